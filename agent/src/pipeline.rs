//! The pipeline for one event at a time, as a straight line: decode (done by the reader) →
//! enrich (one call, observations) → correlate (one call, what happened) → telemetry (one
//! call per emitted item). Synchronous and free of I/O except the enricher's procfs reads, so
//! the agent drives it from its event loop and the benchmark drives it directly.

use std::{
    sync::{Arc, Mutex},
    time::Instant,
};

use crate::{
    capture::{event::Event, watch::WatchSet},
    correlate::Correlator,
    enrich::{Enricher, host::HostView},
    model::{Emitted, Mono, Observation, monotonic_now},
    telemetry::{
        ProcfsFile, Telemetry,
        internal::ProcfsUnreadable,
        work::{SampleScope, thread_cpu_seconds},
    },
};

/// Watch-set rebuilds: this many at once, then one per `WATCH_EVERY` (see
/// `Pipeline::watch_update`).
pub const WATCH_BURST: u32 = 20;
pub const WATCH_EVERY: Mono = 10_000_000;

/// A token bucket: [`WATCH_BURST`] at once, one more per [`WATCH_EVERY`].
#[derive(Debug)]
struct Budget {
    tokens: u32,
    at: Mono,
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            tokens: WATCH_BURST,
            at: 0,
        }
    }
}

impl Budget {
    fn take(&mut self, now: Mono) -> bool {
        let earned = now.saturating_sub(self.at) / WATCH_EVERY;
        if earned > 0 {
            let earned = u32::try_from(earned).unwrap_or(u32::MAX);
            self.tokens = self.tokens.saturating_add(earned).min(WATCH_BURST);
            self.at = now;
        }
        let ok = self.tokens > 0;
        self.tokens = self.tokens.saturating_sub(1);
        ok
    }
}

/// The correlator, shared with the HTTP server, which reads its stops and storms.
pub type SharedCorrelator = Arc<Mutex<Correlator>>;

pub struct Pipeline<H> {
    enricher: Enricher<H>,
    correlator: SharedCorrelator,
    telemetry: Arc<Telemetry>,
    retention: Mono,
    ticks: u64,
    watch_generation: Option<u64>,
    /// Rebuilds of the watch set it may do at once (`watch_update`).
    watch_budget: Budget,
    /// One event's observations and what they made happen, kept between events.
    observations: Vec<Observation>,
    emitted: Vec<Emitted>,
}

impl<H: HostView> Pipeline<H> {
    pub fn new(
        enricher: Enricher<H>,
        correlator: SharedCorrelator,
        telemetry: Arc<Telemetry>,
        retention: Mono,
    ) -> Self {
        Self {
            enricher,
            correlator,
            telemetry,
            retention,
            ticks: 0,
            watch_generation: None,
            watch_budget: Budget::default(),
            observations: Vec::new(),
            emitted: Vec::new(),
        }
    }

    /// The start-up scan: containers, listeners and connections that already exist.
    pub fn start(&mut self) {
        let obs = self.enricher.scan();
        self.correlate(monotonic_now(), obs, false);
    }

    /// The host-namespace watch set, when it may have changed since the last call. At once
    /// (a new listener's first connection must be kept) up to [`WATCH_BURST`] times, then
    /// once per [`WATCH_EVERY`]: a `listen; close` loop in a pod rebuilds it 100 times a
    /// second, not once per event; a change held back goes at the next call (the tick's, at
    /// the latest).
    /// `now` is read only when the set may have changed: this runs after every event.
    pub fn watch_update(&mut self, now: impl FnOnce() -> Mono) -> Option<WatchSet> {
        let generation = self.enricher.watch_generation();
        if self.watch_generation == Some(generation) {
            return None;
        }
        if !self.watch_budget.take(now()) {
            return None;
        }
        self.watch_generation = Some(generation);
        Some(self.enricher.watch_set())
    }

    /// Upstream sockets the agent must add to the kernel's map itself (see
    /// `Enricher::take_follow`).
    pub fn take_follow(&mut self) -> Vec<u64> {
        self.enricher.take_follow()
    }

    /// Hands what a restarted agent would resume from (`crate::checkpoint`) to `f`, under the
    /// correlator's lock: `f` should only encode it.
    pub fn with_checkpoint(&self, f: impl FnOnce(crate::correlate::Checkpoint<'_>)) {
        self.with_correlator(|c| f(c.checkpoint()))
    }

    pub fn container_count(&self) -> usize {
        self.enricher.container_count()
    }

    /// The network namespaces whose arrivals the kernel must send as they come (`--hold`).
    pub fn hot_netns(&self, now: Mono) -> std::collections::BTreeSet<u32> {
        let (keys, workloads) = self.with_correlator(|c| c.hot(now));
        self.enricher.netns_of(&keys, &workloads)
    }

    /// The network namespaces whose accepted connections' answers the kernel times: those of
    /// the workloads a storm may follow (`Storms::watched`).
    pub fn storming_netns(&self, now: Mono) -> std::collections::BTreeSet<u32> {
        let workloads = self.with_correlator(|c| c.storm_watched(now));
        if workloads.is_empty() {
            return Default::default();
        }
        self.enricher.netns_of(&Default::default(), &workloads)
    }

    /// One kernel event.
    pub fn event(&mut self, ev: &Event) {
        let (obs, emitted) = (&mut self.observations, &mut self.emitted);
        self.enricher.on_event_into(ev, obs);
        let at = ev.meta().ts_ns;
        if let Ok(mut c) = self.correlator.lock() {
            c.observe_into(at, obs, true, emitted);
        }
        obs.clear();
        for e in emitted.drain(..) {
            self.telemetry.record(&e);
        }
    }

    /// Periodic work, called every 100 ms: the rest (rescan, expiry, the correlator's clock)
    /// runs every second. The listen path is sampled every time for workloads that are
    /// stopping or storming, and for all every ten seconds: a sample costs the kernel part of a
    /// walk of the host's TCP hash table per namespace (see `Procfs::listeners`).
    pub fn tick(&mut self, now: Mono) {
        self.ticks += 1;
        let refusals = self.enricher.flush(now);
        if !refusals.is_empty() {
            self.correlate(now, refusals, false);
        }
        let second = self.ticks % 10 == 1;
        let full = self.ticks % 100 == 1;
        if second {
            self.enricher.expire(now, self.retention);
            let obs = self.enricher.scan();
            self.correlate(now, obs, false);
            self.telemetry
                .starts
                .set_unowned_resets(self.enricher.unowned_dropped());
            self.telemetry
                .starts
                .set_unseen_containers(self.enricher.unseen_containers());
            self.telemetry
                .work
                .nat_lookups(&self.enricher.nat_lookups());
            self.telemetry
                .starts
                .set_resets_by_inode(self.enricher.resets_by_inode());
            let lost = self.telemetry.lost();
            let (emitted, state) = self.with_correlator(|c| {
                c.lost(lost);
                (c.tick(now), c.state())
            });
            self.telemetry.state.record(&state);
            self.telemetry.state.record(&self.enricher.state());
            self.telemetry
                .work
                .containers(self.enricher.running_containers());
            self.record(&emitted);
        }
        // Containers found since the last sample are sampled at once too (see
        // `sample_listen_path`): their first sample is the baseline of a storm that may follow.
        let hot = if full {
            Default::default()
        } else {
            self.with_correlator(|c| c.hot_workloads(now))
        };
        if full || !hot.is_empty() || self.enricher.has_unsampled() {
            let (wall, cpu) = (Instant::now(), thread_cpu_seconds());
            let (sample, errors) = self.enricher.sample_listen_path((!full).then_some(&hot));
            self.telemetry.work.listen_sample(
                if full {
                    SampleScope::All
                } else {
                    SampleScope::Some
                },
                wall.elapsed().as_secs_f64(),
                thread_cpu_seconds() - cpu,
            );
            for error in &errors {
                ProcfsUnreadable {
                    file: ProcfsFile::Netstat,
                    error,
                }
                .emit(&self.telemetry);
            }
            let emitted = self.with_correlator(|c| c.listen_sample(sample));
            self.record(&emitted);
        }
    }

    fn correlate(&self, at: Mono, obs: Vec<Observation>, event: bool) {
        let emitted = self.with_correlator(|c| c.observe(at, obs, event));
        self.record(&emitted);
    }

    fn with_correlator<T: Default>(&self, f: impl FnOnce(&mut Correlator) -> T) -> T {
        self.correlator
            .lock()
            .map(|mut c| f(&mut c))
            .unwrap_or_default()
    }

    fn record(&self, emitted: &[Emitted]) {
        for e in emitted {
            self.telemetry.record(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_rebuilds_go_at_once_in_bursts_then_at_a_bounded_rate() {
        let mut b = Budget::default();
        let t0 = 1_000 * crate::model::SECOND;
        let at_once = (0..100).filter(|_| b.take(t0)).count();
        assert_eq!(at_once, WATCH_BURST as usize);
        // A loop of changes for a second: one rebuild per 10 ms.
        let per_ms = (1..=1000).filter(|ms| b.take(t0 + ms * 1_000_000)).count();
        assert_eq!(per_ms, 100);
        // After a quiet spell, at once again.
        assert!(b.take(t0 + 10 * crate::model::SECOND));
    }
}
