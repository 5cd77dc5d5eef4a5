//! Reconnect storms end to end: the real agent, a socket service in real podman containers
//! whose connect path is bounded (10 concurrent authorisations of 20 ms: 500 connects/s, backlog
//! 4096), N = 2000 persistent clients in this process (see `drainwatch_tests::lab::storm`). The
//! service's container is stopped (a rolling update: the clients reconnect to the replacement of
//! the same workload) or restarted in place, and the agent's storm record is checked against
//! what the clients counted and timed.
//!
//! Which client-side time is the kernel's accept wait: the agent measures handshake completion
//! → `accept()` returning. A client sees `connect()` return at handshake completion and the
//! greeting one authorisation (20 ms) after `accept()`, so its measure is
//! `greeted - connected - 20 ms`. Measuring from `connect()` start instead adds the handshake,
//! which is where a listener that drops SYNs (a full queue) hides whole seconds of SYN
//! retransmission from any accept-queue measure: the client counts them, the queue never held
//! those connections. Hence the large backlog, and the check that no reconnect needed a SYN
//! retransmission and nothing overflowed, before comparing.

use std::time::Duration;

use drainwatch_tests::{
    accuracy::storm::StormCase,
    lab::{Replace, StormSpec},
};

const N: usize = 2000;

fn case(spec: StormSpec) -> StormCase {
    let c = StormCase::run(spec);
    let wrong: Vec<_> = c.checks().into_iter().filter(|c| !c.exact()).collect();
    assert!(
        wrong.is_empty(),
        "storm record against the clients' truth: {wrong:#?}"
    );
    c
}

fn f(v: &serde_json::Value, k: &str) -> f64 {
    v[k].as_f64()
        .unwrap_or_else(|| panic!("{k} is not a number in {v:#}"))
}

/// |a / b - 1| ≤ tolerance.
fn within(a: f64, b: f64, tolerance: f64) -> bool {
    (a / b - 1.0).abs() <= tolerance
}

/// A storm faster than the service: the clients waited (p50 over 0.5 s, by the server's log),
/// and the agent's accept-wait p50 and p95 are within 25% of the server's.
fn check_queued_waits(c: &StormCase) {
    for (q, key) in [
        (0.5, "accept_wait_p50_seconds"),
        (0.95, "accept_wait_p95_seconds"),
    ] {
        let (server, agent) = c.waits(q, key);
        println!("accept wait q{q}: server's log {server:.3}s, drainwatch {agent:.3}s");
        assert!(server > 0.5, "clients waited (q{q} {server:.3}s)");
        assert!(
            within(agent, server, 0.25),
            "{key} {agent:.3}s vs the server's {server:.3}s: more than 25% apart"
        );
    }
}

/// Case (a): 2000 clients back within a 0.5–1.5 s jitter window, against 500 connects/s: they
/// need 4 s, so most wait in the accept queue (about 0–3 s, p50 ≈ 1.5 s).
#[test]
fn reconnects_within_one_second_wait_in_the_accept_queue() {
    let spec = StormSpec::new(
        N,
        (Duration::from_millis(500), Duration::from_millis(1500)),
        Replace::Rolling,
    );
    let capacity = spec.capacity();
    let c = case(spec);
    let (s, run) = (&c.storm, &c.run);
    assert_eq!(
        run.old_exit_code,
        Some(143),
        "the old server died on SIGTERM"
    );
    // The queue backed up: far beyond the 10 workers, as the agent sampled it.
    let depth = s["max_queue_depth"].as_u64().expect("max_queue_depth");
    assert!(
        depth >= N as u64 / 4 && depth <= run.max_queue().0 as u64 + 50,
        "max_queue_depth {depth}: expected ≥ {} and at most the 10 ms samples' max {}",
        N / 4,
        run.max_queue().0
    );
    check_queued_waits(&c);
    // The window the service needed: clients ÷ what it sustains (N / 500 = 4 s).
    let window = f(s, "recommended_window_seconds");
    let want = N as f64 / capacity;
    assert!(
        within(window, want, 0.25),
        "recommended_window_seconds {window:.3} vs N / capacity {want:.3}"
    );
}

/// Case (b): the same clients spread over 2 × N / 500 = 8 s: arrivals at half the capacity,
/// almost none waits; the agent says the window was wide enough.
#[test]
fn reconnects_spread_over_twice_the_needed_window_barely_wait() {
    let window = Duration::from_secs_f64(2.0 * N as f64 / 500.0);
    let spec = StormSpec::new(N, (Duration::ZERO, window), Replace::Rolling);
    let c = case(spec);
    let (s, run) = (&c.storm, &c.run);
    let (server95, agent95) = c.waits(0.95, "accept_wait_p95_seconds");
    println!("accept wait p95: server's log {server95:.3}s, drainwatch {agent95:.3}s");
    // Near the 20 ms service time: arrivals at half the capacity find a worker free but for
    // chance bunching (10 workers at 50% load: a few % wait, for part of one authorisation),
    // so p95 is within one authorisation; measured: 0 ms (agent), 2 ms (clients).
    let service = run.spec.auth.as_secs_f64();
    assert!(
        agent95 <= service,
        "accept wait p95 {agent95:.3}s: more than one 20 ms authorisation"
    );
    assert!(
        server95 <= service,
        "the server's wait p95 {server95:.3}s: the load did not stay under capacity"
    );
    let depth = s["max_queue_depth"].as_u64().expect("max_queue_depth");
    assert!(
        depth < N as u64 / 20 && run.max_queue().0 < N as u32 / 20,
        "max_queue_depth {depth} (10 ms samples: {}): the queue backed up",
        run.max_queue().0
    );
    // The window was wide enough: nothing to recommend.
    assert!(
        s["sustained_accept_rate"].is_null() && s["recommended_window_seconds"].is_null(),
        "no backlog, so no sustained rate and no recommendation: {s:#}"
    );
}

/// A restart in place: the same container (same id, name and address) stopped and started
/// again; its clients come back to it, and the storm is linked to that container's stop. The
/// jitter window starts at 0 so that some come back during the restart (which takes 0.2–0.8 s
/// here): they are refused and retry after another jitter. The very first can even complete a
/// handshake with the old server's listener, which the kernel closes last when the process
/// exits (tens of ms after its connections): reset in its queue, an arrival all the same.
#[test]
fn a_restart_in_place_storm_belongs_to_the_restarted_container() {
    let spec = StormSpec::new(
        N,
        (Duration::ZERO, Duration::from_secs(1)),
        Replace::InPlace,
    );
    let c = case(spec);
    let (s, run) = (&c.storm, &c.run);
    assert_eq!(
        run.target_container, c.lab.old.container,
        "the same container"
    );
    check_queued_waits(&c);
    let stop = c.old_stop();
    assert!(
        s["stop_id"]
            .as_str()
            .is_some_and(|id| id.starts_with(&c.lab.old.id[..12])),
        "stop id {} names the container",
        s["stop_id"]
    );
    // Some reconnects reached the address before the server listened again and were refused:
    // by the old namespace (its listener closed at the exit, the namespace not yet gone) or by
    // the restart's new one before its listen. Each is on the record of the namespace that
    // sent it, the stop's or the restart's start record; which one depends on the timing.
    // Not all yet: the old namespace's refusals after the agent adopted the restarted
    // container (which settles the old stop) are on neither record (printed; issue 42 item 4,
    // a settled record is never amended). None is counted twice.
    assert!(run.refused() > 0, "some came back during the restart");
    let on_stop = stop["loss"]["refused"].as_u64().expect("loss.refused");
    let starts = c.old_starts();
    let on_start: u64 = starts
        .iter()
        .map(|s| s["loss"]["refused_before_listen"].as_u64().unwrap_or(0))
        .sum();
    let clients = run.refused() as u64;
    println!(
        "refused: clients {clients}, stop record {on_stop}, restart's start record {on_start} \
         ({} start records), on neither {}",
        starts.len(),
        clients.saturating_sub(on_stop + on_start)
    );
    assert!(
        on_stop + on_start > 0 && on_stop + on_start <= clients,
        "the refusals the clients met, on the stop or the restart's start record"
    );
}
