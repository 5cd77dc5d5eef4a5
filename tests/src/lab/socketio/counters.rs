//! A network namespace's own TCP counters, as `nstat` shows them: `Tcp: OutRsts, PassiveOpens`
//! (`/proc/<pid>/net/snmp`) and `TcpExt: ListenOverflows, ListenDrops` (`net/netstat`), read
//! through a process in it, and sampled on a thread while it lives: a container's namespace
//! goes with its last process, so its counters are known up to then.

use std::{
    fs,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use crate::lab::{clock, storm::tcp_ext};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub out_rsts: u64,
    pub passive_opens: u64,
    pub listen_overflows: u64,
    pub listen_drops: u64,
}

/// One field of the `Tcp:` lines of `pid`'s namespace; None once it is gone.
fn snmp_tcp(pid: u32, field: &str) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/net/snmp")).ok()?;
    let mut tcp = text.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next()?, tcp.next()?);
    let i = names.split_whitespace().position(|n| n == field)?;
    values.split_whitespace().nth(i)?.parse().ok()
}

impl Counters {
    /// The counters of `pid`'s network namespace, None once the process is gone.
    pub fn read(pid: u32) -> Option<Counters> {
        Some(Counters {
            out_rsts: snmp_tcp(pid, "OutRsts")?,
            passive_opens: snmp_tcp(pid, "PassiveOpens")?,
            listen_overflows: tcp_ext(pid, "ListenOverflows")?,
            listen_drops: tcp_ext(pid, "ListenDrops")?,
        })
    }
}

/// The machine's CPU time so far (`/proc/stat`'s `cpu` line): (idle incl. iowait, total), in
/// ticks. Two readings give the machine's idle share between them: whether the fleet, the
/// servers and the agent had the 2 CPUs to themselves or waited for them.
pub fn cpu_ticks() -> Option<(u64, u64)> {
    let text = fs::read_to_string("/proc/stat").ok()?;
    let v: Vec<u64> = (text.lines().next()?.split_whitespace().skip(1))
        .filter_map(|x| x.parse().ok())
        .collect();
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    Some((idle, v.iter().take(8).sum()))
}

/// The idle share between two [`cpu_ticks`] readings.
pub fn idle_share(a: (u64, u64), b: (u64, u64)) -> f64 {
    (b.0 - a.0) as f64 / (b.1 - a.1).max(1) as f64
}

/// Samples a namespace's counters every `every` until finished or its process is gone.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<(u64, Counters)>>,
}

impl Sampler {
    pub fn start(pid: u32, every: Duration) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut out = Vec::new();
            while !s.load(Ordering::Relaxed) {
                let at = clock::mono_ns();
                match Counters::read(pid) {
                    Some(c) => out.push((at, c)),
                    None => break,
                }
                std::thread::sleep(every);
            }
            out
        });
        Sampler { stop, thread }
    }

    /// The samples, (CLOCK_MONOTONIC ns, counters), oldest first.
    pub fn finish(self) -> Vec<(u64, Counters)> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("counter sampler")
    }
}
