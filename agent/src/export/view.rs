//! The report API's typed model: what `/api/v1/stops`, `/api/v1/starts`, `/api/v1/deploys` and
//! `/api/v1/storms`
//! serve, and all that `drainwatch report` (which deserializes them from HTTP), the verdicts and
//! the deploy page read. `api.rs` builds them from the records in `crate::model`.
//!
//! - Fields are declared in alphabetical order: serde writes them in declaration order, and
//!   that is the order the API has always served (its JSON went through serde_json's sorted
//!   maps); a test in `api.rs` pins it.
//! - Times are RFC 3339 strings with milliseconds (`Clock::rfc3339`), null when the moment did
//!   not happen; durations are seconds rounded to the millisecond.
//! - Deserializing is as lenient as the report always was: a missing field is empty (`None`,
//!   0, ""), so a report still reads an agent that predates a field.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::model::streams::StreamsEnded;
use crate::model::{
    LossKind,
    stop::{IgnoredSignal, Outcome},
    streams::LifetimeShape,
};

/// One container stop (`/api/v1/stops` element).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StopView {
    /// The agent restarted while it was open: the gap it was down.
    pub agent_gap: Option<GapView>,
    /// Connects from this node to its address, sent after its run ended, whose outcome has not
    /// come yet (the kernel gives up on an unanswered SYN tens of seconds later): it does not
    /// settle while any is in flight, each for at most the kernel's SYN retry time.
    #[serde(default)]
    pub attempts_in_flight: u64,
    /// Of those, the ones whose outcome never came within that time: it is then incomplete.
    #[serde(default)]
    pub attempts_unresolved: u64,
    pub cgroup_removed_at: Option<String>,
    /// False when it settled without an exit (outcome unknown); true when read from an agent
    /// that predates the field.
    #[serde(default = "yes")]
    pub complete: bool,
    pub connections_at_exit: Option<u64>,
    pub connections_at_sigterm: Option<u64>,
    pub container: ContainerView,
    /// Stop signal → exit.
    pub drain_seconds: Option<f64>,
    /// eBPF program faults while it was open that lose part of what it reads
    /// (`drainwatch_ebpf_faults_total`): its counts may be short.
    #[serde(default)]
    pub ebpf_faults: u64,
    /// Kernel events lost while it was open: its counts may be short.
    pub events_lost: u64,
    pub exit_at: Option<String>,
    pub exit_code: Option<i32>,
    pub exit_signal: Option<i32>,
    /// The pod's `terminationGracePeriodSeconds` (Kubernetes API).
    pub grace_configured_seconds: Option<i64>,
    /// Stop signal → SIGKILL, as observed.
    pub grace_seconds: Option<f64>,
    pub id: String,
    pub last_accept_at: Option<String>,
    pub listeners: Vec<ListenerView>,
    pub loss: LossView,
    /// Loss as it happened, oldest first (capped; the counts in `loss` stay exact).
    pub loss_events: Vec<LossEventView>,
    pub loss_events_dropped: u64,
    /// None until the main process has exited.
    pub outcome: Option<Outcome>,
    /// Whether the container has a preStop hook (Kubernetes API).
    pub prestop: Option<bool>,
    /// Stop signal → the last connection routed to it.
    pub routing_lag_seconds: Option<f64>,
    /// When its pod's sandbox (pause) container ended: a line on the pod's records, never a
    /// stop of its own.
    #[serde(default)]
    pub sandbox_stopped_at: Option<String>,
    /// It will not change any more (10 s after its cgroup is gone, or at the no-exit limit;
    /// later while `attempts_in_flight` are).
    pub settled: bool,
    pub sigkill_at: Option<String>,
    pub sigterm_at: Option<String>,
    pub sigterm_sender: Option<SenderView>,
    /// The kernel dropped the stop signal, and why: the process served on until SIGKILL.
    #[serde(default)]
    pub stop_signal_ignored: Option<IgnoredSignal>,
    /// Clients of the reconnect storms this stop caused (on the workload's listeners); None
    /// when it caused none.
    pub storm_clients: Option<u64>,
    /// The lifetimes of the streams its server ended itself, learned on its listeners before
    /// the stop; None until they were watched for twice the longest.
    #[serde(default)]
    pub stream_lifetimes: Option<StreamLifetimesView>,
    /// The upper percentile (p95) of those lifetimes: what the grace period must cover (+ 2 s).
    pub stream_rotation_seconds: Option<f64>,
    /// Live streams its server ended itself during the stop, none of them cut: on their own
    /// timers, or all at once right after the stop signal.
    #[serde(default)]
    pub streams_ended_by_server: StreamsEnded,
    /// The verdict with its fix (as the page and the report say it).
    pub verdict: String,
}

fn yes() -> bool {
    true
}

impl StopView {
    /// The grace period: as configured when the agent knows it, else as observed (SIGTERM →
    /// SIGKILL).
    pub fn grace(&self) -> Option<f64> {
        self.grace_configured_seconds
            .map(|g| g as f64)
            .or(self.grace_seconds)
    }
}

/// How long a server lets its streams live, seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamLifetimesView {
    #[serde(default)]
    pub max_seconds: f64,
    #[serde(default)]
    pub p50_seconds: f64,
    #[serde(default)]
    pub p95_seconds: f64,
    pub shape: LifetimeShape,
    /// How many lifetimes they were read from.
    #[serde(default)]
    pub streams: u32,
}

/// Who the stopped container was ("" where unknown).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ContainerView {
    pub id: String,
    pub name: String,
    pub namespace: String,
    pub node: String,
    pub pod: String,
    pub revision: String,
    pub runtime: String,
    pub workload: String,
    pub workload_kind: String,
}

/// When the agent was not watching while the stop was open (it restarted): what happened then
/// is not in the record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GapView {
    pub from: String,
    pub to: String,
    pub seconds: f64,
}

/// The process outside the container that sent the stop signal.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SenderView {
    pub comm: String,
    pub pid: u32,
}

/// A listening socket of the stopped container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ListenerView {
    pub address: String,
    pub closed_at: Option<String>,
}

/// What a stop (or a deploy) cost, by kind: the record's own type, whose fields are declared
/// in the API's order.
pub type LossView = crate::model::Loss;

/// One loss where it happened, for the timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LossEventView {
    pub at: String,
    pub kind: LossKind,
    /// For a cut: how long the connection had been open.
    pub open_seconds: Option<f64>,
    /// For an in-flight cut: how long its request had been in the server (since the
    /// connection's last received data). Absent from older agents.
    #[serde(default)]
    pub request_seconds: Option<f64>,
}

/// The stops of one workload close together (`/api/v1/deploys` element).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DeployView {
    pub id: String,
    /// Stops whose main process has not exited yet.
    pub in_progress: u64,
    pub last_stop_at: String,
    pub loss: LossView,
    pub namespace: String,
    /// Finished stops by outcome (in the outcomes' alphabetical order).
    pub outcomes: BTreeMap<Outcome, u64>,
    /// The pods whose containers stopped in it (Kubernetes), each once: one pod deletion each.
    pub pods: Vec<String>,
    /// Connects refused before its starts listened (health checks apart).
    pub refused_before_listen: u64,
    /// The revisions the rollout replaced, in order of their stops.
    pub revisions: Vec<String>,
    pub started_at: String,
    /// Ids of its starts, oldest first.
    pub starts: Vec<String>,
    /// Ids of its stops, oldest first.
    pub stops: Vec<String>,
    pub workload: String,
    pub workload_kind: String,
}

/// One container start (`/api/v1/starts` element).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StartView {
    pub container: ContainerView,
    /// eBPF program faults while it was open that lose part of what it reads.
    pub ebpf_faults: u64,
    /// Kernel events lost while it was open: its counts may be short.
    pub events_lost: u64,
    pub first_accept_at: Option<String>,
    pub first_listen_at: Option<String>,
    pub id: String,
    /// Start → first listen.
    pub listen_after_seconds: Option<f64>,
    pub loss: StartLossView,
    /// Its refusals were matched to its network namespace by inode alone (the kernel's records
    /// carry no namespace cookie before 5.12): a namespace that reused a stopped container's
    /// inode could not be told from it.
    pub netns_by_inode: bool,
    /// Ports it listened on, in order.
    pub ports: Vec<u16>,
    /// The pod's Ready condition (Kubernetes API); null when unknown.
    pub ready_at: Option<String>,
    /// Refusals dropped before a listen could take them: the counts may be short by this.
    pub refusals_lost: u64,
    /// When the refused requests happened, oldest first (capped; the count stays exact).
    pub refused_at: Vec<String>,
    /// Restarted in place (same container, new PID 1).
    pub restart: bool,
    /// It will not change any more (settled 10 s after its first listen).
    pub settled: bool,
    pub started_at: String,
    /// The verdict with its fix (as the page and the report say it).
    pub verdict: String,
}

/// What a start cost: the record's own type.
pub type StartLossView = crate::model::start::StartLoss;

/// A reconnect storm after a stop (`/api/v1/storms` element).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StormView {
    pub accept_wait_max_seconds: Option<f64>,
    pub accept_wait_p50_seconds: Option<f64>,
    pub accept_wait_p95_seconds: Option<f64>,
    pub arrivals_per_100ms: Vec<u32>,
    /// Clients that came back, counted by their first connection when known.
    pub clients: u64,
    /// Every connection that arrived, follow-ups included.
    pub connections: u64,
    /// The container (name) whose listener took the storm.
    pub container: String,
    /// The deploy of its stop, while that is still listed.
    pub deploy_id: Option<String>,
    pub first_arrival_at: String,
    /// First to last of the clients' first connections, when known.
    pub first_attempts_seconds: Option<f64>,
    pub last_arrival_at: String,
    pub max_queue_depth: u32,
    pub namespace: String,
    pub netns_listen_drops: Option<u64>,
    pub netns_listen_overflows: Option<u64>,
    pub overflows: u64,
    pub peak_arrivals_per_second: f64,
    pub port: u16,
    /// Clients ÷ sustained accept rate; None when nothing waited.
    pub recommended_window_seconds: Option<f64>,
    pub seconds_to_95_percent: f64,
    /// The stop that caused it.
    pub stop_id: String,
    /// Accepts per second while connections queued; None when the queue never backed up.
    pub sustained_accept_rate: Option<f64>,
    pub workload: String,
}
