//! The stop record: one per container stop, from the first stop signal (or the exit of a
//! crash) to the cgroup's removal, with the connection loss attributed to it. The tracker
//! (`correlate::stops`) builds it; the API, page, report and metrics read it.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::{
    ContainerIdentity, ExitInfo, Loss, LossKind, Mono, SECOND, Sender,
    streams::{StreamEnds, StreamLifetimes, StreamsEnded},
};

pub const SIGINT: i32 = 2;
pub const SIGQUIT: i32 = 3;
pub const SIGKILL: i32 = 9;
pub const SIGTERM: i32 = 15;

/// How soon after the stop signal a process that closed no listener may exit and still have
/// exited at once: it stopped serving, it did not drain.
pub const AT_ONCE: Mono = SECOND;

/// How a stop went. Declared in the order of the names, so that maps keyed by outcome list
/// them as before, alphabetically.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Crashed,
    Drained,
    ExitAtOnce,
    Exited,
    KilledAtDeadline,
    ListenerClosedEarly,
}

impl Outcome {
    pub const ALL: [Outcome; 6] = [
        Outcome::Crashed,
        Outcome::KilledAtDeadline,
        Outcome::ExitAtOnce,
        Outcome::ListenerClosedEarly,
        Outcome::Drained,
        Outcome::Exited,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Crashed => "crashed",
            Outcome::KilledAtDeadline => "killed_at_deadline",
            Outcome::ExitAtOnce => "exit_at_once",
            Outcome::ListenerClosedEarly => "listener_closed_early",
            Outcome::Drained => "drained",
            Outcome::Exited => "exited",
        }
    }
}

/// Why the kernel dropped a stop signal instead of delivering it (`signal_generate`'s result
/// said ignored): the process served on as if none had come.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IgnoredSignal {
    /// Sent to its container's PID 1, which has no handler for it: the kernel protects a
    /// namespace's init from signals it does not handle.
    Pid1WithoutHandler,
    /// The process set the signal to be ignored (`SIG_IGN`, `trap '' TERM`).
    IgnoredByProcess,
}

impl IgnoredSignal {
    /// Why, in the words the page, the report and the verdict use.
    pub fn words(self) -> &'static str {
        match self {
            IgnoredSignal::Pid1WithoutHandler => "PID 1 of its container without a handler",
            IgnoredSignal::IgnoredByProcess => "the process ignores it",
        }
    }
}

/// Most loss events a stop keeps for its timeline; the counts in [`Loss`] stay exact beyond it.
pub const MAX_LOSS_EVENTS: usize = 500;

/// One counted loss (or connection routed to a stopping container), when it happened: what the
/// deploy page draws on a stop's timeline and the verdict reads evidence from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LossEvent {
    pub at: Mono,
    /// Any kind but `idle_closed` and `resets_sent` (see [`LossKind::on_timeline`]); retry
    /// verdicts at the cut's time.
    pub kind: LossKind,
    /// For a cut: how long the connection had been open, when its handshake was seen. With one
    /// request per connection that is how long the request had been running.
    pub open_for: Option<Mono>,
    /// For an in-flight cut: how long its request had been in the server, since the
    /// connection's last received data (`lrcvtime`). On a keep-alive connection the request
    /// is much younger than the connection.
    #[serde(default)]
    pub request_for: Option<Mono>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenerTimeline {
    pub address: SocketAddr,
    pub closed_at: Option<Mono>,
}

/// When the agent was not watching (a restart) while a stop was open: from its last checkpoint
/// to the restarted agent's first event. What happened then is not in the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentGap {
    pub from: Mono,
    pub to: Mono,
}

impl AgentGap {
    pub fn seconds(&self) -> f64 {
        secs(self.to.saturating_sub(self.from))
    }
}

/// One container stop. Times are kernel monotonic; the export layer renders them. Serialized
/// only into the agent's own checkpoint (`correlate::checkpoint`); the API has its own view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stop {
    pub id: String,
    pub container: ContainerIdentity,
    /// The first stop signal: SIGTERM, or SIGINT/SIGQUIT for images that stop with those.
    pub sigterm_at: Option<Mono>,
    pub stop_signal: Option<i32>,
    pub sigterm_sender: Option<Sender>,
    /// The kernel dropped the stop signal (see [`IgnoredSignal`]).
    #[serde(default)]
    pub stop_signal_ignored: Option<IgnoredSignal>,
    pub sigkill_at: Option<Mono>,
    pub exit_at: Option<Mono>,
    pub exit: Option<ExitInfo>,
    pub cgroup_removed_at: Option<Mono>,
    /// When its pod's sandbox (pause) container ended: a line on the pod's records, not a
    /// stop of its own (see `ContainerIdentity::is_sandbox`).
    #[serde(default)]
    pub sandbox_stopped_at: Option<Mono>,
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
    /// How long its server lets a stream live before it ends it (a write timeout, a max
    /// connection age, a token's expiry), learned on its listeners before the stop; None until
    /// a listener's streams were watched for twice their longest lifetime (see
    /// `correlate::stops::streams`).
    #[serde(default)]
    pub stream_lifetimes: Option<StreamLifetimes>,
    /// Live streams its server ended itself during the stop, by when (see
    /// [`Stop::streams_ended_by_server`]).
    #[serde(default)]
    pub stream_ends: StreamEnds,
    /// False when it settled without what it needed: no exit came (the process outlived the
    /// limit, or its exit event was lost), so its outcome is unknown.
    pub complete: bool,
    /// Kernel events lost anywhere on their way (ring buffer, decode, queue) while it was
    /// open: its counts may be short.
    pub events_lost: u64,
    /// eBPF program faults while it was open that lose what it reads (see `Lost`): its counts
    /// may be short too.
    #[serde(default)]
    pub ebpf_faults: u64,
    /// Set once the record will not change any more (see `Tracker::tick`).
    pub settled: bool,
    /// The agent restarted while it was open (see `AgentGap`); it is then incomplete.
    #[serde(default)]
    pub agent_gap: Option<AgentGap>,
    /// Connects from this node to its address, sent after its run ended and before it was due
    /// to settle, whose outcome has not come yet: it does not settle while any is in flight
    /// (each for at most the kernel's SYN retry time, see `correlate::stops::attempts`).
    #[serde(default)]
    pub attempts_in_flight: u64,
    /// Of those, the ones whose outcome never came within the kernel's SYN retry time (their
    /// socket's next step lost, or a socket's own longer SYN retries): it is then incomplete.
    #[serde(default)]
    pub attempts_unresolved: u64,
}

impl Stop {
    /// A record with nothing observed yet.
    pub fn new(id: String, container: ContainerIdentity) -> Self {
        Self {
            id,
            container,
            sigterm_at: None,
            stop_signal: None,
            sigterm_sender: None,
            stop_signal_ignored: None,
            sigkill_at: None,
            exit_at: None,
            exit: None,
            cgroup_removed_at: None,
            sandbox_stopped_at: None,
            listeners: Vec::new(),
            last_accept_at: None,
            connections_at_sigterm: None,
            connections_at_exit: None,
            grace_configured_seconds: None,
            prestop: None,
            loss: Loss::default(),
            events: Vec::new(),
            events_dropped: 0,
            last_routed_at: None,
            stream_lifetimes: None,
            stream_ends: StreamEnds::default(),
            complete: true,
            events_lost: 0,
            ebpf_faults: 0,
            settled: false,
            agent_gap: None,
            attempts_in_flight: 0,
            attempts_unresolved: 0,
        }
    }

    /// SIGTERM → SIGKILL, as observed.
    pub fn grace_seconds(&self) -> Option<f64> {
        Some(secs(self.sigkill_at?.checked_sub(self.sigterm_at?)?))
    }

    /// The upper percentile (p95) of its streams' lifetimes: what the grace period must cover.
    pub fn stream_rotation_seconds(&self) -> Option<f64> {
        self.stream_lifetimes.map(|l| secs(l.p95))
    }

    /// Live streams its server ended itself during the stop (never cuts), on their own timers
    /// or all at once right after the stop signal.
    pub fn streams_ended_by_server(&self) -> StreamsEnded {
        self.stream_ends.split(self.loss.streams_cut)
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

    /// `None` until the main process has exited. The first that matches:
    /// - `exited`: it exited with code 0 with no stop signal and no SIGKILL before (its work
    ///   done, a Job's end: a normal exit, never a crash);
    /// - `crashed`: it exited otherwise with no stop signal and no SIGKILL before;
    /// - `killed_at_deadline`: SIGKILL came after the stop signal, before the exit;
    /// - `exit_at_once`: SIGKILL with no stop signal first, or it died of the stop signal, or
    ///   it exited within [`AT_ONCE`] of the signal having closed no listener (it did not serve
    ///   on);
    /// - `listener_closed_early`: refused requests (not health checks);
    /// - `drained`.
    ///
    /// What the process did decides it, never the loss: a process that closed its listener,
    /// drained and exited 0 is not renamed by a connection it cut at exit (that cut stays in
    /// the loss and the verdict).
    pub fn outcome(&self) -> Option<Outcome> {
        let exit = self.exit?;
        let exit_at = self.exit_at;
        let stop_first = self
            .sigterm_at
            .is_some_and(|t| exit_at.is_none_or(|e| t <= e));
        let kill_first = self
            .sigkill_at
            .is_some_and(|t| exit_at.is_none_or(|e| t <= e));
        Some(if !stop_first && !kill_first {
            if exit.code == Some(0) && exit.signal.is_none() {
                Outcome::Exited
            } else {
                Outcome::Crashed
            }
        } else if stop_first && kill_first {
            Outcome::KilledAtDeadline
        } else if kill_first
            || (exit.signal.is_some() && exit.signal == self.stop_signal)
            || (!self.closed_a_listener() && self.drain().is_some_and(|d| d <= AT_ONCE))
        {
            Outcome::ExitAtOnce
        } else if self.loss.refused > 0 {
            Outcome::ListenerClosedEarly
        } else {
            Outcome::Drained
        })
    }

    /// SIGTERM → exit, in kernel time.
    fn drain(&self) -> Option<Mono> {
        self.exit_at?.checked_sub(self.sigterm_at?)
    }

    /// Whether it closed one of its listeners after the stop signal and before its main
    /// process exited: the kernel's own close of what an exiting process held comes after
    /// the exit (`sched_process_exit` fires before the descriptors are released).
    pub fn closed_a_listener(&self) -> bool {
        let (Some(term), Some(exit)) = (self.sigterm_at, self.exit_at) else {
            return false;
        };
        self.listeners
            .iter()
            .filter_map(|l| l.closed_at)
            .any(|c| c >= term && c < exit)
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

/// What the kernel side lost while records were open: totals since the agent started, or what
/// is new since the last look. Open stop and start records take what is new, and are then
/// incomplete.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lost {
    /// Events lost on their way: shed, ring buffer, queue, decode.
    pub events: u64,
    /// eBPF program faults that lose part of what a record reads
    /// (`FaultKind::loses_input`), and upstream connections the kernel had no room to follow.
    pub faults: u64,
}

impl Lost {
    /// What this total adds to an earlier one.
    pub fn since(self, before: Lost) -> Lost {
        Lost {
            events: self.events.saturating_sub(before.events),
            faults: self.faults.saturating_sub(before.faults),
        }
    }

    pub fn any(self) -> bool {
        self.events > 0 || self.faults > 0
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, SocketAddr};

    use super::*;

    const MS: Mono = 1_000_000;

    /// SIGTERM at 1 s, exit `drain` later with `exit`, the listener closed at `closed` if any.
    fn stop(drain: Mono, exit: ExitInfo, closed: Option<Mono>) -> Stop {
        let term = SECOND;
        Stop {
            sigterm_at: Some(term),
            stop_signal: Some(SIGTERM),
            exit_at: Some(term + drain),
            exit: Some(exit),
            listeners: vec![ListenerTimeline {
                address: SocketAddr::from((Ipv4Addr::UNSPECIFIED, 8080)),
                closed_at: closed,
            }],
            ..Stop::new("c-1".into(), ContainerIdentity::default())
        }
    }

    const EXIT_0: ExitInfo = ExitInfo {
        code: Some(0),
        signal: None,
    };

    #[test]
    fn exiting_without_closing_a_listener_is_at_once_up_to_the_limit_and_inclusive() {
        let at = |drain| stop(drain, EXIT_0, None).outcome();
        assert_eq!(at(10 * MS), Some(Outcome::ExitAtOnce));
        assert_eq!(at(AT_ONCE - 1), Some(Outcome::ExitAtOnce));
        assert_eq!(at(AT_ONCE), Some(Outcome::ExitAtOnce));
        // It served on past the limit: it drained, whatever it cut at exit.
        let mut s = stop(AT_ONCE + 1, EXIT_0, None);
        assert_eq!(s.outcome(), Some(Outcome::Drained));
        s.loss.inflight_cut = 3;
        assert_eq!(s.outcome(), Some(Outcome::Drained));
    }

    #[test]
    fn dying_of_the_stop_signal_is_at_once_however_long_it_took() {
        let killed = ExitInfo {
            code: Some(128 + SIGTERM),
            signal: Some(SIGTERM),
        };
        let s = stop(5 * SECOND, killed, Some(SECOND + 10 * MS));
        assert_eq!(s.outcome(), Some(Outcome::ExitAtOnce));
    }

    #[test]
    fn closing_the_listener_then_exiting_is_never_renamed_by_a_cut() {
        // Closed the listener 1 ms after the signal, exited 0 after 100 ms (inside the
        // at-once limit): it stopped accepting first, so it drained.
        let mut s = stop(100 * MS, EXIT_0, Some(SECOND + MS));
        assert!(s.closed_a_listener());
        assert_eq!(s.outcome(), Some(Outcome::Drained));
        s.loss.inflight_cut = 1;
        assert_eq!(s.outcome(), Some(Outcome::Drained));
        s.loss.refused = 2;
        assert_eq!(s.outcome(), Some(Outcome::ListenerClosedEarly));
    }

    #[test]
    fn a_listener_closed_by_the_exit_itself_or_before_the_signal_does_not_count() {
        // The kernel closes what an exiting process held after its exit event.
        let s = stop(100 * MS, EXIT_0, Some(SECOND + 100 * MS));
        assert!(!s.closed_a_listener());
        assert_eq!(s.outcome(), Some(Outcome::ExitAtOnce));
        let s = stop(100 * MS, EXIT_0, Some(SECOND - MS));
        assert!(!s.closed_a_listener());
        assert_eq!(s.outcome(), Some(Outcome::ExitAtOnce));
        // Exactly at the signal counts: the handler ran at once.
        assert!(stop(100 * MS, EXIT_0, Some(SECOND)).closed_a_listener());
    }

    #[test]
    fn sigkill_decides_before_anything_the_process_did() {
        let mut s = stop(100 * MS, EXIT_0, Some(SECOND + MS));
        s.sigkill_at = Some(SECOND + 50 * MS);
        assert_eq!(s.outcome(), Some(Outcome::KilledAtDeadline));
        s.sigterm_at = None;
        assert_eq!(s.outcome(), Some(Outcome::ExitAtOnce));
        s.sigkill_at = None;
        // No signal at all: code 0 is a normal exit, any other a crash.
        assert_eq!(s.outcome(), Some(Outcome::Exited));
        s.exit = Some(ExitInfo {
            code: Some(1),
            signal: None,
        });
        assert_eq!(s.outcome(), Some(Outcome::Crashed));
    }
}
