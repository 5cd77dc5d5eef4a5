//! What one Service lookup costs the agent: the agent's own ctnetlink code
//! (`drainwatch::enrich::nat::Conntrack`) against the kernel's real connection tracking, in
//! the host's network namespace (run as root there, where conntrack tracks loopback).
//!
//! nat <lookups> <dump entries>
//!
//! - a GET by the original tuple of a tracked connection (a loopback connection held open),
//! - a GET of a tuple nobody has (a failed connect's entry gone: `not_found`),
//! - a dump by destination of `<dump entries>` tracked connections (what a no-endpoint reject
//!   asks, at most once per address every 5 s),
//!
//! each timed by the wall clock and by the process's CPU time (user + system: the kernel's
//! work on the agent's behalf is the agent's). Prints one JSON line.

use std::{
    net::{SocketAddr, TcpListener, TcpStream},
    time::Instant,
};

use drainwatch::enrich::nat::Conntrack;

fn fail(what: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("nat: {what}: {e}");
    std::process::exit(1)
}

/// CPU seconds of this process so far (user + system).
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        fail("getrusage", std::io::Error::last_os_error());
    }
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// `n` runs of `op`: (wall ns, CPU ns) per run.
fn timed(n: usize, mut op: impl FnMut()) -> (f64, f64) {
    let (w0, c0) = (Instant::now(), cpu_seconds());
    for _ in 0..n {
        op();
    }
    let (wall, cpu) = (w0.elapsed().as_secs_f64(), cpu_seconds() - c0);
    (wall * 1e9 / n as f64, cpu * 1e9 / n as f64)
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| {
            a.parse()
                .unwrap_or_else(|e| fail("nat <lookups> <dump entries>", e))
        })
        .collect();
    let (n, entries) = match args[..] {
        [n, e] => (n, e),
        _ => fail("usage", "nat <lookups> <dump entries>"),
    };
    let mut ct = Conntrack::open(true)
        .unwrap_or_else(|e| fail("a ctnetlink socket (root, host namespace)", e));
    let listener =
        TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| fail("a loopback listener", e));
    let to = listener
        .local_addr()
        .unwrap_or_else(|e| fail("its address", e));
    // Both ends held open: tracked for as long as the run.
    let mut held = Vec::new();
    for _ in 0..entries.max(1) {
        let c = TcpStream::connect(to).unwrap_or_else(|e| fail("connect", e));
        let (s, _) = listener.accept().unwrap_or_else(|e| fail("accept", e));
        held.push((c, s));
    }
    let from = held[0]
        .0
        .local_addr()
        .unwrap_or_else(|e| fail("the client's address", e));
    let tracked = ct
        .lookup(from, to)
        .unwrap_or_else(|e| fail("a lookup", e))
        .is_some();
    let (found_ns, found_cpu_ns) = timed(n, || {
        ct.lookup(from, to).unwrap_or_else(|e| fail("a lookup", e));
    });
    // A port nothing uses on this listener's address.
    let nobody: SocketAddr = SocketAddr::new(from.ip(), 9);
    if ct
        .lookup(nobody, to)
        .unwrap_or_else(|e| fail("a lookup", e))
        .is_some()
    {
        fail("a lookup", "a tuple nobody has was found");
    }
    let (missing_ns, missing_cpu_ns) = timed(n, || {
        ct.lookup(nobody, to)
            .unwrap_or_else(|e| fail("a lookup", e));
    });
    let dumps = (n / 100).max(10);
    let (dump_ns, dump_cpu_ns) = timed(dumps, || {
        ct.served_by(to).unwrap_or_else(|e| fail("a dump", e));
    });
    println!(
        "{}",
        serde_json::json!({
            "tracked": tracked,
            "lookups": n,
            "found_ns": found_ns,
            "found_cpu_ns": found_cpu_ns,
            "not_found_ns": missing_ns,
            "not_found_cpu_ns": missing_cpu_ns,
            "dumps": dumps,
            "dump_entries": held.len(),
            "dump_ns": dump_ns,
            "dump_cpu_ns": dump_cpu_ns,
        })
    );
}
