//! Enrich → correlate → export for one event at a time: attributes each event to a container,
//! feeds the stop tracker and the storm detector, and turns what they report into metrics.
//! Synchronous and free of I/O except the enricher's procfs reads, so the agent drives it from
//! its event loop and the benchmark drives it directly.

use std::sync::{Arc, Mutex};

use crate::{
    capture::{event::Event, watch::WatchSet},
    correlate::{
        Mono, Observation,
        stops::{Emitted, Tracker},
        storms::Storms,
    },
    enrich::{
        Enricher,
        attribute::{Fact, ListenSample},
        host::HostView,
    },
    export::metrics::Metrics,
};

pub struct Pipeline<H> {
    enricher: Enricher<H>,
    tracker: Arc<Mutex<Tracker>>,
    storms: Arc<Mutex<Storms>>,
    metrics: Arc<Metrics>,
    retention: Mono,
    ticks: u64,
    watch_generation: Option<u64>,
}

impl<H: HostView> Pipeline<H> {
    pub fn new(
        enricher: Enricher<H>,
        tracker: Arc<Mutex<Tracker>>,
        storms: Arc<Mutex<Storms>>,
        metrics: Arc<Metrics>,
        retention: Mono,
    ) -> Self {
        Self {
            enricher,
            tracker,
            storms,
            metrics,
            retention,
            ticks: 0,
            watch_generation: None,
        }
    }

    /// The start-up scan: containers, listeners and connections that already exist.
    pub fn start(&mut self) {
        let obs = self.enricher.scan();
        self.feed(obs, crate::export::api::monotonic_now(), false);
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

    pub fn container_count(&self) -> usize {
        self.enricher.container_count()
    }

    /// One kernel event.
    pub fn event(&mut self, ev: &Event) {
        let at = ev.meta().ts_ns;
        let obs = self.enricher.on_event(ev);
        for (id, direction, reason) in self.enricher.resets(ev) {
            self.metrics.connection_reset(&id, direction, &reason);
        }
        if let Some(fact) = self.enricher.listener_fact(ev) {
            self.metrics.listener_fact(&fact);
            if let Ok(mut s) = self.storms.lock() {
                let w = (
                    fact.container.namespace.clone(),
                    fact.container.workload.clone(),
                );
                match fact.fact {
                    Fact::Arrival => s.arrival(&w, &fact.container.name, fact.port, at),
                    Fact::AcceptWait(secs) => s.accept_wait(&w, fact.port, secs, at),
                    Fact::Overflow => s.overflow(&w, fact.port),
                }
            }
        }
        self.feed(obs, at, true);
        self.emitted();
    }

    /// Periodic work, called every 100 ms: the rest (rescan, expiry, the tracker's and the
    /// storms' clocks) runs every second. The listen path is sampled every time for workloads
    /// that are stopping or storming, and for all every ten seconds: a sample costs the kernel
    /// a walk of the TCP hash table per listener's namespace (see `enrich/host.rs`).
    pub fn tick(&mut self, now: Mono) {
        self.ticks += 1;
        let second = self.ticks % 10 == 1;
        let full = self.ticks % 100 == 1;
        if second {
            self.enricher.expire(now, self.retention);
            if let Ok(mut s) = self.storms.lock() {
                for storm in s.tick(now) {
                    self.metrics.storm(&storm);
                }
            }
            let obs = self.enricher.scan();
            self.feed(obs, now, false);
            if let Ok(mut t) = self.tracker.lock() {
                t.tick(now);
            }
        }
        // Containers found since the last sample are sampled at once too (see
        // `sample_listen_path`): their first sample is the baseline of a storm that may follow.
        let hot = match self.storms.lock() {
            Ok(s) if !full => s.hot_workloads(now),
            _ => Default::default(),
        };
        if full || !hot.is_empty() || self.enricher.has_unsampled() {
            let sample = self.enricher.sample_listen_path((!full).then_some(&hot));
            self.record_listen_sample(&sample, full);
        }
        self.emitted();
    }

    /// Feeds observations to the tracker; refused connections are also counted outside stops.
    /// `event` marks observations of a kernel event, whose time says how far processing got.
    fn feed(&self, obs: Vec<Observation>, at: Mono, event: bool) {
        let Ok(mut t) = self.tracker.lock() else {
            return;
        };
        for o in obs {
            if let Observation::Container { identity, .. } = &o {
                self.metrics.container_seen(identity);
            }
            if let Observation::Refused { key } = &o
                && let Some(id) = t.identity(key)
            {
                self.metrics.refused_connection(id);
            }
            t.observe(at, o);
        }
        if event {
            t.processed(at);
        }
    }

    fn emitted(&self) {
        let emitted = self
            .tracker
            .lock()
            .map(|mut t| t.take_emitted())
            .unwrap_or_default();
        for e in emitted {
            match e {
                Emitted::Loss {
                    container,
                    kind,
                    reason,
                } => self.metrics.stop_loss(&container, kind, reason.as_deref()),
                Emitted::Settled { stop } => self.metrics.stop_settled(&stop),
                Emitted::StopBegan {
                    container,
                    stop_id,
                    at,
                } => {
                    if let Ok(mut s) = self.storms.lock() {
                        let w = (container.namespace.clone(), container.workload.clone());
                        s.stopped(w, &stop_id, &container.name, at);
                    }
                }
                Emitted::Retry {
                    container,
                    proxy,
                    added_seconds,
                } => self.metrics.retry(&container, &proxy, added_seconds),
            }
        }
    }

    fn record_listen_sample(&self, sample: &ListenSample, complete: bool) {
        for e in &sample.errors {
            tracing::debug!(error = %e, "unreadable net/netstat");
            self.metrics.procfs_error("netstat");
        }
        self.metrics.accept_queues(&sample.queues, complete);
        self.metrics.netns_listen_counters(&sample.netns);
        let Ok(mut s) = self.storms.lock() else {
            return;
        };
        for (c, port, depth, _) in &sample.queues {
            s.queue_depth(&(c.namespace.clone(), c.workload.clone()), *port, *depth);
        }
        for (c, counters) in &sample.netns {
            s.netns_counters(
                &(c.namespace.clone(), c.workload.clone()),
                &c.name,
                *counters,
            );
        }
    }
}
