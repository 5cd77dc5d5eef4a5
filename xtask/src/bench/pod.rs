//! The pod phase: connection churn inside a real container's network namespace (podman +
//! runc), the traffic drainwatch exists for. Unlike the loopback phase, the kernel filter keeps
//! all of it, so this is what the agent costs on a busy pod: nothing attached, the agent at its
//! defaults, its hooks with programs returning at once (`--attach-only`: the ceiling the hooks
//! themselves put on throughput) and bpftrace `count()` on the same hooks, interleaved over
//! rounds.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result, ensure};

use super::{
    Plan,
    agent::Agent,
    bpf::{BpfStats, Bpftrace, Snapshot},
    phases::{json_of, median, num},
    report::{Row, Verdict, pct},
};

/// The lab's image (`tests/src/lab/container`): busybox imported once from the host.
const IMAGE: &str = "localhost/bb:latest";

/// A long-lived container the churn runs in with `podman exec`, removed on drop.
struct Pod {
    name: String,
}

impl Pod {
    fn start(bin: &Path) -> Result<Self> {
        ensure_image()?;
        let name = format!("dwbench-pod-{}", std::process::id());
        let _ = podman(&["rm", "-f", "-t", "0", &name]);
        let mount = format!("{}:/bench:ro", bin.display());
        podman(&[
            "--runtime",
            "/usr/sbin/runc",
            "run",
            "-d",
            "--cgroup-manager=cgroupfs",
            "--ulimit",
            "nofile=10000:10000",
            "--ulimit",
            "nproc=1000:1000",
            "-v",
            "/usr:/usr:ro",
            "-v",
            "/lib:/lib:ro",
            "-v",
            "/lib64:/lib64:ro",
            "-v",
            &mount,
            "--name",
            &name,
            IMAGE,
            "/bin/busybox",
            "sleep",
            "86400",
        ])?;
        Ok(Self { name })
    }

    /// One churn in the pod: (connections, connections/s).
    fn churn(&self, plan: &Plan, secs: f64) -> Result<(f64, f64)> {
        let v = json_of(Command::new("podman").args([
            "exec",
            &self.name,
            "/bench/churn",
            &secs.to_string(),
            &plan.threads.to_string(),
            "0",
            "pod",
        ]))?;
        Ok((num(&v, "connections")?, num(&v, "per_second")?))
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", "-t", "0", &self.name]);
    }
}

fn podman(args: &[&str]) -> Result<String> {
    let out = Command::new("podman")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running podman (`cargo xtask setup` installs it)")?;
    ensure!(
        out.status.success(),
        "podman {args:?}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Imports the lab's busybox image if it is missing, as the tests do.
fn ensure_image() -> Result<()> {
    if podman(&["image", "exists", IMAGE]).is_ok() {
        return Ok(());
    }
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .context("busybox is needed for the pod image (apt-get install busybox-static)")?;
    let root = PathBuf::from(format!("/tmp/dwbench-image-{}", std::process::id()));
    std::fs::create_dir_all(root.join("rootfs/bin"))?;
    std::fs::copy(busybox, root.join("rootfs/bin/busybox"))?;
    let tar = root.join("rootfs.tar");
    let st = Command::new("tar")
        .arg("-C")
        .arg(root.join("rootfs"))
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()?;
    ensure!(st.success(), "tar of the busybox rootfs failed");
    podman(&["import", &tar.to_string_lossy(), IMAGE])?;
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}

/// Kernel time over every program a process holds, between two snapshots.
fn kernel_ns(before: &Snapshot, after: &Snapshot) -> f64 {
    after
        .iter()
        .map(|(hook, (ns, _))| ns.saturating_sub(before.get(hook).map_or(0, |b| b.0)) as f64)
        .sum()
}

/// The agent's work for one churn: CPU, records received and shed, connections made.
#[derive(Default)]
struct Work {
    cpu_seconds: f64,
    records: f64,
    shed: f64,
    connections: f64,
}

pub(super) fn pod_phase(bin: &Path, plan: &Plan, rows: &mut Vec<Row>) -> Result<()> {
    let pod = Pod::start(bin)?;
    let stats = BpfStats::keep()?;
    stats.set(false)?;
    let (mut off, mut on, mut trace) = (Vec::new(), Vec::new(), Vec::new());
    let mut floor = Vec::new();
    let mut work = Work::default();
    let (mut agent_kernel, mut trace_kernel) = ((0.0, 0.0), (0.0, 0.0));
    let mut kernel_ratios = Vec::new();
    let cost_secs = plan.phase_secs / 2.0;
    // Kernel time per connection of the agent's programs and bpftrace's, from one churn with
    // both attached and the statistics on (they add two clock reads to every run): each
    // program's run time is its own, and the pair sees the same machine. Measured apart, the
    // ratio moved by a fifth between runs with the machine's state (1.11–1.23×).
    let kernel = |agent: u32, tracer: u32| -> Result<(f64, f64, f64)> {
        stats.set(true)?;
        let (a0, t0) = (stats.snapshot(agent)?, stats.snapshot(tracer)?);
        let (n, _) = pod.churn(plan, cost_secs)?;
        let (a1, t1) = (stats.snapshot(agent)?, stats.snapshot(tracer)?);
        stats.set(false)?;
        Ok((kernel_ns(&a0, &a1), kernel_ns(&t0, &t1), n))
    };
    for round in 0..plan.rounds {
        eprintln!("[bench] pod churn round {}/{}", round + 1, plan.rounds);
        off.push(pod.churn(plan, plan.phase_secs)?.1);
        {
            let agent = Agent::start(bin, &[])?;
            let (cpu0, rec0) = (
                agent.cpu_seconds()?,
                agent.metric_sum("drainwatch_events_total")?,
            );
            let shed0 = agent.metric_sum("drainwatch_events_shed_total")?;
            let (n, rate) = pod.churn(plan, plan.phase_secs)?;
            on.push(rate);
            // The agent folds the kernel's per-CPU counters in once a second and drains the
            // ring behind the churn: its work for these connections ends after them.
            std::thread::sleep(Duration::from_millis(1500));
            work.cpu_seconds += agent.cpu_seconds()? - cpu0;
            work.records += agent.metric_sum("drainwatch_events_total")? - rec0;
            work.shed += agent.metric_sum("drainwatch_events_shed_total")? - shed0;
            work.connections += n;
            let tracer = Bpftrace::start()?;
            let (a, t, n) = kernel(agent.pid(), tracer.pid())?;
            agent_kernel.0 += a;
            agent_kernel.1 += n;
            trace_kernel.0 += t;
            trace_kernel.1 += n;
            kernel_ratios.push(a / t.max(1.0));
        }
        {
            // The same hooks with programs that return at once: the ceiling attaching them
            // puts on the pod's throughput, whatever the programs do.
            let _floor = Agent::start(bin, &["--attach-only"])?;
            floor.push(pod.churn(plan, plan.phase_secs)?.1);
        }
        {
            let _tracer = Bpftrace::start()?;
            trace.push(pod.churn(plan, plan.phase_secs)?.1);
        }
    }
    let (off, on, trace, floor) = (median(&off), median(&on), median(&trace), median(&floor));
    let ratio = on / off;
    rows.push(Row {
        figure: "pod churn throughput, agent at its defaults (connections/s)".into(),
        value: format!("{on:.0}"),
        baseline: format!("{off:.0} (nothing attached)"),
        ratio: pct(ratio),
        budget: "≥ 97%".into(),
        verdict: Verdict::of(ratio >= 0.97),
    });
    rows.push(Row {
        figure: "pod churn throughput, the agent's hooks with programs returning at once \
                 (`--attach-only`)"
            .into(),
        value: format!("{floor:.0}"),
        baseline: format!("{off:.0} (nothing attached)"),
        ratio: pct(floor / off),
        budget: "-".into(),
        verdict: Verdict::Info,
    });
    rows.push(Row {
        figure: "pod churn throughput, agent at its defaults against its hooks returning at \
                 once (the programs' and the agent's own work)"
            .into(),
        value: format!("{on:.0}"),
        baseline: format!("{floor:.0} (`--attach-only`)"),
        ratio: pct(on / floor),
        budget: "-".into(),
        verdict: Verdict::Info,
    });
    rows.push(Row {
        figure: "pod churn throughput, bpftrace count() on the same hooks".into(),
        value: format!("{trace:.0}"),
        baseline: format!("{off:.0} (nothing attached)"),
        ratio: pct(trace / off),
        budget: "-".into(),
        verdict: Verdict::Info,
    });
    let per_conn = work.cpu_seconds / work.connections.max(1.0);
    // At 10,000 connections/s, c CPU-seconds per connection keep 10,000·c cores busy.
    let millicores = per_conn * 10_000.0 * 1000.0;
    rows.push(Row {
        figure: "agent CPU per 10,000 pod connections/s (user + system)".into(),
        value: format!("{millicores:.1} millicores"),
        baseline: format!("{:.2} µs per connection", per_conn * 1e6),
        ratio: "-".into(),
        budget: "≤ 20 millicores".into(),
        verdict: Verdict::of(millicores <= 20.0),
    });
    let (agent_ns, trace_ns) = (
        agent_kernel.0 / agent_kernel.1.max(1.0),
        trace_kernel.0 / trace_kernel.1.max(1.0),
    );
    let ratio = median(&kernel_ratios);
    let (lo, hi) = kernel_ratios
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
    rows.push(Row {
        figure: "kernel program time per pod connection (BPF stats, every hook, both attached)"
            .into(),
        value: format!("{agent_ns:.0} ns"),
        baseline: format!("{trace_ns:.0} ns (bpftrace count())"),
        ratio: format!("{ratio:.2}× (rounds {lo:.2}–{hi:.2}×)"),
        budget: "≤ bpftrace".into(),
        verdict: Verdict::of(ratio <= 1.0),
    });
    rows.push(Row {
        figure: "records per pod connection (received by the agent)".into(),
        value: format!("{:.2}", work.records / work.connections.max(1.0)),
        baseline: format!(
            "{:.0} records, {:.0} shed, for {:.0} connections",
            work.records, work.shed, work.connections
        ),
        ratio: "-".into(),
        budget: "≤ 1".into(),
        verdict: Verdict::of(work.records <= work.connections && work.shed == 0.0),
    });
    Ok(())
}
