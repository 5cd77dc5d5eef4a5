//! Who a container is, who stopped it, how it ended, and the proxies in front of it.

use serde::{Deserialize, Serialize};

/// Who a container is, as reports and metrics name it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ContainerIdentity {
    pub id: String,
    pub runtime: String,
    pub name: String,
    pub namespace: String,
    pub pod: String,
    pub workload: String,
    /// Kind of the owning workload (Deployment, StatefulSet, DaemonSet, Job, CronJob, …) from
    /// the Kubernetes API; "" without it.
    #[serde(default)]
    pub workload_kind: String,
    /// The rollout the container belongs to: the pod template hash; "" when unknown.
    #[serde(default)]
    pub revision: String,
    /// The node its pod runs on (Kubernetes API); "" when unknown.
    #[serde(default)]
    pub node: String,
    /// What the pod spec says about stopping it; rendered on stop records, not part of the
    /// container object.
    #[serde(skip)]
    pub stop_policy: StopPolicy,
    /// When its pod's `Ready` condition last turned true (Kubernetes API), Unix seconds;
    /// rendered on start records.
    #[serde(skip)]
    pub pod_ready_at: Option<i64>,
}

/// The name the kubelet gives a pod's sandbox (pause) container, and the name every runtime's
/// metadata and the Kubernetes API path give it here (`enrich::runtime_meta`, `enrich::kube`).
/// Kubernetes container names are lower-case DNS labels, so no app container of a pod has it.
pub const SANDBOX_NAME: &str = "POD";

impl ContainerIdentity {
    /// A pod's sandbox (pause) container: it holds the pod's network namespace and serves
    /// nothing, and the runtime SIGKILLs it once the pod's containers are down. Its end is a
    /// line on its pod's records, never a stop of its own, and no loss is ever its.
    pub fn is_sandbox(&self) -> bool {
        self.name == SANDBOX_NAME && !self.pod.is_empty()
    }

    /// Whether `other` is a container of the same Kubernetes pod.
    pub fn same_pod(&self, other: &ContainerIdentity) -> bool {
        !self.pod.is_empty() && self.pod == other.pod && self.namespace == other.namespace
    }

    /// The workload it belongs to, the unit deploys and storms are kept by.
    pub fn workload_key(&self) -> Workload {
        (self.namespace.clone(), self.workload.clone())
    }
}

/// (namespace, workload).
pub type Workload = (String, String);

/// What the pod spec (Kubernetes API) says about stopping a container; None when unknown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct StopPolicy {
    /// `terminationGracePeriodSeconds` (or the deletion's own grace period).
    pub grace_configured_seconds: Option<i64>,
    /// Whether the container has a preStop hook.
    pub prestop: Option<bool>,
}

/// A process outside the container that sent it a stop signal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sender {
    pub pid: u32,
    pub comm: String,
}

/// How a container's main process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitInfo {
    /// The shell's convention: exit code, or 128 + signal.
    pub code: Option<i32>,
    /// The signal that killed it, if one did.
    pub signal: Option<i32>,
}

/// A process on this node that listens and connects to containers (nginx, HAProxy, Envoy).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Proxy {
    pub tgid: u32,
    /// Its container's workload, or its command outside containers.
    pub name: String,
    /// The node's kubelet (by its process name, [`PROBERS`]): what it opens are probes.
    pub prober: bool,
}

/// Process names of the node agents whose connections to containers are health checks:
/// Kubernetes' kubelet (httpGet and tcpSocket probes are its own connections).
pub const PROBERS: [&str; 1] = ["kubelet"];
