//! The stop lab over randomized shapes: each seed draws how `s1` behaves on its stop (each
//! backend mode, a grace period, a drain delay, a request longer than the grace), the load
//! (requests per wave, their work, the waves' period and count, when the stop comes in the
//! wave) and HAProxy's checks (interval, fall, where the stop falls between two checks). The
//! stop record is compared with what the client, HAProxy's log and `chkfail`, `s1`'s own logs
//! and podman saw. Also the truth of the fixed stop tests (`tests/tests/stops.rs`).

use std::{
    fmt,
    time::{Duration, Instant},
};

use serde_json::Value;

use super::{Check, loss};
use crate::{
    agent::{instant, stop_record},
    lab::{ConnMode, Lab, Mode, ScenarioRun, ScenarioSpec, Trigger, clock::secs_since},
};

/// One randomized stop.
#[derive(Clone, Debug)]
pub struct StopShape {
    pub seed: u64,
    pub spec: ScenarioSpec,
}

impl StopShape {
    pub fn from_seed(seed: u64) -> StopShape {
        let mut rng = fastrand::Rng::with_seed(seed);
        let ms =
            |rng: &mut fastrand::Rng, lo: u64, hi: u64| Duration::from_millis(rng.u64(lo..=hi));
        let modes = [
            Mode::NoHandler,
            Mode::ExitZero,
            Mode::CloseListener,
            Mode::Drain,
            Mode::Slow,
            Mode::Crash,
        ];
        let mode = modes[rng.usize(0..modes.len())];
        let trigger = match mode {
            Mode::Crash => Trigger::Crash,
            _ => Trigger::Stop {
                grace_secs: rng.u32(3..=8),
            },
        };
        let mut spec = ScenarioSpec::new(mode, trigger);
        spec.remove_when_down = true;
        spec.per_wave = 2 * rng.usize(1..=3);
        spec.request_ms = rng.u64(200..=1400);
        spec.period = ms(&mut rng, 400, 2000);
        spec.waves_before = rng.usize(1..=3);
        spec.waves_after = rng.usize(2..=5);
        spec.haproxy.inter = ms(&mut rng, 1000, 2000);
        spec.haproxy.fall = rng.u32(2..=3);
        // The stop between two checks, at least 100 ms from either.
        let inter = spec.haproxy.inter.as_millis() as u64;
        spec.check_offset = ms(&mut rng, 100, inter - 100);
        // The stop while the stop wave is in flight, at least 50 ms from its start and end.
        spec.stop_lead = ms(&mut rng, 50, spec.request_ms - 50);
        match (mode, trigger) {
            (Mode::Drain, _) => spec.backend.drain_delay = Some(ms(&mut rng, 500, 6000)),
            (Mode::Slow, Trigger::Stop { grace_secs }) => {
                spec.backend.drain_delay = Some(ms(&mut rng, 0, 3000));
                // Half the time one request outlives the grace period: SIGKILL.
                if rng.bool() {
                    spec.long_request_ms =
                        Some(u64::from(grace_secs) * 1000 + rng.u64(1000..=3000));
                }
            }
            _ => {}
        }
        // Drawn last, so the shapes above stay those of the seeds found before.
        spec.stagger = ms(&mut rng, 20, 150);
        if rng.bool() {
            spec.jitter = ms(&mut rng, 1, spec.stagger.as_millis() as u64 - 10);
            spec.jitter_seed = rng.u64(..);
        }
        if rng.bool() {
            spec.haproxy.conn_mode = ConnMode::KeepAlive;
        }
        StopShape { seed, spec }
    }
}

impl fmt::Display for StopShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.spec;
        write!(
            f,
            "stop seed {}: {:?} {:?}, drain delay {:?}, {} waves of {} × {} ms every {} ms, \
             stop {} ms into wave {}, long request {:?}, checks every {} ms (fall {}), stop {} ms after one, \
             requests {} ms apart (late by up to {} ms), {:?}",
            self.seed,
            s.mode,
            s.trigger,
            s.backend.drain_delay,
            s.waves_before + 1 + s.waves_after,
            s.per_wave,
            s.request_ms,
            s.period.as_millis(),
            s.stop_lead.as_millis(),
            s.waves_before,
            s.long_request_ms,
            s.haproxy.inter.as_millis(),
            s.haproxy.fall,
            s.check_offset.as_millis(),
            s.stagger.as_millis(),
            s.jitter.as_millis(),
            s.haproxy.conn_mode
        )
    }
}

/// Runs `shape` with a fresh agent and compares.
pub fn run(shape: &StopShape) -> Vec<Check> {
    let agent = super::start_agent();
    let lab = Lab::setup(shape.spec.clone());
    let run = lab.run();
    print!("{}", run.report());
    assert!(
        run.unlogged.is_empty(),
        "HAProxy did not log {:?}",
        run.unlogged
    );
    let stop = stop_record(&agent, &lab.s1.id);
    println!("drainwatch: {stop:#}");
    checks(&lab, &run, &stop)
}

/// Health checks that failed: HAProxy's failed checks of `s1` minus those `s1` answered
/// failing (503 once not ready), from its own log.
pub fn failed_checks(lab: &Lab) -> u64 {
    let failed = lab
        .haproxy
        .failed_checks("s1")
        .expect("HAProxy's chkfail for s1");
    let answered_failing = lab
        .s1
        .health_checks()
        .iter()
        .filter(|(_, status)| *status != 200)
        .count() as u64;
    failed - answered_failing
}

/// When the stop signal reached `s1`, as far as the lab knows: after `podman stop` was
/// issued (5 ms for clock granularity) and before it returned and before `s1` logged it.
fn sigterm_bounds(run: &ScenarioRun) -> Option<(Instant, Instant)> {
    let st = run.stop.as_ref()?;
    let hi = run.sigterm_at.map_or(st.returned, |l| l.min(st.returned));
    Some((st.issued - Duration::from_millis(5), hi))
}

/// Connections `s1` held open at `t` (checks and idle keep-alive ones too), from its own log.
fn open_at(run: &ScenarioRun, t: Instant) -> u64 {
    run.s1_conns
        .iter()
        .filter(|c| c.opened <= t && c.closed.is_none_or(|c| c > t))
        .count() as u64
}

/// The range of `count(t)` for `t` in `lo..=hi`: it changes only at connection events, so its
/// value at both ends and at every event between covers it.
fn range_over(
    run: &ScenarioRun,
    lo: Instant,
    hi: Instant,
    count: impl Fn(Instant) -> u64,
) -> (u64, u64) {
    let values: Vec<u64> = [lo, hi]
        .into_iter()
        .chain(
            run.s1_conns
                .iter()
                .flat_map(|c| [Some(c.opened), c.closed])
                .flatten()
                .filter(|&at| at > lo && at < hi),
        )
        .map(count)
        .collect();
    (
        values.iter().copied().min().unwrap_or(0),
        values.iter().copied().max().unwrap_or(0),
    )
}

/// The outcome from what the process did (README: outcomes), as podman and `s1`'s own logs
/// and the client's refusals tell it.
fn outcome_truth(lab: &Lab, run: &ScenarioRun) -> &'static str {
    let event = |kind: &str| run.s1_events.iter().find(|e| e.kind == kind).map(|e| e.at);
    if lab.spec.trigger == Trigger::Crash {
        return "crashed";
    }
    match run.exit_code {
        137 => return "killed_at_deadline",
        143 => return "exit_at_once",
        _ => {}
    }
    let served_on = match (event("sigterm"), run.exit_logged_at) {
        (Some(term), Some(exit)) => secs_since(term, exit) > 1.0,
        _ => true,
    };
    if event("listener-closed").is_none() && !served_on {
        return "exit_at_once";
    }
    if run.summary.count("refused") > 0 {
        "listener_closed_early"
    } else {
        "drained"
    }
}

/// Every field of `stop` the lab's ground truth knows.
pub fn checks(lab: &Lab, run: &ScenarioRun, stop: &Value) -> Vec<Check> {
    let failed = failed_checks(lab);
    let probes =
        loss(stop, "probes.cut") + loss(stop, "probes.refused") + loss(stop, "probes.unreachable");
    let mut checks = vec![
        Check::eq(
            "container.name",
            lab.s1.container.as_str(),
            stop["container"]["name"].as_str().unwrap_or("-"),
        ),
        Check::eq("exit_code", run.exit_code, &stop["exit_code"]),
        Check::eq(
            "outcome",
            outcome_truth(lab, run),
            stop["outcome"].as_str().unwrap_or("-"),
        ),
        Check::eq(
            "inflight_cut",
            run.summary.count("cut"),
            loss(stop, "inflight_cut"),
        ),
        Check::eq(
            "refused",
            run.summary.count("refused"),
            loss(stop, "refused"),
        ),
        Check::eq(
            "unreachable (the holder keeps the address)",
            0,
            loss(stop, "unreachable"),
        ),
        // Requests of every length, keep-alive connections, health checks: no stream.
        Check::eq("streams_cut (no streams)", 0, loss(stop, "streams_cut")),
        Check::eq("probes (all failed checks)", failed, probes),
        Check::eq(
            "probes.by_schedule",
            failed,
            loss(stop, "probes.by_schedule"),
        ),
    ];
    let exit = instant(&stop["exit_at"]);
    if let (Some(exit), Some(logged)) = (exit, run.exit_logged_at) {
        checks.push(Check::within(
            "exit_at - s1's logged exit (s)",
            -0.05,
            0.05,
            secs_since(logged, exit),
        ));
    }
    let term = instant(&stop["sigterm_at"]);
    match (sigterm_bounds(run), term) {
        (None, _) => checks.push(Check::eq(
            "sigterm_at (none was sent)",
            "null",
            &stop["sigterm_at"],
        )),
        (Some(_), None) => checks.push(Check::eq("sigterm_at", "an instant", "null")),
        (Some((lo, hi)), Some(term)) => {
            checks.push(Check::within(
                "sigterm_at - podman stop issued (s)",
                secs_since(lo, lo),
                secs_since(lo, hi),
                secs_since(lo, term),
            ));
            checks.push(Check::eq(
                "sigterm_sender.comm",
                "runc",
                stop["sigterm_sender"]["comm"].as_str().unwrap_or("-"),
            ));
            let end = run.exit_logged_at.unwrap_or_else(Instant::now);
            // Connections that carried requests, not checks.
            let accepted_after = |t: Instant| {
                run.s1_conns
                    .iter()
                    .filter(|c| !c.check && c.opened > t && c.opened < end)
                    .count() as u64
            };
            checks.push(Check::count(
                "accepted_after_sigterm",
                range_over(run, lo, hi, accepted_after),
                loss(stop, "accepted_after_sigterm"),
            ));
            checks.push(Check::count(
                "connections_at_sigterm",
                range_over(run, lo, hi, |t| open_at(run, t)),
                stop["connections_at_sigterm"].as_u64().unwrap_or(u64::MAX),
            ));
        }
    }
    checks
}
