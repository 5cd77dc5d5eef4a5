//! The routing lag (the stop signal → the last connection routed to the stopping container)
//! against the clients' own clocks, when the last attempts are unanswered SYNs to a vanished
//! address: each attempt is dated at its SYN (the client's `connect()`), not when the client
//! gave up on it (issue 42: it read +2.0 s with a 2 s connect timeout).
//!
//! The real agent, a real podman container with no network holder (its address goes with it)
//! that drains and exits 0 on SIGTERM, and clients on the host that connect to it on a fixed
//! beat through the stop and past its exit, each with a 2 s connect timeout. The truth is the
//! clients' own record of every attempt: when its `connect()` began, and what it met.

use std::{
    thread,
    time::{Duration, Instant},
};

use drainwatch_tests::{
    agent::{Agent, current_stop, instant, stop_record, sync, wait_for},
    lab::{
        clock::{secs_since, sleep_until},
        connect::{Met, attempt, count, unclassified},
        container::{Backend, BackendOpts, BridgeHolder, Mode},
        net::require_bridge_route,
    },
};

/// How long a client waits for the SYN's answer: a vanished address gets none.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Between two attempts' `connect()`s.
const BEAT: Duration = Duration::from_millis(200);

#[test]
fn the_routing_lag_ends_at_the_last_syn_not_when_the_client_gave_up() {
    // Keeps podman's bridge (and the clients' SYNs) on the machine once s1's address is gone.
    let _bridge = BridgeHolder::start("lag");
    let agent = Agent::start(&[]);
    let opts = BackendOpts::gone_after_drain();
    let s1 = Backend::start("s1", Mode::Drain, opts);
    let addr = s1.addr();
    wait_for("the agent knows s1", Duration::from_secs(10), || {
        drainwatch_tests::agent::api(&agent, "/api/v1/starts")
            .1
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["container"]["id"] == s1.id.as_str())
    });
    sync(&agent);

    // Attempts on a fixed beat, each in its own thread (an unanswered one takes 2 s), from
    // before the stop until 2 s after the exit: bounded in count and time.
    let attempts = thread::scope(|scope| {
        let stopping = scope.spawn(|| {
            thread::sleep(Duration::from_millis(500));
            s1.stop(10)
        });
        let mut running = Vec::new();
        let mut next = Instant::now();
        let mut exited_at: Option<Instant> = None;
        for _ in 0..100 {
            if exited_at.is_some_and(|e| next > e + Duration::from_secs(2)) {
                break;
            }
            sleep_until(next);
            if let Err(e) = require_bridge_route((*addr.ip()).into()) {
                panic!("lab: refusing to send to {addr}: {e}");
            }
            running.push(scope.spawn(move || attempt(addr, CONNECT_TIMEOUT)));
            next += BEAT;
            if exited_at.is_none() && stopping.is_finished() {
                exited_at = Some(Instant::now());
            }
        }
        assert!(exited_at.is_some(), "s1 did not exit within 100 beats");
        stopping.join().expect("podman stop");
        running
            .into_iter()
            .map(|h| h.join().expect("attempt thread"))
            .collect::<Vec<_>>()
    });
    assert_eq!(s1.exit_code(), 0, "podman: s1 drained and exited 0");
    let sigterm_logged = s1
        .events()
        .iter()
        .find(|e| e.kind == "sigterm")
        .map(|e| e.at)
        .expect("s1 logged its SIGTERM");
    let others = unclassified(&attempts);
    assert!(
        others.is_empty(),
        "attempts the lab cannot classify: {others:?}"
    );
    let unanswered = count(&attempts, &Met::Unanswered);
    println!(
        "clients: {} attempts, {} connected, {} refused, {unanswered} unanswered",
        attempts.len(),
        count(&attempts, &Met::Connected),
        count(&attempts, &Met::Refused)
    );
    assert!(unanswered >= 5, "the last attempts met a vanished address");
    let last_syn = attempts.iter().map(|a| a.at).max().expect("attempts");
    assert!(
        attempts
            .iter()
            .filter(|a| a.at == last_syn)
            .all(|a| a.met == Met::Unanswered),
        "the last attempt went unanswered"
    );

    // Every attempt has ended (the threads joined): the record has them all once the agent
    // has processed up to now. Not settled yet: 10 s after the cgroup's removal.
    stop_record(&agent, &s1.id);
    sync(&agent);
    let stop = current_stop(&agent, &s1.id).expect("s1's stop record");
    println!("drainwatch: {stop:#}");
    assert_eq!(stop["settled"], false, "read before it settled: {stop:#}");
    assert_eq!(
        stop["loss"]["unreachable"].as_u64(),
        Some(unanswered as u64),
        "unreachable = the clients' unanswered attempts"
    );
    let term = instant(&stop["sigterm_at"]).expect("sigterm_at");
    let lag = stop["routing_lag_seconds"].as_f64().expect("routing lag");
    let truth = secs_since(term, last_syn);
    println!(
        "routing lag {lag:.3} s; the clients' last SYN {truth:.3} s after SIGTERM (off by {:+.1} ms); \
         the backend logged SIGTERM {:+.1} ms from the agent's",
        (lag - truth) * 1e3,
        secs_since(term, sigterm_logged) * 1e3
    );
    assert!(
        secs_since(term, sigterm_logged).abs() < 0.05,
        "the agent's SIGTERM is the one s1 handled"
    );
    assert!(
        (lag - truth).abs() < 0.05,
        "routing lag {lag:.3} s vs the clients' last SYN {truth:.3} s after SIGTERM"
    );
    // The timeline draws the last unreachable attempt at its SYN too.
    let last_drawn = stop["loss_events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["kind"] == "unreachable")
        .filter_map(|e| instant(&e["at"]))
        .max()
        .expect("unreachable attempts on the timeline");
    assert!(
        secs_since(last_syn, last_drawn).abs() < 0.05,
        "the last unreachable attempt drawn {:+.3} s from its SYN",
        secs_since(last_syn, last_drawn)
    );
}
