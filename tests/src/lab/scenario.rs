//! A whole deploy-stop scenario: two backends behind HAProxy, a scheduled load, backend `s1`
//! stopped (or crashing) at a planned instant, and the exact client-side ground truth.
//!
//! Determinism comes from planning every boundary in advance, far from every other:
//! - the *anchor* `A` (stop command issued, or crash) is put `check_offset` (0.5 s) after one
//!   of HAProxy's health checks of `s1` (checks are read from the backend's own log, on the
//!   same clock), so the first failing check is at `A + inter - 0.5 s` and HAProxy marks `s1`
//!   DOWN at `D = A + fall × inter - 0.5 s` (3.5 s with the defaults);
//! - waves are `period` (1.5 s) apart, the *stop wave* `stop_lead` (0.3 s) before `A`, so
//!   its requests are in flight from `A - 0.3 s` to `A + 1.0 s` while no other wave is, and
//!   the waves after it leave at `A + 1.2 s`, `A + 2.7 s` (before `D`, routed to `s1`) and
//!   `A + 4.2 s`, `A + 5.7 s` (after `D`, all to `s2`): every wave is ≥ 0.7 s from `D`;
//! - the roundrobin rotation is primed so slot 0 of every wave goes to `s1`: with 4 requests a
//!   wave, slots 0 and 2 go to `s1`, 1 and 3 to `s2`, while `s1` is UP.

use std::time::{Duration, Instant};

use super::{
    client::{self, Load, Outcome, RequestRecord, Schedule, Summary},
    clock::{self, secs_since},
    container::{
        Backend, BackendOpts, ConnEntry, Mode, ServerEvent, StopTimes, WorkEntry, unique_name,
    },
    haproxy::{Haproxy, HaproxyOpts},
};

/// Health checks of `s1` before its stop is planned: drainwatch learns a balancer's check
/// schedule from four in a row (README: health checks), as a balancer that has run for more
/// than a few seconds has made; before that, no tool can tell its checks from requests.
pub const WARM_CHECKS: usize = 4;

/// What ends backend `s1`'s life at the anchor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// `podman stop -t grace_secs` issued at the anchor.
    Stop { grace_secs: u32 },
    /// The backend (mode `Crash`) exits with code 1 by itself at the anchor.
    Crash,
}

/// Everything that defines a scenario. [`ScenarioSpec::new`] gives the lab's timings.
#[derive(Clone, Debug)]
pub struct ScenarioSpec {
    /// `s1`'s mode (`s2` always drains properly and is never stopped).
    pub mode: Mode,
    pub trigger: Trigger,
    /// How `s1` is run.
    pub backend: BackendOpts,
    /// Requests per wave (even, so the roundrobin rotation is the same at every wave).
    pub per_wave: usize,
    /// Work per request.
    pub request_ms: u64,
    /// Between two requests of a wave.
    pub stagger: Duration,
    /// Each request of the load leaves up to this late (below `stagger`), drawn from
    /// `jitter_seed`: arrivals off the beat.
    pub jitter: Duration,
    pub jitter_seed: u64,
    /// Between two waves.
    pub period: Duration,
    /// Waves before the stop wave.
    pub waves_before: usize,
    /// Waves after the stop wave.
    pub waves_after: usize,
    /// The stop wave leaves this long before the anchor.
    pub stop_lead: Duration,
    /// The anchor is this long after a health check of `s1`.
    pub check_offset: Duration,
    /// If set, slot 0 of the stop wave (routed to `s1`) works this long instead.
    pub long_request_ms: Option<u64>,
    /// Once HAProxy marks `s1` DOWN, put it in maintenance: the endpoint is removed from the
    /// balancer (as Kubernetes removes a terminating pod's endpoint), so no more health checks
    /// reach its address.
    pub remove_when_down: bool,
    pub haproxy: HaproxyOpts,
}

impl ScenarioSpec {
    /// The lab's timings: 4 requests of 1.3 s per wave, waves 1.5 s apart, 2 before and 4
    /// after the stop wave (28 requests), the anchor 0.3 s after the stop wave and 0.5 s after
    /// a health check.
    pub fn new(mode: Mode, trigger: Trigger) -> ScenarioSpec {
        ScenarioSpec {
            mode,
            trigger,
            backend: BackendOpts::default(),
            per_wave: 4,
            request_ms: 1300,
            stagger: client::STAGGER,
            jitter: Duration::ZERO,
            jitter_seed: 0,
            period: Duration::from_millis(1500),
            waves_before: 2,
            waves_after: 4,
            stop_lead: Duration::from_millis(300),
            check_offset: Duration::from_millis(500),
            long_request_ms: None,
            remove_when_down: false,
            haproxy: HaproxyOpts::default(),
        }
    }
}

/// The planned timeline of one run.
#[derive(Clone, Debug)]
pub struct Plan {
    /// When the stop command is issued, or the crash happens.
    pub anchor: Instant,
    /// The health check of `s1` the anchor was placed after.
    pub check_before_anchor: Instant,
    /// Measured interval between two checks of `s1`.
    pub check_period: Duration,
    /// When HAProxy should mark `s1` DOWN.
    pub predicted_down: Instant,
    pub schedule: Schedule,
    /// Index of the wave in flight at the anchor.
    pub stop_wave: usize,
}

/// The ground truth of one run.
#[derive(Debug)]
pub struct ScenarioRun {
    pub plan: Plan,
    /// The requests that primed the rotation (all `ok`, before the load).
    pub primer: Vec<RequestRecord>,
    /// The load's requests, in schedule order, annotated from HAProxy's log.
    pub records: Vec<RequestRecord>,
    pub summary: Summary,
    /// For `Trigger::Stop`: when `podman stop` was issued and returned.
    pub stop: Option<StopTimes>,
    /// When `s1` logged SIGTERM (handler modes only: a handler-less server cannot log it).
    pub sigterm_at: Option<Instant>,
    /// When `s1` logged its own exit (`exit` or `crash`), if it did.
    pub exit_logged_at: Option<Instant>,
    /// `s1`'s container exit code.
    pub exit_code: i32,
    /// When HAProxy logged `s1` DOWN.
    pub down_at: Option<Instant>,
    /// `s1`'s request log and lifecycle events.
    pub s1_work: Vec<WorkEntry>,
    pub s1_events: Vec<ServerEvent>,
    /// The connections `s1` accepted.
    pub s1_conns: Vec<ConnEntry>,
    /// Request ids HAProxy did not log (should be empty).
    pub unlogged: Vec<String>,
}

impl ScenarioRun {
    /// Ids of requests routed to `server` with outcome `label`.
    pub fn ids(&self, server: &str, label: &str) -> Vec<&str> {
        self.records
            .iter()
            .filter(|r| r.backend() == Some(server) && r.outcome.label() == label)
            .map(|r| r.id.as_str())
            .collect()
    }

    /// Records with outcome `label`.
    pub fn with_outcome(&self, label: &str) -> Vec<&RequestRecord> {
        self.records
            .iter()
            .filter(|r| r.outcome.label() == label)
            .collect()
    }

    /// HAProxy termination flags seen per outcome label.
    pub fn flags_by_outcome(&self) -> std::collections::BTreeMap<String, Vec<String>> {
        let mut m: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for r in &self.records {
            let v = m.entry(r.outcome.label()).or_default();
            let f = r.flags.clone().unwrap_or_else(|| "?".into());
            if !v.contains(&f) {
                v.push(f);
            }
        }
        m
    }

    /// The ground truth as text: timeline (seconds from the anchor), counts, every non-ok request.
    pub fn report(&self) -> String {
        let a = self.plan.anchor;
        let t = |i: Instant| format!("{:+.3}s", secs_since(a, i));
        let opt = |i: Option<Instant>| i.map_or("-".to_string(), t);
        let mut s = String::new();
        s += &format!(
            "timeline (A = anchor): check {} (period {:.3}s); ",
            t(self.plan.check_before_anchor),
            self.plan.check_period.as_secs_f64()
        );
        if let Some(st) = &self.stop {
            s += &format!("stop issued {} returned {}; ", t(st.issued), t(st.returned));
        }
        s += &format!(
            "sigterm logged {}; exit logged {}; DOWN predicted {} seen {}; exit code {}\n",
            opt(self.sigterm_at),
            opt(self.exit_logged_at),
            t(self.plan.predicted_down),
            opt(self.down_at),
            self.exit_code
        );
        s += "waves at:";
        for (i, w) in self.plan.schedule.waves.iter().enumerate() {
            let mark = if i == self.plan.stop_wave { "*" } else { "" };
            s += &format!(" {}{mark}", t(w.at));
        }
        s += "\n";
        s += &format!("ground truth: {}\n", self.summary);
        s += &format!("HAProxy flags by outcome: {:?}\n", self.flags_by_outcome());
        let late = self
            .records
            .iter()
            .map(|r| r.lateness())
            .max()
            .unwrap_or_default();
        s += &format!(
            "max dispatch lateness: {:.1} ms\n",
            late.as_secs_f64() * 1e3
        );
        for r in self.records.iter().filter(|r| r.outcome != Outcome::Ok) {
            s += &format!(
                "  {} -> {} {:?} {} [{} .. {}]\n",
                r.id,
                r.backend().unwrap_or("?"),
                r.status,
                r.flags.as_deref().unwrap_or("?"),
                t(r.start),
                t(r.end)
            );
        }
        s
    }
}

/// Two backends (`s1` in the scenario's mode, `s2` draining properly) behind HAProxy.
/// Dropping it stops HAProxy and removes the containers.
pub struct Lab {
    pub spec: ScenarioSpec,
    // Field order is drop order: HAProxy first, then the containers.
    pub haproxy: Haproxy,
    pub s1: Backend,
    pub s2: Backend,
    /// Prefix of every request id of this lab.
    pub tag: String,
}

impl Lab {
    /// Starts both backends and HAProxy, and waits until both servers are UP at full health.
    pub fn setup(spec: ScenarioSpec) -> Lab {
        assert!(
            spec.per_wave >= 2 && spec.per_wave.is_multiple_of(2),
            "per_wave must be even"
        );
        if spec.trigger == Trigger::Crash {
            assert_eq!(spec.mode, Mode::Crash, "Trigger::Crash needs Mode::Crash");
        }
        let s1 = Backend::start("s1", spec.mode, spec.backend.clone());
        let s2 = Backend::start("s2", Mode::Drain, BackendOpts::default());
        let haproxy = Haproxy::start(
            &[("s1", s1.addr()), ("s2", s2.addr())],
            spec.haproxy.clone(),
        );
        Lab {
            spec,
            haproxy,
            s1,
            s2,
            tag: unique_name("load"),
        }
    }

    /// Sends `ms=0` requests (at most 4) until one is answered by `s2`, so the next request
    /// HAProxy routes goes to `s1`. Returns them.
    pub fn prime(&self) -> Vec<RequestRecord> {
        client::prime(self.haproxy.frontend, &self.tag)
    }

    /// Plans the anchor and the schedule from `s1`'s health checks (waits, bounded, for
    /// [`WARM_CHECKS`]).
    pub fn plan(&self) -> Plan {
        let spec = &self.spec;
        let deadline = Instant::now() + spec.haproxy.inter * (WARM_CHECKS as u32 + 2);
        let checks = loop {
            let c = self.s1.health_checks();
            if c.len() >= WARM_CHECKS {
                break c;
            }
            assert!(
                Instant::now() < deadline,
                "s1 saw fewer than {WARM_CHECKS} health checks: {c:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(
            checks.iter().all(|c| c.1 == 200),
            "s1 failed a health check before the stop: {checks:?}"
        );
        let (prev, last) = (checks[checks.len() - 2].0, checks[checks.len() - 1].0);
        let period = last - prev;
        let inter = spec.haproxy.inter;
        assert!(
            period >= inter - Duration::from_millis(50) && period <= inter + inter / 10,
            "s1's health checks are {period:?} apart, expected about {inter:?}"
        );
        let lead = spec.stop_lead + spec.period * spec.waves_before as u32;
        let earliest = Instant::now() + Duration::from_millis(150) + lead;
        let mut k = 0u32;
        let mut anchor = last + spec.check_offset;
        while anchor < earliest {
            k += 1;
            anchor = last + period * k + spec.check_offset;
        }
        let predicted_down = last + period * (k + spec.haproxy.fall);
        let waves = spec.waves_before + 1 + spec.waves_after;
        let mut schedule = Schedule::periodic(
            anchor - lead,
            spec.period,
            waves,
            spec.per_wave,
            spec.request_ms,
        );
        if let Some(ms) = spec.long_request_ms {
            schedule.waves[spec.waves_before].ms[0] = ms;
        }
        schedule.stagger = spec.stagger;
        if !spec.jitter.is_zero() {
            schedule.jitter(&mut fastrand::Rng::with_seed(spec.jitter_seed), spec.jitter);
        }
        Plan {
            anchor,
            check_before_anchor: last + period * k,
            check_period: period,
            predicted_down,
            schedule,
            stop_wave: spec.waves_before,
        }
    }

    /// Primes the rotation, plans, runs the load, stops (or crashes) `s1` at the anchor, and
    /// collects the ground truth. Once per `Lab` (s1 is gone afterwards). Bounded: the
    /// schedule, the grace period, and 30 s waits.
    pub fn run(&self) -> ScenarioRun {
        self.s1.require_route();
        self.s2.require_route();
        let primer = self.prime();
        let plan = self.plan();
        if self.spec.trigger == Trigger::Crash {
            self.s1.crash_at(plan.anchor);
        }
        let load = Load::start(self.haproxy.frontend, plan.schedule.clone(), &self.tag);
        let (stop, mut records) = std::thread::scope(|scope| {
            if self.spec.remove_when_down {
                let wait = plan
                    .predicted_down
                    .saturating_duration_since(Instant::now())
                    + Duration::from_secs(10);
                scope.spawn(move || {
                    if self.haproxy.wait_down("s1", wait).is_some() {
                        let _ = self.haproxy.admin("set server be/s1 state maint");
                    }
                });
            }
            clock::sleep_until(plan.anchor);
            let stop = match self.spec.trigger {
                Trigger::Stop { grace_secs } => Some(self.s1.stop(grace_secs)),
                Trigger::Crash => None,
            };
            (stop, load.wait())
        });
        let exit_code = self.s1.exit_code();
        let down_wait = plan
            .predicted_down
            .saturating_duration_since(Instant::now())
            + Duration::from_secs(5);
        let down_at = self.haproxy.wait_down("s1", down_wait);
        let unlogged = client::annotate(&mut records, &self.haproxy, Duration::from_secs(5));
        let s1_events = self.s1.events();
        let logged = |kind: &str| s1_events.iter().find(|e| e.kind == kind).map(|e| e.at);
        ScenarioRun {
            summary: client::summarize(&records),
            sigterm_at: logged("sigterm"),
            exit_logged_at: logged("exit").or_else(|| logged("crash")),
            plan,
            primer,
            records,
            stop,
            exit_code,
            down_at,
            s1_work: self.s1.work_log(),
            s1_conns: self.s1.connections(),
            s1_events,
            unlogged,
        }
    }
}
