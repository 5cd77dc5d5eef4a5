//! Refusals. A SYN to a listening address a container had closed is answered with a RST from
//! its namespace that names no process. When the attempt came from a process on this node,
//! that process's socket sees the RST next: the refusal waits a moment for it, so that the
//! observation names the attempt (a proxy's request or a kubelet probe: `correlate::probes`).
//! Attempts from elsewhere are reported unjoined once the wait is over. Refusals at ports that
//! were never a listening address (`Target::Port`) wait alike: a kubelet probe among them is
//! no refused request.

use super::Key;
use std::{collections::VecDeque, net::SocketAddr, sync::Arc};

use crate::model::{ContainerIdentity, Mono, Netns, Observation};

/// How long a refusal waits for the attempt's own RST, in event time.
const HOLD: Mono = 50_000_000;
/// How long it waits when no events come at all (nothing else moves event time).
const HOLD_IDLE: Mono = 1_000_000_000;
/// Refusals waiting at most; past it the oldest is reported unjoined at once (never dropped).
const MAX_PENDING: usize = 4096;

/// Where a connect was refused.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Target {
    /// At a listening address (namespace, port) the container (this key) had closed.
    Former(Key, Netns, u16),
    /// At (namespace, port) of this container (or pod as a whole) that was no such address.
    Port(Arc<ContainerIdentity>, Netns, u16),
}

#[derive(Debug)]
struct Pending {
    at: Mono,
    /// The attempt's address: the SYN's source.
    client: SocketAddr,
    target: Target,
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

    /// The newest event time seen.
    pub(super) fn event_time(&self) -> Mono {
        self.event_time
    }

    /// The container's side: a SYN from `client` refused at `at`.
    pub(super) fn refused(
        &mut self,
        at: Mono,
        client: SocketAddr,
        target: Target,
        out: &mut Vec<Observation>,
    ) {
        if self.pending.len() >= MAX_PENDING
            && let Some(p) = self.pending.pop_front()
        {
            out.push(observation(p, None));
        }
        self.pending.push_back(Pending { at, client, target });
    }

    /// The attempt's side: the socket bound to `client` was answered with RST; `upstream`
    /// when it was a followed proxy's or prober's, `syn_at` when its SYN was seen: the
    /// attempt's time (the RST may answer a retransmitted SYN, seconds later).
    pub(super) fn attempt_refused(
        &mut self,
        client: SocketAddr,
        upstream: Option<u64>,
        syn_at: Option<Mono>,
        out: &mut Vec<Observation>,
    ) {
        if let Some(i) = self.pending.iter().position(|p| p.client == client)
            && let Some(mut p) = self.pending.remove(i)
        {
            p.at = syn_at.map_or(p.at, |syn| syn.min(p.at));
            out.push(observation(p, upstream));
        }
    }

    /// Whether a container's refusal of a SYN from `client` waits for its attempt.
    pub(super) fn waiting_for(&self, client: SocketAddr) -> bool {
        self.pending.iter().any(|p| p.client == client)
    }

    /// The container `key` restarted in place, its new run at `since`: its refusals still
    /// waiting from then on are the new run's (`identity`), not the old run's stop's.
    pub(super) fn reassign(&mut self, key: &str, since: Mono, identity: &Arc<ContainerIdentity>) {
        for p in &mut self.pending {
            if let Target::Former(k, ns, port) = &p.target
                && k.as_str() == key
                && p.at >= since
            {
                p.target = Target::Port(Arc::clone(identity), *ns, *port);
            }
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
                out.push(observation(p, None));
            }
        }
    }
}

fn observation(p: Pending, upstream: Option<u64>) -> Observation {
    match p.target {
        Target::Former(key, ..) => Observation::Refused {
            key,
            at: p.at,
            upstream,
            peer: p.client.ip(),
        },
        Target::Port(container, netns, port) => Observation::RefusedAt {
            container,
            netns,
            port,
            at: p.at,
            upstream,
            peer: p.client.ip(),
        },
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
        r.refused(
            100 * MS,
            addr(40_001),
            Target::Former(Key::new("c1".into()), Netns::by_inode(1), 8080),
            &mut out,
        );
        r.refused(
            101 * MS,
            addr(40_002),
            Target::Former(Key::new("c1".into()), Netns::by_inode(1), 8080),
            &mut out,
        );
        assert!(out.is_empty());
        // The second attempt's socket saw its RST: joined, with the refusal's own time.
        r.attempt_refused(addr(40_002), Some(0xa), None, &mut out);
        assert_eq!(
            out,
            [Observation::Refused {
                key: Key::new("c1".into()),
                at: 101 * MS,
                upstream: Some(0xa),
                peer: addr(40_002).ip(),
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
                key: Key::new("c1".into()),
                at: 100 * MS,
                upstream: None,
                peer: addr(40_001).ip(),
            }]
        );
        // An attempt whose refusal is gone or never was: nothing.
        out.clear();
        r.attempt_refused(addr(40_001), Some(0xb), None, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn with_no_events_a_refusal_waits_a_second_and_past_the_cap_none_is_lost() {
        let mut r = Refusals::default();
        let mut out = Vec::new();
        r.refused(
            0,
            addr(1),
            Target::Former(Key::new("c1".into()), Netns::by_inode(1), 8080),
            &mut out,
        );
        r.flush(999 * MS, &mut out);
        assert!(out.is_empty());
        r.flush(1000 * MS, &mut out);
        assert_eq!(out.len(), 1);
        out.clear();
        for p in 0..MAX_PENDING as u16 + 3 {
            r.refused(
                2000 * MS,
                addr(p),
                Target::Former(Key::new("c1".into()), Netns::by_inode(1), 8080),
                &mut out,
            );
        }
        assert_eq!(out.len(), 3, "the oldest three reported at once");
    }
}
