//! The agent's own metrics (prometheus-client). Label values are closed sets: hook kinds, loss
//! stages, plan signals and hooks. prometheus-client appends `_total` to counters and `_info` to
//! info metrics itself.

use std::{collections::HashSet, sync::Mutex};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram, info::Info},
    registry::Registry,
};

use drainwatch_common::EventKind;

use crate::{
    capture::{event::kind_name, plan::SignalStatus},
    model::{
        ContainerIdentity, Emitted, Fact, ListenCounters, LossKind, ResetDirection,
        stop::{Outcome, Stop},
        storm::Storm,
    },
};

/// Most distinct containers (namespace, workload, container) the per-container families
/// keep; past it new ones are dropped and counted in `drainwatch_series_dropped_total`.
pub const MAX_CONTAINERS: usize = 2000;

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ContainerLabels {
    pub namespace: String,
    pub workload: String,
    pub container: String,
}

impl From<&ContainerIdentity> for ContainerLabels {
    fn from(c: &ContainerIdentity) -> Self {
        Self {
            namespace: c.namespace.clone(),
            workload: c.workload.clone(),
            container: c.name.clone(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OutcomeLabels {
    namespace: String,
    workload: String,
    container: String,
    outcome: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    namespace: String,
    workload: String,
    container: String,
    reason: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResetLabels {
    namespace: String,
    workload: String,
    container: String,
    direction: String,
    reason: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ProxyLabels {
    namespace: String,
    workload: String,
    container: String,
    proxy: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct PortLabels {
    namespace: String,
    workload: String,
    container: String,
    port: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct MetricLabels {
    metric: String,
}

/// Per-container series, capped.
struct StopFamilies {
    stops: Family<OutcomeLabels, Counter>,
    inflight_cut: Family<ContainerLabels, Counter>,
    refused: Family<ContainerLabels, Counter>,
    unreachable: Family<ContainerLabels, Counter>,
    accepted_after_sigterm: Family<ContainerLabels, Counter>,
    resets_sent: Family<ReasonLabels, Counter>,
    drain_duration: Family<ContainerLabels, Histogram>,
    routing_lag: Family<ContainerLabels, Histogram>,
    grace_period: Family<ContainerLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    connection_resets: Family<ResetLabels, Counter>,
    refused_connections: Family<ContainerLabels, Counter>,
    retry_duplicates: Family<ProxyLabels, Counter>,
    upstream_aborts: Family<ProxyLabels, Counter>,
    retry_added_latency: Family<ContainerLabels, Histogram>,
    accept_wait: Family<PortLabels, Histogram>,
    arrivals: Family<PortLabels, Counter>,
    listen_overflows: Family<PortLabels, Counter>,
    accept_queue_depth: Family<PortLabels, Gauge>,
    accept_queue_limit: Family<PortLabels, Gauge>,
    storms: Family<PortLabels, Counter>,
    storm_peak_rate: Family<PortLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    storm_window: Family<PortLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    storm_observed_window: Family<PortLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    netns_listen_overflows: Family<ContainerLabels, Counter>,
    netns_listen_drops: Family<ContainerLabels, Counter>,
    /// The kernel's absolute counters as last seen, to add only their growth.
    netns_seen: Mutex<std::collections::HashMap<ContainerLabels, ListenCounters>>,
    /// Listeners whose queue gauges were set last time, to remove the ones that went away.
    queues_seen: Mutex<HashSet<PortLabels>>,
    series_dropped: Family<MetricLabels, Counter>,
    seen: Mutex<HashSet<ContainerLabels>>,
}

fn seconds_buckets() -> Histogram {
    Histogram::new([
        0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
    ])
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LossStage {
    Ringbuf,
    Queue,
    Decode,
}

impl LossStage {
    pub const ALL: [LossStage; 3] = [LossStage::Ringbuf, LossStage::Queue, LossStage::Decode];
    pub fn as_str(self) -> &'static str {
        match self {
            LossStage::Ringbuf => "ringbuf",
            LossStage::Queue => "queue",
            LossStage::Decode => "decode",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StageLabels {
    stage: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ProbeLabels {
    signal: String,
    hook: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct SignalLabels {
    signal: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct MapLabels {
    map: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct FileLabels {
    file: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    kernel: String,
}

pub struct Metrics {
    pub registry: Registry,
    events: Family<KindLabels, Counter>,
    filtered: Family<KindLabels, Counter>,
    watch_refused: Counter,
    watch_entries: Family<MapLabels, Gauge>,
    lost: Family<StageLabels, Counter>,
    probe_attached: Family<ProbeLabels, Gauge>,
    probe_degraded: Family<SignalLabels, Gauge>,
    procfs_errors: Family<FileLabels, Counter>,
    stop: StopFamilies,
}

impl Metrics {
    pub fn new(kernel: &str) -> Self {
        let mut registry = Registry::default();
        let events = Family::<KindLabels, Counter>::default();
        let filtered = Family::<KindLabels, Counter>::default();
        let watch_refused = Counter::default();
        let watch_entries = Family::<MapLabels, Gauge>::default();
        let lost = Family::<StageLabels, Counter>::default();
        let probe_attached = Family::<ProbeLabels, Gauge>::default();
        let probe_degraded = Family::<SignalLabels, Gauge>::default();
        let procfs_errors = Family::<FileLabels, Counter>::default();
        registry.register(
            "drainwatch_events",
            "Events received from the kernel, by hook",
            events.clone(),
        );
        registry.register(
            "drainwatch_events_filtered",
            "Events dropped in the kernel as out of scope, by hook: host-namespace connections that touch no container (--host-traffic all keeps them)",
            filtered.clone(),
        );
        registry.register(
            "drainwatch_watch_map_full",
            "Container addresses the kernel's watch map had no room for: host-side traffic to them is not captured",
            watch_refused.clone(),
        );
        registry.register(
            "drainwatch_watch_entries",
            "What the kernel keeps the host namespace's connections for: container addresses, and ports of host-network containers' listeners",
            watch_entries.clone(),
        );
        for map in ["addresses", "ports"] {
            let _ = watch_entries.get_or_create(&MapLabels { map: map.into() });
        }
        registry.register(
            "drainwatch_events_lost",
            "Events lost before processing, by stage: ringbuf (kernel could not reserve), queue (consumer behind), decode (malformed record)",
            lost.clone(),
        );
        registry.register(
            "drainwatch_probe_attached",
            "1 for the hook each signal uses, 0 for hooks tried that failed on this kernel",
            probe_attached.clone(),
        );
        registry.register(
            "drainwatch_probe_degraded",
            "1 when the hook a signal uses lacks fields or offsets on this kernel (see the start-up log)",
            probe_degraded.clone(),
        );
        registry.register(
            "drainwatch_build",
            "drainwatch version and the kernel it runs on",
            Info::new(BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_string(),
                kernel: kernel.to_string(),
            }),
        );
        let stop = StopFamilies {
            stops: Family::default(),
            inflight_cut: Family::default(),
            refused: Family::default(),
            unreachable: Family::default(),
            accepted_after_sigterm: Family::default(),
            resets_sent: Family::default(),
            drain_duration: Family::new_with_constructor(seconds_buckets),
            routing_lag: Family::new_with_constructor(seconds_buckets),
            grace_period: Family::default(),
            connection_resets: Family::default(),
            refused_connections: Family::default(),
            retry_duplicates: Family::default(),
            upstream_aborts: Family::default(),
            retry_added_latency: Family::new_with_constructor(seconds_buckets),
            accept_wait: Family::new_with_constructor(|| {
                Histogram::new([
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                ])
            }),
            arrivals: Family::default(),
            listen_overflows: Family::default(),
            accept_queue_depth: Family::default(),
            accept_queue_limit: Family::default(),
            queues_seen: Mutex::new(HashSet::new()),
            storms: Family::default(),
            storm_peak_rate: Family::default(),
            storm_window: Family::default(),
            storm_observed_window: Family::default(),
            netns_listen_overflows: Family::default(),
            netns_listen_drops: Family::default(),
            netns_seen: Mutex::default(),
            series_dropped: Family::default(),
            seen: Mutex::new(HashSet::new()),
        };
        registry.register(
            "drainwatch_container_stops",
            "Container stops, by outcome, counted when a stop settles",
            stop.stops.clone(),
        );
        registry.register(
            "drainwatch_stop_inflight_cut",
            "Inbound connections a stopping container closed or reset with a request pending",
            stop.inflight_cut.clone(),
        );
        registry.register(
            "drainwatch_stop_refused",
            "Connection attempts refused by a stopping container's closed listener",
            stop.refused.clone(),
        );
        registry.register(
            "drainwatch_stop_unreachable",
            "Connection attempts from this node to a stopped container's address after it was gone",
            stop.unreachable.clone(),
        );
        registry.register(
            "drainwatch_stop_accepted_after_sigterm",
            "Connections a container accepted after its stop signal",
            stop.accepted_after_sigterm.clone(),
        );
        registry.register(
            "drainwatch_stop_resets_sent",
            "RSTs a stopping container sent on its connections, by kernel reason",
            stop.resets_sent.clone(),
        );
        registry.register(
            "drainwatch_drain_duration_seconds",
            "Stop signal to main process exit",
            stop.drain_duration.clone(),
        );
        registry.register(
            "drainwatch_routing_lag_seconds",
            "Stop signal to the last connection accepted after it",
            stop.routing_lag.clone(),
        );
        registry.register(
            "drainwatch_grace_period_seconds",
            "Grace period of the container's last stop: terminationGracePeriodSeconds from the Kubernetes API, else stop signal to SIGKILL when it ran out",
            stop.grace_period.clone(),
        );
        registry.register(
            "drainwatch_connection_resets",
            "RSTs on containers' connections, stop or not, by direction and kernel reason",
            stop.connection_resets.clone(),
        );
        registry.register(
            "drainwatch_refused_connections",
            "Connection attempts refused at a container's former listening address, stop or not",
            stop.refused_connections.clone(),
        );
        registry.register(
            "drainwatch_retry_duplicates",
            "Requests a container cut that a proxy on this node re-sent to another backend: done twice, invisible to the client",
            stop.retry_duplicates.clone(),
        );
        registry.register(
            "drainwatch_upstream_aborts",
            "Requests a container cut that no proxy re-sent: the client saw an error",
            stop.upstream_aborts.clone(),
        );
        registry.register(
            "drainwatch_retry_added_latency_seconds",
            "Latency a proxy retry added: from the original upstream connection to the retry's",
            stop.retry_added_latency.clone(),
        );
        registry.register(
            "drainwatch_accept_wait_seconds",
            "Time connections waited in a listener's accept queue: handshake complete to accept()",
            stop.accept_wait.clone(),
        );
        registry.register(
            "drainwatch_connection_arrivals",
            "Connections that completed their handshake on a container's listener",
            stop.arrivals.clone(),
        );
        registry.register(
            "drainwatch_listen_overflows",
            "Completed handshakes a container's listener dropped because its accept queue was full",
            stop.listen_overflows.clone(),
        );
        registry.register(
            "drainwatch_accept_queue_depth",
            "Connections waiting in a container listener's accept queue (sampled each second)",
            stop.accept_queue_depth.clone(),
        );
        registry.register(
            "drainwatch_accept_queue_limit",
            "A container listener's accept queue limit (its listen() backlog capped by somaxconn), for listeners opened while the agent ran",
            stop.accept_queue_limit.clone(),
        );
        registry.register(
            "drainwatch_reconnect_storms",
            "Reconnect storms: clients of a stopped container coming back at once to a listener of the same workload",
            stop.storms.clone(),
        );
        registry.register(
            "drainwatch_reconnect_storm_peak_rate",
            "Peak arrivals per second (100 ms resolution) of the last reconnect storm",
            stop.storm_peak_rate.clone(),
        );
        registry.register(
            "drainwatch_reconnect_window_recommended_seconds",
            "Reconnect window the last storm needed: its clients divided by the accept rate the listener sustained",
            stop.storm_window.clone(),
        );
        registry.register(
            "drainwatch_reconnect_storm_window_seconds",
            "How long the last storm's clients took to come back (first arrival to 95%): compare with the recommended window",
            stop.storm_observed_window.clone(),
        );
        registry.register(
            "drainwatch_netns_listen_overflows",
            "The kernel's TcpExt ListenOverflows of a container's network namespace: connections dropped because an accept queue was full, including those no drop event reports",
            stop.netns_listen_overflows.clone(),
        );
        registry.register(
            "drainwatch_netns_listen_drops",
            "The kernel's TcpExt ListenDrops of a container's network namespace: every drop on its listen path",
            stop.netns_listen_drops.clone(),
        );
        registry.register(
            "drainwatch_procfs_errors",
            "procfs files that could not be parsed, by file",
            procfs_errors.clone(),
        );
        registry.register(
            "drainwatch_series_dropped",
            "Series not created because the per-container cardinality cap was reached",
            stop.series_dropped.clone(),
        );
        // Every closed-set series exists from the start, so rates and alerts see zeros.
        for k in EventKind::ALL {
            let _ = events.get_or_create(&KindLabels {
                kind: kind_name(k).into(),
            });
            let _ = filtered.get_or_create(&KindLabels {
                kind: kind_name(k).into(),
            });
        }
        for s in LossStage::ALL {
            let _ = lost.get_or_create(&StageLabels {
                stage: s.as_str().into(),
            });
        }
        let _ = procfs_errors.get_or_create(&FileLabels {
            file: "netstat".into(),
        });
        Self {
            registry,
            events,
            filtered,
            watch_refused,
            watch_entries,
            lost,
            probe_attached,
            probe_degraded,
            procfs_errors,
            stop,
        }
    }

    /// Whether series for this container may be created (cardinality cap), counting refusals.
    fn admit(&self, c: &ContainerLabels, metric: &str) -> bool {
        let Ok(mut seen) = self.stop.seen.lock() else {
            return false;
        };
        if seen.contains(c) {
            return true;
        }
        if seen.len() >= MAX_CONTAINERS {
            self.stop
                .series_dropped
                .get_or_create(&MetricLabels {
                    metric: metric.into(),
                })
                .inc();
            return false;
        }
        seen.insert(c.clone());
        true
    }

    /// A container was found: its per-container counters and stop histograms start at zero, so
    /// the first loss and drain of its first stop are an increase that `increase()`, quantiles
    /// and alerts see (Prometheus ignores the first sample of a series that appears already
    /// counted).
    pub fn container_seen(&self, c: &ContainerIdentity) {
        let l = ContainerLabels::from(c);
        if !self.admit(&l, "drainwatch_container_stops") {
            return;
        }
        let f = &self.stop;
        for o in Outcome::ALL {
            let _ = f.stops.get_or_create(&OutcomeLabels {
                namespace: l.namespace.clone(),
                workload: l.workload.clone(),
                container: l.container.clone(),
                outcome: o.as_str().into(),
            });
        }
        for family in [
            &f.inflight_cut,
            &f.refused,
            &f.unreachable,
            &f.accepted_after_sigterm,
            &f.refused_connections,
        ] {
            let _ = family.get_or_create(&l);
        }
        // The same for the per-stop histograms: a histogram that appears with its first
        // observation already counted has no rate, so its first stop would show no quantile.
        let _ = f.drain_duration.get_or_create(&l);
        let _ = f.routing_lag.get_or_create(&l);
    }

    /// Loss counted against a stop, as it happens.
    pub fn stop_loss(&self, c: &ContainerIdentity, kind: LossKind, reason: Option<&str>) {
        let l = ContainerLabels::from(c);
        let metric = match kind {
            LossKind::InflightCut => "drainwatch_stop_inflight_cut",
            LossKind::Refused => "drainwatch_stop_refused",
            LossKind::Unreachable => "drainwatch_stop_unreachable",
            LossKind::AcceptedAfterSigterm => "drainwatch_stop_accepted_after_sigterm",
            LossKind::ResetsSent => "drainwatch_stop_resets_sent",
            // Counted by their own families (retries) or not per stop (idle closes).
            LossKind::IdleClosed | LossKind::RetryDuplicates | LossKind::UpstreamAborts => return,
        };
        if !self.admit(&l, metric) {
            return;
        }
        let f = &self.stop;
        match kind {
            LossKind::InflightCut => f.inflight_cut.get_or_create(&l).inc(),
            LossKind::Refused => f.refused.get_or_create(&l).inc(),
            LossKind::Unreachable => f.unreachable.get_or_create(&l).inc(),
            LossKind::AcceptedAfterSigterm => f.accepted_after_sigterm.get_or_create(&l).inc(),
            _ => f
                .resets_sent
                .get_or_create(&ReasonLabels {
                    namespace: l.namespace,
                    workload: l.workload,
                    container: l.container,
                    reason: reason.unwrap_or("unknown").into(),
                })
                .inc(),
        };
    }

    /// A stop settled: count it by outcome and observe its durations.
    pub fn stop_settled(&self, s: &Stop) {
        let l = ContainerLabels::from(&s.container);
        let Some(outcome) = s.outcome() else { return };
        if !self.admit(&l, "drainwatch_container_stops") {
            return;
        }
        self.stop
            .stops
            .get_or_create(&OutcomeLabels {
                namespace: l.namespace.clone(),
                workload: l.workload.clone(),
                container: l.container.clone(),
                outcome: outcome.as_str().into(),
            })
            .inc();
        if let Some(d) = s.drain_seconds() {
            self.stop.drain_duration.get_or_create(&l).observe(d);
        }
        if let Some(d) = s.routing_lag_seconds() {
            self.stop.routing_lag.get_or_create(&l).observe(d);
        }
        // The configured grace period (Kubernetes metadata) when known; else the observed one,
        // which only a stop that ran out of time shows.
        let grace = s
            .grace_configured_seconds
            .map(|g| g as f64)
            .or_else(|| s.grace_seconds());
        if let Some(g) = grace {
            self.stop.grace_period.get_or_create(&l).set(g);
        }
    }

    /// A RST on a container's connection, in or out of a stop.
    pub fn connection_reset(&self, c: &ContainerIdentity, direction: ResetDirection, reason: &str) {
        let l = ContainerLabels::from(c);
        if !self.admit(&l, "drainwatch_connection_resets") {
            return;
        }
        self.stop
            .connection_resets
            .get_or_create(&ResetLabels {
                namespace: l.namespace,
                workload: l.workload,
                container: l.container,
                direction: direction.as_str().into(),
                reason: reason.into(),
            })
            .inc();
    }

    /// What a proxy did about a request `c` cut: re-sent it (`added` latency) or not.
    pub fn retry(&self, c: &ContainerIdentity, proxy: &str, added: Option<f64>) {
        let l = ContainerLabels::from(c);
        if !self.admit(&l, "drainwatch_retry_duplicates") {
            return;
        }
        let labels = ProxyLabels {
            namespace: l.namespace.clone(),
            workload: l.workload.clone(),
            container: l.container.clone(),
            proxy: proxy.into(),
        };
        match added {
            Some(secs) => {
                self.stop.retry_duplicates.get_or_create(&labels).inc();
                self.stop
                    .retry_added_latency
                    .get_or_create(&l)
                    .observe(secs);
            }
            None => {
                self.stop.upstream_aborts.get_or_create(&labels).inc();
            }
        }
    }

    fn port_labels(&self, c: &ContainerIdentity, port: u16, metric: &str) -> Option<PortLabels> {
        let l = ContainerLabels::from(c);
        self.admit(&l, metric).then(|| PortLabels {
            namespace: l.namespace,
            workload: l.workload,
            container: l.container,
            port: port.to_string(),
        })
    }

    /// An arrival, accept wait or overflow on one of a container's listeners.
    pub fn listener_fact(&self, container: &ContainerIdentity, port: u16, fact: &Fact) {
        let s = &self.stop;
        match *fact {
            Fact::Arrival => {
                if let Some(l) = self.port_labels(container, port, "drainwatch_connection_arrivals")
                {
                    s.arrivals.get_or_create(&l).inc();
                }
            }
            Fact::AcceptWait(secs) => {
                if let Some(l) = self.port_labels(container, port, "drainwatch_accept_wait_seconds")
                {
                    s.accept_wait.get_or_create(&l).observe(secs);
                }
            }
            Fact::Overflow => {
                if let Some(l) = self.port_labels(container, port, "drainwatch_listen_overflows") {
                    s.listen_overflows.get_or_create(&l).inc();
                }
            }
        }
    }

    /// A reconnect storm ended.
    pub fn storm(&self, s: &Storm) {
        let c = ContainerIdentity {
            namespace: s.namespace.clone(),
            workload: s.workload.clone(),
            name: s.container.clone(),
            ..Default::default()
        };
        let Some(l) = self.port_labels(&c, s.port, "drainwatch_reconnect_storms") else {
            return;
        };
        self.stop.storms.get_or_create(&l).inc();
        self.stop
            .storm_peak_rate
            .get_or_create(&l)
            .set(s.peak_arrivals_per_second);
        // 0 when nothing queued: no wider window was needed.
        self.stop
            .storm_window
            .get_or_create(&l)
            .set(s.recommended_window_seconds.unwrap_or(0.0));
        self.stop
            .storm_observed_window
            .get_or_create(&l)
            .set(s.seconds_to_95_percent);
    }

    /// Adds the growth of each namespace's listen counters since the last sample.
    pub fn netns_listen_counters(&self, sample: &[(ContainerIdentity, ListenCounters)]) {
        let Ok(mut seen) = self.stop.netns_seen.lock() else {
            return;
        };
        for (c, now) in sample {
            let l = ContainerLabels::from(c);
            if !self.admit(&l, "drainwatch_netns_listen_overflows") {
                continue;
            }
            let before = seen.insert(l.clone(), *now).unwrap_or_default();
            // A counter that went down belongs to a new namespace under the same names.
            let grew = |b: u64, n: u64| if n >= b { n - b } else { n };
            self.stop
                .netns_listen_overflows
                .get_or_create(&l)
                .inc_by(grew(before.overflows, now.overflows));
            self.stop
                .netns_listen_drops
                .get_or_create(&l)
                .inc_by(grew(before.drops, now.drops));
        }
    }

    pub fn procfs_error(&self, file: &str) {
        self.procfs_errors
            .get_or_create(&FileLabels { file: file.into() })
            .inc();
    }

    /// Sets the accept-queue gauges to this sample; a `complete` sample (every container's
    /// listeners, not a fast one of a few workloads) also removes listeners that are gone.
    pub fn accept_queues(
        &self,
        sample: &[(ContainerIdentity, u16, u32, Option<u32>)],
        complete: bool,
    ) {
        let Ok(mut seen) = self.stop.queues_seen.lock() else {
            return;
        };
        let mut now = HashSet::new();
        for (c, port, depth, limit) in sample {
            let Some(l) = self.port_labels(c, *port, "drainwatch_accept_queue_depth") else {
                continue;
            };
            self.stop
                .accept_queue_depth
                .get_or_create(&l)
                .set(i64::from(*depth));
            if let Some(limit) = limit {
                self.stop
                    .accept_queue_limit
                    .get_or_create(&l)
                    .set(i64::from(*limit));
            }
            now.insert(l);
        }
        if !complete {
            seen.extend(now);
            return;
        }
        for gone in seen.difference(&now) {
            self.stop.accept_queue_depth.remove(gone);
            self.stop.accept_queue_limit.remove(gone);
        }
        *seen = now;
    }

    /// A connection refused at a container's former listening address, in or out of a stop.
    pub fn refused_connection(&self, c: &ContainerIdentity) {
        let l = ContainerLabels::from(c);
        if self.admit(&l, "drainwatch_refused_connections") {
            self.stop.refused_connections.get_or_create(&l).inc();
        }
    }

    pub fn event_received(&self, kind: EventKind) {
        self.events
            .get_or_create(&KindLabels {
                kind: kind_name(kind).into(),
            })
            .inc();
    }

    pub fn filtered(&self, kind: EventKind, n: u64) {
        self.filtered
            .get_or_create(&KindLabels {
                kind: kind_name(kind).into(),
            })
            .inc_by(n);
    }

    /// After the watch maps were updated: what they hold, and what did not fit.
    pub fn watch_applied(&self, addresses: usize, ports: usize, refused: u64) {
        self.watch_refused.inc_by(refused);
        for (map, n) in [("addresses", addresses), ("ports", ports)] {
            self.watch_entries
                .get_or_create(&MapLabels { map: map.into() })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    pub fn lost(&self, stage: LossStage, n: u64) {
        self.lost
            .get_or_create(&StageLabels {
                stage: stage.as_str().into(),
            })
            .inc_by(n);
    }

    pub fn lost_count(&self, stage: LossStage) -> u64 {
        self.lost
            .get_or_create(&StageLabels {
                stage: stage.as_str().into(),
            })
            .get()
    }

    pub fn events_count(&self, kind: EventKind) -> u64 {
        self.events
            .get_or_create(&KindLabels {
                kind: kind_name(kind).into(),
            })
            .get()
    }

    pub fn record_plan(&self, statuses: &[SignalStatus]) {
        for st in statuses {
            let chosen = st.chosen();
            for (hook, _) in &st.tried {
                let v = i64::from(chosen == Some(hook.as_str()));
                self.probe_attached
                    .get_or_create(&ProbeLabels {
                        signal: st.signal.into(),
                        hook: hook.clone(),
                    })
                    .set(v);
            }
            self.probe_degraded
                .get_or_create(&SignalLabels {
                    signal: st.signal.into(),
                })
                .set(i64::from(chosen.is_some() && !st.degraded.is_empty()));
        }
    }

    /// What the correlator reported: the one way the pipeline reaches the metrics.
    pub fn record(&self, e: &Emitted) {
        match e {
            Emitted::ContainerSeen { container } => self.container_seen(container),
            Emitted::Loss {
                container,
                kind,
                reason,
            } => self.stop_loss(container, *kind, reason.as_deref()),
            Emitted::Settled { stop } => self.stop_settled(stop),
            Emitted::StopBegan { .. } => {}
            Emitted::Retry {
                container,
                proxy,
                added_seconds,
            } => self.retry(container, proxy, *added_seconds),
            Emitted::Reset {
                container,
                direction,
                reason,
            } => self.connection_reset(container, *direction, reason),
            Emitted::Refused { container } => self.refused_connection(container),
            Emitted::Listener {
                container,
                port,
                fact,
            } => self.listener_fact(container, *port, fact),
            Emitted::ListenSample(sample) => {
                self.accept_queues(&sample.queues, sample.complete);
                self.netns_listen_counters(&sample.netns);
            }
            Emitted::Storm(storm) => self.storm(storm),
        }
    }

    /// OpenMetrics text.
    pub fn encode_openmetrics(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }

    /// Prometheus text format 0.0.4.
    pub fn encode_prometheus(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_zeroed_series_and_build_info() {
        let m = Metrics::new("6.18.44");
        let text = m.encode_openmetrics().unwrap();
        assert!(
            text.contains("drainwatch_events_total{kind=\"tcp_send_reset\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("drainwatch_events_lost_total{stage=\"ringbuf\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("drainwatch_build_info{version=\"0.1.0\",kernel=\"6.18.44\"} 1"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
        let plain = m.encode_prometheus().unwrap();
        assert!(!plain.contains("# EOF"));
        assert!(
            plain.contains("drainwatch_events_lost_total{stage=\"queue\"} 0"),
            "{plain}"
        );
    }

    #[test]
    fn per_container_series_are_capped_and_the_drops_counted() {
        let m = Metrics::new("k");
        for i in 0..MAX_CONTAINERS + 3 {
            let c = ContainerIdentity {
                name: format!("c{i}"),
                workload: "w".into(),
                ..Default::default()
            };
            m.refused_connection(&c);
        }
        let text = m.encode_prometheus().unwrap();
        assert!(
            text.contains(
                "drainwatch_series_dropped_total{metric=\"drainwatch_refused_connections\"} 3"
            ),
            "{text}"
        );
        assert_eq!(
            text.matches("drainwatch_refused_connections_total{")
                .count(),
            MAX_CONTAINERS
        );
    }

    #[test]
    fn accept_queue_gauges_follow_the_sample_and_drop_gone_listeners() {
        let m = Metrics::new("k");
        let c = ContainerIdentity {
            name: "web-2".into(),
            workload: "web".into(),
            ..Default::default()
        };
        m.accept_queues(&[(c.clone(), 8080, 7, Some(128))], true);
        let text = m.encode_prometheus().unwrap();
        let labels = "{namespace=\"\",workload=\"web\",container=\"web-2\",port=\"8080\"}";
        assert!(
            text.contains(&format!("drainwatch_accept_queue_depth{labels} 7")),
            "{text}"
        );
        assert!(
            text.contains(&format!("drainwatch_accept_queue_limit{labels} 128")),
            "{text}"
        );
        m.accept_queues(&[], false);
        let text = m.encode_prometheus().unwrap();
        assert!(
            text.contains(&format!("drainwatch_accept_queue_depth{labels} 7")),
            "a fast sample of other workloads removes nothing"
        );
        m.accept_queues(&[], true);
        let text = m.encode_prometheus().unwrap();
        assert!(!text.contains("drainwatch_accept_queue_depth{"), "{text}");
    }

    #[test]
    fn namespace_listen_counters_add_the_kernels_growth() {
        let m = Metrics::new("k");
        let c = ContainerIdentity {
            name: "web-2".into(),
            workload: "web".into(),
            ..Default::default()
        };
        let at = |overflows, drops| [(c.clone(), ListenCounters { overflows, drops })];
        m.netns_listen_counters(&at(3, 4));
        m.netns_listen_counters(&at(10, 12));
        let labels = "{namespace=\"\",workload=\"web\",container=\"web-2\"}";
        let text = m.encode_prometheus().unwrap();
        assert!(
            text.contains(&format!(
                "drainwatch_netns_listen_overflows_total{labels} 10"
            )),
            "{text}"
        );
        assert!(text.contains(&format!("drainwatch_netns_listen_drops_total{labels} 12")));
        // A new namespace under the same names starts from 0 again: its value is growth.
        m.netns_listen_counters(&at(2, 2));
        let text = m.encode_prometheus().unwrap();
        assert!(text.contains(&format!(
            "drainwatch_netns_listen_overflows_total{labels} 12"
        )));
    }

    #[test]
    fn a_container_seen_gets_zeroed_counters_so_its_first_loss_is_an_increase() {
        let m = Metrics::new("k");
        let c = ContainerIdentity {
            name: "web-1".into(),
            workload: "web".into(),
            ..Default::default()
        };
        m.container_seen(&c);
        let text = m.encode_prometheus().unwrap();
        let labels = "namespace=\"\",workload=\"web\",container=\"web-1\"";
        for family in [
            "drainwatch_stop_inflight_cut_total",
            "drainwatch_stop_refused_total",
            "drainwatch_stop_unreachable_total",
            "drainwatch_stop_accepted_after_sigterm_total",
            "drainwatch_refused_connections_total",
        ] {
            assert!(
                text.contains(&format!("{family}{{{labels}}} 0\n")),
                "{family}: {text}"
            );
        }
        for o in Outcome::ALL {
            let line = format!(
                "drainwatch_container_stops_total{{{labels},outcome=\"{}\"}} 0\n",
                o.as_str()
            );
            assert!(text.contains(&line), "{line}: {text}");
        }
        for h in [
            "drainwatch_drain_duration_seconds",
            "drainwatch_routing_lag_seconds",
        ] {
            assert!(
                text.contains(&format!("{h}_count{{{labels}}} 0\n")),
                "{h}: {text}"
            );
        }
        // Seen again (a rescan): nothing is reset.
        m.stop_loss(&c, LossKind::InflightCut, None);
        m.container_seen(&c);
        let text = m.encode_prometheus().unwrap();
        assert!(
            text.contains(&format!(
                "drainwatch_stop_inflight_cut_total{{{labels}}} 1\n"
            )),
            "{text}"
        );
    }

    #[test]
    fn the_grace_period_gauge_is_the_configured_one_else_the_observed_one() {
        use crate::{
            correlate::stops::{Config, Tracker},
            model::{
                ExitInfo, Observation as O, SECOND, Sender,
                stop::{SIGKILL, SIGTERM},
            },
        };
        let c = ContainerIdentity {
            id: "c1".into(),
            name: "web-1".into(),
            workload: "web".into(),
            ..Default::default()
        };
        let mut t = Tracker::new(Config::default());
        let t0 = 1_000 * SECOND;
        t.observe(
            t0,
            O::Container {
                identity: c.clone(),
                listeners: vec![],
                inbound: vec![],
            },
        );
        let runc = Sender {
            pid: 42,
            comm: "runc".into(),
        };
        for (at, sig) in [(t0 + SECOND, SIGTERM), (t0 + 31 * SECOND, SIGKILL)] {
            t.observe(
                at,
                O::Signal {
                    key: "c1".into(),
                    sig,
                    sender: runc.clone(),
                },
            );
        }
        t.observe(
            t0 + 31 * SECOND + 1_000_000,
            O::Exit {
                key: "c1".into(),
                exit: ExitInfo {
                    code: Some(137),
                    signal: Some(9),
                },
            },
        );
        // A pod's stop: the configured grace period wins, whether the stop ran out of it or not.
        let pod = ContainerIdentity {
            id: "c2".into(),
            name: "api".into(),
            workload: "api".into(),
            stop_policy: crate::model::StopPolicy {
                grace_configured_seconds: Some(45),
                prestop: None,
            },
            ..Default::default()
        };
        t.observe(
            t0,
            O::Container {
                identity: pod,
                listeners: vec![],
                inbound: vec![],
            },
        );
        t.observe(
            t0 + SECOND,
            O::Signal {
                key: "c2".into(),
                sig: SIGTERM,
                sender: runc.clone(),
            },
        );
        t.observe(
            t0 + 3 * SECOND,
            O::Exit {
                key: "c2".into(),
                exit: ExitInfo {
                    code: Some(0),
                    signal: None,
                },
            },
        );
        let m = Metrics::new("k");
        for s in t.stops() {
            m.stop_settled(s);
        }
        let text = m.encode_prometheus().unwrap();
        assert!(
            text.contains(
                "drainwatch_grace_period_seconds{namespace=\"\",workload=\"web\",container=\"web-1\"} 30.0\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "drainwatch_grace_period_seconds{namespace=\"\",workload=\"api\",container=\"api\"} 45.0\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("drainwatch_container_stops_total{namespace=\"\",workload=\"web\",container=\"web-1\",outcome=\"killed_at_deadline\"} 1\n"),
            "{text}"
        );
    }

    #[test]
    fn plan_outcome_becomes_attached_gauges() {
        let m = Metrics::new("k");
        m.record_plan(&[
            SignalStatus {
                signal: "accept_wait",
                title: "accept wait",
                tried: vec![("kretprobe:inet_csk_accept".into(), Err("no kprobes".into()))],
                degraded: vec![],
                unavailable: "",
            },
            SignalStatus {
                signal: "resets_sent",
                title: "resets sent",
                tried: vec![("tracepoint:tcp:tcp_send_reset".into(), Ok(()))],
                degraded: vec!["no field reason".into()],
                unavailable: "",
            },
        ]);
        let text = m.encode_openmetrics().unwrap();
        assert!(text.contains("drainwatch_probe_attached{signal=\"accept_wait\",hook=\"kretprobe:inet_csk_accept\"} 0"), "{text}");
        assert!(text.contains("drainwatch_probe_attached{signal=\"resets_sent\",hook=\"tracepoint:tcp:tcp_send_reset\"} 1"), "{text}");
        assert!(
            text.contains("drainwatch_probe_degraded{signal=\"resets_sent\"} 1"),
            "{text}"
        );
    }
}
