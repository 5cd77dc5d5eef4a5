//! `sock_length`: `sock_send_length` and `sock_recv_length` (tp_btf), which every socket's
//! send and receive pass. Only proxies' upstream sockets (`UPSTREAM_SOCKS`, filled where a
//! proxy connects) are followed; any other socket costs one hash miss, plus, only within the
//! retry window after a cut, a look at the `CHAINS` slot of the current thread.
//!
//! Per request: a send after a response byte (or on a fresh socket) starts a request; bytes
//! sent add to it; the first response byte ends it. A recv of EOF or a connection error (or a
//! failed send) with a request sent and no response byte is a cut, emitted with the worker's
//! tid and the request's size, and opens that thread's chain: if its next socket action is a
//! connect (`inet_sock_set_state`) or a request start on an upstream socket, that request is
//! the retry candidate (nginx re-sends synchronously, from the failed read's handler); any
//! other socket I/O by the thread first ends the chain (nginx answering 502 to its client).

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map},
    maps::{Array, HashMap, LruHashMap},
    programs::BtfTracePointContext,
};
use drainwatch_common::{
    EventKind,
    sock_length::{
        self, CLOSED, CONN_ERRORS, Chain, Event, MSG_PEEK, Phase, RETRY_STARTED, ReqState,
    },
};

use crate::util::{CONFIG, cfg, fill_header_task, reserve, submit, zeroed};

const KIND: EventKind = EventKind::SockLength;

/// Proxies' upstream sockets and their current request.
#[map]
pub static UPSTREAM_SOCKS: LruHashMap<u64, ReqState> =
    LruHashMap::with_max_entries(sock_length::UPSTREAM_SOCKS, 0);

/// Thread-group ids of proxies (the agent fills it): their connects create entries above.
#[map]
pub static PROXIES: HashMap<u32, u8> = HashMap::with_max_entries(sock_length::PROXIES, 0);

#[map]
static CHAINS: Array<Chain> = Array::with_max_entries(sock_length::CHAINS, 0);

/// The latest end of any open chain's window (0: none), so that other traffic skips the
/// chain lookup (and the clock) outside the windows. Written without atomics: a lost race
/// closes a chain early (a missed retry, never a false one).
#[map]
static CHAIN_ARMED: Array<u64> = Array::with_max_entries(1, 0);

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

/// The current thread's open chain slot, if any window is open and the slot is its own and
/// fresh; `None` otherwise (closing an expired global window on the way).
#[inline(always)]
fn own_chain(tid: u32, now: u64) -> Option<*mut Chain> {
    let armed = CHAIN_ARMED.get_ptr_mut(0)?;
    let until = unsafe { *armed };
    if until == 0 {
        return None;
    }
    if now > until {
        unsafe { *armed = 0 };
        return None;
    }
    let c = CHAINS.get_ptr_mut(tid % sock_length::CHAINS)?;
    let fresh = unsafe { (*c).tid == tid && now <= (*c).at + window_ns() };
    fresh.then_some(c)
}

/// Socket I/O by the current thread on `sk` that is not its retry: its chain ends (I/O on the
/// cut socket itself, a second read of its EOF, does not count).
#[inline(always)]
fn break_chain(sk: u64) {
    let armed = match CHAIN_ARMED.get(0) {
        Some(a) => *a,
        None => return,
    };
    if armed == 0 {
        return;
    }
    let (tid, now) = (tid(), now());
    if let Some(c) = own_chain(tid, now)
        && unsafe { (*c).cut_sk } != sk
    {
        unsafe { (*c).tid = 0 };
    }
}

/// Takes the current thread's chain for a request starting on `sk`, or a connect (`sk`:
/// `None`: a new socket, which may well sit at the address of the cut one the proxy just
/// closed): the cut socket and when it was cut.
#[inline(always)]
fn take_chain(sk: Option<u64>) -> Option<(u64, u64)> {
    let armed = CHAIN_ARMED.get(0).copied().unwrap_or(0);
    if armed == 0 {
        return None;
    }
    let c = own_chain(tid(), now())?;
    let (cut_sk, at) = unsafe { ((*c).cut_sk, (*c).at) };
    if sk == Some(cut_sk) {
        return None; // the cut socket itself: no retry goes out on it
    }
    unsafe { (*c).tid = 0 };
    Some((cut_sk, at))
}

#[inline(always)]
fn open_chain(sk: u64, tid: u32, now: u64) {
    if let Some(c) = CHAINS.get_ptr_mut(tid % sock_length::CHAINS) {
        unsafe {
            (*c).cut_sk = sk;
            (*c).at = now;
            (*c).tid = tid;
        }
    }
    if let Some(a) = CHAIN_ARMED.get_ptr_mut(0) {
        let until = now + window_ns();
        unsafe {
            if *a < until {
                *a = until;
            }
        }
    }
}

#[inline(always)]
fn emit(sk: u64, st: &ReqState, phase: Phase, ret: i32) {
    let Some(mut entry) = reserve::<Event>(KIND) else {
        return;
    };
    let ev = unsafe { entry.assume_init_mut() };
    // No cgroup or command: the socket names the proxy (the agent follows it by address).
    fill_header_task(&mut ev.header, KIND, 0, false);
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
fn conn_error(ret: i32) -> bool {
    let mut i = 0;
    while i < CONN_ERRORS.len() {
        if ret == -CONN_ERRORS[i] {
            return true;
        }
        i += 1;
    }
    false
}

/// The request on `sk` ended without a response byte: a cut, if one was sent. True when the
/// entry is to go (the socket already reached CLOSE).
#[inline(always)]
fn failed(sk: u64, st: &mut ReqState, ret: i32) -> bool {
    let closed = st.flags & CLOSED != 0;
    if st.req_bytes == 0 || st.resp_bytes != 0 {
        return closed;
    }
    if st.retry_of != 0 && st.flags & RETRY_STARTED != 0 {
        // A retry cut in turn: it was sent whole.
        emit(sk, st, Phase::RetryEnd, ret);
    }
    st.retry_of = 0;
    st.retry_cut_at = 0;
    st.flags &= CLOSED;
    emit(sk, st, Phase::Cut, ret);
    open_chain(sk, tid(), now());
    // One cut per request: a second EOF read is no new one.
    st.req_bytes = 0;
    closed
}

#[inline(always)]
fn on_send(sk: u64, st: &mut ReqState, ret: i32) -> bool {
    if ret <= 0 {
        return conn_error(ret) && failed(sk, st, ret);
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
        st.flags &= CLOSED;
        if st.retry_of != 0 {
            if !started {
                emit(sk, st, Phase::RetryStart, ret);
            }
            st.flags |= RETRY_STARTED;
        }
    } else {
        break_chain(sk);
    }
    st.req_bytes += ret as u64;
    false
}

#[inline(always)]
fn on_recv(sk: u64, st: &mut ReqState, ret: i32, flags: i32) -> bool {
    if flags & MSG_PEEK != 0 {
        return false;
    }
    if ret > 0 {
        if st.resp_bytes == 0 && st.req_bytes != 0 && st.flags & RETRY_STARTED != 0 {
            emit(sk, st, Phase::RetryEnd, ret);
            st.retry_of = 0;
            st.retry_cut_at = 0;
            st.flags &= CLOSED;
        }
        st.resp_bytes += ret as u64;
        break_chain(sk);
        false
    } else {
        (ret == 0 || conn_error(ret)) && failed(sk, st, ret)
    }
}

#[inline(always)]
fn on_io(sk: u64, ret: i32, flags: i32, send: bool) {
    if crate::util::attach_only() {
        return;
    }
    let Some(st) = UPSTREAM_SOCKS.get_ptr_mut(sk) else {
        break_chain(sk);
        return;
    };
    let st = unsafe { &mut *st };
    let gone = if send {
        on_send(sk, st, ret)
    } else {
        on_recv(sk, st, ret, flags)
    };
    if gone {
        let _ = UPSTREAM_SOCKS.remove(sk);
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

/// A connect() (CLOSE → SYN_SENT, process context) by a proxy: the new socket is followed,
/// and is the retry candidate of a cut the thread just saw.
#[inline(always)]
pub fn on_connect(sk: u64, tgid: u32) {
    if unsafe { PROXIES.get(tgid) }.is_none() {
        return;
    }
    let mut st = zeroed::<ReqState>();
    if let Some((cut_sk, at)) = take_chain(None) {
        // Reported now, not at its first send: the handshake may take longer than the
        // agent waits for a retry to start.
        st.retry_of = cut_sk;
        st.retry_cut_at = at;
        st.req_start_ns = now();
        st.flags = RETRY_STARTED;
        emit(sk, &st, Phase::RetryStart, 0);
    }
    let _ = UPSTREAM_SOCKS.insert(sk, st, 0);
}

/// A socket reached CLOSE (`inet_sock_set_state`; every socket does before it is freed): its
/// entry goes, unless a reset closed it under a pending request the proxy has yet to read.
#[inline(always)]
pub fn on_close(sk: u64) {
    let Some(st) = UPSTREAM_SOCKS.get_ptr_mut(sk) else {
        return;
    };
    let pending = unsafe { (*st).req_bytes != 0 && (*st).resp_bytes == 0 };
    if pending {
        unsafe { (*st).flags |= CLOSED };
    } else {
        let _ = UPSTREAM_SOCKS.remove(sk);
    }
}
