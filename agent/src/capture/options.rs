//! What the agent asks of capture: ring sizes, budgets, filters, hooks to skip.

pub struct Options {
    pub ring_buffer_bytes: u32,
    pub btf_path: String,
    /// Only these signals (plan names); all when `None`. Tests use it to isolate one hook.
    pub only: Option<Vec<&'static str>>,
    /// The host's network namespace inode: its connections that touch no container are
    /// dropped in the kernel (the `watch` maps say which do). `None` keeps everything.
    pub host_netns: Option<u32>,
    /// Hooks (by label) not to try: tests use it to exercise a fallback the kernel would
    /// not otherwise need.
    pub skip_hooks: Vec<String>,
    /// Programs return at once (the benchmark's floor; see `Config::attach_only`).
    pub attach_only: bool,
    /// How soon after a cut its worker's next upstream action counts as its retry.
    pub retry_window: std::time::Duration,
    /// Records each packet-path hook may emit per CPU per second (0: no limit).
    pub packet_events_per_cpu: u32,
    /// Drop in the kernel (counted as filtered) the records no part of the agent reads (see
    /// `Config::lean`); off by default, so capture's tests see each hook's whole story.
    pub lean: bool,
    /// Hold a pod connection's arrival and accept in the kernel until its next record (see
    /// `Config::hold`; experimental).
    pub hold: bool,
    /// Connections the kernel may hold at once (the `HOLD` map's size).
    pub hold_entries: u32,
    /// Proxies' upstream connections whose requests the kernel may follow at once (the
    /// `UPSTREAM_SOCKS` map's size).
    pub upstream_entries: u32,
    /// Whether to set up the lifecycle programs' log (`ebpf_log`); off only to test the agent
    /// without it (`--test-no-ebpf-log`).
    pub ebpf_log: bool,
}

/// nginx re-sends from the failed read's handler, tens of microseconds after the cut; the
/// window only bounds a chain the worker never continued (any other socket I/O of the thread
/// ends it first, an answer to a client included). 50 ms, not 5: a worker descheduled between
/// its close and its connect on a busy node outlasted 5 ms (the retry lab under four spinning
/// threads on two CPUs: 3 of 12 seeds missed a retry at 5 ms, none of 14 at 50 ms; the `gone` lab,
/// clients leaving so that no answer ends a chain, read no false retry at either).
pub const RETRY_WINDOW: std::time::Duration = std::time::Duration::from_millis(50);

/// Above what pod traffic makes on one CPU: a connection makes about 7 state-change records,
/// so this is some 28,000 connections/s per CPU, where one pod churning 25,000/s on two CPUs
/// makes about 90,000 a CPU (20,000 would have shed three quarters of them). Below what would keep
/// the reader from the lifecycle ring (which has its own ring anyway) or the pipeline (2.5M
/// events/s on one core, BENCHMARKS.md) from its queue on a few CPUs: a scan or a flood of one
/// CPU is shed and counted, not queued.
pub const PACKET_EVENTS_PER_CPU: u32 = 200_000;

impl Default for Options {
    fn default() -> Self {
        Self {
            ring_buffer_bytes: 1 << 20,
            btf_path: "/sys/kernel/btf/vmlinux".into(),
            only: None,
            host_netns: None,
            skip_hooks: Vec::new(),
            attach_only: false,
            retry_window: RETRY_WINDOW,
            packet_events_per_cpu: PACKET_EVENTS_PER_CPU,
            lean: false,
            hold: false,
            hold_entries: HOLD_ENTRIES,
            upstream_entries: drainwatch_common::sock_length::UPSTREAM_SOCKS,
            ebpf_log: true,
        }
    }
}

/// A clean connection is held from its arrival to its close, or for 10 s at most: this many
/// at once is some 6,500 long-lived arrivals a second, far above a node's (9 MiB of kernel
/// memory, BENCHMARKS.md).
pub const HOLD_ENTRIES: u32 = 65_536;

/// The lifecycle ring's size for a packet ring of `packet` bytes: a quarter, at least a page.
/// Its records are few (a stop is a handful) but come in bursts when a node drains.
pub fn lifecycle_ring_bytes(packet: u32) -> u32 {
    (packet / 4).max(4096)
}
