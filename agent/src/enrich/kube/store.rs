//! The store of this node's pods: watch events and relists applied with a retention window
//! for deleted pods, answers by container id or pod uid, and the identity a container gets
//! from them.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
};

use super::{PodRecord, Workload};
use crate::model::{ContainerIdentity, Mono, StopPolicy};

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
    /// The pod's `Ready` transition to true, Unix seconds.
    pub ready_at: Option<i64>,
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
            ready_at: pod.ready_at,
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
        pod_ready_at: k.ready_at,
    }
}
