//! Connect-time work after `accept()`, timed from the kernel: in a namespace the agent marks
//! storming (`STORM_NETNS`: a workload one of whose containers stopped, while a storm may
//! follow), each accepted connection is followed (`STORM_SOCKS`) through its first
//! `STORM_EXCHANGES` exchanges: each server send that follows the client's data (or the
//! accept: a server that speaks first) is emitted as a `sock_length` event, `Phase::Answered`.
//! The agent takes a connection's answer after the longest server-side wait as the moment the
//! service served it (a Socket.IO CONNECT answered after the middleware's pool).
//!
//! Cost: accepts elsewhere pay one hash miss in `STORM_NETNS` only while some namespace is
//! marked (`STORMING`); every socket's send and receive pays one array load, and a hash miss
//! in `STORM_SOCKS` only while some namespace is marked; a close pays one hash miss.

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::map,
    maps::{Array, HashMap},
};
use drainwatch_common::{
    EventKind,
    faults::FaultKind,
    sock_length::{self, Event, MSG_PEEK, Phase, StormSock},
};

use crate::ring::{reserve, submit};
use crate::util::{Ns, fill_header_task};

const KIND: EventKind = EventKind::SockLength;

/// Namespaces (inode) whose accepted connections are followed (the agent writes it).
#[map]
pub static STORM_NETNS: HashMap<u32, u8> = HashMap::with_max_entries(sock_length::STORM_NETNS, 0);

/// `[0]`: how many namespaces `STORM_NETNS` holds (the agent writes it): 0 spares every other
/// socket the lookups.
#[map]
pub static STORMING: Array<u32> = Array::with_max_entries(1, 0);

/// The connections followed, by socket address.
#[map]
pub static STORM_SOCKS: HashMap<u64, StormSock> = HashMap::with_max_entries(
    sock_length::STORM_SOCKS,
    aya_ebpf::bindings::BPF_F_NO_PREALLOC,
);

#[inline(always)]
fn storming() -> bool {
    STORMING.get(0).is_some_and(|n| *n != 0)
}

/// accept() handed `sk` (in namespace `netns`, on listener `port`) to the server.
#[inline(always)]
pub fn on_accept(sk: u64, netns: u32, port: u16) {
    if !storming() || unsafe { STORM_NETNS.get(netns) }.is_none() {
        return;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    let s = StormSock {
        accepted_ns: now,
        data_ns: now,
        exchanges: 0,
        port: u32::from(port),
        netns,
        _pad: 0,
    };
    // An entry a freed socket at this address left (its close removes it) is overwritten.
    if STORM_SOCKS.insert(sk, s, 0).is_err() {
        crate::fault::fault(KIND, FaultKind::StormFull);
    }
}

/// A send or receive of `ret` bytes on `sk`.
#[inline(always)]
pub fn on_io(sk: u64, ret: i32, flags: i32, send: bool) {
    if !storming() {
        return;
    }
    let Some(s) = STORM_SOCKS.get_ptr_mut(sk) else {
        return;
    };
    if ret <= 0 || (!send && flags & MSG_PEEK != 0) {
        return;
    }
    let s = unsafe { &mut *s };
    let now = unsafe { bpf_ktime_get_ns() };
    if now > s.accepted_ns + sock_length::STORM_FOLLOW_NS {
        let _ = STORM_SOCKS.remove(sk);
        return;
    }
    if !send {
        s.data_ns = now;
        return;
    }
    if s.data_ns == 0 {
        return; // more of the same answer, or the server speaking unasked
    }
    emit(sk, s);
    s.data_ns = 0;
    s.exchanges += 1;
    if s.exchanges >= sock_length::STORM_EXCHANGES {
        let _ = STORM_SOCKS.remove(sk);
    }
}

#[inline(always)]
fn emit(sk: u64, s: &StormSock) {
    let Some(mut entry) = reserve::<Event>(KIND) else {
        return;
    };
    let ev = unsafe { entry.assume_init_mut() };
    // The namespace and port name the listener; the inode is the one the accept read.
    let ns = Ns {
        inum: s.netns,
        cookie: 0,
    };
    fill_header_task(&mut ev.header, KIND, ns, false);
    ev.skaddr = sk;
    ev.cut_sk = u64::from(s.port);
    ev.req_bytes = u64::from(s.exchanges);
    ev.req_start_ns = s.data_ns;
    ev.cut_at_ns = s.accepted_ns;
    ev.phase = Phase::Answered as u32;
    ev.ret = 0;
    submit(entry);
}

/// `sk` reached CLOSE (every socket does before it is freed): its entry goes.
#[inline(always)]
pub fn on_close(sk: u64) {
    if unsafe { STORM_SOCKS.get(sk) }.is_some() {
        let _ = STORM_SOCKS.remove(sk);
    }
}
