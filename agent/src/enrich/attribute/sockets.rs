//! Sockets: a container's inbound connections, followed by kernel socket address from the
//! handshake (or adopted by 4-tuple from a scan) to the close that says whether the container
//! cut a request; failed connects to a container's address.

use std::{collections::VecDeque, net::SocketAddr, sync::Arc};

use super::{Enricher, Key, MAX_INBOUND};
use crate::model::state::make_room;
use crate::{
    capture::{
        event::{Endpoints, StateChange},
        hooks::inet_sock_set_state::TcpCounters,
    },
    enrich::host::HostView,
    model::{
        ContainerIdentity, Fact, HashMap, HashSet, Mono, Observation, TcpState, activity::Activity,
    },
};

use TcpState::{Close, CloseWait, Established, Listen, SynRecv, SynSent};

/// A TCP socket the enricher follows: an inbound connection to a container's listener. One
/// per open connection, so kept small (24 bytes; 32 with its map key): 100,000 connections
/// take 4 MiB here.
#[derive(Debug, Clone)]
pub(super) struct Tracked {
    pub(super) key: Key,
    /// While accept() has not taken it: when its handshake completed.
    pub(super) queued_at: Mono,
    /// While accept() has not taken it: the listener's port; 0 otherwise (no listener has
    /// port 0), which is how `queued()` tells.
    pub(super) queued_port: u16,
    /// The peer closed (FIN) or reset first: whatever the container does next is no cut.
    pub(super) peer_done: bool,
}

// Guards the size the comment above promises.
const _: () = assert!(size_of::<Tracked>() <= 24);

impl Tracked {
    pub(super) fn new(key: Key, queued: Option<(Mono, u16)>) -> Self {
        let (queued_at, queued_port) = queued.unwrap_or_default();
        Self {
            key,
            queued_at,
            queued_port,
            peer_done: false,
        }
    }

    /// When its handshake completed and the listener port, until accept() takes it.
    pub(super) fn queued(&self) -> Option<(Mono, u16)> {
        (self.queued_port != 0).then_some((self.queued_at, self.queued_port))
    }

    pub(super) fn take_queued(&mut self) -> Option<(Mono, u16)> {
        let q = self.queued();
        self.queued_port = 0;
        q
    }
}

/// The connections the enricher follows, by kernel socket address.
#[derive(Debug, Default)]
pub(super) struct Sockets {
    pub(super) tracked: HashMap<u64, Tracked>,
    /// Kernel address → the id a scan gave the same connection before its first event.
    pub(super) adopted: HashMap<u64, u64>,
    /// Connect attempts answered with RST: refused (counted from the RST), not unreachable.
    pub(super) refused_attempts: HashSet<u64>,
    /// Connections closed recently, for a RST the kernel sends after the state change.
    pub(super) recent: HashMap<u64, Key>,
    pub(super) recent_order: VecDeque<u64>,
}

impl Sockets {
    /// The id of an inbound connection a scan found (no kernel address yet): the 64-bit hash
    /// of (netns, local, remote), its key in `tracked` until its first event moves it to its
    /// kernel address. No second map from the 4-tuple: that took 80 bytes a connection
    /// (100,000 open when their containers were adopted: 10 MiB). A hash meets a kernel
    /// address or another connection's hash once in billions of node lifetimes.
    pub(super) fn seed_id(&self, ns: u32, local: SocketAddr, remote: SocketAddr) -> u64 {
        self.tracked.hasher().hash_one((ns, local, remote))
    }
}

impl<H: HostView> Enricher<H> {
    pub(super) const RECENT: usize = 8192;

    pub(super) fn on_state(&mut self, s: &StateChange, out: &mut Vec<Observation>) {
        let (old, new) = (s.old, s.new);
        let ns = s.meta.netns;
        let Some(conn) = s.conn else { return };
        self.jiffies.observe(s.meta.ts_ns, s.counters.now);
        if self.on_upstream(s, conn, out) {
            return;
        }
        if old == Some(Listen) || new == Some(Listen) {
            self.watch_generation += 1;
        }
        match (old, new) {
            (Some(Close), Some(Listen)) => self.listener_opened(s, conn, out),
            (Some(Listen), Some(Close)) => self.listener_closed(ns, conn, out),
            (Some(SynRecv), Some(Established)) => {
                if let Some((key, _)) = self.listeners.open.get(&(ns, conn.local.port())) {
                    let key = key.clone();
                    out.push(Observation::InboundEstablished {
                        key: key.to_string(),
                        sock: s.skaddr,
                        upstream: self.upstream_of(conn),
                    });
                    make_room(
                        &mut self.sockets.tracked,
                        MAX_INBOUND,
                        &s.skaddr,
                        &mut self.dropped.inbound,
                    );
                    self.sockets.tracked.insert(
                        s.skaddr,
                        Tracked::new(key.clone(), Some((s.meta.ts_ns, conn.local.port()))),
                    );
                    self.listener_fact(&key, conn.local.port(), Fact::Arrival, out);
                }
            }
            (Some(SynSent), Some(Close)) => {
                // An attempt that never connected and was not refused: to a gone container's
                // address, unreachable.
                // A followed proxy's (or prober's) attempt, if this one was.
                let upstream = self
                    .upstreams
                    .failed_attempt
                    .take()
                    .filter(|a| *a == s.skaddr);
                if self.sockets.refused_attempts.remove(&s.skaddr) {
                    self.refusals.attempt_refused(conn.local, upstream, out);
                    return;
                }
                if let Some(key) = self.by_ip.get(&conn.remote.ip()) {
                    out.push(Observation::Unreachable {
                        key: key.clone(),
                        upstream,
                    });
                }
            }
            (Some(Established), Some(CloseWait)) => {
                if let Some(t) = self.tracked(s.skaddr, ns, conn) {
                    t.peer_done = true;
                }
            }
            (Some(Established), _) | (Some(CloseWait), _) => {
                let Some(t) = self.tracked(s.skaddr, ns, conn).cloned() else {
                    return;
                };
                self.sockets.tracked.remove(&s.skaddr);
                self.remember_closed(s.skaddr, &t.key);
                let by_container = !t.peer_done && old == Some(Established);
                let pending = s.counters.request_pending();
                // What the container left unread says whether a request cut on this
                // connection ever ran (the proxy's side of the cut comes from its worker).
                if by_container
                    && let Some(up) = self.upstreams.by_tuple.get(&(conn.remote, conn.local))
                {
                    out.push(Observation::UpstreamPeerClosed {
                        key: t.key.to_string(),
                        sock: up.sock,
                        unread: s.counters.unread,
                    });
                }
                out.push(Observation::InboundClosed {
                    key: t.key.to_string(),
                    sock: self.sock_id(s.skaddr),
                    by_container,
                    pending,
                    upstream: self.upstream_of(conn),
                    request_bytes: s.counters.bytes_received,
                    port: conn.local.port(),
                    activity: self.activity(&s.counters),
                });
            }
            _ => {}
        }
    }

    /// How a closing connection's data stood, in monotonic time.
    fn activity(&self, c: &TcpCounters) -> Activity {
        let span = |j| self.jiffies.duration(j);
        let (quiet_for, sending_for) = c
            .quiet_and_sending()
            .map_or((None, None), |(q, s)| (span(q), span(s)));
        Activity {
            quiet_for,
            sending_for,
            segs_in: c.segs_in,
            segs_out: c.segs_out,
        }
    }

    /// The container of a followed (or just closed) connection, as its observations name it.
    pub(super) fn connection_owner(&self, skaddr: u64) -> Option<Arc<ContainerIdentity>> {
        self.socket_owner(skaddr)
            .and_then(|k| self.containers.get(k.as_str()))
            .map(|c| Arc::clone(&c.identity))
    }

    fn remember_closed(&mut self, skaddr: u64, key: &Key) {
        if self.sockets.recent.insert(skaddr, key.clone()).is_none() {
            self.sockets.recent_order.push_back(skaddr);
        }
        while self.sockets.recent_order.len() > Self::RECENT {
            if let Some(old) = self.sockets.recent_order.pop_front() {
                self.sockets.recent.remove(&old);
            }
        }
    }

    /// The container of a followed (or just closed) connection.
    fn socket_owner(&self, skaddr: u64) -> Option<Key> {
        self.sockets
            .tracked
            .get(&skaddr)
            .map(|t| t.key.clone())
            .or_else(|| self.sockets.recent.get(&skaddr).cloned())
    }

    /// The id the tracker knows a connection by.
    fn sock_id(&mut self, skaddr: u64) -> u64 {
        self.sockets.adopted.remove(&skaddr).unwrap_or(skaddr)
    }

    /// A followed socket by kernel address, adopting one a scan found by its 4-tuple.
    pub(super) fn tracked(
        &mut self,
        skaddr: u64,
        ns: u32,
        conn: Endpoints,
    ) -> Option<&mut Tracked> {
        if !self.sockets.tracked.contains_key(&skaddr) {
            let id = self.sockets.seed_id(ns, conn.local, conn.remote);
            if let Some(t) = self.sockets.tracked.remove(&id) {
                self.sockets.tracked.insert(skaddr, t);
                self.sockets.adopted.insert(skaddr, id);
            }
        }
        self.sockets.tracked.get_mut(&skaddr)
    }
}
