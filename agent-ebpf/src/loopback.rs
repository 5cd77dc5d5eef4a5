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

use aya_ebpf::{macros::map, maps::LruHashMap};
use drainwatch_common::{AF_INET, AF_INET6, Tuple, watch::Addr};

use crate::util::{CONFIG, cfg};

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

#[inline(always)]
pub fn lean() -> bool {
    cfg(&CONFIG.lean) != 0
}

/// A connect (SYN_SENT) from `sk` to `t.daddr`: remembered when loopback or unset (true),
/// else any entry a freed socket at this address left is removed.
#[inline(always)]
pub fn on_connect(sk: u64, t: &Tuple) -> bool {
    let inet = t.family == AF_INET || t.family == AF_INET6;
    if inet && Addr::of(t.family, &t.daddr).is_none() {
        let _ = LOOPBACK_CONNECTS.insert(sk, 1, 0);
        return true;
    }
    forget(sk);
    false
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
