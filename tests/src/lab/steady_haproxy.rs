//! Retries under a steady stream behind HAProxy: the [`Stream`] of same-size requests through
//! HAProxy (one thread, active checks) to two podman backends, `s1` stopped (no
//! SIGTERM handler) in the middle of it. HAProxy is run the two common ways:
//! - `retries 0` (the lab's default): nothing can be retried. The ground truth of each request
//!   tried on `s1` is HAProxy's own termination state: `SH` (the server aborted before the
//!   response headers: a cut, the client's 502), `SC` (the connection was refused: 503);
//! - L7 retries (`retry-on conn-failure empty-response`, `retries 1`, `option redispatch`):
//!   the retry of a request HAProxy logs with `%rc` > 0. A retried request that `s1`'s own
//!   work log started ran twice (a duplicate); one it never started was either cut unread or
//!   refused, which HAProxy's log cannot tell apart: only their sum is known exactly.
//!
//! HAProxy keeps checking `s1` after it died until `fall` checks failed (and no more once it
//! is DOWN: `downinter` 60 s), so its `chkfail` is every failed check: health checks, never
//! requests. The stop comes after enough checks for a learned
//! schedule (`correlate::probes`): 6 checks (4 teach it).

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use super::{
    client::{Load, Outcome, RequestRecord, Summary, summarize},
    clock,
    container::{Backend, BackendOpts, Mode, WorkEntry, unique_name},
    haproxy::{Haproxy, HaproxyOpts, HttpLog},
    steady::{MAYBE_READ_BEFORE, Stream},
};

/// Checks HAProxy has made before the stop, at least: enough to learn its schedule (4), and
/// some to spare.
const CHECKS_BEFORE_STOP: u32 = 6;

/// How HAProxy is run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HaproxyRetry {
    /// `retries 0`: nothing retried.
    Off,
    /// `retry-on conn-failure empty-response`, `retries 1`, `option redispatch`.
    L7Redispatch,
}

/// Two backends behind HAProxy. Dropping it stops HAProxy and removes the containers.
pub struct HaproxySteadyLab {
    // Field order is drop order: HAProxy first, then the containers.
    pub haproxy: Haproxy,
    pub s1: Backend,
    pub s2: Backend,
    pub retry: HaproxyRetry,
    pub tag: String,
    started: Instant,
}

/// One request's ground truth.
#[derive(Clone, Debug)]
pub struct HaproxyRequest {
    pub record: RequestRecord,
    pub log: Option<HttpLog>,
    pub started_on_s1: bool,
    pub started_on_s2: bool,
}

#[derive(Debug)]
pub struct HaproxySteadyRun {
    pub requests: Vec<HaproxyRequest>,
    pub summary: Summary,
    pub exit_code: i32,
    /// Tried on `s1` only, and cut there (`SH`): the client's 502.
    pub aborts: Vec<String>,
    /// Tried on `s1` only, and refused there (`SC`): the client's 503.
    pub refused: Vec<String>,
    /// Retried, and `s1` had started it: done twice.
    pub duplicates: Vec<String>,
    /// Retried, and `s1` never started it: cut unread, or refused.
    pub retried_not_started: Vec<String>,
    /// Of `retried_not_started`, those sent from [`MAYBE_READ_BEFORE`] before the stop was
    /// issued: `s1` may have read them without logging their start. Each is a duplicate or not.
    pub maybe_read: Vec<String>,
    pub failed: Vec<String>,
    pub unlogged: Vec<String>,
    /// HAProxy's own count of `s1`'s failed checks, at the end.
    pub failed_checks: u64,
}

impl HaproxySteadyRun {
    pub fn report(&self) -> String {
        let mut s = format!(
            "steady stream via HAProxy: {}\nexit code {}; aborts {:?}\nrefused {:?}\nduplicates {:?}\n\
             retried, not started on s1 {:?} (maybe read as s1 died: {:?})\nfailed {:?}\nfailed checks of s1: {}\n",
            self.summary,
            self.exit_code,
            self.aborts,
            self.refused,
            self.duplicates,
            self.retried_not_started,
            self.maybe_read,
            self.failed,
            self.failed_checks
        );
        for r in &self.requests {
            if let Some(l) = &r.log
                && (l.server != "s2" || l.retries > 0 || l.status != 200)
            {
                s += &format!(
                    "  {} {}/{} rc {}{} {} status {} started s1 {} s2 {}\n",
                    r.record.id,
                    l.backend,
                    l.server,
                    if l.redispatched { "+" } else { "" },
                    l.retries,
                    l.flags,
                    l.status,
                    r.started_on_s1,
                    r.started_on_s2
                );
            }
        }
        s
    }
}

impl HaproxySteadyLab {
    /// Checks every `inter`, `fall` failed ones mark a server DOWN.
    pub fn setup(retry: HaproxyRetry, inter: Duration, fall: u32) -> HaproxySteadyLab {
        let s1 = Backend::start("s1", Mode::NoHandler, BackendOpts::default());
        let s2 = Backend::start("s2", Mode::NoHandler, BackendOpts::default());
        let mut opts = HaproxyOpts {
            inter,
            // No checks once DOWN: HAProxy's `chkfail` then counts every failed one.
            downinter: Some(Duration::from_secs(60)),
            fall,
            ..HaproxyOpts::default()
        };
        if retry == HaproxyRetry::L7Redispatch {
            opts.retries = 1;
            opts.retry_on = Some("conn-failure empty-response");
            opts.redispatch = true;
        }
        let started = Instant::now();
        let haproxy = Haproxy::start(&[("s1", s1.addr()), ("s2", s2.addr())], opts);
        HaproxySteadyLab {
            haproxy,
            s1,
            s2,
            retry,
            tag: unique_name("hsteady"),
            started,
        }
    }

    /// Runs `stream`, stops `s1` `stream.stop_after` into it (and no sooner than 6 checks
    /// after HAProxy started), and reads the ground truth. Once per lab.
    pub fn run(&self, stream: &Stream) -> HaproxySteadyRun {
        self.s1.require_route();
        self.s2.require_route();
        let checks = self.haproxy.opts.inter * CHECKS_BEFORE_STOP;
        clock::sleep_until(
            (self.started + checks)
                .checked_sub(stream.stop_after)
                .unwrap_or(self.started),
        );
        let (schedule, anchor) = stream.schedule();
        let load = Load::start_with(self.haproxy.frontend, schedule, &self.tag, stream.method);
        clock::sleep_until(anchor);
        let stop = self.s1.stop(10);
        let records = load.wait();
        // Every failed check is in: HAProxy checks no more once s1 is DOWN (`downinter`).
        let opts = &self.haproxy.opts;
        let down = self.haproxy.wait_down("s1", opts.inter * (opts.fall + 2));
        assert!(down.is_some(), "HAProxy never marked the dead s1 DOWN");
        let exit_code = self.s1.exit_code();
        let ids: Vec<&str> = records.iter().map(|r| r.id.as_str()).collect();
        let mut logs = self.haproxy.wait_logged(&ids, Duration::from_secs(5));
        let started = |work: &[WorkEntry]| -> BTreeSet<String> {
            work.iter()
                .filter(|w| w.started)
                .map(|w| w.id.clone())
                .collect()
        };
        let (on_s1, on_s2) = (started(&self.s1.work_log()), started(&self.s2.work_log()));
        let mut unlogged = Vec::new();
        let requests: Vec<HaproxyRequest> = records
            .into_iter()
            .map(|record| {
                let log = logs.remove(&record.id);
                if log.is_none() {
                    unlogged.push(record.id.clone());
                }
                HaproxyRequest {
                    started_on_s1: on_s1.contains(&record.id),
                    started_on_s2: on_s2.contains(&record.id),
                    log,
                    record,
                }
            })
            .collect();
        let ids_where = |f: &dyn Fn(&HaproxyRequest, &HttpLog) -> bool| -> Vec<String> {
            requests
                .iter()
                .filter(|r| r.log.as_ref().is_some_and(|l| f(r, l)))
                .map(|r| r.record.id.clone())
                .collect()
        };
        let on_s1_only = |l: &HttpLog, flags: &str| {
            l.server == "s1" && l.retries == 0 && l.flags.starts_with(flags)
        };
        let late = stop.issued - MAYBE_READ_BEFORE;
        let recs: Vec<RequestRecord> = requests.iter().map(|r| r.record.clone()).collect();
        HaproxySteadyRun {
            summary: summarize(&recs),
            exit_code,
            aborts: ids_where(&|_, l| on_s1_only(l, "SH")),
            refused: ids_where(&|_, l| on_s1_only(l, "SC")),
            duplicates: ids_where(&|r, l| l.retries > 0 && r.started_on_s1),
            retried_not_started: ids_where(&|r, l| l.retries > 0 && !r.started_on_s1),
            maybe_read: ids_where(&|r, l| {
                l.retries > 0 && !r.started_on_s1 && r.record.start >= late
            }),
            failed: requests
                .iter()
                .filter(|r| r.record.outcome != Outcome::Ok)
                .map(|r| r.record.id.clone())
                .collect(),
            unlogged,
            failed_checks: self.haproxy.failed_checks("s1").unwrap_or(0),
            requests,
        }
    }
}
