//! The ground truth of a storm as text, for a failing test's message: the timeline from the
//! stop command, the clients, the listener, the wait distributions.

use std::time::{Duration, Instant};

use super::{StormRun, quantile};
use crate::lab::clock::secs_since;

impl StormRun {
    /// The ground truth as text: timeline (seconds from the stop command), distributions.
    pub fn report(&self) -> String {
        let base = self.stop.issued;
        let t = |i: Instant| format!("{:+.3}s", secs_since(base, i));
        let opt = |i: Option<Instant>| i.map_or("-".to_string(), t);
        let q = |v: &[f64]| {
            format!(
                "p50 {} p95 {} max {} (n {})",
                fmt_s(quantile(v, 0.5)),
                fmt_s(quantile(v, 0.95)),
                fmt_s(v.last().copied()),
                v.len()
            )
        };
        let mut s = String::new();
        s += &format!(
            "storm lab: {} clients, jitter {:.3}..{:.3}s, {:?}, {} workers x {:?} = {:.0} connects/s, backlog {}, workload {}, target {}\n",
            self.spec.clients,
            self.spec.jitter.0.as_secs_f64(),
            self.spec.jitter.1.as_secs_f64(),
            self.spec.replace,
            self.spec.workers,
            self.spec.auth,
            self.spec.capacity(),
            self.spec.backlog,
            self.spec.workload,
            self.target_container
        );
        let lost: Vec<Instant> = self
            .attempts
            .iter()
            .filter(|a| a.seq == 0)
            .filter_map(|a| a.lost)
            .collect();
        let re = self.reconnects();
        let arrivals = self.arrivals();
        let late = re
            .iter()
            .map(|a| a.start.saturating_duration_since(a.scheduled))
            .max()
            .unwrap_or_default();
        s += &format!(
            "timeline (0 = stop command): returned {}; connections lost {} .. {}; reconnects scheduled {} .. {} (start lateness max {:.1} ms); arrivals {} .. {} (95% after {}); greeted last {}\n",
            t(self.stop.returned),
            opt(lost.iter().min().copied()),
            opt(lost.iter().max().copied()),
            opt(re.iter().map(|a| a.scheduled).min()),
            opt(re.iter().map(|a| a.scheduled).max()),
            late.as_secs_f64() * 1e3,
            opt(arrivals.first().and_then(|a| a.handshake_by())),
            opt(arrivals.last().and_then(|a| a.handshake_by())),
            fmt_s(self.seconds_to_95()),
            opt(re.iter().filter_map(|a| a.greeted).max()),
        );
        let (max_q, max_at) = self.max_queue();
        s += &format!(
            "clients: {} back, {} reconnects refused, {} reset before the greeting, {} with SYN retransmissions; old exit code {:?}\n",
            self.clients_back(),
            self.refused(),
            self.reset_before_greeting(),
            self.syn_retransmitted(),
            self.old_exit_code
        );
        s += &format!(
            "listener: accept queue max {max_q} at {} ({} samples); ListenOverflows +{}; server accept rate {:.1}/s\n",
            opt(max_at),
            self.queue.len(),
            self.listen_overflows,
            self.server_accept_rate().unwrap_or(0.0)
        );
        s += &format!(
            "client wait (greeted - connected - auth): {}\n",
            q(&self.client_waits())
        );
        s += &format!(
            "connect latency (start - greeted):        {}\n",
            q(&self.connect_latencies())
        );
        s += &format!(
            "handshake (start - connected):            {}\n",
            q(&self.handshakes())
        );
        s += &format!(
            "server wait (python accept - connected):  {}\n",
            q(&self.server_waits())
        );
        // Queue depth and arrivals per 500 ms after the first arrival.
        if let Some(first) = arrivals.first().and_then(|a| a.handshake_by()) {
            s += "per 500 ms from the first arrival (arrivals/queue max):";
            let mut k = 0;
            loop {
                let (lo, hi) = (
                    first + Duration::from_millis(500 * k),
                    first + Duration::from_millis(500 * (k + 1)),
                );
                let n = arrivals
                    .iter()
                    .filter(|a| a.handshake_by().is_some_and(|c| c >= lo && c < hi))
                    .count();
                let qmax = self
                    .queue
                    .iter()
                    .filter(|(at, _)| *at >= lo && *at < hi)
                    .map(|(_, d)| *d)
                    .max();
                if n == 0
                    && qmax.unwrap_or(0) == 0
                    && hi
                        > arrivals
                            .last()
                            .and_then(|a| a.handshake_by())
                            .unwrap_or(first)
                {
                    break;
                }
                s += &format!(" {n}/{}", qmax.map_or("-".into(), |d| d.to_string()));
                k += 1;
            }
            s += "\n";
        }
        for a in re.iter().filter(|a| a.syn_retrans > 0).take(5) {
            s += &format!(
                "  SYN retransmitted x{}: client {} attempt {} start {} connected {} greeted {}\n",
                a.syn_retrans,
                a.client,
                a.seq,
                t(a.start),
                opt(a.connected),
                opt(a.greeted)
            );
        }
        let errors: Vec<String> = re.iter().filter_map(|a| a.error.clone()).take(5).collect();
        if !errors.is_empty() {
            s += &format!("first errors: {errors:?}\n");
        }
        s
    }
}

fn fmt_s(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.3}s"))
}
