//! The agent's capped state (`model::state`): entries and capacity per collection as gauges,
//! and what each cap dropped as a counter.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::model::state::{StateMap, StateStat};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub map: StateMap,
}

pub struct StateMetrics {
    entries: [Gauge; StateMap::ALL.len()],
    capacity: [Gauge; StateMap::ALL.len()],
    dropped: [Counter; StateMap::ALL.len()],
}

impl StateMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let entries = Family::<StateLabels, Gauge>::default();
        let capacity = Family::<StateLabels, Gauge>::default();
        let dropped = Family::<StateLabels, Counter>::default();
        registry.register(
            "drainwatch_state_entries",
            "Entries in each of the agent's capped collections",
            entries.clone(),
        );
        registry.register(
            "drainwatch_state_capacity",
            "The cap of each of the agent's collections",
            capacity.clone(),
        );
        registry.register(
            "drainwatch_state_dropped",
            "Entries each of the agent's collections dropped at its cap (stop and start records: settled ones only)",
            dropped.clone(),
        );
        let of = |f: &Family<StateLabels, Gauge>| {
            StateMap::ALL.map(|map| f.get_or_create_owned(&StateLabels { map }))
        };
        Self {
            entries: of(&entries),
            capacity: of(&capacity),
            dropped: StateMap::ALL.map(|map| dropped.get_or_create_owned(&StateLabels { map })),
        }
    }

    /// The collections as they are now (`dropped` is cumulative).
    pub fn record(&self, stats: &[StateStat]) {
        for s in stats {
            let i = StateMap::ALL.iter().position(|m| *m == s.map).unwrap_or(0);
            self.entries[i].set(i64::try_from(s.entries).unwrap_or(i64::MAX));
            self.capacity[i].set(i64::try_from(s.capacity).unwrap_or(i64::MAX));
            let counted = self.dropped[i].get();
            self.dropped[i].inc_by(s.dropped.saturating_sub(counted));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::Telemetry;

    #[test]
    fn every_map_has_its_series_from_the_start_and_drops_count_up() {
        let t = Telemetry::new("k");
        let text = t.encode_prometheus().unwrap();
        for m in StateMap::ALL {
            let l = format!("{{map=\"{}\"}}", m.as_str());
            assert!(
                text.contains(&format!("drainwatch_state_dropped_total{l} 0")),
                "{m:?}"
            );
            assert!(
                text.contains(&format!("drainwatch_state_entries{l} 0")),
                "{m:?}"
            );
        }
        let stat = |dropped| StateStat {
            map: StateMap::Storms,
            entries: 1000,
            capacity: 1000,
            dropped,
        };
        t.state.record(&[stat(3)]);
        t.state.record(&[stat(5)]);
        let text = t.encode_prometheus().unwrap();
        assert!(text.contains("drainwatch_state_dropped_total{map=\"storms\"} 5"));
        assert!(text.contains("drainwatch_state_capacity{map=\"storms\"} 1000"));
    }
}
