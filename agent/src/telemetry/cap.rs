//! The per-container cardinality cap: every per-container family asks [`Cap::admit`] before
//! creating a series, and a container past the cap is dropped and counted in
//! `drainwatch_series_dropped_total{metric}`, never silently.

use std::sync::Mutex;

use prometheus_client::{
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

use super::labels::{ContainerLabels, MetricLabels};
use crate::model::HashSet;

/// Most distinct containers (namespace, workload, container) the per-container families
/// keep; past it new ones are dropped and counted in `drainwatch_series_dropped_total`.
pub const MAX_CONTAINERS: usize = 2000;

pub struct Cap {
    seen: Mutex<HashSet<ContainerLabels>>,
    dropped: Family<MetricLabels, Counter>,
}

impl Cap {
    pub fn register(registry: &mut Registry) -> Self {
        let cap = Self {
            seen: Mutex::new(HashSet::default()),
            dropped: Family::default(),
        };
        registry.register(
            "drainwatch_series_dropped",
            "Series not created because the per-container cardinality cap was reached",
            cap.dropped.clone(),
        );
        cap
    }

    /// Whether series for this container may be created, counting refusals against `metric`
    /// (the family that would have had the series).
    pub fn admit(&self, c: &ContainerLabels, metric: &'static str) -> bool {
        let Ok(mut seen) = self.seen.lock() else {
            return false;
        };
        if seen.contains(c) {
            return true;
        }
        if seen.len() >= MAX_CONTAINERS {
            self.dropped.get_or_create(&MetricLabels { metric }).inc();
            return false;
        }
        seen.insert(c.clone());
        true
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
}
