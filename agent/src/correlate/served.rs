//! What a storming service served, from the kernel's timing of its answers
//! (`agent-ebpf/src/storm_answers.rs`): work done after `accept()` (middleware, authorisation,
//! a pool) keeps clients waiting while the accept queue keeps up, so the accept rate
//! overstates what the service can take. Per connection, the moment it was served is the
//! answer after the longest server-side wait among its first exchanges (a Socket.IO CONNECT
//! answered after the middleware; an HTTP response; a greeting, from the accept); the served
//! capacity is the pace of those moments while served connections were pending. Pure.

use std::collections::HashMap;

use crate::model::{Mono, SECOND};

use super::storms::QUEUED_SECS;

/// One answer of a storming connection (see `Fact::Answered`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    pub sock: u64,
    pub accepted_at: Mono,
    pub data_at: Mono,
    pub index: u32,
    pub at: Mono,
}

/// Connections answered in one storm, each at most `MAX_CONNECTIONS`.
pub const MAX_CONNECTIONS: usize = 100_000;

/// Per connection (socket and accept time: the kernel reuses a freed socket's address), its
/// answer after the longest server-side wait so far: (that wait, its time).
#[derive(Debug, Default, Clone)]
pub struct Served {
    conns: HashMap<(u64, Mono), (Mono, Mono)>,
    /// The latest answer: a storm stays open while answers come.
    pub last: Option<Mono>,
    /// Connections left out at `MAX_CONNECTIONS`.
    pub dropped: u64,
}

impl Served {
    pub fn answer(&mut self, a: Answer) {
        tracing::trace!(
            sock = a.sock,
            accepted = a.accepted_at,
            data = a.data_at,
            index = a.index,
            at = a.at,
            "answer"
        );
        let delay = a.at.saturating_sub(a.data_at);
        self.last = Some(self.last.map_or(a.at, |l| l.max(a.at)));
        let key = (a.sock, a.accepted_at);
        if !self.conns.contains_key(&key) && self.conns.len() >= MAX_CONNECTIONS {
            self.dropped += 1;
            return;
        }
        let e = self.conns.entry(key).or_insert((delay, a.at));
        if delay > e.0 {
            *e = (delay, a.at);
        }
    }

    /// Each connection's served moment and how long after its accept (seconds), by moment.
    pub fn moments(&self) -> Vec<(Mono, f64)> {
        let mut m: Vec<(Mono, f64)> = self
            .conns
            .iter()
            .map(|((_, accepted), (_, at))| {
                (*at, at.saturating_sub(*accepted) as f64 / SECOND as f64)
            })
            .collect();
        m.sort_by_key(|(at, _)| *at);
        m
    }
}

/// The service's own time per connection: the 5th-percentile of accept-to-served (a
/// connection served at once takes that long anyway; the rest waited for the service).
pub fn floor(moments: &[(Mono, f64)]) -> f64 {
    let mut w: Vec<f64> = moments.iter().map(|(_, w)| *w).collect();
    w.sort_by(f64::total_cmp);
    w.get(w.len() / 20).copied().unwrap_or(0.0)
}

/// Connections served per second while served connections were pending: a served moment of a
/// connection that waited (≥ `QUEUED_SECS` beyond the service's own time, `floor`) and was
/// accepted before the previous moment ended a gap during which work was pending; capacity =
/// those gaps ÷ their total time. None unless at least a tenth of the connections (and 10)
/// waited: a service that kept up says nothing about its capacity.
pub fn capacity(moments: &[(Mono, f64)]) -> Option<f64> {
    let threshold = floor(moments) + QUEUED_SECS;
    let queued = moments.iter().filter(|(_, w)| *w >= threshold).count();
    if queued < 10 || queued * 10 < moments.len() {
        return None;
    }
    let (mut gaps, mut busy) = (0u64, 0u64);
    for pair in moments.windows(2) {
        let ((before, _), (at, wait)) = (pair[0], pair[1]);
        let accepted = at.saturating_sub((wait * SECOND as f64) as Mono);
        if wait >= threshold && accepted <= before {
            gaps += 1;
            busy += at - before;
        }
    }
    (busy > 0).then(|| gaps as f64 / (busy as f64 / SECOND as f64))
}

/// The 95th-percentile wait for the service beyond its own time (seconds).
pub fn wait_p95(moments: &[(Mono, f64)]) -> f64 {
    let f = floor(moments);
    let mut w: Vec<f64> = moments.iter().map(|(_, w)| (w - f).max(0.0)).collect();
    w.sort_by(f64::total_cmp);
    w.get((w.len() as f64 * 0.95) as usize)
        .or(w.last())
        .copied()
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Mono = 1_000_000;
    const T0: Mono = 1_000 * SECOND;

    /// `n` connections accepted evenly over `spread`, each answered at once (upgrade, 1 ms),
    /// then its request authorised by a pool of `pool` doing `work` each.
    fn pooled(n: u64, spread: Mono, pool: usize, work: Mono) -> Served {
        let mut s = Served::default();
        let mut free = vec![T0; pool];
        for i in 0..n {
            let accepted = T0 + spread * i / n;
            s.answer(Answer {
                sock: i,
                accepted_at: accepted,
                data_at: accepted,
                index: 0,
                at: accepted + MS,
            });
            let data = accepted + 2 * MS;
            let (slot, at) = free
                .iter()
                .copied()
                .enumerate()
                .min_by_key(|(_, t)| *t)
                .unwrap();
            let done = at.max(data) + work;
            free[slot] = done;
            s.answer(Answer {
                sock: i,
                accepted_at: accepted,
                data_at: data,
                index: 1,
                at: done,
            });
        }
        s
    }

    #[test]
    fn a_pool_slower_than_the_accepts_is_the_capacity() {
        // 500 connections accepted within 0.5 s, a pool of 5 × 20 ms: 250 served/s.
        let s = pooled(500, 500 * MS, 5, 20 * MS);
        let m = s.moments();
        assert_eq!(m.len(), 500, "one moment per connection");
        let rate = capacity(&m).unwrap();
        assert!((rate - 250.0).abs() < 5.0, "{rate}");
        assert!(wait_p95(&m) > 1.0, "the last waited ~1.5 s");
    }

    #[test]
    fn a_pool_that_keeps_up_has_no_capacity() {
        // 200 connections over 2 s (100/s) against a pool of 5 × 20 ms (250/s): they overlap,
        // but none waits for the pool.
        let s = pooled(200, 2 * SECOND, 5, 20 * MS);
        assert_eq!(capacity(&s.moments()), None);
        assert!(wait_p95(&s.moments()) < 0.005);
    }

    #[test]
    fn a_connection_is_served_once_at_its_longest_wait_and_reused_sockets_are_apart() {
        let mut s = Served::default();
        let a = |sock, accepted_at, data_at, at| Answer {
            sock,
            accepted_at,
            data_at,
            index: 0,
            at,
        };
        s.answer(a(1, T0, T0, T0 + MS));
        s.answer(a(1, T0, T0 + 2 * MS, T0 + 50 * MS));
        s.answer(a(1, T0, T0 + 60 * MS, T0 + 61 * MS));
        // The same address, a later connection.
        s.answer(a(1, T0 + SECOND, T0 + SECOND, T0 + SECOND + MS));
        let m = s.moments();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].0, T0 + 50 * MS);
        assert_eq!(s.last, Some(T0 + SECOND + MS));
    }
}
