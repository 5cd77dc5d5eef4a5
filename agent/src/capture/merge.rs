//! One time-ordered stream from the two ring buffers. Lifecycle records (signals, exits, cgroup
//! removals) have a ring of their own so that no flood of packet-path records can take their
//! space, but the pipeline must see a SIGTERM before the resets it caused. Each drain takes a
//! watermark (the monotonic clock) first, then drains the lifecycle ring, then the packet ring:
//! every record of either stamped before the watermark is then in hand (a record is stamped
//! after its reservation, within the program's run). Those go on in time order; the few
//! stamped at or after it (during the drain) wait for the next drain's watermark.
//!
//! Records are a few hundred bytes and the shared packet ring is only nearly in time order
//! (each CPU stamps before it reserves): a comparison sort of the records themselves moved
//! each of them O(log n) times, a quarter of the agent's CPU on busy pod traffic. Their
//! stamps are sorted instead, and each record then moves at most once into place.

use std::collections::VecDeque;

/// A record's kernel timestamp (`bpf_ktime_get_ns`).
pub trait Stamped {
    fn stamp(&self) -> u64;
}

#[derive(Debug)]
pub struct Merge<T> {
    /// Records stamped at or after the last watermark, in time order.
    held: VecDeque<T>,
    /// (stamp, position) of one drain's records, kept for its allocation.
    keys: Vec<(u64, usize)>,
}

impl<T> Default for Merge<T> {
    fn default() -> Self {
        Self {
            held: VecDeque::new(),
            keys: Vec::new(),
        }
    }
}

impl<T: Stamped> Merge<T> {
    /// The records of one drain (each ring's in its own order, both left empty), merged with
    /// those held: what is stamped before `watermark` in time order onto `out` (sorted in
    /// place there: no copy of its own); the rest is held.
    pub fn drain(
        &mut self,
        watermark: u64,
        lifecycle: &mut Vec<T>,
        packet: &mut Vec<T>,
        out: &mut Vec<T>,
    ) {
        let start = out.len();
        out.reserve(self.held.len() + lifecycle.len() + packet.len());
        out.extend(self.held.drain(..));
        out.append(lifecycle);
        out.append(packet);
        let all = &mut out[start..];
        if !all.is_sorted_by_key(Stamped::stamp) {
            // Stable: records of equal stamps keep their order (each ring's own).
            self.keys.clear();
            self.keys
                .extend(all.iter().enumerate().map(|(i, r)| (r.stamp(), i)));
            self.keys.sort_unstable();
            permute(all, &mut self.keys);
        }
        let split = start + all.partition_point(|r| r.stamp() < watermark);
        self.held.extend(out.drain(split..));
    }

    /// Everything held, at shutdown.
    pub fn flush(&mut self, out: &mut Vec<T>) {
        out.extend(self.held.drain(..));
    }

    pub fn held(&self) -> usize {
        self.held.len()
    }
}

/// Puts `items[keys[j].1]` at `j` for every `j`, following each cycle of the permutation
/// with swaps: a record already in place does not move. `keys` is used up.
fn permute<T>(items: &mut [T], keys: &mut [(u64, usize)]) {
    for i in 0..items.len() {
        let mut j = i;
        while keys[j].1 != i {
            let k = keys[j].1;
            items.swap(j, k);
            keys[j].1 = j;
            j = k;
        }
        keys[j].1 = j;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct R(u64, &'static str);

    impl Stamped for R {
        fn stamp(&self) -> u64 {
            self.0
        }
    }

    #[test]
    fn a_signal_goes_before_the_resets_after_it_whichever_ring_was_read_first() {
        let mut m = Merge::default();
        let mut out = Vec::new();
        m.drain(
            100,
            &mut vec![R(50, "sigterm")],
            &mut vec![R(10, "rst"), R(60, "rst after"), R(120, "late")],
            &mut out,
        );
        assert_eq!(
            out,
            vec![R(10, "rst"), R(50, "sigterm"), R(60, "rst after")]
        );
        assert_eq!(m.held(), 1);
        // The exit stamped during the last drain comes before the record held from then.
        out.clear();
        m.drain(
            200,
            &mut vec![R(110, "exit")],
            &mut vec![R(130, "rst")],
            &mut out,
        );
        assert_eq!(out, vec![R(110, "exit"), R(120, "late"), R(130, "rst")]);
        assert_eq!(m.held(), 0);
    }

    proptest::proptest! {
        /// The same order as a stable sort of the records themselves, whatever the stamps.
        #[test]
        fn the_order_is_a_stable_sort_by_stamp(
            held in proptest::collection::vec(0u64..40, 0..20),
            lifecycle in proptest::collection::vec(0u64..40, 0..8),
            packet in proptest::collection::vec(0u64..40, 0..60),
            watermark in 0u64..45,
        ) {
            // (stamp, where it came from, its place there): distinct records, equal stamps.
            let tag = |v: &[u64], ring: u64| -> Vec<(u64, u64)> {
                v.iter().enumerate().map(|(i, s)| (*s, ring * 100 + i as u64)).collect()
            };
            let mut sorted_held = tag(&held, 0);
            sorted_held.sort_by_key(|r| r.0);
            let mut m = Merge { held: sorted_held.iter().copied().collect(), keys: Vec::new() };
            let mut expected = sorted_held.clone();
            expected.extend(tag(&lifecycle, 1));
            expected.extend(tag(&packet, 2));
            expected.sort_by_key(|r| r.0);
            let mut out = vec![(999, 999)];
            m.drain(watermark, &mut tag(&lifecycle, 1), &mut tag(&packet, 2), &mut out);
            let split = expected.partition_point(|r| r.0 < watermark);
            proptest::prop_assert_eq!(&out[1..], &expected[..split]);
            out.clear();
            m.flush(&mut out);
            proptest::prop_assert_eq!(&out[..], &expected[split..]);
        }
    }

    impl Stamped for (u64, u64) {
        fn stamp(&self) -> u64 {
            self.0
        }
    }

    #[test]
    fn equal_stamps_keep_each_rings_order_and_flush_empties() {
        let mut m = Merge::default();
        let mut out = Vec::new();
        m.drain(
            5,
            &mut vec![],
            &mut vec![R(7, "a"), R(7, "b"), R(3, "c")],
            &mut out,
        );
        assert_eq!(out, vec![R(3, "c")]);
        out.clear();
        m.flush(&mut out);
        assert_eq!(out, vec![R(7, "a"), R(7, "b")]);
        assert_eq!(m.held(), 0);
    }
}
