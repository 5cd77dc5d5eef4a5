//! The kernel's tick (HZ), learned from the events that carry both of its clocks: `lsndtime`
//! and `lrcvtime` count in jiffies, and HZ (100 to 1000, a build option) is in no file a
//! container can always read, so each `inet_sock_set_state` record with counters brings a
//! (monotonic ns, jiffies) pair and the rate is their slope.

use crate::model::{Mono, SECOND};

#[derive(Debug, Default, Clone)]
pub struct JiffyClock {
    /// The pair the slope is measured from.
    anchor: Option<(Mono, u32)>,
    ns_per_jiffy: Option<f64>,
}

impl JiffyClock {
    /// Pairs closer than this give no estimate (one jiffy of 10 ms in a second: 1 %).
    const MIN_SPAN: Mono = SECOND;
    /// Re-anchored after this long, well before 32-bit jiffies wrap (49 days at 1000 Hz).
    const MAX_SPAN: Mono = 3600 * SECOND;

    pub fn observe(&mut self, ts: Mono, jiffies: u32) {
        if jiffies == 0 {
            return; // not read
        }
        let Some((t0, j0)) = self.anchor else {
            self.anchor = Some((ts, jiffies));
            return;
        };
        let Some(span) = ts.checked_sub(t0) else {
            return; // out of order
        };
        let ticks = jiffies.wrapping_sub(j0);
        if span >= Self::MIN_SPAN && ticks > 0 && (ticks as i32) > 0 {
            self.ns_per_jiffy = Some(span as f64 / f64::from(ticks));
        }
        if span >= Self::MAX_SPAN {
            self.anchor = Some((ts, jiffies));
        }
    }

    /// HZ, rounded; None until learned.
    pub fn hz(&self) -> Option<u32> {
        self.ns_per_jiffy
            .map(|ns| (SECOND as f64 / ns).round() as u32)
    }

    /// A count of jiffies as monotonic time; None until the rate is learned.
    pub fn duration(&self, jiffies: u32) -> Option<Mono> {
        self.ns_per_jiffy
            .map(|ns| (f64::from(jiffies) * ns) as Mono)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_learned_from_pairs_a_second_apart_and_survives_the_wrap() {
        let mut c = JiffyClock::default();
        assert_eq!(c.duration(250), None);
        // HZ=250, jiffies near the wrap (the kernel starts them 5 minutes before it).
        let j0 = u32::MAX - 100;
        c.observe(10 * SECOND, j0);
        c.observe(10 * SECOND + SECOND / 2, j0.wrapping_add(125));
        assert_eq!(c.hz(), None, "half a second is too short to trust");
        c.observe(13 * SECOND, j0.wrapping_add(750));
        assert_eq!(c.hz(), Some(250));
        assert_eq!(c.duration(50), Some(200_000_000));
        // Unread clocks and out-of-order pairs change nothing.
        c.observe(20 * SECOND, 0);
        c.observe(SECOND, 7);
        assert_eq!(c.hz(), Some(250));
        // Re-anchored after an hour, still right a day later.
        c.observe(10 * SECOND + 3600 * SECOND, j0.wrapping_add(900_000));
        c.observe(10 * SECOND + 86_400 * SECOND, j0.wrapping_add(21_600_000));
        assert_eq!(c.hz(), Some(250));
    }

    #[test]
    fn hz_1000_and_100() {
        for hz in [100u32, 1000] {
            let mut c = JiffyClock::default();
            c.observe(0, 1);
            c.observe(2 * SECOND, 1 + 2 * hz);
            assert_eq!(c.hz(), Some(hz));
        }
    }
}
