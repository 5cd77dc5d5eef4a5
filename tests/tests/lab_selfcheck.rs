//! Self-check of the deploy lab: each deploy-time failure mode, reproduced with real containers
//! behind a real HAProxy, gives exactly the client-side ground truth the plan says it must.
//! drainwatch's end-to-end tests compare the agent's counts with this ground truth, so it has to
//! be exact on every run.
//!
//! Timeline of every scenario (see `drainwatch_tests::lab::scenario`): 7 waves of 4 requests of
//! 1.3 s, 1.5 s apart; the stop wave leaves at A - 0.3 s (A: `podman stop` issued, or the
//! crash); the anchor is 0.5 s after a health check of s1, so HAProxy marks s1 DOWN at
//! A + 3.5 s; two waves (A + 1.2 s, A + 2.7 s) are routed half to s1 before that, two
//! (A + 4.2 s, A + 5.7 s) all to s2 after. Slots 0 and 2 of a wave go to s1 while it is UP.

use std::time::Duration;

use drainwatch_tests::{
    lab::{BackendOpts, Lab, Mode, Outcome, ScenarioRun, ScenarioSpec, Trigger},
    require_root,
};

/// Counts the plan predicts for one scenario (28 requests in all).
struct Expect {
    exit_code: i32,
    ok_s1: usize,
    ok_s2: usize,
    cut: usize,
    refused: usize,
}

fn scenario(name: &str, spec: ScenarioSpec) -> (Lab, ScenarioRun) {
    let lab = Lab::setup(spec);
    let run = lab.run();
    println!(
        "=== {name}: s1 {} pid {} {} (container {}), s2 {}, HAProxy {}",
        &lab.s1.id[..12],
        lab.s1.pid,
        lab.s1.addr(),
        lab.s1.container,
        lab.s2.addr(),
        lab.haproxy.frontend
    );
    print!("{}", run.report());
    (lab, run)
}

/// What holds in every scenario, then the scenario's own counts.
fn check(lab: &Lab, run: &ScenarioRun, e: &Expect) {
    let plan = &run.plan;
    let a = plan.anchor;
    assert!(
        run.unlogged.is_empty(),
        "HAProxy did not log {:?}",
        run.unlogged
    );
    assert_eq!(run.records.len(), 28);

    // The schedule was kept: every request left within 150 ms of its planned instant.
    for r in &run.records {
        assert!(
            r.lateness() < Duration::from_millis(150),
            "{} left {:?} late",
            r.id,
            r.lateness()
        );
    }

    // HAProxy marked s1 DOWN when the plan said (checks are 2 s apart: 0.5 s is far off).
    let down = run.down_at.expect("HAProxy never marked s1 DOWN");
    let off = clock_diff(down, plan.predicted_down);
    assert!(off < 0.5, "s1 DOWN {off:.3}s away from the prediction");

    // The stop reached the server well inside the 1 s the stop wave stays in flight after A.
    if let Some(sig) = run.sigterm_at {
        let latency = sig.saturating_duration_since(a);
        assert!(
            latency < Duration::from_millis(900),
            "SIGTERM {latency:?} after A"
        );
    }

    // Routing: slots 0 and 2 to s1, 1 and 3 to s2, for every wave that left before DOWN;
    // everything to s2 after.
    for r in &run.records {
        let want = if r.scheduled < plan.predicted_down && r.slot % 2 == 0 {
            "s1"
        } else {
            "s2"
        };
        assert_eq!(
            r.backend(),
            Some(want),
            "{} routed to {:?}",
            r.id,
            r.backend()
        );
    }

    // Outcome ⇔ HAProxy termination state, and the backend's own log agrees.
    let work = &run.s1_work;
    let started = |id: &str| work.iter().any(|w| w.started && w.id == id);
    let ended = |id: &str| work.iter().any(|w| !w.started && w.id == id);
    for r in &run.records {
        let flags = r.flags.as_deref().unwrap_or("?");
        match &r.outcome {
            Outcome::Ok => {
                assert_eq!(flags, "----", "{}", r.id);
                assert_eq!(r.status, Some(200));
                assert_eq!(r.body, r.id, "the body is the id");
                assert_eq!(r.x_backend.as_deref(), r.server.as_deref());
                if r.backend() == Some("s1") {
                    assert!(started(&r.id) && ended(&r.id), "{} not in s1's log", r.id);
                }
            }
            Outcome::Cut => {
                assert_eq!(flags, "SH--", "{}", r.id);
                assert_eq!(r.status, Some(502));
                assert_eq!(r.wave, plan.stop_wave, "{} cut outside the stop wave", r.id);
                assert!(
                    started(&r.id) && !ended(&r.id),
                    "{}: s1 did not start it only",
                    r.id
                );
            }
            Outcome::Refused => {
                assert_eq!(flags, "SC--", "{}", r.id);
                assert_eq!(r.status, Some(503));
                assert!(
                    r.scheduled > a && r.scheduled < plan.predicted_down,
                    "{}",
                    r.id
                );
                assert!(!started(&r.id), "{} reached s1", r.id);
            }
            other => panic!("{}: unexpected outcome {other:?}", r.id),
        }
    }

    let s = &run.summary;
    assert_eq!(s.count_on("s1", "ok"), e.ok_s1, "ok on s1");
    assert_eq!(s.count_on("s2", "ok"), e.ok_s2, "ok on s2");
    assert_eq!(s.count("cut"), e.cut, "cut");
    assert_eq!(s.count("refused"), e.refused, "refused");
    assert_eq!(s.count("ok") + e.cut + e.refused, 28);
    assert_eq!(run.exit_code, e.exit_code, "exit code of s1");
    assert!(lab.s1.wait_exited(Duration::from_secs(1)));
}

fn clock_diff(a: std::time::Instant, b: std::time::Instant) -> f64 {
    drainwatch_tests::lab::clock::secs_since(b, a).abs()
}

/// Scenario 1, no SIGTERM handler (run with --init): the 2 requests in flight on s1 are cut (502),
/// exit 143; s1's address stays (pod-like), so the 2 waves routed to it before DOWN are refused
/// (503): 4 requests.
#[test]
fn no_handler_cuts_in_flight_and_refuses_until_down() {
    require_root();
    let spec = ScenarioSpec::new(Mode::NoHandler, Trigger::Stop { grace_secs: 10 });
    let (lab, run) = scenario("no-handler", spec);
    check(
        &lab,
        &run,
        &Expect {
            exit_code: 143,
            ok_s1: 4,
            ok_s2: 18,
            cut: 2,
            refused: 4,
        },
    );
    assert!(run.sigterm_at.is_none() && run.exit_logged_at.is_none());
    let st = run.stop.unwrap();
    assert!(
        st.returned - st.issued < Duration::from_secs(5),
        "killed by SIGTERM, not the deadline"
    );
}

/// Scenario 2, listener closed on SIGTERM: in-flight finish (ok), exit 0, but the 4 requests routed
/// to s1 between the close and DOWN are refused.
#[test]
fn close_listener_refuses_until_down() {
    require_root();
    let spec = ScenarioSpec::new(Mode::CloseListener, Trigger::Stop { grace_secs: 10 });
    let (lab, run) = scenario("close-listener", spec);
    check(
        &lab,
        &run,
        &Expect {
            exit_code: 0,
            ok_s1: 6,
            ok_s2: 18,
            cut: 0,
            refused: 4,
        },
    );
    let ev = |k: &str| run.s1_events.iter().find(|e| e.kind == k).map(|e| e.at);
    assert!(ev("listener-closed").unwrap() < run.plan.anchor + Duration::from_millis(900));
    assert!(ev("exit").is_some());
}

/// Scenario 3, readiness flip then drain (5 s > inter × fall = 4 s): s1 keeps serving until HAProxy
/// takes it out, then exits 0. Nothing is lost.
#[test]
fn drain_loses_nothing() {
    require_root();
    let mut spec = ScenarioSpec::new(Mode::Drain, Trigger::Stop { grace_secs: 10 });
    spec.backend = BackendOpts {
        drain_delay: Some(Duration::from_secs(5)),
        ..BackendOpts::default()
    };
    let (lab, run) = scenario("drain", spec);
    check(
        &lab,
        &run,
        &Expect {
            exit_code: 0,
            ok_s1: 10,
            ok_s2: 18,
            cut: 0,
            refused: 0,
        },
    );
    // The listener closed only after HAProxy had taken s1 out.
    let closed = run
        .s1_events
        .iter()
        .find(|e| e.kind == "listener-closed")
        .unwrap()
        .at;
    assert!(closed > run.down_at.unwrap());
}

/// Scenario 4, killed at the deadline: s1 drains properly (5 s) but one request of 9 s outlives the
/// 7 s grace period and is cut by SIGKILL (exit 137); nothing else is lost.
#[test]
fn slow_request_is_cut_at_the_deadline() {
    require_root();
    let mut spec = ScenarioSpec::new(Mode::Slow, Trigger::Stop { grace_secs: 7 });
    spec.backend = BackendOpts {
        drain_delay: Some(Duration::from_secs(5)),
        ..BackendOpts::default()
    };
    spec.long_request_ms = Some(9000);
    let (lab, run) = scenario("slow", spec);
    check(
        &lab,
        &run,
        &Expect {
            exit_code: 137,
            ok_s1: 9,
            ok_s2: 18,
            cut: 1,
            refused: 0,
        },
    );
    let cut = run.with_outcome("cut");
    assert_eq!(cut[0].id, format!("{}-w2-s0", lab.tag), "the long request");
    // Cut at the deadline, not at SIGTERM.
    let st = run.stop.unwrap();
    assert!(cut[0].end >= st.issued + Duration::from_secs(7));
    assert!(st.returned - st.issued >= Duration::from_secs(7));
    assert!(
        run.exit_logged_at.is_none(),
        "SIGKILLed before it could exit"
    );
}

/// Scenario 5, crash: no signal; exits 1 at the anchor; the 2 requests in flight on s1 are cut, the
/// 4 routed to its (still present) address before DOWN are refused.
#[test]
fn crash_cuts_in_flight() {
    require_root();
    let spec = ScenarioSpec::new(Mode::Crash, Trigger::Crash);
    let (lab, run) = scenario("crash", spec);
    check(
        &lab,
        &run,
        &Expect {
            exit_code: 1,
            ok_s1: 4,
            ok_s2: 18,
            cut: 2,
            refused: 4,
        },
    );
    assert!(run.sigterm_at.is_none());
    let crashed = run.exit_logged_at.expect("crash logged");
    assert!(
        clock_diff(crashed, run.plan.anchor) < 0.05,
        "crashed on time"
    );
}
