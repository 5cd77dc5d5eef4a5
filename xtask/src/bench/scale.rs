//! The scale phase, on real kernel objects: network namespaces made with `ip netns add`, each
//! a container to the agent (a process in a Docker-shaped cgroup, inside the namespace, holding
//! a listener and connections to it: `bench/src/bin/namespaces.rs`). The agent's RSS once it
//! follows all of them, and what its listen-path samples cost, beside the same agent on the
//! same machine without them. Everything made is removed on drop, on error and on Ctrl-C; what
//! a killed run left behind is removed by the next.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};

use super::{
    Plan,
    agent::Agent,
    report::{Row, Verdict},
};

/// Namespaces and the cgroup parent are named `<PREFIX><pid of this run>`.
const PREFIX: &str = "dwscale-";
const CGROUP_ROOT: &str = "/sys/fs/cgroup/unified";
const BUDGET_MIB: f64 = 32.0;

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn interrupted(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Ctrl-C and SIGTERM end the phase through its guards instead of killing the process; the
/// defaults come back on drop.
struct Signals;

impl Signals {
    fn catch() -> Self {
        for sig in [libc::SIGINT, libc::SIGTERM] {
            // SAFETY: the handler only stores to an atomic.
            unsafe { libc::signal(sig, interrupted as *const () as libc::sighandler_t) };
        }
        Self
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        for sig in [libc::SIGINT, libc::SIGTERM] {
            // SAFETY: restores the default disposition.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
    }
}

/// Sleeps, or fails at once when interrupted.
fn wait(d: Duration) -> Result<()> {
    let end = Instant::now() + d;
    while Instant::now() < end {
        ensure!(!INTERRUPTED.load(Ordering::Relaxed), "interrupted");
        std::thread::sleep(Duration::from_millis(100).min(end - Instant::now()));
    }
    Ok(())
}

/// The namespaces, their cgroups and the process holding their sockets; all removed on drop.
struct Fleet {
    name: String,
    count: usize,
    holder: Option<(Child, ChildStdin)>,
}

impl Fleet {
    fn create(bin: &Path, count: usize, conns: usize) -> Result<Self> {
        let name = format!("{PREFIX}{}", std::process::id());
        let mut fleet = Self {
            name,
            count,
            holder: None,
        };
        let adds: String = (0..count)
            .map(|i| format!("netns add {}-{i}\n", fleet.name))
            .collect();
        ip_batch(&adds)?;
        let parent = fleet.cgroup_parent();
        std::fs::create_dir_all(&parent).with_context(|| format!("{}", parent.display()))?;
        let mut child = Command::new(bin.join("namespaces"))
            .args([&fleet.name, &count.to_string(), &conns.to_string()])
            .arg(&parent)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting bench/src/bin/namespaces.rs")?;
        let (stdin, stdout) = (child.stdin.take(), child.stdout.take());
        if let Some(stdin) = stdin {
            fleet.holder = Some((child, stdin));
        }
        let mut line = String::new();
        BufReader::new(stdout.context("no stdout")?).read_line(&mut line)?;
        ensure!(
            line.contains("\"namespaces\""),
            "the namespaces were not made: {line:?}"
        );
        Ok(fleet)
    }

    fn cgroup_parent(&self) -> PathBuf {
        Path::new(CGROUP_ROOT).join(&self.name)
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if let Some((mut child, stdin)) = self.holder.take() {
            // Its end of file, then its end: each process it forked dies with it.
            drop(stdin);
            let _ = child.kill();
            let _ = child.wait();
        }
        remove(&self.name, self.count);
    }
}

/// Removes what a run named `name` made: its cgroups once their processes are gone, then its
/// namespaces.
fn remove(name: &str, count: usize) {
    let parent = Path::new(CGROUP_ROOT).join(name);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let dirs: Vec<PathBuf> = std::fs::read_dir(&parent)
            .map(|d| {
                d.filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| p.is_dir())
                    .collect()
            })
            .unwrap_or_default();
        // rmdir fails while a process is still in it (the kill is asynchronous).
        let left = dirs
            .iter()
            .filter(|d| std::fs::remove_dir(d).is_err())
            .count();
        if left == 0 || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = std::fs::remove_dir(&parent);
    let existing: String = (0..count)
        .map(|i| format!("{name}-{i}"))
        .filter(|n| Path::new("/run/netns").join(n).exists())
        .map(|n| format!("netns del {n}\n"))
        .collect();
    if !existing.is_empty()
        && let Err(e) = ip_batch(&existing)
    {
        eprintln!("[bench] scale: removing namespaces: {e:#}");
    }
}

/// What runs killed outright left: namespaces and cgroups of runs whose process is gone.
fn remove_stale() {
    let mut runs: Vec<(String, usize)> = Vec::new();
    let names = std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .chain(std::fs::read_dir(CGROUP_ROOT).into_iter().flatten())
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok());
    for n in names {
        let Some(rest) = n.strip_prefix(PREFIX) else {
            continue;
        };
        let (pid, index) = rest.split_once('-').unwrap_or((rest, "0"));
        let index: usize = index.parse().unwrap_or(0);
        if pid.parse::<u32>().is_err() || Path::new("/proc").join(pid).exists() {
            continue;
        }
        let run = format!("{PREFIX}{pid}");
        match runs.iter_mut().find(|(r, _)| *r == run) {
            Some((_, n)) => *n = (*n).max(index + 1),
            None => runs.push((run, index + 1)),
        }
    }
    for (run, count) in runs {
        eprintln!("[bench] scale: removing what run {run} left");
        remove(&run, count);
    }
}

fn ip_batch(commands: &str) -> Result<()> {
    let mut ip = Command::new("ip")
        .args(["-force", "-batch", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .context("running ip")?;
    ip.stdin
        .take()
        .context("no stdin")?
        .write_all(commands.as_bytes())?;
    let status = ip.wait()?;
    ensure!(status.success(), "ip -batch failed ({status})");
    Ok(())
}

/// The agent at rest, as one run measured it.
struct Rest {
    rss_mib: f64,
    /// Share of one core, over the whole rest period.
    cpu: f64,
    /// Full samples (all containers) seen during the rest period.
    samples: f64,
    /// Wall and CPU seconds per full sample.
    sample_wall: f64,
    sample_cpu: f64,
    /// Share of one core that full samples took.
    sampling_cpu: f64,
    containers: f64,
    connections: f64,
}

fn at_rest(agent: &Agent, secs: f64) -> Result<Rest> {
    let all = "scope=\"all\"";
    let read = || -> Result<[f64; 4]> {
        Ok([
            agent.cpu_seconds()?,
            agent.metric_where("drainwatch_listen_sample_seconds_count", all)?,
            agent.metric_where("drainwatch_listen_sample_seconds_sum", all)?,
            agent.metric_where("drainwatch_listen_sample_cpu_seconds_total", all)?,
        ])
    };
    let (before, t) = (read()?, Instant::now());
    wait(Duration::from_secs_f64(secs))?;
    // A long run waits for two full samples however long they take (capped): their cost is
    // the figure.
    let want = if secs >= 10.0 { 2.0 } else { 0.0 };
    let mut after = read()?;
    while after[1] - before[1] < want && t.elapsed() < Duration::from_secs(600) {
        wait(Duration::from_secs(1))?;
        after = read()?;
    }
    let d: Vec<f64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
    let secs = t.elapsed().as_secs_f64();
    Ok(Rest {
        rss_mib: agent.rss_kib()? / 1024.0,
        cpu: d[0] / secs,
        sampling_cpu: d[3] / secs,
        samples: d[1],
        sample_wall: d[2] / d[1],
        sample_cpu: d[3] / d[1],
        containers: agent.metric_sum("drainwatch_containers")?,
        connections: agent.metric_where("drainwatch_state_entries", "\"inbound_sockets\"")?,
    })
}

/// Waits until the agent follows `containers` containers and `connections` inbound
/// connections, and its first full listen-path sample after that is done.
fn settle(agent: &Agent, containers: f64, connections: f64) -> Result<Duration> {
    let t = Instant::now();
    // 1,000 namespaces took the agent minutes (see BENCHMARKS.md): waited for, and reported.
    let deadline = t + Duration::from_secs(900);
    while agent.metric_sum("drainwatch_containers")? < containers
        || agent.metric_where("drainwatch_state_entries", "\"inbound_sockets\"")? < connections
    {
        ensure!(
            Instant::now() < deadline,
            "the agent did not see {containers} containers and {connections} connections in 900 s"
        );
        wait(Duration::from_millis(500))?;
    }
    let seen = t.elapsed();
    let samples = || agent.metric_where("drainwatch_listen_sample_seconds_count", "\"all\"");
    let first = samples()?;
    while samples()? <= first {
        ensure!(Instant::now() < deadline, "no full listen-path sample");
        wait(Duration::from_millis(200))?;
    }
    Ok(seen)
}

pub(super) fn scale_phase(bin: &Path, plan: &Plan, rows: &mut Vec<Row>) -> Result<()> {
    let _signals = Signals::catch();
    remove_stale();
    let (n, conns) = (plan.scale_namespaces, plan.scale_conns);
    eprintln!("[bench] scale: the agent alone");
    let base = {
        let agent = Agent::start(bin, &[])?;
        settle(&agent, 0.0, 0.0)?;
        at_rest(&agent, plan.rest_secs)?
    };
    eprintln!(
        "[bench] scale: {n} network namespaces, {} connections",
        n * conns
    );
    let fleet = Fleet::create(bin, n, conns)?;
    let (full, seen) = {
        let agent = Agent::start(bin, &[])?;
        // Others' containers on the machine (tests running beside) come and go: the counts
        // are at least ours.
        let seen = settle(&agent, n as f64, (n * conns) as f64)?;
        (at_rest(&agent, plan.rest_secs)?, seen)
    };
    drop(fleet);
    if INTERRUPTED.load(Ordering::Relaxed) {
        bail!("interrupted");
    }
    push_rows(rows, n, conns, &base, &full, seen);
    Ok(())
}

fn push_rows(
    rows: &mut Vec<Row>,
    n: usize,
    conns: usize,
    base: &Rest,
    full: &Rest,
    seen: Duration,
) {
    // Containers of others (tests running beside) that the agent alone saw.
    let none = match base.containers.round() as u64 {
        1 => "1 container".to_string(),
        n => format!("{n} containers"),
    };
    rows.push(Row {
        figure: format!(
            "agent RSS with {n} network namespaces as containers and {} connections (real, `ip netns`)",
            n * conns
        ),
        value: format!("{:.1} MiB", full.rss_mib),
        baseline: format!("{:.1} MiB with {none}", base.rss_mib),
        ratio: format!("+{:.1} MiB", full.rss_mib - base.rss_mib),
        budget: format!("≤ {BUDGET_MIB:.0} MiB"),
        verdict: Verdict::of(full.rss_mib <= BUDGET_MIB),
    });
    rows.push(Row {
        figure: "what the agent reports it follows (`drainwatch_containers`, `drainwatch_state_entries{map=\"inbound_sockets\"}`)".into(),
        value: format!(
            "{:.0} containers, {:.0} connections (all seen {:.1} s after start)",
            full.containers,
            full.connections,
            seen.as_secs_f64()
        ),
        baseline: format!("{none}, {:.0} connections", base.connections),
        ratio: "-".into(),
        budget: "-".into(),
        verdict: Verdict::Info,
    });
    let per_sample = |r: &Rest, v: f64| {
        if r.samples > 0.0 {
            format!("{:.1} ms", v * 1e3)
        } else {
            "not measured".into()
        }
    };
    for (what, f) in [
        ("wall", (|r: &Rest| r.sample_wall) as fn(&Rest) -> f64),
        ("CPU", |r: &Rest| r.sample_cpu),
    ] {
        rows.push(Row {
            figure: format!("listen-path sample of every container ({what} time per sample)"),
            value: per_sample(full, f(full)),
            baseline: format!("{} with {none}", per_sample(base, f(base))),
            ratio: "-".into(),
            budget: "-".into(),
            verdict: Verdict::Info,
        });
    }
    let share = |r: &Rest| {
        if r.samples > 0.0 {
            format!("{:.3}%", r.sampling_cpu * 100.0)
        } else {
            "not measured".into()
        }
    };
    rows.push(Row {
        figure: "listen-path samples of every container: CPU (% of one core)".into(),
        value: share(full),
        baseline: format!("{} with {none}", share(base)),
        ratio: "-".into(),
        budget: "-".into(),
        verdict: Verdict::Info,
    });
    rows.push(Row {
        figure: format!("agent CPU at rest with {n} namespaces as containers (% of one core)"),
        value: format!("{:.2}%", full.cpu * 100.0),
        baseline: format!("{:.2}% with {none}", base.cpu * 100.0),
        ratio: "-".into(),
        budget: "-".into(),
        verdict: Verdict::Info,
    });
}
