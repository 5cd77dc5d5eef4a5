//! Sockets: a container's inbound connections, followed by kernel socket address from the
//! handshake (or adopted by 4-tuple from a scan) to the close that says whether the container
//! cut a request; failed connects to a container's address.

use std::{collections::VecDeque, net::SocketAddr, sync::Arc};

use super::{Enricher, Key, MAX_CONNECTING, MAX_INBOUND};
use crate::model::state::make_room;
use crate::{
    capture::{
        event::{Endpoints, StateChange},
        hooks::inet_sock_set_state::TcpCounters,
    },
    enrich::{host::HostView, nat::Translation},
    model::{
        ContainerIdentity, Fact, HashMap, HashSet, Mono, Observation, TcpState, activity::Activity,
    },
};

use TcpState::{Close, CloseWait, Established, Listen, SynRecv, SynSent};

/// The longest a connect attempt is believed to have been in flight: past the kernel's SYN
/// retry time (127 s with the default `tcp_syn_retries` of 6), an entry is taken for one
/// whose socket's next step was lost.
const MAX_ATTEMPT: Mono = 300 * crate::model::SECOND;

/// A TCP socket the enricher follows: an inbound connection to a container's listener, by the
/// container it belongs to. One per open connection, so kept small (8 bytes; 16 with its map
/// key): 100,000 connections take 2 MiB here. What a connection is only for a moment (waiting
/// for accept(), its peer done) is in [`Sockets::passing`], as small as such moments are rare.
#[derive(Debug, Clone)]
pub(super) struct Tracked {
    pub(super) key: Key,
}

// Guards the size the comment above promises.
const _: () = assert!(size_of::<Tracked>() <= 8);

/// A followed connection's passing state.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Passing {
    /// While accept() has not taken it: when its handshake completed, and the listener's port.
    queued: Option<(Mono, u16)>,
    /// The peer closed (FIN) or reset first: whatever the container does next is no cut.
    peer_done: bool,
}

/// The connections the enricher follows, by kernel socket address.
#[derive(Debug, Default)]
pub(super) struct Sockets {
    pub(super) tracked: HashMap<u64, Tracked>,
    /// Followed connections waiting for accept() or whose peer is done, by the same key. An
    /// entry left by a connection no longer followed (evicted at the cap, its container
    /// expired) is never read: following an address again resets its entry.
    pub(super) passing: HashMap<u64, Passing>,
    /// Kernel address → the id a scan gave the same connection before its first event.
    pub(super) adopted: HashMap<u64, u64>,
    /// Connect attempts answered with RST: refused (counted from the RST), not unreachable.
    pub(super) refused_attempts: HashSet<u64>,
    /// Connects to containers' addresses in flight: when each sent its SYN (CLOSE →
    /// SYN_SENT), by kernel address, until its next step. A failed attempt is dated by it.
    pub(super) connecting: HashMap<u64, Mono>,
    /// Those of `connecting` sent to a container whose run had ended (`AttemptBegan`), until
    /// their next step (`AttemptEnded`): its stop waits for their outcome. Capped with
    /// `connecting`, evictions counted there.
    pub(super) to_ended: HashMap<u64, Key>,
    /// Connections closed recently, for a RST the kernel sends after the state change (by
    /// their time-wait or orphaned socket: the same four-tuple).
    pub(super) recent: HashMap<u64, (Key, Endpoints)>,
    pub(super) recent_order: VecDeque<u64>,
    /// The last `RECENT` arrivals' times by kernel address (`Tracked` stays 8 bytes): a late
    /// record of an earlier connection at a reused address is not the current one's.
    arrived: HashMap<u64, Mono>,
    arrived_order: VecDeque<(u64, Mono)>,
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

    /// Follows a connection from now on, with nothing of an earlier socket at its address.
    pub(super) fn follow(&mut self, id: u64, key: Key, queued: Option<(Mono, u16)>) {
        self.tracked.insert(id, Tracked { key });
        match queued {
            Some(q) => {
                let passing = Passing {
                    queued: Some(q),
                    peer_done: false,
                };
                self.passing.insert(id, passing);
            }
            None => {
                self.passing.remove(&id);
            }
        }
        // Entries of connections evicted at the cap are orphans: once they could outnumber
        // the connections followed, they go (so `passing` never outgrows `tracked` by more
        // than one, however long the node stays at the cap).
        if self.passing.len() > self.tracked.len() {
            let tracked = &self.tracked;
            self.passing.retain(|id, _| tracked.contains_key(id));
        }
    }

    /// Stops following a connection: its container, and whether its peer was done first.
    pub(super) fn unfollow(&mut self, id: u64) -> Option<(Key, bool)> {
        let t = self.tracked.remove(&id)?;
        let passing = self.passing.remove(&id).unwrap_or_default();
        Some((t.key, passing.peer_done))
    }

    /// A followed connection's peer closed or reset it.
    pub(super) fn set_peer_done(&mut self, id: u64) {
        if self.tracked.contains_key(&id) {
            self.passing.entry(id).or_default().peer_done = true;
        }
    }

    /// The accept() of a followed connection: its container, when its handshake completed and
    /// the listener's port, once.
    pub(super) fn take_queued(&mut self, id: u64) -> Option<(Key, Mono, u16)> {
        let key = self.tracked.get(&id)?.key.clone();
        let passing = self.passing.get_mut(&id)?;
        let (at, port) = passing.queued.take()?;
        if !passing.peer_done {
            self.passing.remove(&id);
        }
        Some((key, at, port))
    }

    /// A connection a scan found (by `seed_id`) seen by kernel address at last.
    fn adopt(&mut self, seed: u64, skaddr: u64) -> bool {
        let Some(t) = self.tracked.remove(&seed) else {
            return false;
        };
        self.tracked.insert(skaddr, t);
        match self.passing.remove(&seed) {
            Some(p) => self.passing.insert(skaddr, p),
            None => self.passing.remove(&skaddr),
        };
        self.adopted.insert(skaddr, seed);
        true
    }

    /// Notes an arrival at `skaddr`, keeping the last `cap`.
    fn arrived(&mut self, skaddr: u64, at: Mono, cap: usize) {
        self.arrived.insert(skaddr, at);
        self.arrived_order.push_back((skaddr, at));
        if self.arrived_order.len() > cap
            && let Some((old, at)) = self.arrived_order.pop_front()
            && self.arrived.get(&old) == Some(&at)
        {
            self.arrived.remove(&old);
        }
    }

    /// Forgets the connections of expired containers.
    pub(super) fn retain(&mut self, keep: impl Fn(&Key) -> bool) {
        self.tracked.retain(|_, t| keep(&t.key));
        let tracked = &self.tracked;
        self.passing.retain(|id, _| tracked.contains_key(id));
    }
}

/// A connect that failed this soon after its SYN, with no RST and no tracked entry, was
/// rejected on this node (an ICMP answer takes microseconds; the first SYN retransmission is
/// 1 s away, and a client giving up on an unanswered SYN waits longer than this).
const REJECTED_WITHIN: Mono = 200_000_000;

impl<H: HostView> Enricher<H> {
    pub(super) const RECENT: usize = 8192;

    pub(super) fn on_state(&mut self, s: &StateChange, out: &mut Vec<Observation>) {
        let (old, new) = (s.old, s.new);
        let ns = s.meta.netns;
        let Some(conn) = s.conn else { return };
        self.jiffies.observe(s.meta.ts_ns, s.counters.now);
        let syn_at = self.connect_step(s, conn, out);
        if self.on_upstream(s, conn, out) {
            return;
        }
        if old == Some(Listen) || new == Some(Listen) {
            self.watch_generation += 1;
        }
        match (old, new) {
            (Some(Close), Some(Listen)) => self.listener_opened(s, conn, out),
            (Some(Listen), Some(Close)) => {
                self.listener_closed(s.meta.ns(), conn, s.meta.ts_ns, out)
            }
            (Some(SynRecv), Some(Established)) | (Some(Established), _) | (Some(CloseWait), _)
                if self.sockets.arrived.get(&s.skaddr) > Some(&s.meta.ts_ns) =>
            {
                // An earlier connection's, come after the arrival of the one now at its address.
                tracing::debug!(skaddr = s.skaddr, at = s.meta.ts_ns, "stale socket step");
            }
            (Some(SynRecv), Some(Established)) => {
                let Some(key) = self.arrival_owner(s.meta.ns(), conn.local.port(), s.meta.ts_ns)
                else {
                    return;
                };
                let queued = Some((s.meta.ts_ns, conn.local.port()));
                self.sockets.arrived(s.skaddr, s.meta.ts_ns, Self::RECENT);
                let seed = self.sockets.seed_id(ns, conn.local, conn.remote);
                let adopted = self.sockets.adopt(seed, s.skaddr);
                // A scan may have found it first (its arrival was held in the kernel, or
                // waited in the queue): the tracker knows it by the scan's id, and learns
                // of its handshake all the same (when it came; a client's return).
                out.push(Observation::InboundEstablished {
                    key: key.clone(),
                    sock: if adopted { seed } else { s.skaddr },
                    upstream: self.upstream_of(ns, conn),
                    peer: conn.remote.ip(),
                });
                if adopted {
                    self.sockets.passing.entry(s.skaddr).or_default().queued = queued;
                } else {
                    make_room(
                        &mut self.sockets.tracked,
                        MAX_INBOUND,
                        &s.skaddr,
                        &mut self.dropped.inbound,
                    );
                    // Bounded as the connections are; what it drops is of connections gone.
                    make_room(&mut self.sockets.passing, MAX_INBOUND, &s.skaddr, &mut 0);
                    self.sockets.follow(s.skaddr, key.clone(), queued);
                }
                self.listener_fact(&key, conn.local.port(), Fact::Arrival, out);
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
                // Its SYN as its socket kept it (tp_btf), else as the agent saw it go.
                let syn_at = s.failure.and_then(|f| f.syn_at).or(syn_at);
                if self.sockets.refused_attempts.remove(&s.skaddr) {
                    self.refusals
                        .attempt_refused(conn.local, upstream, syn_at, out);
                    return;
                }
                // The container that listened on the port it was sent to (a pod's containers
                // share the address), or, for an address nobody has, the one a Service's
                // DNAT sent it to. Dated at its SYN, else (its SYN unseen) now.
                let at = syn_at.unwrap_or(s.meta.ts_ns);
                if let Some(key) = self.backend_of(conn.remote) {
                    out.push(Observation::Unreachable { key, at, upstream });
                    return;
                }
                let refused = s.failure.is_some_and(|f| f.errno == libc::ECONNREFUSED);
                // Answered at once, with no RST seen: the kernel's ECONNREFUSED, or (its socket
                // closed by the client after reading the error, which clears it) failed within
                // REJECTED_WITHIN of its SYN. Untracked, only a filter's reject does that.
                let rejected = refused
                    || syn_at
                        .is_some_and(|syn| s.meta.ts_ns.saturating_sub(syn) <= REJECTED_WITHIN);
                // A container's RST that the socket was not seen to take (a host socket to a
                // Service's virtual IP is filtered in the kernel, and conntrack forgets an
                // entry whose only answer was a RST): the refusal waiting for this client.
                if rejected && self.refusals.waiting_for(conn.local) {
                    self.refusals
                        .attempt_refused(conn.local, upstream, syn_at, out);
                    return;
                }
                let found = self
                    .nat
                    .lookup(s.meta.ts_ns, conn.local, conn.remote, rejected);
                tracing::debug!(
                    from = %conn.local, to = %conn.remote, failure = ?s.failure, ?found,
                    "failed connect to an address no container has"
                );
                match found {
                    // A RST from the pod is its refusal, counted in its own namespace.
                    Translation::To(real) if !refused => {
                        if let Some(key) = self.backend_of(real) {
                            out.push(Observation::Unreachable { key, at, upstream });
                        }
                    }
                    // Counted once, on the pod that served most of the Service's tracked
                    // connections.
                    Translation::Rejected(pods) => {
                        if let Some(key) = pods.into_iter().find_map(|p| self.backend_of(p)) {
                            out.push(Observation::ServiceRejected { key, at });
                        }
                    }
                    Translation::To(_) | Translation::None => {}
                }
            }
            (Some(Established), Some(CloseWait)) => self.peer_done(s.skaddr, ns, conn),
            (Some(Established), _) | (Some(CloseWait), _) => {
                if !self.follows(s.skaddr, ns, conn) {
                    return;
                }
                let Some((key, peer_done)) = self.sockets.unfollow(s.skaddr) else {
                    return;
                };
                self.remember_closed(s.skaddr, &key, conn);
                let by_container = !peer_done && old == Some(Established);
                let pending = s.counters.request_pending();
                // What the container left unread says whether a request cut on this
                // connection ever ran (the proxy's side of the cut comes from its worker).
                if by_container
                    && let Some(up) = self.upstreams.by_tuple.get(&super::upstreams::tuple_key(
                        ns,
                        conn.remote,
                        conn.local,
                    ))
                {
                    out.push(Observation::UpstreamPeerClosed {
                        key: key.clone(),
                        sock: up.sock,
                        unread: s.counters.unread,
                    });
                }
                out.push(Observation::InboundClosed {
                    key: key.clone(),
                    sock: self.sock_id(s.skaddr),
                    by_container,
                    pending,
                    upstream: self.upstream_of(ns, conn),
                    request_bytes: s.counters.bytes_received,
                    port: conn.local.port(),
                    activity: Activity {
                        reset: by_container && new == Some(Close),
                        ..self.activity(&s.counters)
                    },
                    peer: conn.remote.ip(),
                });
            }
            _ => {}
        }
    }

    /// Follows a connect to a container's address from its SYN: notes when it was sent
    /// (CLOSE → SYN_SENT) and, at the socket's next step, returns that time once. Only
    /// connects to containers' addresses are noted (every later step of those reaches the
    /// agent; a loopback connect's may not: the kernel's lean filter drops them). An entry
    /// whose next step was lost stays until its address connects again or the cap evicts it
    /// (counted); one older than any SYN retry time is not believed.
    fn connect_step(
        &mut self,
        s: &StateChange,
        conn: Endpoints,
        out: &mut Vec<Observation>,
    ) -> Option<Mono> {
        match (s.old, s.new) {
            (Some(Close), Some(SynSent)) => {
                // A reused address: its earlier attempt ended unseen.
                self.attempt_ended(s.skaddr, out);
                if self.by_ip.contains_key(&conn.remote.ip()) {
                    make_room(
                        &mut self.sockets.connecting,
                        MAX_CONNECTING,
                        &s.skaddr,
                        &mut self.dropped.connecting,
                    );
                    self.sockets.connecting.insert(s.skaddr, s.meta.ts_ns);
                    self.attempt_to_ended(s, conn, out);
                } else {
                    // A reused address's old entry is not this connect's.
                    self.sockets.connecting.remove(&s.skaddr);
                }
                None
            }
            (Some(SynSent), _) => {
                self.attempt_ended(s.skaddr, out);
                let at = self.sockets.connecting.remove(&s.skaddr)?;
                (at <= s.meta.ts_ns && s.meta.ts_ns - at <= MAX_ATTEMPT).then_some(at)
            }
            _ => None,
        }
    }

    /// A SYN to the address of a container whose run has ended (its process exited, or its
    /// cgroup is gone): announced, so that its stop waits for the attempt's outcome. Only
    /// those: a connect to a running container costs nothing more here.
    fn attempt_to_ended(&mut self, s: &StateChange, conn: Endpoints, out: &mut Vec<Observation>) {
        let Some(key) = self.backend_of(conn.remote) else {
            return;
        };
        let ended = self
            .containers
            .get(key.as_str())
            .is_some_and(|c| c.run_ended || c.gone_at.is_some());
        if !ended {
            return;
        }
        make_room(
            &mut self.sockets.to_ended,
            MAX_CONNECTING,
            &s.skaddr,
            &mut self.dropped.connecting,
        );
        self.sockets.to_ended.insert(s.skaddr, key.clone());
        out.push(Observation::AttemptBegan {
            key,
            sock: s.skaddr,
            at: s.meta.ts_ns,
        });
    }

    /// The next step of an announced attempt (see `attempt_to_ended`).
    fn attempt_ended(&mut self, skaddr: u64, out: &mut Vec<Observation>) {
        if let Some(key) = self.sockets.to_ended.remove(&skaddr) {
            out.push(Observation::AttemptEnded { key, sock: skaddr });
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
            reset: false,
        }
    }

    /// The container of a followed (or just closed) connection, as its observations name it.
    /// The container of the connection at `skaddr`; a closed one's only for a record of the
    /// same connection (`conn`: a freed socket's memory is soon another's, perhaps one the
    /// kernel filter kept from the agent).
    pub(super) fn connection_owner(
        &self,
        skaddr: u64,
        conn: Option<&Endpoints>,
    ) -> Option<Arc<ContainerIdentity>> {
        self.socket_owner(skaddr, conn)
            .and_then(|k| self.containers.get(k.as_str()))
            .map(|c| Arc::clone(&c.identity))
    }

    fn remember_closed(&mut self, skaddr: u64, key: &Key, conn: Endpoints) {
        if self
            .sockets
            .recent
            .insert(skaddr, (key.clone(), conn))
            .is_none()
        {
            self.sockets.recent_order.push_back(skaddr);
        }
        while self.sockets.recent_order.len() > Self::RECENT {
            if let Some(old) = self.sockets.recent_order.pop_front() {
                self.sockets.recent.remove(&old);
            }
        }
    }

    /// The container of a followed (or just closed) connection.
    fn socket_owner(&self, skaddr: u64, conn: Option<&Endpoints>) -> Option<Key> {
        self.sockets
            .tracked
            .get(&skaddr)
            .map(|t| t.key.clone())
            .or_else(|| {
                let (key, closed) = self.sockets.recent.get(&skaddr)?;
                conn.is_none_or(|c| c == closed).then(|| key.clone())
            })
    }

    /// The id the tracker knows a connection by.
    fn sock_id(&mut self, skaddr: u64) -> u64 {
        self.sockets.adopted.remove(&skaddr).unwrap_or(skaddr)
    }

    /// A followed connection's peer closed or reset it (the guard of a match arm would let
    /// an unfollowed one fall through to the close).
    pub(super) fn peer_done(&mut self, skaddr: u64, ns: u32, conn: Endpoints) {
        if self.follows(skaddr, ns, conn) {
            self.sockets.set_peer_done(skaddr);
        }
    }

    /// Whether a socket is followed, by kernel address, adopting one a scan found by its
    /// 4-tuple.
    pub(super) fn follows(&mut self, skaddr: u64, ns: u32, conn: Endpoints) -> bool {
        if self.sockets.tracked.contains_key(&skaddr) {
            return true;
        }
        let seed = self.sockets.seed_id(ns, conn.local, conn.remote);
        self.sockets.adopt(seed, skaddr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passing_state_lives_while_queued_or_peer_done_and_an_address_followed_again_starts_clean() {
        let mut s = Sockets::default();
        let key: Key = Arc::new("c".to_string());
        // Its peer done while it waited for accept(): both kept until the close.
        s.follow(1, key.clone(), Some((5, 8080)));
        s.set_peer_done(1);
        let queued = |s: &mut Sockets, id| s.take_queued(id).map(|(_, at, port)| (at, port));
        assert_eq!(queued(&mut s, 1), Some((5, 8080)));
        assert_eq!(queued(&mut s, 1), None, "accepted once");
        assert_eq!(s.unfollow(1).map(|(_, done)| done), Some(true));
        assert!(s.passing.is_empty());
        // Accepted, nothing else: no entry left.
        s.follow(2, key.clone(), Some((5, 8080)));
        assert_eq!(queued(&mut s, 2), Some((5, 8080)));
        assert!(s.passing.is_empty());
        // An entry left by a connection no longer followed (evicted) is not the next one's.
        s.follow(3, key.clone(), None);
        s.set_peer_done(3);
        s.tracked.remove(&3);
        s.follow(3, key.clone(), None);
        assert_eq!(s.unfollow(3).map(|(_, done)| done), Some(false));
        // Nothing kept for an address not followed.
        s.set_peer_done(4);
        assert!(s.passing.is_empty());
        // A scan's connection keeps what it was when adopted by kernel address.
        s.follow(7, key.clone(), None);
        s.set_peer_done(7);
        assert!(s.adopt(7, 70));
        assert_eq!(s.adopted.get(&70), Some(&7));
        assert_eq!(s.unfollow(70).map(|(_, done)| done), Some(true));
        assert!(s.passing.is_empty());
        assert_eq!(s.tracked.len(), 1, "the accepted one, still open");
    }

    #[test]
    fn passing_states_of_evicted_connections_never_outgrow_the_connections_followed() {
        let mut s = Sockets::default();
        let key: Key = Arc::new("c".to_string());
        for id in 0..10_000u64 {
            s.follow(id, key.clone(), Some((id, 80)));
            // The cap evicts from `tracked` alone, as `make_room` does.
            if s.tracked.len() > 100 {
                let old = *s.tracked.keys().next().expect("an entry");
                s.tracked.remove(&old);
            }
            assert!(s.passing.len() <= s.tracked.len() + 1, "at {id}");
        }
        // A followed connection's state survives the sweeps.
        let kept = *s.tracked.keys().next().expect("an entry");
        assert!(s.take_queued(kept).is_some());
    }
}
