//! The stop state machine: one record per container stop, from the first stop signal (or the
//! exit of a crash) to the cgroup's removal, with the connection loss attributed to it.

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
};

use serde::Serialize;

use super::{
    ContainerIdentity, ExitInfo, Mono, Observation, SECOND, Sender,
    retries::{Cut, Matcher, Verdict},
};

pub const SIGINT: i32 = 2;
pub const SIGQUIT: i32 = 3;
pub const SIGKILL: i32 = 9;
pub const SIGTERM: i32 = 15;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Crashed,
    KilledAtDeadline,
    ExitAtOnce,
    ListenerClosedEarly,
    Drained,
}

impl Outcome {
    pub const ALL: [Outcome; 5] = [
        Outcome::Crashed,
        Outcome::KilledAtDeadline,
        Outcome::ExitAtOnce,
        Outcome::ListenerClosedEarly,
        Outcome::Drained,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Crashed => "crashed",
            Outcome::KilledAtDeadline => "killed_at_deadline",
            Outcome::ExitAtOnce => "exit_at_once",
            Outcome::ListenerClosedEarly => "listener_closed_early",
            Outcome::Drained => "drained",
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Loss {
    pub inflight_cut: u64,
    pub idle_closed: u64,
    /// RSTs sent, by kernel reason.
    pub resets_sent: BTreeMap<String, u64>,
    pub refused: u64,
    pub unreachable: u64,
    pub accepted_after_sigterm: u64,
    /// Cut requests a proxy re-sent to another backend (done twice, invisible to the client).
    pub retry_duplicates: u64,
    /// Cut requests no proxy re-sent (the client saw an error).
    pub upstream_aborts: u64,
}

impl Loss {
    pub fn add(&mut self, other: &Loss) {
        self.inflight_cut += other.inflight_cut;
        self.idle_closed += other.idle_closed;
        for (r, n) in &other.resets_sent {
            *self.resets_sent.entry(r.clone()).or_default() += n;
        }
        self.refused += other.refused;
        self.unreachable += other.unreachable;
        self.accepted_after_sigterm += other.accepted_after_sigterm;
        self.retry_duplicates += other.retry_duplicates;
        self.upstream_aborts += other.upstream_aborts;
    }
}

/// Most loss events a stop keeps for its timeline; the counts in [`Loss`] stay exact beyond it.
pub const MAX_LOSS_EVENTS: usize = 500;

/// One counted loss (or connection routed to a stopping container), when it happened: what the
/// deploy page draws on a stop's timeline and the verdict reads evidence from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LossEvent {
    pub at: Mono,
    /// A [`Loss`] field name: `inflight_cut`, `refused`, `unreachable`,
    /// `accepted_after_sigterm`, `retry_duplicates` or `upstream_aborts` (at the cut's time).
    pub kind: &'static str,
    /// For a cut: how long the connection had been open, when its handshake was seen. With one
    /// request per connection that is how long the request had been running.
    pub open_for: Option<Mono>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerTimeline {
    pub address: SocketAddr,
    pub closed_at: Option<Mono>,
}

/// One container stop. Times are kernel monotonic; the export layer renders them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stop {
    pub id: String,
    pub container: ContainerIdentity,
    /// The first stop signal: SIGTERM, or SIGINT/SIGQUIT for images that stop with those.
    pub sigterm_at: Option<Mono>,
    pub stop_signal: Option<i32>,
    pub sigterm_sender: Option<Sender>,
    pub sigkill_at: Option<Mono>,
    pub exit_at: Option<Mono>,
    pub exit: Option<ExitInfo>,
    pub cgroup_removed_at: Option<Mono>,
    pub listeners: Vec<ListenerTimeline>,
    pub last_accept_at: Option<Mono>,
    pub connections_at_sigterm: Option<u64>,
    pub connections_at_exit: Option<u64>,
    /// The pod's `terminationGracePeriodSeconds` (Kubernetes API); None when unknown.
    pub grace_configured_seconds: Option<i64>,
    /// Whether the container has a preStop hook (Kubernetes API); None when unknown.
    pub prestop: Option<bool>,
    pub loss: Loss,
    /// Loss as it happened, oldest first, at most [`MAX_LOSS_EVENTS`].
    pub events: Vec<LossEvent>,
    /// Loss events not kept beyond the cap (still counted in `loss`).
    pub events_dropped: u64,
    /// The last connection routed to it after the stop signal: accepted, refused or unreachable.
    pub last_routed_at: Option<Mono>,
    /// Set once the record will not change any more (see `Tracker::tick`).
    pub settled: bool,
}

impl Stop {
    /// SIGTERM → SIGKILL, as observed.
    pub fn grace_seconds(&self) -> Option<f64> {
        Some(secs(self.sigkill_at?.checked_sub(self.sigterm_at?)?))
    }

    /// SIGTERM → exit.
    pub fn drain_seconds(&self) -> Option<f64> {
        Some(secs(self.exit_at?.checked_sub(self.sigterm_at?)?))
    }

    /// SIGTERM → the last connection routed to it after that, accepted or refused or
    /// unreachable (how long routing kept sending).
    pub fn routing_lag_seconds(&self) -> Option<f64> {
        let term = self.sigterm_at?;
        let last = self.last_accept_at.max(self.last_routed_at)?;
        (last > term).then(|| secs(last - term))
    }

    /// `None` until the main process has exited.
    pub fn outcome(&self) -> Option<Outcome> {
        let exit = self.exit?;
        let stop_first = self
            .sigterm_at
            .is_some_and(|t| self.exit_at.is_none_or(|e| t <= e));
        let kill_first = self
            .sigkill_at
            .is_some_and(|t| self.exit_at.is_none_or(|e| t <= e));
        Some(if !stop_first && !kill_first {
            Outcome::Crashed
        } else if stop_first && kill_first {
            Outcome::KilledAtDeadline
        } else if kill_first
            || (exit.signal.is_some() && exit.signal == self.stop_signal)
            || self.loss.inflight_cut > 0
        {
            Outcome::ExitAtOnce
        } else if self.loss.refused > 0 {
            Outcome::ListenerClosedEarly
        } else {
            Outcome::Drained
        })
    }

    /// The moment the record started.
    pub fn started_at(&self) -> Mono {
        [self.sigterm_at, self.sigkill_at, self.exit_at]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(0)
    }
}

fn secs(ns: Mono) -> f64 {
    ns as f64 / SECOND as f64
}

/// What the tracker reports for metrics, as it happens.
#[derive(Debug, Clone, PartialEq)]
pub enum Emitted {
    /// Loss counted against a stop (`kind`: inflight_cut, refused, unreachable,
    /// accepted_after_sigterm, idle_closed, or `resets_sent` with a reason).
    Loss {
        container: ContainerIdentity,
        kind: &'static str,
        reason: Option<String>,
    },
    /// A stop began (its first signal, or the exit of a crash).
    StopBegan {
        container: ContainerIdentity,
        stop_id: String,
        at: Mono,
    },
    /// A stop will not change any more.
    Settled { stop: Box<Stop> },
    /// What a proxy did about a request the container cut, stop or not.
    Retry {
        container: ContainerIdentity,
        proxy: String,
        /// `None` for an abort; the latency the retry added for a duplicate.
        added_seconds: Option<f64>,
    },
}

#[derive(Debug, Clone)]
pub struct Config {
    /// How long a gone container's state is kept for late events.
    pub retention: Mono,
    /// How long after exit (and cgroup removal) a stop settles.
    pub settle: Mono,
    /// Most stop records kept.
    pub max_stops: usize,
    /// How soon after a cut a proxy's new connection counts as its retry.
    pub retry_window: Mono,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            retention: 300 * SECOND,
            settle: 10 * SECOND,
            max_stops: 1000,
            retry_window: SECOND,
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
    last_accept_at: Option<Mono>,
    /// Index into `Tracker::stops` of the stop in progress.
    stop: Option<usize>,
    gone_at: Option<Mono>,
    stops_seen: u32,
}

#[derive(Debug)]
pub struct Tracker {
    config: Config,
    retries: Matcher,
    containers: HashMap<String, ContainerState>,
    stops: Vec<Stop>,
    /// Stops dropped from the front of `stops` (keeps indices stable in meaning).
    dropped: usize,
    emitted: Vec<Emitted>,
    /// The newest event time fed so far: readers use it to know what has been processed.
    processed_until: Mono,
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
            config,
            containers: HashMap::new(),
            stops: Vec::new(),
            dropped: 0,
            emitted: Vec::new(),
            processed_until: 0,
        }
    }

    pub fn stops(&self) -> &[Stop] {
        &self.stops
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

    fn stop_mut(&mut self, key: &str) -> Option<&mut Stop> {
        let idx = self.containers.get(key)?.stop?;
        self.stops.get_mut(idx.checked_sub(self.dropped)?)
    }

    fn begin_stop(&mut self, key: &str, now: Mono) -> Option<usize> {
        let c = self.containers.get_mut(key)?;
        if let Some(i) = c.stop {
            return Some(i);
        }
        c.stops_seen += 1;
        let short: String = c.identity.id.chars().take(12).collect();
        let stop = Stop {
            id: format!("{short}-{}", c.stops_seen),
            container: c.identity.clone(),
            sigterm_at: None,
            stop_signal: None,
            sigterm_sender: None,
            sigkill_at: None,
            exit_at: None,
            exit: None,
            cgroup_removed_at: None,
            listeners: c.listeners.clone(),
            last_accept_at: c.last_accept_at,
            connections_at_sigterm: None,
            connections_at_exit: None,
            grace_configured_seconds: c.identity.stop_policy.grace_configured_seconds,
            prestop: c.identity.stop_policy.prestop,
            loss: Loss::default(),
            events: Vec::new(),
            events_dropped: 0,
            last_routed_at: None,
            settled: false,
        };
        let idx = self.dropped + self.stops.len();
        self.emitted.push(Emitted::StopBegan {
            container: stop.container.clone(),
            stop_id: stop.id.clone(),
            at: now,
        });
        self.stops.push(stop);
        c.stop = Some(idx);
        Some(idx)
    }

    /// Counts one loss of `kind` that happened `at` against the container's stop in progress.
    fn count(
        &mut self,
        key: &str,
        kind: &'static str,
        reason: Option<String>,
        at: Mono,
        open_for: Option<Mono>,
    ) {
        let Some(stop) = self.stop_mut(key) else {
            return;
        };
        if stop.settled {
            return;
        }
        if matches!(kind, "accepted_after_sigterm" | "refused" | "unreachable") {
            stop.last_routed_at = stop.last_routed_at.max(Some(at));
        }
        if kind != "idle_closed" && kind != "resets_sent" {
            if stop.events.len() < MAX_LOSS_EVENTS {
                stop.events.push(LossEvent { at, kind, open_for });
            } else {
                stop.events_dropped += 1;
            }
        }
        let l = &mut stop.loss;
        match kind {
            "inflight_cut" => l.inflight_cut += 1,
            "idle_closed" => l.idle_closed += 1,
            "refused" => l.refused += 1,
            "unreachable" => l.unreachable += 1,
            "accepted_after_sigterm" => l.accepted_after_sigterm += 1,
            "retry_duplicates" => l.retry_duplicates += 1,
            "upstream_aborts" => l.upstream_aborts += 1,
            "resets_sent" => {
                *l.resets_sent
                    .entry(reason.clone().unwrap_or_default())
                    .or_default() += 1
            }
            _ => return,
        }
        let container = stop.container.clone();
        self.emitted.push(Emitted::Loss {
            container,
            kind,
            reason,
        });
    }

    /// Records that every event up to `at` has been fed.
    pub fn processed(&mut self, at: Mono) {
        self.processed_until = self.processed_until.max(at);
    }

    pub fn processed_until(&self) -> Mono {
        self.processed_until
    }

    /// Feeds one observation made at `now`.
    pub fn observe(&mut self, now: Mono, obs: Observation) {
        let key = obs.key().to_string();
        if let Observation::Container {
            identity,
            listeners,
            inbound,
        } = obs
        {
            // Announced again after its main process exited: restarted in place. The old
            // stop is over (settled now); the next stop signal starts a new record.
            let restarted = self
                .stop_mut(&key)
                .filter(|s| s.exit_at.is_some() && !s.settled);
            if let Some(s) = restarted {
                s.settled = true;
                let stop = Box::new(s.clone());
                self.emitted.push(Emitted::Settled { stop });
            }
            let c = self.containers.entry(key).or_default();
            if c.gone_at.is_some() {
                c.gone_at = None;
                c.stop = None;
                c.inbound.clear();
                c.listeners.retain(|l| l.closed_at.is_none());
            }
            c.identity = identity;
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
        if !self.containers.contains_key(&key) {
            // Attribution only names containers it announced; anything else is ignored.
            return;
        }
        match obs {
            Observation::Container { .. } => {}
            Observation::Identity { identity } => {
                if let Some(s) = self.stop_mut(&key).filter(|s| !s.settled) {
                    s.grace_configured_seconds = identity.stop_policy.grace_configured_seconds;
                    s.prestop = identity.stop_policy.prestop;
                    s.container = identity.clone();
                }
                if let Some(c) = self.containers.get_mut(&key) {
                    c.identity = identity;
                }
            }
            Observation::UpstreamOpened { key, sock, proxy } => {
                self.retries.opened(sock, proxy.tgid, key, now);
            }
            Observation::UpstreamClosed {
                sock, bytes_sent, ..
            } => self.retries.closed(sock, bytes_sent),
            Observation::UpstreamCut {
                key,
                proxy,
                request_bytes,
                upstream_opened_at,
            } => self.retries.cut(Cut {
                at: now,
                proxy,
                backend: key,
                request_bytes,
                upstream_opened_at,
            }),
            Observation::Signal { sig, sender, .. } => self.on_signal(now, &key, sig, sender),
            Observation::Exit { exit, .. } => self.on_exit(now, &key, exit),
            Observation::ListenerOpened { addr, .. } => {
                if let Some(c) = self.containers.get_mut(&key) {
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
                    if let Some(idx) = c.stop.and_then(|i| i.checked_sub(self.dropped))
                        && let Some(s) = self.stops.get_mut(idx)
                    {
                        s.listeners = c.listeners.clone();
                    }
                }
            }
            Observation::ListenerClosed { addr, .. } => {
                if let Some(c) = self.containers.get_mut(&key) {
                    if let Some(l) = c
                        .listeners
                        .iter_mut()
                        .rev()
                        .find(|l| l.address == addr && l.closed_at.is_none())
                    {
                        l.closed_at = Some(now);
                    }
                    if let Some(idx) = c.stop.and_then(|i| i.checked_sub(self.dropped))
                        && let Some(s) = self.stops.get_mut(idx)
                    {
                        s.listeners = c.listeners.clone();
                    }
                }
            }
            Observation::InboundEstablished { sock, .. } => {
                let Some(c) = self.containers.get_mut(&key) else {
                    return;
                };
                if c.inbound.contains_key(&sock) {
                    return; // duplicate
                }
                c.inbound.insert(sock, Opened(now));
                c.last_accept_at = Some(now);
                let after_sigterm = self
                    .stop_mut(&key)
                    .map(|s| {
                        s.last_accept_at = Some(now);
                        s.sigterm_at.is_some_and(|t| t <= now) && s.exit_at.is_none()
                    })
                    .unwrap_or(false);
                if after_sigterm {
                    self.count(&key, "accepted_after_sigterm", None, now, None);
                }
            }
            Observation::InboundClosed {
                sock,
                by_container,
                pending,
                ..
            } => {
                let Some(c) = self.containers.get_mut(&key) else {
                    return;
                };
                let Some(opened) = c.inbound.remove(&sock) else {
                    return; // unknown (duplicate)
                };
                if !by_container {
                    return; // closed by the peer
                }
                let open_for = opened.at().and_then(|o| now.checked_sub(o));
                if self.stop_mut(&key).is_some() {
                    self.count(
                        &key,
                        if pending {
                            "inflight_cut"
                        } else {
                            "idle_closed"
                        },
                        None,
                        now,
                        open_for,
                    );
                }
            }
            Observation::ResetSent { reason, .. } => {
                self.count(&key, "resets_sent", Some(reason), now, None)
            }
            Observation::Refused { .. } => self.count(&key, "refused", None, now, None),
            Observation::Unreachable { .. } => {
                let gone = self
                    .containers
                    .get(&key)
                    .is_some_and(|c| c.gone_at.is_some());
                if gone {
                    self.count(&key, "unreachable", None, now, None);
                }
            }
            Observation::CgroupRemoved { .. } => {
                if let Some(s) = self.stop_mut(&key)
                    && s.cgroup_removed_at.is_none()
                {
                    s.cgroup_removed_at = Some(now);
                }
                if let Some(c) = self.containers.get_mut(&key) {
                    c.gone_at.get_or_insert(now);
                }
            }
        }
    }

    fn open_inbound(&self, key: &str) -> u64 {
        self.containers
            .get(key)
            .map_or(0, |c| c.inbound.len() as u64)
    }

    fn on_signal(&mut self, now: Mono, key: &str, sig: i32, sender: Sender) {
        let stop_signal = matches!(sig, SIGTERM | SIGINT | SIGQUIT);
        if !stop_signal && sig != SIGKILL {
            return;
        }
        let exited = self.stop_mut(key).is_some_and(|s| s.exit_at.is_some());
        if exited {
            return; // signals to what is left of an exited container change nothing
        }
        if self.begin_stop(key, now).is_none() {
            return;
        }
        let inbound = self.open_inbound(key);
        let Some(s) = self.stop_mut(key) else { return };
        if stop_signal && s.sigterm_at.is_none() {
            s.sigterm_at = Some(now);
            s.stop_signal = Some(sig);
            s.sigterm_sender = Some(sender);
            s.connections_at_sigterm = Some(inbound);
        } else if sig == SIGKILL && s.sigkill_at.is_none() {
            s.sigkill_at = Some(now);
        }
    }

    fn on_exit(&mut self, now: Mono, key: &str, exit: ExitInfo) {
        if self.stop_mut(key).is_some_and(|s| s.exit_at.is_some()) {
            return; // duplicate
        }
        if self.begin_stop(key, now).is_none() {
            return;
        }
        let inbound = self.open_inbound(key);
        if let Some(c) = self.containers.get_mut(key) {
            c.gone_at.get_or_insert(now);
        }
        if let Some(s) = self.stop_mut(key) {
            s.exit_at = Some(now);
            s.exit = Some(exit);
            s.connections_at_exit = Some(inbound);
        }
    }

    /// Advances the clock: settles stops whose container is gone long enough, forgets
    /// containers past the retention window, bounds the number of records.
    pub fn tick(&mut self, now: Mono) {
        for d in self.retries.tick(now) {
            let key = d.cut.backend.clone();
            let (kind, added) = match d.verdict {
                Verdict::Duplicate { added_seconds, .. } => {
                    ("retry_duplicates", Some(added_seconds))
                }
                Verdict::Abort => ("upstream_aborts", None),
            };
            if let Some(c) = self.containers.get(&key) {
                self.emitted.push(Emitted::Retry {
                    container: c.identity.clone(),
                    proxy: d.cut.proxy.name.clone(),
                    added_seconds: added,
                });
            }
            // At the cut: where the request was lost, not where the retry window closed.
            self.count(&key, kind, None, d.cut.at, None);
        }
        let settle = self.config.settle;
        let mut settled = Vec::new();
        for c in self.containers.values_mut() {
            let Some(idx) = c.stop.and_then(|i| i.checked_sub(self.dropped)) else {
                continue;
            };
            let Some(s) = self.stops.get_mut(idx) else {
                continue;
            };
            let Some(exit_at) = s.exit_at else { continue };
            // Settle once the cgroup is gone (or long after exit) plus the settle delay; loss
            // seen after that (late unreachable attempts) is not attributed to this stop.
            let since = s.cgroup_removed_at.unwrap_or(exit_at + 3 * settle);
            if now >= since + settle && !s.settled {
                s.settled = true;
                settled.push(s.clone());
            }
        }
        for s in settled {
            self.emitted.push(Emitted::Settled { stop: Box::new(s) });
        }
        let retention = self.config.retention;
        let stops = &self.stops;
        let dropped = self.dropped;
        self.containers.retain(|_, c| {
            let Some(gone) = c.gone_at else { return true };
            let settled = c
                .stop
                .and_then(|i| i.checked_sub(dropped))
                .and_then(|i| stops.get(i))
                .is_none_or(|s| s.settled);
            !(settled && now >= gone + retention)
        });
        // After a stop settled and the container lives on (a restart in place), the next
        // signal starts a new record.
        for c in self.containers.values_mut() {
            if let Some(i) = c.stop
                && i.checked_sub(self.dropped)
                    .and_then(|i| self.stops.get(i))
                    .is_some_and(|s| s.settled)
                && c.gone_at.is_none()
            {
                c.stop = None;
            }
        }
        while self.stops.len() > self.config.max_stops {
            let oldest_open = self.stops.first().is_some_and(|s| !s.settled);
            if oldest_open {
                break;
            }
            self.stops.remove(0);
            self.dropped += 1;
        }
    }
}
