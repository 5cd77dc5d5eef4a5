//! What the enricher established about containers, the only input the correlator has.

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use super::{
    ContainerIdentity, ExitInfo, Mono, Netns, Proxy, ResetDirection, Sender, activity::Activity,
    stop::IgnoredSignal,
};

/// A container's id as observations carry it: shared, so that an observation made per
/// connection event costs no allocation of its own. `Arc<String>` rather than `Arc<str>`: a
/// thin pointer, 8 bytes less in every connection's entry that keeps one.
pub type ContainerKey = Arc<String>;

/// A namespace's `TcpExt: ListenOverflows ListenDrops`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListenCounters {
    pub overflows: u64,
    pub drops: u64,
}

/// What an event says about one of a container's listeners.
#[derive(Debug, Clone, PartialEq)]
pub enum Fact {
    /// A connection completed its handshake.
    Arrival,
    /// accept() took a connection that had waited this many seconds.
    AcceptWait(f64),
    /// A completed handshake was dropped: the accept queue was full.
    Overflow,
    /// The server answered on a connection it accepted at `accepted_at` (a storming
    /// namespace's, `capture::hooks::sock_length::IoStep::Answered`): its `index`-th exchange,
    /// answering the client's data at `data_at`, at the observation's time. `sock` tells
    /// connections apart.
    Answered {
        sock: u64,
        accepted_at: Mono,
        data_at: Mono,
        index: u32,
    },
}

/// One sample of the listen path (`Enricher::sample_listen_path`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListenSample {
    /// (container, port, accept-queue depth, its limit) of each sampled listener. The limit is
    /// known for listeners opened while the agent ran (procfs does not show it).
    pub queues: Vec<(ContainerIdentity, u16, u32, Option<u32>)>,
    /// Each sampled network namespace's counters, under the container that owns it.
    pub netns: Vec<(ContainerIdentity, ListenCounters)>,
    /// Whether every running container was sampled (listeners missing from it are gone).
    pub complete: bool,
}

/// A step of a request on a proxy's upstream connection, as the kernel saw it
/// (`capture::hooks::sock_length`). Sizes are per request: bytes sent since the last response
/// byte, so pooled keep-alive connections count each request apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamStep {
    /// The worker read EOF or a connection error with a request of `bytes`, started at
    /// `started_at`, unanswered.
    Cut { bytes: u64, started_at: Mono },
    /// The worker's next upstream action after the cut on `cut_sock` (at `cut_at`) started a
    /// request on this connection: the retry, if it is the same request.
    RetryStarted {
        cut_sock: u64,
        cut_at: Mono,
        started_at: Mono,
    },
    /// That request was sent whole: `bytes`.
    RetryEnded { cut_sock: u64, bytes: u64 },
}

/// Something the attribution stage established about one container. `key` is the container id.
#[derive(Debug, Clone, PartialEq)]
pub enum Observation {
    /// The container exists (scan or first event). `listeners` and `inbound` seed state when
    /// the agent starts while the container runs.
    Container {
        identity: Box<ContainerIdentity>,
        listeners: Vec<SocketAddr>,
        inbound: Vec<u64>,
    },
    /// It started while the agent ran: a new container, or one restarted in place
    /// (`restart`). `at`: when its PID 1 started; `netns`: its network namespace's inode;
    /// `fresh_netns`: the namespace was made for it (no other container but a pod's sandbox
    /// in it), so its listen counters started at 0.
    Started {
        identity: Arc<ContainerIdentity>,
        at: Mono,
        netns: Option<u32>,
        restart: bool,
        fresh_netns: bool,
    },
    /// A stop signal from outside the container.
    Signal {
        key: ContainerKey,
        sig: i32,
        sender: Sender,
        /// The kernel dropped it (`signal_generate`'s result), and why.
        ignored: Option<IgnoredSignal>,
    },
    /// The container's main process exited.
    Exit {
        key: ContainerKey,
        exit: ExitInfo,
    },
    /// Its process listened at `addr`, in namespace `netns` (the listener's own record: its
    /// cookie where the kernel has one).
    ListenerOpened {
        key: ContainerKey,
        addr: SocketAddr,
        netns: Netns,
    },
    ListenerClosed {
        key: ContainerKey,
        addr: SocketAddr,
    },
    /// A connection to one of its listeners completed its handshake. `upstream`: the
    /// connecting socket, when a proxy or prober on this node opened it (see `UpstreamOpened`).
    InboundEstablished {
        key: ContainerKey,
        sock: u64,
        upstream: Option<u64>,
        /// The client's address.
        peer: IpAddr,
    },
    /// An inbound connection ended. `by_container`: the container closed or reset it (not the
    /// peer); `pending`: a request was waiting for an answer; `request_bytes`: what it had
    /// received on the connection; `port`: the listener's; `activity`: how its data stood
    /// (a live stream's or an idle connection's).
    InboundClosed {
        key: ContainerKey,
        sock: u64,
        by_container: bool,
        pending: bool,
        upstream: Option<u64>,
        request_bytes: u64,
        port: u16,
        activity: Activity,
        /// The client's address.
        peer: IpAddr,
    },
    /// A RST its network namespace sent (with the kernel's reason) or one of its sockets
    /// received (reason "none": the kernel gives none). `on_connection`: on a connection the
    /// agent follows (what a stop counts); else the namespace's own, attributed by port (see
    /// `enrich::attribute::resets`), and `container` may be the pod as a whole (name "").
    /// `answers_request`: a sent RST answering a segment that carried data (never a bare FIN,
    /// ACK or SYN) to one of its listening ports (a client's request, not an upstream's
    /// answer on a connection it opened).
    Reset {
        container: Arc<ContainerIdentity>,
        direction: ResetDirection,
        reason: String,
        on_connection: bool,
        answers_request: bool,
    },
    /// A SYN to a listening address it had closed was answered with RST. `upstream`: the
    /// connecting socket, when the attempt was seen from its side too (a process on this
    /// node). `at`: the attempt's SYN when its socket was seen (CLOSE → SYN_SENT), else the
    /// RST (microseconds after the SYN it answers, later only after SYN retransmits).
    /// `peer`: the attempt's source address (a client coming back).
    Refused {
        key: ContainerKey,
        at: Mono,
        upstream: Option<u64>,
        peer: IpAddr,
    },
    /// A SYN to `port` of namespace `netns`, where it never listened (or listens, at another
    /// address, or listened in an earlier run), answered with RST at `at`: a refused connect,
    /// counted, no stop's loss, and a start's when it listens there next. `container` may be
    /// the pod as a whole (name ""). `upstream` as for `Refused`.
    RefusedAt {
        container: Arc<ContainerIdentity>,
        netns: Netns,
        port: u16,
        at: Mono,
        upstream: Option<u64>,
        peer: IpAddr,
    },
    /// A connection attempt from this node to an address it held, after it was gone;
    /// `upstream` the attempt's socket. `at`: its SYN (the socket's CLOSE → SYN_SENT), not
    /// when the client gave up on it (a connect timeout, or ARP's failure seconds later).
    Unreachable {
        key: ContainerKey,
        at: Mono,
        upstream: Option<u64>,
    },
    /// A connect from this node to a Service's virtual IP that its kube-proxy rejected (no
    /// endpoints), on the container that had served the Service's connections. `at`: its SYN.
    ServiceRejected {
        key: ContainerKey,
        at: Mono,
    },
    /// A connect from this node (`sock`, its kernel address) sent its SYN at `at` to the
    /// address of a container whose run had ended: its outcome (unreachable, mostly, when the
    /// kernel gives up on it, seconds later) is still to come, and the container's stop waits
    /// for it before it settles.
    AttemptBegan {
        key: ContainerKey,
        sock: u64,
        at: Mono,
    },
    /// That attempt's socket took its next step (failed, refused or connected): whatever it
    /// counts for came with it.
    AttemptEnded {
        key: ContainerKey,
        sock: u64,
    },
    CgroupRemoved {
        key: ContainerKey,
    },
    /// No process of it was found for a while, and its cgroup's removal was never seen (the
    /// event lost, or its path cut): gone, for everything that waits on that.
    Vanished {
        key: ContainerKey,
    },
    /// What is known about who the container is changed (the Kubernetes API learned its
    /// pod after it was adopted with the runtime's names, or its pod spec changed).
    Identity {
        identity: Box<ContainerIdentity>,
    },
    /// What happened on one of its listeners (arrivals, accept waits, overflows).
    Listener {
        container: Arc<ContainerIdentity>,
        port: u16,
        fact: Fact,
    },
    /// A proxy (or prober) on this node opened a connection to the container (`key`).
    UpstreamOpened {
        key: ContainerKey,
        sock: u64,
        proxy: Proxy,
    },
    /// That connection closed after the proxy sent `bytes_sent` bytes on it.
    UpstreamClosed {
        key: ContainerKey,
        sock: u64,
        bytes_sent: u64,
    },
    /// What a proxy's worker thread (`tid`) did on its connection `sock` to the container
    /// (`key`) around a cut (see `UpstreamStep`).
    UpstreamRequest {
        key: ContainerKey,
        sock: u64,
        proxy: Proxy,
        tid: u32,
        step: UpstreamStep,
    },
    /// The container closed (or reset) its end of the proxy's connection `sock` (the proxy's
    /// socket) with `unread` bytes it never read.
    UpstreamPeerClosed {
        key: ContainerKey,
        sock: u64,
        unread: u32,
    },
}

impl Observation {
    pub fn key(&self) -> &str {
        match self {
            Observation::Container { identity, .. } | Observation::Identity { identity } => {
                &identity.id
            }
            Observation::Reset { container, .. }
            | Observation::Listener { container, .. }
            | Observation::RefusedAt { container, .. }
            | Observation::Started {
                identity: container,
                ..
            } => &container.id,
            Observation::Signal { key, .. }
            | Observation::Exit { key, .. }
            | Observation::ListenerOpened { key, .. }
            | Observation::ListenerClosed { key, .. }
            | Observation::InboundEstablished { key, .. }
            | Observation::InboundClosed { key, .. }
            | Observation::Refused { key, .. }
            | Observation::Unreachable { key, .. }
            | Observation::ServiceRejected { key, .. }
            | Observation::AttemptBegan { key, .. }
            | Observation::AttemptEnded { key, .. }
            | Observation::CgroupRemoved { key }
            | Observation::Vanished { key }
            | Observation::UpstreamOpened { key, .. }
            | Observation::UpstreamClosed { key, .. }
            | Observation::UpstreamRequest { key, .. }
            | Observation::UpstreamPeerClosed { key, .. } => key,
        }
    }
}
