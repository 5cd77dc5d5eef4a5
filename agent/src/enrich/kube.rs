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

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, watcher},
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use tokio::sync::watch as shutdown_watch;

use crate::model::{ContainerIdentity, Mono, StopPolicy};

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

/// The workload a pod belongs to: what a rollout replaces, and which rollout made the pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Workload {
    /// Deployment, StatefulSet, DaemonSet, Job, CronJob, ReplicaSet, StaticPod, Pod, or the
    /// kind of a custom controller.
    pub kind: String,
    pub name: String,
    /// The pod template's hash: `pod-template-hash` for a Deployment's pods,
    /// `controller-revision-hash` for a StatefulSet's or DaemonSet's, the static pod's config
    /// hash; "" when there is none (a Job, a bare pod).
    pub revision: String,
}

/// One container of a pod, as far as naming and stopping go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRecord {
    pub name: String,
    /// Whether its spec has a preStop hook; None when the spec does not list it.
    pub prestop: Option<bool>,
    /// Runtime ids (bare, without `containerd://`): the running one and the one before a
    /// restart (`lastState.terminated`), so a restarted container's old run still resolves.
    pub ids: Vec<String>,
}

/// What the store keeps of one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRecord {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub node: String,
    pub workload: Workload,
    /// `spec.terminationGracePeriodSeconds`.
    pub grace_spec_seconds: Option<i64>,
    /// `metadata.deletionGracePeriodSeconds` while the pod is being deleted with a grace
    /// period (kubectl delete --grace-period, eviction): the one the kubelet applies. 0 (the
    /// kubelet's final delete once the containers are gone) is no grace period and ignored.
    pub grace_deletion_seconds: Option<i64>,
    pub containers: Vec<ContainerRecord>,
}

/// What the store answers for one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeMeta {
    pub pod: String,
    pub namespace: String,
    pub node: String,
    pub pod_uid: String,
    /// The container's name; None for a container of the pod that the API does not list
    /// (its sandbox), found by the pod uid of its cgroup path.
    pub container: Option<String>,
    pub workload: Workload,
    pub grace_configured_seconds: Option<i64>,
    pub prestop: Option<bool>,
}

/// The bare id of a `containerID` (`containerd://<id>`, `cri-o://<id>`, `docker://<id>`):
/// the id cgroup paths carry. None when empty (a container not started yet).
pub fn container_id(s: &str) -> Option<&str> {
    let id = s.split_once("://").map_or(s, |(_, id)| id);
    (!id.is_empty()).then_some(id)
}

const POD_TEMPLATE_HASH: &str = "pod-template-hash";
const CONTROLLER_REVISION_HASH: &str = "controller-revision-hash";
/// The kubelet's hash of a static pod's manifest, on its mirror pod.
const CONFIG_HASH: &str = "kubernetes.io/config.hash";

/// Characters of Kubernetes' generated name suffixes and hashes
/// (`k8s.io/apimachinery/pkg/util/rand`): no vowels, no 0, 1 or 3.
const KUBE_ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

fn looks_like_hash(s: &str) -> bool {
    (6..=10).contains(&s.len())
        && (s.bytes().all(|b| KUBE_ALPHANUMS.contains(&b)) || s.bytes().all(|b| b.is_ascii_digit()))
}

/// The workload that owns a pod, from its controller's owner reference and its labels.
///
/// No extra API call and no extra RBAC (the agent may only list and watch pods): the owner of a
/// ReplicaSet, and of a Job, is derived from naming conventions of their controllers instead of
/// reading the ReplicaSet or Job:
/// - ReplicaSet `<deployment>-<pod-template-hash>` (the Deployment controller's naming):
///   Deployment `<deployment>`, revision the hash. Kubernetes before 1.11 hashed the name and
///   the label differently: then a `-<hash>` shaped last part still names the Deployment. A
///   ReplicaSet without the label is a bare ReplicaSet.
/// - Job `<cronjob>-<scheduled time in minutes>` (the CronJob controller's naming, 8+ digits):
///   CronJob `<cronjob>`, so every run of a CronJob is one workload (metric series stay
///   bounded); other Jobs are themselves.
/// - StatefulSet, DaemonSet: revision from `controller-revision-hash` (a StatefulSet's is its
///   ControllerRevision's name `<sts>-<hash>`: only the hash is kept).
/// - A mirror pod (owner kind Node): a static pod, named without the `-<node>` suffix the
///   kubelet appends, revision its config hash.
/// - No owner: a bare pod, the pod itself.
pub fn workload(pod: &Pod) -> Workload {
    let meta = &pod.metadata;
    let pod_name = meta.name.clone().unwrap_or_default();
    let label = |k: &str| {
        meta.labels
            .as_ref()
            .and_then(|l| l.get(k))
            .cloned()
            .unwrap_or_default()
    };
    let owners = meta.owner_references.as_deref().unwrap_or_default();
    let Some(owner) = owners
        .iter()
        .find(|o| o.controller == Some(true))
        .or(owners.first())
    else {
        return Workload {
            kind: "Pod".into(),
            name: pod_name,
            revision: String::new(),
        };
    };
    let w = |kind: &str, name: &str, revision: String| Workload {
        kind: kind.into(),
        name: name.into(),
        revision,
    };
    match owner.kind.as_str() {
        "ReplicaSet" => {
            let hash = label(POD_TEMPLATE_HASH);
            if hash.is_empty() {
                return w("ReplicaSet", &owner.name, String::new());
            }
            if let Some(base) = owner.name.strip_suffix(&format!("-{hash}"))
                && !base.is_empty()
            {
                return w("Deployment", base, hash);
            }
            match owner.name.rsplit_once('-') {
                Some((base, suffix)) if !base.is_empty() && looks_like_hash(suffix) => {
                    w("Deployment", base, suffix.to_string())
                }
                _ => w("ReplicaSet", &owner.name, hash),
            }
        }
        "StatefulSet" | "DaemonSet" => {
            let rev = label(CONTROLLER_REVISION_HASH);
            let rev = rev
                .strip_prefix(&format!("{}-", owner.name))
                .map_or(rev.clone(), str::to_string);
            w(&owner.kind, &owner.name, rev)
        }
        "Job" => match owner.name.rsplit_once('-') {
            Some((base, minutes))
                if !base.is_empty()
                    && minutes.len() >= 8
                    && minutes.bytes().all(|b| b.is_ascii_digit()) =>
            {
                w("CronJob", base, String::new())
            }
            _ => w("Job", &owner.name, String::new()),
        },
        "Node" => {
            let name = pod_name
                .strip_suffix(&format!("-{}", owner.name))
                .filter(|b| !b.is_empty())
                .unwrap_or(&pod_name);
            let hash = meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(CONFIG_HASH))
                .cloned()
                .unwrap_or_default();
            w("StaticPod", name, hash)
        }
        _ => {
            let rev = Some(label(CONTROLLER_REVISION_HASH))
                .filter(|r| !r.is_empty())
                .unwrap_or_else(|| label(POD_TEMPLATE_HASH));
            w(&owner.kind, &owner.name, rev)
        }
    }
}

/// Pure: the record the store keeps of a pod. Init and ephemeral containers are included, so
/// every container the kubelet runs for the pod resolves.
pub fn pod_record(pod: &Pod) -> Result<PodRecord, KubeError> {
    let meta = &pod.metadata;
    let uid = meta
        .uid
        .clone()
        .filter(|s| !s.is_empty())
        .ok_or(KubeError::Missing("uid"))?;
    let name = meta
        .name
        .clone()
        .filter(|s| !s.is_empty())
        .ok_or(KubeError::Missing("name"))?;
    let spec = pod.spec.as_ref();
    let mut prestop: BTreeMap<&str, bool> = BTreeMap::new();
    if let Some(spec) = spec {
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            let has = c.lifecycle.as_ref().is_some_and(|l| l.pre_stop.is_some());
            prestop.insert(c.name.as_str(), has);
        }
        // Ephemeral (debug) containers cannot have lifecycle hooks.
        for c in spec.ephemeral_containers.iter().flatten() {
            prestop.insert(c.name.as_str(), false);
        }
    }
    let mut containers: Vec<ContainerRecord> = Vec::new();
    if let Some(status) = pod.status.as_ref() {
        for s in status
            .container_statuses
            .iter()
            .flatten()
            .chain(status.init_container_statuses.iter().flatten())
            .chain(status.ephemeral_container_statuses.iter().flatten())
        {
            let current = s.container_id.as_deref();
            let running = s.state.as_ref().and_then(|st| st.terminated.as_ref());
            let previous = s.last_state.as_ref().and_then(|st| st.terminated.as_ref());
            let mut ids: Vec<String> = Vec::new();
            for id in [
                current,
                running.and_then(|t| t.container_id.as_deref()),
                previous.and_then(|t| t.container_id.as_deref()),
            ]
            .into_iter()
            .flatten()
            .filter_map(container_id)
            {
                if !ids.iter().any(|i| i == id) {
                    ids.push(id.to_string());
                }
            }
            containers.push(ContainerRecord {
                name: s.name.clone(),
                prestop: prestop.get(s.name.as_str()).copied(),
                ids,
            });
        }
    }
    // Containers in the spec without a status yet (still being created) are kept by name.
    for (name, has) in &prestop {
        if !containers.iter().any(|c| c.name == *name) {
            containers.push(ContainerRecord {
                name: (*name).to_string(),
                prestop: Some(*has),
                ids: Vec::new(),
            });
        }
    }
    Ok(PodRecord {
        uid,
        name,
        namespace: meta.namespace.clone().unwrap_or_default(),
        node: spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        workload: workload(pod),
        grace_spec_seconds: spec.and_then(|s| s.termination_grace_period_seconds),
        grace_deletion_seconds: meta.deletion_grace_period_seconds.filter(|g| *g > 0),
        containers,
    })
}

/// A watch event, as the store consumes it (kube-runtime's `watcher::Event` with the pod
/// already turned into a record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// ADDED or MODIFIED.
    Apply(PodRecord),
    /// DELETED.
    Delete(PodRecord),
    /// A (re)list begins: after start-up, or after the watch expired (410 Gone).
    Init,
    /// One pod of that list.
    InitApply(PodRecord),
    /// The list is complete: pods not in it are gone.
    InitDone,
}

#[derive(Debug)]
struct Entry {
    pod: PodRecord,
    /// When the pod was deleted (or found missing from a relist).
    deleted_at: Option<Mono>,
}

/// The pods of this node the API server reported, by uid and by container id.
#[derive(Debug)]
pub struct Store {
    retention: Mono,
    pods: HashMap<String, Entry>,
    by_container: HashMap<String, String>,
    /// The pods of a relist in progress (`Init` … `InitDone`).
    relist: Option<Vec<PodRecord>>,
    synced: bool,
    generation: u64,
}

pub type SharedStore = Arc<Mutex<Store>>;

impl Store {
    /// `retention`: how long a deleted pod stays answerable (kernel monotonic ns).
    pub fn new(retention: Mono) -> Self {
        Self {
            retention,
            pods: HashMap::new(),
            by_container: HashMap::new(),
            relist: None,
            synced: false,
            generation: 0,
        }
    }

    /// Whether a full list has been applied since start-up.
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// Changes whenever what the store answers may have changed.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether the pod with this uid was deleted (None when the store does not know it).
    pub fn deleted(&self, uid: &str) -> Option<bool> {
        self.pods.get(uid).map(|e| e.deleted_at.is_some())
    }

    /// Pods on the node now (deleted ones in their retention window excluded).
    pub fn live_pods(&self) -> usize {
        self.pods
            .values()
            .filter(|e| e.deleted_at.is_none())
            .count()
    }

    fn upsert(&mut self, pod: PodRecord) {
        let old = self.pods.remove(&pod.uid);
        // A deletion grace period seen once (the kubelet's final update resets it to 0)
        // stays: it is the one the stop used.
        let mut pod = pod;
        if pod.grace_deletion_seconds.is_none() {
            pod.grace_deletion_seconds = old.as_ref().and_then(|e| e.pod.grace_deletion_seconds);
        }
        // A container's previous ids stay too: its old run may still be reported on.
        if let Some(old) = &old {
            for c in &mut pod.containers {
                if let Some(prev) = old.pod.containers.iter().find(|o| o.name == c.name) {
                    for id in &prev.ids {
                        if !c.ids.contains(id) && c.ids.len() < MAX_IDS_PER_CONTAINER {
                            c.ids.push(id.clone());
                        }
                    }
                }
            }
        }
        // Ids that fell off the bound stop resolving to this pod.
        let ids: HashSet<&String> = pod.containers.iter().flat_map(|c| &c.ids).collect();
        self.by_container
            .retain(|id, uid| *uid != pod.uid || ids.contains(id));
        for id in ids {
            self.by_container.insert(id.clone(), pod.uid.clone());
        }
        self.pods.insert(
            pod.uid.clone(),
            Entry {
                pod,
                deleted_at: None,
            },
        );
    }

    fn mark_deleted(&mut self, uid: &str, now: Mono) {
        if let Some(e) = self.pods.get_mut(uid) {
            e.deleted_at.get_or_insert(now);
        }
    }

    /// Applies one watch event seen at `now`.
    pub fn apply(&mut self, now: Mono, ev: WatchEvent) {
        match ev {
            WatchEvent::Apply(pod) => self.upsert(pod),
            WatchEvent::Delete(pod) => {
                let uid = pod.uid.clone();
                self.upsert(pod);
                self.mark_deleted(&uid, now);
            }
            WatchEvent::Init => self.relist = Some(Vec::new()),
            WatchEvent::InitApply(pod) => match &mut self.relist {
                Some(list) => list.push(pod),
                // An object outside a relist (not expected): apply it as it is.
                None => self.upsert(pod),
            },
            WatchEvent::InitDone => {
                let listed = self.relist.take().unwrap_or_default();
                let present: HashSet<&str> = listed.iter().map(|p| p.uid.as_str()).collect();
                // Deleted while the watch was down: its DELETED event was never seen.
                let missing: Vec<String> = self
                    .pods
                    .iter()
                    .filter(|(uid, e)| e.deleted_at.is_none() && !present.contains(uid.as_str()))
                    .map(|(uid, _)| uid.clone())
                    .collect();
                for uid in missing {
                    self.mark_deleted(&uid, now);
                }
                for pod in listed {
                    self.upsert(pod);
                }
                self.synced = true;
            }
        }
        self.generation += 1;
    }

    /// Forgets pods deleted longer than the retention window ago.
    pub fn expire(&mut self, now: Mono) {
        let retention = self.retention;
        let before = self.pods.len();
        self.pods.retain(|_, e| {
            e.deleted_at
                .is_none_or(|d| now < d.saturating_add(retention))
        });
        if self.pods.len() != before {
            let pods = &self.pods;
            self.by_container.retain(|_, uid| pods.contains_key(uid));
            self.generation += 1;
        }
    }

    /// The metadata of a container, by its runtime id, or by the uid of the pod its cgroup
    /// path names (a pod's sandbox, or a container started after the last pod update).
    pub fn lookup(&self, container_id: &str, pod_uid: Option<&str>) -> Option<KubeMeta> {
        let by_id = self
            .by_container
            .get(container_id)
            .and_then(|uid| self.pods.get(uid));
        let entry = by_id.or_else(|| pod_uid.and_then(|u| self.pods.get(u)))?;
        let pod = &entry.pod;
        let container = pod
            .containers
            .iter()
            .find(|c| c.ids.iter().any(|i| i == container_id));
        Some(KubeMeta {
            pod: pod.name.clone(),
            namespace: pod.namespace.clone(),
            node: pod.node.clone(),
            pod_uid: pod.uid.clone(),
            container: container.map(|c| c.name.clone()),
            workload: pod.workload.clone(),
            grace_configured_seconds: pod.grace_deletion_seconds.or(pod.grace_spec_seconds),
            prestop: container.and_then(|c| c.prestop),
        })
    }
}

/// Old ids kept per container (a crash-looping container gets a new id on every restart).
const MAX_IDS_PER_CONTAINER: usize = 8;

/// Pure: a container's identity with what the API says, over what the runtime's state said
/// (`base`). The container name stays the runtime's for a container the pod does not list.
pub fn named(base: &ContainerIdentity, k: &KubeMeta) -> ContainerIdentity {
    ContainerIdentity {
        id: base.id.clone(),
        runtime: base.runtime.clone(),
        name: k.container.clone().unwrap_or_else(|| base.name.clone()),
        namespace: k.namespace.clone(),
        pod: k.pod.clone(),
        workload: k.workload.name.clone(),
        workload_kind: k.workload.kind.clone(),
        revision: k.workload.revision.clone(),
        node: k.node.clone(),
        stop_policy: StopPolicy {
            grace_configured_seconds: k.grace_configured_seconds,
            prestop: k.prestop,
        },
    }
}

// ---------------------------------------------------------------------------------------
// Thin I/O: the client and the watch task.

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

/// Why the watch failed, as `drainwatch_kube_watch_errors_total{kind}` counts it.
pub const ERROR_KINDS: [&str; 6] = [
    "list",
    "watch_start",
    "watch_stream",
    "gone",
    "watch_status",
    "invalid_object",
];

/// The watch's own metrics. Registered only when the API is used, so an agent outside
/// Kubernetes exports exactly what it did before.
#[derive(Clone)]
pub struct KubeMetrics {
    errors: Family<KindLabels, Counter>,
    reachable: Gauge,
    pods: Gauge,
    relists: Counter,
}

impl KubeMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            errors: Family::default(),
            reachable: Gauge::default(),
            pods: Gauge::default(),
            relists: Counter::default(),
        };
        registry.register(
            "drainwatch_kube_watch_errors",
            "Failures watching this node's pods on the Kubernetes API, by kind: list, watch_start, watch_stream (connection or decoding), gone (410: the watch expired, a relist follows), watch_status (other error events), invalid_object (a pod without uid or name, dropped)",
            m.errors.clone(),
        );
        registry.register(
            "drainwatch_kube_api_reachable",
            "1 while the last list or watch of the Kubernetes API succeeded, 0 after a failure (names then come from the runtime's state)",
            m.reachable.clone(),
        );
        registry.register(
            "drainwatch_kube_pods",
            "Pods of this node known from the Kubernetes API",
            m.pods.clone(),
        );
        registry.register(
            "drainwatch_kube_relists",
            "Full lists of this node's pods: at start-up and after every expired watch (410 Gone)",
            m.relists.clone(),
        );
        for k in ERROR_KINDS {
            let _ = m.errors.get_or_create(&KindLabels { kind: k.into() });
        }
        m
    }

    fn error(&self, kind: &str) {
        self.errors
            .get_or_create(&KindLabels { kind: kind.into() })
            .inc();
    }

    pub fn errors(&self, kind: &str) -> u64 {
        self.errors
            .get_or_create(&KindLabels { kind: kind.into() })
            .get()
    }

    pub fn reachable(&self) -> i64 {
        self.reachable.get()
    }

    pub fn relists(&self) -> u64 {
        self.relists.get()
    }
}

/// How `--kube` was set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// In-cluster configuration when running in a pod (KUBERNETES_SERVICE_HOST set).
    Auto,
    /// In-cluster configuration or a kubeconfig; failing to load one is a start-up error.
    On,
    Off,
}

/// The client and node to watch, or None when the API is not used. Logs one line saying
/// which. Errors only for `Mode::On`.
pub async fn client_for(
    mode: Mode,
    node: Option<String>,
    in_pod: bool,
) -> Result<Option<(Client, String)>, KubeError> {
    let node = node.filter(|n| !n.is_empty());
    match mode {
        Mode::Off => {
            tracing::info!(
                "Kubernetes API metadata off (--kube off): names come from the runtime's state"
            );
            return Ok(None);
        }
        Mode::Auto if !in_pod => {
            tracing::info!(
                "Kubernetes API metadata off: not running in a pod (KUBERNETES_SERVICE_HOST unset); names come from the runtime's state"
            );
            return Ok(None);
        }
        _ => {}
    }
    let Some(node) = node else {
        if mode == Mode::On {
            return Err(KubeError::NoNodeName);
        }
        tracing::warn!(
            "Kubernetes API metadata off: no node name (set --node-name, or NODE_NAME from the downward API's spec.nodeName); names come from the runtime's state"
        );
        return Ok(None);
    };
    let config = if mode == Mode::On {
        kube::Config::infer().await.map_err(|e| e.to_string())
    } else {
        kube::Config::incluster().map_err(|e| e.to_string())
    };
    let client = config.and_then(|c| Client::try_from(c).map_err(|e| e.to_string()));
    match client {
        Ok(c) => {
            tracing::info!(node = %node, "Kubernetes API metadata on: watching this node's pods");
            Ok(Some((c, node)))
        }
        Err(e) if mode == Mode::On => Err(KubeError::Config(e)),
        Err(e) => {
            tracing::warn!(
                "Kubernetes API metadata off: in-cluster configuration unusable ({e}); names come from the runtime's state"
            );
            Ok(None)
        }
    }
}

/// Watches this node's pods (`spec.nodeName=<node>`) and feeds the store until shutdown.
/// kube-runtime's watcher lists, then watches from the list's resourceVersion, and lists
/// again when the watch expires (an ERROR event with code 410); its default backoff spaces
/// retries after failures. `clock` is kernel monotonic time (the store's retention clock).
pub async fn watch_pods(
    client: Client,
    node: String,
    store: SharedStore,
    metrics: KubeMetrics,
    clock: fn() -> Mono,
    mut shutdown: shutdown_watch::Receiver<bool>,
) {
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut stream = std::pin::pin!(watcher(api, config).default_backoff());
    let mut expire = tokio::time::interval(Duration::from_secs(5));
    let mut reachable = None;
    let mut set_reachable = |up: bool, why: &dyn std::fmt::Display| {
        metrics.reachable.set(i64::from(up));
        if reachable != Some(up) {
            if up {
                tracing::info!(node = %node, "Kubernetes API reachable: naming containers from their pods");
            } else {
                tracing::warn!(
                    "Kubernetes API unreachable ({why}): naming containers from the runtime's state until it answers"
                );
            }
            reachable = Some(up);
        }
    };
    loop {
        let item = tokio::select! {
            item = stream.next() => item,
            _ = expire.tick() => {
                if let Ok(mut s) = store.lock() {
                    s.expire(clock());
                    metrics.pods.set(s.live_pods() as i64);
                }
                continue;
            }
            _ = shutdown.changed() => break,
        };
        let Some(item) = item else { break };
        let ev = match item {
            Ok(ev) => ev,
            Err(e) => {
                let kind = match &e {
                    watcher::Error::InitialListFailed(_) => "list",
                    watcher::Error::WatchStartFailed(_) => "watch_start",
                    watcher::Error::WatchFailed(_) => "watch_stream",
                    watcher::Error::WatchError(s) if s.code == 410 => "gone",
                    watcher::Error::WatchError(_) => "watch_status",
                    watcher::Error::NoResourceVersion => "watch_status",
                };
                metrics.error(kind);
                match kind {
                    // The server answered; the watcher relists.
                    "gone" => tracing::debug!("Kubernetes watch expired (410 Gone): relisting"),
                    "list" | "watch_start" => set_reachable(false, &e),
                    _ => tracing::debug!("Kubernetes watch error: {e}"),
                }
                continue;
            }
        };
        let converted = match ev {
            watcher::Event::Init => {
                metrics.relists.inc();
                Some(WatchEvent::Init)
            }
            watcher::Event::InitDone => {
                set_reachable(true, &"");
                Some(WatchEvent::InitDone)
            }
            watcher::Event::Apply(p) => pod_record(&p).map(WatchEvent::Apply).ok(),
            watcher::Event::Delete(p) => pod_record(&p).map(WatchEvent::Delete).ok(),
            watcher::Event::InitApply(p) => pod_record(&p).map(WatchEvent::InitApply).ok(),
        };
        let Some(ev) = converted else {
            metrics.error("invalid_object");
            continue;
        };
        if matches!(ev, WatchEvent::Apply(_) | WatchEvent::Delete(_)) {
            set_reachable(true, &"");
        }
        if let Ok(mut s) = store.lock() {
            s.apply(clock(), ev);
            metrics.pods.set(s.live_pods() as i64);
        }
    }
}
