//! `sock:inet_sock_set_state`: a TCP socket changed state (only `IPPROTO_TCP` is emitted).

use crate::{
    Header, Tuple,
    fields::{AddrFields, NO_FIELD},
};

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Event {
    pub header: Header,
    pub skaddr: u64,
    pub tuple: Tuple,
    pub oldstate: i32,
    pub newstate: i32,
    /// `tcp_sock` counters at the transition (0 where BTF gave no offset): payload bytes
    /// received and sent, the receive queue's ends, and the jiffies of the last data received
    /// and sent. Together they say whether a request was pending when the connection closed.
    pub bytes_received: u64,
    pub bytes_sent: u64,
    pub rcv_nxt: u32,
    pub copied_seq: u32,
    pub lrcvtime: u32,
    pub lsndtime: u32,
    /// `sk_max_ack_backlog`: for a transition to LISTEN, the accept queue's limit (the
    /// listen() backlog capped by somaxconn), which /proc/net/tcp does not show.
    pub max_ack_backlog: u32,
    /// The low 32 bits of jiffies at the transition (with the counters, else 0): what
    /// `lrcvtime` and `lsndtime` are measured against, so the agent sees how long the
    /// connection had been quiet when it closed.
    pub jiffies: u32,
    /// `tcp_sock.data_segs_in` / `data_segs_out` (with the counters): a stream sends many
    /// segments per segment it receives, a request/response connection about as many.
    pub data_segs_in: u32,
    pub data_segs_out: u32,
    /// `tcp_sock.snd_wl1` (with the counters on the tp_btf program, else 0): where the peer's
    /// data since it acknowledged this side's last data starts, so `rcv_nxt - snd_wl1` is what
    /// it sent after this side's last answer reached it.
    pub snd_wl1: u32,
    /// `snd_nxt - snd_una` (with `snd_wl1`, else 0): this side's data the peer had not yet
    /// acknowledged. With the tick clocks unable to order a request and the answer before it,
    /// 0 says the answer had reached the peer before what it sent since.
    pub unacked: u32,
    /// A connect's failure (SYN_SENT to CLOSE) on the tp_btf program, else 0: when its first
    /// SYN went out (`tcp_sock.retrans_stamp`, which `tcp_connect` sets: milliseconds of the
    /// monotonic clock, low 32 bits), and `sk_err`, why it failed (ECONNREFUSED with no RST
    /// received is a filter's ICMP reject, as kube-proxy answers for a Service with no
    /// endpoints; EHOSTUNREACH, ETIMEDOUT; 0: its process gave up first).
    pub syn_ms: u32,
    pub error: i32,
    /// With `Config::hold`: the socket's arrival and accept, held in the kernel and sent with
    /// this record instead of records of their own (all zero when nothing was held).
    pub held: Held,
}

/// A passive child's arrival (SYN_RECV→ESTABLISHED) and accept, kept in the kernel until the
/// socket's next record carries them (`Config::hold`): a connection that opens and closes
/// cleanly then makes one record where it made three.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// When its handshake completed (`bpf_ktime_get_ns`); 0: nothing held.
    pub arrived_ns: u64,
    /// When accept() took it; 0: not accepted.
    pub accepted_ns: u64,
    /// The thread group that accepted it.
    pub accept_tgid: u32,
    pub _pad: u32,
}

/// A held connection in the kernel's map (`HOLD`): what its next record will carry, and where
/// it is, for the agent to take it over when its namespace turns hot (a stop, a start, a
/// storm to follow) or it has waited long (see `capture::hold`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HoldEntry {
    pub held: Held,
    pub netns: u32,
    pub _pad: u32,
    pub tuple: Tuple,
}

/// `oldstate` and `newstate` of a record that carries only what was held for its socket (sent
/// before a reset hook's record of the same socket), no transition of its own.
pub const HELD_ONLY: i32 = -1;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fields {
    pub skaddr: u16,
    pub oldstate: u16,
    pub newstate: u16,
    pub protocol: u16,
    pub addr: AddrFields,
    /// Bit `1 << state` set for the old states whose transitions the agent uses (a closing
    /// connection's later steps, FIN_WAIT1 onwards, are not): others are dropped in the kernel.
    pub emit_old: u32,
    /// Old states whose transitions need the `tcp_sock` counters (leaving ESTABLISHED or
    /// CLOSE_WAIT: was a request pending?).
    pub counters_old: u32,
    /// New states that need `sk_max_ack_backlog` (entering LISTEN).
    pub backlog_new: u32,
    /// With `backlog_new` (LISTEN): a listener opening (to LISTEN) or closing (from LISTEN to
    /// these, CLOSE) passes the host-namespace filter even when it touches no container: a
    /// listener may belong to a host-network container, which only the agent can tell, and
    /// listeners open and close rarely. (A passive child's first step, LISTEN to SYN_RECV,
    /// is not a listener closing.)
    pub listener_closed_new: u32,
    /// New states entered in process context whose events the agent attributes by task
    /// (connect(): SYN_SENT, listen(): LISTEN): only these read the task's cgroup and command
    /// (two helper calls); other transitions mostly run in softirq, for an unrelated task.
    pub task_new: u32,
    /// New states of a connect() (SYN_SENT): a proxy's (`PROXIES`) new socket gets an
    /// `UPSTREAM_SOCKS` entry, and may be the retry of a cut its thread just saw.
    pub connect_new: u32,
    /// TCP_CLOSE's number (-2: unknown): a socket's last state, where `sock_length`'s entry
    /// for it goes.
    pub close_state: i32,
    /// TCP_LAST_ACK's number (-2: unknown): a socket the peer had closed, closed in turn by
    /// its process (process context): a proxy's close of a cut upstream.
    pub last_ack_state: i32,
    /// TCP_FIN_WAIT1's number (-2: unknown): a process closed (or shut down) an established
    /// socket (process context): a proxy giving up on a retry it sent (`sock_length`).
    pub fin_wait1_state: i32,
    /// TCP_SYN_RECV's number (-2: unknown): a passive child's first state. Its address may be
    /// a freed upstream socket's whose `sock_length` entry outlived it (the agent adds entries
    /// for sockets it learns of late, which may be gone by then): that entry goes.
    pub syn_recv_state: i32,
    /// TCP_ESTABLISHED's number (-2: unknown): with `Config::hold`, a passive child entering
    /// it from SYN_RECV is an arrival, held (`inet_sock_set_state::Held`).
    pub established_state: i32,
    /// With `Config::lean`: old states (SYN_SENT, ESTABLISHED, CLOSE_WAIT) whose transitions
    /// are dropped for a connect to a loopback or unset address (`LOOPBACK_CONNECTS`), but a
    /// failed connect (SYN_SENT to CLOSE). The agent follows a connect only to a container's
    /// address, which is never loopback; 0: none dropped.
    pub loopback_old: u32,
}

impl Fields {
    pub const ABSENT: Self = Self {
        skaddr: NO_FIELD,
        oldstate: NO_FIELD,
        newstate: NO_FIELD,
        protocol: NO_FIELD,
        addr: AddrFields::ABSENT,
        emit_old: u32::MAX,
        counters_old: u32::MAX,
        backlog_new: u32::MAX,
        listener_closed_new: u32::MAX,
        task_new: u32::MAX,
        connect_new: 0,
        close_state: -2,
        last_ack_state: -2,
        fin_wait1_state: -2,
        syn_recv_state: -2,
        established_state: -2,
        loopback_old: 0,
    };
}

pod!(Event, Fields, Held, HoldEntry);

// The layout is a contract with the kernel side (see the crate root).
const _: () = assert!(core::mem::size_of::<Event>() == 200);
