//! `sock:sock_send_length` / `sock:sock_recv_length` (Linux 6.3+), on proxies' upstream
//! sockets only: per-request byte accounting (the bytes a proxy sent since the last response
//! byte it read), and the evidence that one worker thread handled a cut and went straight on
//! to re-send the request. The programs keep the accounting in `UPSTREAM_SOCKS` and emit an
//! event only around cuts: a cut, and the start and end of the request that followed it.

use crate::Header;

/// What an `Event` reports.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// A recv() returned 0 (EOF) or a connection error, or a send() failed, while a request
    /// was sent and no response byte read: the worker (`header.pid`) saw the cut.
    Cut = 1,
    /// The same worker's next upstream action started a request on this socket (a new
    /// connect, reported at the connect, or a send on a pooled connection) within the retry
    /// window of the cut on `cut_sk`, with no other socket I/O in between.
    RetryStart = 2,
    /// That request was sent whole (its first response byte was read, or it was cut in turn),
    /// or the proxy closed its socket before any response byte (its client gone): `req_bytes`
    /// is its size, or what was sent of it.
    RetryEnd = 3,
    /// A connection accepted in a storming namespace (`STORM_NETNS`): the server answered
    /// (sent) after the client's data, or after the accept, in one of the connection's first
    /// `STORM_EXCHANGES` exchanges. `cut_sk`: the listener's port; `cut_at_ns`: the accept;
    /// `req_start_ns`: the client's last data before the answer (the accept if none);
    /// `req_bytes`: the exchange's index (0 first); the header's time: the answer.
    Answered = 4,
}

impl Phase {
    pub fn from_u32(v: u32) -> Option<Self> {
        match v {
            1 => Some(Phase::Cut),
            2 => Some(Phase::RetryStart),
            3 => Some(Phase::RetryEnd),
            4 => Some(Phase::Answered),
            _ => None,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Event {
    pub header: Header,
    /// The upstream socket (`struct sock *`, as `inet_sock_set_state` reports it).
    pub skaddr: u64,
    /// For a retry's phases: the socket whose cut it followed. 0 for a cut.
    pub cut_sk: u64,
    /// Bytes of the request (sent since the last response byte); for `RetryStart`, 0.
    pub req_bytes: u64,
    /// `bpf_ktime_get_ns()` of the request's first byte sent.
    pub req_start_ns: u64,
    /// For a retry's phases: when the cut it followed was seen.
    pub cut_at_ns: u64,
    /// `Phase`.
    pub phase: u32,
    /// The syscall's result: the byte count or -errno (0: EOF).
    pub ret: i32,
}

/// An `UPSTREAM_SOCKS` value: one upstream connection's current request.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReqState {
    pub req_bytes: u64,
    pub resp_bytes: u64,
    pub req_start_ns: u64,
    /// Set (to the cut socket) when this socket's next or current request is a retry
    /// candidate; cleared when its `RetryEnd` is emitted.
    pub retry_of: u64,
    pub retry_cut_at: u64,
    /// When this socket's request was cut (with `CUT`).
    pub cut_at: u64,
    /// `RETRY_STARTED`, `CLOSED`, `CUT`, `SENT`.
    pub flags: u32,
    pub _pad: u32,
}

/// `ReqState::flags`: the candidate's `RetryStart` was emitted.
pub const RETRY_STARTED: u32 = 1;
/// `ReqState::flags`: the socket reached CLOSE (a reset) with a request pending: kept until
/// the proxy reads the error (the cut), then removed. Entries are removed at CLOSE otherwise:
/// the kernel reuses a freed socket's address, for any socket (a proxy's accepted client).
pub const CLOSED: u32 = 2;
/// `ReqState::flags`: its request was cut, and the proxy has not closed it yet. The entry is
/// kept until the proxy's close (`LAST_ACK`, or `tcp_destroy_sock` for a reset socket).
pub const CUT: u32 = 4;
/// `ReqState::flags`: the proxy has sent on this socket. Until then a reset that fails its
/// first send kept a request from going out (a cut of zero bytes); after, a reset with nothing
/// pending is an idle pooled connection's, no request's.
pub const SENT: u32 = 8;
/// Send errors of an established connection reset or closed under it (a refused connect's
/// failure is judged from its state change instead).
pub const RESET_ERRORS: [i32; 2] = [
    104, // ECONNRESET
    32,  // EPIPE
];

/// A `CHAINS` slot: one worker thread's way from a cut to its retry. A retry is the
/// thread's next upstream action after it **closed** the cut socket (nginx and HAProxy both
/// close it and connect again in one go; an event loop may read several cuts first, and may
/// read a new client request before it, so the cut read alone proves nothing). The close
/// counts only if the thread sent nothing to a client since its latest cut: an abort answers
/// the client (a 502) before or right after its close. Client-side reads do not count.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    /// `CHAIN_OPEN`: the closed cut socket, and when it was cut and closed.
    pub cut_sk: u64,
    pub cut_at: u64,
    pub closed_at: u64,
    /// The thread's latest cut (`CHAIN_CUT_SEEN` is fresh for `CUT_CLOSE_NS` after it).
    pub seen_at: u64,
    /// 0: empty.
    pub tid: u32,
    /// 0, `CHAIN_CUT_SEEN` or `CHAIN_OPEN`.
    pub state: u32,
}

/// `Chain::state`: the thread read a cut and has sent nothing to a client since.
pub const CHAIN_CUT_SEEN: u32 = 1;
/// `Chain::state`: then it closed a cut socket: its next upstream action, within the retry
/// window and with no other socket I/O first, is that request's retry candidate.
pub const CHAIN_OPEN: u32 = 2;
/// How long after its latest cut a thread's close of a cut socket may open a chain.
pub const CUT_CLOSE_NS: u64 = 250_000_000;

/// Default capacity of `UPSTREAM_SOCKS` (`--upstream-entries`). A plain hash: every entry
/// goes when its socket is destroyed, so a full map is that many upstream connections open at
/// once, and a connect it has no room for is counted (`FaultKind::UpstreamFull`), where an LRU
/// would have evicted a live connection's request uncounted.
pub const UPSTREAM_SOCKS: u32 = 65536;
/// Capacity of `PROXIES`: processes whose connects create `UPSTREAM_SOCKS` entries.
pub const PROXIES: u32 = 4096;
/// `CHAINS` slots, indexed by `tid % CHAINS` (a collision loses a chain: a missed retry,
/// never a false one, as the slot holds the tid).
pub const CHAINS: u32 = 256;

/// A `STORM_SOCKS` value: a connection accepted in a storming namespace, followed through its
/// opening exchanges (the server's answer to the client's data, or to the accept for a server
/// that speaks first), the connect-time work done after `accept()` (middleware, authorisation,
/// a pool) that the accept queue does not show.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StormSock {
    pub accepted_ns: u64,
    /// The client's latest data not yet answered (the accept at first); 0: none pending.
    pub data_ns: u64,
    pub exchanges: u32,
    /// The listener's port.
    pub port: u32,
    /// Its network namespace (inode).
    pub netns: u32,
    pub _pad: u32,
}

/// Exchanges followed per storming connection: a Socket.IO session's opening is two (the
/// upgrade, then its CONNECT answered after the middleware), an HTTP request one, a polling
/// transport's three; later ones are the session's ordinary traffic.
pub const STORM_EXCHANGES: u32 = 4;
/// A storming connection is followed for at most this long after its accept (its entry goes
/// at its next I/O after it, or at its close).
pub const STORM_FOLLOW_NS: u64 = 30_000_000_000;
/// Capacity of `STORM_SOCKS`: connections followed at once (a plain hash, entries go at
/// close; one that finds it full is counted, `FaultKind::StormFull`).
pub const STORM_SOCKS: u32 = 65536;
/// Capacity of `STORM_NETNS`: namespaces storming (or watched for a storm) at once.
pub const STORM_NETNS: u32 = 1024;

/// recv() flag the tracepoint passes through: a peek reads nothing.
pub const MSG_PEEK: i32 = 2;

/// Connection errors that end a request (others, EAGAIN and EINTR first, are transient).
pub const CONN_ERRORS: [i32; 8] = [
    104, // ECONNRESET
    32,  // EPIPE
    110, // ETIMEDOUT
    111, // ECONNREFUSED
    103, // ECONNABORTED
    107, // ENOTCONN
    113, // EHOSTUNREACH
    101, // ENETUNREACH
];

pod!(Event, ReqState, Chain);

// The layouts are a contract with the kernel side (see the crate root).
const _: () = assert!(core::mem::size_of::<Event>() == 104);
const _: () = assert!(core::mem::size_of::<ReqState>() == 56);
const _: () = assert!(core::mem::size_of::<Chain>() == 40);
