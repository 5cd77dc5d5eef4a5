//! A stop's lifecycle: its record begun, the stop signal and SIGKILL, the main process's
//! exit, and the clock that settles stops, forgets gone containers and bounds the records.

use super::Tracker;
use crate::{
    correlate::retries::Decision,
    model::{
        Emitted, ExitInfo, Mono, SECOND, Sender,
        stop::{AgentGap, IgnoredSignal, Lost, SIGINT, SIGKILL, SIGQUIT, SIGTERM, Stop},
    },
};

/// A stop that saw no exit settles, incomplete, this long after SIGKILL...
pub const NO_EXIT_AFTER_KILL: Mono = 30 * SECOND;
/// ... or after the stop signal, its grace period (this when unknown: no runtime waits
/// longer by default) and the same margin.
pub const UNKNOWN_GRACE: Mono = 300 * SECOND;

/// When a stop without an exit settles (see the constants above).
fn no_exit_limit(s: &Stop) -> Mono {
    if let Some(kill) = s.sigkill_at {
        return kill + NO_EXIT_AFTER_KILL;
    }
    let grace = s
        .grace_configured_seconds
        .and_then(|g| Mono::try_from(g).ok())
        .map_or(UNKNOWN_GRACE, |g| g * SECOND);
    s.started_at() + grace + NO_EXIT_AFTER_KILL
}

/// When a stop is due to settle: its cgroup gone (or long after its exit) plus the settle
/// delay, or its no-exit limit. It settles then, or once the attempts to its address that
/// began by then have their outcome (`attempts`).
pub(super) fn due(s: &Stop, settle: Mono) -> Mono {
    match (s.exit_at, s.cgroup_removed_at) {
        // Loss seen after that (attempts begun later) is not attributed to this stop.
        (Some(exit_at), removed) => removed.unwrap_or(exit_at + 3 * settle) + settle,
        // No exit, but the cgroup is gone: its exit event was lost; none will come.
        (None, Some(removed)) => removed + settle,
        // No exit: the process outlived every deadline, or its exit event was lost.
        (None, None) => no_exit_limit(s),
    }
}

/// How much earlier than a stop's beginning a cut may be and still be its loss (the kernel's
/// record of a process's death can trail the closes it made).
const CUT_BEFORE_STOP: Mono = 100_000_000;

/// How long before a stop begins its pod's sandbox may have ended and still be its pod's
/// (the stops of one deletion, in either order).
const SANDBOX_BEFORE_STOP: Mono = SECOND;

/// How far behind the clock the events may be while they still come: the clock decides a
/// cut only this long after the event time would have (the queue drains before each tick,
/// at most a second late; the reader batches the ring).
const PIPELINE_LAG: Mono = 5 * SECOND;

impl Tracker {
    /// The stop in progress of `key`, begun now if none is (its sequence number).
    /// Never for a pod's sandbox: see [`Self::sandbox_ended`].
    pub(super) fn begin_stop(&mut self, key: &str, now: Mono) -> Option<usize> {
        let c = self.containers.get_mut(key)?;
        if let Some(i) = c.stop {
            return Some(i);
        }
        if c.identity.is_sandbox() {
            return None;
        }
        c.stops_seen += 1;
        let short: String = c.identity.id.chars().take(12).collect();
        let stop = Stop {
            listeners: c.listeners.clone(),
            last_accept_at: c.last_accept_at,
            grace_configured_seconds: c.identity.stop_policy.grace_configured_seconds,
            prestop: c.identity.stop_policy.prestop,
            stream_lifetimes: c.streams.lifetimes(now),
            ..Stop::new(format!("{short}-{}", c.stops_seen), c.identity.clone())
        };
        // Its pod's sandbox may have gone a moment before: podman stops a pod's containers
        // together, and the sandbox's exit can come first.
        let sandbox_stopped_at = self
            .containers
            .values()
            .filter(|o| o.identity.is_sandbox() && o.identity.same_pod(&stop.container))
            .filter_map(|o| o.gone_at)
            .filter(|at| now.saturating_sub(*at) <= SANDBOX_BEFORE_STOP)
            .max();
        let stop = Stop {
            sandbox_stopped_at,
            ..stop
        };
        self.emitted.push(Emitted::StopBegan {
            container: stop.container.clone(),
            stop_id: stop.id.clone(),
            at: now,
        });
        let seq = self.records.push(stop);
        if let Some(c) = self.containers.get_mut(key) {
            c.stop = Some(seq);
        }
        // Within the cap at once, not only at the next tick (settled records go first).
        self.records.bound(self.config.max_stops);
        Some(seq)
    }

    pub(super) fn on_signal(
        &mut self,
        now: Mono,
        key: &str,
        sig: i32,
        sender: Sender,
        ignored: Option<IgnoredSignal>,
    ) {
        let stop_signal = matches!(sig, SIGTERM | SIGINT | SIGQUIT);
        if !stop_signal && sig != SIGKILL {
            return;
        }
        let exited = self.stop_mut(key).is_some_and(|s| s.exit_at.is_some());
        if exited {
            return; // signals to what is left of an exited container change nothing
        }
        if self.begin_stop(key, now).is_none() {
            return;
        }
        let inbound = self.open_inbound(key);
        let Some(s) = self.stop_mut(key) else { return };
        if stop_signal && s.sigterm_at.is_none() {
            s.sigterm_at = Some(now);
            s.stop_signal = Some(sig);
            s.sigterm_sender = Some(sender);
            s.stop_signal_ignored = ignored;
            s.connections_at_sigterm = Some(inbound);
        } else if sig == SIGKILL && s.sigkill_at.is_none() {
            s.sigkill_at = Some(now);
        }
    }

    /// A pod's sandbox ended (`key` is one): a line on the records of its pod's stops in
    /// progress, none of its own. False when `key` is no sandbox.
    fn sandbox_ended(&mut self, key: &str, now: Mono) -> bool {
        let Some(sandbox) = self.containers.get_mut(key) else {
            return false;
        };
        if !sandbox.identity.is_sandbox() {
            return false;
        }
        sandbox.gone_at.get_or_insert(now);
        let pod = sandbox.identity.clone();
        let stops: Vec<usize> = self
            .containers
            .values()
            .filter(|c| !c.identity.is_sandbox() && c.identity.same_pod(&pod))
            .filter_map(|c| c.stop)
            .collect();
        for seq in stops {
            if let Some(s) = self.records.get_mut(seq).filter(|s| !s.settled) {
                s.sandbox_stopped_at.get_or_insert(now);
            }
        }
        true
    }

    /// What became of a cut request, counted against the cut backend.
    pub(super) fn decided(&mut self, d: Decision) {
        let key = d.cut.backend;
        if let Some(c) = self.containers.get(&key) {
            self.emitted.push(Emitted::Retry {
                container: c.identity.clone(),
                proxy: d.cut.proxy.name,
                outcome: d.outcome,
            });
        }
        // A cut from before the stop began (decided only once it had) is not its loss: a stop
        // cuts at its signal or exit, never earlier. The metric above still counts it.
        let before = self
            .stop_mut(&key)
            .is_some_and(|s| d.cut.at.saturating_add(CUT_BEFORE_STOP) < s.started_at());
        if before {
            tracing::debug!(
                at = d.cut.at,
                "retry verdict of a cut before the stop: not its loss"
            );
            return;
        }
        // At the cut: where the request was lost, not where it was decided.
        self.count(&key, d.outcome.loss(), None, d.cut.at, None);
    }

    pub(super) fn on_exit(&mut self, now: Mono, key: &str, exit: ExitInfo) {
        if self.stop_mut(key).is_some_and(|s| s.exit_at.is_some()) {
            return; // duplicate
        }
        if self.sandbox_ended(key, now) {
            return;
        }
        if self.begin_stop(key, now).is_none() {
            return;
        }
        let inbound = self.open_inbound(key);
        if let Some(c) = self.containers.get_mut(key) {
            c.gone_at.get_or_insert(now);
        }
        let in_gap = self.stop_began_in_gap(key, now);
        if let Some(s) = self.stop_mut(key) {
            s.exit_at = Some(now);
            s.exit = Some(exit);
            s.connections_at_exit = Some(inbound);
            if in_gap.is_some() && s.sigterm_at.is_none() && s.sigkill_at.is_none() {
                s.agent_gap = in_gap;
                s.complete = false;
            }
        }
    }

    /// The agent's restart gap, when a stop signal to `key` may have come in it unseen: the
    /// container ran then (it did not start after the gap) and exits within its grace period
    /// (300 s when unknown) of the gap's end.
    fn stop_began_in_gap(&self, key: &str, now: Mono) -> Option<AgentGap> {
        let gap = self.gap?;
        let c = self.containers.get(key)?;
        if c.started_at.is_some_and(|at| at >= gap.to) {
            return None;
        }
        let grace = c
            .identity
            .stop_policy
            .grace_configured_seconds
            .and_then(|g| Mono::try_from(g).ok())
            .map_or(UNKNOWN_GRACE, |g| g * SECOND);
        (now <= gap.to.saturating_add(grace)).then_some(gap)
    }

    /// `new`: what was lost since the last call, charged to every open record.
    pub fn lost(&mut self, new: Lost) {
        for (_, s) in self.records.iter_mut() {
            if !s.settled {
                s.events_lost += new.events;
                s.ebpf_faults += new.faults;
                s.complete = false;
            }
        }
    }

    /// Advances the clock: settles stops whose container is gone long enough, forgets
    /// containers past the retention window, bounds the number of records.
    pub fn tick(&mut self, now: Mono) {
        // Event time judges held refusals; the clock only when events stopped coming (it runs
        // ahead of events still in the pipeline).
        self.release_held(now.saturating_sub(SECOND));
        // Cuts are decided on event time as events come (`processed`); the clock decides only
        // once events stopped coming for `PIPELINE_LAG`, so that a pipeline that fell behind
        // on a busy node (the scan of a thousand containers, a CPU shared with spinning
        // work) never decides a cut an abort before reading its retry.
        for d in self.retries.tick(now.saturating_sub(PIPELINE_LAG)) {
            self.decided(d);
        }
        self.expire_sessions(now);
        self.expire_attempts(now);
        let settle = self.config.settle;
        let mut settled = Vec::new();
        for (_, s) in self.records.iter_mut() {
            if s.settled {
                continue;
            }
            // Attempts to its vanished address still in flight hold it (see `attempts`).
            let due = due(s, settle);
            if now >= due && s.attempts_in_flight == 0 {
                s.complete = s.exit_at.is_some()
                    && s.events_lost == 0
                    && s.ebpf_faults == 0
                    && s.agent_gap.is_none()
                    && s.attempts_unresolved == 0;
                s.settled = true;
                settled.push(s.clone());
            }
        }
        for s in settled {
            self.emitted.push(Emitted::Settled { stop: Box::new(s) });
        }
        let retention = self.config.retention;
        let records = &self.records;
        let probes = &mut self.probes;
        let emitted = &mut self.emitted;
        self.containers.retain(|key, c| {
            let Some(gone) = c.gone_at else { return true };
            let settled = c
                .stop
                .and_then(|seq| records.get(seq))
                .is_none_or(|s| s.settled);
            let keep = !(settled && now >= gone + retention);
            if !keep {
                probes.forget_backend(key);
                emitted.push(Emitted::ContainerForgotten {
                    container: c.identity.clone(),
                });
            }
            keep
        });
        // After a stop settled and the container lives on (a restart in place, or a stop
        // that never saw an exit), the next signal starts a new record.
        for c in self.containers.values_mut() {
            if c.stop
                .and_then(|seq| self.records.get(seq))
                .is_some_and(|s| s.settled)
                && c.gone_at.is_none()
            {
                c.stop = None;
            }
        }
        self.records.bound(self.config.max_stops);
    }
}
