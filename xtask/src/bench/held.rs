//! Long-lived pod connections under `--hold`: the kernel holds each arrival until the
//! connection's next record, and the agent takes over whatever has waited 10 s (checked every
//! 5 s: `agent/src/consumer.rs`). The pod holds `Plan::held_conns` connections open
//! (`bench/src/bin/held.rs`) long enough for that; the agent's own metrics say what it took
//! over (against the client's count: each exactly once) and what its take-overs cost, and
//! `bpftool` what its maps hold of kernel memory.

use std::{path::Path, thread, time::Duration};

use anyhow::{Context as _, Result};

use super::{
    Plan,
    agent::Agent,
    bpf::map_memory,
    phases::num,
    pod::Pod,
    report::{Row, Verdict, pct},
};

/// Long enough after the last connection opened for a check to find it 10 s old.
const HELD_SECS: f64 = 17.0;

/// Connections a client process holds (both ends: within the pod's 10,000 descriptors).
const PER_CLIENT: usize = 4000;

pub(super) fn held_phase(bin: &Path, pod: &Pod, plan: &Plan, rows: &mut Vec<Row>) -> Result<()> {
    eprintln!(
        "[bench] {} long-lived pod connections held {HELD_SECS} s",
        plan.held_conns
    );
    let agent = Agent::start(bin, &[])?;
    let memory = map_memory(agent.pid())?;
    let metric = |name: &str| agent.metric_sum(name);
    let taken0 = metric("drainwatch_hold_taken_over_total")?;
    let sum0 = metric("drainwatch_hold_take_over_seconds_sum")?;
    let count0 = metric("drainwatch_hold_take_over_seconds_count")?;
    let secs = HELD_SECS.to_string();
    let clients: Vec<String> = (0..plan.held_conns.div_ceil(PER_CLIENT))
        .map(|i| PER_CLIENT.min(plan.held_conns - i * PER_CLIENT).to_string())
        .collect();
    let mut most_held = 0.0f64;
    let printed = thread::scope(|s| {
        let running: Vec<_> = clients
            .iter()
            .map(|n| s.spawn(|| pod.exec(&["/bench/held", n, &secs])))
            .collect();
        while !running.iter().all(|c| c.is_finished()) {
            most_held = most_held.max(metric("drainwatch_hold_entries").unwrap_or(0.0));
            thread::sleep(Duration::from_millis(250));
        }
        running
            .into_iter()
            .map(|c| c.join().ok().context("a held client panicked")?)
            .collect::<Result<Vec<_>>>()
    })?;
    let held = printed
        .iter()
        .map(|v| num(v, "connections"))
        .sum::<Result<f64>>()?;
    // The connections' closes drain behind them.
    thread::sleep(Duration::from_millis(1500));
    let taken = metric("drainwatch_hold_taken_over_total")? - taken0;
    let sweeps = metric("drainwatch_hold_take_over_seconds_count")? - count0;
    let seconds = metric("drainwatch_hold_take_over_seconds_sum")? - sum0;
    rows.push(Row {
        figure: "long-lived pod connections taken over from the kernel's hold after 10 s \
                 (`--hold`), agent at its defaults"
            .into(),
        value: format!("{taken:.0}"),
        baseline: format!("{held:.0} the client held open {HELD_SECS} s"),
        ratio: pct(taken / held.max(1.0)),
        budget: "all, once".into(),
        verdict: Verdict::of(taken == held),
    });
    rows.push(Row {
        figure: format!(
            "take-over of held connections (the kernel's map read in batches every 5 s, what \
             waited 10 s removed), up to {most_held:.0} held"
        ),
        value: if sweeps > 0.0 {
            format!("{:.2} ms per take-over", seconds / sweeps * 1e3)
        } else {
            "not measured".into()
        },
        baseline: format!("{sweeps:.0} take-overs"),
        ratio: "-".into(),
        budget: "-".into(),
        verdict: Verdict::Info,
    });
    let total: u64 = memory.values().sum();
    let mut largest: Vec<(&String, &u64)> = memory.iter().collect();
    largest.sort_by(|a, b| b.1.cmp(a.1));
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    rows.push(Row {
        figure: "kernel memory of the agent's BPF maps (`bytes_memlock`), agent at its defaults"
            .into(),
        value: format!("{:.1} MiB", mib(total)),
        baseline: largest
            .iter()
            .take(4)
            .map(|(name, b)| format!("{name} {:.1} MiB", mib(**b)))
            .collect::<Vec<_>>()
            .join(", "),
        ratio: "-".into(),
        budget: "-".into(),
        verdict: Verdict::Info,
    });
    Ok(())
}
