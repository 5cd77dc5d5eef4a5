//! The pipeline for one event at a time, as a straight line: decode (done by the reader) →
//! enrich (one call, observations) → correlate (one call, what happened) → telemetry (one
//! call per emitted item). Synchronous and free of I/O except the enricher's procfs reads, so
//! the agent drives it from its event loop and the benchmark drives it directly.

use std::sync::{Arc, Mutex};

use crate::{
    capture::{event::Event, watch::WatchSet},
    correlate::Correlator,
    enrich::{Enricher, host::HostView},
    model::{Emitted, Mono, Observation, monotonic_now},
    telemetry::{ProcfsFile, Telemetry, internal::ProcfsUnreadable},
};

/// The correlator, shared with the HTTP server, which reads its stops and storms.
pub type SharedCorrelator = Arc<Mutex<Correlator>>;

pub struct Pipeline<H> {
    enricher: Enricher<H>,
    correlator: SharedCorrelator,
    telemetry: Arc<Telemetry>,
    retention: Mono,
    ticks: u64,
    watch_generation: Option<u64>,
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
        }
    }

    /// The start-up scan: containers, listeners and connections that already exist.
    pub fn start(&mut self) {
        let obs = self.enricher.scan();
        self.correlate(monotonic_now(), obs, false);
    }

    /// The host-namespace watch set, when it may have changed since the last call.
    pub fn watch_update(&mut self) -> Option<WatchSet> {
        let generation = self.enricher.watch_generation();
        if self.watch_generation == Some(generation) {
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

    pub fn container_count(&self) -> usize {
        self.enricher.container_count()
    }

    /// One kernel event.
    pub fn event(&mut self, ev: &Event) {
        let obs = self.enricher.on_event(ev);
        self.correlate(ev.meta().ts_ns, obs, true);
    }

    /// Periodic work, called every 100 ms: the rest (rescan, expiry, the correlator's clock)
    /// runs every second. The listen path is sampled every time for workloads that are
    /// stopping or storming, and for all every ten seconds: a sample costs the kernel a walk
    /// of the TCP hash table per listener's namespace (see `enrich/host.rs`).
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
            let lost = self.telemetry.lost_total();
            let (emitted, state) = self.with_correlator(|c| {
                c.events_lost(lost);
                (c.tick(now), c.state())
            });
            self.telemetry.state.record(&state);
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
            let (sample, errors) = self.enricher.sample_listen_path((!full).then_some(&hot));
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
