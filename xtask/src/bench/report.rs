//! The report: one row per figure, rendered as the Markdown table `cargo xtask bench` prints
//! and writes into BENCHMARKS.md.

use std::{fmt::Write as _, process::Command};

use anyhow::Result;

use super::Plan;

/// One line of the report.
pub(super) struct Row {
    pub(super) figure: String,
    pub(super) value: String,
    pub(super) baseline: String,
    pub(super) ratio: String,
    pub(super) budget: String,
    pub(super) verdict: Verdict,
}

#[derive(Clone, Copy, PartialEq)]
pub(super) enum Verdict {
    Pass,
    Miss,
    Info,
}

impl Verdict {
    pub(super) fn of(ok: bool) -> Self {
        if ok { Verdict::Pass } else { Verdict::Miss }
    }
    fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "meets",
            Verdict::Miss => "**misses**",
            Verdict::Info => "",
        }
    }
}

pub(super) fn pct(r: f64) -> String {
    format!("{:.1}%", r * 100.0)
}

pub(super) fn render(rows: &[Row]) -> String {
    let mut s = String::from(
        "| figure | value | baseline (same run) | ratio | budget | |\n|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} |",
            r.figure,
            r.value,
            r.baseline,
            r.ratio,
            r.budget,
            r.verdict.as_str()
        );
    }
    s
}

pub(super) fn document(table: &str, plan: &Plan) -> Result<String> {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")?;
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let date = crate::capture(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"]))
        .unwrap_or_default();
    Ok(format!(
        "# Benchmarks\n\n\
        Written by `cargo xtask bench` on {date_trim}: kernel {kernel_trim}, {cpus} CPUs. \
        The first rows are pod traffic, what the agent exists for: churn inside a podman \
        container's network namespace (of ten connections eight a request and its answer \
        closed by the server, one refused, one aborted), which the kernel filter keeps whole; \
        the loopback rows after them are host traffic, which it drops unless told to keep it. \
        Churn phases of {secs} s, {rounds} interleaved rounds (pod: off, agent, hooks alone, \
        bpftrace; loopback: off, agent, agent keeping every event, hooks alone, bpftrace), \
        medians; throughput with `kernel.bpf_stats_enabled` off, as in production, and the \
        kernel cost per run from a following phase of half the length with it on (pod: the \
        agent and bpftrace attached together, each program's time its own). \
        Every figure sits beside a baseline measured in the same run; absolute numbers move \
        with whatever else the machine does.\n\n{table}\n\
        How each figure is measured: see the module documentation of `xtask/src/bench.rs`. \
        Two 1,000-container memory figures: the synthetic one is the agent's RSS at rest plus \
        what the pipeline's state grows by when a synthetic host of 1,000 containers and \
        100,000 open connections is fed through the real pipeline code \
        (`bench/src/bin/pipeline.rs footprint`); the real one (`cargo xtask bench --only \
        scale`) is the agent's own RSS beside 1,000 network namespaces made with `ip netns`, \
        each a container to it (a process in a Docker-shaped cgroup holding a listener and \
        100 connections), and the listen-path sampling cost is measured there too.\n",
        date_trim = date.trim(),
        kernel_trim = kernel.trim(),
        secs = plan.phase_secs,
        rounds = plan.rounds,
    ))
}
