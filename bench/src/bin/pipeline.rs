//! The agent's userspace path (decode → enrich → correlate → export) fed a synthetic event
//! stream of ring-buffer records, on a synthetic host of many containers. Prints one JSON line.
//!
//! pipeline capacity <seconds> <containers> [held]
//!     events/s on one core: decode only (the baseline), then the whole pipeline, and the
//!     heap allocations per record on that path (decode and pipeline, not its timer). The
//!     stream: five records per connection (the kernel holding nothing), or with `held` the
//!     one record per clean connection the agent gets at its defaults (the hold carries the
//!     handshake and the accept on the connection's first step out of ESTABLISHED).
//! pipeline loss <seconds> <containers> <events per second>
//!     a producer thread offers records at that rate through the agent's bounded queue
//!     (65,536 events, `try_send` as the reader does) to the pipeline on another thread:
//!     how many were lost.
//! pipeline footprint <containers> <open connections>
//!     resident memory before and after the pipeline tracks that many containers and open
//!     inbound connections.
//!
//! Needs tracefs (root) for the kernel's state names, as the agent does.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use drainwatch::{
    capture::{
        self,
        event::{self, KernelNames},
    },
    correlate::Correlator,
    enrich::{
        Enricher,
        cgroup_path::CgroupOwner,
        host::{HostView, ProcInfo, SocketEntry},
        runtime_meta::ContainerMeta,
    },
    model::{SECOND, monotonic_now},
    pipeline::Pipeline,
    telemetry::Telemetry,
};
use drainwatch_common::{EventKind, Header, Tuple, inet_csk_accept, inet_sock_set_state};

const PORT: u16 = 8080;
/// Synthetic container ids count up from here.
const ID_BASE: u64 = 0x00c0_ffee_0000;
const QUEUE: usize = 65_536;
/// Records per synthetic connection: handshake done, accepted, peer FIN, close, closed.
const PER_CONN: f64 = 5.0;

/// The system allocator, counting allocations (and reallocations): the hot path's are read
/// around each record.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call goes to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// A host running `n` podman containers, each one process with a listener on :8080.
struct SynthHost {
    n: u32,
}

fn pid(i: u32) -> u32 {
    100_000 + i
}
fn netns(i: u32) -> u32 {
    4_026_600_000 + i
}
fn ip(i: u32) -> Ipv4Addr {
    Ipv4Addr::new(10, 88, (i / 250) as u8, (i % 250 + 2) as u8)
}
fn container_id(i: u32) -> String {
    format!("{:064x}", ID_BASE + u64::from(i))
}
fn index_of(pid_: u32) -> Option<u32> {
    pid_.checked_sub(100_000)
}

fn cgroup_path(i: u32) -> String {
    format!("/libpod_parent/libpod-{}", container_id(i))
}

impl HostView for SynthHost {
    fn container_pids(&self) -> Vec<(u32, String)> {
        (0..self.n).map(|i| (pid(i), cgroup_path(i))).collect()
    }
    fn process(&self, p: u32) -> Option<ProcInfo> {
        let i = index_of(p).filter(|i| *i < self.n)?;
        Some(ProcInfo {
            pid: p,
            ppid: 1,
            comm: "server".into(),
            ns_pid: Some(1),
            netns: Some(netns(i)),
            cgroup_path: Some(cgroup_path(i)),
        })
    }
    fn sockets(&self, p: u32) -> Vec<SocketEntry> {
        vec![SocketEntry {
            inode: u64::from(p) * 10,
            local: SocketAddr::from((Ipv4Addr::UNSPECIFIED, PORT)),
            remote: SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            listening: true,
            established: false,
            rx_queue: 0,
        }]
    }
    fn socket_inodes(&self, p: u32) -> Vec<u64> {
        vec![u64::from(p) * 10]
    }
    fn local_ips(&self, p: u32) -> Vec<IpAddr> {
        index_of(p)
            .map(|i| vec![IpAddr::V4(ip(i))])
            .unwrap_or_default()
    }
    fn cgroup_v2_id(&self, path: &str) -> Option<u64> {
        Some(path.len() as u64 * 7919)
    }
    fn metadata(&self, owner: &CgroupOwner) -> ContainerMeta {
        let i = u64::from_str_radix(&owner.id, 16).unwrap_or(0) - ID_BASE;
        ContainerMeta {
            name: format!("web-{i}"),
            namespace: String::new(),
            pod: String::new(),
            workload: format!("web-{}", i / 10),
        }
    }
    fn netstat(&self, _pid: u32) -> Option<String> {
        Some("TcpExt: ListenOverflows ListenDrops\nTcpExt: 0 0\n".into())
    }
}

fn bytes_of<T: aya::Pod>(v: &T) -> Vec<u8> {
    // SAFETY: T is Pod: plain integers and arrays without padding.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
}

fn header(kind: EventKind, tgid: u32, netns: u32) -> Header {
    Header {
        ts_ns: 0,
        cgroup_id: 0,
        kind: kind as u32,
        pid: tgid,
        tgid,
        netns,
        comm: [0; 16],
        netns_cookie: u64::from(netns),
    }
}

fn tuple(local: SocketAddr, remote: SocketAddr) -> Tuple {
    let (SocketAddr::V4(l), SocketAddr::V4(r)) = (local, remote) else {
        unreachable!("synthetic addresses are IPv4")
    };
    let mut t = Tuple {
        family: drainwatch_common::AF_INET,
        sport: l.port(),
        dport: r.port(),
        ..Default::default()
    };
    t.saddr[..4].copy_from_slice(&l.ip().octets());
    t.daddr[..4].copy_from_slice(&r.ip().octets());
    t
}

/// How the kernel side sends a connection's life.
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    /// Every step a record: handshake done, accepted, peer FIN, close, closed.
    Steps,
    /// Only the opening (handshake done, accepted), left open.
    Open,
    /// With the hold (the default): one record, the server's close, carrying the handshake
    /// and the accept. Its `held` times are set when the record is replayed.
    Held,
}

/// Where a held record's `held` times are, to stamp them as it is replayed.
const HELD_AT: usize = std::mem::offset_of!(inet_sock_set_state::Event, held);

/// The records of connection `k`'s life.
fn connection(k: u64, containers: u32, states: &dyn Fn(&str) -> i32, shape: Shape) -> Vec<Vec<u8>> {
    let i = (k % u64::from(containers)) as u32;
    let local = SocketAddr::from((ip(i), PORT));
    let remote = SocketAddr::from((
        Ipv4Addr::new(10, 200, (k >> 16) as u8, (k >> 8) as u8),
        1024 + (k % 60_000) as u16,
    ));
    let skaddr = 0xffff_8880_0000_0000 + k * 0x800;
    let change = |tgid: u32, old: &str, new: &str| {
        bytes_of(&inet_sock_set_state::Event {
            header: header(EventKind::InetSockSetState, tgid, netns(i)),
            skaddr,
            tuple: tuple(local, remote),
            oldstate: states(old),
            newstate: states(new),
            bytes_received: 120,
            bytes_sent: 800,
            rcv_nxt: 1,
            copied_seq: 1,
            lrcvtime: 10,
            lsndtime: 11,
            max_ack_backlog: 4096,
            jiffies: 12,
            data_segs_in: 2,
            data_segs_out: 2,
            snd_wl1: 0,
            unacked: 0,
            syn_ms: 0,
            error: 0,
            held: Default::default(),
        })
    };
    if shape == Shape::Held {
        return vec![change(pid(i), "TCP_ESTABLISHED", "TCP_FIN_WAIT1")];
    }
    let mut out = vec![
        change(0, "TCP_SYN_RECV", "TCP_ESTABLISHED"),
        bytes_of(&inet_csk_accept::Event {
            header: header(EventKind::InetCskAccept, pid(i), netns(i)),
            skaddr,
            tuple: tuple(local, remote),
        }),
    ];
    if shape == Shape::Steps {
        out.push(change(0, "TCP_ESTABLISHED", "TCP_CLOSE_WAIT"));
        out.push(change(pid(i), "TCP_CLOSE_WAIT", "TCP_LAST_ACK"));
        out.push(change(0, "TCP_LAST_ACK", "TCP_CLOSE"));
    }
    out
}

fn names() -> KernelNames {
    capture::kernel_names().unwrap_or_else(|e| {
        eprintln!("pipeline: {e}");
        std::process::exit(2)
    })
}

fn state_numbers(names: &KernelNames) -> impl Fn(&str) -> i32 + '_ {
    move |name: &str| {
        names
            .tcp_states
            .iter()
            .find(|(_, n)| n.as_str() == name)
            .map(|(v, _)| *v as i32)
            .unwrap_or_else(|| panic!("this kernel's format has no {name}"))
    }
}

fn pipeline(containers: u32) -> Pipeline<SynthHost> {
    pipeline_with(containers, Arc::new(Telemetry::new("bench")))
}

fn pipeline_with(containers: u32, metrics: Arc<Telemetry>) -> Pipeline<SynthHost> {
    let mut p = Pipeline::new(
        Enricher::new(SynthHost { n: containers }),
        Arc::new(Mutex::new(Correlator::default())),
        metrics,
        300 * SECOND,
    );
    p.start();
    p
}

fn counter_sum(metrics: &Telemetry, prefix: &str) -> f64 {
    metrics
        .encode_prometheus()
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A stream of complete connection lives, replayed with fresh timestamps.
#[derive(Clone)]
struct Stream {
    records: Vec<Vec<u8>>,
    next: usize,
    ts: u64,
    held: bool,
}

impl Stream {
    fn new(containers: u32, names: &KernelNames, shape: Shape) -> Self {
        let states = state_numbers(names);
        let records = (0..20_000u64)
            .flat_map(|k| connection(k, containers, &states, shape))
            .collect();
        Self {
            records,
            next: 0,
            ts: monotonic_now(),
            held: shape == Shape::Held,
        }
    }

    /// The next record, stamped 2 µs after the previous one (a held record's connection
    /// arrived 300 µs and was accepted 200 µs before).
    fn next(&mut self) -> &[u8] {
        self.ts += 2_000;
        let i = self.next;
        self.next = (i + 1) % self.records.len();
        let r = &mut self.records[i];
        r[..8].copy_from_slice(&self.ts.to_ne_bytes());
        if self.held {
            let (arrived, accepted) = (self.ts - 300_000, self.ts - 200_000);
            r[HELD_AT..HELD_AT + 8].copy_from_slice(&arrived.to_ne_bytes());
            r[HELD_AT + 8..HELD_AT + 16].copy_from_slice(&accepted.to_ne_bytes());
        }
        r
    }

    fn per_connection(&self) -> f64 {
        if self.held { 1.0 } else { PER_CONN }
    }
}

fn capacity(seconds: f64, containers: u32, shape: Shape) -> serde_json::Value {
    let names = names();
    let stream = Stream::new(containers, &names, shape);
    let run = |f: &mut dyn FnMut(&[u8])| -> f64 {
        let mut stream = Stream {
            ts: monotonic_now(),
            ..stream.clone()
        };
        let start = Instant::now();
        let mut n = 0u64;
        while start.elapsed().as_secs_f64() < seconds {
            for _ in 0..10_000 {
                f(stream.next());
            }
            n += 10_000;
        }
        n as f64 / start.elapsed().as_secs_f64()
    };
    let decode_only = run(&mut |r| {
        std::hint::black_box(event::decode(r, &names).ok());
    });
    let metrics = Arc::new(Telemetry::new("bench"));
    let mut p = pipeline_with(containers, metrics.clone());
    let mut last_tick = Instant::now();
    let mut offered = 0u64;
    let mut hot_allocations = 0u64;
    // As the reader does: a held record stands for the arrival and accept it carries too.
    let mut unfolded = Vec::with_capacity(4);
    let full = run(&mut |r| {
        offered += 1;
        let before = allocations();
        if let Ok(ev) = event::decode(r, &names) {
            event::unfold(ev, &mut unfolded);
            for ev in unfolded.drain(..) {
                p.event(&ev);
            }
        }
        hot_allocations += allocations() - before;
        // The agent's periodic work, at its real cadence.
        if last_tick.elapsed() >= Duration::from_millis(100) {
            last_tick = Instant::now();
            p.tick(monotonic_now());
        }
    });
    // Proof that the pipeline did the work: every connection was attributed to its container.
    let arrivals = counter_sum(&metrics, "drainwatch_connection_arrivals_total{");
    serde_json::json!({
        "decode_only_per_second": decode_only,
        "pipeline_per_second": full,
        "ratio": full / decode_only,
        "connections_offered": (offered as f64 / stream.per_connection()).floor(),
        "arrivals_counted": arrivals,
        "allocations_per_record": hot_allocations as f64 / offered as f64,
    })
}

fn loss(seconds: f64, containers: u32, rate: f64) -> serde_json::Value {
    let names = Arc::new(names());
    // The agent's queue: a bounded channel the reader `try_send`s into.
    let (tx, rx) = drainwatch::queue::bounded::<event::Event>(QUEUE);
    let consumer = std::thread::spawn(move || {
        let mut p = pipeline(containers);
        let mut last_tick = Instant::now();
        let mut n = 0u64;
        while let Ok(batch) = rx.recv() {
            for ev in &batch {
                p.event(ev);
                n += 1;
            }
            if last_tick.elapsed() >= Duration::from_millis(100) {
                last_tick = Instant::now();
                p.tick(monotonic_now());
            }
        }
        n
    });
    let mut stream = Stream::new(containers, &names, Shape::Steps);
    let (mut sent, mut lost) = (0u64, 0u64);
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < seconds {
        // Offer what is due by now, as the reader drains what the kernel produced.
        let due = (start.elapsed().as_secs_f64() * rate) as u64;
        let mut batch = Vec::new();
        while sent < due {
            if let Ok(ev) = event::decode(stream.next(), &names) {
                batch.push(ev);
            }
            sent += 1;
        }
        lost += tx.try_send_all(batch) as u64;
        std::thread::sleep(Duration::from_micros(500));
    }
    drop(tx);
    let Ok(processed) = consumer.join() else {
        eprintln!("pipeline: the consumer thread panicked");
        std::process::exit(1);
    };
    serde_json::json!({
        "offered_per_second": sent as f64 / seconds,
        "offered": sent,
        "lost": lost,
        "processed": processed,
    })
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

fn footprint(containers: u32, open: u64) -> serde_json::Value {
    let names = names();
    let states = state_numbers(&names);
    let before = rss_kib();
    let mut p = pipeline(containers);
    let mut ts = monotonic_now();
    for k in 0..open {
        for mut r in connection(k, containers, &states, Shape::Open) {
            ts += 1_000;
            r[..8].copy_from_slice(&ts.to_ne_bytes());
            if let Ok(ev) = event::decode(&r, &names) {
                p.event(&ev);
            }
        }
    }
    p.tick(monotonic_now());
    serde_json::json!({
        "containers": p.container_count(),
        "open_connections": open,
        "rss_before_kib": before,
        "rss_after_kib": rss_kib(),
    })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize| -> f64 {
        let a = args.get(i).unwrap_or_else(|| {
            eprintln!("usage: pipeline capacity|loss|footprint ... (see the source)");
            std::process::exit(2)
        });
        a.parse().unwrap_or_else(|_| panic!("not a number: {a}"))
    };
    let out = match args.first().map(String::as_str) {
        Some("capacity") => {
            let shape = match args.get(3).map(String::as_str) {
                Some("held") => Shape::Held,
                _ => Shape::Steps,
            };
            capacity(num(1), num(2) as u32, shape)
        }
        Some("loss") => loss(num(1), num(2) as u32, num(3)),
        Some("footprint") => footprint(num(1) as u32, num(2) as u64),
        _ => {
            eprintln!("usage: pipeline capacity|loss|footprint ... (see the source)");
            std::process::exit(2)
        }
    };
    println!("{out}");
}
