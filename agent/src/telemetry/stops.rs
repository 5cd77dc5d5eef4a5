//! Per-container stop families: stops by outcome, the loss counted against a stop as it
//! happens, drain and routing-lag histograms, the grace period, and the connection facts of a
//! container in or out of a stop (resets, refused connects, proxy retries and aborts). Every
//! series goes through the cardinality cap.

use std::sync::{Arc, Mutex, Weak, atomic::AtomicU64};

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use super::{
    cap::Cap,
    labels::{
        ContainerLabels, OutcomeLabels, ProbeFailureLabels, ProbeResult, ProxyLabels, ReasonLabels,
        ResetLabels,
    },
};
use crate::model::{
    ContainerIdentity, HashMap, LossKind, ResetDirection, RetryOutcome,
    stop::{Outcome, Stop},
};

/// Buckets of the per-stop durations, 100 ms to 5 min.
pub(super) fn seconds_buckets() -> Histogram {
    Histogram::new([
        0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
    ])
}

pub struct StopMetrics {
    cap: Arc<Cap>,
    stops: Family<OutcomeLabels, Counter>,
    /// `drainwatch_stop_<field>` of every kind with a plain per-container counter.
    loss: Vec<(LossKind, Family<ContainerLabels, Counter>)>,
    probe_failures: Family<ProbeFailureLabels, Counter>,
    resets_sent: Family<ReasonLabels, Counter>,
    drain_duration: Family<ContainerLabels, Histogram>,
    routing_lag: Family<ContainerLabels, Histogram>,
    grace_period: Family<ContainerLabels, Gauge<f64, AtomicU64>>,
    stream_rotation: Family<ContainerLabels, Gauge<f64, AtomicU64>>,
    connection_resets: Family<ResetLabels, Counter>,
    refused_connections: Family<ContainerLabels, Counter>,
    retry_duplicates: Family<ProxyLabels, Counter>,
    retried_unexecuted: Family<ProxyLabels, Counter>,
    upstream_aborts: Family<ProxyLabels, Counter>,
    retry_added_latency: Family<ContainerLabels, Histogram>,
    reset_series: Mutex<ResetSeries>,
}

/// The reset series resolved so far, by the address of the container identity's allocation
/// (held weakly, so the address is not reused while the entry lives), then by direction and
/// reason: a container sees few reasons, so a short list.
/// One series: its direction, its reason and the counter.
type ResetSeriesOf = (ResetDirection, String, Counter);

#[derive(Default)]
struct ResetSeries {
    by_container: HashMap<usize, (Weak<ContainerIdentity>, Vec<ResetSeriesOf>)>,
    /// Entries of identities no longer alive are dropped when the map reaches this size.
    prune_at: usize,
}

impl ResetSeries {
    fn get(
        &self,
        c: &Arc<ContainerIdentity>,
        direction: ResetDirection,
        reason: &str,
    ) -> Option<&Counter> {
        let (_, list) = self.by_container.get(&(Arc::as_ptr(c) as usize))?;
        list.iter()
            .find(|(d, r, _)| *d == direction && r == reason)
            .map(|(.., counter)| counter)
    }

    fn insert(
        &mut self,
        c: &Arc<ContainerIdentity>,
        direction: ResetDirection,
        reason: &str,
        counter: Counter,
    ) {
        self.by_container
            .entry(Arc::as_ptr(c) as usize)
            .or_insert_with(|| (Arc::downgrade(c), Vec::new()))
            .1
            .push((direction, reason.into(), counter));
        if self.by_container.len() >= self.prune_at {
            self.by_container.retain(|_, (w, _)| w.strong_count() > 0);
            self.prune_at = (self.by_container.len() * 2).max(256);
        }
    }
}

impl StopMetrics {
    pub fn register(registry: &mut Registry, cap: Arc<Cap>) -> Self {
        let m = Self {
            cap,
            stops: Family::default(),
            loss: LossKind::ALL
                .iter()
                .filter(|k| k.info().help.is_some())
                .map(|k| (*k, Family::default()))
                .collect(),
            probe_failures: Family::default(),
            resets_sent: Family::default(),
            drain_duration: Family::new_with_constructor(seconds_buckets),
            routing_lag: Family::new_with_constructor(seconds_buckets),
            grace_period: Family::default(),
            stream_rotation: Family::default(),
            connection_resets: Family::default(),
            refused_connections: Family::default(),
            retry_duplicates: Family::default(),
            retried_unexecuted: Family::default(),
            upstream_aborts: Family::default(),
            retry_added_latency: Family::new_with_constructor(seconds_buckets),
            reset_series: Mutex::default(),
        };
        registry.register(
            "drainwatch_container_stops",
            "Container stops, by outcome, counted when a stop settles",
            m.stops.clone(),
        );
        for (kind, family) in &m.loss {
            let help = kind.info().help.unwrap_or_default();
            registry.register(kind.metric(), help, family.clone());
        }
        registry.register(
            "drainwatch_stop_probe_failures",
            "Health checks (the kubelet's probes, a balancer's learned checks) a stopping container cut, refused or was unreachable for: apart from the request counts",
            m.probe_failures.clone(),
        );
        registry.register(
            "drainwatch_stop_resets_sent",
            "RSTs a stopping container's network namespace sent during its stop (its connections, time-wait and orphaned sockets, refusals), by kernel reason",
            m.resets_sent.clone(),
        );
        registry.register(
            "drainwatch_drain_duration_seconds",
            "Stop signal to main process exit",
            m.drain_duration.clone(),
        );
        registry.register(
            "drainwatch_routing_lag_seconds",
            "Stop signal to the last connection routed to the container after it: accepted, refused or unreachable (how long load balancers kept sending)",
            m.routing_lag.clone(),
        );
        registry.register(
            "drainwatch_grace_period_seconds",
            "Grace period of the container's last stop: terminationGracePeriodSeconds from the Kubernetes API, else stop signal to SIGKILL when it ran out",
            m.grace_period.clone(),
        );
        registry.register(
            "drainwatch_stream_rotation_seconds",
            "How long the container's server lets a stream live before ending it itself (a write timeout, a max connection age, a token's expiry): the 95th percentile of the lifetimes learned on its listeners, once watched for twice the longest",
            m.stream_rotation.clone(),
        );
        registry.register(
            "drainwatch_connection_resets",
            "RSTs a container's network namespace sent (summed over reasons: the namespace's TcpOutRsts) or its sockets received, stop or not; container=\"\" for a pod's own that no container's port accounts for",
            m.connection_resets.clone(),
        );
        registry.register(
            "drainwatch_refused_connections",
            "Connects a container's network namespace refused (a SYN answered with RST), at a former listening address or any other port, stop or not; health checks apart",
            m.refused_connections.clone(),
        );
        registry.register(
            "drainwatch_retry_duplicates",
            "Requests a container cut after reading them that a proxy on this node re-sent to another backend: done twice (or maybe twice), invisible to the client",
            m.retry_duplicates.clone(),
        );
        registry.register(
            "drainwatch_retried_unexecuted",
            "Requests a container cut before reading them (still in its receive queue) that a proxy on this node re-sent to another backend: done once",
            m.retried_unexecuted.clone(),
        );
        registry.register(
            "drainwatch_upstream_aborts",
            "Requests a container cut that no proxy re-sent: the client saw an error",
            m.upstream_aborts.clone(),
        );
        registry.register(
            "drainwatch_retry_added_latency_seconds",
            "Latency a proxy retry added: from the original upstream request's start to the retry's",
            m.retry_added_latency.clone(),
        );
        m
    }

    /// A container was found: its per-container counters and stop histograms start at zero, so
    /// the first loss and drain of its first stop are an increase that `increase()`, quantiles
    /// and alerts see (Prometheus ignores the first sample of a series that appears already
    /// counted).
    pub fn container_seen(&self, c: &ContainerIdentity) {
        let l = ContainerLabels::from(c);
        if !self.cap.admit(&l, "drainwatch_container_stops") {
            return;
        }
        for outcome in Outcome::ALL {
            let _ = self.cap.series(
                &self.stops,
                &OutcomeLabels {
                    container: l.clone(),
                    outcome,
                },
            );
        }
        for family in self
            .loss
            .iter()
            .map(|(_, f)| f)
            .chain([&self.refused_connections])
        {
            let _ = self.cap.series(family, &l);
        }
        // The same for the per-stop histograms: a histogram that appears with its first
        // observation already counted has no rate, so its first stop would show no quantile.
        let _ = self.cap.series(&self.drain_duration, &l);
        let _ = self.cap.series(&self.routing_lag, &l);
    }

    /// Loss counted against a stop, as it happens.
    pub fn stop_loss(&self, c: &ContainerIdentity, kind: LossKind, reason: Option<&str>) {
        if let Some((_, family)) = self.loss.iter().find(|(k, _)| *k == kind) {
            let l = ContainerLabels::from(c);
            if self.cap.admit(&l, kind.metric()) {
                self.cap.series(family, &l).inc();
            }
            return;
        }
        match kind {
            LossKind::ResetsSent => {
                let container = ContainerLabels::from(c);
                if self.cap.admit(&container, "drainwatch_stop_resets_sent") {
                    self.cap
                        .series(
                            &self.resets_sent,
                            &ReasonLabels {
                                container,
                                reason: reason.unwrap_or("unknown").into(),
                            },
                        )
                        .inc();
                }
            }
            LossKind::ProbeCut | LossKind::ProbeRefused | LossKind::ProbeUnreachable => {
                let container = ContainerLabels::from(c);
                if self.cap.admit(&container, "drainwatch_stop_probe_failures") {
                    let result = match kind {
                        LossKind::ProbeCut => ProbeResult::Cut,
                        LossKind::ProbeRefused => ProbeResult::Refused,
                        _ => ProbeResult::Unreachable,
                    };
                    self.cap
                        .series(
                            &self.probe_failures,
                            &ProbeFailureLabels { container, result },
                        )
                        .inc();
                }
            }
            // Counted by their own families (retries), by proxy.
            _ => {}
        }
    }

    /// A stop settled: count it by outcome and observe its durations.
    pub fn stop_settled(&self, s: &Stop) {
        let l = ContainerLabels::from(&s.container);
        let Some(outcome) = s.outcome() else { return };
        if !self.cap.admit(&l, "drainwatch_container_stops") {
            return;
        }
        self.cap
            .series(
                &self.stops,
                &OutcomeLabels {
                    container: l.clone(),
                    outcome,
                },
            )
            .inc();
        if let Some(d) = s.drain_seconds() {
            self.cap.series(&self.drain_duration, &l).observe(d);
        }
        if let Some(d) = s.routing_lag_seconds() {
            self.cap.series(&self.routing_lag, &l).observe(d);
        }
        // The configured grace period (Kubernetes metadata) when known; else the observed one,
        // which only a stop that ran out of time shows.
        let grace = s
            .grace_configured_seconds
            .map(|g| g as f64)
            .or_else(|| s.grace_seconds());
        if let Some(g) = grace {
            self.cap.series(&self.grace_period, &l).set(g);
        }
        if let Some(r) = s.stream_rotation_seconds() {
            self.cap.series(&self.stream_rotation, &l).set(r);
        }
    }

    /// The stream rotation learned on a container's listeners.
    pub fn stream_rotation(&self, c: &ContainerIdentity, seconds: f64) {
        let l = ContainerLabels::from(c);
        if self.cap.admit(&l, "drainwatch_stream_rotation_seconds") {
            self.cap.series(&self.stream_rotation, &l).set(seconds);
        }
    }

    /// A RST on a container's connection, in or out of a stop. Its series is resolved once
    /// per container, direction and reason (`ResetSeries`), not per RST.
    pub fn connection_reset(
        &self,
        c: &Arc<ContainerIdentity>,
        direction: ResetDirection,
        reason: &str,
    ) {
        let Ok(mut cache) = self.reset_series.lock() else {
            return;
        };
        if let Some(counter) = cache.get(c, direction, reason) {
            counter.inc();
            return;
        }
        let container = ContainerLabels::from(&**c);
        // Refused by the cap: not cached, so each refusal is counted.
        if !self.cap.admit(&container, "drainwatch_connection_resets") {
            return;
        }
        let labels = ResetLabels {
            container,
            direction,
            reason: reason.into(),
        };
        let counter = self.cap.series(&self.connection_resets, &labels).clone();
        counter.inc();
        cache.insert(c, direction, reason, counter);
    }

    /// A container was forgotten and its series removed: no cached handle may outlive them.
    pub fn forget_handles(&self) {
        if let Ok(mut cache) = self.reset_series.lock() {
            *cache = ResetSeries::default();
        }
    }

    /// A connect a container's namespace refused, in or out of a stop.
    pub fn refused_connection(&self, c: &ContainerIdentity) {
        let l = ContainerLabels::from(c);
        if self.cap.admit(&l, "drainwatch_refused_connections") {
            self.cap.series(&self.refused_connections, &l).inc();
        }
    }

    /// What a proxy did about a request `c` cut: re-sent it (adding latency) or not.
    pub fn retry(&self, c: &ContainerIdentity, proxy: &str, outcome: RetryOutcome) {
        let l = ContainerLabels::from(c);
        if !self.cap.admit(&l, "drainwatch_retry_duplicates") {
            return;
        }
        let labels = ProxyLabels {
            container: l,
            proxy: proxy.into(),
        };
        match outcome {
            RetryOutcome::Duplicate { added_seconds } => {
                self.cap.series(&self.retry_duplicates, &labels).inc();
                self.cap
                    .series(&self.retry_added_latency, &labels.container)
                    .observe(added_seconds);
            }
            RetryOutcome::Unexecuted { added_seconds } => {
                self.cap.series(&self.retried_unexecuted, &labels).inc();
                self.cap
                    .series(&self.retry_added_latency, &labels.container)
                    .observe(added_seconds);
            }
            RetryOutcome::Abort => {
                self.cap.series(&self.upstream_aborts, &labels).inc();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{
        model::{ContainerIdentity, LossKind, stop::Outcome},
        telemetry::Telemetry,
    };

    #[test]
    fn a_reset_series_is_resolved_once_and_made_again_after_its_container_is_forgotten() {
        use crate::model::{Emitted, ResetDirection};
        let m = Telemetry::new("k");
        let c = std::sync::Arc::new(ContainerIdentity {
            id: "a".into(),
            name: "app".into(),
            workload: "web".into(),
            ..Default::default()
        });
        let seen = || Emitted::ContainerSeen {
            container: (*c).clone(),
        };
        m.record(&seen());
        for _ in 0..3 {
            m.stops
                .connection_reset(&c, ResetDirection::Sent, "NOT_SPECIFIED");
        }
        m.stops
            .connection_reset(&c, ResetDirection::Sent, "TCP_CLOSE");
        let resets = |m: &Telemetry| -> Vec<String> {
            let text = m.encode_prometheus().unwrap();
            let mut v: Vec<String> = text
                .lines()
                .filter(|l| l.starts_with("drainwatch_connection_resets_total{"))
                .map(|l| {
                    let reason = l.split("reason=\"").nth(1).unwrap_or("").split('"').next();
                    format!(
                        "{} {}",
                        reason.unwrap_or(""),
                        l.rsplit(' ').next().unwrap_or("")
                    )
                })
                .collect();
            v.sort();
            v
        };
        assert_eq!(resets(&m), ["NOT_SPECIFIED 3", "TCP_CLOSE 1"]);
        m.record(&Emitted::ContainerForgotten {
            container: (*c).clone(),
        });
        assert!(resets(&m).is_empty());
        // The identity outlived its forgetting (a late event): its series is made anew, not
        // counted into the one removed.
        m.record(&seen());
        m.stops
            .connection_reset(&c, ResetDirection::Sent, "NOT_SPECIFIED");
        assert_eq!(resets(&m), ["NOT_SPECIFIED 1"]);
    }

    #[test]
    fn a_container_seen_gets_zeroed_counters_so_its_first_loss_is_an_increase() {
        let m = Telemetry::new("k");
        let c = ContainerIdentity {
            name: "web-1".into(),
            workload: "web".into(),
            ..Default::default()
        };
        m.stops.container_seen(&c);
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
        m.stops.stop_loss(&c, LossKind::InflightCut, None);
        m.stops.container_seen(&c);
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
                identity: Box::new(c.clone()),
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
                    key: std::sync::Arc::new("c1".into()),
                    sig,
                    sender: runc.clone(),
                    ignored: None,
                },
            );
        }
        t.observe(
            t0 + 31 * SECOND + 1_000_000,
            O::Exit {
                key: std::sync::Arc::new("c1".into()),
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
                identity: Box::new(pod),
                listeners: vec![],
                inbound: vec![],
            },
        );
        t.observe(
            t0 + SECOND,
            O::Signal {
                key: std::sync::Arc::new("c2".into()),
                sig: SIGTERM,
                sender: runc.clone(),
                ignored: None,
            },
        );
        t.observe(
            t0 + 3 * SECOND,
            O::Exit {
                key: std::sync::Arc::new("c2".into()),
                exit: ExitInfo {
                    code: Some(0),
                    signal: None,
                },
            },
        );
        let m = Telemetry::new("k");
        for s in t.stops() {
            m.stops.stop_settled(s);
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
}
