//! `cargo xtask bench`: the agent's overhead, each figure next to a baseline measured in the
//! same run (these machines are shared and noisy: an absolute time alone means little).
//!
//! - Churn: loopback connect/accept/close, refused connects and aborts (`bench/src/bin/churn.rs`)
//!   with nothing attached, with the agent, with the agent's hooks attached but its programs
//!   returning at once (`--attach-only`: the floor that attaching these hooks costs on this
//!   kernel, whatever the programs do), with the agent keeping every event
//!   (`--host-traffic all`: the loopback churn touches no container, so by default the
//!   programs drop it before reserving a record; kept, it costs what a container's own
//!   connections cost), and with a minimal bpftrace tracer (`count()` on the same
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

use std::{
    fmt::Write as _,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::TcpStream,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::Value;

use crate::{cargo, repo_root, run_cmd, target_dir};

/// Tracepoints the agent attaches on this kernel (kprobes and fentry are unavailable here);
/// the reference tracer counts on the same ones.
const TRACEPOINTS: &[&str] = &[
    "tcp:tcp_send_reset",
    "tcp:tcp_receive_reset",
    "sock:inet_sock_set_state",
    "sock:inet_sk_error_report",
    "signal:signal_generate",
    "sched:sched_process_exit",
    "cgroup:cgroup_rmdir",
    "skb:kfree_skb",
    "syscalls:sys_exit_accept",
    "syscalls:sys_exit_accept4",
];

/// Programs the budget calls hot.
const HOT: &[&str] = &["inet_sock_set_state", "tcp_send_reset", "tcp_receive_reset"];

pub struct Settings {
    pub smoke: bool,
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

/// One line of the report.
struct Row {
    figure: String,
    value: String,
    baseline: String,
    ratio: String,
    budget: String,
    verdict: Verdict,
}

#[derive(Clone, Copy, PartialEq)]
enum Verdict {
    Pass,
    Miss,
    Info,
}

impl Verdict {
    fn of(ok: bool) -> Self {
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
    let stats = BpfStats::keep()?;
    let mut rows = Vec::new();

    // Churn: off / agent / agent keeping all host traffic / bpftrace, interleaved. Throughput
    // is measured with BPF statistics off (as in production: they add two clock reads to
    // every program run), then the kernel cost per run in a second phase with them on.
    let (mut off, mut on, mut all, mut trace) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut floor = Vec::new();
    let (mut agent_costs, mut all_costs, mut trace_costs, mut floor_costs) = (
        Costs::default(),
        Costs::default(),
        Costs::default(),
        Costs::default(),
    );
    let mut agent_churn_cpu = Vec::new();
    let cost_plan = Plan {
        phase_secs: plan.phase_secs / 2.0,
        ..plan
    };
    // The throughput phase, then the cost phase, against programs `pid` holds.
    let measure = |pid: u32, costs: &mut Costs| -> Result<f64> {
        stats.set(false)?;
        let rate = churn(&bin, &plan, 0.0)?;
        stats.set(true)?;
        let before = stats.snapshot(pid)?;
        churn(&bin, &cost_plan, 0.0)?;
        costs.add(&before, &stats.snapshot(pid)?);
        stats.set(false)?;
        Ok(rate)
    };
    for round in 0..plan.rounds {
        eprintln!("[bench] churn round {}/{}", round + 1, plan.rounds);
        stats.set(false)?;
        off.push(churn(&bin, &plan, 0.0)?);
        {
            // The loopback churn touches no container: the default drops it in the kernel.
            // With `--host-traffic all` every event is kept, which is what a container's own
            // connections cost.
            let agent = Agent::start(&bin, &["--host-traffic", "all"])?;
            all.push(measure(agent.pid(), &mut all_costs)?);
        }
        {
            let agent = Agent::start(&bin, &[])?;
            let cpu0 = agent.cpu_seconds()?;
            let t = Instant::now();
            stats.set(false)?;
            on.push(churn(&bin, &plan, 0.0)?);
            agent_churn_cpu.push((agent.cpu_seconds()? - cpu0) / t.elapsed().as_secs_f64());
            stats.set(true)?;
            let before = stats.snapshot(agent.pid())?;
            churn(&bin, &cost_plan, 0.0)?;
            agent_costs.add(&before, &stats.snapshot(agent.pid())?);
            stats.set(false)?;
        }
        {
            // The same hooks with programs that return at once: what attaching them costs
            // the kernel before any of the programs' work.
            let agent = Agent::start(&bin, &["--attach-only"])?;
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
    // Each round's ratio to that round's agent-off run: the spread says how far to trust the
    // medians on a machine whose speed drifts.
    let spread = |v: &[f64]| {
        let r: Vec<f64> = v.iter().zip(&off).map(|(x, o)| x / o).collect();
        let (lo, hi) = r
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
        if r.len() > 1 {
            format!(" (rounds {:.1}–{})", lo * 100.0, pct(hi))
        } else {
            String::new()
        }
    };
    let (on_spread, floor_spread, trace_spread) = (spread(&on), spread(&floor), spread(&trace));
    let (off, on, all, trace) = (median(&off), median(&on), median(&all), median(&trace));
    let floor = median(&floor);
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
    for (tp, (ns, runs)) in &all_costs.per_run() {
        if !HOT.contains(&tp.as_str()) {
            continue;
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
    drop(stats);

    // Userspace capacity and loss.
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

    // Footprint.
    eprintln!("[bench] footprint");
    let rest = {
        let agent = Agent::start(&bin, &[])?;
        // Past the start-up scan and its one-off work.
        std::thread::sleep(Duration::from_secs(3));
        let (cpu0, t) = (agent.cpu_seconds()?, Instant::now());
        std::thread::sleep(Duration::from_secs_f64(plan.rest_secs));
        let cpu = (agent.cpu_seconds()? - cpu0) / t.elapsed().as_secs_f64();
        let capped = {
            let cpu0 = agent.cpu_seconds()?;
            let t = Instant::now();
            let rate = churn(&bin, &plan, plan.capped_rate)?;
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
        value: format!("{:.1}%", capped_cpu * 100.0),
        baseline: format!("{capped_rate:.0} connections/s reached"),
        ratio: "-".into(),
        budget: "-".into(),
        verdict: Verdict::Info,
    });
    rows.push(Row {
        figure: "agent CPU under unbounded churn".into(),
        value: format!("{:.1}%", median(&agent_churn_cpu) * 100.0),
        baseline: format!("{on:.0} connections/s"),
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

    let table = render(&rows);
    println!("{table}");
    if !settings.smoke {
        let doc = document(&table, &plan)?;
        std::fs::write(root.join("BENCHMARKS.md"), doc).context("writing BENCHMARKS.md")?;
        eprintln!("[bench] wrote BENCHMARKS.md");
    }
    Ok(())
}

fn pct(r: f64) -> String {
    format!("{:.1}%", r * 100.0)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn num(v: &Value, key: &str) -> Result<f64> {
    v[key]
        .as_f64()
        .with_context(|| format!("no number {key} in {v}"))
}

/// Runs a workload that prints one JSON line.
fn json_of(cmd: &mut Command) -> Result<Value> {
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

fn render(rows: &[Row]) -> String {
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

fn document(table: &str, plan: &Plan) -> Result<String> {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")?;
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let date = crate::capture(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"]))
        .unwrap_or_default();
    Ok(format!(
        "# Benchmarks\n\n\
        Written by `cargo xtask bench` on {date_trim}: kernel {kernel_trim}, {cpus} CPUs. \
        Churn phases of {secs} s, {rounds} interleaved rounds (off, agent, agent keeping \
        every event, bpftrace), medians; throughput with `kernel.bpf_stats_enabled` off, as in \
        production, and the kernel cost per run from a following phase of half the length with \
        it on. \
        Every figure sits beside a baseline measured in the same run; absolute numbers move \
        with whatever else the machine does.\n\n{table}\n\
        How each figure is measured: see the module documentation of `xtask/src/bench.rs`. \
        The 1,000-container memory figure is the agent's RSS at rest plus what the pipeline's \
        state grows by when a synthetic host of 1,000 containers and 100,000 open connections \
        is fed through the real pipeline code (`bench/src/bin/pipeline.rs footprint`): a \
        machine with 1,000 real containers is not available here.\n",
        date_trim = date.trim(),
        kernel_trim = kernel.trim(),
        secs = plan.phase_secs,
        rounds = plan.rounds,
    ))
}

/// The release agent on a free port, killed on drop.
struct Agent {
    child: Child,
    port: u16,
}

impl Agent {
    fn start(bin: &Path, extra: &[&str]) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new(bin.join("drainwatch"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the agent")?;
        let agent = Self { child, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ready(port) {
            ensure!(Instant::now() < deadline, "the agent was not ready in 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(agent)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The sum of a metric's series on /metrics.
    fn metric_sum(&self, name: &str) -> Result<f64> {
        let text = get(self.port, "/metrics").context("scraping the agent")?;
        Ok(text
            .lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }

    fn cpu_seconds(&self) -> Result<f64> {
        cpu_seconds(self.pid())
    }

    fn rss_kib(&self) -> Result<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .context("no VmRSS")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // SAFETY: kill(2) of our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

fn ready(port: u16) -> bool {
    get(port, "/readyz").is_some_and(|r| r.starts_with("HTTP/1.1 200"))
}

fn get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).ok()?;
    Some(reply)
}

/// User + system CPU seconds of a process.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command (which may contain spaces) start at state (field 3).
    let rest = stat.rsplit_once(')').map(|x| x.1).context("no comm")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f
        .get(11)
        .zip(f.get(12))
        .and_then(|(u, s)| Some(u.parse::<f64>().ok()? + s.parse::<f64>().ok()?))
        .context("no utime/stime")?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks / hz)
}

/// bpftrace with one `count()` per tracepoint, killed on drop.
struct Bpftrace {
    child: Child,
}

impl Bpftrace {
    fn start() -> Result<Self> {
        let probes: Vec<String> = TRACEPOINTS
            .iter()
            .map(|t| format!("tracepoint:{t}"))
            .collect();
        let script = format!("{} {{ @[probe] = count(); }}", probes.join(", "));
        let mut child = Command::new("bpftrace")
            .args(["-e", &script])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting bpftrace (apt-get install bpftrace; `cargo xtask setup` does)")?;
        let stdout = child.stdout.take().context("bpftrace stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        // It prints "Attaching N probes..." once every probe is attached.
        loop {
            match lines.next() {
                Some(Ok(l)) if l.starts_with("Attaching") => break,
                Some(Ok(_)) => {}
                _ => bail!("bpftrace exited before attaching"),
            }
        }
        // Keep draining its output so it never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Ok(Self { child })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Bpftrace {
    fn drop(&mut self) {
        // SAFETY: kill(2) of our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let _ = self.child.wait();
    }
}

/// `kernel.bpf_stats_enabled` on for the run, restored on drop.
struct BpfStats {
    before: String,
}

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// Per hook: (run_time_ns, run_cnt) of the programs one process holds.
type Snapshot = std::collections::BTreeMap<String, (u64, u64)>;

impl BpfStats {
    /// Restores the setting found on drop.
    fn keep() -> Result<Self> {
        let before = std::fs::read_to_string(BPF_STATS).context("reading bpf_stats_enabled")?;
        Ok(Self { before })
    }

    fn set(&self, on: bool) -> Result<()> {
        std::fs::write(BPF_STATS, if on { "1" } else { "0" }).context("setting bpf_stats_enabled")
    }

    /// The run-time counters of the programs `pid` holds, by program name: the hook for both
    /// the agent's and bpftrace's programs (truncated by the kernel to 15 characters).
    fn snapshot(&self, pid: u32) -> Result<Snapshot> {
        let mut ids = std::collections::BTreeSet::new();
        for e in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))?.flatten() {
            let info = std::fs::read_to_string(e.path()).unwrap_or_default();
            ids.extend(
                info.lines()
                    .filter_map(|l| l.strip_prefix("prog_id:"))
                    .filter_map(|v| v.trim().parse::<u64>().ok()),
            );
        }
        let progs = bpftool(&["prog", "show"])?;
        let mut out = Snapshot::new();
        for p in progs.as_array().into_iter().flatten() {
            let (Some(id), Some(name)) = (p["id"].as_u64(), p["name"].as_str()) else {
                continue;
            };
            if !ids.contains(&id) {
                continue;
            }
            // The agent's tp_btf program for a tracepoint is `<tracepoint>_btf`.
            let name = name.strip_suffix("_btf").unwrap_or(name);
            let hook = TRACEPOINTS
                .iter()
                .filter_map(|t| t.split_once(':').map(|x| x.1))
                .find(|t| t.starts_with(name))
                .unwrap_or(name);
            let e = out.entry(hook.to_string()).or_default();
            e.0 += p["run_time_ns"].as_u64().unwrap_or(0);
            e.1 += p["run_cnt"].as_u64().unwrap_or(0);
        }
        Ok(out)
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write(BPF_STATS, self.before.trim());
    }
}

fn bpftool(args: &[&str]) -> Result<Value> {
    let out = Command::new("bpftool")
        .args(args)
        .arg("--json")
        .stderr(Stdio::null())
        .output()
        .context("running bpftool")?;
    ensure!(out.status.success(), "bpftool {args:?} failed");
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// Run time and runs summed over rounds, per tracepoint.
#[derive(Default)]
struct Costs(std::collections::BTreeMap<String, (u64, u64)>);

impl Costs {
    fn add(&mut self, before: &Snapshot, after: &Snapshot) {
        for (tp, (ns, n)) in after {
            let (ns0, n0) = before.get(tp).copied().unwrap_or_default();
            let e = self.0.entry(tp.clone()).or_default();
            e.0 += ns.saturating_sub(ns0);
            e.1 += n.saturating_sub(n0);
        }
    }

    /// Mean ns per run, and runs, of each tracepoint that ran.
    fn per_run(&self) -> std::collections::BTreeMap<String, (f64, u64)> {
        self.0
            .iter()
            .filter(|(_, (_, n))| *n > 0)
            .map(|(tp, (ns, n))| (tp.clone(), (*ns as f64 / *n as f64, *n)))
            .collect()
    }
}
