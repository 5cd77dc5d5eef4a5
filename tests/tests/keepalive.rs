//! A server that never closes its keep-alive connections (`backend.py --mode keep-alive`:
//! on SIGTERM it closes its listener and waits for every connection to end, as Node's
//! `server.close()` does without `closeIdleConnections`), with keep-alive clients that reuse
//! their connections without checking them first (like Python's `http.client`): 12 persistent
//! connections, a request of 20–200 ms every 0–300 ms. It serves on through the grace period
//! and is SIGKILLed at the deadline.
//!
//! Ground truth: the server's own request log (which requests started and never ended), each
//! client's own times (when it connected, when its request died), and the namespace's own
//! `Tcp: OutRsts`. Checked: the cut requests' ages are their own (tens of milliseconds), not
//! their connections' (seconds); the verdict says the server never closed its keep-alive
//! connections and does not say to raise the grace period; and every RST the namespace sent
//! during the stop is in the record's `resets_sent`, the time-wait sockets' answers to the
//! requests clients sent after the kill on connections the exit had closed included.
//!
//! Then a `Drain` server's race (Go's `Shutdown`: at SIGTERM the listener and every idle
//! connection close at once, 20 clients reusing theirs): `sent_after_close` equals the
//! requests the clients lost that the server never received (its log; the kernel's
//! `TCPAbortOnClose` for those its close reset unread); and the fix (`Connection: close` on
//! every response for 1 s first, which the clients honour) reads 0 with no request lost.

use std::{
    collections::HashMap,
    thread,
    time::{Duration, Instant},
};

use drainwatch_tests::{
    agent::{Agent, instant, metric_sum, stop_record, sync},
    lab::{
        container::{Backend, BackendOpts, Mode, http_get},
        keepalive::{ClientKind, KaRequest, KaRun, KaSpec, ServerKind, plain_client},
    },
    require_root, snmp_tcp, tcp_ext,
};
use serde_json::Value;

const CLIENTS: usize = 12;
const GRACE_SECS: u32 = 4;
/// A client's pause between requests and each request's work (ms).
const SHAPE: ((u64, u64), (u64, u64)) = ((0, 300), (20, 200));

fn sent_rsts(agent: &Agent, b: &Backend) -> f64 {
    metric_sum(
        &agent.metrics_text(),
        "drainwatch_connection_resets_total",
        &[("container", b.container.as_str()), ("direction", "sent")],
    )
}

#[test]
fn a_server_that_never_closes_keep_alive_connections_is_told_so_with_its_requests_ages() {
    require_root();
    let started = Instant::now();
    let b = Backend::start("ka", Mode::KeepAlive, BackendOpts::default());
    let agent = Agent::start(&[]);
    agent.wait_adopted(&b.container);
    // Two closed connections over a second apart: the agent learns the kernel's tick, which
    // request ages are read in.
    b.require_route();
    http_get(b.addr(), "/health", Duration::from_secs(2)).expect("health");
    let addr = b.addr();
    let warmup = Duration::from_secs(3);
    let until = Instant::now() + warmup + Duration::from_secs(u64::from(GRACE_SECS) + 2);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|n| thread::spawn(move || plain_client(addr, n, 43 + n as u64, SHAPE, until)))
        .collect();
    thread::sleep(Duration::from_millis(1500));
    http_get(b.addr(), "/health", Duration::from_secs(2)).expect("health");
    thread::sleep(warmup - Duration::from_millis(1500));

    // The namespace (kept by its holder) counts on after the server is gone.
    let ns_pid = b.netns_pid();
    sync(&agent);
    let (out_rsts_before, sent_before) = (snmp_tcp(ns_pid, "OutRsts"), sent_rsts(&agent, &b));
    let unread_before = tcp_ext(ns_pid, "TCPAbortOnClose");
    let stop = b.stop(GRACE_SECS);
    let sent: Vec<KaRequest> = clients
        .into_iter()
        .flat_map(|c| c.join().expect("client"))
        .collect();
    assert_eq!(b.exit_code(), 137, "SIGKILLed at the deadline");
    let record = stop_record(&agent, &b.id);
    let out_rsts = snmp_tcp(ns_pid, "OutRsts") - out_rsts_before;
    // Requests that reached the server's socket but not the server before the kill: the
    // kernel closed their connections with the request unread (and counted each), so the
    // server's log never saw them. Cut in flight all the same.
    let unread = tcp_ext(ns_pid, "TCPAbortOnClose") - unread_before;
    let metric = sent_rsts(&agent, &b) - sent_before;

    // The server's own log: requests it started and never ended were cut.
    let log = b.work_log();
    let ended: std::collections::HashSet<&str> = log
        .iter()
        .filter(|e| !e.started)
        .map(|e| e.id.as_str())
        .collect();
    let started_at: HashMap<&str, Instant> = log
        .iter()
        .filter(|e| e.started)
        .map(|e| (e.id.as_str(), e.at))
        .collect();
    let failed: Vec<&KaRequest> = sent.iter().filter(|s| !s.ok).collect();
    let cut: Vec<&KaRequest> = failed
        .iter()
        .copied()
        .filter(|s| started_at.contains_key(s.id.as_str()) && !ended.contains(s.id.as_str()))
        .collect();
    // Sent after the kill to a connection the exit had closed (or unread at it): the server
    // never saw them.
    let never_seen = failed
        .iter()
        .filter(|s| !started_at.contains_key(s.id.as_str()))
        .count()
        - unread as usize;
    // But a request the server read just before the kill and never logged is a cut: one sent
    // before any client saw the kill (its first failure) may be either, as many as are not
    // the unread. drainwatch's split must lie within that; the rest of the checks take it.
    let first_failure = failed.iter().map(|s| s.ended).min();
    let ambiguous = failed
        .iter()
        .filter(|s| !started_at.contains_key(s.id.as_str()))
        .filter(|s| first_failure.is_some_and(|f| s.sent < f))
        .count()
        .saturating_sub(unread as usize);
    let counted_after = record["loss"]["sent_after_close"]
        .as_u64()
        .unwrap_or(u64::MAX) as usize;
    assert!(
        (never_seen.saturating_sub(ambiguous)..=never_seen).contains(&counted_after),
        "sent_after_close {counted_after}: {never_seen} never seen, {ambiguous} of them maybe \
         read unlogged at the kill"
    );
    let read_unlogged = (never_seen - counted_after) as u64;
    let never_seen = counted_after;
    let mut truth_ages: Vec<f64> = cut
        .iter()
        .map(|s| (s.ended - started_at[s.id.as_str()]).as_secs_f64())
        .collect();
    truth_ages.sort_by(f64::total_cmp);
    let truth_conn = cut
        .iter()
        .filter_map(|s| Some((s.ended - s.connected?).as_secs_f64()))
        .fold(0.0, f64::max);
    let events: Vec<&Value> = record["loss_events"]
        .as_array()
        .expect("loss_events")
        .iter()
        .filter(|e| e["kind"] == "inflight_cut")
        .collect();
    let mut ages: Vec<f64> = events
        .iter()
        .filter_map(|e| e["request_seconds"].as_f64())
        .collect();
    ages.sort_by(f64::total_cmp);
    let resets: &serde_json::Map<String, Value> = record["loss"]["resets_sent"]
        .as_object()
        .expect("resets_sent");
    let record_rsts: u64 = resets.values().filter_map(Value::as_u64).sum();
    let verdict = record["verdict"].as_str().unwrap_or_default();
    let kill = instant(&record["sigkill_at"]);
    println!(
        "{} requests, {} cut (server log) + {unread} unread at the kill (TCPAbortOnClose) + \
         {read_unlogged} read unlogged (of {ambiguous} that may be), \
         {never_seen} sent after the kill on closed connections (drainwatch {}); \
         request ages at the cut (client/server) {truth_ages:?} vs drainwatch {ages:?}; \
         connections open up to {truth_conn:.2} s; OutRsts +{out_rsts}, metric +{metric}, \
         record {resets:?}; kill {:?} after stop issued; verdict: {verdict}; {:.1} s",
        sent.len(),
        cut.len(),
        record["loss"]["sent_after_close"],
        kill.map(|k| k - stop.issued),
        started.elapsed().as_secs_f64()
    );

    // The cuts: the server's unfinished requests, each by its own age.
    assert!(!cut.is_empty(), "some requests were in flight at the kill");
    let cuts = cut.len() as u64 + unread + read_unlogged;
    assert_eq!(record["loss"]["inflight_cut"], cuts);
    assert_eq!(ages.len() as u64, cuts, "every cut has its request's age");
    // Each request the server logged has its age among drainwatch's (the unread and unlogged
    // ones have no server-side start to compare with).
    let mut left = ages.clone();
    for truth in &truth_ages {
        let i = left.iter().position(|got| (got - truth).abs() <= 0.02);
        assert!(
            i.is_some(),
            "no request age within 20 ms of the server's log and client's {truth} s in {ages:?}"
        );
        if let Some(i) = i {
            left.remove(i);
        }
    }
    assert!(
        truth_conn > f64::from(GRACE_SECS),
        "connections older than the grace"
    );
    // The verdict: keep-alive, not the grace period.
    assert!(
        verdict.contains("the server never closed its keep-alive connections"),
        "{verdict}"
    );
    assert!(verdict.contains("answer `Connection: close`"), "{verdict}");
    assert!(!verdict.contains("raise it"), "{verdict}");
    let oldest_ms: f64 = verdict
        .split("(the oldest ")
        .nth(1)
        .and_then(|r| r.split(" ms old").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no oldest request age in ms: {verdict}"));
    let truth_oldest = truth_ages.last().copied().unwrap_or_default() * 1e3;
    assert!(
        (oldest_ms - truth_oldest).abs() <= 20.0,
        "verdict's oldest {oldest_ms} ms, truth {truth_oldest:.0} ms"
    );

    // Resets: record = metric = the namespace's own count, time-wait answers included.
    assert!(
        never_seen > 0,
        "clients reused connections the exit had closed"
    );
    assert_eq!(record_rsts, out_rsts, "resets_sent = TcpOutRsts");
    assert_eq!(metric, out_rsts as f64, "the metric = TcpOutRsts");
    let late = resets
        .get("TCP_TIMEWAIT_SOCKET")
        .and_then(Value::as_u64)
        .unwrap_or(0)
        + resets
            .get("TCP_ABORT_ON_DATA")
            .and_then(Value::as_u64)
            .unwrap_or(0);
    assert_eq!(
        late, never_seen as u64,
        "one RST from a closed socket per request sent after the kill"
    );
    // The loss: the clients' requests the server never saw, each counted once.
    assert_eq!(
        record["loss"]["sent_after_close"], never_seen as u64,
        "requests sent on connections it had closed: the clients' that the server never saw"
    );
    assert!(
        verdict.contains(&format!(
            "{} reached keep-alive connections it had already closed",
            if never_seen == 1 {
                "1 request".to_string()
            } else {
                format!("{never_seen} requests")
            }
        )),
        "{verdict}"
    );
}

/// `Drain` (`Connection: close` on every response from SIGTERM, the listener and the idle
/// connections closed after `drain_delay`: 0 or 1 s): 20 clients, a request of 20–200 ms every
/// 0–300 ms, stopped after 2 s of traffic.
fn race(server: ServerKind) -> KaRun {
    let agent = Agent::start(&[]);
    KaRun::run(&agent, &KaSpec::new(ClientKind::Plain, server))
}

#[test]
fn a_server_that_closes_idle_connections_at_sigterm_loses_the_requests_racing_its_close() {
    // Go's `Shutdown`, Node's `closeIdleConnections()`: on SIGTERM the listener and every
    // idle keep-alive connection close at once, while clients still reuse them.
    require_root();
    let started = Instant::now();
    let r = race(ServerKind::Race);
    let verdict = r.verdict();
    println!("{}; {:.1} s", r.report(), started.elapsed().as_secs_f64());
    assert_eq!(r.exit_code, 0, "it drained and exited by itself");
    let n = r
        .sent_after_close()
        .expect("the kernel's unread <= the clients' lost");
    assert!(n > 0, "some clients reused a connection it had closed");
    assert_eq!(
        r.loss("sent_after_close"),
        n,
        "requests that reached connections it had closed = the clients' the server never saw"
    );
    r.assert_verdict_names(n);
    assert!(verdict.contains("answer `Connection: close`"), "{verdict}");
}

#[test]
fn a_server_that_answers_connection_close_before_closing_idle_ones_loses_none_to_closed_connections()
 {
    // The fix: `Connection: close` on every response for 1 s (each client asks within 0.5 s
    // and moves on), then the listener and whatever is still idle.
    require_root();
    let started = Instant::now();
    let r = race(ServerKind::Safe);
    let failed = r.failed().count();
    println!("{}; {:.1} s", r.report(), started.elapsed().as_secs_f64());
    assert_eq!(r.exit_code, 0);
    assert_eq!(
        failed, 0,
        "every client was told to close before the server did"
    );
    assert_eq!(r.loss("sent_after_close"), 0);
    let verdict = r.verdict();
    assert!(!verdict.contains("already closed"), "{verdict}");
}
