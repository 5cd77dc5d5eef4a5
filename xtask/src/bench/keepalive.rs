//! The keep-alive phase: the workload peers publish their overhead on (an HTTP server under
//! load from 100 persistent connections), inside a podman container's network namespace as
//! the pod rows run: nothing attached, the agent at its defaults and its hooks with programs
//! returning at once (`--attach-only`), interleaved over rounds, the order turning each round
//! (`bench/src/bin/keepalive.rs`). Requests/s; the agent's CPU per 10,000 requests/s (from before each load to 1.5 s after
//! it, as the pod rows); kernel program time per request (every program the process holds,
//! beside bpftrace `count()` on the same hooks, both attached during a half-length load of
//! each round with the statistics on) and records per request.

use std::{path::Path, time::Duration};

use anyhow::Result;

use super::{
    Plan,
    agent::Agent,
    bpf::{BpfStats, Bpftrace, Costs},
    phases::{median, num, round_spread},
    pod::{Pod, kernel_ns},
    report::{Row, Verdict, pct},
};

/// Persistent connections, as Coroot's published run (wrk2, 100 connections).
const CONNECTIONS: usize = 100;

/// The agent's work and kernel time over the rounds.
#[derive(Default)]
struct AgentWork {
    cpu_seconds: f64,
    records: f64,
    requests: f64,
    /// (agent ns, bpftrace ns, requests) with the statistics on, summed over the rounds.
    kernel: (f64, f64, f64),
    kernel_ratios: Vec<f64>,
    by_hook: (Costs, Costs),
}

/// One load in the pod: (requests, requests/s), the clients' count (the server's agrees, or
/// the workload fails).
fn load(pod: &Pod, plan: &Plan, secs: f64) -> Result<(f64, f64)> {
    let v = pod.exec(&[
        "/bench/keepalive",
        &secs.to_string(),
        &CONNECTIONS.to_string(),
        &plan.threads.to_string(),
    ])?;
    Ok((num(&v, "requests")?, num(&v, "per_second")?))
}

impl AgentWork {
    /// The agent at its defaults: a load for throughput, CPU and records, then one with
    /// bpftrace beside it and the statistics on. Its throughput.
    fn round(&mut self, bin: &Path, pod: &Pod, plan: &Plan, stats: &BpfStats) -> Result<f64> {
        let agent = Agent::start(bin, &[])?;
        let (cpu0, rec0) = (
            agent.cpu_seconds()?,
            agent.metric_sum("drainwatch_events_total")?,
        );
        let (n, rate) = load(pod, plan, plan.phase_secs)?;
        std::thread::sleep(Duration::from_millis(1500));
        self.cpu_seconds += agent.cpu_seconds()? - cpu0;
        self.records += agent.metric_sum("drainwatch_events_total")? - rec0;
        self.requests += n;
        let tracer = Bpftrace::start()?;
        stats.set(true)?;
        let (a0, t0) = (stats.snapshot(agent.pid())?, stats.snapshot(tracer.pid())?);
        let (n, _) = load(pod, plan, plan.phase_secs / 2.0)?;
        let (a1, t1) = (stats.snapshot(agent.pid())?, stats.snapshot(tracer.pid())?);
        stats.set(false)?;
        let (a, t) = (kernel_ns(&a0, &a1), kernel_ns(&t0, &t1));
        self.by_hook.0.add(&a0, &a1);
        self.by_hook.1.add(&t0, &t1);
        self.kernel.0 += a;
        self.kernel.1 += t;
        self.kernel.2 += n;
        self.kernel_ratios.push(a / t.max(1.0));
        Ok(rate)
    }
}

/// What the peers publish for this shape, beside ours (for the text under the table).
pub(super) struct Peers {
    pub(super) millicores: f64,
    pub(super) kernel_ns: f64,
    pub(super) rate: f64,
}

pub(super) fn keepalive_phase(bin: &Path, plan: &Plan, rows: &mut Vec<Row>) -> Result<Peers> {
    let pod = Pod::start(bin)?;
    let stats = BpfStats::keep()?;
    stats.set(false)?;
    let (mut off, mut on, mut floor) = (Vec::new(), Vec::new(), Vec::new());
    let mut work = AgentWork::default();
    for round in 0..plan.rounds {
        eprintln!("[bench] keep-alive round {}/{}", round + 1, plan.rounds);
        // The order turns each round: on a machine others load, a slot that always came first
        // or last would carry their rhythm into one variant's figures.
        for slot in 0..3 {
            match (slot + round) % 3 {
                0 => off.push(load(&pod, plan, plan.phase_secs)?.1),
                1 => on.push(work.round(bin, &pod, plan, &stats)?),
                _ => {
                    let _floor = Agent::start(bin, &["--attach-only"])?;
                    floor.push(load(&pod, plan, plan.phase_secs)?.1);
                }
            }
        }
    }
    let (on_spread, floor_spread) = (round_spread(&on, &off), round_spread(&floor, &off));
    let on_floor_spread = round_spread(&on, &floor);
    let (off, rate, floor) = (median(&off), median(&on), median(&floor));
    let what = format!("keep-alive requests/s in a pod ({CONNECTIONS} connections)");
    rows.push(Row {
        figure: format!("{what}, agent at its defaults"),
        value: format!("{rate:.0}"),
        baseline: format!("{off:.0} (nothing attached)"),
        ratio: format!("{}{on_spread}", pct(rate / off)),
        budget: "≥ 99%".into(),
        verdict: Verdict::of(rate / off >= 0.99),
    });
    rows.push(Row {
        figure: format!(
            "{what}, the agent's hooks with programs returning at once (`--attach-only`)"
        ),
        value: format!("{floor:.0}"),
        baseline: format!("{off:.0} (nothing attached)"),
        ratio: format!("{}{floor_spread}", pct(floor / off)),
        budget: "-".into(),
        verdict: Verdict::Info,
    });
    rows.push(Row {
        figure: format!("{what}, agent at its defaults against its hooks returning at once"),
        value: format!("{rate:.0}"),
        baseline: format!("{floor:.0} (`--attach-only`)"),
        ratio: format!("{}{on_floor_spread}", pct(rate / floor)),
        budget: "-".into(),
        verdict: Verdict::Info,
    });
    let per_request = work.cpu_seconds / work.requests.max(1.0);
    // At 10,000 requests/s, c CPU-seconds per request keep 10,000·c cores busy.
    let millicores = per_request * 10_000.0 * 1000.0;
    rows.push(Row {
        figure: "agent CPU per 10,000 keep-alive requests/s (user + system), agent at its \
                 defaults"
            .into(),
        value: format!("{millicores:.2} millicores"),
        baseline: format!(
            "{:.1} ns per request ({:.2} CPU-seconds for {:.0} requests)",
            per_request * 1e9,
            work.cpu_seconds,
            work.requests
        ),
        ratio: "-".into(),
        budget: "-".into(),
        verdict: Verdict::Info,
    });
    let k = &work.kernel;
    let (agent_ns, trace_ns) = (k.0 / k.2.max(1.0), k.1 / k.2.max(1.0));
    let ratio = median(&work.kernel_ratios);
    rows.push(Row {
        figure: "kernel program time per keep-alive request (BPF stats, every hook, both \
                 attached), agent at its defaults"
            .into(),
        value: format!("{agent_ns:.0} ns"),
        baseline: format!("{trace_ns:.0} ns (bpftrace count())"),
        ratio: format!("{ratio:.2}×{}", ratio_spread(&work.kernel_ratios)),
        budget: "-".into(),
        verdict: Verdict::Info,
    });
    let trace = work.by_hook.1.per_run();
    for (hook, (ns, runs)) in work.by_hook.0.per_run() {
        let per = runs as f64 / k.2.max(1.0);
        // Hooks a request does not pass (a few runs from the load's start and end).
        if per < 0.01 {
            continue;
        }
        rows.push(Row {
            figure: format!(
                "kernel program time per keep-alive request, {hook} ({per:.2} runs a request), \
                 agent at its defaults"
            ),
            value: format!("{:.0} ns", ns * per),
            baseline: trace.get(&hook).map_or("not attached".into(), |(t, n)| {
                format!("{:.0} ns (bpftrace)", t * *n as f64 / k.2.max(1.0))
            }),
            ratio: "-".into(),
            budget: "-".into(),
            verdict: Verdict::Info,
        });
    }
    rows.push(Row {
        figure: "records per keep-alive request (received by the agent), agent at its defaults"
            .into(),
        value: format!("{:.4}", work.records / work.requests.max(1.0)),
        baseline: format!(
            "{:.0} records for {:.0} requests over {} connections a load",
            work.records, work.requests, CONNECTIONS
        ),
        ratio: "-".into(),
        budget: "-".into(),
        verdict: Verdict::Info,
    });
    Ok(Peers {
        millicores,
        kernel_ns: agent_ns,
        rate,
    })
}

/// ` (rounds a–b×)` over more than one round.
fn ratio_spread(v: &[f64]) -> String {
    let (lo, hi) = v
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
    if v.len() > 1 {
        format!(" (rounds {lo:.2}–{hi:.2}×)")
    } else {
        String::new()
    }
}
