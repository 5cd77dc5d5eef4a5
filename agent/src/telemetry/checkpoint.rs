//! The state directory's checkpoint (`crate::checkpoint`): writes, failed writes, bytes, and
//! files set aside at start, by why.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

/// Why a previous run's checkpoint was not used.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Discard {
    Unreadable,
    /// Not JSON of the expected shape.
    Corrupt,
    /// Another format number (another version of the agent).
    Format,
    /// Written in another boot: its kernel times mean nothing now.
    Boot,
}

impl Discard {
    pub const ALL: [Discard; 4] = [
        Discard::Unreadable,
        Discard::Corrupt,
        Discard::Format,
        Discard::Boot,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Discard::Unreadable => "unreadable",
            Discard::Corrupt => "corrupt",
            Discard::Format => "format",
            Discard::Boot => "boot",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DiscardLabels {
    pub reason: Discard,
}

#[derive(Clone)]
pub struct CheckpointMetrics {
    writes: Counter,
    failures: Counter,
    bytes: Gauge,
    discarded: Family<DiscardLabels, Counter>,
}

impl CheckpointMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            writes: Counter::default(),
            failures: Counter::default(),
            bytes: Gauge::default(),
            discarded: Family::default(),
        };
        registry.register(
            "drainwatch_checkpoint_writes",
            "Checkpoints written to the state directory (--state-dir), each when it changed",
            m.writes.clone(),
        );
        registry.register(
            "drainwatch_checkpoint_write_failures",
            "Checkpoints that could not be written (see the log): a restart would resume from an older one",
            m.failures.clone(),
        );
        registry.register(
            "drainwatch_checkpoint_bytes",
            "Size of the last checkpoint written",
            m.bytes.clone(),
        );
        registry.register(
            "drainwatch_checkpoint_discarded",
            "Checkpoints found at start that could not be used and were set aside (state.json.discarded), by why",
            m.discarded.clone(),
        );
        for reason in Discard::ALL {
            let _ = m.discarded.get_or_create(&DiscardLabels { reason });
        }
        m
    }

    pub fn written(&self, bytes: usize) {
        self.writes.inc();
        self.bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    pub fn write_failed(&self) {
        self.failures.inc();
    }

    pub fn discarded(&self, reason: Discard) {
        self.discarded
            .get_or_create(&DiscardLabels { reason })
            .inc();
    }
}
