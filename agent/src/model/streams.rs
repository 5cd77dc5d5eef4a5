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

/// How soon after the stop signal a stream the server ended was ended "at" it.
pub const AT_SIGTERM: Mono = SECOND;

/// The share of the stop's live streams the server must have ended within [`AT_SIGTERM`] of
/// the signal for the drain to have ended them at once, in tenths: timers end only the
/// streams that had under a second left (a sixth for a fixed 6 s lifetime, about 30% for
/// lifetimes spread over 1.2–6 s).
const AT_ONCE_TENTHS: u64 = 9;

/// Live streams its server ended itself during a stop, while it still ran (never cuts: each
/// client got its stream's end from the server), by when.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StreamEnds {
    /// Within [`AT_SIGTERM`] of the stop signal.
    pub near_signal: u64,
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
            Some(t) if at >= t && at - t <= AT_SIGTERM => self.near_signal += 1,
            _ => self.later += 1,
        }
    }

    /// The split, given the stop's live streams cut (`streams_cut`) and the lifetimes learned
    /// before it. The drain ended them at once when it ended nine in ten of the stop's live
    /// streams (at least two) within a second of the signal. Timers cannot be told from that
    /// when half the streams live under two seconds: then they are credited with all.
    pub fn split(&self, cut: u64, lifetimes: Option<&StreamLifetimes>) -> StreamsEnded {
        let live = self.near_signal + self.later + cut;
        let short_lived = lifetimes.is_some_and(|l| l.p50 < 2 * AT_SIGTERM);
        let at_once =
            self.near_signal >= 2 && 10 * self.near_signal >= AT_ONCE_TENTHS * live && !short_lived;
        if at_once {
            StreamsEnded {
                on_their_timers: self.later,
                at_sigterm: self.near_signal,
            }
        } else {
            StreamsEnded {
                on_their_timers: self.near_signal + self.later,
                at_sigterm: 0,
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
        let mut timers = StreamEnds::default();
        // A fixed 6 s lifetime: a sixth end within the first second, the rest later.
        for i in 0..60 {
            timers.count(t + i * 100 * MS, Some(t));
        }
        assert_eq!((timers.near_signal, timers.later), (11, 49));
        let six = of(&[6_000; 20]);
        assert_eq!(
            timers.split(0, Some(&six)),
            StreamsEnded {
                on_their_timers: 60,
                at_sigterm: 0
            }
        );
        // With a 2 s grace period, SIGKILL cut those the timers had not ended.
        let mut killed = StreamEnds::default();
        for i in 0..20 {
            killed.count(t + i * 100 * MS, Some(t));
        }
        assert_eq!(killed.split(40, Some(&six)).at_sigterm, 0);
        // Ended all at once, 30 ms after the signal (no lifetime learned, or one).
        let mut at_once = StreamEnds::default();
        for _ in 0..40 {
            at_once.count(t + 30 * MS, Some(t));
        }
        at_once.count(t + 3 * SECOND, Some(t)); // one opened after the signal, on its timer
        for l in [None, Some(&six)] {
            assert_eq!(
                at_once.split(0, l),
                StreamsEnded {
                    on_their_timers: 1,
                    at_sigterm: 40
                }
            );
        }
        // Streams that live a second end within one of any signal: timers.
        assert_eq!(at_once.split(0, Some(&of(&[900; 10]))).at_sigterm, 0);
        // One stream proves nothing; before the signal or in a stop without one is later.
        let mut one = StreamEnds::default();
        one.count(t + 10 * MS, Some(t));
        one.count(t - 10 * MS, Some(t));
        one.count(t, None);
        assert_eq!((one.near_signal, one.later), (1, 2));
        assert_eq!(one.split(0, None).at_sigterm, 0);
    }
}
