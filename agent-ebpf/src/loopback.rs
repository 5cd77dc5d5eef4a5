//! Per-socket state in the kernel for `inet_sock_set_state` (with `Config::lean`): connects to
//! a loopback or unset address, which the agent has no use for (it follows a connect only to
//! a container's address, which it never takes from loopback), so they are dropped here and
//! counted as filtered: the connect itself unless a proxy made it, and every later step but a
//! failure (SYN_SENT to CLOSE: a refusal's or an unreachable address's attempt). Their passive
//! side (the container's inbound connection) is another socket, kept whole.
//!
//! A hash keyed by socket address, not `BPF_MAP_TYPE_SK_STORAGE`: this works in the classic
//! tracepoint too and on every kernel of the matrix (tracing programs may use sk storage from
//! 5.11 only). An entry goes at the socket's CLOSE, and any socket's first step (a connect, a
//! passive child's SYN_RECV) replaces or removes one left at a reused address; an entry the
//! LRU evicted only makes its socket's steps emitted, as before.
//!
//! Two kinds of loopback connect are kept whole, never marked: a proxy's (`PROXIES`), and one
//! to a listener of a pod whose namespace more than one container shares (`POD_LISTENERS`):
//! a sidecar's to its app, the agent's only way to learn the sidecar is a proxy before its
//! requests go by (an in-pod proxy never connects to a container's address).

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap},
};
use drainwatch_common::{
    AF_INET, AF_INET6, Tuple,
    watch::{self, Addr},
};

use crate::util::{CONFIG, Ns, cfg};

/// Far above the loopback connections a node holds open at once.
const ENTRIES: u32 = 65_536;

/// `BPF_F_NO_COMMON_LRU`: each CPU takes free entries from and evicts in a list of its own
/// (a share of `ENTRIES`), where the common list made inserts and removals on different CPUs
/// take each other's locks: the state-change program's run fell from 270 to 251 ns (median of
/// six alternating pod-churn runs each). A CPU past its share evicts its own oldest marks,
/// which only makes their sockets' steps emitted.
const NO_COMMON_LRU: u32 = 2;

#[map]
static LOOPBACK_CONNECTS: LruHashMap<u64, u8> =
    LruHashMap::with_max_entries(ENTRIES, NO_COMMON_LRU);

/// Ports with an entry in `POD_LISTENERS` (the agent keeps both): an inlined array load
/// spares the hash lookup for every other loopback connect.
#[map]
static POD_PORTS: Array<u8> = Array::with_max_entries(watch::PORTS, 0);

/// Listening ports (open or closed) of namespaces more than one container shares, by
/// `watch::pod_listener` (the agent fills it). Allocated per entry (only the agent writes it,
/// rarely): about 1 MiB of kernel memory preallocated would hold a few entries.
#[map]
static POD_LISTENERS: HashMap<u64, u8> =
    HashMap::with_max_entries(watch::POD_LISTENERS, aya_ebpf::bindings::BPF_F_NO_PREALLOC);

#[inline(always)]
pub fn lean() -> bool {
    cfg(&CONFIG.lean) != 0
}

/// What a connect (SYN_SENT) is to the lean filter.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Connect {
    /// To a loopback or unset address, no proxy's, to no pod's shared listener: marked, and
    /// dropped with its later steps (but a failure).
    Unused,
    /// To a loopback or unset address, at a listener of a namespace more than one container
    /// shares (a sidecar's to its app): kept whole, and its requests followed.
    Pod,
    /// Anything else (a proxy's loopback connect included): kept whole.
    Other,
}

/// A connect from `sk` (in `netns`, by `tgid`) to `t.daddr`: a loopback or unset one no
/// proxy made, to no pod's shared listener, is remembered; any other removes the entry a
/// freed socket at this address left.
#[inline(always)]
pub fn on_connect(sk: u64, t: &Tuple, netns: Ns, tgid: u32) -> Connect {
    let inet = t.family == AF_INET || t.family == AF_INET6;
    if !inet || Addr::of(t.family, &t.daddr).is_some() {
        forget(sk);
        return Connect::Other;
    }
    if to_pod_listener(netns, t.dport) {
        forget(sk);
        return Connect::Pod;
    }
    if crate::sock_length::is_proxy(tgid) {
        forget(sk);
        return Connect::Other;
    }
    let _ = LOOPBACK_CONNECTS.insert(sk, 1, 0);
    Connect::Unused
}

/// Whether `port` of `netns` is a listener (open or closed) of a namespace more than one
/// container shares.
#[inline(always)]
fn to_pod_listener(netns: Ns, port: u16) -> bool {
    port != 0
        && POD_PORTS.get(u32::from(port)).is_some_and(|v| *v != 0)
        && unsafe { POD_LISTENERS.get(watch::pod_listener(netns.inum, port)) }.is_some()
}

/// A socket's last step (CLOSE) or a passive child's first (SYN_RECV): no entry from here.
#[inline(always)]
pub fn forget(sk: u64) {
    // Looked up first: most sockets have none, and a removal takes the bucket's lock.
    if is_loopback_connect(sk) {
        let _ = LOOPBACK_CONNECTS.remove(sk);
    }
}

/// Whether `sk` is a connect to a loopback or unset address.
#[inline(always)]
pub fn is_loopback_connect(sk: u64) -> bool {
    unsafe { LOOPBACK_CONNECTS.get(sk) }.is_some()
}
