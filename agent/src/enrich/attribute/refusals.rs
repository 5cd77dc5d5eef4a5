//! Refusals. A SYN to a listening address a container had closed is answered with a RST from
//! its namespace that names no process. When the attempt came from a process on this node,
//! that process's socket sees the RST next: the refusal waits a moment for it, so that the
//! observation names the attempt (a proxy's request or a kubelet probe: `correlate::probes`).
//! Attempts from elsewhere are reported unjoined once the wait is over.

use std::{collections::VecDeque, net::SocketAddr};

use crate::model::{Mono, Observation};

/// How long a refusal waits for the attempt's own RST, in event time.
const HOLD: Mono = 50_000_000;
/// How long it waits when no events come at all (nothing else moves event time).
const HOLD_IDLE: Mono = 1_000_000_000;
/// Refusals waiting at most; past it the oldest is reported unjoined at once (never dropped).
const MAX_PENDING: usize = 4096;

#[derive(Debug)]
struct Pending {
    at: Mono,
    /// The attempt's address: the SYN's source.
    client: SocketAddr,
    key: String,
}

#[derive(Debug, Default)]
pub(super) struct Refusals {
    pending: VecDeque<Pending>,
    /// The newest event time seen: how far the kernel's story has been read.
    event_time: Mono,
}

impl Refusals {
    /// Every event's time, in order of arrival.
    pub(super) fn event_at(&mut self, ts: Mono) {
        self.event_time = self.event_time.max(ts);
    }

    /// The container's side: a SYN from `client` refused at `at`.
    pub(super) fn refused(
        &mut self,
        at: Mono,
        client: SocketAddr,
        key: String,
        out: &mut Vec<Observation>,
    ) {
        if self.pending.len() >= MAX_PENDING
            && let Some(p) = self.pending.pop_front()
        {
            out.push(unjoined(p));
        }
        self.pending.push_back(Pending { at, client, key });
    }

    /// The attempt's side: the socket bound to `client` was answered with RST; `upstream`
    /// when it was a followed proxy's or prober's.
    pub(super) fn attempt_refused(
        &mut self,
        client: SocketAddr,
        upstream: Option<u64>,
        out: &mut Vec<Observation>,
    ) {
        if let Some(i) = self.pending.iter().position(|p| p.client == client)
            && let Some(p) = self.pending.remove(i)
        {
            out.push(Observation::Refused {
                key: p.key,
                at: p.at,
                upstream,
            });
        }
    }

    /// Refusals no attempt on this node claimed in time: from elsewhere.
    pub(super) fn flush(&mut self, now: Mono, out: &mut Vec<Observation>) {
        while let Some(p) = self.pending.front() {
            let waited = self.event_time >= p.at + HOLD || now >= p.at + HOLD_IDLE;
            if !waited {
                break;
            }
            if let Some(p) = self.pending.pop_front() {
                out.push(unjoined(p));
            }
        }
    }
}

fn unjoined(p: Pending) -> Observation {
    Observation::Refused {
        key: p.key,
        at: p.at,
        upstream: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Mono = 1_000_000;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 88, 0, 1], port))
    }

    #[test]
    fn a_refusal_waits_for_its_attempt_then_goes_out_unjoined() {
        let mut r = Refusals::default();
        let mut out = Vec::new();
        r.event_at(100 * MS);
        r.refused(100 * MS, addr(40_001), "c1".into(), &mut out);
        r.refused(101 * MS, addr(40_002), "c1".into(), &mut out);
        assert!(out.is_empty());
        // The second attempt's socket saw its RST: joined, with the refusal's own time.
        r.attempt_refused(addr(40_002), Some(0xa), &mut out);
        assert_eq!(
            out,
            [Observation::Refused {
                key: "c1".into(),
                at: 101 * MS,
                upstream: Some(0xa)
            }]
        );
        out.clear();
        // Event time has not moved 50 ms on: the first still waits, however late the clock.
        r.flush(200 * MS, &mut out);
        assert!(out.is_empty());
        r.event_at(150 * MS);
        r.flush(200 * MS, &mut out);
        assert_eq!(
            out,
            [Observation::Refused {
                key: "c1".into(),
                at: 100 * MS,
                upstream: None
            }]
        );
        // An attempt whose refusal is gone or never was: nothing.
        out.clear();
        r.attempt_refused(addr(40_001), Some(0xb), &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn with_no_events_a_refusal_waits_a_second_and_past_the_cap_none_is_lost() {
        let mut r = Refusals::default();
        let mut out = Vec::new();
        r.refused(0, addr(1), "c1".into(), &mut out);
        r.flush(999 * MS, &mut out);
        assert!(out.is_empty());
        r.flush(1000 * MS, &mut out);
        assert_eq!(out.len(), 1);
        out.clear();
        for p in 0..MAX_PENDING as u16 + 3 {
            r.refused(2000 * MS, addr(p), "c1".into(), &mut out);
        }
        assert_eq!(out.len(), 3, "the oldest three reported at once");
    }
}
