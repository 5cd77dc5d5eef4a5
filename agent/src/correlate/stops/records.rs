//! The stop records, oldest first, each under a sequence number that stays its name while
//! older records are evicted around it: containers point at their stop by it.

use crate::model::stop::Stop;

#[derive(Debug, Default)]
pub(super) struct Records {
    stops: Vec<Stop>,
    /// `stops[i]`'s sequence number; ascending, so a lookup is a binary search.
    seqs: Vec<usize>,
    next: usize,
    /// Settled records evicted at the cap.
    pub(super) evicted: u64,
}

impl Records {
    pub(super) fn push(&mut self, stop: Stop) -> usize {
        let seq = self.next;
        self.next += 1;
        self.stops.push(stop);
        self.seqs.push(seq);
        seq
    }

    pub(super) fn get(&self, seq: usize) -> Option<&Stop> {
        self.seqs.binary_search(&seq).ok().map(|i| &self.stops[i])
    }

    pub(super) fn get_mut(&mut self, seq: usize) -> Option<&mut Stop> {
        let i = self.seqs.binary_search(&seq).ok()?;
        self.stops.get_mut(i)
    }

    pub(super) fn all(&self) -> &[Stop] {
        &self.stops
    }

    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = (usize, &mut Stop)> {
        self.seqs.iter().copied().zip(self.stops.iter_mut())
    }

    /// Down to `max` records, evicting the oldest settled ones: an open record is never
    /// evicted and never keeps a settled one in (open ones settle by themselves, see
    /// `Tracker::tick`).
    pub(super) fn bound(&mut self, max: usize) {
        while self.stops.len() > max {
            let Some(i) = self.stops.iter().position(|s| s.settled) else {
                return;
            };
            self.stops.remove(i);
            self.seqs.remove(i);
            self.evicted += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stop(id: &str, settled: bool) -> Stop {
        Stop {
            settled,
            ..Stop::new(id.into(), Default::default())
        }
    }

    #[test]
    fn an_open_record_never_blocks_eviction_and_names_survive_it() {
        let mut r = Records::default();
        let open = r.push(stop("open", false));
        let a = r.push(stop("a", true));
        let b = r.push(stop("b", true));
        let c = r.push(stop("c", false));
        r.bound(2);
        let ids: Vec<&str> = r.all().iter().map(|s| s.id.as_str()).collect();
        assert_eq!(
            ids,
            ["open", "c"],
            "the settled ones went, the open ones stay"
        );
        assert_eq!(r.evicted, 2);
        assert!(r.get(a).is_none() && r.get(b).is_none());
        assert_eq!(r.get(open).map(|s| s.id.as_str()), Some("open"));
        assert_eq!(r.get_mut(c).map(|s| s.id.as_str()), Some("c"));
        // Nothing settled: over the cap until something settles.
        r.bound(1);
        assert_eq!(r.all().len(), 2);
    }
}
