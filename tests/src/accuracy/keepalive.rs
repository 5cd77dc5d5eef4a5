//! The keep-alive lab (`lab::keepalive`) over randomized shapes: each seed draws the client
//! kind (reuse without a check, or Node's `http.Agent` pool that drops an idle connection on
//! the server's FIN), the server kind (idle connections closed at SIGTERM, `Connection: close`
//! for 1 s first, or never closed and SIGKILLed at a grace of 2–4 s), the number of clients
//! (5–30), their pause between requests (0 to 50–400 ms), the work per request and how long
//! the traffic runs before the stop. Truth: each client's own per-request result (errno,
//! reused or new connection), the server's request log and the namespace's `TCPAbortOnClose`
//! and `TcpOutRsts`.

use std::{fmt, time::Duration};

use super::Check;
use crate::lab::keepalive::{ClientKind, KaRun, KaSpec, ServerKind};

/// One randomized keep-alive stop.
#[derive(Clone, Debug)]
pub struct KaShape {
    pub seed: u64,
    pub spec: KaSpec,
}

impl KaShape {
    pub fn from_seed(seed: u64) -> KaShape {
        let mut rng = fastrand::Rng::with_seed(seed);
        let client = if rng.bool() {
            ClientKind::Plain
        } else {
            ClientKind::Pool
        };
        let server = [ServerKind::Race, ServerKind::Safe, ServerKind::NeverCloses][rng.usize(..3)];
        let mut spec = KaSpec::new(client, server);
        spec.clients = rng.usize(5..=30);
        // The safe server's 1 s of `Connection: close` reaches every client that asks within
        // it: pause + work stay under 0.6 s.
        spec.gap_ms = (0, rng.u64(50..=400));
        spec.work_ms = (20, rng.u64(20..=200));
        spec.traffic = Duration::from_millis(rng.u64(1500..=3000));
        if server == ServerKind::NeverCloses {
            spec.grace_secs = rng.u32(2..=4);
        }
        spec.seed = seed;
        KaShape { seed, spec }
    }
}

impl fmt::Display for KaShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.spec;
        write!(
            f,
            "keepalive seed {}: {} {} clients, a request of {}–{} ms every {}–{} ms, {} server, \
             stop after {:?}, grace {} s",
            self.seed,
            s.clients,
            s.client.as_str(),
            s.work_ms.0,
            s.work_ms.1,
            s.gap_ms.0,
            s.gap_ms.1,
            s.server.as_str(),
            s.traffic,
            s.grace_secs
        )
    }
}

/// Every field the truth knows, for one run.
pub fn checks(r: &KaRun) -> Vec<Check> {
    let mut checks = vec![
        Check::eq(
            "outcome",
            r.outcome(),
            r.record["outcome"].as_str().unwrap_or("-"),
        ),
        match r.sent_after_close_range() {
            Some(range) => Check::count(
                "sent_after_close (lost on reuse, unseen by the server, less the unread)",
                range,
                r.loss("sent_after_close"),
            ),
            None => Check::eq(
                "sent_after_close (lost on reuse, unseen by the server, less the unread)",
                format!("unread {} > lost {}", r.unread, r.lost_on_reuse()),
                r.loss("sent_after_close"),
            ),
        },
        Check::count(
            "inflight_cut (failed, read by the server or unread at its close)",
            r.inflight_cut_range(),
            r.loss("inflight_cut"),
        ),
        Check::eq(
            "sent_after_close + inflight_cut (the clients' failed on reuse, less the refused)",
            r.cut_in_server() + r.sent_after_close().unwrap_or(0) + r.unread,
            r.loss("sent_after_close") + r.loss("inflight_cut"),
        ),
        Check::eq(
            "refused (the clients' ECONNREFUSED)",
            r.refused(),
            r.loss("refused"),
        ),
        Check::eq("resets_sent (TcpOutRsts)", r.out_rsts, r.record_rsts()),
        Check::eq(
            "drainwatch_connection_resets_total sent (TcpOutRsts)",
            r.out_rsts as f64,
            r.rsts_metric,
        ),
        Check::eq(
            "the clients' lost requests on new connections, not refused",
            0,
            r.lost_on_new(),
        ),
    ];
    // The count the verdict must name: drainwatch's when the truth allows it.
    let n = match r.sent_after_close_range() {
        Some((lo, hi)) if (lo..=hi).contains(&r.loss("sent_after_close")) => {
            r.loss("sent_after_close")
        }
        range => range.map_or(0, |(_, hi)| hi),
    };
    let named = if n == 1 {
        "1 request reached keep-alive connections it had already closed".to_string()
    } else {
        format!("{n} requests reached keep-alive connections it had already closed")
    };
    let verdict = r.verdict();
    checks.push(Check::eq(
        "the verdict names the requests sent to closed connections (only if any)",
        n > 0,
        if n > 0 {
            verdict.contains(&named)
        } else {
            verdict.contains("already closed")
        },
    ));
    if r.spec.server == ServerKind::Safe {
        // No false finding: every client was told to close first.
        checks.push(Check::eq(
            "safe server: the clients' failed requests",
            0,
            r.failed().count(),
        ));
        checks.push(Check::eq(
            "safe server: the verdict",
            "nothing lost",
            if verdict.contains("nothing lost") {
                "nothing lost"
            } else {
                verdict
            },
        ));
    }
    checks
}

/// Runs `shape` with a fresh agent and compares.
pub fn run(shape: &KaShape) -> Vec<Check> {
    let agent = super::start_agent();
    let r = KaRun::run(&agent, &shape.spec);
    println!("{}\n{}", r.report(), r.failures());
    checks(&r)
}
