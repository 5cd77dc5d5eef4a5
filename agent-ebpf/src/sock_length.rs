//! `sock_length`: `sock_send_length` and `sock_recv_length` (tp_btf), which every socket's
//! send and receive pass, and `tcp_destroy_sock`. Only proxies' upstream sockets
//! (`UPSTREAM_SOCKS`, filled where a proxy connects) are followed; any other socket costs one
//! hash miss and a look at the current thread's `CHAINS` slot (the clock is read only when
//! that slot holds a chain).
//!
//! Per request: a send after a response byte (or on a fresh socket) starts a request; bytes
//! sent add to it; the first response byte ends it. A recv of EOF or a connection error (or a
//! failed send) with a request sent and no response byte is a cut, emitted with the worker's
//! tid and the request's size. The retry candidate is decided from what that thread does
//! next (see `Chain`): it closes the cut socket with no client-side send since its latest cut,
//! then its next upstream action (a connect, seen by `inet_sock_set_state`, or a request
//! start on a pooled socket), with no other socket I/O first, is the candidate.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map},
    maps::{Array, HashMap},
    programs::BtfTracePointContext,
};
use drainwatch_common::{
    EventKind,
    faults::FaultKind,
    sock_length::{
        self, CHAIN_CUT_SEEN, CHAIN_OPEN, CLOSED, CONN_ERRORS, CUT, Chain, Event, MSG_PEEK, Phase,
        RESET_ERRORS, RETRY_STARTED, ReqState, SENT,
    },
};

use crate::ring::{reserve, submit};
use crate::util::{CONFIG, Ns, cfg, fill_header_task, zeroed};

const KIND: EventKind = EventKind::SockLength;

/// Proxies' upstream sockets and their current request. The agent sets the size
/// (`--upstream-entries`); a connect past it is counted (`upstream_full`).
#[map]
pub static UPSTREAM_SOCKS: HashMap<u64, ReqState> =
    HashMap::with_max_entries(sock_length::UPSTREAM_SOCKS, 0);

/// Thread-group ids of proxies (the agent fills it): their connects create entries above.
#[map]
pub static PROXIES: HashMap<u32, u8> = HashMap::with_max_entries(sock_length::PROXIES, 0);

#[map]
static CHAINS: Array<Chain> = Array::with_max_entries(sock_length::CHAINS, 0);

#[inline(always)]
fn window_ns() -> u64 {
    u64::from(cfg(&CONFIG.retry_window_us)) * 1000
}

#[inline(always)]
fn tid() -> u32 {
    bpf_get_current_pid_tgid() as u32
}

#[inline(always)]
fn now() -> u64 {
    unsafe { bpf_ktime_get_ns() }
}

/// The current thread's chain slot, if the slot is its own, in a state, and fresh; `None`
/// otherwise (ending an expired chain on the way). Only the owning thread writes its slot
/// (a colliding thread takes it over, counted as `ChainLost`), so no global "any chain open"
/// flag is kept: one, written from every CPU without atomics, lost windows under races.
#[inline(always)]
fn own_chain(tid: u32) -> Option<(*mut Chain, u64)> {
    let c = CHAINS.get_ptr_mut(tid % sock_length::CHAINS)?;
    let (own, state) = unsafe { ((*c).tid == tid, (*c).state) };
    if !own || state == 0 {
        return None;
    }
    let now = now();
    let fresh = unsafe {
        if state == CHAIN_OPEN {
            now <= (*c).closed_at + window_ns()
        } else {
            now <= (*c).seen_at + sock_length::CUT_CLOSE_NS
        }
    };
    if !fresh {
        unsafe { (*c).state = 0 };
        return None;
    }
    Some((c, now))
}

/// Socket I/O by the current thread on `sk` that is not its retry. An open chain ends (I/O on
/// the cut socket itself does not count). A client-side send (`answer`) also ends the clean
/// state since the cut: whatever the thread closes next may be an abort answered. A client-side
/// read does not: an event loop reads new requests between a cut and its retry.
#[inline(always)]
fn break_chain(sk: u64, answer: bool) {
    let Some((c, _)) = own_chain(tid()) else {
        return;
    };
    unsafe {
        if (*c).state == CHAIN_OPEN && (*c).cut_sk == sk {
            return;
        }
        (*c).state = if answer { 0 } else { CHAIN_CUT_SEEN };
    }
}

/// Takes the current thread's open chain for a request starting on `sk`, or a connect (`sk`:
/// `None`: a new socket, which may well sit at the address of the cut one the proxy just
/// closed): the cut socket and when it was cut. The thread stays clean for its other cuts.
#[inline(always)]
fn take_chain(sk: Option<u64>) -> Option<(u64, u64)> {
    let (c, _) = own_chain(tid())?;
    let (state, cut_sk, at) = unsafe { ((*c).state, (*c).cut_sk, (*c).cut_at) };
    if state != CHAIN_OPEN || sk == Some(cut_sk) {
        return None;
    }
    unsafe { (*c).state = CHAIN_CUT_SEEN };
    Some((cut_sk, at))
}

/// The current thread read a cut: it is clean from now.
#[inline(always)]
fn cut_seen(tid: u32, now: u64) {
    if let Some(c) = CHAINS.get_ptr_mut(tid % sock_length::CHAINS) {
        unsafe {
            let live = (*c).state != 0
                && (*c).tid != tid
                && now <= (*c).seen_at + sock_length::CUT_CLOSE_NS;
            if live {
                crate::fault::fault(KIND, FaultKind::ChainLost);
            }
            (*c).tid = tid;
            (*c).state = CHAIN_CUT_SEEN;
            (*c).seen_at = now;
        }
    }
}

/// The current thread closed the cut socket `sk` (cut at `cut_at`): if it is clean since its
/// latest cut, its next upstream action is the retry candidate.
#[inline(always)]
fn open_chain(sk: u64, cut_at: u64) {
    let Some((c, now)) = own_chain(tid()) else {
        return;
    };
    unsafe {
        (*c).state = CHAIN_OPEN;
        (*c).cut_sk = sk;
        (*c).cut_at = cut_at;
        (*c).closed_at = now;
    }
}

#[inline(always)]
fn emit(sk: u64, st: &ReqState, phase: Phase, ret: i32) {
    let Some(mut entry) = reserve::<Event>(KIND) else {
        return;
    };
    let ev = unsafe { entry.assume_init_mut() };
    // No cgroup or command: the socket names the proxy (the agent follows it by address).
    fill_header_task(&mut ev.header, KIND, Ns::UNKNOWN, false);
    ev.skaddr = sk;
    ev.cut_sk = st.retry_of;
    ev.req_bytes = st.req_bytes;
    ev.req_start_ns = st.req_start_ns;
    ev.cut_at_ns = st.retry_cut_at;
    ev.phase = phase as u32;
    ev.ret = ret;
    submit(entry);
}

#[inline(always)]
fn one_of(ret: i32, errors: &[i32]) -> bool {
    let mut i = 0;
    while i < errors.len() {
        if ret == -errors[i] {
            return true;
        }
        i += 1;
    }
    false
}

#[inline(always)]
fn conn_error(ret: i32) -> bool {
    one_of(ret, &CONN_ERRORS)
}

/// The request on `sk` ended without a response byte: a cut, if one was sent, or if the
/// proxy's first send on a fresh connection failed on its reset (HAProxy connects, the
/// backend's listener closes with the connection in its accept queue, the send fails: the
/// client's 502 all the same). The entry stays (flagged `CUT`) until the proxy closes the
/// socket: that close, not the read, opens the chain.
#[inline(always)]
fn failed(sk: u64, st: &mut ReqState, ret: i32, send: bool) {
    if st.resp_bytes != 0 {
        return;
    }
    if st.req_bytes == 0 {
        // Not an idle pooled connection's reset (it has sent), nor one found by a read (a
        // proxy's pre-opened spare connection), nor a refused connect's.
        let unsent = send
            && st.flags & (SENT | CUT | RETRY_STARTED) == 0
            && st.retry_of == 0
            && one_of(ret, &RESET_ERRORS);
        if !unsent {
            return;
        }
        st.req_start_ns = now();
    }
    if st.retry_of != 0 && st.flags & RETRY_STARTED != 0 {
        // A retry cut in turn: it was sent whole.
        emit(sk, st, Phase::RetryEnd, ret);
    }
    st.retry_of = 0;
    st.retry_cut_at = 0;
    st.flags = (st.flags & (CLOSED | SENT)) | CUT;
    let (tid, now) = (tid(), now());
    st.cut_at = now;
    emit(sk, st, Phase::Cut, ret);
    cut_seen(tid, now);
    // One cut per request: a second EOF read is no new one.
    st.req_bytes = 0;
}

#[inline(always)]
fn on_send(sk: u64, st: &mut ReqState, ret: i32) {
    if ret <= 0 {
        if conn_error(ret) {
            failed(sk, st, ret, true);
        }
        return;
    }
    if st.req_bytes == 0 || st.resp_bytes != 0 {
        // A new connection's retry was reported at its connect.
        let started = st.flags & RETRY_STARTED != 0;
        st.req_bytes = 0;
        st.resp_bytes = 0;
        st.req_start_ns = now();
        if st.retry_of == 0
            && let Some((cut_sk, at)) = take_chain(Some(sk))
        {
            // A pooled connection: the retry goes out on it at once.
            st.retry_of = cut_sk;
            st.retry_cut_at = at;
        }
        st.flags &= CLOSED | SENT;
        if st.retry_of != 0 {
            if !started {
                emit(sk, st, Phase::RetryStart, ret);
            }
            st.flags |= RETRY_STARTED;
        }
    } else {
        break_chain(sk, false);
    }
    st.req_bytes += ret as u64;
    st.flags |= SENT;
}

#[inline(always)]
fn on_recv(sk: u64, st: &mut ReqState, ret: i32, flags: i32) {
    if flags & MSG_PEEK != 0 {
        return;
    }
    if ret > 0 {
        if st.resp_bytes == 0 && st.req_bytes != 0 && st.flags & RETRY_STARTED != 0 {
            emit(sk, st, Phase::RetryEnd, ret);
            st.retry_of = 0;
            st.retry_cut_at = 0;
            st.flags &= CLOSED | SENT;
        }
        st.resp_bytes += ret as u64;
        break_chain(sk, false);
    } else if ret == 0 || conn_error(ret) {
        failed(sk, st, ret, false);
    }
}

#[inline(always)]
fn on_io(sk: u64, ret: i32, flags: i32, send: bool) {
    if crate::util::attach_only() {
        return;
    }
    let Some(st) = UPSTREAM_SOCKS.get_ptr_mut(sk) else {
        // A connection accepted in a storming namespace: its answers are timed. Still I/O of
        // the thread (a proxy's client side, if the proxy is what storms).
        crate::storm_answers::on_io(sk, ret, flags, send);
        break_chain(sk, send);
        return;
    };
    let st = unsafe { &mut *st };
    if send {
        on_send(sk, st, ret);
    } else {
        on_recv(sk, st, ret, flags);
    }
}

/// tp_btf: `sock_send_length(struct sock *sk, int ret, int flags)`.
#[btf_tracepoint(function = "sock_send_length")]
pub fn sock_send_length_btf(ctx: BtfTracePointContext) -> i32 {
    let sk: *const u8 = ctx.arg(0);
    on_io(sk as u64, ctx.arg(1), ctx.arg(2), true);
    0
}

/// tp_btf: `sock_recv_length(struct sock *sk, int ret, int flags)`.
#[btf_tracepoint(function = "sock_recv_length")]
pub fn sock_recv_length_btf(ctx: BtfTracePointContext) -> i32 {
    let sk: *const u8 = ctx.arg(0);
    on_io(sk as u64, ctx.arg(1), ctx.arg(2), false);
    0
}

/// A connect() (CLOSE → SYN_SENT, process context) by a proxy, or to a container on this node
/// (`to_container`): the new socket is followed, and is the retry candidate of a chain the
/// thread just opened.
#[inline(always)]
pub fn on_connect(sk: u64, tgid: u32, to_container: bool) {
    if !to_container && !is_proxy(tgid) {
        on_new_sock(sk);
        return;
    }
    let mut st = zeroed::<ReqState>();
    if let Some((cut_sk, at)) = take_chain(None) {
        st.retry_of = cut_sk;
        st.retry_cut_at = at;
        st.req_start_ns = now();
        st.flags = RETRY_STARTED;
    }
    if UPSTREAM_SOCKS.insert(sk, st, 0).is_err() {
        // Full (`--upstream-entries`): this connection's requests go unjudged, and a retry
        // of the chain's cut, if this was it, counts as an abort (as for `ChainLost`).
        crate::fault::fault(EventKind::InetSockSetState, FaultKind::UpstreamFull);
    } else if st.retry_of != 0 {
        // Reported now, not at its first send: the handshake may take longer than the
        // agent waits for a retry to start.
        emit(sk, &st, Phase::RetryStart, 0);
    }
}

/// Whether `tgid` is a proxy the agent named (its connects are followed).
#[inline(always)]
pub fn is_proxy(tgid: u32) -> bool {
    unsafe { PROXIES.get(tgid) }.is_some()
}

/// A new socket nobody follows (a passive child, a connect by another process) at `sk`: an
/// entry there is a freed socket's, which the agent added after the kernel had destroyed it
/// (`Watch::follow` races the socket's close), and the new socket's I/O is not its requests.
#[inline(always)]
pub fn on_new_sock(sk: u64) {
    if unsafe { UPSTREAM_SOCKS.get(sk) }.is_some() {
        let _ = UPSTREAM_SOCKS.remove(sk);
        crate::fault::fault(KIND, FaultKind::StaleEntry);
    }
}

/// A socket reached CLOSE (`inet_sock_set_state`; every socket does before it is freed): its
/// entry goes, unless a reset closed it under a pending request the proxy has yet to read (or
/// before the proxy's first send, which the reset will fail), or it was cut and the proxy has
/// yet to close it (then `tcp_destroy_sock` removes it).
#[inline(always)]
pub fn on_close(sk: u64) {
    let Some(st) = UPSTREAM_SOCKS.get_ptr_mut(sk) else {
        return;
    };
    let (pending, cut) = unsafe {
        (
            (*st).resp_bytes == 0 && ((*st).req_bytes != 0 || (*st).flags & SENT == 0),
            (*st).flags & CUT != 0,
        )
    };
    if pending {
        unsafe { (*st).flags |= CLOSED };
    } else if !cut {
        let _ = UPSTREAM_SOCKS.remove(sk);
    }
}

/// The proxy closed `sk` (CLOSE_WAIT → LAST_ACK, process context): if it was cut, the chain
/// opens (see `Chain`).
#[inline(always)]
pub fn on_proxy_close(sk: u64) {
    if let Some(st) = followed(sk) {
        proxy_close(sk, st);
    }
}

#[inline(always)]
fn proxy_close(sk: u64, st: &mut ReqState) {
    if st.flags & CUT == 0 {
        return;
    }
    st.flags &= !CUT;
    open_chain(sk, st.cut_at);
}

/// CLOSE_WAIT → LAST_ACK: [`on_proxy_shut`] then [`on_proxy_close`], one lookup for both.
#[inline(always)]
pub fn on_last_ack(sk: u64) {
    if let Some(st) = followed(sk) {
        proxy_shut(sk, st);
        proxy_close(sk, st);
    }
}

/// `sk`'s entry, if it is followed (one lookup: most sockets are not).
#[inline(always)]
fn followed(sk: u64) -> Option<&'static mut ReqState> {
    UPSTREAM_SOCKS.get_ptr_mut(sk).map(|st| unsafe { &mut *st })
}

/// The proxy closed `sk` (FIN_WAIT1 or LAST_ACK, or its destruction at close() of a socket
/// a reset or the close itself left in CLOSE: process context) with a retry candidate on it
/// that read no response byte: the candidate is over, with what was sent of it. A proxy drops
/// a retry so when its client left meanwhile (nginx even before sending it), and no response
/// byte or cut would ever end it: its cut stayed without a verdict.
#[inline(always)]
pub fn on_proxy_shut(sk: u64) {
    if let Some(st) = followed(sk) {
        proxy_shut(sk, st);
    }
}

#[inline(always)]
fn proxy_shut(sk: u64, st: &mut ReqState) {
    if st.retry_of == 0 || st.flags & RETRY_STARTED == 0 || st.resp_bytes != 0 {
        return;
    }
    // With what was sent of it: nothing is an abort; sent whole, the backend has it, and (as
    // for the cut backend, `retries::read_by_backend`) having it counts as running it.
    emit(sk, st, Phase::RetryEnd, 0);
    st.retry_of = 0;
    st.retry_cut_at = 0;
    st.flags &= !RETRY_STARTED;
}

/// tp_btf: `tcp_destroy_sock(struct sock *sk)`. A socket a reset had closed is destroyed at
/// its process's close(), in process context: a proxy's close of a cut upstream (or of a
/// retry, see `on_proxy_shut`); any other entry goes too (the kernel reuses the address).
#[btf_tracepoint(function = "tcp_destroy_sock")]
pub fn tcp_destroy_sock_btf(ctx: BtfTracePointContext) -> i32 {
    if crate::util::attach_only() {
        return 0;
    }
    let sk = ctx.arg::<*const u8>(0) as u64;
    // One lookup where most sockets have no entry (a removal takes the bucket's lock).
    if let Some(st) = followed(sk) {
        proxy_shut(sk, st);
        proxy_close(sk, st);
        let _ = UPSTREAM_SOCKS.remove(sk);
    }
    0
}
