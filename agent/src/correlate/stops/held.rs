//! Refusals, and observations that cannot be judged yet. A refused attempt on a tick of a learned check
//! schedule carries no size: the check is the attempt of that tick closest to its due time,
//! and an attempt's refusal is known microseconds after its connect, before a later attempt of
//! the same tick has even connected. Such a refusal waits, in event time, until the tick's
//! window has passed (at most 2% of the check interval), then is judged with every attempt of
//! the tick known.

use super::Tracker;
use crate::{
    correlate::probes::{Attempt, ProbeSource},
    model::{
        ContainerIdentity, Emitted, LossKind, Mono, Observation,
        stop::{LossEvent, MAX_LOSS_EVENTS, Stop},
    },
};

/// Counts one loss on `stop`; what telemetry is told.
pub(super) fn record(
    stop: &mut Stop,
    kind: LossKind,
    reason: Option<String>,
    at: Mono,
    open_for: Option<Mono>,
    request_for: Option<Mono>,
) -> Emitted {
    if kind.is_routed() {
        stop.last_routed_at = stop.last_routed_at.max(Some(at));
    }
    if kind.on_timeline() {
        if stop.events.len() < MAX_LOSS_EVENTS {
            stop.events.push(LossEvent {
                at,
                kind,
                open_for,
                request_for,
            });
        } else {
            stop.events_dropped += 1;
        }
    }
    stop.loss.count(kind, reason.as_deref());
    Emitted::Loss {
        container: stop.container.clone(),
        kind,
        reason,
    }
}

/// Held at most; past it the oldest is judged at once (never dropped).
const MAX_HELD: usize = 1024;

/// A refusal waiting to be judged.
#[derive(Debug)]
struct Refusal {
    until: Mono,
    /// When it was observed, and when the kernel saw it.
    observed: Mono,
    at: Mono,
    key: crate::model::observation::ContainerKey,
    /// The connection, named now: its socket may carry another by the time it is judged.
    attempt: Attempt,
}

#[derive(Debug, Default)]
pub(super) struct Held {
    /// Oldest first.
    waiting: Vec<Refusal>,
}

impl Held {
    /// When the oldest held observation was made.
    pub(super) fn oldest(&self) -> Option<Mono> {
        self.waiting.iter().map(|r| r.observed).min()
    }
}

impl Tracker {
    /// Feeds one observation made at `now`.
    pub fn observe(&mut self, now: Mono, obs: Observation) {
        self.release_held(now);
        if let Observation::Refused {
            key, at, upstream, ..
        } = &obs
            && let Some((attempt, until)) = self.probes.refused(*upstream)
            && until > now
        {
            if self.held.waiting.len() >= MAX_HELD {
                let old = self.held.waiting.remove(0);
                self.judge(old);
            }
            tracing::debug!(now, until, "held: a refusal on a check tick");
            self.held.waiting.push(Refusal {
                until,
                observed: now,
                at: *at,
                key: key.clone(),
                attempt,
            });
            return;
        }
        self.apply(now, obs);
    }

    /// Records that every event up to `at` has been fed.
    pub fn processed(&mut self, at: Mono) {
        self.processed_until = self.processed_until.max(at);
        self.release_held(at);
        for d in self.retries.tick(at) {
            self.decided(d);
        }
    }

    /// Up to when everything fed is in the records: a held observation is not yet.
    pub fn processed_until(&self) -> Mono {
        self.held.oldest().map_or(self.processed_until, |at| {
            self.processed_until.min(at.saturating_sub(1))
        })
    }

    /// Judges the held observations whose time has come.
    pub(super) fn release_held(&mut self, now: Mono) {
        if self.held.waiting.iter().all(|r| r.until > now) {
            return;
        }
        let (due, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held.waiting)
            .into_iter()
            .partition(|r| r.until <= now);
        self.held.waiting = keep;
        for r in due {
            tracing::debug!(now, at = r.observed, "held: judged");
            self.judge(r);
        }
    }

    fn judge(&mut self, r: Refusal) {
        let probe = self.probes.classify_attempt(r.attempt, None);
        self.refusal(&r.key, r.at, probe);
    }
}

impl Tracker {
    /// A refused attempt at `at`, a probe or a request.
    pub(super) fn refusal(&mut self, key: &str, at: Mono, probe: Option<ProbeSource>) {
        if probe.is_none()
            && let Some(c) = self.containers.get(key)
        {
            // Stop or not: the refused requests of a known container.
            self.emitted.push(Emitted::Refused {
                container: c.identity.clone(),
            });
        }
        let kind = self.probe_or(key, probe, LossKind::Refused, LossKind::ProbeRefused);
        // Reported after the container restarted in place (the enricher decided it was the
        // old run's): the old run's stop's, settled or not.
        let (late, current) = self
            .containers
            .get(key)
            .map_or((None, None), |c| (c.previous_stop, c.stop));
        let newer = current.filter(|c| Some(*c) != late.map(|l| l.0));
        if let Some((i, _)) = late.filter(|(_, restarted)| at <= *restarted)
            && newer.is_none_or(|_| self.stop_mut(key).is_none_or(|s| s.started_at() > at))
            && let Some(stop) = self.records.get_mut(i)
        {
            let e = record(stop, kind, None, at, None, None);
            self.emitted.push(e);
            return;
        }
        self.count(key, kind, None, at, None);
    }

    /// A connect refused where no listener of the container had been: counted (a health
    /// check apart), no stop's loss.
    pub(super) fn refused_elsewhere(&mut self, c: &ContainerIdentity, upstream: Option<u64>) {
        if self.probes.classify(upstream, None).is_none() {
            self.emitted.push(Emitted::Refused {
                container: c.clone(),
            });
        }
    }
}
