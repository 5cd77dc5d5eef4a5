//! Attempts that fail late (issue 42, item 4): connects to a stopped container's vanished
//! address that the kernel gives up on only tens of seconds later, after the stop record
//! would have settled (10 s after the cgroup's removal). The record must wait for them: it
//! stays unsettled with `attempts_in_flight` while they are, then counts each as unreachable,
//! dated at its SYN, and its metrics say the same.
//!
//! The real agent; a real podman container with no network holder (its address goes with it)
//! that drains and exits 0 on SIGTERM; a client in a container of its own on the same bridge
//! (`lab::late`) that talked to the server up to the stop, so its neighbour cache still holds
//! the server's link-layer address: its SYNs go out to a port that is gone and nothing
//! answers. Its kernel gives up after its SYN retries, lowered to 4 in its namespace only (the
//! default 6 would take 127 s), or when ARP gives up on the old neighbour. The truth is the
//! client's own record of each attempt: when its `connect()` began and ended, and its errno.

use std::time::{Duration, Instant};

use drainwatch_tests::{
    agent::{Agent, api, current_stop, instant, stop_record, sync, wait_for},
    lab::{
        clock::secs_since,
        container::{Backend, BackendOpts, BridgeHolder, Mode},
        late::LateClient,
    },
};

/// The client's `net.ipv4.tcp_syn_retries`: it gives up on an unanswered SYN after about 31 s.
const SYN_RETRIES: u32 = 4;
/// 30 attempts 200 ms apart: 6 s of a client still sending to the stopped replica.
const BEAT: Duration = Duration::from_millis(200);
const ATTEMPTS: u32 = 30;
/// The agent's settle delay (its default): the record was due this long after the cgroup went.
const SETTLE: Duration = Duration::from_secs(10);

#[test]
fn a_stop_waits_for_attempts_that_fail_after_it_was_due_and_counts_them_at_their_syn() {
    let started = Instant::now();
    // Keeps podman's bridge up (and the client's SYNs on it) once s1's address is gone.
    let _bridge = BridgeHolder::start("late");
    let agent = Agent::start(&[]);
    let opts = BackendOpts::gone_after_drain();
    let s1 = Backend::start("s1", Mode::Drain, opts);
    s1.require_route();
    let client = LateClient::start(s1.addr(), SYN_RETRIES, BEAT, ATTEMPTS);
    wait_for("the agent knows s1", Duration::from_secs(10), || {
        api(&agent, "/api/v1/starts")
            .1
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["container"]["id"] == s1.id.as_str())
    });
    client.hold();
    sync(&agent);
    s1.stop(10);
    assert_eq!(s1.exit_code(), 0, "podman: s1 drained and exited 0");
    s1.require_route();
    client.go();

    // Past the time it was due, every attempt still unanswered: the record waits.
    let stop = stop_record(&agent, &s1.id);
    let removed = instant(&stop["cgroup_removed_at"]).expect("cgroup_removed_at");
    let due = removed + SETTLE;
    drainwatch_tests::lab::clock::sleep_until(due + Duration::from_secs(2));
    let read_from = Instant::now();
    sync(&agent);
    let waiting = current_stop(&agent, &s1.id).expect("s1's stop record");
    let read_to = Instant::now();
    println!(
        "at due + {:.1} s: settled {}, attempts_in_flight {}, unreachable {}; verdict: {}",
        secs_since(due, read_from),
        waiting["settled"],
        waiting["attempts_in_flight"],
        waiting["loss"]["unreachable"],
        waiting["verdict"]
    );

    let attempts = client.attempts(Duration::from_secs(90));
    let truth = attempts.len();
    assert_eq!(truth, ATTEMPTS as usize, "the client logged every attempt");
    for a in &attempts {
        println!(
            "attempt at due {:+.3} s: {} after {:.1} s (due {:+.1} s)",
            secs_since(due, a.at),
            a.result,
            (a.ended - a.at).as_secs_f64(),
            secs_since(due, a.ended)
        );
    }
    assert!(
        attempts.iter().all(|a| a.failed_late()),
        "every attempt met the vanished address: {attempts:#?}"
    );
    let after_due = attempts.iter().filter(|a| a.ended > due).count();
    assert!(
        attempts.iter().all(|a| a.at < due),
        "every attempt began before the record was due"
    );
    assert!(
        after_due > 0,
        "no attempt failed after the record was due: the lab did not make late failures"
    );
    // What the agent waited on at the read: between the attempts unfinished when it answered
    // and those unfinished when it began to sync.
    let (least, most) = (
        attempts.iter().filter(|a| a.ended > read_to).count(),
        attempts.iter().filter(|a| a.ended > read_from).count(),
    );
    let in_flight = waiting["attempts_in_flight"]
        .as_u64()
        .expect("attempts_in_flight") as usize;
    assert_eq!(
        waiting["settled"], false,
        "due, with attempts in flight: {waiting:#}"
    );
    assert!(
        (least..=most).contains(&in_flight),
        "attempts_in_flight {in_flight}: the client had {least}–{most} unfinished"
    );

    // Every attempt has ended: the record settles at its next tick.
    wait_for("s1's stop settles", Duration::from_secs(10), || {
        current_stop(&agent, &s1.id).is_some_and(|s| s["settled"] == true)
    });
    let stop = current_stop(&agent, &s1.id).expect("s1's stop record");
    println!("drainwatch: {stop:#}");
    assert_eq!(
        stop["loss"]["unreachable"].as_u64(),
        Some(truth as u64),
        "unreachable = the client's late failures"
    );
    assert_eq!(stop["attempts_in_flight"], 0);
    assert_eq!(stop["attempts_unresolved"], 0);
    assert_eq!(stop["complete"], true, "{stop:#}");
    let term = instant(&stop["sigterm_at"]).expect("sigterm_at");
    let last_syn = attempts.iter().map(|a| a.at).max().expect("attempts");
    let lag = stop["routing_lag_seconds"].as_f64().expect("routing lag");
    let want = secs_since(term, last_syn);
    println!(
        "routing lag {lag:.3} s; the client's last SYN {want:.3} s after SIGTERM (off by {:+.1} ms)",
        (lag - want) * 1e3
    );
    assert!(
        (lag - want).abs() < 0.05,
        "routing lag {lag:.3} s vs the client's last SYN {want:.3} s after SIGTERM"
    );
    assert!(
        stop["verdict"]
            .as_str()
            .is_some_and(|v| v.contains(&format!("{truth} connection attempts"))),
        "the verdict names the attempts: {}",
        stop["verdict"]
    );

    // The metrics agree with the record.
    let name = stop["container"]["name"]
        .as_str()
        .expect("name")
        .to_string();
    let labels = [("container", name.as_str())];
    let metrics = agent.metrics_text();
    let sum = |family| drainwatch_tests::agent::metric_sum(&metrics, family, &labels);
    assert_eq!(
        sum("drainwatch_stop_unreachable_total"),
        truth as f64,
        "drainwatch_stop_unreachable_total"
    );
    assert_eq!(sum("drainwatch_routing_lag_seconds_count"), 1.0);
    let observed = sum("drainwatch_routing_lag_seconds_sum");
    assert!(
        (observed - lag).abs() < 0.001,
        "drainwatch_routing_lag_seconds_sum {observed} vs the record's {lag}"
    );
    sync(&agent);
    println!("run time {:.1} s", started.elapsed().as_secs_f64());
}
