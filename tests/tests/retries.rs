//! Proxy retry duplicates end to end: the real agent, nginx in front of two podman backends,
//! backend s1 stopped (no SIGTERM handler) with k requests in flight on it (see
//! `drainwatch_tests::lab::retry`). Ground truth: the backends' own logs (a request started on
//! both is a duplicate) and what the client saw (502 = abort).

use std::time::{Duration, Instant};

use drainwatch_tests::{
    agent::{Agent, current_stop, promtool_check, stop_record},
    lab::{Method, RetryLab, RetryRun, RetrySpec},
};
use serde_json::Value;

struct Variant {
    agent: Agent,
    lab: RetryLab,
    run: RetryRun,
    stop: Value,
}

fn variant(spec: RetrySpec) -> Variant {
    let agent = Agent::start(&[]);
    let lab = RetryLab::setup(spec);
    let run = lab.run();
    print!("{}", run.report());
    let mut stop = stop_record(&agent, &lab.s1.id);
    // A cut is decided once its retry was sent whole, or a second after it without one: wait
    // until every cut has its verdict (bounded), then check which.
    let deadline = Instant::now() + Duration::from_secs(10);
    let decided = |s: &Value| {
        s["loss"]["retry_duplicates"].as_u64().unwrap_or(0)
            + s["loss"]["retried_unexecuted"].as_u64().unwrap_or(0)
            + s["loss"]["upstream_aborts"].as_u64().unwrap_or(0)
    };
    while decided(&stop) < stop["loss"]["inflight_cut"].as_u64().unwrap_or(0) {
        assert!(Instant::now() < deadline, "cuts never decided: {stop:#}");
        std::thread::sleep(Duration::from_millis(200));
        stop = current_stop(&agent, &lab.s1.id).expect("s1's stop");
    }
    println!("drainwatch: {stop:#}");
    Variant {
        agent,
        lab,
        run,
        stop,
    }
}

impl Variant {
    fn loss(&self, k: &str) -> u64 {
        self.stop["loss"][k]
            .as_u64()
            .unwrap_or_else(|| panic!("loss.{k} in {:#}", self.stop))
    }

    fn labels(&self, extra: &str) -> String {
        let c = &self.stop["container"];
        format!(
            "{{namespace=\"\",workload=\"{}\",container=\"{}\"{extra}}}",
            c["workload"].as_str().unwrap(),
            c["name"].as_str().unwrap()
        )
    }
}

#[test]
fn a_get_cut_mid_request_is_retried_by_nginx_and_done_twice() {
    let v = variant(RetrySpec::new(Method::Get, None));
    assert_eq!(
        v.run.duplicates.len(),
        2,
        "ground truth: the 2 requests in flight ran twice"
    );
    assert!(v.run.aborts.is_empty(), "the client saw no error");
    assert_eq!(v.loss("inflight_cut"), 2);
    assert_eq!(v.loss("retry_duplicates"), v.run.duplicates.len() as u64);
    assert_eq!(v.loss("upstream_aborts"), 0);
    let proxy = ",proxy=\"nginx\"";
    assert_eq!(
        v.agent.metric(&format!(
            "drainwatch_retry_duplicates_total{}",
            v.labels(proxy)
        )),
        Some(2.0)
    );
    // The latency the retries added: the agent measures upstream connect to upstream connect,
    // the backends log request start to request start; they agree within a few ms each.
    let count = v.agent.metric(&format!(
        "drainwatch_retry_added_latency_seconds_count{}",
        v.labels("")
    ));
    assert_eq!(count, Some(2.0));
    let sum = v
        .agent
        .metric(&format!(
            "drainwatch_retry_added_latency_seconds_sum{}",
            v.labels("")
        ))
        .unwrap();
    let truth: f64 = v
        .run
        .retry_added_latency
        .values()
        .map(Duration::as_secs_f64)
        .sum();
    assert!(
        (sum - truth).abs() < 0.05,
        "added latency {sum:.3}s vs {truth:.3}s from the backends' logs"
    );
    // The retry families, histogram included, are valid exposition.
    promtool_check(&v.agent.metrics_text());
    let _ = &v.lab;
}

#[test]
fn without_proxy_next_upstream_a_cut_is_an_abort() {
    let v = variant(RetrySpec::new(Method::Get, Some("off")));
    assert_eq!(
        v.run.aborts.len(),
        2,
        "ground truth: the client saw 2 errors"
    );
    assert!(v.run.duplicates.is_empty());
    assert_eq!(v.loss("inflight_cut"), 2);
    assert_eq!(v.loss("upstream_aborts"), v.run.aborts.len() as u64);
    assert_eq!(v.loss("retry_duplicates"), 0);
    assert_eq!(
        v.agent.metric(&format!(
            "drainwatch_upstream_aborts_total{}",
            v.labels(",proxy=\"nginx\"")
        )),
        Some(2.0)
    );
}

#[test]
fn a_post_cut_mid_request_is_not_retried() {
    let v = variant(RetrySpec::new(Method::Post(64), None));
    assert_eq!(
        v.run.aborts.len(),
        2,
        "nginx does not retry a POST by default"
    );
    assert!(v.run.duplicates.is_empty());
    assert_eq!(v.loss("upstream_aborts"), 2);
    assert_eq!(v.loss("retry_duplicates"), 0);
}
