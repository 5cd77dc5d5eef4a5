//! The load's schedule, fixed in advance: waves of requests at given instants, a stagger apart,
//! each optionally late by a jitter or given up by its client at an instant.

use std::time::{Duration, Instant};

/// One wave: at `at`, one request per entry of `ms` (its work in ms), `stagger` apart, each
/// late by its entry of `jitter` (none: on time), its client closing its connection at its
/// entry of `give_up` if the response is not complete by then (none: it waits).
#[derive(Clone, Debug)]
pub struct Wave {
    pub at: Instant,
    pub ms: Vec<u64>,
    pub jitter: Vec<Duration>,
    pub give_up: Vec<Option<Instant>>,
}

/// The whole load, fixed in advance: bounded in count and in time.
#[derive(Clone, Debug)]
pub struct Schedule {
    pub waves: Vec<Wave>,
    /// Gap between two requests of a wave (keeps their arrival order at HAProxy fixed).
    pub stagger: Duration,
    /// Client timeout beyond a request's work (more than HAProxy's `timeout server`, so its
    /// 504 is what the client sees).
    pub timeout_extra: Duration,
}

/// Gap between the requests of a wave.
pub const STAGGER: Duration = Duration::from_millis(40);
/// Most requests one schedule may hold (one thread each).
pub const MAX_REQUESTS: usize = 2000;

impl Schedule {
    /// `waves` waves `period` apart from `first`, each of `per_wave` requests of `ms` ms.
    pub fn periodic(
        first: Instant,
        period: Duration,
        waves: usize,
        per_wave: usize,
        ms: u64,
    ) -> Schedule {
        Schedule {
            waves: (0..waves)
                .map(|i| Wave {
                    at: first + period * i as u32,
                    ms: vec![ms; per_wave],
                    jitter: Vec::new(),
                    give_up: Vec::new(),
                })
                .collect(),
            stagger: STAGGER,
            timeout_extra: Duration::from_secs(35),
        }
    }

    /// Number of requests.
    pub fn len(&self) -> usize {
        self.waves.iter().map(|w| w.ms.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// When request `slot` of wave `wave` is sent.
    pub fn dispatch_at(&self, wave: usize, slot: usize) -> Instant {
        let w = &self.waves[wave];
        w.at + self.stagger * slot as u32 + w.jitter.get(slot).copied().unwrap_or_default()
    }

    /// Makes every request late by a random 0..`max` (drawn from `rng`): arrivals off the
    /// beat, in the same order (`max` is below `stagger`).
    pub fn jitter(&mut self, rng: &mut fastrand::Rng, max: Duration) {
        assert!(max < self.stagger, "jitter {max:?} would reorder requests");
        let max_us = max.as_micros() as u64;
        for w in &mut self.waves {
            w.jitter = (0..w.ms.len())
                .map(|_| Duration::from_micros(rng.u64(0..=max_us)))
                .collect();
        }
    }

    /// When the last request would end if every request completed its work.
    pub fn nominal_end(&self) -> Instant {
        let mut end = Instant::now();
        for (w, wave) in self.waves.iter().enumerate() {
            for (s, ms) in wave.ms.iter().enumerate() {
                end = end.max(self.dispatch_at(w, s) + Duration::from_millis(*ms));
            }
        }
        end
    }
}
