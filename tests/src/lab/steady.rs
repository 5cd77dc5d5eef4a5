//! Retries under a steady stream of same-size requests: the [`RetryLab`]'s nginx and two
//! backends, a request every `interval` (each `ms` of work, every one of them the same number
//! of bytes: same method, same `ms`, ids of one length), backend `s1` stopped in the middle.
//! Which requests the stop cuts is left to chance; the ground truth is read afterwards from
//! what nginx and the backends logged, never from drainwatch:
//! - a **cut** is a request whose try on `s1` nginx's error log reports failed while reading
//!   the response header (`upstream prematurely closed connection`, `recv() failed (104:
//!   Connection reset by peer)`): the request was sent, no response came;
//! - a cut nginx tried again (`$upstream_addr` lists `s2` after `s1`) is a **duplicate** if
//!   `s1`'s own work log has its `start` (it ran there too), else **retried unexecuted**;
//! - a cut not tried again is an **abort** (the client got 502, or had gone).
//!
//! The stream outlasts the stop by a few seconds and ends within `fail_timeout` of it, so
//! nginx never tries `s1`'s dead address again (a refused connect would be retried too, but
//! is no cut: no request was sent).

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use super::{
    client::{Load, Method, Outcome, RequestRecord, Schedule, Summary, summarize},
    clock,
    container::{StopTimes, WorkEntry},
    nginx::AccessEntry,
    retry::RetryLab,
};

/// The stream: `waves` × 10 requests, one every `interval`, `ms` of work each.
#[derive(Clone, Debug)]
pub struct Stream {
    pub method: Method,
    pub interval: Duration,
    pub ms: u64,
    /// At most 10, so that every id (`<tag>-w<w>-s<s>`) has one length.
    pub waves: usize,
    /// When `s1` is stopped, from the stream's start.
    pub stop_after: Duration,
    /// Clients that give up around the stop (none: every client waits for its response).
    pub gone: Option<Gone>,
}

/// Clients that close their connection before their response, around the stop: where a
/// proxy's cut upstream request may belong to a client already gone, so that no answer to
/// the client follows the cut.
#[derive(Clone, Copy, Debug)]
pub struct Gone {
    /// Draws which clients give up, and when.
    pub seed: u64,
    /// The share of the requests in flight at the stop whose client gives up.
    pub share: f64,
    /// Each gives up within this much of the stop, either side (never before its request
    /// was sent).
    pub around: Duration,
    /// The proxy carries on upstream after a client left (nginx `proxy_ignore_client_abort
    /// on`): its cuts then find the client gone.
    pub proxy_ignores: bool,
}

impl Stream {
    /// 100 requests of 600 ms, one every 40 ms (about 15 in flight, half on `s1`), `s1`
    /// stopped 2 s in.
    pub fn new(method: Method) -> Stream {
        Stream {
            method,
            interval: Duration::from_millis(40),
            ms: 600,
            waves: 10,
            stop_after: Duration::from_secs(2),
            gone: None,
        }
    }
}

impl Stream {
    /// The schedule, starting 0.3 s from now, and when `s1` is to be stopped.
    pub(super) fn schedule(&self) -> (Schedule, Instant) {
        assert!(self.waves <= 10, "ids must have one length");
        let first = Instant::now() + Duration::from_millis(300);
        let per_wave = 10;
        let mut schedule = Schedule::periodic(
            first,
            self.interval * per_wave,
            self.waves,
            per_wave as usize,
            self.ms,
        );
        schedule.stagger = self.interval;
        let anchor = first + self.stop_after;
        if let Some(g) = self.gone {
            let mut rng = fastrand::Rng::with_seed(g.seed);
            let work = Duration::from_millis(self.ms);
            for w in 0..schedule.waves.len() {
                let give_up = (0..per_wave as usize)
                    .map(|slot| {
                        let sent = schedule.dispatch_at(w, slot);
                        let at = anchor - g.around + g.around.mul_f64(2.0 * rng.f64());
                        let in_flight = sent <= anchor && anchor < sent + work;
                        (in_flight && rng.f64() < g.share).then_some(at.max(sent))
                    })
                    .collect();
                schedule.waves[w].give_up = give_up;
            }
        }
        (schedule, anchor)
    }
}

/// One request's ground truth.
#[derive(Clone, Debug)]
pub struct SteadyRequest {
    pub record: RequestRecord,
    pub access: Option<AccessEntry>,
    /// Upstream names nginx tried, in order.
    pub upstreams: Vec<String>,
    pub started_on_s1: bool,
    pub started_on_s2: bool,
    /// nginx's error log says its try on `s1` was cut after the request was sent.
    pub cut_on_s1: bool,
}

/// A request sent this long before a backend's stop was issued may have been read by it (the
/// kernel's count, which drainwatch reads) without its start logged: the backend dies of the
/// signal between its `recv` and its log line. Normally well under a millisecond; on a loaded
/// machine its thread can wait for a CPU for tens of milliseconds in between.
pub const MAYBE_READ_BEFORE: Duration = Duration::from_millis(200);

#[derive(Debug)]
pub struct SteadyRun {
    pub requests: Vec<SteadyRequest>,
    pub summary: Summary,
    pub stop: StopTimes,
    pub exit_code: i32,
    pub cuts: Vec<String>,
    pub duplicates: Vec<String>,
    pub retried_unexecuted: Vec<String>,
    /// Of `retried_unexecuted`, those that reached `s1` as it was stopped (sent from
    /// [`MAYBE_READ_BEFORE`] before the stop was issued on): it may have read them in its last
    /// instant without logging their start, which no log tells apart. Each is a duplicate or
    /// not.
    pub maybe_read: Vec<String>,
    pub aborts: Vec<String>,
    /// Of `aborts`, those nginx logged a try on `s2` for that `s2` never read (its own log):
    /// their client left while nginx connected there, and nginx closed that connection
    /// before sending the request. Not retried: done once at most.
    pub dropped_retries: Vec<String>,
    /// Requests the client saw fail (any reason).
    pub failed: Vec<String>,
    pub unlogged: Vec<String>,
    /// The error log lines about `s1`, for the report.
    pub s1_errors: Vec<String>,
}

impl SteadyRun {
    pub fn report(&self) -> String {
        let mut s = format!(
            "steady stream: {}\nexit code {}; cuts {:?}\nduplicates {:?}\nretried unexecuted {:?} (maybe read as s1 died: {:?})\naborts {:?} (tried on s2, never read there: {:?})\nfailed {:?}\n",
            self.summary,
            self.exit_code,
            self.cuts,
            self.duplicates,
            self.retried_unexecuted,
            self.maybe_read,
            self.aborts,
            self.dropped_retries,
            self.failed
        );
        for l in &self.s1_errors {
            s += &format!("  {l}\n");
        }
        s
    }
}

impl RetryLab {
    /// Runs `stream` through nginx, stops `s1` `stream.stop_after` into it, and reads the
    /// ground truth. Once per lab (`s1` is gone afterwards).
    pub fn run_steady(&self, stream: &Stream) -> SteadyRun {
        self.s1.require_route();
        self.s2.require_route();
        let (schedule, anchor) = stream.schedule();
        let last = schedule.dispatch_at(stream.waves - 1, 9);
        assert!(
            last + Duration::from_millis(stream.ms + 1000) < anchor + self.spec.nginx.fail_timeout,
            "the stream outlasts fail_timeout after the stop: nginx would try s1 again"
        );
        let load = Load::start_with(self.nginx.frontend, schedule, &self.tag, stream.method);
        clock::sleep_until(anchor);
        let stop = self.s1.stop(self.spec.grace_secs);
        let records = load.wait();
        let exit_code = self.s1.exit_code();
        let ids: Vec<&str> = records.iter().map(|r| r.id.as_str()).collect();
        let mut access = self.nginx.wait_logged(&ids, Duration::from_secs(5));
        let (s1_work, s2_work) = (self.s1.work_log(), self.s2.work_log());
        let s1_addr = self.s1.addr().to_string();
        let s1_errors: Vec<String> = self
            .nginx
            .error_log()
            .lines()
            .filter(|l| l.contains(&format!("upstream: \"http://{s1_addr}/")))
            .map(str::to_string)
            .collect();
        let started = |work: &[WorkEntry]| -> BTreeSet<String> {
            work.iter()
                .filter(|w| w.started)
                .map(|w| w.id.clone())
                .collect()
        };
        let (on_s1, on_s2) = (started(&s1_work), started(&s2_work));
        let mut unlogged = Vec::new();
        let requests: Vec<SteadyRequest> = records
            .into_iter()
            .map(|record| {
                let entry = access.remove(&record.id);
                if entry.is_none() {
                    unlogged.push(record.id.clone());
                }
                let upstreams: Vec<String> = entry
                    .iter()
                    .flat_map(|e| &e.upstream_addrs)
                    .map(|a| self.nginx.server_name(a).unwrap_or(a).to_string())
                    .collect();
                let id_arg = format!("&id={} ", record.id);
                // Not nginx's own close when the client left first ("client prematurely
                // closed connection, so upstream connection is closed too"), logged in the
                // same phase.
                let cut_on_s1 = s1_errors.iter().any(|l| {
                    l.contains(&id_arg)
                        && l.contains("while reading response header from upstream")
                        && !l.contains("client prematurely closed")
                });
                SteadyRequest {
                    started_on_s1: on_s1.contains(&record.id),
                    started_on_s2: on_s2.contains(&record.id),
                    access: entry,
                    upstreams,
                    cut_on_s1,
                    record,
                }
            })
            .collect();
        let ids_where = |f: &dyn Fn(&SteadyRequest) -> bool| -> Vec<String> {
            requests
                .iter()
                .filter(|r| f(r))
                .map(|r| r.record.id.clone())
                .collect()
        };
        // Re-sent to `s2`: nginx tried it and `s2` read it. nginx logs a try of `s2` for a
        // request it dropped before sending it there (its client gone during the connect).
        let tried_s2 = |r: &SteadyRequest| r.upstreams.len() > 1;
        let retried = |r: &SteadyRequest| tried_s2(r) && r.started_on_s2;
        let cuts = ids_where(&|r| r.cut_on_s1);
        let duplicates = ids_where(&|r| r.cut_on_s1 && retried(r) && r.started_on_s1);
        let retried_unexecuted = ids_where(&|r| r.cut_on_s1 && retried(r) && !r.started_on_s1);
        let late = stop.issued - MAYBE_READ_BEFORE;
        let maybe_read =
            ids_where(&|r| r.cut_on_s1 && retried(r) && !r.started_on_s1 && r.record.start >= late);
        let aborts = ids_where(&|r| r.cut_on_s1 && !retried(r));
        let dropped_retries = ids_where(&|r| r.cut_on_s1 && tried_s2(r) && !r.started_on_s2);
        let failed = ids_where(&|r| r.record.outcome != Outcome::Ok);
        let recs: Vec<RequestRecord> = requests.iter().map(|r| r.record.clone()).collect();
        SteadyRun {
            summary: summarize(&recs),
            requests,
            stop,
            exit_code,
            cuts,
            duplicates,
            retried_unexecuted,
            maybe_read,
            aborts,
            dropped_retries,
            failed,
            unlogged,
            s1_errors,
        }
    }
}
