//! Harness for the privileged tests: loads the real programs into the running kernel through
//! the agent's own capture code and collects the decoded events synchronously. Kernel paths
//! that the tests trigger (connect, close, kill, waitpid, rmdir) run their tracepoints before
//! the system call returns, so draining right after the action sees every event it caused.

pub mod accuracy;
pub mod agent;
pub mod browser;
pub mod gates;
pub mod kube_api;
pub mod matrix;
pub mod ops;
pub mod prometheus;

use std::sync::Arc;

use drainwatch::{
    capture::{self, Capture, event::Event, reader::Reader},
    telemetry::Telemetry,
};

/// Fails the test, loudly, when not root: privileged tests never skip.
pub fn require_root() {
    // SAFETY: no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this privileged test loads eBPF programs and needs root; run it through `cargo xtask test` as root"
    );
}

pub struct Harness {
    pub capture: Capture,
    pub reader: Reader,
    pub rx: drainwatch::queue::Receiver<Event>,
    pub metrics: Arc<Telemetry>,
    // Keeps the reactor the ring buffer's AsyncFd is registered with.
    _rt: tokio::runtime::Runtime,
}

impl Harness {
    /// What `start` loads: `only` (plan signal names) with a ring buffer of `ring_bytes`, the
    /// rest as `capture::Options` has it; the other constructors change one thing of it.
    pub fn options(only: &[&'static str], ring_bytes: u32) -> capture::Options {
        capture::Options {
            ring_buffer_bytes: ring_bytes,
            only: Some(only.to_vec()),
            ..Default::default()
        }
    }

    /// Loads the programs for `only` with a ring buffer of `ring_bytes`.
    pub fn start(only: &[&'static str], ring_bytes: u32) -> Self {
        Self::start_opts(Self::options(only, ring_bytes), 1 << 20)
    }

    /// As `start`, without trying the hooks labelled `skip` (to reach a fallback).
    pub fn start_skipping(only: &[&'static str], ring_bytes: u32, skip: &[&'static str]) -> Self {
        let opts = capture::Options {
            skip_hooks: skip.iter().map(|s| s.to_string()).collect(),
            ..Self::options(only, ring_bytes)
        };
        Self::start_opts(opts, 1 << 20)
    }

    /// As `start`, with a per-CPU budget of `per_cpu` packet-path events a second.
    pub fn start_budget(only: &[&'static str], per_cpu: u32) -> Self {
        let opts = capture::Options {
            packet_events_per_cpu: per_cpu,
            ..Self::options(only, 1 << 22)
        };
        Self::start_opts(opts, 1 << 20)
    }

    /// As `start`, with a queue of `queue` events between reader and consumer.
    pub fn start_with_queue(only: &[&'static str], ring_bytes: u32, queue: usize) -> Self {
        Self::start_opts(Self::options(only, ring_bytes), queue)
    }

    /// As `start`, as the agent loads the programs: records nothing in the agent reads are
    /// dropped in the kernel and counted as filtered (`capture::Options::lean`).
    pub fn start_lean(only: &[&'static str], ring_bytes: u32) -> Self {
        Self::start_lean_as(only, ring_bytes, false)
    }

    /// As `start_lean`, with the kernel holding a connection's arrival and accept for its next
    /// record (`capture::Options::hold`) when `hold`.
    pub fn start_lean_as(only: &[&'static str], ring_bytes: u32, hold: bool) -> Self {
        let opts = capture::Options {
            lean: true,
            hold,
            ..Self::options(only, ring_bytes)
        };
        Self::start_opts(opts, 1 << 20)
    }

    /// As `start_lean_as` with the kernel's hold, holding at most `entries` connections at
    /// once (`capture::Options::hold_entries`).
    pub fn start_lean_holding(only: &[&'static str], ring_bytes: u32, entries: u32) -> Self {
        let opts = capture::Options {
            lean: true,
            hold: true,
            hold_entries: entries,
            ..Self::options(only, ring_bytes)
        };
        Self::start_opts(opts, 1 << 20)
    }

    /// Loads with `opts` and a queue of `queue` events; every signal must attach.
    pub fn start_opts(opts: capture::Options, queue: usize) -> Self {
        let h = Self::try_start(&opts, queue).expect("loading the eBPF programs");
        for st in &h.capture.statuses {
            assert!(st.chosen().is_some(), "{}", st.summary());
        }
        h
    }

    /// Loads with `opts` and a queue of `queue` events; signals that attach nothing are left
    /// in `capture.statuses` for the caller to judge (the kernel matrix asserts what each
    /// kernel must offer).
    pub fn try_start(opts: &capture::Options, queue: usize) -> Result<Self, capture::CaptureError> {
        require_root();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let _guard = rt.enter();
        let mut capture = Capture::load(opts)?;
        let metrics = Arc::new(Telemetry::new("test"));
        let (tx, rx) = drainwatch::queue::bounded(queue);
        let maps = capture.take_reader_maps().expect("ring buffer maps");
        let reader = Reader::new(maps, capture.names.clone(), metrics.clone(), tx).expect("reader");
        drop(_guard);
        Ok(Self {
            capture,
            reader,
            rx,
            metrics,
            _rt: rt,
        })
    }

    /// How often the programs met `fault`, over every hook, since they were loaded.
    pub fn fault_count(&self, fault: drainwatch_common::faults::FaultKind) -> u64 {
        self.capture
            .faults()
            .iter()
            .filter(|(_, f, _)| *f == fault)
            .map(|(_, _, n)| n)
            .sum()
    }

    /// Everything the kernel has handed over so far, decoded, in order.
    pub fn events(&mut self) -> Vec<Event> {
        self.reader.drain();
        self.reader.poll_lost();
        let mut out = Vec::new();
        while let Ok(batch) = self.rx.try_recv() {
            out.extend(batch);
        }
        out
    }
}

/// The kernel's `TCP_INFO` of a socket, None if getsockopt(2) failed.
pub fn tcp_info(s: &impl std::os::fd::AsRawFd) -> Option<libc::tcp_info> {
    // SAFETY: `info` is a writable tcp_info and `len` its size, as getsockopt(2) expects.
    unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let rc = libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        );
        (rc == 0).then_some(info)
    }
}

/// One field of the namespace's `Tcp:` line in `/proc/<pid>/net/snmp`.
pub fn snmp_tcp(pid: u32, field: &str) -> u64 {
    proc_net_field(pid, "snmp", "Tcp:", field)
}

/// One field of the namespace's `Icmp:` line in `/proc/<pid>/net/snmp`.
pub fn snmp_icmp(pid: u32, field: &str) -> u64 {
    proc_net_field(pid, "snmp", "Icmp:", field)
}

/// One field of the namespace's `TcpExt:` line in `/proc/<pid>/net/netstat`.
pub fn tcp_ext(pid: u32, field: &str) -> u64 {
    proc_net_field(pid, "netstat", "TcpExt:", field)
}

/// `field` of the `prefix` lines (names, then values) of `/proc/<pid>/net/<file>`.
fn proc_net_field(pid: u32, file: &str, prefix: &str, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/{file}"))
        .unwrap_or_else(|e| panic!("read net/{file}: {e}"));
    let mut lines = text.lines().filter(|l| l.starts_with(prefix));
    let (names, values) = (
        lines.next().expect("the names line"),
        lines.next().expect("the values line"),
    );
    let i = names
        .split_whitespace()
        .position(|n| n == field)
        .unwrap_or_else(|| panic!("no {prefix} {field} in {names}"));
    values
        .split_whitespace()
        .nth(i)
        .expect("a value")
        .parse()
        .expect("a number")
}

/// The cgroup v2 mount: the root on pure v2 hosts, `unified` on hybrid ones.
pub fn cgroup_v2_root() -> std::path::PathBuf {
    ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .into_iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.join("cgroup.controllers").exists())
        .expect("a cgroup v2 mount")
}

/// Makes and removes two nested cgroups, the inner one's path longer than a record holds (1 +
/// 29 + 180 + 1 + 100 bytes below the v2 root, past 256): its removal's path is cut, the fault
/// `path_truncated`; the outer one's is whole.
pub fn remove_cgroups_one_too_long() {
    let outer = cgroup_v2_root().join(format!(
        "drainwatch-test-{}-{}",
        std::process::id(),
        "a".repeat(180)
    ));
    let inner = outer.join("b".repeat(100));
    std::fs::create_dir_all(&inner).expect("mkdir cgroups");
    std::fs::remove_dir(&inner).expect("rmdir inner");
    std::fs::remove_dir(&outer).expect("rmdir outer");
}

/// The inode of this process's network namespace, as the programs report it.
pub fn own_netns() -> u32 {
    let link = std::fs::read_link("/proc/self/ns/net").expect("read /proc/self/ns/net");
    let s = link.to_string_lossy();
    // "net:[4026531840]"
    s.trim_start_matches("net:[")
        .trim_end_matches(']')
        .parse()
        .unwrap_or_else(|_| panic!("unexpected namespace link {s}"))
}

/// The kernel's `TcpExt ListenOverflows` of `pid`'s network namespace ("self" for this one),
/// read independently of the agent's parser.
pub fn listen_overflows_of(pid: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/netstat")).expect("net/netstat");
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (names, values) = (lines.next().unwrap(), lines.next().unwrap());
    let i = names
        .split_whitespace()
        .position(|n| n == "ListenOverflows")
        .expect("a ListenOverflows column");
    values.split_whitespace().nth(i).unwrap().parse().unwrap()
}

pub mod lab;
