//! What every program shares: the ring buffer, the loss counters, the configuration global and
//! reads through BTF offsets. Reads that can fail (helper calls) count their failures under the
//! event kind they are for (`fault`).

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_kernel_buf,
        generated::{bpf_get_current_comm, bpf_get_current_task_btf, bpf_skc_to_tcp_sock},
    },
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
    programs::TracePointContext,
};
use drainwatch_common::{
    AF_INET, AF_INET6, EventKind, Header, Tuple,
    config::Config,
    faults::FaultKind,
    fields::{AddrFields, NO_FIELD, NO_OFFSET, family_of_v6},
    watch,
};

use crate::fault::{fault, fault_at};

#[unsafe(no_mangle)]
pub static CONFIG: Config = Config::UNSET;

/// Events dropped as out of scope (host-namespace traffic touching no container), per kind,
/// per CPU.
#[map]
pub static FILTERED: PerCpuArray<u64> = PerCpuArray::with_max_entries(EventKind::COUNT, 0);

/// Host-namespace ports and container addresses whose traffic is kept (see `watch`).
#[map]
pub static WATCH_PORTS: Array<u8> = Array::with_max_entries(watch::PORTS, 0);
#[map]
pub static WATCH_ADDRS: HashMap<watch::Addr, u8> = HashMap::with_max_entries(watch::ADDRS, 0);

/// Whether the programs are to return at once (see `Config::attach_only`).
#[inline(always)]
pub fn attach_only() -> bool {
    cfg(&CONFIG.attach_only) != 0
}

/// A network namespace as records name it: its inode, which procfs shows and the kernel gives
/// a freed namespace's to the next one, and its cookie, unique for the kernel's lifetime (0
/// where the kernel has none). Two registers when inlined.
#[derive(Clone, Copy)]
pub struct Ns {
    pub inum: u32,
    pub cookie: u64,
}

impl Ns {
    pub const UNKNOWN: Ns = Ns { inum: 0, cookie: 0 };
}

/// Whether `netns` is the host's and the filter is on (the host's inode is never reused).
#[inline(always)]
pub fn is_host(netns: Ns) -> bool {
    let host = cfg(&CONFIG.host_netns);
    host != 0 && netns.inum == host
}

#[inline(always)]
pub fn watched_port(port: u32) -> bool {
    WATCH_PORTS.get(port).is_some_and(|v| *v != 0)
}

/// Whether a socket's port is a watched one (0, a port not chosen yet or already given up,
/// never is: index 0 is the "any" flag).
#[inline(always)]
fn watched_port_of(port: u16) -> bool {
    port != 0 && watched_port(u32::from(port))
}

#[inline(always)]
pub fn watched_addr(family: u16, a: &[u8; 16]) -> bool {
    watch::Addr::of(family, a).is_some_and(|k| unsafe { WATCH_ADDRS.get(k) }.is_some())
}

#[inline(always)]
pub fn count_filtered(kind: EventKind) {
    count(&FILTERED, kind);
}

/// Drops (and counts) an event in the host namespace whose connection touches no container:
/// neither end is a watched port or a container's address.
#[inline(always)]
pub fn out_of_scope(kind: EventKind, netns: Ns, t: &Tuple) -> bool {
    if !is_host(netns)
        || (watched_port(watch::ANY_PORT) && (watched_port_of(t.sport) || watched_port_of(t.dport)))
        || watched_addr(t.family, &t.daddr)
        || watched_addr(t.family, &t.saddr)
    {
        return false;
    }
    count_filtered(kind);
    true
}

/// An all-zero `T` (8-aligned, a whole number of words) built with word stores. LLVM's BPF
/// backend lowers the zeroing of a byte array (`Tuple::default()`, `[0; 16]`) to a call to
/// aya's byte-at-a-time `memset`: that was a third of the instructions a filtered event ran.
/// Volatile, so the stores are not merged back into one.
#[inline(always)]
pub fn zeroed<T: Copy>() -> T {
    const {
        assert!(core::mem::size_of::<T>().is_multiple_of(8) && core::mem::align_of::<T>() >= 8);
    }
    let mut v = core::mem::MaybeUninit::<T>::uninit();
    let p = v.as_mut_ptr() as *mut u64;
    for i in 0..core::mem::size_of::<T>() / 8 {
        unsafe { core::ptr::write_volatile(p.add(i), 0) };
    }
    unsafe { v.assume_init() }
}

/// Zeroes a 16-byte array inside an 8-aligned record (see [`zeroed`]).
#[inline(always)]
fn zero16(a: &mut [u8; 16]) {
    let p = a.as_mut_ptr() as *mut u64;
    unsafe {
        core::ptr::write_volatile(p, 0);
        core::ptr::write_volatile(p.add(1), 0);
    }
}

/// Reads a configuration value; volatile so the compiler cannot fold the load-time default.
#[inline(always)]
pub fn cfg<T: Copy>(p: *const T) -> T {
    unsafe { core::ptr::read_volatile(p) }
}

#[inline(always)]
pub fn count(counters: &PerCpuArray<u64>, kind: EventKind) {
    if let Some(n) = counters.get_ptr_mut(kind.index() as u32) {
        unsafe { *n += 1 };
    }
}

#[inline(always)]
pub fn fill_header(h: &mut Header, kind: EventKind, netns: Ns) {
    fill_header_task(h, kind, netns, true);
}

/// `fill_header` for a socket's or a packet's event (a reset, a socket error, a dropped
/// packet): no cgroup or command. The agent reads these by socket, namespace and time, and
/// their task is mostly whichever one the softirq interrupted; two helper calls saved.
#[inline(always)]
pub fn fill_header_sock(h: &mut Header, kind: EventKind, netns: Ns) {
    fill_header_task(h, kind, netns, false);
}

/// `fill_header`, with the task's cgroup and command only when `task` (each a helper call;
/// left zero otherwise).
#[inline(always)]
pub fn fill_header_task(h: &mut Header, kind: EventKind, netns: Ns, task: bool) {
    let pid_tgid = bpf_get_current_pid_tgid();
    h.ts_ns = unsafe { bpf_ktime_get_ns() };
    h.kind = kind as u32;
    h.pid = pid_tgid as u32;
    h.tgid = (pid_tgid >> 32) as u32;
    h.netns = netns.inum;
    h.netns_cookie = netns.cookie;
    if task {
        h.cgroup_id = unsafe { bpf_get_current_cgroup_id() };
        // Straight into the record: the helper zero-fills on failure, and aya's wrapper would
        // zero a stack copy with `memset` first.
        let comm = h.comm.as_mut_ptr() as *mut core::ffi::c_void;
        unsafe { bpf_get_current_comm(comm, h.comm.len() as u32) };
    } else {
        h.cgroup_id = 0;
        zero16(&mut h.comm);
    }
}

/// Bytes of a tracepoint record copied at once. Every fixed field the programs read lies within
/// them on the kernels seen; one beyond is read on its own. The copy may run past a short
/// record into the rest of the per-CPU trace buffer: those bytes are never used.
const RECORD: usize = 128;

#[map]
static RECORDS: PerCpuArray<[u8; RECORD]> = PerCpuArray::with_max_entries(1, 0);

/// A tracepoint's record, copied with one helper call: each helper call costs tens of
/// nanoseconds, and a program reads up to a dozen fields at offsets known only at load time
/// (from the format files), which the verifier does not allow as direct context reads.
pub struct Record<'a> {
    ctx: &'a TracePointContext,
    buf: Option<*const u8>,
    kind: EventKind,
}

impl<'a> Record<'a> {
    /// The record of a program emitting `kind` events (whose faults count under it).
    #[inline(always)]
    pub fn load(ctx: &'a TracePointContext, kind: EventKind) -> Self {
        let buf = RECORDS.get_ptr_mut(0).and_then(|b| {
            let dst = unsafe { &mut *b };
            match unsafe { bpf_probe_read_kernel_buf(ctx.as_ptr() as *const u8, dst) } {
                Ok(()) => Some(b as *const u8),
                Err(_) => {
                    fault(kind, FaultKind::RecordRead);
                    None
                }
            }
        });
        Self { ctx, buf, kind }
    }

    /// The field at an offset from the format file; `None` if this kernel lacks it.
    #[inline(always)]
    pub fn get<T: Copy>(&self, off: u16) -> Option<T> {
        if off == NO_FIELD {
            return None;
        }
        let off = off as usize;
        match self.buf {
            Some(b) if off + core::mem::size_of::<T>() <= RECORD => {
                Some(unsafe { core::ptr::read_unaligned(b.add(off) as *const T) })
            }
            _ => match unsafe { self.ctx.read_at::<T>(off) } {
                Ok(v) => Some(v),
                Err(_) => {
                    fault_at(self.kind, FaultKind::RecordRead, off as u32);
                    None
                }
            },
        }
    }
}

/// Loads a `T` at `base + off` from a BTF-typed pointer (a tp_btf argument, or a pointer
/// loaded from one): a plain load, no helper call. The verifier accepts it because `off`
/// comes from the frozen `CONFIG` (a known constant) and lies within the pointed-to struct.
#[inline(always)]
pub fn ld<T: Copy>(base: *const u8, off: u32) -> Option<T> {
    if off == NO_OFFSET {
        return None;
    }
    Some(unsafe { core::ptr::read_volatile(base.add(off as usize) as *const T) })
}

/// Per CPU, the last namespace whose inode a program read: its cookie (high half) and inode
/// (low half), in one word, so that a program interrupting another on this CPU never leaves
/// half an entry.
#[map]
static NETNS_SEEN: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// The inode of the namespace whose cookie is `cookie` (0: unknown), read by `inum` unless it
/// is the one this CPU read last. The inode shares its cache line with the namespace's
/// reference count, which every socket's creation and release writes: under connection churn
/// that load missed on most runs (by perf, the largest single cost of the state-change
/// program). The cookie is unique for the kernel's lifetime and sits on a line nothing
/// writes, so a namespace made where a freed one was never reads the freed one's inode.
#[inline(always)]
fn cached_inum(cookie: u64, inum: impl FnOnce() -> u32) -> u32 {
    // 0: not assigned yet (before 5.12 a namespace gets one on first use); past 32 bits, not
    // cached.
    if cookie == 0 || cookie > u64::from(u32::MAX) {
        return inum();
    }
    let Some(e) = NETNS_SEEN.get_ptr_mut(0) else {
        return inum();
    };
    let seen = unsafe { core::ptr::read_volatile(e) };
    if seen >> 32 == cookie {
        return seen as u32;
    }
    let n = inum();
    if n != 0 {
        unsafe { core::ptr::write_volatile(e, (cookie << 32) | u64::from(n)) };
    }
    n
}

/// The namespace of a BTF-typed `struct net` (plain loads).
#[inline(always)]
pub fn btf_net(net: *const u8) -> Ns {
    let k = &CONFIG.kernel;
    let cookie = ld::<u64>(net, cfg(&k.net_cookie)).unwrap_or(0);
    let inum = cached_inum(cookie, || ld::<u32>(net, cfg(&k.net_inum)).unwrap_or(0));
    Ns { inum, cookie }
}

/// The namespace of a BTF-typed `struct sock` (plain loads).
#[inline(always)]
pub fn btf_sock_netns(sk: *const u8) -> Ns {
    let k = &CONFIG.kernel;
    ld::<*const u8>(sk, cfg(&k.sock_net)).map_or(Ns::UNKNOWN, btf_net)
}

/// The 4-tuple of a BTF-typed `struct sock` as the classic TCP tracepoints record it: local =
/// s*, remote = d*, ports in host order.
#[inline(always)]
pub fn btf_sock_tuple(sk: *const u8, t: &mut Tuple) {
    let k = &CONFIG.kernel;
    t.family = ld::<u16>(sk, cfg(&k.sock_family)).unwrap_or(0);
    t.sport = ld::<u16>(sk, cfg(&k.sock_num)).unwrap_or(0);
    t.dport = u16::from_be(ld::<u16>(sk, cfg(&k.sock_dport)).unwrap_or(0));
    if t.family == AF_INET {
        // As u32: one load each (a `[u8; 4]` is loaded a byte at a time).
        let v4 = |off: u32| ld::<u32>(sk, off).unwrap_or(0).to_ne_bytes();
        t.saddr[..4].copy_from_slice(&v4(cfg(&k.sock_rcv_saddr)));
        t.daddr[..4].copy_from_slice(&v4(cfg(&k.sock_daddr)));
    } else if t.family == AF_INET6 {
        let (s, d) = (cfg(&k.sock_v6_rcv_saddr), cfg(&k.sock_v6_daddr));
        let half = |off: u32| ld::<u64>(sk, off).unwrap_or(0).to_ne_bytes();
        t.saddr[..8].copy_from_slice(&half(s));
        t.saddr[8..].copy_from_slice(&half(s.wrapping_add(8)));
        t.daddr[..8].copy_from_slice(&half(d));
        t.daddr[8..].copy_from_slice(&half(d.wrapping_add(8)));
    }
}

/// A BTF-typed socket as a `tcp_sock`, for members past `struct sock` (one helper call); NULL
/// when it is not one.
#[inline(always)]
pub fn btf_tcp_sock(sk: *const u8) -> *const u8 {
    unsafe { bpf_skc_to_tcp_sock(sk as *mut _) as *const u8 }
}

/// The local port from `inet_sock.inet_sport`: a socket that reached CLOSE has already given
/// up `skc_num`, but the classic records take the port from here.
#[inline(always)]
pub fn btf_inet_sport(sk: *const u8) -> u16 {
    let tp = btf_tcp_sock(sk);
    if tp.is_null() {
        return 0;
    }
    u16::from_be(ld::<u16>(tp, cfg(&CONFIG.kernel.tcp_inet_sport)).unwrap_or(0))
}

/// Reads a `T` at `base + off` in kernel memory; `None` for unresolved offsets or NULL bases,
/// and for a failed read, which counts as a `kind` fault.
#[inline(always)]
pub fn kread<T>(kind: EventKind, base: u64, off: u32) -> Option<T> {
    if base == 0 || off == NO_OFFSET {
        return None;
    }
    match unsafe { bpf_probe_read_kernel((base + off as u64) as *const T) } {
        Ok(v) => Some(v),
        Err(_) => {
            fault_at(kind, FaultKind::KernelRead, off);
            None
        }
    }
}

/// The namespace of a `struct net` by probe reads (no cache: the classic state-change program
/// is at its verifier's limit on 5.10 and 6.1). The cookie is a second read; none where BTF
/// has no `net_cookie` (before 5.7).
#[inline(always)]
pub fn net_ns(kind: EventKind, net: u64) -> Ns {
    let k = &CONFIG.kernel;
    Ns {
        inum: kread::<u32>(kind, net, cfg(&k.net_inum)).unwrap_or(0),
        cookie: kread::<u64>(kind, net, cfg(&k.net_cookie)).unwrap_or(0),
    }
}

/// The namespace of a `struct sock`.
#[inline(always)]
pub fn sock_netns(kind: EventKind, sk: u64) -> Ns {
    kread::<u64>(kind, sk, cfg(&CONFIG.kernel.sock_net)).map_or(Ns::UNKNOWN, |n| net_ns(kind, n))
}

/// The namespace of the device a packet arrived on (sockets-less paths).
#[inline(always)]
pub fn skb_netns(kind: EventKind, skb: u64) -> Ns {
    let k = &CONFIG.kernel;
    kread::<u64>(kind, skb, cfg(&k.skb_dev))
        .and_then(|dev| kread::<u64>(kind, dev, cfg(&k.net_device_nd_net)))
        .map_or(Ns::UNKNOWN, |n| net_ns(kind, n))
}

/// The current task's namespace, by plain loads from its BTF-typed `task_struct` (one helper
/// call where `task_netns` makes four, and the cookie with it).
#[inline(always)]
pub fn current_netns() -> Ns {
    let k = &CONFIG.kernel;
    let task = unsafe { bpf_get_current_task_btf() } as *const u8;
    if task.is_null() {
        return Ns::UNKNOWN;
    }
    ld::<*const u8>(task, cfg(&k.task_nsproxy))
        .filter(|ns| !ns.is_null())
        .and_then(|ns| ld::<*const u8>(ns, cfg(&k.nsproxy_net_ns)))
        .filter(|net| !net.is_null())
        .map_or(Ns::UNKNOWN, btf_net)
}

/// The current task's namespace, its inode only: for process-context records (attributed by
/// process, not namespace) and the host filter, a helper call fewer than with the cookie.
#[inline(always)]
pub fn task_netns(kind: EventKind) -> Ns {
    let k = &CONFIG.kernel;
    let task = unsafe { bpf_get_current_task() };
    let inum = kread::<u64>(kind, task, cfg(&k.task_nsproxy))
        .and_then(|ns| kread::<u64>(kind, ns, cfg(&k.nsproxy_net_ns)))
        .and_then(|n| kread::<u32>(kind, n, cfg(&k.net_inum)))
        .unwrap_or(0);
    Ns { inum, cookie: 0 }
}

/// TCP state of a `struct sock`, -1 if unreadable.
#[inline(always)]
pub fn sock_state(kind: EventKind, sk: u64) -> i32 {
    kread::<u8>(kind, sk, cfg(&CONFIG.kernel.sock_state)).map_or(-1, i32::from)
}

/// The 4-tuple a `struct sock` holds (local = s*, remote = d*).
#[inline(always)]
pub fn sock_tuple(kind: EventKind, sk: u64, t: &mut Tuple) {
    let k = &CONFIG.kernel;
    let rd = |off: u32| kread::<u16>(kind, sk, off).unwrap_or(0);
    t.family = rd(cfg(&k.sock_family));
    t.sport = rd(cfg(&k.sock_num));
    t.dport = u16::from_be(rd(cfg(&k.sock_dport)));
    if t.family == AF_INET {
        let v4 = |off: u32| kread::<[u8; 4]>(kind, sk, off).unwrap_or([0; 4]);
        t.saddr[..4].copy_from_slice(&v4(cfg(&k.sock_rcv_saddr)));
        t.daddr[..4].copy_from_slice(&v4(cfg(&k.sock_daddr)));
    } else if t.family == AF_INET6 {
        let v6 = |off: u32| kread::<[u8; 16]>(kind, sk, off).unwrap_or([0; 16]);
        t.saddr = v6(cfg(&k.sock_v6_rcv_saddr));
        t.daddr = v6(cfg(&k.sock_v6_daddr));
    }
}

/// Reads a tuple from separate family/port/address fields (ports are host order there).
#[inline(always)]
pub fn tp_tuple(rec: &Record, f: &AddrFields, t: &mut Tuple) {
    // 5.10's reset tracepoints have no `family`: their IPv6 fields tell.
    t.family = match rec.get::<u16>(f.family) {
        Some(family) => family,
        None => rec
            .get::<[u8; 16]>(f.saddr_v6)
            .map_or(0, |a| family_of_v6(&a)),
    };
    t.sport = rec.get::<u16>(f.sport).unwrap_or(0);
    t.dport = rec.get::<u16>(f.dport).unwrap_or(0);
    if t.family == AF_INET6 {
        t.saddr = rec.get::<[u8; 16]>(f.saddr_v6).unwrap_or([0; 16]);
        t.daddr = rec.get::<[u8; 16]>(f.daddr_v6).unwrap_or([0; 16]);
    } else {
        t.saddr[..4].copy_from_slice(&rec.get::<[u8; 4]>(f.saddr).unwrap_or([0; 4]));
        t.daddr[..4].copy_from_slice(&rec.get::<[u8; 4]>(f.daddr).unwrap_or([0; 4]));
    }
}

pub const IPPROTO_TCP: u16 = 6;
