//! BPF around the agent: the reference tracer (bpftrace counting on the same tracepoints), the
//! kernel's per-program run-time statistics and the cost per run they give.

use std::{
    io::{BufRead as _, BufReader},
    process::{Child, Command, Stdio},
};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::Value;

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
    // `sock_length` (tp_btf): every socket send and receive; the churn's are no proxy's, so
    // this measures what other traffic pays (one hash miss).
    "sock:sock_send_length",
    "sock:sock_recv_length",
    "tcp:tcp_destroy_sock",
];

/// bpftrace with one `count()` per tracepoint, killed on drop.
pub(super) struct Bpftrace {
    child: Child,
}

impl Bpftrace {
    pub(super) fn start() -> Result<Self> {
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
        let tracer = Self { child };
        // It prints that line before it attaches: a SIGINT before its handler is in place was
        // seen lost, and a churn started early would go partly uncounted.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while tracer.attached() < TRACEPOINTS.len() {
            ensure!(
                std::time::Instant::now() < deadline,
                "bpftrace attached {} of {} probes in 30 s",
                tracer.attached(),
                TRACEPOINTS.len()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Ok(tracer)
    }

    /// Tracepoints it has attached, as the kernel lists them (`bpftool perf list`).
    fn attached(&self) -> usize {
        let pid = u64::from(self.child.id());
        bpftool(&["perf", "list"]).map_or(0, |v| {
            v.as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["pid"].as_u64() == Some(pid))
                .count()
        })
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Bpftrace {
    fn drop(&mut self) {
        // SIGINT lets it detach and print; killed if it has not gone within 5 s.
        // SAFETY: kill(2) of our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `kernel.bpf_stats_enabled` on for the run, restored on drop.
pub(super) struct BpfStats {
    before: String,
}

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// Per hook: (run_time_ns, run_cnt) of the programs one process holds.
pub(super) type Snapshot = std::collections::BTreeMap<String, (u64, u64)>;

impl BpfStats {
    /// Restores the setting found on drop.
    pub(super) fn keep() -> Result<Self> {
        let before = std::fs::read_to_string(BPF_STATS).context("reading bpf_stats_enabled")?;
        Ok(Self { before })
    }

    pub(super) fn set(&self, on: bool) -> Result<()> {
        std::fs::write(BPF_STATS, if on { "1" } else { "0" }).context("setting bpf_stats_enabled")
    }

    /// The run-time counters of the programs `pid` holds, by program name: the hook for both
    /// the agent's and bpftrace's programs (truncated by the kernel to 15 characters).
    pub(super) fn snapshot(&self, pid: u32) -> Result<Snapshot> {
        let ids = fdinfo_ids(pid, "prog_id:")?;
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

/// Kernel memory of each map `pid` holds, by map name (bytes, as `bpftool map show` reports
/// the kernel's own figure: `bytes_memlock`, its memory usage estimate on 6.5+).
pub(super) fn map_memory(pid: u32) -> Result<std::collections::BTreeMap<String, u64>> {
    let ids = fdinfo_ids(pid, "map_id:")?;
    let mut out = std::collections::BTreeMap::new();
    for m in bpftool(&["map", "show"])?.as_array().into_iter().flatten() {
        let (Some(id), Some(bytes)) = (m["id"].as_u64(), m["bytes_memlock"].as_u64()) else {
            continue;
        };
        if ids.contains(&id) {
            let name = m["name"].as_str().unwrap_or("?").to_string();
            *out.entry(name).or_default() += bytes;
        }
    }
    ensure!(!out.is_empty(), "process {pid} holds no BPF maps");
    Ok(out)
}

/// The BPF object ids (`prog_id:` or `map_id:`) behind `pid`'s descriptors.
fn fdinfo_ids(pid: u32, key: &str) -> Result<std::collections::BTreeSet<u64>> {
    let mut ids = std::collections::BTreeSet::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))?.flatten() {
        let info = std::fs::read_to_string(e.path()).unwrap_or_default();
        ids.extend(
            info.lines()
                .filter_map(|l| l.strip_prefix(key))
                .filter_map(|v| v.trim().parse::<u64>().ok()),
        );
    }
    Ok(ids)
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
pub(super) struct Costs(std::collections::BTreeMap<String, (u64, u64)>);

impl Costs {
    pub(super) fn add(&mut self, before: &Snapshot, after: &Snapshot) {
        for (tp, (ns, n)) in after {
            let (ns0, n0) = before.get(tp).copied().unwrap_or_default();
            let e = self.0.entry(tp.clone()).or_default();
            e.0 += ns.saturating_sub(ns0);
            e.1 += n.saturating_sub(n0);
        }
    }

    /// Mean ns per run, and runs, of each tracepoint that ran.
    pub(super) fn per_run(&self) -> std::collections::BTreeMap<String, (f64, u64)> {
        self.0
            .iter()
            .filter(|(_, (_, n))| *n > 0)
            .map(|(tp, (ns, n))| (tp.clone(), (*ns as f64 / *n as f64, *n)))
            .collect()
    }
}
