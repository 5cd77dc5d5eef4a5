//! The ground truth of a storm as figures: reconnects and arrivals, the clients' and the
//! server's waits, how fast the listener caught up.

use std::time::Instant;

use super::{Attempt, StormRun};
use crate::lab::clock;

/// Nearest-rank quantile of sorted values (the agent's definition).
pub fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    let n = sorted.len();
    (n > 0).then(|| sorted[((q * n as f64).ceil() as usize).clamp(1, n) - 1])
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

impl StormRun {
    /// Attempts after the stop (the reconnects), in order of `start`.
    pub fn reconnects(&self) -> Vec<&Attempt> {
        let mut v: Vec<&Attempt> = self.attempts.iter().filter(|a| a.seq > 0).collect();
        v.sort_by_key(|a| a.start);
        v
    }

    /// Reconnects whose handshake completed: the arrivals the listener saw, in order of
    /// [`Attempt::handshake_by`].
    pub fn arrivals(&self) -> Vec<&Attempt> {
        let mut v: Vec<&Attempt> = self
            .reconnects()
            .into_iter()
            .filter(|a| a.handshake_by().is_some())
            .collect();
        v.sort_by_key(|a| a.handshake_by());
        v
    }

    /// Clients that came back and were greeted.
    pub fn clients_back(&self) -> usize {
        self.reconnects()
            .iter()
            .filter(|a| a.greeted.is_some())
            .count()
    }

    /// Reconnects whose `connect()` failed with `kind`.
    pub fn connects_failed(&self, kind: std::io::ErrorKind) -> usize {
        self.reconnects()
            .iter()
            .filter(|a| a.connect_failed.is_some_and(|(_, k)| k == kind))
            .count()
    }

    /// Reconnects refused: nothing listened.
    pub fn refused(&self) -> usize {
        self.connects_failed(std::io::ErrorKind::ConnectionRefused)
    }

    /// Reconnects whose handshake completed with a listener that then closed, resetting them
    /// before the greeting (before or just after `connect()` returned): arrivals no client
    /// counts as a connection.
    pub fn reset_before_greeting(&self) -> usize {
        self.reconnects()
            .iter()
            .filter(|a| a.reset_before_greeting())
            .count()
    }

    /// The client's measure of the accept wait, per greeted reconnect, sorted (seconds):
    /// `greeted - connected - auth` (see the module docs).
    pub fn client_waits(&self) -> Vec<f64> {
        let auth = self.spec.auth.as_secs_f64();
        sorted(
            self.reconnects()
                .iter()
                .filter_map(|a| Some((a.greeted? - a.connected?).as_secs_f64() - auth))
                .collect(),
        )
    }

    /// Connect latency as a client experiences it: `connect()` start to greeting (seconds).
    pub fn connect_latencies(&self) -> Vec<f64> {
        sorted(
            self.reconnects()
                .iter()
                .filter_map(|a| Some((a.greeted? - a.start).as_secs_f64()))
                .collect(),
        )
    }

    /// `connect()` start to `connect()` returned: the handshake (seconds).
    pub fn handshakes(&self) -> Vec<f64> {
        sorted(
            self.reconnects()
                .iter()
                .filter_map(|a| Some((a.connected? - a.start).as_secs_f64()))
                .collect(),
        )
    }

    /// The server's view of the wait: its python `accept()` returned (from the greeting) minus
    /// the client's `connect()` returned (seconds).
    pub fn server_waits(&self) -> Vec<f64> {
        sorted(
            self.reconnects()
                .iter()
                .filter_map(|a| {
                    let acc = a.server_accepted_ns? as f64 / 1e9;
                    Some(acc - clock::mono_ns_of(a.connected?) as f64 / 1e9)
                })
                .collect(),
        )
    }

    /// Connects per second the server sustained while it had a backlog: greetings' accept
    /// times, first to last.
    pub fn server_accept_rate(&self) -> Option<f64> {
        let mut acc: Vec<u64> = self
            .reconnects()
            .iter()
            .filter_map(|a| a.server_accepted_ns)
            .collect();
        acc.sort_unstable();
        let (first, last) = (*acc.first()?, *acc.last()?);
        (last > first).then(|| (acc.len() - 1) as f64 / ((last - first) as f64 / 1e9))
    }

    /// Reconnects whose handshake needed SYN retransmissions.
    pub fn syn_retransmitted(&self) -> usize {
        self.reconnects()
            .iter()
            .filter(|a| a.syn_retrans > 0)
            .count()
    }

    /// First arrival to the arrival that completes 95% (client-side), seconds.
    pub fn seconds_to_95(&self) -> Option<f64> {
        let a = self.arrivals();
        let i = ((a.len() as f64 * 0.95).ceil() as usize).clamp(1, a.len().max(1)) - 1;
        Some((a.get(i)?.handshake_by()? - a.first()?.handshake_by()?).as_secs_f64())
    }

    /// Bounds on the listener's first-arrival-to-95% time: each handshake completed between
    /// its `start` and `connected`, so the i-th completion lies between the i-th start and the
    /// i-th `connected` (sorted separately).
    pub fn seconds_to_95_bounds(&self) -> Option<(f64, f64)> {
        let a = self.arrivals();
        let mut starts: Vec<Instant> = a.iter().map(|a| a.start).collect();
        let mut conns: Vec<Instant> = a.iter().filter_map(|a| a.handshake_by()).collect();
        starts.sort_unstable();
        conns.sort_unstable();
        let i = ((a.len() as f64 * 0.95).ceil() as usize).clamp(1, a.len().max(1)) - 1;
        let lo = starts.get(i)?.saturating_duration_since(*conns.first()?);
        let hi = conns.get(i)?.saturating_duration_since(*starts.first()?);
        Some((lo.as_secs_f64(), hi.as_secs_f64()))
    }

    pub fn max_queue(&self) -> (u32, Option<Instant>) {
        self.queue
            .iter()
            .max_by_key(|(_, d)| *d)
            .map_or((0, None), |(t, d)| (*d, Some(*t)))
    }
}
