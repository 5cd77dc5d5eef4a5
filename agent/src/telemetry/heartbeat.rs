//! Heartbeats of the threads that must keep going for capture to be right: the ring-buffer
//! reader and the pipeline. `/healthz` fails when either has not beaten for a while, so a
//! wedged or dead thread restarts the pod instead of leaving it green and blind.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::model::{Mono, SECOND, monotonic_now};

/// Longer than this without a beat is a stall: both beat at least every 100 ms (the drain
/// interval, the tick), and the pipeline's slowest step (a namespace's TCP table) takes a
/// second at worst.
pub const STALLED_AFTER: Mono = 5 * SECOND;

#[derive(Debug, Default)]
pub struct Heartbeat(AtomicU64);

impl Heartbeat {
    pub fn beat(&self) {
        self.beat_at(monotonic_now());
    }

    pub fn beat_at(&self, now: Mono) {
        self.0.store(now, Ordering::Relaxed);
    }

    /// How long since the last beat at `now`; None before the first.
    pub fn silent_for(&self, now: Mono) -> Option<Mono> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            last => Some(now.saturating_sub(last)),
        }
    }
}

/// The reader's and the pipeline's.
#[derive(Debug, Default)]
pub struct Heartbeats {
    pub reader: Heartbeat,
    pub pipeline: Heartbeat,
}

impl Heartbeats {
    /// The threads that stalled at `now`, with how long they have been silent.
    pub fn stalled(&self, now: Mono) -> Vec<(&'static str, Mono)> {
        [("reader", &self.reader), ("pipeline", &self.pipeline)]
            .into_iter()
            .filter_map(|(name, h)| Some((name, h.silent_for(now)?)))
            .filter(|(_, silent)| *silent > STALLED_AFTER)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_silent_for_longer_than_the_limit_has_stalled() {
        let h = Heartbeats::default();
        let now = monotonic_now();
        assert!(h.stalled(now).is_empty(), "not started yet: no stall");
        h.reader.beat();
        h.pipeline.beat();
        assert!(h.stalled(now + SECOND).is_empty());
        h.pipeline.beat();
        let later = monotonic_now() + STALLED_AFTER + SECOND;
        let names: Vec<&str> = h.stalled(later).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["reader", "pipeline"]);
    }
}
