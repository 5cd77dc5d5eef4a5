//! Per-connection state in the kernel (`Config::hold`, experimental, `--hold`): a pod
//! connection's arrival (SYN_RECV→ESTABLISHED) and accept wait here, keyed by socket address,
//! until the socket's next record carries them (`inet_sock_set_state::Held`). A connection
//! that opens and closes cleanly then makes one record instead of three. A reset hook's record
//! of a held socket is preceded by a record carrying only what was held (`HELD_ONLY`), so the
//! agent knows the connection before its reset.
//!
//! Not in the namespaces the agent marks hot (`HOT_NETNS`: a container stopping or starting,
//! a workload a storm may follow), whose arrivals it needs as they come; it takes over what
//! was held there when it marks one, and whatever has waited long (`capture::hold`), so that
//! no arrival waits for a long-lived connection's close.
//!
//! A hash keyed by socket address, as `loopback`'s: the accept syscall tracepoint may not use
//! sk storage, and tracing programs may only from 5.11. When the map is full the arrival is
//! sent as before; an arrival overwrites whatever a freed socket at its address left.

use aya_ebpf::{
    bindings::BPF_ANY,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::map,
    maps::HashMap,
};
use drainwatch_common::{
    EventKind, Tuple,
    faults::FaultKind,
    inet_sock_set_state::{Held, HoldEntry},
};

use crate::{
    fault::fault,
    util::{CONFIG, cfg, zeroed},
};

/// Connections held at once: past it, arrivals are sent as before (and counted as the fault
/// `hold_full`). The agent sets the size (`--hold-entries`).
const ENTRIES: u32 = 65_536;

#[map]
static HOLD: HashMap<u64, HoldEntry> = HashMap::with_max_entries(ENTRIES, 0);

/// Namespaces whose arrivals are sent as they come (written by the agent).
#[map]
static HOT_NETNS: HashMap<u32, u8> = HashMap::with_max_entries(4096, 0);

#[inline(always)]
pub fn on() -> bool {
    cfg(&CONFIG.hold) != 0
}

/// The arrival of `sk`, now: held (true), or to be sent (a hot namespace, the map full).
#[inline(always)]
pub fn arrive(sk: u64, netns: u32, tuple: &Tuple) -> bool {
    if unsafe { HOT_NETNS.get(netns) }.is_some() {
        return false;
    }
    let mut e = zeroed::<HoldEntry>();
    e.held.arrived_ns = unsafe { bpf_ktime_get_ns() };
    e.netns = netns;
    e.tuple = *tuple;
    if HOLD.insert(sk, e, u64::from(BPF_ANY)).is_err() {
        fault(EventKind::InetSockSetState, FaultKind::HoldFull);
        return false;
    }
    true
}

/// accept() took `sk`: noted in its held entry (true), or it has none (the accept is sent).
#[inline(always)]
pub fn accept(sk: u64) -> bool {
    let Some(h) = HOLD.get_ptr_mut(sk) else {
        return false;
    };
    unsafe {
        (*h).held.accepted_ns = bpf_ktime_get_ns();
        (*h).held.accept_tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    }
    // The peer's FIN or RST may have taken the entry on another CPU meanwhile, with or without
    // this accept: then the accept is sent too (the agent takes a connection's accept once).
    unsafe { HOLD.get(sk) }.is_some()
}

/// What was held for `sk`, taken (`arrived_ns` 0: nothing).
#[inline(always)]
pub fn take(sk: u64) -> Held {
    if let Some(e) = unsafe { HOLD.get(sk) } {
        let h = e.held;
        // Only the program whose removal succeeds carries it: never twice.
        if HOLD.remove(sk).is_ok() {
            return h;
        }
    }
    zeroed::<Held>()
}
