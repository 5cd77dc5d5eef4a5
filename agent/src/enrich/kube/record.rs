//! Pure: a pod object, as the API serves it, turned into the record the store keeps (its
//! containers' runtime ids, names, grace periods and preStop hooks).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use super::{KubeError, Workload, workload};

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
    /// When its `Ready` condition turned true (`lastTransitionTime`), Unix seconds; None
    /// while it is not ready.
    pub ready_at: Option<i64>,
}

/// The bare id of a `containerID` (`containerd://<id>`, `cri-o://<id>`, `docker://<id>`):
/// the id cgroup paths carry. None when empty (a container not started yet).
pub fn container_id(s: &str) -> Option<&str> {
    let id = s.split_once("://").map_or(s, |(_, id)| id);
    (!id.is_empty()).then_some(id)
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
        ready_at: ready_at(pod),
    })
}

/// The `Ready` condition's last transition, while it is true.
fn ready_at(pod: &Pod) -> Option<i64> {
    let c = pod
        .status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready" && c.status == "True")?;
    Some(c.last_transition_time.as_ref()?.0.as_second())
}
