//! Self-check of the retry lab: nginx in front of two backend containers, `s1` stopped while
//! exactly k = 2 requests are in flight on it, and the exact ground truth of what nginx did
//! with them. drainwatch's retry-duplicate tests compare the agent's counts with this ground
//! truth, so it has to be exact on every run.
//!
//! Timeline of every variant (see `drainwatch_tests::lab::retry`): 4 waves of 4 requests of
//! 1.3 s, 1.5 s apart; the stop wave leaves at A - 0.3 s (A: `podman stop` of s1 issued); slots
//! 0 and 2 of a wave go to s1, 1 and 3 to s2, until the stop; s1 dies from SIGTERM at once
//! (no handler, `--init`: exit 143), cutting the stop wave's slots 0 and 2 before any response
//! header; nginx then leaves s1 out for `fail_timeout` (10 s), longer than the rest of the load,
//! so the 2 waves after the stop (A + 1.2 s, A + 2.7 s) all go to s2.

use std::time::Duration;

use drainwatch_tests::{
    lab::{Method, Outcome, RetryLab, RetryRun, RetrySpec},
    require_root,
};

/// What a variant does to the k requests in flight on s1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    /// Retried on s2: the client gets 200, the work ran twice.
    Duplicated,
    /// Not retried: the client gets 502, the work ran once (cut).
    Aborted,
}

fn variant(name: &str, spec: RetrySpec) -> (RetryLab, RetryRun) {
    let lab = RetryLab::setup(spec);
    let run = lab.run();
    println!(
        "=== {name}: nginx {} master {} worker {}; s1 {} {} pid {}, s2 {} {} pid {}",
        lab.nginx.frontend,
        lab.nginx.master_pid,
        lab.nginx.worker_pid,
        &lab.s1.id[..12],
        lab.s1.addr(),
        lab.s1.pid,
        &lab.s2.id[..12],
        lab.s2.addr(),
        lab.s2.pid,
    );
    print!("{}", run.report());
    (lab, run)
}

/// What holds in every variant, then the fate of the k in-flight requests.
fn check(lab: &RetryLab, run: &RetryRun, fate: Fate, method: &str) {
    let plan = &run.plan;
    let a = plan.anchor;
    let k = lab.spec.in_flight;
    let ms = Duration::from_millis(lab.spec.request_ms);
    assert!(
        run.unlogged.is_empty(),
        "nginx did not log {:?}",
        run.unlogged
    );
    assert_eq!(run.requests.len(), 16);
    assert_eq!(plan.in_flight_on_s1.len(), k);
    assert_eq!(run.exit_code, 143, "s1 died from SIGTERM");
    assert!(
        run.stop.returned - run.stop.issued < Duration::from_secs(5),
        "s1 was killed by SIGTERM, not at the deadline"
    );
    assert!(lab.s1.wait_exited(Duration::from_secs(1)));

    // One worker served everything, and is still the one.
    assert_eq!(lab.nginx.worker_pids(), vec![lab.nginx.worker_pid]);
    for r in &run.requests {
        let e = r.access.as_ref().unwrap();
        assert_eq!(e.pid, lab.nginx.worker_pid, "{}", r.record.id);
        assert_eq!(e.method, method, "{}", r.record.id);
        assert_eq!(Some(e.status), r.record.status, "{}", r.record.id);
        assert_eq!(e.client, r.record.local, "{}", r.record.id);
        assert_eq!(e.upstream_statuses.len(), e.upstream_addrs.len());
        assert!(
            r.record.lateness() < Duration::from_millis(150),
            "{} left {:?} late",
            r.record.id,
            r.record.lateness()
        );
    }

    for r in &run.requests {
        let id = r.record.id.as_str();
        let e = r.access.as_ref().unwrap();
        let in_flight = plan.in_flight_on_s1.iter().any(|i| i == id);
        if in_flight {
            assert_eq!(r.record.wave, plan.stop_wave);
            assert_eq!(r.record.slot % 2, 0);
            // s1 started it and was cut before finishing.
            assert!(r.started_on("s1").is_some(), "{id} not started on s1");
            assert!(!r.ended.iter().any(|b| b == "s1"), "{id} ended on s1");
            match fate {
                Fate::Duplicated => {
                    assert_eq!(r.record.outcome, Outcome::Ok, "{id}");
                    assert_eq!(r.record.body, id, "the body is the id");
                    assert_eq!(r.record.x_backend.as_deref(), Some("s2"), "{id}");
                    assert_eq!(r.upstreams, ["s1", "s2"], "{id}");
                    assert_eq!(e.upstream_statuses, [Some(502), Some(200)], "{id}");
                    assert_eq!(r.ended, ["s2"], "{id}");
                    // The retry starts on s2 once s1 is gone: after the stop was issued,
                    // no later than it returned.
                    let on_s2 = r.started_on("s2").unwrap();
                    assert!(on_s2 > run.stop.issued, "{id} retried before the stop");
                    assert!(
                        on_s2 < run.stop.returned + Duration::from_millis(100),
                        "{id} retried long after s1 was gone"
                    );
                    // The client waited for both: the cut try and the whole retry.
                    let added = run.retry_added_latency[id];
                    assert_eq!(
                        added,
                        on_s2 - r.started_on("s1").unwrap(),
                        "{id} added latency"
                    );
                    assert!(
                        r.latency() + Duration::from_millis(1) >= added + ms,
                        "{id}: latency {:?} < {added:?} + {ms:?}",
                        r.latency()
                    );
                }
                Fate::Aborted => {
                    assert_eq!(r.record.outcome, Outcome::Cut, "{id}");
                    assert_eq!(r.record.status, Some(502), "{id}");
                    assert_eq!(r.upstreams, ["s1"], "{id}");
                    assert_eq!(e.upstream_statuses, [Some(502)], "{id}");
                    assert!(r.started_on("s2").is_none(), "{id} reached s2");
                    assert!(r.ended.is_empty(), "{id} ended somewhere");
                    assert!(
                        r.record.end > run.stop.issued,
                        "{id} failed before the stop"
                    );
                }
            }
        } else {
            // Everything else: one upstream, 200, run once. s1 while it lived (slots 0, 2, ...
            // of the waves before the stop and of the stop wave), s2 otherwise.
            let want = if r.record.scheduled < a && r.record.slot % 2 == 0 {
                "s1"
            } else {
                "s2"
            };
            assert_eq!(r.record.outcome, Outcome::Ok, "{id}");
            assert_eq!(r.upstreams, [want], "{id}");
            assert_eq!(e.upstream_statuses, [Some(200)], "{id}");
            assert_eq!(r.record.x_backend.as_deref(), Some(want), "{id}");
            assert_eq!(r.started.len(), 1, "{id} started {:?}", r.started);
            assert_eq!(r.started[0].0, want, "{id}");
            assert_eq!(r.ended, [want], "{id}");
        }
    }

    let expect_ids = |f: Fate| -> Vec<String> {
        if f == fate {
            plan.in_flight_on_s1.clone()
        } else {
            Vec::new()
        }
    };
    assert_eq!(run.duplicates, expect_ids(Fate::Duplicated), "duplicates");
    assert_eq!(run.retried, run.duplicates, "retried = duplicates");
    assert_eq!(run.aborts, expect_ids(Fate::Aborted), "aborts");
    assert_eq!(
        run.retry_added_latency.keys().cloned().collect::<Vec<_>>(),
        run.duplicates
    );
    let s = &run.summary;
    let failed = if fate == Fate::Aborted { k } else { 0 };
    assert_eq!(s.count("ok"), 16 - failed, "ok");
    assert_eq!(s.count("cut"), failed, "cut (502)");
    // First choices: 2 waves of 2 to s1 (before and at the stop), the rest to s2.
    assert_eq!(s.routed_to("s1"), 2 * k, "first choice s1");
    assert_eq!(s.routed_to("s2"), 16 - 2 * k, "first choice s2");

    // nginx's own view: each cut is one "prematurely closed", and s1 was taken out.
    let closed = lab
        .nginx
        .error_lines("upstream prematurely closed connection");
    assert_eq!(closed.len(), k, "{closed:#?}");
    assert!(
        !lab.nginx
            .error_lines("upstream server temporarily disabled")
            .is_empty()
    );
}

/// (a) nginx's default `proxy_next_upstream error timeout`, GET: both requests cut on s1 are
/// re-sent to s2. The client sees no error at all; 2 duplicates.
#[test]
fn default_retries_get_and_duplicates_work() {
    require_root();
    let spec = RetrySpec::new(Method::Get, None);
    let (lab, run) = variant("default-get", spec);
    check(&lab, &run, Fate::Duplicated, "GET");
    // The retry cost about the time already spent on s1: 0.3 s and 0.22 s, plus the time the
    // stop took to kill s1.
    for (id, d) in &run.retry_added_latency {
        assert!(
            *d > Duration::from_millis(200) && *d < Duration::from_millis(1000),
            "{id}: {d:?}"
        );
    }
}

/// (b) `proxy_next_upstream off`, GET: both requests cut on s1 are the client's 502s; nothing ran
/// twice.
#[test]
fn next_upstream_off_aborts() {
    require_root();
    let spec = RetrySpec::new(Method::Get, Some("off"));
    let (lab, run) = variant("off-get", spec);
    check(&lab, &run, Fate::Aborted, "GET");
}

/// (c) default `proxy_next_upstream`, POST with a small body: not idempotent, so nginx does not
/// re-send it: 2 aborts (502), no duplicate.
#[test]
fn post_is_not_retried() {
    require_root();
    let spec = RetrySpec::new(Method::Post(64), None);
    let (lab, run) = variant("default-post", spec);
    check(&lab, &run, Fate::Aborted, "POST");
}
