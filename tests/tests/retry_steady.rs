//! Retry verdicts under a steady stream of same-size requests (issue 14): the real agent,
//! nginx in front of two podman backends, a request every 40 ms (all the same bytes), backend
//! s1 stopped (no SIGTERM handler) in the middle of it (see `drainwatch_tests::lab::steady`).
//!
//! The ground truth is what nginx and the backends logged, never drainwatch's arithmetic: a
//! cut is a try on s1 nginx's error log reports failed while reading the response header; a
//! retried cut is a duplicate when s1's own log has its start, else it ran once (retried
//! unexecuted); a cut nginx did not retry is an abort. Every count must be equal, and a
//! variant that cannot retry must read zero retries though the stream keeps sending requests
//! of exactly the cut ones' size.

use std::time::{Duration, Instant};

use drainwatch_tests::{
    agent::{Agent, current_stop, stop_record},
    lab::{Method, NginxOpts, RetryLab, RetrySpec, SteadyRun, Stream},
    require_root,
};
use serde_json::Value;

struct Variant {
    agent: Agent,
    lab: RetryLab,
    run: SteadyRun,
    stop: Value,
}

fn variant(method: Method, next_upstream: Option<&str>, keepalive: Option<u32>) -> Variant {
    require_root();
    let agent = Agent::start(&[]);
    let mut spec = RetrySpec::new(method, next_upstream);
    spec.nginx = NginxOpts {
        keepalive,
        ..spec.nginx
    };
    let lab = RetryLab::setup(spec);
    let run = lab.run_steady(&Stream::new(method));
    print!("{}", run.report());
    assert!(
        run.unlogged.is_empty(),
        "nginx did not log {:?}",
        run.unlogged
    );
    assert_eq!(run.exit_code, 143, "s1 died from SIGTERM");
    assert!(!run.cuts.is_empty(), "the stop cut nothing: no test");
    let mut stop = stop_record(&agent, &lab.s1.id);
    // Aborts are decided a second after the cut; retries once the retry is sent whole.
    let decided = |s: &Value| {
        ["retry_duplicates", "retried_unexecuted", "upstream_aborts"]
            .iter()
            .map(|k| s["loss"][k].as_u64().unwrap_or(0))
            .sum::<u64>()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while decided(&stop) < run.cuts.len() as u64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        stop = current_stop(&agent, &lab.s1.id).expect("s1's stop");
    }
    // Late verdicts would be wrong ones: give them time to show.
    std::thread::sleep(Duration::from_millis(1500));
    if let Some(s) = current_stop(&agent, &lab.s1.id) {
        stop = s;
    }
    println!("drainwatch: {:#}", stop["loss"]);
    println!(
        "sock_length events: {:?}, ebpf faults: {:?}",
        agent.metric("drainwatch_events_total{kind=\"sock_length\"}"),
        agent
            .metrics_text()
            .lines()
            .filter(|l| l.starts_with("drainwatch_ebpf_faults_total") && !l.ends_with(" 0"))
            .collect::<Vec<_>>()
    );
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

    fn metric(&self, family: &str) -> f64 {
        let c = &self.stop["container"];
        let labels = format!(
            "{{namespace=\"\",workload=\"{}\",container=\"{}\",proxy=\"nginx\"}}",
            c["workload"].as_str().unwrap_or_default(),
            c["name"].as_str().unwrap_or_default()
        );
        self.agent
            .metric(&format!("{family}{labels}"))
            .unwrap_or(0.0)
    }

    /// drainwatch's three verdicts equal the logs', in the record and in the metrics.
    fn check_exact(&self) {
        let r = &self.run;
        let want = (
            r.duplicates.len() as u64,
            r.retried_unexecuted.len() as u64,
            r.aborts.len() as u64,
        );
        let got = (
            self.loss("retry_duplicates"),
            self.loss("retried_unexecuted"),
            self.loss("upstream_aborts"),
        );
        assert_eq!(
            got, want,
            "(retry_duplicates, retried_unexecuted, upstream_aborts) vs the logs"
        );
        let metrics = (
            self.metric("drainwatch_retry_duplicates_total"),
            self.metric("drainwatch_retried_unexecuted_total"),
            self.metric("drainwatch_upstream_aborts_total"),
        );
        assert_eq!(
            metrics,
            (want.0 as f64, want.1 as f64, want.2 as f64),
            "metrics"
        );
        let _ = &self.lab;
    }
}

#[test]
fn nginx_default_retries_under_a_steady_stream_exactly() {
    let v = variant(Method::Get, None, None);
    assert!(v.run.aborts.is_empty(), "nginx retried every cut GET");
    v.check_exact();
}

#[test]
fn nginx_keepalive_pool_retries_under_a_steady_stream_exactly() {
    let v = variant(Method::Get, None, Some(8));
    v.check_exact();
}

#[test]
fn nginx_next_upstream_off_never_matches_the_stream() {
    let v = variant(Method::Get, Some("off"), None);
    assert!(v.run.duplicates.is_empty() && v.run.retried_unexecuted.is_empty());
    assert_eq!(v.loss("retry_duplicates"), 0, "false positives");
    assert_eq!(v.loss("retried_unexecuted"), 0, "false positives");
    v.check_exact();
}

#[test]
fn nginx_next_upstream_off_pooled_never_matches_the_stream() {
    let v = variant(Method::Get, Some("off"), Some(8));
    assert!(v.run.duplicates.is_empty() && v.run.retried_unexecuted.is_empty());
    assert_eq!(v.loss("retry_duplicates"), 0, "false positives");
    assert_eq!(v.loss("retried_unexecuted"), 0, "false positives");
    v.check_exact();
}

#[test]
fn a_post_under_a_steady_stream_is_not_retried() {
    let v = variant(Method::Post(64), None, None);
    assert!(v.run.duplicates.is_empty() && v.run.retried_unexecuted.is_empty());
    assert_eq!(v.loss("retry_duplicates"), 0, "false positives");
    v.check_exact();
}
