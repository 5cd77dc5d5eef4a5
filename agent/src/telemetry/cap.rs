//! The per-container cardinality cap: every per-container family asks [`Cap::admit`] before
//! creating a series, and a container past the cap is dropped and counted in
//! `drainwatch_series_dropped_total{metric}`, never silently. The cap is over containers alive
//! or retained: each series made through [`Cap::series`] is remembered with its container, and
//! when the correlator forgets the last container of those labels (after the retention
//! window) its series are removed and its place freed ([`Cap::forget`]).

use std::sync::Mutex;

use prometheus_client::{
    metrics::{counter::Counter, family::Family, family::MetricConstructor},
    registry::Registry,
};

use super::labels::{ContainerLabels, MetricLabels};
use crate::model::{HashMap, HashSet};

/// Most distinct containers (namespace, workload, container) the per-container families
/// keep; past it new ones are dropped and counted in `drainwatch_series_dropped_total`.
pub const MAX_CONTAINERS: usize = 2000;

/// A label set with its container's labels in it.
pub trait OfContainer {
    fn container(&self) -> &ContainerLabels;
}

impl OfContainer for ContainerLabels {
    fn container(&self) -> &ContainerLabels {
        self
    }
}

type Remove = Box<dyn Fn() + Send + Sync>;

#[derive(Default)]
struct Slot {
    /// Removes each series made for these labels.
    series: Vec<Remove>,
    /// The containers (by id) seen under these labels and not forgotten yet.
    holders: HashSet<String>,
}

pub struct Cap {
    admitted: Mutex<HashMap<ContainerLabels, Slot>>,
    /// Each pod's own labels (`container=""`) with the containers (by id) of the pod not
    /// forgotten yet: apart from `admitted`, so that they take no place under the cap until a
    /// series is made for them. Locked after `admitted`.
    pods: Mutex<HashMap<ContainerLabels, HashSet<String>>>,
    dropped: Family<MetricLabels, Counter>,
    forgotten: Counter,
}

impl Cap {
    pub fn register(registry: &mut Registry) -> Self {
        let cap = Self {
            admitted: Mutex::new(HashMap::default()),
            pods: Mutex::new(HashMap::default()),
            dropped: Family::default(),
            forgotten: Counter::default(),
        };
        registry.register(
            "drainwatch_series_dropped",
            "Series not created because the per-container cardinality cap was reached",
            cap.dropped.clone(),
        );
        registry.register(
            "drainwatch_series_forgotten_containers",
            "Containers whose series were removed once they were gone longer than the retention window",
            cap.forgotten.clone(),
        );
        cap
    }

    /// Whether series for this container may be created, counting refusals against `metric`
    /// (the family that would have had the series).
    pub fn admit(&self, c: &ContainerLabels, metric: &'static str) -> bool {
        let Ok(mut admitted) = self.admitted.lock() else {
            return false;
        };
        if admitted.contains_key(c) {
            return true;
        }
        if admitted.len() >= MAX_CONTAINERS {
            self.dropped.get_or_create(&MetricLabels { metric }).inc();
            return false;
        }
        admitted.insert(c.clone(), Slot::default());
        true
    }

    /// `family`'s series for `labels` (of an admitted container), made on first use and
    /// remembered for [`Cap::forget`].
    pub fn series<'a, S, M, C>(
        &self,
        family: &'a Family<S, M, C>,
        labels: &S,
    ) -> impl std::ops::Deref<Target = M> + 'a
    where
        S: OfContainer + Clone + std::hash::Hash + Eq + Send + Sync + 'static,
        M: Send + Sync + 'static,
        C: MetricConstructor<M> + Clone + Send + Sync + 'static,
    {
        if family.get(labels).is_none()
            && let Ok(mut admitted) = self.admitted.lock()
            && let Some(slot) = admitted.get_mut(labels.container())
        {
            let (f, l) = (family.clone(), labels.clone());
            slot.series.push(Box::new(move || {
                f.remove(&l);
            }));
        }
        family.get_or_create(labels)
    }

    /// Container `id` has these labels (a container announced). It holds its pod's own labels
    /// (`container=""`, what a pod's RSTs no container accounts for are counted under) too, so
    /// those go with the pod's last container instead of staying for the agent's lifetime.
    pub fn hold(&self, c: &ContainerLabels, id: &str) {
        let Ok(mut admitted) = self.admitted.lock() else {
            return;
        };
        if let Some(slot) = admitted.get_mut(c) {
            slot.holders.insert(id.to_string());
        }
        let pod = pod_labels(c);
        if *c != pod
            && let Ok(mut pods) = self.pods.lock()
        {
            pods.entry(pod).or_default().insert(id.to_string());
        }
    }

    /// Container `id` is forgotten: when no other holds its labels (or its pod's), their
    /// series go.
    pub fn forget(&self, c: &ContainerLabels, id: &str) {
        let Ok(mut admitted) = self.admitted.lock() else {
            return;
        };
        if let Some(slot) = admitted.get_mut(c) {
            slot.holders.remove(id);
            if slot.holders.is_empty() {
                remove_series(&mut admitted, c);
                self.forgotten.inc();
            }
        }
        let pod = pod_labels(c);
        if *c != pod
            && let Ok(mut pods) = self.pods.lock()
            && let Some(holders) = pods.get_mut(&pod)
        {
            holders.remove(id);
            if holders.is_empty() {
                pods.remove(&pod);
                remove_series(&mut admitted, &pod);
            }
        }
    }
}

/// Removes the series made for `labels` and frees their place.
fn remove_series(admitted: &mut HashMap<ContainerLabels, Slot>, labels: &ContainerLabels) {
    if let Some(slot) = admitted.remove(labels) {
        for remove in &slot.series {
            remove();
        }
    }
}

/// The labels a container's pod's own series have: the container's, with no container.
fn pod_labels(c: &ContainerLabels) -> ContainerLabels {
    ContainerLabels {
        container: "".into(),
        ..c.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{model::ContainerIdentity, telemetry::Telemetry};

    #[test]
    fn per_container_series_are_capped_and_the_drops_counted() {
        let m = Telemetry::new("k");
        for i in 0..MAX_CONTAINERS + 3 {
            let c = ContainerIdentity {
                name: format!("c{i}"),
                workload: "w".into(),
                ..Default::default()
            };
            m.stops.refused_connection(&c);
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
    fn a_forgotten_container_frees_its_series_once_no_other_run_holds_its_labels() {
        use crate::model::{Emitted, ResetDirection};
        let m = Telemetry::new("k");
        let run = |id: &str| ContainerIdentity {
            id: id.into(),
            name: "app".into(),
            workload: "web".into(),
            ..Default::default()
        };
        let (old, new) = (run("old"), run("new"));
        for c in [&old, &new] {
            m.record(&Emitted::ContainerSeen {
                container: c.clone(),
            });
        }
        m.stops.connection_reset(
            &std::sync::Arc::new(old.clone()),
            ResetDirection::Sent,
            "NOT_SPECIFIED",
        );
        let series = |m: &Telemetry| {
            let text = m.encode_prometheus().unwrap();
            text.lines()
                .filter(|l| !l.starts_with('#') && l.contains("container=\"app\""))
                .count()
        };
        let before = series(&m);
        assert!(before > 10, "zeroed series and the reset: {before}");
        // The old run is forgotten, the new one still holds the labels: nothing goes.
        m.record(&Emitted::ContainerForgotten { container: old });
        assert_eq!(series(&m), before);
        m.record(&Emitted::ContainerForgotten { container: new });
        assert_eq!(series(&m), 0, "{}", m.encode_prometheus().unwrap());
        let text = m.encode_prometheus().unwrap();
        assert!(
            text.contains("drainwatch_series_forgotten_containers_total 1"),
            "{text}"
        );
        assert!(
            m.cap.admitted.lock().unwrap().is_empty(),
            "its place is free"
        );
    }

    #[test]
    fn a_pods_own_series_go_with_its_last_container() {
        use crate::model::{Emitted, ResetDirection};
        let m = Telemetry::new("k");
        let member = |id: &str, name: &str| ContainerIdentity {
            id: id.into(),
            name: name.into(),
            workload: "web".into(),
            ..Default::default()
        };
        let (app, sidecar) = (member("a", "app"), member("s", "sidecar"));
        for c in [&app, &sidecar] {
            m.record(&Emitted::ContainerSeen {
                container: c.clone(),
            });
        }
        // The pod's own RSTs (resets::pod_as_a_whole): no id, no name.
        m.stops.connection_reset(
            &std::sync::Arc::new(member("", "")),
            ResetDirection::Sent,
            "NOT_SPECIFIED",
        );
        let pod_series = |m: &Telemetry| {
            let text = m.encode_prometheus().unwrap();
            text.lines()
                .filter(|l| !l.starts_with('#') && l.contains("container=\"\""))
                .count()
        };
        assert_eq!(pod_series(&m), 1);
        m.record(&Emitted::ContainerForgotten { container: app });
        assert_eq!(pod_series(&m), 1, "the sidecar still holds the pod");
        m.record(&Emitted::ContainerForgotten { container: sidecar });
        assert_eq!(pod_series(&m), 0, "{}", m.encode_prometheus().unwrap());
        assert!(m.cap.admitted.lock().unwrap().is_empty());
        assert!(m.cap.pods.lock().unwrap().is_empty());
        assert!(
            m.encode_prometheus()
                .unwrap()
                .contains("drainwatch_series_forgotten_containers_total 2")
        );
    }
}
