//! Upstreams: a process that listens and connects to a container is a proxy (nginx,
//! HAProxy, Envoy: no list of names); its connections to containers are followed, so that a
//! cut on the container side names the proxy and its retry can be judged.

use std::{collections::VecDeque, net::SocketAddr};

use super::Enricher;
use crate::{
    capture::event::{Endpoints, StateChange},
    enrich::host::HostView,
    model::{HashMap, HashSet, Mono, Observation, PROBERS, Proxy, TcpState},
};

use TcpState::{Close, CloseWait, Established, SynSent};

/// A proxy's connection to a container.
#[derive(Debug, Clone)]
pub(super) struct Upstream {
    pub(super) sock: u64,
    pub(super) key: String,
    pub(super) proxy: Proxy,
    pub(super) opened_at: Mono,
}

/// Proxies and their connections to containers.
#[derive(Debug, Default)]
pub(super) struct Upstreams {
    /// Open connections from proxy processes to containers, by kernel address.
    pub(super) open: HashMap<u64, Upstream>,
    /// The same, by (proxy's local, container's) address, kept a while after they close:
    /// how the container side of a cut finds the proxy.
    pub(super) by_tuple: HashMap<(SocketAddr, SocketAddr), Upstream>,
    pub(super) order: VecDeque<(SocketAddr, SocketAddr)>,
    /// Whether a process is a proxy (it holds a listening socket), cached until it exits.
    pub(super) proxies: HashMap<u32, Option<Proxy>>,
    /// The upstream attempt the current event ended (connect failed), for the refusal or
    /// unreachable verdict that follows in the same event. Socket addresses are reused at
    /// once, so nothing else may name a closed upstream by its address.
    pub(super) failed_attempt: Option<u64>,
}

impl<H: HostView> Enricher<H> {
    /// The proxy a process is, if it is one: it holds a listening socket. Named by its
    /// container's workload, or its command outside containers.
    fn proxy(&mut self, tgid: u32, comm: &str) -> Option<Proxy> {
        if let Some(p) = self.upstreams.proxies.get(&tgid) {
            return p.clone();
        }
        let prober = PROBERS.contains(&comm) && !self.by_pid.contains_key(&tgid);
        let own: HashSet<u64> = self.host.socket_inodes(tgid).into_iter().collect();
        let listens = prober
            || !own.is_empty()
                && self
                    .host
                    .sockets(tgid)
                    .iter()
                    .any(|s| s.listening && own.contains(&s.inode));
        let p = listens.then(|| Proxy {
            tgid,
            name: self
                .by_pid
                .get(&tgid)
                .and_then(|k| self.containers.get(k))
                .map_or_else(|| comm.to_string(), |c| c.identity.workload.clone()),
            prober,
        });
        self.upstreams.proxies.insert(tgid, p.clone());
        p
    }

    /// The socket of the proxy or prober on this node at the other end of a container's
    /// inbound connection, if one opened it.
    pub(super) fn upstream_of(&self, inbound: Endpoints) -> Option<u64> {
        self.upstreams
            .by_tuple
            .get(&(inbound.remote, inbound.local))
            .map(|u| u.sock)
    }

    /// Follows proxies' connections to containers; true when the state change was one.
    pub(super) fn on_upstream(
        &mut self,
        s: &StateChange,
        conn: Endpoints,
        out: &mut Vec<Observation>,
    ) -> bool {
        let (old, new) = (s.old, s.new);
        match (old, new) {
            (Some(Close), Some(SynSent)) => {
                // connect(): process context, the local port is not chosen yet.
                let Some(key) = self.by_ip.get(&conn.remote.ip()).cloned() else {
                    return false;
                };
                let Some(proxy) = self.proxy(s.meta.tgid, &s.meta.comm) else {
                    return false;
                };
                let up = Upstream {
                    sock: s.skaddr,
                    key: key.clone(),
                    proxy: proxy.clone(),
                    opened_at: s.meta.ts_ns,
                };
                self.upstreams.open.insert(s.skaddr, up);
                out.push(Observation::UpstreamOpened {
                    key,
                    sock: s.skaddr,
                    proxy,
                });
                true
            }
            (Some(SynSent), Some(Established)) => {
                let tuple = (conn.local, conn.remote);
                let Some(up) = self.upstreams.open.get(&s.skaddr).cloned() else {
                    // Another process's connection on a tuple a closed upstream had.
                    self.upstreams.by_tuple.remove(&tuple);
                    return false;
                };
                if self.upstreams.by_tuple.insert(tuple, up).is_none() {
                    self.upstreams.order.push_back(tuple);
                }
                while self.upstreams.order.len() > Self::RECENT {
                    if let Some(old) = self.upstreams.order.pop_front() {
                        self.upstreams.by_tuple.remove(&old);
                    }
                }
                true
            }
            (_, Some(CloseWait)) => self.upstreams.open.contains_key(&s.skaddr),
            (Some(SynSent), _) | (Some(Established), _) | (Some(CloseWait), _) => {
                let Some(up) = self.upstreams.open.remove(&s.skaddr) else {
                    return false;
                };
                out.push(Observation::UpstreamClosed {
                    key: up.key,
                    sock: up.sock,
                    bytes_sent: s.counters.bytes_sent,
                });
                // A failed attempt goes on to be judged refused or unreachable below.
                let failed = old == Some(SynSent) && new == Some(Close);
                if failed {
                    self.upstreams.failed_attempt = Some(s.skaddr);
                }
                !failed
            }
            _ => false,
        }
    }
}
