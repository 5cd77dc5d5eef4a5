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

pub(super) fn document(
    table: &str,
    plan: &Plan,
    peers: Option<&super::keepalive::Peers>,
) -> Result<String> {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")?;
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let date = crate::capture(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"]))
        .unwrap_or_default();
    // What peers publish for the keep-alive shape, beside ours from this run.
    let peers = peers.map_or(String::new(), |p| {
        format!(
            "\nThe keep-alive rows are the shape peers publish their overhead on. Coroot's node \
            agent: about 200 millicores at 10,000 requests/s over 100 connections (wrk2 against \
            a Go server, <https://docs.coroot.com/installation/performance-impact>); drainwatch \
            here: {:.2} millicores per 10,000 requests/s (at {:.0} requests/s, the agent's own \
            CPU). Beyla: about 500 ns of eBPF time per request (the figure issue 44 quotes; \
            Beyla's own page, <https://grafana.com/docs/beyla/latest/performance/>, gives CPU \
            shares on the OpenTelemetry demo instead); drainwatch here: {:.0} ns of kernel \
            program time per request, every hook. Peers capture each request (method, path, \
            status, latency); drainwatch follows requests only on proxies' upstream connections \
            and keeps none of a server's, so this is the cost of its hooks on every send and \
            receive that keep nothing, not of the same work.\n",
            p.millicores, p.rate, p.kernel_ns
        )
    });
    Ok(format!(
        "# Benchmarks\n\n\
        Written by `cargo xtask bench` on {date_trim}: kernel {kernel_trim}, {cpus} CPUs. \
        The first rows are pod traffic, what the agent exists for: churn inside a podman \
        container's network namespace (of ten connections eight a request and its answer \
        closed by the server, one refused, one aborted), which the kernel filter keeps whole; \
        the loopback rows after them are host traffic, which it drops unless told to keep it. \
        Churn phases of {secs} s, {rounds} interleaved rounds (pod: off, agent, hooks alone, \
        bpftrace; keep-alive: off, agent, hooks alone; loopback: off, agent, agent keeping every event, hooks alone, bpftrace), \
        medians; throughput with `kernel.bpf_stats_enabled` off, as in production, and the \
        kernel cost per run from a following phase of half the length with it on (pod: the \
        agent and bpftrace attached together, each program's time its own). \
        Every figure sits beside a baseline measured in the same run; absolute numbers move \
        with whatever else the machine does.\n\n{table}{peers}\n\
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
