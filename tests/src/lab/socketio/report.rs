//! The ground truth of a run as text: the timeline from the stop command, the clients, the
//! refusals by namespace, the replacement's load and counters, the fleet's own load.

use super::{AuthWork, SioRun, Transports, truth::sorted};
use crate::lab::{clock, storm::quantile};

fn s(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.3}s"))
}

fn q(v: &[f64]) -> String {
    format!(
        "p50 {} p95 {} max {} (n {})",
        s(quantile(v, 0.5)),
        s(quantile(v, 0.95)),
        s(v.last().copied()),
        v.len()
    )
}

impl SioRun {
    /// The shape of the run in one line.
    pub fn shape(&self) -> String {
        let sp = &self.spec;
        let auth = match sp.auth {
            AuthWork::Io { pool, query } => {
                format!("I/O-bound auth ({pool} × {} ms)", query.as_millis())
            }
            AuthWork::Cpu { iterations } => format!("CPU-bound auth (PBKDF2 × {iterations})"),
        };
        let transports = match sp.transports {
            Transports::Websocket => "websocket-only",
            Transports::Default => "default transports",
        };
        let pinned = sp.fleet_cpu.map_or(String::new(), |c| {
            format!(", the fleet pinned to CPU {c}, the servers to the others")
        });
        format!(
            "{} clients, {transports}, {auth}, listens {} ms after it starts, {} (grace {} s){pinned}; socket.io {} / socket.io-client {}",
            sp.clients,
            sp.listen_delay.as_millis(),
            if sp.init {
                "dies on SIGTERM (--init)"
            } else {
                "PID 1: SIGKILL at the deadline"
            },
            sp.grace_secs,
            self.versions.0,
            self.versions.1
        )
    }

    pub fn report(&self) -> String {
        let rel = |ns: Option<u64>| ns.map_or("-".into(), |t| format!("{:+.3}s", self.rel(t)));
        let at = |i: std::time::Instant| format!("{:+.3}s", clock::secs_since(self.stop.issued, i));
        let clients = self.clients();
        let lost: Vec<u64> = clients
            .iter()
            .filter_map(|c| c.lost.as_ref().map(|l| l.0))
            .collect();
        let first = self.first_attempts();
        let mut out = format!("socket.io lab: {}\n", self.shape());
        out += &format!(
            "timeline (0 = podman stop): stop returned {} (old exit {}); sessions lost {} .. {}; \
             replacement run {} .. {}, its code {}, listening {}; first attempts {} .. {} (spread {:.3}s); \
             last client back {}\n",
            at(self.stop.returned),
            self.old_exit_code,
            rel(lost.iter().min().copied()),
            rel(lost.iter().max().copied()),
            at(self.new_launched.0),
            at(self.new_launched.1),
            rel(self.new.started),
            rel(self.new.listening),
            rel(first.first().copied()),
            rel(first.last().copied()),
            self.first_attempt_spread(),
            s(self.fleet_back_seconds()),
        );
        let mut reasons: Vec<String> = clients
            .iter()
            .filter_map(|c| c.lost.as_ref().map(|l| l.1.clone()))
            .collect();
        reasons.sort();
        reasons.dedup();
        out += &format!(
            "sessions: {} open on the old server at the stop (its log), {} lost and back (clients' logs; reasons {reasons:?})\n",
            self.sessions_open_at_stop(),
            self.sessions_cut_and_back(),
        );
        let (lo, hi) = self.new_rsts_at_listen();
        out += &format!(
            "failed attempts by errno: {:?}; refused by the old namespace {}, by the replacement's {} \
             (its OutRsts by its listen: {:?}..{:?})\n",
            self.errors_by_code(),
            self.refused_by_old(),
            self.refused_by_new(),
            lo,
            hi
        );
        out += &format!(
            "client wait (first attempt -> connected): {}; session lost -> connected again: {}\n",
            q(&self.waits()),
            q(&self.returns_after_loss())
        );
        let arrivals = self.first_arrivals();
        out += &format!(
            "first connections at the replacement: {} .. {} (spread {}, n {}), peak {:.0}/s per 100 ms\n",
            rel(arrivals.first().copied()),
            rel(arrivals.last().copied()),
            s(arrivals
                .first()
                .zip(arrivals.last())
                .map(|(a, b)| (b - a) as f64 / 1e9)),
            arrivals.len(),
            self.peak_first_arrivals_per_second()
        );
        out += &format!(
            "accept wait (server accept - client connected): sessions' first connections {}; all connections {}\n",
            q(&self.accept_waits(true)),
            q(&self.accept_waits(false))
        );
        let auth_times = sorted(
            (self.new.auths.iter())
                .filter_map(|a| Some((a.end? - a.start) as f64 / 1e9))
                .collect(),
        );
        let (_, sat) = self.saturated();
        out += &format!(
            "replacement: {} authorisations (start -> end {}), saturated {:.3}s, served {} /s -> window needed {}; \
             event loop busy {:.0}% over the storm\n",
            self.new.auths.len(),
            q(&auth_times),
            sat as f64 / 1e9,
            self.served_rate().map_or("-".into(), |r| format!("{r:.1}")),
            s(self.needed_window()),
            self.server_busy_share() * 100.0
        );
        let end = self.new_counters_end();
        let old = self.old_counters_growth();
        out += &format!(
            "namespaces (nstat): replacement OutRsts {} PassiveOpens {} ListenOverflows {} ListenDrops {}; \
             old during its stop: OutRsts +{} PassiveOpens +{} ListenOverflows +{}\n",
            end.out_rsts,
            end.passive_opens,
            end.listen_overflows,
            end.listen_drops,
            old.out_rsts,
            old.passive_opens,
            old.listen_overflows
        );
        let rsts: Vec<String> = (self.new_rst_timeline().iter())
            .map(|(t, n)| format!("{n} at {:+.3}s", self.rel(*t)))
            .collect();
        out += &format!("replacement's RSTs as sampled: {}\n", rsts.join(", "));
        if let Some(l) = self.fleet.load {
            out += &format!(
                "fleet's own load over the storm: {:.2} CPUs ({} ms CPU in {:.0} ms), event loop busy {:.0}%, \
                 its delay p50 {:.1} ms p99 {:.1} ms max {:.1} ms (client timestamps are late by that much); \
                 the machine {} idle meanwhile\n",
                l.cpus(),
                l.cpu_us / 1000,
                l.elapsed_ms,
                l.elu_active_ms / l.elapsed_ms.max(1e-9) * 100.0,
                l.lag_p50_ms,
                l.lag_p99_ms,
                l.lag_max_ms,
                self.machine_idle
                    .map_or("-".into(), |i| format!("{:.0}%", i * 100.0))
            );
        }
        out
    }
}
