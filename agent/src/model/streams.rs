//! Long-lived streams, as the stop record reports them: how long a container's server lets a
//! stream live before it ends it itself (a write timeout, a max connection age, a token's
//! expiry), learned as a distribution, and what became of the live streams the server ended
//! itself during a stop: on their own timers, or all at once right after the stop signal.

use serde::{Deserialize, Serialize};

use super::{Mono, SECOND};

/// How the lifetimes of a server's streams vary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LifetimeShape {
    /// All the same (5th to 95th percentile within 5% of the median, or 200 ms): one timer.
    Fixed,
    /// Within 40% of the median: a timer with jitter.
    Jittered,
    /// Wider: lifetimes set per stream (tokens expiring sooner, clients asking for less).
    Spread,
}

impl LifetimeShape {
    pub fn as_str(self) -> &'static str {
        match self {
            LifetimeShape::Fixed => "fixed",
            LifetimeShape::Jittered => "jittered",
            LifetimeShape::Spread => "spread",
        }
    }
}

/// The lifetimes of the streams a server ended itself while data still moved, outside stops:
/// kept quantiles and their shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamLifetimes {
    pub p50: Mono,
    /// The upper percentile the grace period is checked against: a stream opened just before
    /// the stop signal needs this long to end on its own timer (5% need longer).
    pub p95: Mono,
    pub max: Mono,
    /// How many lifetimes they were read from.
    pub streams: u32,
    pub shape: LifetimeShape,
}

impl StreamLifetimes {
    /// The quantiles of `lifetimes` (sorted here); None when there are none.
    pub fn of(lifetimes: &mut [Mono]) -> Option<StreamLifetimes> {
        lifetimes.sort_unstable();
        let n = lifetimes.len();
        // Nearest rank.
        let q = |p: usize| lifetimes[(p * n).div_ceil(100).clamp(1, n) - 1];
        let max = *lifetimes.last()?;
        let (p5, p50, p95) = (q(5), q(50), q(95));
        let width = p95 - p5;
        let shape = if width <= (p50 / 20).max(SECOND / 5) {
            LifetimeShape::Fixed
        } else if width <= p50 * 2 / 5 {
            LifetimeShape::Jittered
        } else {
            LifetimeShape::Spread
        };
        Some(StreamLifetimes {
            p50,
            p95,
            max,
            streams: n as u32,
            shape,
        })
    }
}

/// How soon after the stop signal a stream the server ended may have been ended "at" it.
pub const AT_SIGTERM: Mono = SECOND;

/// Ends within [`AT_SIGTERM`] are kept by this much time after the signal...
const SLOT: Mono = SECOND / 20;
const SLOTS: usize = 20;
/// ... and those within this long of each other make a burst: a drain ending every stream at
/// once does it within a few ms (or one event period of a server that polls a flag), while
/// timers end streams spread out as their lifetimes run out.
const BURST_SLOTS: usize = 5;

/// The share of the stop's live streams a burst must hold for the drain to have ended them at
/// once, in tenths: timers end within any 250 ms only the streams that had that little left
/// (a 24th of them for a fixed 6 s lifetime, a seventh for lifetimes of 0.6–3 s).
const AT_ONCE_TENTHS: u64 = 9;

/// Live streams its server ended itself during a stop, while it still ran (never cuts: each
/// client got its stream's end from the server), by when.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StreamEnds {
    /// Within [`AT_SIGTERM`] of the stop signal, by 50 ms after it.
    pub near_signal: [u64; SLOTS],
    /// Later (or in a stop with no stop signal).
    pub later: u64,
}

/// The split the record reports: did the drain ride the streams' own timers, or end them all
/// at once right after the stop signal?
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StreamsEnded {
    /// Ended all at once right after the stop signal, before their timers.
    pub at_sigterm: u64,
    /// Ended on their own timers (their lifetime ran out during the drain).
    pub on_their_timers: u64,
}

impl StreamEnds {
    /// Counts one stream the server ended at `at`, in a stop whose signal came at `sigterm`.
    pub fn count(&mut self, at: Mono, sigterm: Option<Mono>) {
        match sigterm {
            Some(t) if at >= t && at - t <= AT_SIGTERM => {
                let slot = ((at - t) / SLOT) as usize;
                self.near_signal[slot.min(SLOTS - 1)] += 1;
            }
            _ => self.later += 1,
        }
    }

    /// All of them.
    pub fn total(&self) -> u64 {
        self.near_signal.iter().sum::<u64>() + self.later
    }

    /// The split, given the stop's live streams cut (`streams_cut`). The drain ended them at
    /// once when, within a second of the signal, it ended nine in ten of the stop's live
    /// streams (at least two) within 250 ms of each other. Timers do that only for streams
    /// that opened together and live the same time (a fleet that reconnected within 250 ms):
    /// a limit.
    pub fn split(&self, cut: u64) -> StreamsEnded {
        let live = self.total() + cut;
        let burst = self
            .near_signal
            .windows(BURST_SLOTS)
            .map(|w| w.iter().sum::<u64>())
            .max()
            .unwrap_or(0);
        if burst >= 2 && 10 * burst >= AT_ONCE_TENTHS * live {
            StreamsEnded {
                at_sigterm: burst,
                on_their_timers: self.total() - burst,
            }
        } else {
            StreamsEnded {
                at_sigterm: 0,
                on_their_timers: self.total(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Mono = 1_000_000;

    fn of(ms: &[Mono]) -> StreamLifetimes {
        let mut l: Vec<Mono> = ms.iter().map(|m| m * MS).collect();
        StreamLifetimes::of(&mut l).unwrap()
    }

    #[test]
    fn quantiles_and_shape_follow_the_spread_of_lifetimes() {
        // One timer, measured to a few ms.
        let fixed = of(&(0..40).map(|i| 6_000 + i % 7).collect::<Vec<_>>());
        assert_eq!(fixed.shape, LifetimeShape::Fixed);
        assert_eq!(
            (fixed.p50, fixed.max, fixed.streams),
            (6_003 * MS, 6_006 * MS, 40)
        );
        // 0.8–1.0 × 6 s, and 0.2–1.0 × 6 s, evenly.
        let jittered = of(&(0..=100).map(|i| 4_800 + 12 * i).collect::<Vec<_>>());
        assert_eq!(jittered.shape, LifetimeShape::Jittered);
        assert_eq!(jittered.p95, 5_940 * MS);
        let spread = of(&(0..=100).map(|i| 1_200 + 48 * i).collect::<Vec<_>>());
        assert_eq!(spread.shape, LifetimeShape::Spread);
        assert_eq!((spread.p50, spread.p95), (3_600 * MS, 5_760 * MS));
        assert_eq!(StreamLifetimes::of(&mut []), None);
    }

    #[test]
    fn streams_ended_at_once_are_told_from_streams_on_their_timers() {
        let t = 10 * SECOND;
        let near = |e: &StreamEnds| e.near_signal.iter().sum::<u64>();
        let mut timers = StreamEnds::default();
        // A fixed 6 s lifetime: a sixth end within the first second, the rest later.
        for i in 0..60 {
            timers.count(t + i * 100 * MS, Some(t));
        }
        assert_eq!((near(&timers), timers.later), (11, 49));
        let on_timers = |n| StreamsEnded {
            at_sigterm: 0,
            on_their_timers: n,
        };
        assert_eq!(timers.split(0), on_timers(60));
        // With a 1 s grace period, SIGKILL cut those the timers had not ended: the ends
        // within the second are spread, no burst.
        let mut killed = StreamEnds::default();
        for i in 0..=10 {
            killed.count(t + i * 100 * MS, Some(t));
        }
        assert_eq!(killed.split(2), on_timers(11));
        // Ended all at once, 300 ms after the signal, after two had ended on their timers (no
        // lifetime learned, or one).
        let mut at_once = StreamEnds::default();
        at_once.count(t + 20 * MS, Some(t));
        at_once.count(t + 90 * MS, Some(t));
        for i in 0..40 {
            at_once.count(t + 300 * MS + i * MS, Some(t));
        }
        at_once.count(t + 3 * SECOND, Some(t)); // one opened after the signal, on its timer
        assert_eq!(
            at_once.split(0),
            StreamsEnded {
                at_sigterm: 40,
                on_their_timers: 3
            }
        );
        // Lifetimes of 0.6–3 s end a seventh of the streams within any 250 ms on their
        // timers: a burst is still the drain (seeds 52 and 58 of the accuracy campaign).
        let mut short = StreamEnds::default();
        for i in 0..10 {
            short.count(t + 400 * MS + i * 10 * MS, Some(t));
        }
        assert_eq!(short.split(0).at_sigterm, 10);
        // One stream proves nothing; before the signal or in a stop without one is later.
        let mut one = StreamEnds::default();
        one.count(t + 10 * MS, Some(t));
        one.count(t - 10 * MS, Some(t));
        one.count(t, None);
        one.count(t + SECOND, Some(t));
        assert_eq!((near(&one), one.later), (2, 2));
        assert_eq!(one.near_signal[19], 1, "the second's last slot");
        assert_eq!(one.split(0), on_timers(4));
    }
}
