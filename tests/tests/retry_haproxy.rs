//! Retry verdicts behind HAProxy under a steady stream of same-size GETs (issue 14): the real
//! agent, HAProxy (active checks every second, DOWN after 2 failed) in front of two podman
//! backends, `s1` stopped mid-stream (see `drainwatch_tests::lab::steady_haproxy`). Ground
//! truth is HAProxy's own log and the backends' own work logs; the checks HAProxy keeps making
//! to the dead `s1` are its own `chkfail` count (see `drainwatch_tests::accuracy`).

use std::time::Duration;

use drainwatch_tests::{
    accuracy::{Check, retry::haproxy_checks, settled_stop},
    agent::Agent,
    lab::{HaproxyRetry, HaproxySteadyLab, HaproxySteadyRun, Method, Stream},
    require_root,
};

fn run(retry: HaproxyRetry) -> (HaproxySteadyRun, Vec<Check>) {
    require_root();
    let agent = Agent::start(&[]);
    let lab = HaproxySteadyLab::setup(retry, Duration::from_secs(1), 2);
    let run = lab.run(&Stream::new(Method::Get));
    print!("{}", run.report());
    assert!(
        run.unlogged.is_empty(),
        "HAProxy did not log {:?}",
        run.unlogged
    );
    assert_eq!(run.exit_code, 143, "s1 died from SIGTERM");
    assert!(
        run.failed_checks > 0,
        "HAProxy checked the dead s1: no test"
    );
    let stop = settled_stop(&agent, &lab.s1.id);
    println!("drainwatch: {:#}", stop["loss"]);
    let checks = haproxy_checks(retry, &run, &stop);
    (run, checks)
}

fn assert_exact(checks: &[Check]) {
    let wrong: Vec<&Check> = checks.iter().filter(|c| !c.exact()).collect();
    assert!(wrong.is_empty(), "against the logs: {wrong:#?}");
}

#[test]
fn haproxy_without_retries_cuts_and_refuses_but_never_retries() {
    let (run, checks) = run(HaproxyRetry::Off);
    assert!(run.duplicates.is_empty() && run.retried_not_started.is_empty());
    assert!(!run.aborts.is_empty(), "the stop cut nothing: no test");
    assert_exact(&checks);
}

#[test]
fn haproxy_l7_retries_with_redispatch_are_exact() {
    let (run, checks) = run(HaproxyRetry::L7Redispatch);
    assert!(run.aborts.is_empty(), "HAProxy retried every cut GET");
    assert!(
        !run.duplicates.is_empty(),
        "the stop cut nothing s1 had read: no test"
    );
    assert_exact(&checks);
}
