//! Container stops end to end: the real agent, real podman containers behind a real HAProxy
//! with active health checks and no retries, a scheduled client load (see
//! `drainwatch_tests::lab`). Each test stops (or crashes) backend s1 mid-load and asserts the
//! agent's stop record against ground truth from the client, HAProxy and the backend's own log.
//!
//! Ground truth for `refused` is the client's 503s; for `probes.refused`, HAProxy's own count
//! of its failed health checks (`chkfail`) minus those s1 answered: drainwatch learns HAProxy's
//! check schedule from its traffic and must tell the two apart exactly. Once HAProxy marks s1
//! DOWN, the lab removes it from the balancer (maintenance), as Kubernetes removes a
//! terminating pod's endpoint, so no later check reaches its address.

use std::time::{Duration, Instant};

use drainwatch_tests::{
    accuracy::stop,
    agent::{Agent, instant, promtool_check, stop_record},
    lab::{Lab, Mode, ScenarioRun, ScenarioSpec, Trigger, clock},
};
use serde_json::Value;

fn near(a: Instant, b: Instant) -> f64 {
    clock::secs_since(b, a).abs()
}

struct Scenario {
    agent: Agent,
    lab: Lab,
    run: ScenarioRun,
    stop: Value,
}

fn scenario(mode: Mode, trigger: Trigger, tune: impl FnOnce(&mut ScenarioSpec)) -> Scenario {
    let agent = Agent::start(&[]);
    let mut spec = ScenarioSpec::new(mode, trigger);
    spec.remove_when_down = true;
    tune(&mut spec);
    let lab = Lab::setup(spec);
    let run = lab.run();
    print!("{}", run.report());
    let stop = stop_record(&agent, &lab.s1.id);
    println!("drainwatch: {stop:#}");
    Scenario {
        agent,
        lab,
        run,
        stop,
    }
}

impl Scenario {
    fn loss(&self, k: &str) -> u64 {
        self.stop["loss"][k]
            .as_u64()
            .unwrap_or_else(|| panic!("loss.{k} in {:#}", self.stop))
    }

    fn failed_checks(&self) -> u64 {
        stop::failed_checks(&self.lab)
    }

    /// What holds for every stop: the lab's ground truth field by field
    /// (`drainwatch_tests::accuracy::stop`), and an ordered timeline.
    fn check_common(&self) {
        let s = &self.stop;
        let wrong: Vec<_> = stop::checks(&self.lab, &self.run, s)
            .into_iter()
            .filter(|c| !c.exact())
            .collect();
        assert!(
            wrong.is_empty(),
            "stop record against the lab's truth: {wrong:#?}"
        );
        assert_eq!(s["container"]["runtime"], "podman");
        let exit = instant(&s["exit_at"]).expect("exit_at");
        let removed = instant(&s["cgroup_removed_at"]).expect("cgroup_removed_at");
        assert!(exit <= removed, "exit before cgroup removal");
        if let Some(term) = instant(&s["sigterm_at"]) {
            assert!(term <= exit);
            // The stop wave's two s1 requests were in flight at SIGTERM.
            assert_eq!(s["connections_at_sigterm"], 2);
        }
    }
}

#[test]
fn no_sigterm_handler_exits_at_once_cutting_inflight_requests() {
    let sc = scenario(Mode::NoHandler, Trigger::Stop { grace_secs: 10 }, |_| {});
    sc.check_common();
    let s = &sc.stop;
    assert_eq!(s["outcome"], "exit_at_once");
    assert_eq!(
        (s["exit_code"].as_i64(), s["exit_signal"].as_i64()),
        (Some(143), Some(15))
    );
    assert_eq!(sc.loss("inflight_cut"), 2);
    assert_eq!(sc.run.summary.count("refused"), 4);
    assert!(s["sigkill_at"].is_null());
    assert!(s["drain_seconds"].as_f64().unwrap() < 0.5);
    let report = std::process::Command::new(drainwatch_tests::agent::binary())
        .args(["report", "--agent", &format!("127.0.0.1:{}", sc.agent.port)])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(report.status.success(), "{text}");
    assert!(
        text.contains(&format!(
            "STOP {} (podman {})",
            sc.lab.s1.container,
            &sc.lab.s1.id[..12]
        )),
        "{text}"
    );
    assert!(text.contains("verdict: exited at once on the stop signal (exit signal 15, code 143), cutting 2 in-flight requests"), "{text}");
}

#[test]
fn exiting_zero_on_sigterm_with_the_listener_open_is_exit_at_once() {
    // A handler that exits 0 at once: no signal death, but it neither closed its listener
    // nor served on, so it exited at once (README: outcomes), cutting what was in flight.
    let sc = scenario(Mode::ExitZero, Trigger::Stop { grace_secs: 10 }, |_| {});
    sc.check_common();
    let s = &sc.stop;
    assert_eq!(s["outcome"], "exit_at_once", "{s:#}");
    assert_eq!(
        (s["exit_code"].as_i64(), s["exit_signal"].as_i64()),
        (Some(0), None)
    );
    assert_eq!(sc.loss("inflight_cut"), 2);
    assert!(s["drain_seconds"].as_f64().unwrap() < 0.5);
    let closed_before_exit = s["listeners"].as_array().unwrap().iter().any(|l| {
        instant(&l["closed_at"])
            .zip(instant(&s["exit_at"]))
            .is_some_and(|(c, e)| c < e)
    });
    assert!(
        !closed_before_exit,
        "the kernel closes it after the exit: {s:#}"
    );
}

#[test]
fn closing_the_listener_on_sigterm_refuses_what_routing_still_sends() {
    let sc = scenario(
        Mode::CloseListener,
        Trigger::Stop { grace_secs: 10 },
        |_| {},
    );
    sc.check_common();
    let s = &sc.stop;
    assert_eq!(s["outcome"], "listener_closed_early");
    assert_eq!(
        (s["exit_code"].as_i64(), s["exit_signal"].as_i64()),
        (Some(0), None)
    );
    assert_eq!(sc.loss("inflight_cut"), 0);
    assert_eq!(sc.run.summary.count("refused"), 4);
    let term = instant(&s["sigterm_at"]).unwrap();
    let closed = s["listeners"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| instant(&l["closed_at"]))
        .min()
        .expect("a listener closed");
    assert!(
        closed >= term && near(closed, term) < 0.2,
        "listener closed right after SIGTERM"
    );
}

#[test]
fn readiness_flip_then_drain_loses_nothing() {
    let sc = scenario(Mode::Drain, Trigger::Stop { grace_secs: 10 }, |_| {});
    sc.check_common();
    let s = &sc.stop;
    assert_eq!(s["outcome"], "drained", "{s:#}");
    assert_eq!((sc.loss("inflight_cut"), sc.loss("refused")), (0, 0));
    assert_eq!(sc.failed_checks(), 0);
    assert!(
        sc.loss("accepted_after_sigterm") > 0,
        "routing kept sending after SIGTERM"
    );
    // The listener closed when the backend says it did, after the drain delay.
    let closed = s["listeners"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| instant(&l["closed_at"]))
        .min()
        .expect("closed");
    let logged = sc
        .lab
        .s1
        .event_at("listener-closed")
        .expect("the backend logged its listener close");
    assert!(near(closed, logged) < 0.05);
    assert!(s["drain_seconds"].as_f64().unwrap() > 5.0);
}

#[test]
fn work_longer_than_the_grace_period_is_killed_at_the_deadline() {
    let sc = scenario(Mode::Slow, Trigger::Stop { grace_secs: 7 }, |spec| {
        spec.backend.drain_delay = Some(Duration::from_secs(5));
        spec.long_request_ms = Some(9000);
    });
    sc.check_common();
    let s = &sc.stop;
    assert_eq!(s["outcome"], "killed_at_deadline");
    assert_eq!(
        (s["exit_code"].as_i64(), s["exit_signal"].as_i64()),
        (Some(137), Some(9))
    );
    assert_eq!(sc.loss("inflight_cut"), 1, "the 9 s request");
    let grace = s["grace_seconds"].as_f64().expect("grace observed");
    assert!((6.9..7.5).contains(&grace), "grace {grace}");
}

#[test]
fn exiting_with_code_1_on_its_own_is_a_crash() {
    let sc = scenario(Mode::Crash, Trigger::Crash, |_| {});
    sc.check_common();
    let s = &sc.stop;
    assert_eq!(s["outcome"], "crashed");
    assert_eq!(
        (s["exit_code"].as_i64(), s["exit_signal"].as_i64()),
        (Some(1), None)
    );
    assert!(s["sigterm_at"].is_null() && s["sigkill_at"].is_null());
    assert_eq!(sc.loss("inflight_cut"), 2);
    // Metrics: the loss is exported per container, and the settled stop by outcome.
    let labels = format!(
        "{{namespace=\"\",workload=\"{}\",container=\"{}\"}}",
        s["container"]["workload"].as_str().unwrap(),
        sc.lab.s1.container
    );
    assert_eq!(
        sc.agent
            .metric(&format!("drainwatch_stop_inflight_cut_total{labels}")),
        Some(2.0)
    );
    // It settles 10 s (the default) after its cgroup is gone.
    let deadline = Instant::now() + Duration::from_secs(25);
    let settled = format!(
        "drainwatch_container_stops_total{{namespace=\"\",workload=\"{}\",container=\"{}\",outcome=\"crashed\"}}",
        s["container"]["workload"].as_str().unwrap(),
        sc.lab.s1.container
    );
    while sc.agent.metric(&settled) != Some(1.0) {
        assert!(Instant::now() < deadline, "stop never counted as settled");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Every family, now with per-container series and histograms, is valid exposition.
    promtool_check(&sc.agent.metrics_text());
}
