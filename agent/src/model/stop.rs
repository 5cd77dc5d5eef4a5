//! The stop record: one per container stop, from the first stop signal (or the exit of a
//! crash) to the cgroup's removal, with the connection loss attributed to it. The tracker
//! (`correlate::stops`) builds it; the API, page, report and metrics read it.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::{ContainerIdentity, ExitInfo, Loss, LossKind, Mono, SECOND, Sender};

pub const SIGINT: i32 = 2;
pub const SIGQUIT: i32 = 3;
pub const SIGKILL: i32 = 9;
pub const SIGTERM: i32 = 15;

/// How a stop went. Declared in the order of the names, so that maps keyed by outcome list
/// them as before, alphabetically.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Crashed,
    Drained,
    ExitAtOnce,
    KilledAtDeadline,
    ListenerClosedEarly,
}

impl Outcome {
    pub const ALL: [Outcome; 5] = [
        Outcome::Crashed,
        Outcome::KilledAtDeadline,
        Outcome::ExitAtOnce,
        Outcome::ListenerClosedEarly,
        Outcome::Drained,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Crashed => "crashed",
            Outcome::KilledAtDeadline => "killed_at_deadline",
            Outcome::ExitAtOnce => "exit_at_once",
            Outcome::ListenerClosedEarly => "listener_closed_early",
            Outcome::Drained => "drained",
        }
    }
}

/// Most loss events a stop keeps for its timeline; the counts in [`Loss`] stay exact beyond it.
pub const MAX_LOSS_EVENTS: usize = 500;

/// One counted loss (or connection routed to a stopping container), when it happened: what the
/// deploy page draws on a stop's timeline and the verdict reads evidence from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LossEvent {
    pub at: Mono,
    /// Any kind but `idle_closed` and `resets_sent` (see [`LossKind::on_timeline`]); retry
    /// verdicts at the cut's time.
    pub kind: LossKind,
    /// For a cut: how long the connection had been open, when its handshake was seen. With one
    /// request per connection that is how long the request had been running.
    pub open_for: Option<Mono>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerTimeline {
    pub address: SocketAddr,
    pub closed_at: Option<Mono>,
}

/// One container stop. Times are kernel monotonic; the export layer renders them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stop {
    pub id: String,
    pub container: ContainerIdentity,
    /// The first stop signal: SIGTERM, or SIGINT/SIGQUIT for images that stop with those.
    pub sigterm_at: Option<Mono>,
    pub stop_signal: Option<i32>,
    pub sigterm_sender: Option<Sender>,
    pub sigkill_at: Option<Mono>,
    pub exit_at: Option<Mono>,
    pub exit: Option<ExitInfo>,
    pub cgroup_removed_at: Option<Mono>,
    pub listeners: Vec<ListenerTimeline>,
    pub last_accept_at: Option<Mono>,
    pub connections_at_sigterm: Option<u64>,
    pub connections_at_exit: Option<u64>,
    /// The pod's `terminationGracePeriodSeconds` (Kubernetes API); None when unknown.
    pub grace_configured_seconds: Option<i64>,
    /// Whether the container has a preStop hook (Kubernetes API); None when unknown.
    pub prestop: Option<bool>,
    pub loss: Loss,
    /// Loss as it happened, oldest first, at most [`MAX_LOSS_EVENTS`].
    pub events: Vec<LossEvent>,
    /// Loss events not kept beyond the cap (still counted in `loss`).
    pub events_dropped: u64,
    /// The last connection routed to it after the stop signal: accepted, refused or unreachable.
    pub last_routed_at: Option<Mono>,
    /// Set once the record will not change any more (see `Tracker::tick`).
    pub settled: bool,
}

impl Stop {
    /// SIGTERM → SIGKILL, as observed.
    pub fn grace_seconds(&self) -> Option<f64> {
        Some(secs(self.sigkill_at?.checked_sub(self.sigterm_at?)?))
    }

    /// SIGTERM → exit.
    pub fn drain_seconds(&self) -> Option<f64> {
        Some(secs(self.exit_at?.checked_sub(self.sigterm_at?)?))
    }

    /// SIGTERM → the last connection routed to it after that, accepted or refused or
    /// unreachable (how long routing kept sending).
    pub fn routing_lag_seconds(&self) -> Option<f64> {
        let term = self.sigterm_at?;
        let last = self.last_accept_at.max(self.last_routed_at)?;
        (last > term).then(|| secs(last - term))
    }

    /// `None` until the main process has exited.
    pub fn outcome(&self) -> Option<Outcome> {
        let exit = self.exit?;
        let stop_first = self
            .sigterm_at
            .is_some_and(|t| self.exit_at.is_none_or(|e| t <= e));
        let kill_first = self
            .sigkill_at
            .is_some_and(|t| self.exit_at.is_none_or(|e| t <= e));
        Some(if !stop_first && !kill_first {
            Outcome::Crashed
        } else if stop_first && kill_first {
            Outcome::KilledAtDeadline
        } else if kill_first
            || (exit.signal.is_some() && exit.signal == self.stop_signal)
            || self.loss.inflight_cut > 0
        {
            Outcome::ExitAtOnce
        } else if self.loss.refused > 0 {
            Outcome::ListenerClosedEarly
        } else {
            Outcome::Drained
        })
    }

    /// The moment the record started.
    pub fn started_at(&self) -> Mono {
        [self.sigterm_at, self.sigkill_at, self.exit_at]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(0)
    }
}

fn secs(ns: Mono) -> f64 {
    ns as f64 / SECOND as f64
}
