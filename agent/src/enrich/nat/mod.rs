//! Where a connect was really sent when the address it named is nobody's: a Service's virtual
//! IP, which kube-proxy DNATs to a pod (iptables or nftables mode alike). The kernel's
//! connection tracking keeps the translation: the entry's reply tuple comes from the pod's
//! address. An unanswered SYN's entry lives `nf_conntrack_tcp_timeout_syn_sent` (120 s by
//! default), a refused one's 10 s: there when its socket gives up.
//!
//! One ctnetlink `IPCTNL_MSG_CT_GET` by the original tuple, only for failed connects to an
//! address no container has (rare: a successful connect is never looked up), over a netlink
//! socket of the host's network namespace (the agent must run there, with `CAP_NET_ADMIN`).
//! Hand-written: the maintained netlink crates (rust-netlink's `netlink-packet-netfilter`)
//! speak nflog, not ctnetlink, and one request and one reply is all this needs.

mod ctnetlink;

use std::{collections::HashMap, io, net::SocketAddr, path::Path};

use thiserror::Error;

pub use crate::model::nat::NatOutcome;
pub use ctnetlink::Conntrack;
use ctnetlink::same;

use super::host::netns_inode;

#[derive(Debug, Error)]
pub enum NatError {
    #[error(
        "the agent is not in the host's network namespace: no Service translation can be looked up (run it with hostNetwork)"
    )]
    NotHostNetns,
    #[error("ctnetlink: {0}")]
    Io(#[from] io::Error),
    #[error("ctnetlink answered with a malformed message: {0}")]
    Malformed(&'static str),
}

/// Lookups a second at most: a node whose processes fail connects to some dead host by the
/// thousand costs the agent no more than this (the rest counted `capped`).
pub const MAX_PER_SECOND: u32 = 200;

/// Where a connect was really sent, however it is asked (a ctnetlink socket; a fake in tests).
pub trait Resolve: Send {
    /// Where `from` → `to` was really sent: `Ok(None)` when not tracked.
    fn resolve(&mut self, from: SocketAddr, to: SocketAddr)
    -> Result<Option<SocketAddr>, NatError>;
    /// Where the tracked connections to `to` were really sent, translated ones only.
    fn served_by(&mut self, to: SocketAddr) -> Result<Vec<SocketAddr>, NatError>;
}

impl Resolve for Conntrack {
    fn resolve(
        &mut self,
        from: SocketAddr,
        to: SocketAddr,
    ) -> Result<Option<SocketAddr>, NatError> {
        self.lookup(from, to)
    }

    fn served_by(&mut self, to: SocketAddr) -> Result<Vec<SocketAddr>, NatError> {
        Conntrack::served_by(self, to)
    }
}

/// What a failed connect's lookup found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Translation {
    /// DNATed to this address.
    To(SocketAddr),
    /// Refused by the node's own filter before any translation (no entry, and the kernel
    /// answered with an ICMP reject, not a RST: kube-proxy's Service with no endpoints), and
    /// where the Service's tracked connections had gone (its pods, most connections first).
    Rejected(Vec<SocketAddr>),
    /// Neither: not translated, not tracked, not looked up.
    None,
}

/// How long what a dump found for an address is reused: a Service without endpoints is
/// rejected many times a second, its tracked connections change slowly.
const SERVED_BY_REUSE_NS: u64 = 5_000_000_000;

/// How long after a reject answered by ICMP an untracked connect to the same address that
/// went unanswered is one of the same rejects: the node rate-limits the ICMP errors it sends
/// to another host (`icmp_ratelimit`, a burst of 6 then one a second per peer), so a pod or a
/// remote client sees most rejects as a SYN nobody answered.
const REJECTING_NS: u64 = 10_000_000_000;

/// The enricher's lookups: budgeted per second, each counted by outcome.
#[derive(Default)]
pub struct Nat {
    resolver: Option<Box<dyn Resolve>>,
    /// The second (monotonic) the budget is for, and the lookups made in it.
    second: u64,
    used: u32,
    counts: [u64; NatOutcome::ALL.len()],
    /// The last dump's finding per address, and when it was made.
    served: HashMap<SocketAddr, (u64, Vec<SocketAddr>)>,
    /// Addresses seen rejected with an ICMP answer, and when last.
    rejecting: HashMap<SocketAddr, u64>,
}

impl Nat {
    pub fn new(resolver: Box<dyn Resolve>) -> Self {
        Self {
            resolver: Some(resolver),
            ..Self::default()
        }
    }

    /// Over ctnetlink when the agent runs in the host's network namespace (PID 1's under
    /// `procfs_root`; its own when that cannot be read, as the agent's host filter assumes);
    /// else none, and the log says why.
    pub fn open(procfs_root: &Path) -> Self {
        let netns = |p: &Path| {
            std::fs::read_link(p)
                .ok()
                .and_then(|l| netns_inode(&l.to_string_lossy()))
        };
        let own = netns(Path::new("/proc/self/ns/net"));
        let host = netns(&procfs_root.join("1/ns/net")).or(own);
        match Conntrack::open(own.is_some() && host == own) {
            Ok(ct) => Self::new(Box::new(ct)),
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "connects that fail through a Service's virtual IP will not be counted on their pod"
                );
                Self::default()
            }
        }
    }

    /// Where `from` → `to`, a connect that failed at `now` (monotonic ns), was really sent;
    /// `refused`: with ECONNREFUSED and no RST received. An untracked one is a reject when it
    /// was refused, or went unanswered while its address was being rejected (within
    /// [`REJECTING_NS`] of a refused one). Nothing without a resolver (nothing counted: the
    /// agent said at start-up why it has none).
    pub fn lookup(
        &mut self,
        now: u64,
        from: SocketAddr,
        to: SocketAddr,
        refused: bool,
    ) -> Translation {
        let Some(resolver) = self.resolver.as_mut() else {
            return Translation::None;
        };
        let second = now / 1_000_000_000;
        if second != self.second {
            (self.second, self.used) = (second, 0);
        }
        let (outcome, found) = if self.used >= MAX_PER_SECOND {
            (NatOutcome::Capped, Translation::None)
        } else {
            self.used += 1;
            match resolver.resolve(from, to) {
                Ok(Some(real)) if !same(real, to) => {
                    (NatOutcome::Translated, Translation::To(real))
                }
                Ok(Some(_)) => (NatOutcome::Untranslated, Translation::None),
                Ok(None) if refused || self.rejecting(now, to) => {
                    if refused {
                        // Bounded by the addresses rejected within the window.
                        self.rejecting
                            .retain(|_, at| now.saturating_sub(*at) < REJECTING_NS);
                        self.rejecting.insert(to, now);
                    }
                    (
                        NatOutcome::Rejected,
                        Translation::Rejected(self.served_by(now, to)),
                    )
                }
                Ok(None) => (NatOutcome::NotFound, Translation::None),
                Err(e) => {
                    tracing::debug!(error = %e, "conntrack lookup failed");
                    (NatOutcome::Failed, Translation::None)
                }
            }
        };
        self.counts[outcome as usize] += 1;
        found
    }

    fn rejecting(&self, now: u64, to: SocketAddr) -> bool {
        self.rejecting
            .get(&to)
            .is_some_and(|at| now.saturating_sub(*at) < REJECTING_NS)
    }

    /// Where `to`'s tracked connections went, most first, from a dump at most every 5 s.
    fn served_by(&mut self, now: u64, to: SocketAddr) -> Vec<SocketAddr> {
        if let Some((at, found)) = self.served.get(&to)
            && now.saturating_sub(*at) < SERVED_BY_REUSE_NS
        {
            return found.clone();
        }
        let Some(resolver) = self.resolver.as_mut() else {
            return Vec::new();
        };
        let all = resolver.served_by(to).unwrap_or_else(|e| {
            tracing::debug!(error = %e, "conntrack dump failed");
            Vec::new()
        });
        let mut by_count: HashMap<SocketAddr, usize> = HashMap::new();
        for a in all {
            *by_count.entry(a).or_default() += 1;
        }
        let mut found: Vec<(SocketAddr, usize)> = by_count.into_iter().collect();
        found.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let found: Vec<SocketAddr> = found.into_iter().map(|(a, _)| a).collect();
        // Bounded by the Services' addresses rejected within 5 s.
        self.served
            .retain(|_, (at, _)| now.saturating_sub(*at) < SERVED_BY_REUSE_NS);
        self.served.insert(to, (now, found.clone()));
        found
    }

    /// Lookups so far by outcome (`drainwatch_nat_lookups_total`); empty without a resolver.
    pub fn counts(&self) -> Vec<(NatOutcome, u64)> {
        if self.resolver.is_none() {
            return Vec::new();
        }
        NatOutcome::ALL
            .iter()
            .map(|o| (*o, self.counts[*o as usize]))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    struct Fake(Option<SocketAddr>);
    impl Resolve for Fake {
        fn resolve(
            &mut self,
            _: SocketAddr,
            _: SocketAddr,
        ) -> Result<Option<SocketAddr>, NatError> {
            Ok(self.0)
        }
        fn served_by(&mut self, _: SocketAddr) -> Result<Vec<SocketAddr>, NatError> {
            Ok(vec![
                sa("10.88.0.6:8080"),
                sa("10.88.0.7:8080"),
                sa("10.88.0.7:8080"),
            ])
        }
    }

    #[test]
    fn lookups_are_budgeted_per_second_and_counted_by_outcome() {
        let (from, vip, pod) = (sa("10.0.2.15:1"), sa("10.96.0.10:80"), sa("10.88.0.7:8080"));
        let mut nat = Nat::new(Box::new(Fake(Some(pod))));
        let to = |p| Translation::To(p);
        for _ in 0..MAX_PER_SECOND {
            assert_eq!(nat.lookup(5_000_000_000, from, vip, false), to(pod));
        }
        assert_eq!(
            nat.lookup(5_900_000_000, from, vip, false),
            Translation::None,
            "over the budget"
        );
        assert_eq!(
            nat.lookup(6_000_000_000, from, vip, false),
            to(pod),
            "a new second"
        );
        let count = |n: &Nat, o| {
            n.counts()
                .into_iter()
                .find(|(k, _)| *k == o)
                .map(|(_, c)| c)
        };
        assert_eq!(
            count(&nat, NatOutcome::Translated),
            Some(u64::from(MAX_PER_SECOND) + 1)
        );
        assert_eq!(count(&nat, NatOutcome::Capped), Some(1));
        // The address it named is where it went: not translated.
        let mut same = Nat::new(Box::new(Fake(Some(vip))));
        assert_eq!(same.lookup(0, from, vip, true), Translation::None);
        assert_eq!(count(&same, NatOutcome::Untranslated), Some(1));
        assert!(Nat::default().counts().is_empty());
        // Untracked and refused by ICMP: rejected by a filter; where the Service's tracked
        // connections went, most first.
        let mut none = Nat::new(Box::new(Fake(None)));
        assert_eq!(none.lookup(0, from, vip, false), Translation::None);
        let pods = vec![sa("10.88.0.7:8080"), sa("10.88.0.6:8080")];
        assert_eq!(
            none.lookup(0, from, vip, true),
            Translation::Rejected(pods.clone())
        );
        // Unanswered while the address is rejected: an ICMP answer the node rate-limited.
        let (late, after) = (REJECTING_NS - 1, REJECTING_NS + 1);
        assert_eq!(
            none.lookup(late, from, vip, false),
            Translation::Rejected(pods)
        );
        assert_eq!(none.lookup(after, from, vip, false), Translation::None);
        assert_eq!(
            none.lookup(after, from, sa("10.96.0.11:80"), false),
            Translation::None
        );
        assert_eq!(count(&none, NatOutcome::NotFound), Some(3));
        assert_eq!(count(&none, NatOutcome::Rejected), Some(2));
    }
}
