//! A deploy: the stops and starts of one workload within a window of each other
//! (`correlate::deploys` groups them).

use std::collections::BTreeMap;

use super::{Loss, Mono, stop::Outcome};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deploy {
    pub id: String,
    pub namespace: String,
    pub workload: String,
    /// The workload's kind (Kubernetes API); "" when unknown.
    pub workload_kind: String,
    /// The revisions (pod template hashes) of the stopped containers, in order of their
    /// stops: the rollout replaced these.
    pub revisions: Vec<String>,
    pub started_at: Mono,
    /// Start of the last stop in the deploy (of its last start when it has no stop).
    pub last_stop_at: Mono,
    pub stops: Vec<String>,
    /// The pods whose containers stopped in it, each once: a pod's containers that stop
    /// together (an app and its sidecars, in any order) are one pod deletion.
    pub pods: Vec<String>,
    pub starts: Vec<String>,
    /// Connects refused before its starts listened.
    pub refused_before_listen: u64,
    pub outcomes: BTreeMap<Outcome, u64>,
    /// Stops whose main process has not exited yet.
    pub in_progress: u64,
    pub loss: Loss,
}
