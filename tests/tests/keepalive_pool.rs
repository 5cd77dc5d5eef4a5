//! Keep-alive clients of the second kind: a pool that checks a connection before reuse, Node's
//! own `http.Agent({keepAlive: true})` shared by 20 clients (`lab::keepalive`, `ClientKind::
//! Pool`), a request of 20–200 ms every 0–300 ms, against the lab's three servers. While a
//! connection waits in the pool Node reads it, so a server FIN drops it and the next request
//! opens a new connection; only a FIN that comes after the request was written loses it.
//!
//! Ground truth: the pool's own per-request log (the errno, whether the connection was reused),
//! the server's request log and the namespace's `TCPAbortOnClose` and `Tcp: OutRsts`.
//! - Race server (idle connections closed at SIGTERM): `sent_after_close` = the requests lost on
//!   reused connections that the server never logged, less those its close reset unread; the
//!   new connections the pool opened after the FIN were refused: `refused` = the pool's
//!   `ECONNREFUSED`s.
//! - Safe server (`Connection: close` for 1 s first): nothing lost, nothing refused, no verdict
//!   of loss.
//! - A server that never closes them (SIGKILL at the deadline): its cuts (the server's log and
//!   the unread, those the server received within a tick of the connection's previous answer
//!   included: see `KaRun::same_tick_cuts`), the closed
//!   connections' RSTs (record = metric = `TcpOutRsts`), the refusals.

use drainwatch_tests::{
    agent::Agent,
    lab::keepalive::{ClientKind, KaRun, KaSpec, ServerKind},
    require_root,
};

fn run(server: ServerKind) -> KaRun {
    require_root();
    let started = std::time::Instant::now();
    let agent = Agent::start(&[]);
    let r = KaRun::run(&agent, &KaSpec::new(ClientKind::Pool, server));
    println!("{}; {:.1} s", r.report(), started.elapsed().as_secs_f64());
    assert_eq!(
        r.lost_on_new(),
        0,
        "no new connection lost but by a refusal"
    );
    r
}

#[test]
fn a_checking_pool_drops_the_connections_a_racing_server_closed_and_loses_only_the_late_fins() {
    let r = run(ServerKind::Race);
    assert_eq!(r.exit_code, 0, "it drained and exited by itself");
    assert!(
        r.idle_fins > 0,
        "the pool dropped idle connections on the server's FIN"
    );
    let truth = r
        .sent_after_close()
        .expect("the kernel's unread <= the pool's lost");
    assert_eq!(
        r.loss("sent_after_close"),
        truth,
        "requests that reached connections it had closed = the pool's lost that the server \
         never saw, less the unread"
    );
    assert_eq!(
        r.loss("refused"),
        r.refused(),
        "refused = the pool's ECONNREFUSED"
    );
    assert_eq!(
        r.loss("inflight_cut"),
        r.cut_in_server() + r.unread,
        "cuts: the server's unfinished requests and the unread at its close"
    );
    r.assert_verdict_names(truth);
}

#[test]
fn a_checking_pool_against_a_server_answering_connection_close_first_loses_nothing() {
    let r = run(ServerKind::Safe);
    assert_eq!(r.exit_code, 0);
    assert_eq!(
        r.failed().count(),
        0,
        "every request answered: each client was told to close first"
    );
    for field in ["sent_after_close", "inflight_cut", "refused", "unreachable"] {
        assert_eq!(r.loss(field), 0, "{field}: {}", r.record["loss"]);
    }
    r.assert_verdict_names(0);
}

#[test]
fn a_checking_pool_against_a_server_that_never_closes_loses_the_cuts_and_the_refusals() {
    let r = run(ServerKind::NeverCloses);
    assert_eq!(r.exit_code, 137, "SIGKILLed at the deadline");
    // A request read by the server just before the kill, unlogged, is a cut; one sent after
    // it to the closed connection is not: the truth tells them apart only by when it was sent.
    let (lo, hi) = r
        .sent_after_close_range()
        .expect("the kernel's unread <= the pool's lost");
    let truth = r.loss("sent_after_close");
    assert!(
        (lo..=hi).contains(&truth),
        "sent_after_close {truth}, truth {lo}..={hi}"
    );
    // The pool reuses the connection another client's answer just freed (LIFO): many cuts
    // are of requests the server received in the same tick as its previous answer, which the
    // tick clocks (`lrcvtime`, `lsndtime`) cannot order; the peer's acknowledgement does, and
    // they count (printed, from the clients' own timing).
    // Those read unlogged are cuts.
    let cuts = r.cut_in_server() + r.unread + (hi - truth);
    assert_eq!(
        r.loss("inflight_cut"),
        cuts,
        "inflight_cut: the server's unfinished requests and the unread at the kill ({} of \
         them within a tick of their connection's previous answer)",
        r.same_tick_cuts()
    );
    assert_eq!(
        r.loss("refused"),
        r.refused(),
        "refused = the pool's ECONNREFUSED"
    );
    assert_eq!(r.record_rsts(), r.out_rsts, "resets_sent = TcpOutRsts");
    assert_eq!(r.rsts_metric, r.out_rsts as f64, "the metric = TcpOutRsts");
    r.assert_verdict_names(truth);
}
