//! Proxy retry duplicates: two backends behind nginx, a scheduled load of slow requests, backend
//! `s1` stopped (`podman stop`) while exactly `k` requests are in flight on it, and the exact
//! ground truth of what nginx did with them.
//!
//! With nginx's default `proxy_next_upstream error timeout`, a GET whose upstream closes before
//! the response headers is sent again to `s2`: the client sees 200 (late), and the work ran
//! twice (a *duplicate*: its `start` is in both backends' logs). With `proxy_next_upstream off`,
//! or for a POST (not idempotent: not retried by default), the client gets 502 instead (an
//! *abort*) and the work ran once, cut.
//!
//! Determinism, planned in advance:
//! - nginx runs one worker, so round robin is one rotation in arrival order; requests leave
//!   40 ms apart, so they arrive in schedule order. The rotation is primed so slot 0 of every
//!   wave goes to `s1`: slots 0, 2, ... to `s1`, 1, 3, ... to `s2` (`2k` requests a wave);
//! - the *stop wave* leaves `stop_lead` (0.3 s) before the anchor `A` (`podman stop` issued),
//!   so its `k` requests on `s1` are in flight from `A - 0.3 s` to `A + 1.0 s` (1.3 s of work)
//!   while no other wave is: `s1` (no SIGTERM handler, `--init`) dies from SIGTERM within tens
//!   of ms of `A`, cutting exactly those `k`;
//! - the first cut counts as a failure of `s1` (`max_fails=1`): nginx leaves it out for
//!   `fail_timeout` (10 s), so every later request goes to `s2`; the load ends well before
//!   `A + fail_timeout` (checked by [`RetryLab::plan`]), so nginx never tries `s1`'s dead
//!   address again (it would, and that request would be retried on `s2` after a refused
//!   connect: a retry, not a duplicate).

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use super::{
    client::{self, Load, Method, Outcome, RequestRecord, Schedule, Summary},
    clock::{self, secs_since},
    container::{Backend, BackendOpts, Mode, StopTimes, WorkEntry, unique_name},
    nginx::{AccessEntry, Nginx, NginxOpts},
};

/// Everything that defines a retry scenario. [`RetrySpec::new`] gives the lab's timings.
#[derive(Clone, Debug)]
pub struct RetrySpec {
    /// How every request of the load is sent (the primer always uses GET).
    pub method: Method,
    pub nginx: NginxOpts,
    /// `k`: requests in flight on `s1` when it is stopped (a wave is `2k` requests).
    pub in_flight: usize,
    /// Work per request.
    pub request_ms: u64,
    /// Between two waves.
    pub period: Duration,
    /// Waves before the stop wave.
    pub waves_before: usize,
    /// Waves after the stop wave.
    pub waves_after: usize,
    /// The stop wave leaves this long before the anchor.
    pub stop_lead: Duration,
    /// `podman stop -t grace_secs` (`s1` dies from SIGTERM at once: no handler, `--init`).
    pub grace_secs: u32,
    /// How both backends are run (mode `NoHandler`).
    pub backend: BackendOpts,
}

impl RetrySpec {
    /// The lab's timings: `k` = 2, waves of 4 requests of 1.3 s, 1.5 s apart, 1 wave before and
    /// 2 after the stop wave (16 requests), the stop wave 0.3 s before the anchor.
    pub fn new(method: Method, next_upstream: Option<&str>) -> RetrySpec {
        RetrySpec {
            method,
            nginx: NginxOpts {
                next_upstream: next_upstream.map(str::to_string),
                ..NginxOpts::default()
            },
            in_flight: 2,
            request_ms: 1300,
            period: Duration::from_millis(1500),
            waves_before: 1,
            waves_after: 2,
            stop_lead: Duration::from_millis(300),
            grace_secs: 10,
            backend: BackendOpts::default(),
        }
    }

    /// Requests per wave.
    pub fn per_wave(&self) -> usize {
        2 * self.in_flight
    }
}

/// The planned timeline of one run.
#[derive(Clone, Debug)]
pub struct RetryPlan {
    /// When `podman stop` of `s1` is issued.
    pub anchor: Instant,
    pub schedule: Schedule,
    /// Index of the wave in flight at the anchor.
    pub stop_wave: usize,
    /// Ids of the stop wave's requests routed to `s1` (its even slots): the `k` in flight.
    pub in_flight_on_s1: Vec<String>,
}

/// One request's ground truth, from the client, nginx's access log and both backends' logs.
#[derive(Clone, Debug)]
pub struct RetryRequest {
    /// What the client saw. `server` is nginx's first choice (the rotation's), `x_backend` the
    /// backend that answered.
    pub record: RequestRecord,
    /// nginx's access log line.
    pub access: Option<AccessEntry>,
    /// Names of the upstreams nginx tried, in order (from `$upstream_addr`; an address that is
    /// no server is kept as is).
    pub upstreams: Vec<String>,
    /// When each backend logged `start` of this request (`(name, at)`, in time order).
    pub started: Vec<(String, Instant)>,
    /// Backends that logged `end` of this request.
    pub ended: Vec<String>,
}

impl RetryRequest {
    /// Client latency: from starting to connect to the complete response (or the failure).
    pub fn latency(&self) -> Duration {
        self.record.end - self.record.start
    }

    /// When `backend` logged the start of this request.
    pub fn started_on(&self, backend: &str) -> Option<Instant> {
        self.started
            .iter()
            .find(|(b, _)| b == backend)
            .map(|(_, t)| *t)
    }

    /// Executed twice: started on both backends.
    pub fn duplicate(&self) -> bool {
        self.started_on("s1").is_some() && self.started_on("s2").is_some()
    }
}

/// The ground truth of one run.
#[derive(Debug)]
pub struct RetryRun {
    pub plan: RetryPlan,
    /// The requests that primed the rotation (all `ok`, before the load).
    pub primer: Vec<RequestRecord>,
    /// The load's requests, in schedule order.
    pub requests: Vec<RetryRequest>,
    /// Client outcomes per first-choice server.
    pub summary: Summary,
    pub stop: StopTimes,
    /// `s1`'s container exit code (143: SIGTERM).
    pub exit_code: i32,
    /// Ids whose `start` is in both `s1`'s and `s2`'s work log: executed twice.
    pub duplicates: Vec<String>,
    /// Ids the client saw as 502 or 504 (or a client timeout).
    pub aborts: Vec<String>,
    /// Ids nginx sent to more than one upstream (`$upstream_addr` has two entries).
    pub retried: Vec<String>,
    /// For each duplicate: from its start on `s1` to its start on `s2` (the backends' logs).
    pub retry_added_latency: BTreeMap<String, Duration>,
    pub s1_work: Vec<WorkEntry>,
    pub s2_work: Vec<WorkEntry>,
    /// Request ids nginx did not log (should be empty).
    pub unlogged: Vec<String>,
}

impl RetryRun {
    /// The request with id `id`.
    pub fn request(&self, id: &str) -> Option<&RetryRequest> {
        self.requests.iter().find(|r| r.record.id == id)
    }

    /// The ground truth as text: timeline (seconds from the anchor), counts, every request
    /// that was not a plain single-upstream 200.
    pub fn report(&self) -> String {
        let a = self.plan.anchor;
        let t = |i: Instant| format!("{:+.3}s", secs_since(a, i));
        let mut s = format!(
            "timeline (A = podman stop issued): stop returned {}; exit code {}\n",
            t(self.stop.returned),
            self.exit_code
        );
        s += "waves at:";
        for (i, w) in self.plan.schedule.waves.iter().enumerate() {
            let mark = if i == self.plan.stop_wave { "*" } else { "" };
            s += &format!(" {}{mark}", t(w.at));
        }
        s += &format!(
            "\nground truth: {}\nduplicates {:?}\naborts {:?}\nretried {:?}\n",
            self.summary, self.duplicates, self.aborts, self.retried
        );
        for r in &self.requests {
            let plain = r.record.outcome == Outcome::Ok && r.upstreams.len() == 1;
            if plain {
                continue;
            }
            let starts: Vec<String> = r
                .started
                .iter()
                .map(|(b, at)| format!("{b}@{}", t(*at)))
                .collect();
            s += &format!(
                "  {} {:?} {:?} via {:?} (status {:?}) started [{}] ended {:?} \
                 [{} .. {}] latency {:.3}s\n",
                r.record.id,
                r.record.outcome,
                r.record.status,
                r.upstreams,
                r.access.as_ref().map(|e| e.upstream_statuses.clone()),
                starts.join(", "),
                r.ended,
                t(r.record.start),
                t(r.record.end),
                r.latency().as_secs_f64()
            );
        }
        for (id, d) in &self.retry_added_latency {
            s += &format!("  retry added {:.3}s to {id}\n", d.as_secs_f64());
        }
        s
    }
}

/// Two backends (`s1`, `s2`, both `NoHandler` with `--init` and a network holder) behind nginx.
/// Dropping it stops nginx and removes the containers.
pub struct RetryLab {
    pub spec: RetrySpec,
    // Field order is drop order: nginx first, then the containers.
    pub nginx: Nginx,
    pub s1: Backend,
    pub s2: Backend,
    /// Prefix of every request id of this lab.
    pub tag: String,
}

impl RetryLab {
    /// Starts both backends and nginx (ready, with one worker).
    pub fn setup(spec: RetrySpec) -> RetryLab {
        assert!(spec.in_flight >= 1, "in_flight must be at least 1");
        assert!(
            spec.backend.init,
            "s1 must run with --init to die from SIGTERM"
        );
        let s1 = Backend::start("s1", Mode::NoHandler, spec.backend.clone());
        let s2 = Backend::start("s2", Mode::NoHandler, spec.backend.clone());
        let nginx = Nginx::start(&[("s1", s1.addr()), ("s2", s2.addr())], spec.nginx.clone());
        RetryLab {
            spec,
            nginx,
            s1,
            s2,
            tag: unique_name("retry"),
        }
    }

    /// Sends `ms=0` GETs (at most 4) until one is answered by `s2`, so the next request nginx
    /// routes goes to `s1`. Returns them.
    pub fn prime(&self) -> Vec<RequestRecord> {
        client::prime(self.nginx.frontend, &self.tag)
    }

    /// Plans the anchor and the schedule, starting about 0.2 s from now. Panics if the load
    /// would outlast `fail_timeout` after the anchor (nginx would try `s1` again).
    pub fn plan(&self) -> RetryPlan {
        let spec = &self.spec;
        let lead = spec.stop_lead + spec.period * spec.waves_before as u32;
        let anchor = Instant::now() + Duration::from_millis(200) + lead;
        let waves = spec.waves_before + 1 + spec.waves_after;
        let schedule = Schedule::periodic(
            anchor - lead,
            spec.period,
            waves,
            spec.per_wave(),
            spec.request_ms,
        );
        let stop_wave = spec.waves_before;
        let last_sent = schedule.dispatch_at(waves - 1, spec.per_wave() - 1);
        assert!(
            last_sent + Duration::from_secs(1) < anchor + spec.nginx.fail_timeout,
            "the load outlasts fail_timeout after the stop: nginx would try s1 again"
        );
        let stop_end = schedule.dispatch_at(stop_wave, 0) + Duration::from_millis(spec.request_ms);
        assert!(
            stop_end > anchor + Duration::from_millis(500),
            "the stop wave must still be in flight well after the stop"
        );
        if spec.waves_after > 0 {
            assert!(
                schedule.dispatch_at(stop_wave + 1, 0) > anchor + Duration::from_millis(500),
                "the wave after the stop leaves too early"
            );
        }
        if spec.waves_before > 0 {
            let prev_end = schedule.dispatch_at(stop_wave - 1, spec.per_wave() - 1)
                + Duration::from_millis(spec.request_ms);
            assert!(
                prev_end + Duration::from_millis(100) < anchor,
                "the wave before the stop is still in flight at the stop"
            );
        }
        RetryPlan {
            anchor,
            in_flight_on_s1: (0..spec.per_wave())
                .step_by(2)
                .map(|s| format!("{}-w{stop_wave}-s{s}", self.tag))
                .collect(),
            schedule,
            stop_wave,
        }
    }

    /// Primes the rotation, plans, runs the load, stops `s1` at the anchor and collects the
    /// ground truth. Once per `RetryLab` (`s1` is gone afterwards). Bounded: the schedule, the
    /// grace period and 30 s waits.
    pub fn run(&self) -> RetryRun {
        self.s1.require_route();
        self.s2.require_route();
        let primer = self.prime();
        let plan = self.plan();
        let load = Load::start_with(
            self.nginx.frontend,
            plan.schedule.clone(),
            &self.tag,
            self.spec.method,
        );
        clock::sleep_until(plan.anchor);
        let stop = self.s1.stop(self.spec.grace_secs);
        let records = load.wait();
        let exit_code = self.s1.exit_code();
        let ids: Vec<&str> = records.iter().map(|r| r.id.as_str()).collect();
        let mut access = self.nginx.wait_logged(&ids, Duration::from_secs(5));
        let (s1_work, s2_work) = (self.s1.work_log(), self.s2.work_log());
        let mut unlogged = Vec::new();
        let requests: Vec<RetryRequest> = records
            .into_iter()
            .map(|mut record| {
                let entry = access.remove(&record.id);
                if entry.is_none() {
                    unlogged.push(record.id.clone());
                }
                let upstreams: Vec<String> = entry
                    .iter()
                    .flat_map(|e| &e.upstream_addrs)
                    .map(|a| self.nginx.server_name(a).unwrap_or(a).to_string())
                    .collect();
                record.server = upstreams.first().cloned();
                let mut started = Vec::new();
                let mut ended = Vec::new();
                for (name, work) in [("s1", &s1_work), ("s2", &s2_work)] {
                    for w in work.iter().filter(|w| w.id == record.id) {
                        if w.started {
                            started.push((name.to_string(), w.at));
                        } else {
                            ended.push(name.to_string());
                        }
                    }
                }
                started.sort_by_key(|(_, at)| *at);
                RetryRequest {
                    record,
                    access: entry,
                    upstreams,
                    started,
                    ended,
                }
            })
            .collect();
        let ids_where = |f: &dyn Fn(&RetryRequest) -> bool| -> Vec<String> {
            requests
                .iter()
                .filter(|r| f(r))
                .map(|r| r.record.id.clone())
                .collect()
        };
        let duplicates = ids_where(&|r| r.duplicate());
        let aborts = ids_where(&|r| matches!(r.record.outcome, Outcome::Cut | Outcome::Timeout));
        let retried = ids_where(&|r| r.upstreams.len() > 1);
        let retry_added_latency = requests
            .iter()
            .filter(|r| r.duplicate())
            .filter_map(|r| {
                let d = r
                    .started_on("s2")?
                    .checked_duration_since(r.started_on("s1")?)?;
                Some((r.record.id.clone(), d))
            })
            .collect();
        let records: Vec<RequestRecord> = requests.iter().map(|r| r.record.clone()).collect();
        RetryRun {
            summary: client::summarize(&records),
            plan,
            primer,
            requests,
            stop,
            exit_code,
            duplicates,
            aborts,
            retried,
            retry_added_latency,
            s1_work,
            s2_work,
            unlogged,
        }
    }
}
