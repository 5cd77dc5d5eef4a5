//! Connects still in flight to a stopped container's vanished address. A SYN to an address
//! nothing answers for anymore fails only when the kernel gives up on it: when ARP gives up
//! on the old neighbour (tens of seconds while the host still believes the old link-layer
//! address), or after the SYN retries (`net.ipv4.tcp_syn_retries`: 127 s by default). A stop
//! record would settle first, 10 s after the cgroup's removal, and miss them (issue 42: nginx
//! kept connecting to a stopped replica for 6 s; its connects failed 39–44 s later).
//!
//! So the enricher announces each SYN to the address of a container whose run has ended
//! (`Observation::AttemptBegan`) and its socket's next step (`AttemptEnded`), and the stop
//! does not settle while one that began before it was due is in flight; each for at most the
//! kernel's give-up time (`syn_give_up`), past which it is counted unresolved and the record
//! is incomplete. Attempts begun after it was due are not the record's, as before: a record's
//! life stays bounded (its due time plus one give-up time) however long clients keep trying.

use super::Tracker;
use crate::model::{HashMap, Mono, SECOND};

/// Most attempts followed at once over all stops; past it one goes (its stop stops waiting
/// for it), counted (`drainwatch_state_dropped_total{map="attempts_in_flight"}`).
pub const MAX_IN_FLIGHT: usize = 65_536;

/// The kernel's retry parameters for a connect's SYN, read at start-up (see `from_proc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SynRetries {
    /// `net.ipv4.tcp_syn_retries`: retransmissions before the kernel gives up (6 by default).
    pub retries: u32,
    /// `net.ipv4.tcp_rto_max_ms` (6.15+; 120 s before, and by default): the longest wait.
    pub rto_max: Mono,
}

impl Default for SynRetries {
    /// The kernel's defaults, for tests and a kernel whose values cannot be read.
    fn default() -> Self {
        Self {
            retries: 6,
            rto_max: 120 * SECOND,
        }
    }
}

impl SynRetries {
    /// Read from `<procfs>/sys/net/ipv4` (the agent's own network namespace: the host's when
    /// it runs in it; a pod's namespace starts with the kernel's defaults). What cannot be
    /// read stays the kernel's default, and says so.
    pub fn from_proc(procfs: &std::path::Path) -> (Self, Vec<String>) {
        let mut s = Self::default();
        let mut unread = Vec::new();
        let dir = procfs.join("sys/net/ipv4");
        let read = |name: &str| -> Option<u64> {
            std::fs::read_to_string(dir.join(name))
                .ok()
                .and_then(|t| t.trim().parse().ok())
        };
        match read("tcp_syn_retries").and_then(|r| u32::try_from(r).ok()) {
            Some(r) => s.retries = r,
            None => unread.push("tcp_syn_retries".to_string()),
        }
        // Absent before 6.15: the fixed TCP_RTO_MAX, which is its default.
        if let Some(ms) = read("tcp_rto_max_ms") {
            s.rto_max = ms.saturating_mul(1_000_000);
        }
        (s, unread)
    }

    /// `from_proc`, saying what it could not read.
    pub fn read(procfs: &std::path::Path) -> Self {
        let (syn, unread) = Self::from_proc(procfs);
        if !unread.is_empty() {
            tracing::warn!(
                ?unread,
                "cannot read the kernel's SYN retries: stops wait for attempts to vanished addresses as long as its defaults say"
            );
        }
        tracing::debug!(
            retries = syn.retries,
            give_up_ns = syn.give_up(),
            "SYN retries"
        );
        syn
    }

    /// How long after its SYN the kernel has given up on a connect no one answers: the
    /// initial RTO (1 s, `TCP_TIMEOUT_INIT`) doubling at each retransmission up to the
    /// longest wait, and the wait after the last one; plus half of that, as the timer wheel
    /// fires timers of seconds late (measured here: 7.1, 19.4 and 35.5 s with 2, 3 and 4
    /// retries, against 7, 15 and 31 s). 190 s with the defaults. A bound for an outcome
    /// lost on its way; a socket's own `TCP_SYNCNT` or `TCP_USER_TIMEOUT` can exceed it.
    pub fn give_up(self) -> Mono {
        let mut total: Mono = 0;
        let mut rto = SECOND;
        for _ in 0..=self.retries.min(255) {
            total = total.saturating_add(rto);
            rto = rto.saturating_mul(2).min(self.rto_max.max(SECOND));
        }
        total.saturating_add(total / 2)
    }
}

impl super::Config {
    /// The defaults, with the kernel's SYN retries read from `procfs` (`SynRetries::read`).
    pub fn reading_syn_retries(procfs: &std::path::Path) -> Self {
        Self {
            syn: SynRetries::read(procfs),
            ..Self::default()
        }
    }
}

/// One attempt in flight: the record that waits for it, and its SYN.
#[derive(Debug, Clone, Copy)]
struct Pending {
    seq: usize,
    at: Mono,
}

#[derive(Debug, Default)]
pub(super) struct InFlight {
    by_sock: HashMap<u64, Pending>,
    pub(super) dropped: u64,
}

impl InFlight {
    pub(super) fn len(&self) -> usize {
        self.by_sock.len()
    }
}

impl Tracker {
    /// A connect from this node to `key`'s address, sent at `at` after its run ended.
    pub(super) fn attempt_began(&mut self, key: &str, sock: u64, at: Mono) {
        let settle = self.config.settle;
        let Some(seq) = self.containers.get(key).and_then(|c| c.stop) else {
            return;
        };
        let Some(s) = self.records.get_mut(seq).filter(|s| !s.settled) else {
            return;
        };
        // Begun after the record was due: not its loss (see the module's comment).
        if at > super::lifecycle::due(s, settle) {
            return;
        }
        // A socket address reused before its earlier attempt's end was seen.
        self.attempt_ended(sock);
        // At the cap one goes (any: a map has no order; the likely one outlived its end,
        // lost on the way), and its record stops waiting for it.
        if self.in_flight.by_sock.len() >= MAX_IN_FLIGHT
            && let Some(old) = self.in_flight.by_sock.keys().next().copied()
        {
            self.attempt_ended(old);
            self.in_flight.dropped += 1;
        }
        self.in_flight.by_sock.insert(sock, Pending { seq, at });
        if let Some(s) = self.records.get_mut(seq) {
            s.attempts_in_flight += 1;
        }
    }

    /// That attempt's socket took its next step: its outcome, if any, came with it.
    pub(super) fn attempt_ended(&mut self, sock: u64) {
        let Some(p) = self.in_flight.by_sock.remove(&sock) else {
            return;
        };
        // A settled record never changes (one settled at a restart in place counts none).
        if let Some(s) = self.records.get_mut(p.seq).filter(|s| !s.settled) {
            s.attempts_in_flight = s.attempts_in_flight.saturating_sub(1);
        }
    }

    /// Attempts the kernel has given up on by `now` whose end never came: unresolved.
    pub(super) fn expire_attempts(&mut self, now: Mono) {
        let give_up = self.config.syn.give_up();
        let records = &mut self.records;
        self.in_flight.by_sock.retain(|_, p| {
            let keep = now < p.at.saturating_add(give_up);
            if !keep && let Some(s) = records.get_mut(p.seq).filter(|s| !s.settled) {
                s.attempts_in_flight = s.attempts_in_flight.saturating_sub(1);
                s.attempts_unresolved += 1;
            }
            keep
        });
    }

    /// Attempts followed now, and how many the cap dropped.
    pub fn attempts_in_flight(&self) -> (usize, u64) {
        (self.in_flight.len(), self.in_flight.dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        ContainerIdentity, Emitted, ExitInfo, LossKind, Observation as O, Sender, stop::SIGTERM,
    };

    const T0: Mono = 1_000 * SECOND;

    fn ms(n: u64) -> Mono {
        T0 + n * 1_000_000
    }

    fn key() -> crate::model::observation::ContainerKey {
        crate::model::observation::ContainerKey::new("c1".into())
    }

    /// c1 stopped: SIGTERM at 0, exit at 20 ms (code 0), cgroup gone at 30 ms (due at 10.03 s).
    fn stopped(syn: SynRetries) -> Tracker {
        let mut t = Tracker::new(super::super::Config {
            syn,
            ..Default::default()
        });
        t.observe(
            ms(0),
            O::Container {
                identity: Box::new(ContainerIdentity {
                    id: "c1".into(),
                    workload: "web".into(),
                    ..Default::default()
                }),
                listeners: vec!["10.88.0.5:8080".parse().expect("addr")],
                inbound: vec![],
            },
        );
        let sender = Sender {
            pid: 1,
            comm: "runc".into(),
        };
        let steps = [
            O::Signal {
                key: key(),
                sig: SIGTERM,
                sender,
                ignored: None,
            },
            O::Exit {
                key: key(),
                exit: ExitInfo {
                    code: Some(0),
                    signal: None,
                },
            },
            O::CgroupRemoved { key: key() },
        ];
        for (at, o) in [ms(0), ms(20), ms(30)].into_iter().zip(steps) {
            t.observe(at, o);
        }
        t
    }

    fn began(t: &mut Tracker, sock: u64, at: Mono) {
        t.observe(
            at,
            O::AttemptBegan {
                key: key(),
                sock,
                at,
            },
        );
    }

    /// The kernel gave up on `sock` (sent at `at`) `now`: unreachable, then its next step.
    fn failed(t: &mut Tracker, sock: u64, at: Mono, now: Mono) {
        let unreachable = O::Unreachable {
            key: key(),
            at,
            upstream: None,
        };
        t.observe(now, O::AttemptEnded { key: key(), sock });
        t.observe(now, unreachable);
    }

    #[test]
    fn a_stop_waits_for_the_attempts_to_its_vanished_address_begun_before_it_was_due() {
        let mut t = stopped(SynRetries::default());
        began(&mut t, 1, ms(1_000));
        began(&mut t, 2, ms(6_000));
        // Begun after it was due (10.03 s): neither held nor counted.
        began(&mut t, 3, ms(10_500));
        t.tick(ms(10_030));
        t.tick(ms(12_000));
        let s = &t.stops()[0];
        assert!(!s.settled, "due, but two attempts are in flight");
        assert_eq!(s.attempts_in_flight, 2);
        // ARP gives up on the old neighbour some 40 s later: the first fails.
        failed(&mut t, 1, ms(1_000), ms(40_000));
        t.tick(ms(40_100));
        let s = &t.stops()[0];
        assert!(!s.settled && s.attempts_in_flight == 1);
        assert_eq!(s.loss.unreachable, 1);
        failed(&mut t, 3, ms(10_500), ms(44_000));
        failed(&mut t, 2, ms(6_000), ms(45_000));
        let losses = t
            .take_emitted()
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    Emitted::Loss {
                        kind: LossKind::Unreachable,
                        ..
                    }
                )
            })
            .count();
        assert_eq!(losses, 2, "counted for the metrics as they came");
        t.tick(ms(45_100));
        let s = &t.stops()[0];
        assert!(s.settled && s.complete);
        assert_eq!((s.loss.unreachable, s.attempts_in_flight), (2, 0));
        // At the SYN of its last attempt, not when the kernel gave up.
        assert_eq!(s.routing_lag_seconds(), Some(6.0));
        let settled: Vec<_> = t
            .take_emitted()
            .into_iter()
            .filter_map(|e| match e {
                Emitted::Settled { stop } => Some(stop),
                _ => None,
            })
            .collect();
        assert_eq!(settled.len(), 1);
        assert_eq!(settled[0].loss.unreachable, 2);
    }

    #[test]
    fn an_attempt_whose_outcome_never_comes_holds_the_stop_only_until_the_kernel_gave_up() {
        // 2 retries: the kernel gives up within 7 s; the stop waits 10.5 s from the SYN.
        let syn = SynRetries {
            retries: 2,
            ..SynRetries::default()
        };
        let mut t = stopped(syn);
        began(&mut t, 1, ms(5_000));
        began(&mut t, 2, ms(5_100));
        failed(&mut t, 2, ms(5_100), ms(12_000));
        t.tick(ms(15_000));
        assert!(!t.stops()[0].settled);
        assert_eq!(t.attempts_in_flight(), (1, 0));
        t.tick(ms(15_500));
        let s = &t.stops()[0];
        assert!(s.settled, "given up on at 5 + 10.5 s");
        assert_eq!((s.attempts_in_flight, s.attempts_unresolved), (0, 1));
        assert!(!s.complete, "an attempt's outcome is unknown");
        assert_eq!(s.loss.unreachable, 1);
        assert_eq!(t.attempts_in_flight(), (0, 0));
    }

    #[test]
    fn attempts_to_a_running_container_or_after_settling_change_no_record() {
        let mut t = stopped(SynRetries::default());
        t.tick(ms(10_030));
        assert!(t.stops()[0].settled);
        began(&mut t, 1, ms(10_040));
        failed(&mut t, 1, ms(10_040), ms(13_000));
        let s = &t.stops()[0];
        assert_eq!((s.attempts_in_flight, s.loss.unreachable), (0, 0));
        assert_eq!(t.attempts_in_flight(), (0, 0));
    }

    #[test]
    fn the_give_up_time_follows_the_kernels_retries_with_the_timer_wheels_margin() {
        let syn = |retries| SynRetries {
            retries,
            ..SynRetries::default()
        };
        // 1 + 2 + 4 = 7 s, and half again.
        assert_eq!(syn(2).give_up(), 10_500 * 1_000_000);
        // The default: 127 s, and half again.
        assert_eq!(SynRetries::default().give_up(), 190_500 * 1_000_000);
        // Waits stop doubling at the longest RTO.
        let capped = SynRetries {
            retries: 8,
            rto_max: 60 * SECOND,
        };
        // 1+2+4+8+16+32+60+60+60 = 243 s.
        assert_eq!(capped.give_up(), 243 * SECOND + 243 * SECOND / 2);
    }

    #[test]
    fn the_retries_are_read_from_the_kernels_files_and_what_is_unreadable_is_said() {
        let dir = std::env::temp_dir().join(format!("dw-syn-{}", std::process::id()));
        let ipv4 = dir.join("sys/net/ipv4");
        std::fs::create_dir_all(&ipv4).expect("dir");
        std::fs::write(ipv4.join("tcp_syn_retries"), "3\n").expect("write");
        std::fs::write(ipv4.join("tcp_rto_max_ms"), "60000\n").expect("write");
        let (s, unread) = SynRetries::from_proc(&dir);
        assert_eq!(
            s,
            SynRetries {
                retries: 3,
                rto_max: 60 * SECOND
            }
        );
        assert!(unread.is_empty());
        std::fs::remove_dir_all(&dir).expect("cleanup");
        let (s, unread) = SynRetries::from_proc(&dir);
        assert_eq!(s, SynRetries::default());
        assert_eq!(unread, ["tcp_syn_retries"]);
    }
}
