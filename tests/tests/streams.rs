//! Long-lived streams end to end: the real agent, a server-sent-events backend in real podman
//! containers whose streams end at their own deadlines (see `drainwatch_tests::lab::sse`),
//! clients holding streams, the old container stopped. Lifetimes all the same (5 s) with a
//! grace period below them (SIGKILL cuts the streams still running) and above (every stream
//! ends on its timer); lifetimes that vary (0.2–1.0 of the longest) under a grace period that
//! covers the longest; a stop 2 s after the fleet started (nothing may be learned from its
//! shortest streams); a drain that ends every stream at once. Every record field is checked
//! against the clients' own count of cut streams and reconnects, the server's log (the
//! lifetime it drew for each stream, why it ended each) and the metrics and verdict with it
//! (`drainwatch_tests::accuracy::streams`).

use std::time::{Duration, Instant};

use drainwatch::export::{format::secs, verdict, view::StopView};
use drainwatch_tests::{
    accuracy::streams::StreamsCase,
    agent::{Agent, api},
    lab::{Lifetimes, SseSpec, StopAt, StreamDrain},
};

const CLIENTS: usize = 40;

/// Runs `spec` and asserts every check against the truth.
fn case(spec: SseSpec) -> StreamsCase {
    let started = Instant::now();
    let c = StreamsCase::run_with(Agent::start(&[]), spec);
    let wrong: Vec<_> = c.checks().into_iter().filter(|c| !c.exact()).collect();
    assert!(wrong.is_empty(), "record against the truth: {wrong:#?}");
    assert_eq!(c.run.failed_connects, 0, "no client was refused");
    // No client sent a request on a connection the server had closed: streams' clients
    // write nothing after theirs (their own late RSTs, at a reused socket address, are not
    // the server's).
    assert_eq!(
        c.stop["loss"]["sent_after_close"], 0,
        "{:#}",
        c.stop["loss"]
    );
    println!("lab run in {:.0} s", started.elapsed().as_secs_f64());
    c
}

fn spec(rotation_secs: u64, grace_secs: u32) -> SseSpec {
    SseSpec::new(CLIENTS, Duration::from_secs(rotation_secs), grace_secs)
}

fn labels(c: &StreamsCase) -> String {
    format!(
        "{{namespace=\"\",workload=\"{}\",container=\"{}\"}}",
        c.lab.spec.workload, c.lab.old.container
    )
}

fn view(c: &StreamsCase) -> StopView {
    let (_, stops) = api(&c.agent, "/api/v1/stops");
    stops
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["id"] == c.stop["id"])
        .map(|s| serde_json::from_value::<StopView>(s.clone()).expect("a stop view"))
        .expect("the stop")
}

/// The stop's reconnect storm (if the agent recorded one) counts the clients that came back
/// to the new server.
fn storm_clients(c: &StreamsCase) -> Option<u64> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, storms) = api(&c.agent, "/api/v1/storms");
        let mine = storms
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["stop_id"] == c.stop["id"])
            .map(|s| s["clients"].as_u64().unwrap_or(0))
            .reduce(|a, b| a + b);
        if mine.is_some() || Instant::now() > deadline {
            return mine;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The lifetimes' gauge: their p95 on the record.
fn check_gauge(c: &StreamsCase) {
    let p95 = c.stop["stream_lifetimes"]["p95_seconds"]
        .as_f64()
        .unwrap_or_else(|| panic!("no stream lifetimes in {:#}", c.stop));
    let gauge = c
        .agent
        .metric(&format!("drainwatch_stream_rotation_seconds{}", labels(c)))
        .expect("the stream lifetimes gauge");
    assert!((gauge - p95).abs() <= 0.3, "gauge {gauge} vs p95 {p95}");
}

#[test]
fn a_grace_period_shorter_than_the_longest_lifetime_cuts_live_streams_at_sigkill() {
    // Two stream requests still queued for accept() on a second listener when SIGTERM closes
    // it: reset by the close, 2 s before the deadline, never "outlived the grace period".
    let c = case(SseSpec {
        queued: 2,
        ..spec(5, 2)
    });
    let run = &c.run;
    assert_eq!(run.old_exit_code, 137, "SIGKILLed at the deadline");
    let cut = run.cut_on_old() as u64;
    assert!(cut >= 10, "the deadline cut streams: {}", run.report());
    assert_eq!(run.queued_reset, 2, "{}", run.report());
    assert_eq!(
        c.agent
            .metric(&format!("drainwatch_stop_streams_cut_total{}", labels(&c))),
        Some(cut as f64)
    );
    check_gauge(&c);
    // The storm of reconnects links back to the stop and counts the clients.
    assert_eq!(run.clients_on_new(), CLIENTS, "every client came back");
    let back = run.reconnects() as u64;
    assert_eq!(storm_clients(&c), Some(back), "storm clients = reconnects");
    // The verdict names the cause with the numbers, and the queued requests apart.
    let view = view(&c);
    let text = verdict::stop(&view).text;
    println!("verdict: {text}");
    assert!(
        text.starts_with("2 requests were cut as it closed its listener 0"),
        "{text}"
    );
    assert!(!text.contains("outlived"), "{text}");
    let want = format!(
        "{cut} live streams cut at SIGKILL ({back} clients back at once): the 2 s grace period is shorter than the {} s its server lets streams live: raise it to at least 7 s",
        view.stream_rotation_seconds.map_or("?".into(), secs)
    );
    assert!(text.contains(&want), "verdict {text:?} lacks {want:?}");
    // The alert's condition holds once the stop settled: grace < the lifetimes' p95 + 2 s.
    let grace = format!("drainwatch_grace_period_seconds{}", labels(&c));
    let deadline = Instant::now() + Duration::from_secs(25);
    while c.agent.metric(&grace).is_none() {
        assert!(Instant::now() < deadline, "no grace period gauge");
        std::thread::sleep(Duration::from_millis(200));
    }
    let grace = c.agent.metric(&grace).unwrap_or_default();
    let upper = c
        .agent
        .metric(&format!("drainwatch_stream_rotation_seconds{}", labels(&c)))
        .unwrap_or_default();
    assert!((grace - 2.0).abs() < 0.1, "observed grace {grace}");
    assert!(
        grace < upper + 2.0,
        "the alert's condition: {grace} < {upper} + 2"
    );
}

#[test]
fn a_grace_period_longer_than_the_longest_lifetime_lets_every_stream_end_on_its_timer() {
    let c = case(spec(5, 8));
    assert_eq!(c.run.old_exit_code, 0, "exited once its last stream ended");
    assert_eq!(c.run.cut_on_old(), 0, "{}", c.run.report());
    check_gauge(&c);
    let v = verdict::stop(&view(&c));
    assert_eq!(v.level, verdict::Level::Good, "{}", v.text);
    assert!(
        v.text
            .ends_with(&format!("({} live streams ended on their own timers)", {
                c.run.rotated_on_old_in_stop()
            })),
        "{}",
        v.text
    );
}

#[test]
fn lifetimes_that_vary_under_a_grace_period_that_covers_the_longest_cut_nothing() {
    // 0.2–1.0 × 4 s: a token expiring sooner. Before, every stream the server ended in the
    // stop before the median lifetime read as cut.
    let c = case(SseSpec {
        lifetimes: Lifetimes::Spread,
        ..spec(4, 6)
    });
    assert_eq!(c.run.cut_on_old(), 0, "{}", c.run.report());
    assert_eq!(c.stop["stream_lifetimes"]["shape"], "spread");
    check_gauge(&c);
    let v = verdict::stop(&view(&c));
    assert_eq!(v.level, verdict::Level::Good, "{}", v.text);
}

#[test]
fn stopped_early_nothing_is_learned_from_the_first_streams_and_sigkill_cuts_are_exact() {
    // 0.8–1.0 × 5 s, stopped 2 s after the fleet started: no stream had ended.
    let c = case(SseSpec {
        lifetimes: Lifetimes::Jittered,
        stop_at: StopAt::Early,
        ..spec(5, 2)
    });
    assert_eq!(c.run.old_exit_code, 137);
    assert!(c.run.cut_on_old() > 0, "{}", c.run.report());
    assert!(c.stop["stream_lifetimes"].is_null(), "{:#}", c.stop);
    let text = verdict::stop(&view(&c)).text;
    assert!(
        text.contains("not learned before this stop") || text.contains("their clients lost"),
        "{text}"
    );
}

#[test]
fn a_drain_that_ends_every_stream_at_once_is_reported_apart_from_cuts() {
    let c = case(SseSpec {
        drain: StreamDrain::AtOnce,
        ..spec(4, 6)
    });
    let ended = c.run.rotated_on_old_in_stop() as u64;
    assert_eq!(
        c.stop["streams_ended_by_server"]["at_sigterm"].as_u64(),
        Some(ended),
        "{:#}",
        c.stop
    );
    let v = verdict::stop(&view(&c));
    assert!(
        v.text.contains(&format!(
            "its server ended {ended} live streams at once right after SIGTERM (none cut"
        )),
        "{}",
        v.text
    );
}
