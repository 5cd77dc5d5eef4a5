//! The ground truth of a run as figures, from the clients', the servers' and the namespaces'
//! own records only: sessions lost and back, the first attempts' spread, each client's wait,
//! refusals by the namespace that sent them, arrivals, accept waits, the server's served rate.

use std::collections::HashMap;

use super::{ClientEvent, Counters, SioRun, Tcp};
use crate::lab::{clock, storm::quantile};

/// One client's reconnection, from its own log.
#[derive(Clone, Debug, Default)]
pub struct ClientTruth {
    pub client: usize,
    pub first_connect: Option<u64>,
    /// Its first lost session, and the reason the library gave.
    pub lost: Option<(u64, String)>,
    /// Reconnect attempts started after the loss.
    pub attempts: Vec<u64>,
    /// Failed attempts: when, and the errno.
    pub errors: Vec<(u64, String)>,
    /// Connected again (the middleware passed) after the loss.
    pub back: Option<u64>,
    /// Its engine's first upgrade (default transports: to websocket) before the loss.
    pub upgraded: Option<u64>,
    /// The server's last ping before the loss (each answered with a pong at once).
    pub last_ping: Option<u64>,
}

impl ClientTruth {
    fn of(client: usize, events: &[ClientEvent]) -> ClientTruth {
        let mut t = ClientTruth {
            client,
            ..ClientTruth::default()
        };
        for e in events {
            match e {
                ClientEvent::Connect { at, .. } if t.first_connect.is_none() => {
                    t.first_connect = Some(*at)
                }
                ClientEvent::Connect { at, .. } if t.lost.is_some() && t.back.is_none() => {
                    t.back = Some(*at)
                }
                ClientEvent::Disconnect { at, reason } if t.lost.is_none() => {
                    t.lost = Some((*at, reason.clone()))
                }
                ClientEvent::Attempt { at, .. } if t.lost.is_some() && t.back.is_none() => {
                    t.attempts.push(*at)
                }
                ClientEvent::Error { at, code } if t.lost.is_some() && t.back.is_none() => {
                    t.errors.push((*at, code.clone()))
                }
                ClientEvent::Upgrade { at, .. } if t.lost.is_none() && t.upgraded.is_none() => {
                    t.upgraded = Some(*at)
                }
                ClientEvent::Ping { at } if t.lost.is_none() => t.last_ping = Some(*at),
                _ => {}
            }
        }
        t
    }

    /// First attempt after the loss to connected again (seconds).
    pub fn wait(&self) -> Option<f64> {
        Some((self.back? - *self.attempts.first()?) as f64 / 1e9)
    }
}

pub(super) fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// Merged `[from, to]` intervals, and their total length (ns).
fn union(mut iv: Vec<(u64, u64)>) -> (Vec<(u64, u64)>, u64) {
    iv.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (a, b) in iv {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    let total = out.iter().map(|(a, b)| b - a).sum();
    (out, total)
}

/// SYN retransmissions leave at these offsets from `connect()` (seconds): 1 s initial RTO, doubling.
const SYN_RETRANSMITS: [u64; 5] = [0, 1, 3, 7, 15];

/// When a client's handshake completed: its SYN goes out at `connect()` (`start`), and a SYN
/// nobody answered (the replacement's address not up yet) is sent again 1, 3, 7, 15 s after;
/// the SYN-ACK answers the last one sent before the client saw it (`connected`), at once (the
/// server's kernel answers, on the same bridge). `connected` itself is late by the fleet's
/// event-loop delay (tens of ms), `start` is not.
pub fn handshake(start: u64, connected: u64) -> u64 {
    SYN_RETRANSMITS
        .iter()
        .map(|o| start + o * 1_000_000_000)
        .filter(|t| *t <= connected)
        .max()
        .unwrap_or(start)
}

/// The event loop at or above this share of a 50 ms tick counts as saturated.
const BUSY: f64 = 0.9;

impl SioRun {
    /// `podman stop` issued, in CLOCK_MONOTONIC ns: time 0 of the reports.
    pub fn t0(&self) -> u64 {
        clock::mono_ns_of(self.stop.issued)
    }

    /// Seconds from the stop command.
    pub fn rel(&self, ns: u64) -> f64 {
        (ns as f64 - self.t0() as f64) / 1e9
    }

    pub fn clients(&self) -> Vec<ClientTruth> {
        (self.fleet.clients.iter().enumerate())
            .map(|(i, ev)| ClientTruth::of(i, ev))
            .collect()
    }

    /// Clients whose session the stop cut and who reconnected: the sessions lost.
    pub fn sessions_cut_and_back(&self) -> usize {
        (self.clients().iter())
            .filter(|c| c.lost.is_some() && c.back.is_some())
            .count()
    }

    /// The frame each session's client sent last before the stop, which the server never
    /// answers by design, as (the upgrade packet `5`, a pong): a pong when the server's ping
    /// came after the upgrade (or, websocket-only, at all), else the upgrade packet (default
    /// transports), else none (websocket-only, no ping: the server spoke last). Of the
    /// clients that lost their session, from their own logs.
    pub fn unanswered_last_frames(&self) -> (usize, usize) {
        let default = self.spec.transports == super::Transports::Default;
        let lost: Vec<ClientTruth> = (self.clients().into_iter())
            .filter(|c| c.lost.is_some())
            .collect();
        let pong = |c: &ClientTruth| match (c.last_ping, c.upgraded) {
            (Some(p), Some(u)) => p > u,
            (Some(_), None) => !default,
            (None, _) => false,
        };
        let pongs = lost.iter().filter(|c| pong(c)).count();
        let upgrades = (lost.iter())
            .filter(|c| default && c.upgraded.is_some() && !pong(c))
            .count();
        (upgrades, pongs)
    }

    /// How the clients' sessions ended, by the reason their library gave (`transport close`:
    /// the connection closed under an open session; `transport error`: a request failed).
    pub fn loss_reasons(&self) -> std::collections::BTreeMap<String, usize> {
        let mut m = std::collections::BTreeMap::new();
        for c in self.clients() {
            if let Some((_, r)) = c.lost {
                *m.entry(r).or_insert(0) += 1;
            }
        }
        m
    }

    /// Sessions open on the old server when it was stopped, by its own log.
    pub fn sessions_open_at_stop(&self) -> usize {
        let t0 = self.t0();
        let opened = self.old.connects.iter().filter(|c| c.0 < t0).count();
        let closed = self.old.disconnects.iter().filter(|d| d.0 < t0).count();
        opened - closed.min(opened)
    }

    /// Each client's first attempt after its loss, sorted (ns).
    pub fn first_attempts(&self) -> Vec<u64> {
        let mut v: Vec<u64> = (self.clients().iter())
            .filter_map(|c| c.attempts.first().copied())
            .collect();
        v.sort_unstable();
        v
    }

    /// First to last first attempt (seconds).
    pub fn first_attempt_spread(&self) -> f64 {
        let a = self.first_attempts();
        match (a.first(), a.last()) {
            (Some(f), Some(l)) => (l - f) as f64 / 1e9,
            _ => 0.0,
        }
    }

    /// Each client's wait from its first attempt to connected, sorted (seconds).
    pub fn waits(&self) -> Vec<f64> {
        sorted(
            self.clients()
                .iter()
                .filter_map(ClientTruth::wait)
                .collect(),
        )
    }

    /// Each client's session lost to connected again, sorted (seconds): how long after its
    /// close a return must still be matched to it.
    pub fn returns_after_loss(&self) -> Vec<f64> {
        sorted(
            (self.clients().iter())
                .filter_map(|c| Some((c.back? - c.lost.as_ref()?.0) as f64 / 1e9))
                .collect(),
        )
    }

    /// The stop command to the last client connected again (seconds).
    pub fn fleet_back_seconds(&self) -> Option<f64> {
        let last = self.clients().iter().filter_map(|c| c.back).max()?;
        Some(self.rel(last))
    }

    /// Failed reconnect attempts by errno.
    pub fn errors_by_code(&self) -> Vec<(String, usize)> {
        let mut m: HashMap<String, usize> = HashMap::new();
        for c in self.clients() {
            for (_, code) in c.errors {
                *m.entry(code).or_default() += 1;
            }
        }
        let mut v: Vec<_> = m.into_iter().collect();
        v.sort();
        v
    }

    /// Refused attempts (ECONNREFUSED), sorted (ns).
    pub fn refusals(&self) -> Vec<u64> {
        let mut v: Vec<u64> = (self.clients().into_iter())
            .flat_map(|c| c.errors)
            .filter(|(_, code)| code == "ECONNREFUSED")
            .map(|(at, _)| at)
            .collect();
        v.sort_unstable();
        v
    }

    /// Refusals the replacement's namespace sent: those after its `podman run` was issued.
    /// The two namespaces never had the address at once (podman released it with the old
    /// one), so every earlier refusal is the old namespace's.
    pub fn refused_by_new(&self) -> usize {
        let issued = clock::mono_ns_of(self.new_launched.0);
        self.refusals().iter().filter(|t| **t >= issued).count()
    }

    pub fn refused_by_old(&self) -> usize {
        self.refusals().len() - self.refused_by_new()
    }

    /// The new namespace's `OutRsts` by its first listen: (the last sample before, the first
    /// after). A new namespace starts at 0, so before the listen these are refusals, or
    /// answers to stray segments of the old connections.
    pub fn new_rsts_at_listen(&self) -> (Option<u64>, Option<u64>) {
        let Some(listen) = self.new.listening else {
            return (None, None);
        };
        let before = (self.new_counters.iter())
            .rev()
            .find(|(t, _)| *t <= listen)
            .map(|(_, c)| c.out_rsts);
        let after = (self.new_counters.iter())
            .find(|(t, _)| *t >= listen)
            .map(|(_, c)| c.out_rsts);
        (before, after)
    }

    /// When the replacement's namespace sent its RSTs: (the first sample that saw them, how
    /// many), growth within 100 ms merged.
    pub fn new_rst_timeline(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        let mut last = 0;
        for (at, c) in &self.new_counters {
            let d = c.out_rsts - last.min(c.out_rsts);
            last = c.out_rsts;
            if d == 0 {
                continue;
            }
            match out.last_mut() {
                Some((t, n)) if at - *t < 100_000_000 => *n += d,
                _ => out.push((*at, d)),
            }
        }
        out
    }

    /// The new namespace's counters once the fleet was back (from 0: a new namespace).
    pub fn new_counters_end(&self) -> Counters {
        self.new_counters.last().map(|s| s.1).unwrap_or_default()
    }

    /// What the old namespace's counters grew by from just before the stop to its last
    /// process's exit (after which nothing could read them).
    pub fn old_counters_growth(&self) -> Counters {
        match (self.old_counters.first(), self.old_counters.last()) {
            (Some((_, a)), Some((_, b))) => Counters {
                out_rsts: b.out_rsts - a.out_rsts,
                passive_opens: b.passive_opens - a.passive_opens,
                listen_overflows: b.listen_overflows - a.listen_overflows,
                listen_drops: b.listen_drops - a.listen_drops,
            },
            _ => Counters::default(),
        }
    }

    /// The clients' TCP connections to the replacement (connected after the stop), by port:
    /// (`connect()` called, the handshake's completion as [`handshake`] estimates it).
    fn new_tcp_by_port(&self) -> HashMap<u16, Vec<(u64, u64)>> {
        let t0 = self.t0();
        let mut m: HashMap<u16, Vec<(u64, u64)>> = HashMap::new();
        for Tcp {
            start, connected, ..
        } in &self.fleet.tcp
        {
            if let Some((at, port)) = connected
                && *at >= t0
            {
                m.entry(*port)
                    .or_default()
                    .push((*start, handshake(*start, *at)));
            }
        }
        m
    }

    /// The handshake of the connection from `port` that the server accepted or authorised at
    /// `at`: the latest one started before it (ports are reused).
    fn handshake_before(
        by_port: &HashMap<u16, Vec<(u64, u64)>>,
        port: u16,
        at: u64,
    ) -> Option<u64> {
        let (_, hs) = by_port.get(&port)?.iter().filter(|(s, _)| *s <= at).max()?;
        Some(*hs)
    }

    /// Each client's first connection to the replacement: the one that opened its session
    /// (the websocket, or the polling handshake), at its handshake; sorted (ns). The arrivals
    /// the clients' demand is made of.
    pub fn first_arrivals(&self) -> Vec<u64> {
        let by_port = self.new_tcp_by_port();
        let mut v: Vec<u64> = (self.new.auths.iter())
            .filter_map(|a| Self::handshake_before(&by_port, a.port, a.start))
            .collect();
        v.sort_unstable();
        v
    }

    /// The most first arrivals in 100 ms (from the first), per second.
    /// The most handshakes the replacement's namespace completed within any 100 ms, from its
    /// `PassiveOpens` samples (each window from a sample to the last one at least 100 ms
    /// before it, 100 to 110 ms long).
    pub fn busiest_100ms_passive_opens(&self) -> u64 {
        let s = &self.new_counters;
        let mut best = 0;
        let mut j = 0;
        for (at, c) in s {
            while j + 1 < s.len() && s[j + 1].0 + 100_000_000 <= *at {
                j += 1;
            }
            // Windows stretched past 110 ms by a late sample are left out.
            if let Some((from, b)) = s.get(j)
                && from + 100_000_000 <= *at
                && *at <= from + 110_000_000
            {
                best = best.max(c.passive_opens - b.passive_opens);
            }
        }
        best
    }

    pub fn peak_first_arrivals_per_second(&self) -> f64 {
        let a = self.first_arrivals();
        let Some(first) = a.first() else { return 0.0 };
        let mut buckets: HashMap<u64, u32> = HashMap::new();
        for t in &a {
            *buckets.entry((t - first) / 100_000_000).or_default() += 1;
        }
        f64::from(buckets.values().copied().max().unwrap_or(0)) * 10.0
    }

    /// `accept()` (the server's log) minus the handshake (the client's, see [`handshake`]),
    /// sorted (seconds): the kernel's accept wait of each connection to the replacement, its
    /// sessions' first connections only (`sessions`) or all of them.
    pub fn accept_waits(&self, sessions: bool) -> Vec<f64> {
        let by_port = self.new_tcp_by_port();
        let accepts: HashMap<u16, Vec<u64>> =
            self.new
                .accepts
                .iter()
                .fold(HashMap::new(), |mut m, (at, port)| {
                    m.entry(*port).or_default().push(*at);
                    m
                });
        let pairs: Vec<(u16, u64)> = if sessions {
            (self.new.auths.iter())
                .filter_map(|a| {
                    let acc = accepts
                        .get(&a.port)?
                        .iter()
                        .filter(|t| **t <= a.start)
                        .max()?;
                    Some((a.port, *acc))
                })
                .collect()
        } else {
            self.new.accepts.iter().map(|(at, p)| (*p, *at)).collect()
        };
        sorted(
            pairs
                .into_iter()
                .filter_map(|(port, acc)| {
                    let hs = Self::handshake_before(&by_port, port, acc)?;
                    Some(acc.saturating_sub(hs) as f64 / 1e9)
                })
                .collect(),
        )
    }

    /// When the replacement was saturated: its pool had waiters (an authorisation waited for
    /// a connection for over 1 ms), or its event loop was busy ≥ 90% of a 50 ms tick.
    /// Merged intervals and their total (ns).
    pub fn saturated(&self) -> (Vec<(u64, u64)>, u64) {
        let mut iv: Vec<(u64, u64)> = (self.new.auths.iter())
            .filter_map(|a| Some((a.start, a.run?)))
            .filter(|(s, r)| r - s > 1_000_000)
            .collect();
        iv.extend(
            (self.new.ticks.iter())
                .filter(|t| t.active_ns as f64 >= BUSY * t.elapsed_ns as f64)
                .map(|t| (t.at - t.elapsed_ns.min(t.at), t.at)),
        );
        union(iv)
    }

    /// Authorisations the replacement completed per second while saturated: what its connect
    /// path serves. None when it never was (for 100 ms at least): it kept up.
    pub fn served_rate(&self) -> Option<f64> {
        let (iv, total) = self.saturated();
        if total < 100_000_000 {
            return None;
        }
        let done = (self.new.auths.iter())
            .filter_map(|a| a.end)
            .filter(|e| iv.iter().any(|(a, b)| e > a && e <= b))
            .count();
        Some(done as f64 / (total as f64 / 1e9))
    }

    /// The reconnect window the clients needed: clients ÷ served rate (seconds).
    pub fn needed_window(&self) -> Option<f64> {
        Some(self.sessions_cut_and_back() as f64 / self.served_rate()?)
    }

    /// The replacement's event loop over the storm: busy share from the stop to the last
    /// client back.
    pub fn server_busy_share(&self) -> f64 {
        let (from, to) = (
            self.t0(),
            self.t0() + (self.fleet_back_seconds().unwrap_or(0.0) * 1e9) as u64,
        );
        let ticks: Vec<_> = (self.new.ticks.iter())
            .filter(|t| t.at > from && t.at <= to + 50_000_000)
            .collect();
        let active: u64 = ticks.iter().map(|t| t.active_ns).sum();
        let elapsed: u64 = ticks.iter().map(|t| t.elapsed_ns).sum();
        active as f64 / elapsed.max(1) as f64
    }

    /// Quantile `q` of the clients' waits.
    pub fn wait_quantile(&self, q: f64) -> Option<f64> {
        quantile(&self.waits(), q)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handshake_answers_the_last_syn_sent() {
        let ms = 1_000_000;
        assert_eq!(handshake(1000 * ms, 1050 * ms), 1000 * ms);
        assert_eq!(handshake(1000 * ms, 2040 * ms), 2000 * ms);
        assert_eq!(handshake(1000 * ms, 4100 * ms), 4000 * ms);
        assert_eq!(handshake(1000 * ms, 999 * ms), 1000 * ms);
    }

    #[test]
    fn intervals_merge_and_sum() {
        let (iv, total) = union(vec![(10, 20), (15, 30), (40, 50), (5, 8)]);
        assert_eq!(iv, vec![(5, 8), (10, 30), (40, 50)]);
        assert_eq!(total, 3 + 20 + 10);
    }

    #[test]
    fn a_clients_truth_starts_at_its_first_loss() {
        let ev = vec![
            ClientEvent::Connect {
                at: 10,
                transport: "websocket".into(),
            },
            ClientEvent::Disconnect {
                at: 20,
                reason: "transport_close".into(),
            },
            ClientEvent::Attempt {
                at: 1_000_000_030,
                n: 1,
            },
            ClientEvent::Error {
                at: 1_000_000_031,
                code: "ECONNREFUSED".into(),
            },
            ClientEvent::Attempt {
                at: 3_000_000_030,
                n: 2,
            },
            ClientEvent::Connect {
                at: 3_500_000_030,
                transport: "websocket".into(),
            },
        ];
        let t = ClientTruth::of(3, &ev);
        assert_eq!(t.first_connect, Some(10));
        assert_eq!(t.lost, Some((20, "transport_close".into())));
        assert_eq!(t.attempts.len(), 2);
        assert_eq!(t.errors.len(), 1);
        assert_eq!(t.back, Some(3_500_000_030));
        assert_eq!(t.wait(), Some(2.5));
    }
}
