//! Kubernetes metadata from the API server: pod, namespace, container name, node, the owning
//! workload with its revision, and what the pod spec says about stopping each container
//! (`terminationGracePeriodSeconds`, a preStop hook).
//!
//! A pure core and a thin I/O task:
//! - [`pod_record`] turns a `Pod` (as the API serves it) into a [`PodRecord`]; [`workload`]
//!   names the owner from the owner reference and the pod's labels; [`container_id`] strips
//!   the runtime prefix of `status.containerStatuses[].containerID`.
//! - [`Store`] applies watch events (ADDED/MODIFIED as `Apply`, DELETED, and the relist after
//!   a resync: `Init`, `InitApply`…, `InitDone`) and answers by container id (the ids
//!   `cgroup_path` yields). A deleted pod stays answerable for the retention window.
//! - [`watch_pods`] runs kube-runtime's watcher (list + watch of this node's pods, relist on
//!   410 Gone) and feeds the store; every failure is counted in
//!   `drainwatch_kube_watch_errors_total{kind}`, API reachability is
//!   `drainwatch_kube_api_reachable`.
//!
//! Without the API (outside Kubernetes, or while it is unreachable) containers keep the
//! names `runtime_meta` reads from the runtime's state; the enricher upgrades them when the
//! store learns their pod (`attribute::Enricher::with_kube`).

mod owner;
mod record;
mod store;
mod watch;

pub use owner::{Workload, workload};
pub use record::{ContainerRecord, PodRecord, container_id, pod_record};
pub use store::{KubeMeta, SharedStore, Store, WatchEvent, named};
pub use watch::{ERROR_KINDS, KubeMetrics, Mode, client_for, watch_pods};

/// Why a pod could not be used, or the client not built.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// A pod object without a field every pod has (a truncated or foreign object).
    #[error("pod object without metadata.{0}")]
    Missing(&'static str),
    /// `--kube on` and no usable configuration (in-cluster or kubeconfig).
    #[error("--kube on, but no Kubernetes client configuration could be loaded: {0}")]
    Config(String),
    /// `--kube on` without the node to watch.
    #[error(
        "--kube on needs the node name: set --node-name or NODE_NAME (the downward API's spec.nodeName)"
    )]
    NoNodeName,
}
