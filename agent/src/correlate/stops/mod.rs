//! The stop tracker: the state machine that builds one [`Stop`] record per container stop,
//! from the first stop signal (or the exit of a crash) to the cgroup's removal, and attributes
//! connection loss to it. Signals, exits and the clock (settling, retention, the record cap)
//! are in `lifecycle`.

mod attempts;
mod checkpoint;
mod held;
mod lifecycle;
#[cfg(test)]
mod proptests;
mod records;
mod sessions;
mod streams;

pub use attempts::{MAX_IN_FLIGHT, SynRetries};
pub use checkpoint::{RECENT_SETTLED, StopsCheckpoint};
pub use lifecycle::{NO_EXIT_AFTER_KILL, UNKNOWN_GRACE};
pub use sessions::{MAX_HELD as MAX_SESSIONS_WAITING, Return};

use super::{
    probes::{ProbeSource, Probes},
    retries::{Cut, Matcher},
};
use crate::model::{
    ContainerIdentity, Emitted, HashMap, HashSet, LossKind, Mono, Observation, ResetDirection,
    SECOND, UpstreamStep,
    stop::{ListenerTimeline, Stop},
};

/// The kernel's reasons (6.10+) for a RST answering a segment that reached a socket its
/// process had closed: the time-wait socket's, and the orphaned one's still in FIN_WAIT.
const CLOSED_SOCKET: [&str; 2] = ["TCP_TIMEWAIT_SOCKET", "TCP_ABORT_ON_DATA"];

#[derive(Debug, Clone)]
pub struct Config {
    /// How long a gone container's state is kept for late events.
    pub retention: Mono,
    /// How long after exit (and cgroup removal) a stop settles.
    pub settle: Mono,
    /// Most stop records kept.
    pub max_stops: usize,
    /// How long after a cut with no retry started it is decided an abort (the kernel judges
    /// the retry itself within a few ms; this covers the events' way here).
    pub retry_window: Mono,
    /// The kernel's SYN retries: how long a stop waits at most for an attempt to its
    /// vanished address (see `attempts`).
    pub syn: SynRetries,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            retention: 300 * SECOND,
            settle: 10 * SECOND,
            max_stops: 1000,
            retry_window: SECOND,
            syn: SynRetries::default(),
        }
    }
}

/// When an open inbound connection's handshake was seen: 8 bytes where `Option<Mono>` takes
/// 16, in an entry kept per open connection. `Mono::MAX`, a time no kernel clock reaches,
/// stands for a connection found by a scan (handshake unseen).
#[derive(Debug, Clone, Copy)]
struct Opened(Mono);

impl Opened {
    const SCANNED: Opened = Opened(Mono::MAX);

    fn at(self) -> Option<Mono> {
        (self.0 != Mono::MAX).then_some(self.0)
    }
}

#[derive(Debug, Default)]
struct ContainerState {
    identity: ContainerIdentity,
    listeners: Vec<ListenerTimeline>,
    /// Open inbound connections, with when their handshake was seen.
    inbound: HashMap<u64, Opened>,
    /// Those accepted after the stop signal on a check tick: a check or a request, decided at
    /// their close by their size.
    tick_accepts: HashSet<u64>,
    last_accept_at: Option<Mono>,
    /// The stop in progress (its sequence number in `Tracker::records`).
    stop: Option<usize>,
    /// The stop of its run before a restart in place, and when the restart was seen.
    previous_stop: Option<(usize, Mono)>,
    gone_at: Option<Mono>,
    /// When its run started, when that was while the agent ran (`Observation::Started`).
    started_at: Option<Mono>,
    stops_seen: u32,
    /// Its listeners' streams and their rotation.
    streams: streams::Streams,
}

#[derive(Debug)]
pub struct Tracker {
    config: Config,
    retries: Matcher,
    /// Which connections are health checks (their schedules forgotten with the backend).
    probes: Probes,
    /// Boxed: a `ContainerState` is about 600 bytes and a map of 1,000 has 2,048 slots.
    containers: HashMap<String, Box<ContainerState>>,
    records: records::Records,
    emitted: Vec<Emitted>,
    /// The newest event time fed so far: readers use it to know what has been processed.
    processed_until: Mono,
    /// Observations waiting until they can be judged (`held.rs`).
    held: held::Held,
    /// The agent's last restart gap (`resume`): a stop signal may have come in it unseen.
    gap: Option<crate::model::stop::AgentGap>,
    /// The key of the observation being applied, kept for its allocation (see `apply`).
    key: String,
    /// Closes at exit waiting for their client's return.
    sessions: sessions::Sessions,
    /// Connects in flight to stopped containers' addresses, which their stops wait for.
    in_flight: attempts::InFlight,
}

impl Default for Tracker {
    fn default() -> Self {
        Self::new(Config::default())
    }
}

impl Tracker {
    pub fn new(config: Config) -> Self {
        Self {
            retries: Matcher::new(config.retry_window),
            probes: Probes::default(),
            config,
            containers: HashMap::default(),
            records: records::Records::default(),
            emitted: Vec::new(),
            processed_until: 0,
            held: held::Held::default(),
            gap: None,
            key: String::new(),
            sessions: sessions::Sessions::default(),
            in_flight: attempts::InFlight::default(),
        }
    }

    pub fn stops(&self) -> &[Stop] {
        self.records.all()
    }

    pub fn max_stops(&self) -> usize {
        self.config.max_stops
    }

    /// Settled records evicted at the cap.
    pub fn stops_evicted(&self) -> u64 {
        self.records.evicted
    }

    /// Whether the attempt on `upstream` (a failed one) was a health check.
    pub fn is_probe(&mut self, upstream: Option<u64>) -> bool {
        self.probes.classify(upstream, None).is_some()
    }

    /// The learned check schedules of the container `key` (see `probes`).
    pub fn check_schedules(&self, key: &str) -> Vec<super::probes::Schedule> {
        self.probes.schedules_of(key)
    }

    /// Takes what happened since the last call, for metrics.
    pub fn take_emitted(&mut self) -> Vec<Emitted> {
        std::mem::take(&mut self.emitted)
    }

    pub fn identity(&self, key: &str) -> Option<&ContainerIdentity> {
        self.containers.get(key).map(|c| &c.identity)
    }

    /// Whether the tracker knows this container (alive, or gone within the retention window).
    pub fn knows(&self, key: &str) -> bool {
        self.containers.contains_key(key)
    }

    /// The container's stop in progress; a settled record never changes, so none then.
    /// Containers with a stop in progress.
    pub fn stopping(&self) -> impl Iterator<Item = &str> {
        self.containers
            .iter()
            .filter(|(_, c)| {
                c.stop
                    .and_then(|seq| self.records.get(seq))
                    .is_some_and(|s| !s.settled)
            })
            .map(|(k, _)| k.as_str())
    }

    fn stop_mut(&mut self, key: &str) -> Option<&mut Stop> {
        let seq = self.containers.get(key)?.stop?;
        self.records.get_mut(seq).filter(|s| !s.settled)
    }

    /// Counts one loss of `kind` that happened `at` against the container's stop in progress.
    fn count(
        &mut self,
        key: &str,
        kind: LossKind,
        reason: Option<String>,
        at: Mono,
        open_for: Option<Mono>,
    ) {
        self.count_aged(key, kind, reason, at, open_for, None);
    }

    /// As `count`, with the age of the request a cut caught (see `LossEvent::request_for`).
    fn count_aged(
        &mut self,
        key: &str,
        kind: LossKind,
        reason: Option<String>,
        at: Mono,
        open_for: Option<Mono>,
        request_for: Option<Mono>,
    ) {
        let Some(stop) = self.stop_mut(key).filter(|s| !s.settled) else {
            return;
        };
        let e = held::record(stop, kind, reason, at, open_for, request_for);
        self.emitted.push(e);
    }

    /// Applies one observation made at `now` (see `observe`). Its container's key is copied
    /// out first (the observation is taken apart below) into a buffer kept for its
    /// allocation: a copy of its own for each observation was most of the allocations on the
    /// hot path.
    fn apply(&mut self, now: Mono, obs: Observation) {
        let mut key = std::mem::take(&mut self.key);
        key.clear();
        key.push_str(obs.key());
        self.apply_to(now, obs, &key);
        self.key = key;
    }

    fn apply_to(&mut self, now: Mono, obs: Observation, key: &str) {
        if let Observation::Container {
            identity,
            listeners,
            inbound,
        } = obs
        {
            // Announced again after its main process exited: restarted in place. The old
            // stop is over (settled now); the next stop signal starts a new record.
            let gone = self
                .containers
                .get(key)
                .is_some_and(|c| c.gone_at.is_some());
            let restarted = self
                .stop_mut(key)
                .filter(|s| (s.exit_at.is_some() || gone) && !s.settled);
            if let Some(s) = restarted {
                // Its address is the new run's now: attempts to it meet that run.
                s.attempts_in_flight = 0;
                s.complete = s.exit_at.is_some()
                    && s.events_lost == 0
                    && s.ebpf_faults == 0
                    && s.agent_gap.is_none();
                s.settled = true;
                let stop = Box::new(s.clone());
                self.emitted.push(Emitted::Settled { stop });
            }
            let c = self.containers.entry(key.to_owned()).or_default();
            c.previous_stop = c.stop.map(|i| (i, now)).or(c.previous_stop);
            if c.gone_at.is_some() {
                c.gone_at = None;
                c.stop = None;
                c.inbound.clear();
                c.tick_accepts.clear();
                c.listeners.retain(|l| l.closed_at.is_none());
            }
            c.identity = *identity;
            for addr in listeners {
                if !c
                    .listeners
                    .iter()
                    .any(|l| l.address == addr && l.closed_at.is_none())
                {
                    c.listeners.push(ListenerTimeline {
                        address: addr,
                        closed_at: None,
                    });
                }
            }
            for sock in inbound {
                c.inbound.entry(sock).or_insert(Opened::SCANNED);
            }
            return;
        }
        if let Observation::RefusedAt {
            container,
            upstream,
            peer,
            at,
            ..
        } = &obs
        {
            // Counted for whoever attribution named: a pod as a whole too, which is never
            // announced (a refusal at a port no container of the pod holds).
            self.refused_elsewhere(container, *upstream);
            // A client coming back to a replacement that did not listen yet: its first
            // attempt (a probe is none).
            if self.probes.peek(*upstream).is_none() && !self.sessions_idle() {
                self.returned_to(&container.workload_key(), *peer, *at);
            }
            return;
        }
        if !self.containers.contains_key(key) {
            // Attribution only names containers it announced; anything else is ignored.
            return;
        }
        match obs {
            Observation::Container { .. } => {}
            Observation::Started { at, .. } => {
                if let Some(c) = self.containers.get_mut(key) {
                    c.started_at = Some(at);
                }
            }
            Observation::Identity { identity } => {
                if let Some(s) = self.stop_mut(key).filter(|s| !s.settled) {
                    s.grace_configured_seconds = identity.stop_policy.grace_configured_seconds;
                    s.prestop = identity.stop_policy.prestop;
                    s.container = (*identity).clone();
                }
                if let Some(c) = self.containers.get_mut(key) {
                    c.identity = *identity;
                }
            }
            Observation::UpstreamPeerClosed { key, sock, unread } => {
                self.retries
                    .peer_closed(sock, String::clone(&key), now, unread);
            }
            Observation::UpstreamOpened { key, sock, proxy } => {
                self.probes.opened(sock, &proxy, &key, now);
            }
            Observation::UpstreamClosed {
                sock, bytes_sent, ..
            } => self.probes.closed(sock, bytes_sent),
            // A health check is not re-sent by a proxy: nothing to judge. A cut of zero bytes
            // (a reset failed the first send) has no size: time alone tells it.
            Observation::UpstreamRequest {
                sock,
                step: UpstreamStep::Cut { bytes, .. },
                ..
            } if self
                .probes
                .classify(Some(sock), (bytes != 0).then_some(bytes))
                .is_some() => {}
            Observation::UpstreamRequest {
                key,
                sock,
                proxy,
                tid,
                step,
            } => match step {
                UpstreamStep::Cut { bytes, started_at } => self.retries.cut(Cut {
                    at: now,
                    proxy,
                    tid,
                    backend: String::clone(&key),
                    sock,
                    bytes,
                    started_at,
                }),
                UpstreamStep::RetryStarted {
                    cut_sock,
                    started_at,
                    ..
                } => self
                    .retries
                    .retry_started(cut_sock, tid, String::clone(&key), started_at),
                UpstreamStep::RetryEnded { cut_sock, bytes } => {
                    if let Some(d) = self.retries.retry_ended(cut_sock, tid, bytes) {
                        self.decided(d);
                    }
                }
            },
            Observation::Signal {
                sig,
                sender,
                ignored,
                ..
            } => self.on_signal(now, key, sig, sender, ignored),
            Observation::Exit { exit, .. } => self.on_exit(now, key, exit),
            Observation::ListenerOpened { addr, .. } => {
                if let Some(c) = self.containers.get_mut(key) {
                    if c.listeners
                        .iter()
                        .any(|l| l.address == addr && l.closed_at.is_none())
                    {
                        return; // already known from a scan
                    }
                    c.listeners.push(ListenerTimeline {
                        address: addr,
                        closed_at: None,
                    });
                    if let Some(s) = c.stop.and_then(|seq| self.records.get_mut(seq)) {
                        s.listeners = c.listeners.clone();
                    }
                }
            }
            Observation::ListenerClosed { addr, .. } => {
                if let Some(c) = self.containers.get_mut(key) {
                    if let Some(l) = c
                        .listeners
                        .iter_mut()
                        .rev()
                        .find(|l| l.address == addr && l.closed_at.is_none())
                    {
                        l.closed_at = Some(now);
                    }
                    if let Some(s) = c.stop.and_then(|seq| self.records.get_mut(seq)) {
                        s.listeners = c.listeners.clone();
                    }
                }
            }
            Observation::InboundEstablished {
                sock,
                upstream,
                peer,
                ..
            } => {
                let Some(c) = self.containers.get_mut(key) else {
                    return;
                };
                // A scan may have found it first (its handshake came between the programs'
                // attach and the scan, or while the event waited in the queue): the
                // handshake is the accept all the same.
                if c.inbound.get(&sock).is_some_and(|o| o.at().is_some()) {
                    return; // duplicate
                }
                // Counted already if a scan found it.
                let counted = c.inbound.insert(sock, Opened(now)).is_some();
                c.last_accept_at = c.last_accept_at.max(Some(now));
                let mut after_sigterm = false;
                if let Some(s) = self.stop_mut(key) {
                    let before = |t: Option<Mono>| t.is_some_and(|t| now < t);
                    // By time, not by what was seen: an arrival may come late (below).
                    after_sigterm =
                        s.sigterm_at.is_some_and(|t| t <= now) && s.exit_at.is_none_or(|e| now < e);
                    // An arrival from before the signal (or exit) that comes after it was held
                    // in the kernel (`--hold`) by a record made after it: the connection was
                    // open then, and the count taken at the signal missed it.
                    if before(s.sigterm_at) && !counted {
                        s.connections_at_sigterm = s.connections_at_sigterm.map(|n| n + 1);
                    }
                    if before(s.exit_at) && !counted {
                        s.connections_at_exit = s.connections_at_exit.map(|n| n + 1);
                    }
                }
                // A balancer still checking is not routing: probes move neither, nor are
                // they a client's return.
                if self.probes.peek(upstream).is_none() {
                    self.session_returned(key, peer, now);
                }
                if self.probes.peek(upstream).is_some() {
                    if after_sigterm && let Some(c) = self.containers.get_mut(key) {
                        c.tick_accepts.insert(sock);
                    }
                    return;
                }
                self.accepted(key, after_sigterm, now);
            }
            Observation::InboundClosed {
                sock,
                by_container,
                pending,
                upstream,
                request_bytes,
                port,
                activity,
                peer,
                ..
            } => {
                let Some(c) = self.containers.get_mut(key) else {
                    return;
                };
                let Some(opened) = c.inbound.remove(&sock) else {
                    return; // unknown (duplicate)
                };
                // An earlier connection at a reused address, come after the current one's
                // arrival: not the current one's close.
                if opened.at().is_some_and(|at| now < at) {
                    c.inbound.insert(sock, opened);
                    return;
                }
                if c.tick_accepts.remove(&sock)
                    && self
                        .probes
                        .classify(upstream, Some(request_bytes))
                        .is_none()
                {
                    self.accepted(key, true, opened.at().unwrap_or(now));
                }
                if !by_container {
                    return; // closed by the peer
                }
                let open_for = opened.at().and_then(|o| now.checked_sub(o));
                if !pending {
                    let close = streams::Close {
                        port,
                        activity,
                        age: open_for,
                        at_exit: self.exited_by(key, now),
                        in_stop: self.stop_mut(key).is_some(),
                    };
                    self.closed_unpending(key, now, close, peer);
                } else if self.stop_mut(key).is_some() {
                    let probe = self.probes.classify(upstream, Some(request_bytes));
                    let kind = self.probe_or(key, probe, LossKind::InflightCut, LossKind::ProbeCut);
                    // The request's own age, never the (keep-alive) connection's.
                    let request_for = activity.since_received();
                    self.count_aged(key, kind, None, now, open_for, request_for);
                    if kind == LossKind::InflightCut {
                        // Its client's return is a first connection of the storm.
                        self.hold_session(key, peer, now, open_for, Some(kind));
                    }
                }
            }
            // Every RST its namespace sent during the stop, on a followed connection or not
            // (time-wait and orphaned sockets, refusals, aborts): the record's count is the
            // namespace's own `TcpOutRsts`, as the per-container metric is.
            Observation::Reset {
                direction: ResetDirection::Sent,
                reason,
                answers_request,
                ..
            } => {
                // Data at a socket it had closed: a request written to a connection it closed
                // (a late FIN or ACK at the same socket is no request: payload only).
                if answers_request && CLOSED_SOCKET.contains(&reason.as_str()) {
                    self.count(key, LossKind::SentAfterClose, None, now, None);
                }
                self.count(key, LossKind::ResetsSent, Some(reason), now, None);
            }
            Observation::Reset { .. } | Observation::Listener { .. } => {}
            Observation::Refused {
                at, upstream, peer, ..
            } => {
                let probe = self.probes.classify(upstream, None);
                self.refusal(key, at, probe);
                // A client coming back, refused: its first attempt.
                if probe.is_none() {
                    self.session_returned(key, peer, at);
                }
            }
            Observation::RefusedAt { .. } => {}
            Observation::AttemptBegan { sock, at, .. } => self.attempt_began(key, sock, at),
            Observation::AttemptEnded { sock, .. } => self.attempt_ended(sock),
            Observation::Unreachable { at, upstream, .. } => {
                let gone = self
                    .containers
                    .get(key)
                    .is_some_and(|c| c.gone_at.is_some());
                // Sent after its stop was due: not its loss, though the record may still be
                // open, waiting for attempts begun before (`attempts`).
                let settle = self.config.settle;
                let late = self
                    .stop_mut(key)
                    .is_some_and(|s| at > lifecycle::due(s, settle));
                if gone && !late {
                    let probe = self.probes.classify(upstream, None);
                    let kind = self.probe_or(
                        key,
                        probe,
                        LossKind::Unreachable,
                        LossKind::ProbeUnreachable,
                    );
                    // At its SYN: when routing sent it here (the routing lag), not when the
                    // client gave up on it.
                    self.count(key, kind, None, at, None);
                }
            }
            // The Service had no endpoints: its pods stopping (or not ready yet).
            Observation::ServiceRejected { at, .. } => {
                self.count(key, LossKind::NoEndpoints, None, at, None);
            }
            Observation::CgroupRemoved { .. } => {
                if let Some(s) = self.stop_mut(key)
                    && s.cgroup_removed_at.is_none()
                    && !s.settled
                {
                    s.cgroup_removed_at = Some(now);
                }
                if let Some(c) = self.containers.get_mut(key) {
                    c.gone_at.get_or_insert(now);
                }
            }
            Observation::Vanished { .. } => {
                if let Some(c) = self.containers.get_mut(key) {
                    c.gone_at.get_or_insert(now);
                }
            }
        }
    }

    /// `probe` when the attempt was a probe (and, told apart by a schedule, counted as such
    /// on the stop), else `request`.
    fn probe_or(
        &mut self,
        key: &str,
        probe: Option<ProbeSource>,
        request: LossKind,
        probe_kind: LossKind,
    ) -> LossKind {
        match probe {
            None => request,
            Some(source) => {
                if source == ProbeSource::Schedule
                    && let Some(s) = self.stop_mut(key).filter(|s| !s.settled)
                {
                    s.loss.probes.by_schedule += 1;
                }
                probe_kind
            }
        }
    }

    /// A request accepted at `at` (a probe is not: it moves nothing).
    fn accepted(&mut self, key: &str, after_sigterm: bool, at: Mono) {
        // A settled record never changes (a container that lives on after its stop settled).
        if let Some(s) = self.stop_mut(key).filter(|s| !s.settled) {
            s.last_accept_at = s.last_accept_at.max(Some(at));
        }
        if after_sigterm {
            self.count(key, LossKind::AcceptedAfterSigterm, None, at, None);
        }
    }

    fn open_inbound(&self, key: &str) -> u64 {
        self.containers
            .get(key)
            .map_or(0, |c| c.inbound.len() as u64)
    }
}
