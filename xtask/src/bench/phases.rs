//! The benchmark's phases, each appending its rows to the report: loopback churn with and
//! without the agent (throughput, then kernel cost per program run), the userspace pipeline's
//! capacity and loss, and the agent's footprint.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use serde_json::Value;

use super::{
    Plan,
    agent::Agent,
    bpf::{BpfStats, Bpftrace, Costs},
    report::{Row, Verdict, pct},
};

/// Programs the budget calls hot.
const HOT: &[&str] = &["inet_sock_set_state", "tcp_send_reset", "tcp_receive_reset"];

/// What the footprint phase takes from the churn phase.
pub(super) struct Churn {
    /// Median connections/s with the agent on.
    pub(super) on: f64,
    /// The agent's CPU (share of one core) during each round's unbounded churn.
    pub(super) agent_cpu: Vec<f64>,
}

/// Churn: off / agent / agent keeping all host traffic / bpftrace, interleaved over rounds, and
/// the kernel cost per program run of each.
pub(super) fn churn_phase(bin: &Path, plan: &Plan, rows: &mut Vec<Row>) -> Result<Churn> {
    let stats = BpfStats::keep()?;
    // Throughput is measured with BPF statistics off (as in production: they add two clock
    // reads to every program run), then the kernel cost per run in a second phase with them on.
    let (mut off, mut on, mut all, mut trace) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut floor, mut unbudgeted) = (Vec::new(), Vec::new());
    let (mut agent_costs, mut all_costs, mut trace_costs, mut floor_costs) = (
        Costs::default(),
        Costs::default(),
        Costs::default(),
        Costs::default(),
    );
    let mut unbudgeted_costs = Costs::default();
    // Records the default per-CPU budget shed while every event was kept, and all it saw.
    let (mut shed, mut kept) = (0.0, 0.0);
    let mut agent_churn_cpu = Vec::new();
    let cost_plan = Plan {
        phase_secs: plan.phase_secs / 2.0,
        ..*plan
    };
    // The throughput phase, then the cost phase, against programs `pid` holds.
    let measure = |pid: u32, costs: &mut Costs| -> Result<f64> {
        stats.set(false)?;
        let rate = churn(bin, plan, 0.0)?;
        stats.set(true)?;
        let before = stats.snapshot(pid)?;
        churn(bin, &cost_plan, 0.0)?;
        costs.add(&before, &stats.snapshot(pid)?);
        stats.set(false)?;
        Ok(rate)
    };
    for round in 0..plan.rounds {
        eprintln!("[bench] churn round {}/{}", round + 1, plan.rounds);
        stats.set(false)?;
        off.push(churn(bin, plan, 0.0)?);
        {
            // The loopback churn touches no container: the default drops it in the kernel.
            // With `--host-traffic all` every event is kept, which is what a container's own
            // connections cost.
            let agent = Agent::start(bin, &["--host-traffic", "all"])?;
            all.push(measure(agent.pid(), &mut all_costs)?);
            // The agent folds the kernel's per-CPU counters in every second.
            std::thread::sleep(Duration::from_millis(1500));
            shed += agent.metric_sum("drainwatch_events_shed_total")?;
            kept += agent.metric_sum("drainwatch_events_total")?;
        }
        {
            // The same without the per-CPU budget of packet-path records: what its check
            // costs each run.
            let agent = Agent::start(
                bin,
                &["--host-traffic", "all", "--packet-events-per-cpu", "0"],
            )?;
            unbudgeted.push(measure(agent.pid(), &mut unbudgeted_costs)?);
        }
        {
            let agent = Agent::start(bin, &[])?;
            let cpu0 = agent.cpu_seconds()?;
            let t = Instant::now();
            stats.set(false)?;
            on.push(churn(bin, plan, 0.0)?);
            agent_churn_cpu.push((agent.cpu_seconds()? - cpu0) / t.elapsed().as_secs_f64());
            stats.set(true)?;
            let before = stats.snapshot(agent.pid())?;
            churn(bin, &cost_plan, 0.0)?;
            agent_costs.add(&before, &stats.snapshot(agent.pid())?);
            stats.set(false)?;
        }
        {
            // The same hooks with programs that return at once: what attaching them costs
            // the kernel before any of the programs' work.
            let agent = Agent::start(bin, &["--attach-only"])?;
            floor.push(measure(agent.pid(), &mut floor_costs)?);
            // The agent folds the kernel's per-CPU counters in every second: the churn ran
            // long enough for a program that did any work to show.
            let seen = agent.metric_sum("drainwatch_events_filtered_total")?
                + agent.metric_sum("drainwatch_events_total")?;
            ensure!(
                seen == 0.0,
                "--attach-only programs did work: {seen} events"
            );
        }
        {
            let tracer = Bpftrace::start()?;
            trace.push(measure(tracer.pid(), &mut trace_costs)?);
        }
    }
    let spread = |v: &[f64]| round_spread(v, &off);
    let (on_spread, floor_spread, trace_spread) = (spread(&on), spread(&floor), spread(&trace));
    let (off, on, all, trace) = (median(&off), median(&on), median(&all), median(&trace));
    let (floor, unbudgeted) = (median(&floor), median(&unbudgeted));
    let ratio_on = on / off;
    let ratio_trace = trace / off;
    rows.push(Row {
        figure: "churn throughput, agent on (connections/s)".into(),
        value: format!("{on:.0}"),
        baseline: format!("{off:.0} (nothing attached)"),
        ratio: format!("{}{on_spread}", pct(ratio_on)),
        budget: "≥ 95%".into(),
        verdict: Verdict::of(ratio_on >= 0.95),
    });
    rows.push(Row {
        figure: "churn throughput, the agent's hooks with programs returning at once \
                 (`--attach-only`)"
            .into(),
        value: format!("{floor:.0}"),
        baseline: format!("{off:.0} (nothing attached)"),
        ratio: format!("{}{floor_spread}", pct(floor / off)),
        budget: "-".into(),
        verdict: Verdict::Info,
    });
    rows.push(Row {
        figure: "churn throughput, agent on against its hooks returning at once (the \
                 programs' own work)"
            .into(),
        value: format!("{on:.0}"),
        baseline: format!("{floor:.0} (`--attach-only`)"),
        ratio: pct(on / floor),
        budget: "-".into(),
        verdict: Verdict::Info,
    });
    rows.push(Row {
        figure: "churn throughput, bpftrace count() on the same tracepoints".into(),
        value: format!("{trace:.0}"),
        baseline: format!("{off:.0} (nothing attached)"),
        ratio: format!("{}{trace_spread}", pct(ratio_trace)),
        budget: "agent within 2 points of it".into(),
        verdict: Verdict::of(ratio_trace - ratio_on <= 0.02),
    });
    rows.push(Row {
        figure: "churn throughput, agent keeping every event (`--host-traffic all`)".into(),
        value: format!("{all:.0}"),
        baseline: format!("{off:.0} (nothing attached)"),
        ratio: pct(all / off),
        budget: "-".into(),
        verdict: Verdict::Info,
    });
    rows.push(Row {
        figure: "churn throughput, agent keeping every event without the per-CPU budget \
                 (`--packet-events-per-cpu 0`)"
            .into(),
        value: format!("{unbudgeted:.0}"),
        baseline: format!("{all:.0} (every event kept, default budget)"),
        ratio: pct(unbudgeted / all),
        budget: "-".into(),
        verdict: Verdict::Info,
    });
    rows.push(Row {
        figure: "records shed by the default per-CPU budget (`--packet-events-per-cpu`) while \
                 every event was kept"
            .into(),
        value: format!("{shed:.0}"),
        baseline: format!("{:.0} events received", kept),
        ratio: pct(shed / (shed + kept).max(1.0)),
        budget: "-".into(),
        verdict: Verdict::Info,
    });
    let unbudgeted_runs = unbudgeted_costs.per_run();
    for (tp, (ns, runs)) in &all_costs.per_run() {
        if !HOT.contains(&tp.as_str()) {
            continue;
        }
        if let Some((free, free_runs)) = unbudgeted_runs.get(tp) {
            rows.push(Row {
                figure: format!(
                    "kernel cost per run, every event kept, without the budget check: {tp} \
                     ({free_runs} runs)"
                ),
                value: format!("{free:.0} ns"),
                baseline: format!("{ns:.0} ns (with it, default)"),
                ratio: format!("{:+.0} ns", ns - free),
                budget: "-".into(),
                verdict: Verdict::Info,
            });
        }
        let reference = trace_costs.per_run().get(tp).map(|(n, _)| *n);
        rows.push(Row {
            figure: format!("kernel cost per run, every event kept: {tp} ({runs} runs)"),
            value: format!("{ns:.0} ns"),
            baseline: reference.map_or("-".into(), |r| format!("{r:.0} ns (bpftrace)")),
            ratio: reference.map_or("-".into(), |r| format!("{:.1}×", ns / r)),
            budget: "-".into(),
            verdict: Verdict::Info,
        });
    }
    for (tp, (ns, runs)) in &agent_costs.per_run() {
        let reference = trace_costs.per_run().get(tp).map(|(n, _)| *n);
        let hot = HOT.contains(&tp.as_str());
        rows.push(Row {
            figure: format!("kernel cost per run: {tp} ({runs} runs)"),
            value: format!("{ns:.0} ns"),
            baseline: reference.map_or("-".into(), |r| format!("{r:.0} ns (bpftrace)")),
            ratio: reference.map_or("-".into(), |r| format!("{:.1}×", ns / r)),
            budget: if hot { "≤ 250 ns".into() } else { "-".into() },
            verdict: if hot {
                Verdict::of(*ns <= 250.0)
            } else {
                Verdict::Info
            },
        });
    }
    if let Some((ns, runs)) = floor_costs.per_run().get("inet_sock_set_state") {
        rows.push(Row {
            figure: format!(
                "kernel cost per run of a program returning at once: inet_sock_set_state \
                 ({runs} runs)"
            ),
            value: format!("{ns:.0} ns"),
            baseline: "-".into(),
            ratio: "-".into(),
            budget: "-".into(),
            verdict: Verdict::Info,
        });
    }
    Ok(Churn {
        on,
        agent_cpu: agent_churn_cpu,
    })
}

/// Userspace capacity and loss.
pub(super) fn pipeline_phase(bin: &Path, plan: &Plan, rows: &mut Vec<Row>) -> Result<()> {
    eprintln!("[bench] pipeline capacity");
    let cap = json_of(Command::new(bin.join("pipeline")).args([
        "capacity",
        &plan.phase_secs.to_string(),
        "1000",
    ]))?;
    let per_sec = num(&cap, "pipeline_per_second")?;
    let decode = num(&cap, "decode_only_per_second")?;
    ensure!(
        num(&cap, "arrivals_counted")? == num(&cap, "connections_offered")?,
        "the pipeline did not attribute every synthetic connection: {cap}"
    );
    rows.push(Row {
        figure: "userspace pipeline, one core (events/s)".into(),
        value: format!("{per_sec:.0}"),
        baseline: format!("{decode:.0} (decode alone)"),
        ratio: pct(per_sec / decode),
        budget: "≥ 1,000,000".into(),
        verdict: Verdict::of(per_sec >= 1_000_000.0),
    });
    // The record the agent gets per clean connection at its defaults: one, carrying the
    // handshake and accept the kernel held (three events once unfolded).
    let held = json_of(Command::new(bin.join("pipeline")).args([
        "capacity",
        &plan.phase_secs.to_string(),
        "1000",
        "held",
    ]))?;
    ensure!(
        num(&held, "arrivals_counted")? == num(&held, "connections_offered")?,
        "the pipeline did not attribute every synthetic held connection: {held}"
    );
    let (held_rate, held_decode) = (
        num(&held, "pipeline_per_second")?,
        num(&held, "decode_only_per_second")?,
    );
    rows.push(Row {
        figure: "userspace pipeline, one core, clean connections' held records (records/s)".into(),
        value: format!("{held_rate:.0}"),
        baseline: format!("{held_decode:.0} (decode alone)"),
        ratio: pct(held_rate / held_decode),
        budget: "-".into(),
        verdict: Verdict::Info,
    });
    // Amortized growth of the pipeline's maps is all that may allocate on this path.
    for (stream, v) in [
        ("five records per connection", &cap),
        ("held records", &held),
    ] {
        let allocs = num(v, "allocations_per_record")?;
        rows.push(Row {
            figure: format!("heap allocations per record, userspace pipeline ({stream})"),
            value: format!("{allocs:.3}"),
            baseline: "-".into(),
            ratio: "-".into(),
            budget: "< 0.01".into(),
            verdict: Verdict::of(allocs < 0.01),
        });
    }
    for (rate, label, budget) in [
        (200_000.0, "200,000 events/s".to_string(), Some("0 lost")),
        (2.0 * per_sec, "2× capacity".to_string(), None),
    ] {
        eprintln!("[bench] pipeline loss at {label}");
        let l = json_of(Command::new(bin.join("pipeline")).args([
            "loss",
            &plan.phase_secs.to_string(),
            "1000",
            &format!("{rate:.0}"),
        ]))?;
        let (lost, offered) = (num(&l, "lost")?, num(&l, "offered")?);
        rows.push(Row {
            figure: format!("events lost through the queue at {label}"),
            value: format!("{lost:.0}"),
            baseline: format!("{offered:.0} offered"),
            ratio: pct(lost / offered.max(1.0)),
            budget: budget.unwrap_or("-").into(),
            verdict: budget.map_or(Verdict::Info, |_| Verdict::of(lost == 0.0)),
        });
    }
    Ok(())
}

/// Footprint: CPU and RSS at rest and under churn, and the pipeline state's memory.
pub(super) fn footprint_phase(
    bin: &Path,
    plan: &Plan,
    unbounded: &Churn,
    rows: &mut Vec<Row>,
) -> Result<()> {
    eprintln!("[bench] footprint");
    let rest = {
        let agent = Agent::start(bin, &[])?;
        // Past the start-up scan and its one-off work.
        std::thread::sleep(Duration::from_secs(3));
        let (cpu0, t) = (agent.cpu_seconds()?, Instant::now());
        std::thread::sleep(Duration::from_secs_f64(plan.rest_secs));
        let cpu = (agent.cpu_seconds()? - cpu0) / t.elapsed().as_secs_f64();
        let capped = {
            let cpu0 = agent.cpu_seconds()?;
            let t = Instant::now();
            let rate = churn(bin, plan, plan.capped_rate)?;
            (
                (agent.cpu_seconds()? - cpu0) / t.elapsed().as_secs_f64(),
                rate,
            )
        };
        (cpu, agent.rss_kib()?, capped)
    };
    let (rest_cpu, rest_rss, (capped_cpu, capped_rate)) = rest;
    rows.push(Row {
        figure: "agent CPU at rest (% of one core)".into(),
        value: format!("{:.2}%", rest_cpu * 100.0),
        baseline: "-".into(),
        ratio: "-".into(),
        budget: "≤ 0.5%".into(),
        verdict: Verdict::of(rest_cpu <= 0.005),
    });
    rows.push(Row {
        figure: format!("agent CPU under churn capped at {:.0}/s", plan.capped_rate),
        value: pct(capped_cpu),
        baseline: format!("{capped_rate:.0} connections/s reached"),
        ratio: "-".into(),
        budget: "-".into(),
        verdict: Verdict::Info,
    });
    rows.push(Row {
        figure: "agent CPU under unbounded churn".into(),
        value: pct(median(&unbounded.agent_cpu)),
        baseline: format!("{:.0} connections/s", unbounded.on),
        ratio: "-".into(),
        budget: "-".into(),
        verdict: Verdict::Info,
    });
    let fp = json_of(Command::new(bin.join("pipeline")).args(["footprint", "1000", "100000"]))?;
    let state_kib = num(&fp, "rss_after_kib")? - num(&fp, "rss_before_kib")?;
    let estimate_mib = (rest_rss + state_kib) / 1024.0;
    rows.push(Row {
        figure: "agent RSS at rest".into(),
        value: format!("{:.1} MiB", rest_rss / 1024.0),
        baseline: "-".into(),
        ratio: "-".into(),
        budget: "-".into(),
        verdict: Verdict::Info,
    });
    rows.push(Row {
        figure: "agent RSS with 1,000 containers and 100,000 connections tracked".into(),
        value: format!("{estimate_mib:.1} MiB"),
        baseline: format!(
            "at rest + {:.1} MiB of pipeline state (synthetic host)",
            state_kib / 1024.0
        ),
        ratio: "-".into(),
        budget: "≤ 64 MiB".into(),
        verdict: Verdict::of(estimate_mib <= 64.0),
    });
    Ok(())
}

/// Each round's ratio to the same round's baseline, lowest to highest, as ` (rounds a–b%)`
/// (nothing for one round): the spread says how far to trust the medians on a machine whose
/// speed drifts.
pub(super) fn round_spread(v: &[f64], base: &[f64]) -> String {
    let (lo, hi) = v
        .iter()
        .zip(base)
        .map(|(x, b)| x / b)
        .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
    if v.len().min(base.len()) > 1 {
        format!(" (rounds {:.1}–{})", lo * 100.0, pct(hi))
    } else {
        String::new()
    }
}

pub(super) fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

pub(super) fn num(v: &Value, key: &str) -> Result<f64> {
    v[key]
        .as_f64()
        .with_context(|| format!("no number {key} in {v}"))
}

/// Runs a workload that prints one JSON line.
pub(super) fn json_of(cmd: &mut Command) -> Result<Value> {
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("could not start {cmd:?}"))?;
    ensure!(out.status.success(), "{cmd:?} failed ({})", out.status);
    serde_json::from_slice(&out.stdout).with_context(|| format!("{cmd:?} printed no JSON"))
}

fn churn(bin: &Path, plan: &Plan, rate: f64) -> Result<f64> {
    let v = json_of(Command::new(bin.join("churn")).args([
        plan.phase_secs.to_string(),
        plan.threads.to_string(),
        rate.to_string(),
    ]))?;
    num(&v, "per_second")
}
