//! The accept path of containers' listeners and the reconnect storms on it: arrivals, accept
//! waits and overflows per listener, sampled accept-queue depths and limits, the namespaces'
//! own listen counters, and what each storm needed. Every series goes through the cap.

use std::{
    collections::hash_map::Entry,
    sync::{Arc, Mutex, Weak, atomic::AtomicU64},
};

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use super::{
    cap::Cap,
    labels::{ContainerLabels, PortLabels},
};
use crate::model::{ContainerIdentity, Fact, HashMap, HashSet, ListenCounters, storm::Storm};

/// Buckets of the accept wait, 0.5 ms to 5 s.
fn accept_wait_buckets() -> Histogram {
    Histogram::new([
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    ])
}

pub struct ListenerMetrics {
    cap: Arc<Cap>,
    accept_wait: Family<PortLabels, Histogram>,
    arrivals: Family<PortLabels, Counter>,
    listen_overflows: Family<PortLabels, Counter>,
    accept_queue_depth: Family<PortLabels, Gauge>,
    accept_queue_limit: Family<PortLabels, Gauge>,
    storms: Family<PortLabels, Counter>,
    storm_peak_rate: Family<PortLabels, Gauge<f64, AtomicU64>>,
    storm_window: Family<PortLabels, Gauge<f64, AtomicU64>>,
    storm_observed_window: Family<PortLabels, Gauge<f64, AtomicU64>>,
    netns_listen_overflows: Family<ContainerLabels, Counter>,
    netns_listen_drops: Family<ContainerLabels, Counter>,
    /// The kernel's absolute counters as last seen, to add only their growth.
    /// Each series' last sample, and the container (id) it was of.
    netns_seen: Mutex<HashMap<ContainerLabels, (String, ListenCounters)>>,
    /// Listeners whose queue gauges were set last time, to remove the ones that went away.
    queues_seen: Mutex<HashSet<PortLabels>>,
    /// Each listener's per-connection series, resolved once (see [`Handles`]).
    handles: Mutex<HandleCache>,
}

/// The series of one listener's per-connection facts: arrivals and accept waits come with
/// every connection, so their label sets are built, capped and looked up once per listener,
/// not per event. Keyed by the address of the container identity's allocation, held weakly
/// so that address is not reused while the entry lives. An identity that changed (the
/// Kubernetes API named the pod) is a new allocation, so a new entry under the new labels.
struct Handles {
    identity: Weak<ContainerIdentity>,
    arrivals: Option<Counter>,
    accept_wait: Option<Histogram>,
    overflows: Option<Counter>,
}

#[derive(Default)]
struct HandleCache {
    by_listener: HashMap<(usize, u16), Handles>,
    /// Entries of identities no longer alive are dropped when the cache reaches this size.
    prune_at: usize,
}

impl ListenerMetrics {
    pub fn register(registry: &mut Registry, cap: Arc<Cap>) -> Self {
        let m = Self {
            cap,
            accept_wait: Family::new_with_constructor(accept_wait_buckets),
            arrivals: Family::default(),
            listen_overflows: Family::default(),
            accept_queue_depth: Family::default(),
            accept_queue_limit: Family::default(),
            storms: Family::default(),
            storm_peak_rate: Family::default(),
            storm_window: Family::default(),
            storm_observed_window: Family::default(),
            netns_listen_overflows: Family::default(),
            netns_listen_drops: Family::default(),
            netns_seen: Mutex::default(),
            queues_seen: Mutex::default(),
            handles: Mutex::default(),
        };
        registry.register(
            "drainwatch_accept_wait_seconds",
            "Time connections waited in a listener's accept queue: handshake complete to accept()",
            m.accept_wait.clone(),
        );
        registry.register(
            "drainwatch_connection_arrivals",
            "Connections that completed their handshake on a container's listener",
            m.arrivals.clone(),
        );
        registry.register(
            "drainwatch_listen_overflows",
            "Completed handshakes a container's listener dropped because its accept queue was full",
            m.listen_overflows.clone(),
        );
        registry.register(
            "drainwatch_accept_queue_depth",
            "Connections waiting in a container listener's accept queue, read from procfs: every 100 ms while a container of its workload is stopping or its clients storm back (the 10 s after a stop, or an open storm), every 10 s otherwise, and when the container is found",
            m.accept_queue_depth.clone(),
        );
        registry.register(
            "drainwatch_accept_queue_limit",
            "A container listener's accept queue limit (its listen() backlog capped by somaxconn), for listeners opened while the agent ran",
            m.accept_queue_limit.clone(),
        );
        registry.register(
            "drainwatch_reconnect_storms",
            "Reconnect storms: clients of a stopped container coming back at once to a listener of the same workload",
            m.storms.clone(),
        );
        registry.register(
            "drainwatch_reconnect_storm_peak_arrivals_per_second",
            "Peak arrival rate of the last reconnect storm, in connections per second (the busiest 100 ms window's arrivals times 10)",
            m.storm_peak_rate.clone(),
        );
        registry.register(
            "drainwatch_reconnect_window_recommended_seconds",
            "Reconnect window the last storm needed: its clients divided by the accept rate the listener sustained",
            m.storm_window.clone(),
        );
        registry.register(
            "drainwatch_reconnect_storm_window_seconds",
            "How long the last storm's clients took to come back (first arrival to 95%): compare with the recommended window",
            m.storm_observed_window.clone(),
        );
        registry.register(
            "drainwatch_netns_listen_overflows",
            "The kernel's TcpExt ListenOverflows of a container's network namespace: connections dropped because an accept queue was full, including those no drop event reports",
            m.netns_listen_overflows.clone(),
        );
        registry.register(
            "drainwatch_netns_listen_drops",
            "The kernel's TcpExt ListenDrops of a container's network namespace: every drop on its listen path",
            m.netns_listen_drops.clone(),
        );
        m
    }

    fn port_labels(
        &self,
        c: &ContainerIdentity,
        port: u16,
        metric: &'static str,
    ) -> Option<PortLabels> {
        let container = ContainerLabels::from(c);
        self.cap
            .admit(&container, metric)
            .then_some(PortLabels { container, port })
    }

    /// An arrival, accept wait or overflow on one of a container's listeners.
    pub fn listener_fact(&self, container: &Arc<ContainerIdentity>, port: u16, fact: &Fact) {
        let metric = match fact {
            Fact::Arrival => "drainwatch_connection_arrivals",
            Fact::AcceptWait(_) => "drainwatch_accept_wait_seconds",
            Fact::Overflow => "drainwatch_listen_overflows",
            Fact::Answered { .. } => return,
        };
        let Ok(mut cache) = self.handles.lock() else {
            return;
        };
        let cache = &mut *cache;
        let h = match cache
            .by_listener
            .entry((Arc::as_ptr(container) as usize, port))
        {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                // Refused by the cap: not cached, so each refusal is counted.
                if self.port_labels(container, port, metric).is_none() {
                    return;
                }
                e.insert(Handles {
                    identity: Arc::downgrade(container),
                    arrivals: None,
                    accept_wait: None,
                    overflows: None,
                })
            }
        };
        // Admitted by the cap when the entry was made; built again only for a new series.
        let labels = || PortLabels {
            container: ContainerLabels::from(&**container),
            port,
        };
        match *fact {
            Fact::Arrival => {
                h.arrivals
                    .get_or_insert_with(|| self.cap.series(&self.arrivals, &labels()).clone())
                    .inc();
            }
            Fact::AcceptWait(secs) => h
                .accept_wait
                .get_or_insert_with(|| self.cap.series(&self.accept_wait, &labels()).clone())
                .observe(secs),
            Fact::Overflow => {
                h.overflows
                    .get_or_insert_with(|| {
                        self.cap.series(&self.listen_overflows, &labels()).clone()
                    })
                    .inc();
            }
            Fact::Answered { .. } => {}
        }
        if cache.by_listener.len() >= cache.prune_at {
            cache
                .by_listener
                .retain(|_, h| h.identity.strong_count() > 0);
            cache.prune_at = (cache.by_listener.len() * 2).max(256);
        }
    }

    /// A container was forgotten and its series removed: no cached handle may outlive them.
    pub fn forget_handles(&self) {
        if let Ok(mut cache) = self.handles.lock() {
            *cache = HandleCache::default();
        }
    }

    /// A reconnect storm ended (`new`), or one already counted resumed and ended again.
    pub fn storm(&self, s: &Storm, new: bool) {
        let c = ContainerIdentity {
            namespace: s.namespace.clone(),
            workload: s.workload.clone(),
            name: s.container.clone(),
            ..Default::default()
        };
        let Some(l) = self.port_labels(&c, s.port, "drainwatch_reconnect_storms") else {
            return;
        };
        if new {
            self.cap.series(&self.storms, &l).inc();
        }
        self.cap
            .series(&self.storm_peak_rate, &l)
            .set(s.peak_arrivals_per_second);
        // 0 when nothing queued: no wider window was needed.
        self.cap
            .series(&self.storm_window, &l)
            .set(s.recommended_window_seconds.unwrap_or(0.0));
        self.cap
            .series(&self.storm_observed_window, &l)
            .set(s.seconds_to_95_percent);
    }

    /// Adds the growth of each namespace's listen counters since the last sample.
    pub fn netns_listen_counters(&self, sample: &[(ContainerIdentity, ListenCounters)]) {
        let Ok(mut seen) = self.netns_seen.lock() else {
            return;
        };
        for (c, now) in sample {
            let l = ContainerLabels::from(c);
            if !self.cap.admit(&l, "drainwatch_netns_listen_overflows") {
                continue;
            }
            // Another container under the same names (a replacement that took its name) has a
            // namespace of its own, counted from 0; so has one whose counter went down.
            let before = match seen.insert(l.clone(), (c.id.clone(), *now)) {
                Some((id, before)) if id == c.id => before,
                _ => ListenCounters::default(),
            };
            let grew = |b: u64, n: u64| if n >= b { n - b } else { n };
            self.cap
                .series(&self.netns_listen_overflows, &l)
                .inc_by(grew(before.overflows, now.overflows));
            self.cap
                .series(&self.netns_listen_drops, &l)
                .inc_by(grew(before.drops, now.drops));
        }
    }

    /// Sets the accept-queue gauges to this sample; a `complete` sample (every container's
    /// listeners, not a fast one of a few workloads) also removes listeners that are gone.
    pub fn accept_queues(
        &self,
        sample: &[(ContainerIdentity, u16, u32, Option<u32>)],
        complete: bool,
    ) {
        let Ok(mut seen) = self.queues_seen.lock() else {
            return;
        };
        let mut now = HashSet::default();
        for (c, port, depth, limit) in sample {
            let Some(l) = self.port_labels(c, *port, "drainwatch_accept_queue_depth") else {
                continue;
            };
            self.cap
                .series(&self.accept_queue_depth, &l)
                .set(i64::from(*depth));
            if let Some(limit) = limit {
                self.cap
                    .series(&self.accept_queue_limit, &l)
                    .set(i64::from(*limit));
            }
            now.insert(l);
        }
        if !complete {
            seen.extend(now);
            return;
        }
        for gone in seen.difference(&now) {
            self.accept_queue_depth.remove(gone);
            self.accept_queue_limit.remove(gone);
        }
        *seen = now;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::{
        model::{ContainerIdentity, Fact, ListenCounters},
        telemetry::{Telemetry, cap::MAX_CONTAINERS},
    };

    #[test]
    fn listener_series_follow_an_identity_change_and_every_capped_fact_is_counted() {
        let m = Telemetry::new("k");
        let runtime = Arc::new(ContainerIdentity {
            name: "web-1".into(),
            workload: "web".into(),
            ..Default::default()
        });
        m.listeners.listener_fact(&runtime, 8080, &Fact::Arrival);
        m.listeners.listener_fact(&runtime, 8080, &Fact::Arrival);
        // The Kubernetes API named the pod: a new identity, its own series.
        let kube = Arc::new(ContainerIdentity {
            namespace: "shop".into(),
            ..(*runtime).clone()
        });
        drop(runtime);
        m.listeners.listener_fact(&kube, 8080, &Fact::Arrival);
        m.listeners
            .listener_fact(&kube, 8080, &Fact::AcceptWait(0.002));
        m.listeners.listener_fact(&kube, 9090, &Fact::Overflow);
        let text = m.encode_prometheus().unwrap();
        let at = |ns: &str, port: u16| {
            format!("{{namespace=\"{ns}\",workload=\"web\",container=\"web-1\",port=\"{port}\"}}")
        };
        for line in [
            format!("drainwatch_connection_arrivals_total{} 2", at("", 8080)),
            format!("drainwatch_connection_arrivals_total{} 1", at("shop", 8080)),
            format!("drainwatch_accept_wait_seconds_count{} 1", at("shop", 8080)),
            format!("drainwatch_listen_overflows_total{} 1", at("shop", 9090)),
        ] {
            assert!(text.contains(&line), "{line} in {text}");
        }
        assert!(!text.contains(&format!(
            "drainwatch_listen_overflows_total{}",
            at("shop", 8080)
        )));

        for i in 0..MAX_CONTAINERS {
            let c = ContainerIdentity {
                name: format!("c{i}"),
                ..Default::default()
            };
            m.stops.refused_connection(&c);
        }
        let late = Arc::new(ContainerIdentity {
            name: "late".into(),
            ..Default::default()
        });
        for _ in 0..3 {
            m.listeners.listener_fact(&late, 8080, &Fact::Arrival);
        }
        let text = m.encode_prometheus().unwrap();
        assert!(
            text.contains(
                "drainwatch_series_dropped_total{metric=\"drainwatch_connection_arrivals\"} 3"
            ),
            "{text}"
        );
    }

    #[test]
    fn accept_queue_gauges_follow_the_sample_and_drop_gone_listeners() {
        let m = Telemetry::new("k");
        let c = ContainerIdentity {
            name: "web-2".into(),
            workload: "web".into(),
            ..Default::default()
        };
        m.listeners
            .accept_queues(&[(c.clone(), 8080, 7, Some(128))], true);
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
        m.listeners.accept_queues(&[], false);
        let text = m.encode_prometheus().unwrap();
        assert!(
            text.contains(&format!("drainwatch_accept_queue_depth{labels} 7")),
            "a fast sample of other workloads removes nothing"
        );
        m.listeners.accept_queues(&[], true);
        let text = m.encode_prometheus().unwrap();
        assert!(!text.contains("drainwatch_accept_queue_depth{"), "{text}");
    }

    #[test]
    fn a_storm_resumed_updates_its_gauges_and_counts_once() {
        use crate::model::{Emitted, storm::Storm};
        let m = Telemetry::new("k");
        let storm = |clients, window| Storm {
            workload: "web".into(),
            container: "web-2".into(),
            port: 8080,
            clients,
            seconds_to_95_percent: window,
            ..Default::default()
        };
        m.record(&Emitted::Storm(Box::new(storm(45, 3.0))));
        m.record(&Emitted::StormUpdated(Box::new(storm(75, 11.0))));
        let labels = "{namespace=\"\",workload=\"web\",container=\"web-2\",port=\"8080\"}";
        let text = m.encode_prometheus().unwrap();
        assert!(
            text.contains(&format!("drainwatch_reconnect_storms_total{labels} 1")),
            "{text}"
        );
        assert!(text.contains(&format!(
            "drainwatch_reconnect_storm_window_seconds{labels} 11"
        )));
    }

    #[test]
    fn namespace_listen_counters_add_the_kernels_growth() {
        let m = Telemetry::new("k");
        let c = ContainerIdentity {
            name: "web-2".into(),
            workload: "web".into(),
            ..Default::default()
        };
        let at = |overflows, drops| [(c.clone(), ListenCounters { overflows, drops })];
        m.listeners.netns_listen_counters(&at(3, 4));
        m.listeners.netns_listen_counters(&at(10, 12));
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
        m.listeners.netns_listen_counters(&at(2, 2));
        let text = m.encode_prometheus().unwrap();
        assert!(text.contains(&format!(
            "drainwatch_netns_listen_overflows_total{labels} 12"
        )));
        // A replacement that took the name (another container) counts from 0, even past the
        // old one's last value.
        let new = ContainerIdentity {
            id: "replacement".into(),
            ..c.clone()
        };
        let counters = ListenCounters {
            overflows: 17,
            drops: 17,
        };
        m.listeners.netns_listen_counters(&[(new, counters)]);
        let text = m.encode_prometheus().unwrap();
        assert!(text.contains(&format!(
            "drainwatch_netns_listen_overflows_total{labels} 29"
        )));
    }
}
