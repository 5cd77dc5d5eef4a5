//! Long-lived streams end to end: the real agent, a server-sent-events backend in real podman
//! containers whose streams rotate every 5 s (see `drainwatch_tests::lab::sse`), 40 clients
//! holding streams, the old container stopped with a grace period below the rotation (SIGKILL
//! cuts the streams still running) and above it (every stream ends at its rotation). The stop
//! record, the metrics and the verdict are checked against the clients' own count of cut
//! streams and reconnects, cross-checked with the server's log.

use std::time::{Duration, Instant};

use drainwatch::export::{format::secs, verdict, view::StopView};
use drainwatch_tests::{
    agent::{Agent, api, stop_record, sync},
    lab::{SseLab, SseRun, SseSpec},
};
use serde_json::Value;

const CLIENTS: usize = 40;
const ROTATION: Duration = Duration::from_secs(5);

struct Case {
    agent: Agent,
    lab: SseLab,
    run: SseRun,
    stop: Value,
}

fn case(grace_secs: u32) -> Case {
    let agent = Agent::start(&[]);
    let mut lab = SseLab::setup(SseSpec::new(CLIENTS, ROTATION, grace_secs));
    let run = lab.run();
    print!("{}", run.report());
    let stop = stop_record(&agent, &lab.old.id);
    println!("drainwatch: {stop:#}");
    // The truth holds together: no client was refused (routing moved first), and the server
    // itself ended every stream the clients saw rotate, never one they saw cut.
    assert_eq!(run.failed_connects, 0, "no client was refused");
    assert_eq!(
        run.server_opened - run.server_ended,
        run.cut_on_old(),
        "streams the server never ended = streams the clients saw cut"
    );
    Case {
        agent,
        lab,
        run,
        stop,
    }
}

impl Case {
    fn loss(&self, k: &str) -> u64 {
        self.stop["loss"][k]
            .as_u64()
            .unwrap_or_else(|| panic!("loss.{k} in {:#}", self.stop))
    }

    fn labels(&self) -> String {
        format!(
            "{{namespace=\"\",workload=\"{}\",container=\"{}\"}}",
            self.lab.spec.workload, self.lab.old.container
        )
    }

    /// The learned rotation: on the record and as the gauge, within 0.3 s of the mean
    /// lifetime the clients saw rotated streams live.
    fn check_rotation(&self) {
        let lifetimes = self.run.rotation_lifetimes();
        let truth = lifetimes.iter().sum::<f64>() / lifetimes.len() as f64;
        let learned = self.stop["stream_rotation_seconds"]
            .as_f64()
            .unwrap_or_else(|| panic!("no stream rotation in {:#}", self.stop));
        assert!(
            (learned - truth).abs() <= 0.3,
            "stream_rotation_seconds {learned} vs the clients' {truth:.3}"
        );
        let gauge = self
            .agent
            .metric(&format!(
                "drainwatch_stream_rotation_seconds{}",
                self.labels()
            ))
            .expect("the rotation gauge");
        assert!((gauge - truth).abs() <= 0.3, "gauge {gauge} vs {truth:.3}");
    }

    /// The stop's reconnect storm (if the agent recorded one) counts the clients that came
    /// back to the new server.
    fn storm_clients(&self) -> Option<u64> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let (_, storms) = api(&self.agent, "/api/v1/storms");
            let mine = storms
                .as_array()
                .into_iter()
                .flatten()
                .filter(|s| s["stop_id"] == self.stop["id"])
                .map(|s| s["clients"].as_u64().unwrap_or(0))
                .reduce(|a, b| a + b);
            if mine.is_some() || Instant::now() > deadline {
                return mine;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

#[test]
fn a_grace_period_shorter_than_the_rotation_cuts_live_streams_at_sigkill() {
    let c = case(2);
    let run = &c.run;
    assert_eq!(run.old_exit_code, 137, "SIGKILLed at the deadline");
    let cut = run.cut_on_old() as u64;
    assert!(cut >= 10, "the deadline cut streams: {}", run.report());
    assert_eq!(c.stop["outcome"], "killed_at_deadline");
    assert_eq!(
        c.loss("streams_cut"),
        cut,
        "streams cut = the clients' count"
    );
    assert_eq!(c.loss("inflight_cut"), 0, "a stream has no request pending");
    assert_eq!(
        c.loss("idle_closed"),
        run.rotated_on_old_in_stop() as u64,
        "streams that reached their rotation in the grace period are harmless"
    );
    assert_eq!(
        c.agent
            .metric(&format!("drainwatch_stop_streams_cut_total{}", c.labels())),
        Some(cut as f64)
    );
    c.check_rotation();
    // The storm of reconnects links back to the stop and counts the clients.
    assert_eq!(run.clients_on_new(), CLIENTS, "every client came back");
    let back = run.reconnects() as u64;
    assert_eq!(c.storm_clients(), Some(back), "storm clients = reconnects");
    // The verdict names the cause with the numbers.
    let (_, stops) = api(&c.agent, "/api/v1/stops");
    let view = stops
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["id"] == c.stop["id"])
        .map(|s| serde_json::from_value::<StopView>(s.clone()).expect("a stop view"))
        .expect("the stop");
    let text = verdict::stop(&view).text;
    println!("verdict: {text}");
    let want = format!(
        "{cut} live streams cut at SIGKILL ({back} clients back at once): the 2 s grace period is shorter than the {} s stream rotation: raise it to at least 7 s",
        view.stream_rotation_seconds.map_or("?".into(), secs)
    );
    assert!(text.contains(&want), "verdict {text:?} lacks {want:?}");
    // The alert's condition holds once the stop settled: grace < rotation + 2 s.
    let grace = format!("drainwatch_grace_period_seconds{}", c.labels());
    let deadline = Instant::now() + Duration::from_secs(25);
    while c.agent.metric(&grace).is_none() {
        assert!(Instant::now() < deadline, "no grace period gauge");
        std::thread::sleep(Duration::from_millis(200));
    }
    let grace = c.agent.metric(&grace).unwrap_or_default();
    let rotation = c
        .agent
        .metric(&format!("drainwatch_stream_rotation_seconds{}", c.labels()))
        .unwrap_or_default();
    assert!((grace - 2.0).abs() < 0.1, "observed grace {grace}");
    assert!(
        grace < rotation + 2.0,
        "the alert's condition: {grace} < {rotation} + 2"
    );
}

#[test]
fn a_grace_period_longer_than_the_rotation_lets_every_stream_end_at_it() {
    let c = case(8);
    let run = &c.run;
    assert_eq!(run.old_exit_code, 0, "exited once its last stream rotated");
    assert_eq!(run.cut_on_old(), 0, "{}", run.report());
    sync(&c.agent);
    assert_eq!(c.stop["outcome"], "drained");
    assert_eq!(c.loss("streams_cut"), 0);
    assert_eq!(c.loss("inflight_cut"), 0);
    assert_eq!(c.loss("idle_closed"), run.rotated_on_old_in_stop() as u64);
    assert_eq!(
        c.agent
            .metric(&format!("drainwatch_stop_streams_cut_total{}", c.labels())),
        Some(0.0)
    );
    c.check_rotation();
    let view: StopView = serde_json::from_value(c.stop.clone()).expect("a stop view");
    let v = verdict::stop(&view);
    assert!(!v.text.contains("stream"), "{}", v.text);
}
