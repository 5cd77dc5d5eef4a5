//! `cargo xtask bench`: the agent's overhead, each figure next to a baseline measured in the
//! same run (these machines are shared and noisy: an absolute time alone means little).
//!
//! - Pod churn, the headline: the same churn with a pod's mix (of ten connections eight close
//!   cleanly, the server first, one is refused, one aborted) inside a podman container's
//!   network namespace, which the kernel filter keeps whole: nothing attached, the agent at its
//!   defaults, and bpftrace `count()` on the same hooks, interleaved over rounds. Throughput,
//!   the agent's CPU per 10,000 connections/s (measured from before each churn to 1.5 s after
//!   it, so the draining of its records counts), kernel program time per connection (every
//!   program the process holds, against bpftrace's) and records per connection
//!   (`bench/src/bin/churn.rs pod`, `xtask/src/bench/pod.rs`).
//! - Churn: loopback connect/accept/close, refused connects and aborts (`bench/src/bin/churn.rs`)
//!   with nothing attached, with the agent, with the agent's hooks attached but its programs
//!   returning at once (`--attach-only`: the floor that attaching these hooks costs on this
//!   kernel, whatever the programs do), with the agent keeping every event
//!   (`--host-traffic all`: the loopback churn touches no container, so by default the
//!   programs drop it before reserving a record; kept, it costs what a container's own
//!   connections cost; again with `--packet-events-per-cpu 0`, the per-CPU budget of
//!   packet-path records off, for what its check costs, and what the default budget shed),
//!   and with a minimal bpftrace tracer (`count()` on the same
//!   tracepoints), interleaved over rounds; the median of each.
//! - Kernel cost: `run_time_ns / run_cnt` of each program (`kernel.bpf_stats_enabled`) during
//!   a churn phase of its own (the statistics add two clock reads to every run, so the
//!   throughput phases run without them), the agent's beside bpftrace's on the same
//!   tracepoint, in both agent modes.
//!   The agent takes TCP state changes from the BTF-typed raw tracepoint of
//!   `sock:inet_sock_set_state` (no trace record built, plain loads); Debian's bpftrace 0.17
//!   attaches only classic tracepoints, so its floor there includes building the record.
//! - Userspace: events/s through decode → enrich → correlate → export on one core against
//!   decode alone, and the loss through the agent's queue at 2× that rate and at 200,000/s
//!   (`bench/src/bin/pipeline.rs`).
//! - Footprint: the agent's CPU and RSS at rest and under capped churn, and the memory the
//!   pipeline's state takes for 1,000 containers and 100,000 open connections.

mod agent;
mod bpf;
mod phases;
mod pod;
mod report;

use anyhow::{Context as _, Result};

use crate::{cargo, repo_root, run_cmd, target_dir};

pub struct Settings {
    pub smoke: bool,
    /// Only the pod phase, its table printed, nothing written.
    pub pod_only: bool,
}

struct Plan {
    phase_secs: f64,
    rounds: usize,
    threads: usize,
    capped_rate: f64,
    /// The agent at rest: at 10 ms of CPU accounting resolution, 30 s resolve 0.03%.
    rest_secs: f64,
}

impl Settings {
    fn plan(&self) -> Plan {
        if self.smoke {
            Plan {
                phase_secs: 1.0,
                rounds: 1,
                threads: 2,
                capped_rate: 50_000.0,
                rest_secs: 2.0,
            }
        } else {
            Plan {
                phase_secs: 6.0,
                rounds: 7,
                threads: 2,
                capped_rate: 50_000.0,
                rest_secs: 30.0,
            }
        }
    }
}

pub fn run(settings: &Settings) -> Result<()> {
    let root = repo_root();
    let plan = settings.plan();
    run_cmd(cargo(&root).args([
        "build",
        "--release",
        "-p",
        "drainwatch",
        "-p",
        "drainwatch-bench",
    ]))?;
    let bin = target_dir(&root).join("release");
    let mut rows = Vec::new();
    pod::pod_phase(&bin, &plan, &mut rows)?;
    if settings.pod_only {
        println!("{}", report::render(&rows));
        return Ok(());
    }
    let churn = phases::churn_phase(&bin, &plan, &mut rows)?;
    phases::pipeline_phase(&bin, &plan, &mut rows)?;
    phases::footprint_phase(&bin, &plan, &churn, &mut rows)?;

    let table = report::render(&rows);
    println!("{table}");
    if !settings.smoke {
        let mut doc = report::document(&table, &plan)?;
        // The soak's figures (`cargo xtask soak`) are kept.
        let old = std::fs::read_to_string(root.join("BENCHMARKS.md")).unwrap_or_default();
        if let Some(soak) = crate::soak::section(&old) {
            doc = format!("{}\n\n{soak}\n", doc.trim_end());
        }
        std::fs::write(root.join("BENCHMARKS.md"), doc).context("writing BENCHMARKS.md")?;
        eprintln!("[bench] wrote BENCHMARKS.md");
    }
    Ok(())
}
