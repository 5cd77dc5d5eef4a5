//! Socket.IO sessions whose client spoke last are sessions, not requests (issue 41 item 1):
//! with the library's default transports the client's last websocket frame before a stop is
//! its upgrade packet (`5`) or the pong answering the server's ping, both by design never
//! answered. drainwatch read each such connection as an in-flight request cut ("cutting N
//! in-flight requests"). socket.io 4.8 and socket.io-client 4.8 from npm (`cargo xtask setup`
//! installs them), the server with no SIGTERM handler and replaced at the same address, its
//! engine pinging every second so that the sessions connected first sent pongs before the
//! stop and the last ones their upgrade packet.
//!
//! Truth from the clients' own logs (each upgraded before the stop, lost its session with
//! `transport close`: no request of theirs was in flight; pongs and upgrade packets as their
//! last frames) and the servers' logs (the sessions open at the stop), never drainwatch.

use std::time::{Duration, Instant};

use drainwatch_tests::{
    accuracy::{
        Check,
        socketio::{SioCase, property},
    },
    lab::socketio::{AuthWork, SioSpec, Transports},
};

/// `clients` clients on `transports`, a pool of 10 in front of a 5 ms query (2,000
/// authorisations/s).
fn spec(clients: usize, transports: Transports) -> SioSpec {
    let auth = AuthWork::Io {
        pool: 10,
        query: Duration::from_millis(5),
    };
    let mut spec = SioSpec::new(clients, transports, auth);
    spec.in_flight = 50;
    spec
}

/// What each client sent last before the stop, from its own log.
#[derive(Clone, Copy, Debug, PartialEq)]
enum LastFrame {
    /// Default transports, stopped before the first ping (the library's 25 s).
    UpgradePacket,
    /// Pings every second, stopped 1.5 s after the last client connected.
    Pong,
}

/// Runs the lab and checks the sessions: every client's session lost and back is
/// `sessions_cut`, nothing is `inflight_cut` and the verdict names no in-flight request.
fn sessions_hold(mut spec: SioSpec, last: LastFrame) {
    if last == LastFrame::Pong {
        spec.ping_interval = Some(Duration::from_secs(1));
        spec.connected_for = Duration::from_millis(1500);
    }
    let t = Instant::now();
    let case = SioCase::run(spec);
    let run = &case.run;
    let n = run.spec.clients;
    let clients = run.clients();
    let (upgrades, pongs) = run.unanswered_last_frames();
    let reasons = run.loss_reasons();
    println!(
        "last client frames unanswered at the stop: {upgrades} upgrade packets, {pongs} pongs; \
         the clients' loss reasons: {reasons:?}"
    );
    let verdict = case.stop["verdict"].to_string();
    let mut checks: Vec<Check> = (case.checks().into_iter())
        .filter(|c| ["lab", "stop", "sessions"].contains(&property(c)))
        .collect();
    let default = run.spec.transports == Transports::Default;
    checks.extend([
        Check::eq(
            "lab: clients upgraded to websocket before the stop (their logs)",
            if default { n } else { 0 },
            clients.iter().filter(|c| c.upgraded.is_some()).count(),
        ),
        Check::eq(
            "lab: sessions lost with transport close (no request of theirs in flight)",
            n,
            reasons.get("transport_close").copied().unwrap_or(0),
        ),
        Check::eq(
            "lab: sessions whose last frame was a pong (their logs: a ping after the upgrade)",
            if last == LastFrame::Pong { n } else { 0 },
            pongs,
        ),
        Check::eq(
            "lab: sessions whose last frame was the upgrade packet (their logs: no ping after it)",
            if last == LastFrame::UpgradePacket {
                n
            } else {
                0
            },
            upgrades,
        ),
        Check::eq(
            "sessions: the verdict names no in-flight request",
            "no",
            if verdict.contains("in-flight request") {
                verdict.as_str()
            } else {
                "no"
            },
        ),
    ]);
    for c in &checks {
        let mark = if c.exact() { "ok  " } else { "DIFF" };
        println!(
            "{mark} {}: truth {} drainwatch {}",
            c.field, c.truth, c.drainwatch
        );
    }
    println!("the lab ran in {:.1} s", t.elapsed().as_secs_f64());
    let wrong: Vec<&Check> = checks.iter().filter(|c| !c.exact()).collect();
    assert!(wrong.is_empty(), "against the truth: {wrong:#?}");
}

/// Default transports (polling, then the upgrade), stopped before the first ping: the
/// client's upgrade packet is its last frame on the websocket connection (the storm lab's
/// shape, which read "cutting N in-flight requests").
#[test]
fn default_transports_upgrade_packets_are_no_in_flight_requests() {
    sessions_hold(spec(300, Transports::Default), LastFrame::UpgradePacket);
}

/// Default transports, pinged: the pong is the last frame.
#[test]
fn default_transports_pongs_are_no_in_flight_requests() {
    sessions_hold(spec(300, Transports::Default), LastFrame::Pong);
}

/// Websocket-only, pinged: the server sent the engine's open packet right after the upgrade
/// response, and the client's pong answering a ping is its last frame (some still unread
/// when the process dies: its kernel resets those).
#[test]
fn websocket_pongs_are_no_in_flight_requests() {
    sessions_hold(spec(300, Transports::Websocket), LastFrame::Pong);
}
