//! Sockets: a container's inbound connections, followed by kernel socket address from the
//! handshake (or adopted by 4-tuple from a scan) to the close that says whether the container
//! cut a request; failed connects to a container's address; resets on its connections.

use std::sync::Arc;

use super::{Enricher, Key, Tracked};
use crate::{
    capture::event::{Endpoints, StateChange},
    enrich::host::HostView,
    model::{Fact, Observation, ResetDirection, TcpState},
};

use TcpState::{Close, CloseWait, Established, Listen, SynRecv, SynSent};

impl<H: HostView> Enricher<H> {
    pub(super) const RECENT: usize = 8192;

    pub(super) fn on_state(&mut self, s: &StateChange, out: &mut Vec<Observation>) {
        let (old, new) = (s.old, s.new);
        let ns = s.meta.netns;
        let Some(conn) = s.conn else { return };
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
                if let Some((key, _)) = self.listeners.get(&(ns, conn.local.port())) {
                    let key = key.clone();
                    out.push(Observation::InboundEstablished {
                        key: key.to_string(),
                        sock: s.skaddr,
                    });
                    self.sockets.insert(
                        s.skaddr,
                        Tracked::new(key.clone(), Some((s.meta.ts_ns, conn.local.port()))),
                    );
                    self.listener_fact(&key, conn.local.port(), Fact::Arrival, out);
                }
            }
            (Some(SynSent), Some(Close)) => {
                // An attempt that never connected and was not refused: to a gone container's
                // address, unreachable.
                if self.refused_attempts.remove(&s.skaddr) {
                    return;
                }
                if let Some(key) = self.by_ip.get(&conn.remote.ip()) {
                    out.push(Observation::Unreachable { key: key.clone() });
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
                self.sockets.remove(&s.skaddr);
                self.remember_closed(s.skaddr, &t.key);
                let by_container = !t.peer_done && old == Some(Established);
                let pending = s.counters.request_pending();
                if by_container
                    && pending
                    && let Some(up) = self.upstream_by_tuple.get(&(conn.remote, conn.local))
                {
                    out.push(Observation::UpstreamCut {
                        key: t.key.to_string(),
                        proxy: up.proxy.clone(),
                        request_bytes: s.counters.bytes_received,
                        upstream_opened_at: up.opened_at,
                    });
                }
                out.push(Observation::InboundClosed {
                    key: t.key.to_string(),
                    sock: self.sock_id(s.skaddr),
                    by_container,
                    pending,
                });
            }
            _ => {}
        }
    }

    /// A RST on a followed (or just closed) connection of a container.
    pub(super) fn reset(
        &self,
        skaddr: u64,
        direction: ResetDirection,
        reason: String,
        out: &mut Vec<Observation>,
    ) {
        if let Some(c) = self
            .socket_owner(skaddr)
            .and_then(|k| self.containers.get(k.as_str()))
        {
            out.push(Observation::Reset {
                container: Arc::clone(&c.identity),
                direction,
                reason,
            });
        }
    }

    fn remember_closed(&mut self, skaddr: u64, key: &Key) {
        if self.recent.insert(skaddr, key.clone()).is_none() {
            self.recent_order.push_back(skaddr);
        }
        while self.recent_order.len() > Self::RECENT {
            if let Some(old) = self.recent_order.pop_front() {
                self.recent.remove(&old);
            }
        }
    }

    /// The container of a followed (or just closed) connection.
    fn socket_owner(&self, skaddr: u64) -> Option<Key> {
        self.sockets
            .get(&skaddr)
            .map(|t| t.key.clone())
            .or_else(|| self.recent.get(&skaddr).cloned())
    }

    /// The id the tracker knows a connection by.
    fn sock_id(&mut self, skaddr: u64) -> u64 {
        self.adopted.remove(&skaddr).unwrap_or(skaddr)
    }

    /// A followed socket by kernel address, adopting one a scan found by its 4-tuple.
    pub(super) fn tracked(
        &mut self,
        skaddr: u64,
        ns: u32,
        conn: Endpoints,
    ) -> Option<&mut Tracked> {
        if !self.sockets.contains_key(&skaddr)
            && let Some(id) = self.seeded.remove(&(ns, conn.local, conn.remote))
            && let Some(t) = self.sockets.remove(&id)
        {
            self.sockets.insert(skaddr, t);
            self.adopted.insert(skaddr, id);
        }
        self.sockets.get_mut(&skaddr)
    }
}
