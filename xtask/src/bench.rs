//! `cargo xtask bench`: the agent's overhead, each figure next to a baseline measured in the
//! same run (these machines are shared and noisy: an absolute time alone means little).
//!
//! - Pod churn, the headline: the same churn with a pod's mix (of ten connections eight close
//!   cleanly, the server first, one is refused, one aborted) inside a podman container's
//!   network namespace, which the kernel filter keeps whole: nothing attached, the agent at its
//!   defaults, and bpftrace `count()` on the same hooks, interleaved over rounds. Throughput,
//!   the agent's CPU per 10,000 connections/s (measured from before each churn to 1.5 s after
//!   it, so the draining of its records counts), kernel program time per connection (every
//!   program the process holds, against bpftrace's, both attached during one churn of each
//!   round: the ratio is the median of the rounds', each from one machine state) and records
//!   per connection; the same for the agent with `--hold false` (every arrival and accept a
//!   record of its own, as before the hold), and the pod's throughput with the hooks alone
//!   (`--attach-only`)
//!   (`bench/src/bin/churn.rs pod`, `xtask/src/bench/pod.rs`). Then records per connection
//!   when none fails (`churn … clean`), and long-lived pod connections under the hold: 20,000
//!   held open 17 s (`bench/src/bin/held.rs`), each to be taken over from the kernel once
//!   (the agent's `drainwatch_hold_taken_over_total` against the client's count), what each
//!   take-over cost (`drainwatch_hold_take_over_seconds`), and the kernel memory of the
//!   agent's maps (`bpftool map show`'s `bytes_memlock`) (`xtask/src/bench/held.rs`).
//! - Keep-alive requests, the shape peers publish (Coroot: wrk2 at 10,000 requests/s over 100
//!   connections; Beyla: eBPF time per request): an HTTP/1.1 server (hyper) and 100 clients,
//!   each a persistent connection sending a request and reading its answer in a loop, in a
//!   podman container's network namespace as the pod churn, every connection open before the
//!   clock starts (`bench/src/bin/keepalive.rs`): nothing attached, the agent at its defaults
//!   and its hooks alone (`--attach-only`), interleaved over rounds. Requests/s (the clients'
//!   count, which must equal the server's), the agent's CPU per 10,000 requests/s, kernel
//!   program time per request beside bpftrace `count()`'s (both attached, as the pod rows) and
//!   records per request (`xtask/src/bench/keepalive.rs`).
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
//! - Service lookups (`xtask/src/bench/nat.rs`, `bench/src/bin/nat.rs`): the agent's ctnetlink
//!   code against the kernel's connection tracking, a GET by tuple (found, not found) and a
//!   dump by destination, wall and CPU time, and the most the agent's budget lets them cost;
//!   the pod rows count the lookups made during pod churn (none: only failed connects to
//!   addresses no container has are looked up).
//! - Footprint: the agent's CPU and RSS at rest and under capped churn, and the memory the
//!   pipeline's state takes for 1,000 containers and 100,000 open connections fed through the
//!   pipeline's code as synthetic events (`bench/src/bin/pipeline.rs footprint`).
//! - Scale, on real kernel objects (`xtask/src/bench/scale.rs`): 1,000 network namespaces made
//!   with `ip netns add` (50 in `--smoke`), each a container to the agent: a process in a
//!   Docker-shaped cgroup (`<parent>/docker-<id>.scope`) inside the namespace, with `lo` up, a
//!   listener and 100 connections to it, both ends held open (`bench/src/bin/namespaces.rs`),
//!   removed again on drop, error or Ctrl-C. The agent, started after them, until its metrics
//!   say it follows all the containers and connections: its RSS, its CPU at rest, and the wall
//!   and CPU time of each listen-path sample of every container
//!   (`drainwatch_listen_sample_seconds`, `drainwatch_listen_sample_cpu_seconds_total`), beside
//!   the same agent without them in the same run. Alone: `cargo xtask bench --only scale`.

mod agent;
mod bpf;
mod held;
mod keepalive;
mod nat;
mod phases;
mod pod;
mod report;
mod scale;

use anyhow::{Context as _, Result};

use crate::{cargo, repo_root, run_cmd, target_dir};

pub struct Settings {
    pub smoke: bool,
    /// One phase alone (its table printed, BENCHMARKS.md left as it is).
    pub only: Option<Phase>,
}

/// The phases, in the order a full run takes them.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Phase {
    Pod,
    Keepalive,
    /// Also what `footprint` needs.
    Churn,
    Pipeline,
    Footprint,
    Scale,
    /// Service lookups (ctnetlink).
    Nat,
}

struct Plan {
    phase_secs: f64,
    rounds: usize,
    threads: usize,
    capped_rate: f64,
    /// The agent at rest: at 10 ms of CPU accounting resolution, 30 s resolve 0.03%.
    rest_secs: f64,
    /// Network namespaces made containers in the scale phase, and connections in each.
    scale_namespaces: usize,
    scale_conns: usize,
    /// Long-lived pod connections held open for `--hold`'s take-over (`bench/held.rs`).
    held_conns: usize,
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
                scale_namespaces: 50,
                scale_conns: 100,
                held_conns: 500,
            }
        } else {
            Plan {
                phase_secs: 6.0,
                rounds: 7,
                threads: 2,
                capped_rate: 50_000.0,
                rest_secs: 30.0,
                scale_namespaces: 1000,
                scale_conns: 100,
                held_conns: 20_000,
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
    let runs = |p: Phase| settings.only.is_none_or(|o| o == p);
    if runs(Phase::Pod) {
        pod::pod_phase(&bin, &plan, &mut rows)?;
    }
    let mut peers = None;
    if runs(Phase::Keepalive) {
        peers = Some(keepalive::keepalive_phase(&bin, &plan, &mut rows)?);
    }
    if runs(Phase::Churn) || runs(Phase::Footprint) {
        let churn = phases::churn_phase(&bin, &plan, &mut rows)?;
        if runs(Phase::Pipeline) {
            phases::pipeline_phase(&bin, &plan, &mut rows)?;
        }
        if runs(Phase::Footprint) {
            phases::footprint_phase(&bin, &plan, &churn, &mut rows)?;
        }
    } else if runs(Phase::Pipeline) {
        phases::pipeline_phase(&bin, &plan, &mut rows)?;
    }
    if runs(Phase::Scale) {
        scale::scale_phase(&bin, &plan, &mut rows)?;
    }
    if runs(Phase::Nat) {
        nat::nat_phase(&bin, &plan, &mut rows)?;
    }

    let table = report::render(&rows);
    println!("{table}");
    if !settings.smoke && settings.only.is_none() {
        let mut doc = report::document(&table, &plan, peers.as_ref())?;
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
