//! Upstreams: a process that listens and connects to a container is a proxy (nginx,
//! HAProxy, Envoy: no list of names); its connections to containers are followed, so that a
//! cut on the container side names the proxy, and what its worker did about the cut
//! (`sock_length` events on the proxy's socket) names the backends involved.

use super::Key;
use crate::model::{Fact, Netns};
use std::{
    collections::VecDeque,
    net::{IpAddr, SocketAddr},
};

use super::{Enricher, MAX_UPSTREAMS};
use crate::model::state::make_room;
use crate::{
    capture::event::{Endpoints, IoStep, StateChange, UpstreamIo},
    enrich::host::HostView,
    model::{HashMap, HashSet, Mono, Observation, PROBERS, Proxy, SECOND, TcpState, UpstreamStep},
};

use TcpState::{Close, CloseWait, Established, SynSent};

/// A proxy's connection to a container.
#[derive(Debug, Clone)]
pub(super) struct Upstream {
    pub(super) sock: u64,
    pub(super) key: Key,
    pub(super) proxy: Proxy,
    /// Its handshake completed: a reset that failed the proxy's first send kept a request
    /// from going out (before it, the attempt is judged refused or unreachable).
    pub(super) established: bool,
}

/// A proxy's connection by (namespace, proxy's end, container's end): the namespace (its
/// inode) only where the container's end is a local address (loopback, unset: an in-pod
/// proxy's), which every pod has, else 0 (a container's address names its pod).
pub(super) type TupleKey = (u32, SocketAddr, SocketAddr);

/// The `TupleKey` of a connection between `proxy` and `container` seen in namespace `ns`.
pub(super) fn tuple_key(ns: u32, proxy: SocketAddr, container: SocketAddr) -> TupleKey {
    (
        if is_local(container.ip()) { ns } else { 0 },
        proxy,
        container,
    )
}

/// A loopback or unset address (IPv4, IPv6 or IPv4-mapped): a connect to it stays in the
/// connecting socket's namespace.
pub(super) fn is_local(ip: IpAddr) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    ip.is_loopback() || ip.is_unspecified()
}

/// Proxies and their connections to containers.
#[derive(Debug, Default)]
pub(super) struct Upstreams {
    /// Open connections from proxy processes to containers, by kernel address.
    pub(super) open: HashMap<u64, Upstream>,
    /// The same, by (proxy's local, container's) address (`TupleKey`), kept a while after
    /// they close: how the container side of a cut finds the proxy.
    pub(super) by_tuple: HashMap<TupleKey, Upstream>,
    pub(super) order: VecDeque<TupleKey>,
    /// Closed connections by kernel address, kept a while: a reset closes the proxy's socket
    /// before its worker reads the error (the cut).
    pub(super) closed: HashMap<u64, Upstream>,
    pub(super) closed_order: VecDeque<u64>,
    /// Whether a process is a proxy (it holds a listening socket): when found to be one (the
    /// kernel follows its connects from shortly after), cached until it exits; when found to
    /// be none, when that was (see `NOT_A_PROXY_FOR`).
    pub(super) proxies: HashMap<u32, Result<(Proxy, Mono), Mono>>,
    /// Upstream sockets the kernel may not follow yet (opened before their process was in
    /// its proxy map): the agent adds them (`take_follow`).
    pub(super) follow: Vec<u64>,
    /// The upstream attempt the current event ended (connect failed), for the refusal or
    /// unreachable verdict that follows in the same event. Socket addresses are reused at
    /// once, so nothing else may name a closed upstream by its address.
    pub(super) failed_attempt: Option<u64>,
}

/// How long a process found holding no listening socket is taken for no proxy: its next
/// connect to a container after that looks again. A proxy may connect before it listens
/// (Envoy health-checks its clusters before its listeners are up; a proxy's readiness checks of
/// its backends): cached for good, as it was, its connections were nobody's until it exited.
const NOT_A_PROXY_FOR: Mono = 5 * SECOND;

/// How long after a proxy is found its connects may still precede the kernel knowing it:
/// the pipeline updates the map after the event that found it, and events reach it in
/// batches at most a few hundred ms old.
const KERNEL_CATCH_UP: Mono = 2 * SECOND;

impl<H: HostView> Enricher<H> {
    /// The proxy a process is, if it is one: it holds a listening socket. Named by its
    /// container's workload, or its command outside containers.
    fn proxy(&mut self, tgid: u32, comm: &str, now: Mono) -> Option<(Proxy, Mono)> {
        match self.upstreams.proxies.get(&tgid) {
            Some(Ok(p)) => return Some(p.clone()),
            Some(Err(at)) if now < at.saturating_add(NOT_A_PROXY_FOR) => return None,
            _ => {}
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
        let p = listens.then(|| {
            let proxy = Proxy {
                tgid,
                name: self
                    .by_pid
                    .get(&tgid)
                    .and_then(|k| self.containers.get(k))
                    .map_or_else(|| comm.to_string(), |c| c.identity.workload.clone()),
                prober,
            };
            (proxy, now)
        });
        if p.is_some() {
            self.watch_generation += 1;
        }
        self.upstreams.proxies.insert(tgid, p.clone().ok_or(now));
        p
    }

    /// The container an address belongs to: the one listening on its port, as a pod's
    /// containers share one address (a network holder, sidecars); after that listener closed,
    /// its former owner (so that attempts refused there name the same backend).
    pub(super) fn backend_of(&self, remote: SocketAddr) -> Option<Key> {
        let key = self.by_ip.get(&remote.ip())?;
        let Some(ns) = self.containers.get(key.as_str()).and_then(|c| {
            let inum = c.netns?;
            Some(crate::model::Netns::new(inum, c.netns_cookie))
        }) else {
            return Some(key.clone());
        };
        if let Some((k, ..)) = self.listeners.open_at(ns, remote.port()) {
            return Some(k.clone());
        }
        Some(
            self.listeners
                .closed_at(ns, remote.port())
                .map_or(key, |(k, ..)| k)
                .clone(),
        )
    }

    /// The container a connect from a socket in `ns` to `remote` reaches: over loopback (or
    /// to an unset address), the one listening on the port in that namespace (a sidecar's
    /// app), or that listened there last; else as [`Self::backend_of`].
    pub(super) fn backend_at(&self, ns: Netns, remote: SocketAddr) -> Option<Key> {
        if !is_local(remote.ip()) {
            return self.backend_of(remote);
        }
        if let Some((k, ..)) = self.listeners.open_at(ns, remote.port()) {
            return Some(k.clone());
        }
        self.listeners
            .closed_at(ns, remote.port())
            .map(|(k, ..)| k.clone())
    }

    /// The proxies the kernel is to follow the connects of. Not probers: a probe is never
    /// retried, so their sends and receives are not needed.
    pub(super) fn proxy_tgids(&self) -> impl Iterator<Item = u32> + '_ {
        self.upstreams
            .proxies
            .iter()
            .filter_map(|(tgid, p)| p.as_ref().ok().filter(|(p, _)| !p.prober).map(|_| *tgid))
    }

    /// Upstream sockets the agent must add to the kernel's map itself, since the last call.
    pub fn take_follow(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.upstreams.follow)
    }

    /// A proxy's worker around a cut on one of its upstream connections.
    pub(super) fn upstream_io(&mut self, io: &UpstreamIo, out: &mut Vec<Observation>) {
        if let IoStep::Answered {
            port,
            accepted_at,
            data_at,
            index,
        } = io.step
        {
            // A server's answer in a storming namespace: a fact of the listener it came from.
            if let Some((key, ..)) = self.listeners.open_at(io.meta.ns(), port) {
                let fact = Fact::Answered {
                    sock: io.skaddr,
                    accepted_at,
                    data_at,
                    index,
                };
                self.listener_fact(&key.clone(), port, fact, out);
            }
            return;
        }
        let Some(up) = self
            .upstreams
            .open
            .get(&io.skaddr)
            .or_else(|| self.upstreams.closed.get(&io.skaddr))
        else {
            tracing::debug!(sock = io.skaddr, step = ?io.step, tid = io.meta.pid, "upstream io on an unknown socket");
            return; // not a connection to a container
        };
        if io.meta.tgid != up.proxy.tgid {
            // Another process's connection at the address the proxy's closed one had: the
            // kernel follows every connection to a container, and its connect may not have
            // reached the agent.
            tracing::debug!(sock = io.skaddr, step = ?io.step, tgid = io.meta.tgid, proxy = up.proxy.tgid, "upstream io by another process");
            return;
        }
        tracing::debug!(sock = io.skaddr, step = ?io.step, tid = io.meta.pid, backend = %up.key, "upstream io");
        let step = match io.step {
            IoStep::Cut { bytes: 0, .. } if !up.established => {
                // A refused connect's failed send: its state change already told.
                tracing::debug!(
                    sock = io.skaddr,
                    "unsent cut on an attempt never established"
                );
                return;
            }
            IoStep::Cut {
                bytes, started_at, ..
            } => UpstreamStep::Cut { bytes, started_at },
            IoStep::RetryStarted {
                cut_sock,
                cut_at,
                started_at,
            } => UpstreamStep::RetryStarted {
                cut_sock,
                cut_at,
                started_at,
            },
            IoStep::RetryEnded {
                cut_sock, bytes, ..
            } => UpstreamStep::RetryEnded { cut_sock, bytes },
            IoStep::Answered { .. } => return, // taken above
        };
        out.push(Observation::UpstreamRequest {
            key: up.key.clone(),
            sock: up.sock,
            proxy: up.proxy.clone(),
            tid: io.meta.pid,
            step,
        });
    }

    fn remember_closed_upstream(&mut self, up: Upstream) {
        let sock = up.sock;
        if self.upstreams.closed.insert(sock, up).is_none() {
            self.upstreams.closed_order.push_back(sock);
        }
        while self.upstreams.closed_order.len() > Self::RECENT {
            if let Some(old) = self.upstreams.closed_order.pop_front() {
                self.upstreams.closed.remove(&old);
            }
        }
    }

    /// The socket of the proxy or prober on this node at the other end of a container's
    /// inbound connection (seen in namespace `ns`), if one opened it.
    pub(super) fn upstream_of(&self, ns: u32, inbound: Endpoints) -> Option<u64> {
        self.upstreams
            .by_tuple
            .get(&tuple_key(ns, inbound.remote, inbound.local))
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
                // A socket address reused, by any process: the old connection's record is
                // over (the kernel follows every connection to a container, a proxy's or
                // not, and its I/O must not be read as the old proxy connection's).
                self.upstreams.closed.remove(&s.skaddr);
                // connect(): process context, the local port is not chosen yet. Over loopback,
                // to another container of the pod (a sidecar's to its app).
                let Some(key) = self.backend_at(s.meta.ns(), conn.remote) else {
                    return false;
                };
                // A container's connect to itself (its own health check over loopback) is no
                // proxying. Only a process in the backend's namespace can be in it (no lookup
                // for a node proxy's connects).
                let same_ns =
                    self.containers.get(key.as_str()).and_then(|c| c.netns) == Some(s.meta.netns);
                if same_ns
                    && self
                        .container_of_task(s.meta.tgid, s.meta.cgroup_id, out)
                        .is_some_and(|own| own == key.as_str())
                {
                    return false;
                }
                let now = s.meta.ts_ns;
                let Some((proxy, found_at)) = self.proxy(s.meta.tgid, &s.meta.comm, now) else {
                    return false;
                };
                if !proxy.prober && now <= found_at.saturating_add(KERNEL_CATCH_UP) {
                    self.upstreams.follow.push(s.skaddr);
                }
                let up = Upstream {
                    sock: s.skaddr,
                    key: key.clone(),
                    proxy: proxy.clone(),
                    established: false,
                };
                make_room(
                    &mut self.upstreams.open,
                    MAX_UPSTREAMS,
                    &s.skaddr,
                    &mut self.dropped.upstreams,
                );
                self.upstreams.open.insert(s.skaddr, up);
                out.push(Observation::UpstreamOpened {
                    key,
                    sock: s.skaddr,
                    proxy,
                });
                true
            }
            (Some(SynSent), Some(Established)) => {
                let tuple = tuple_key(s.meta.netns, conn.local, conn.remote);
                let Some(up) = self.upstreams.open.get_mut(&s.skaddr) else {
                    // Another process's connection on a tuple a closed upstream had.
                    self.upstreams.by_tuple.remove(&tuple);
                    return false;
                };
                up.established = true;
                let up = up.clone();
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
                // Closed before the agent added it to the kernel's map: an entry added now
                // would outlive the socket (the kernel drops it at the address's next socket).
                self.upstreams.follow.retain(|sk| *sk != s.skaddr);
                out.push(Observation::UpstreamClosed {
                    key: up.key.clone(),
                    sock: up.sock,
                    bytes_sent: s.counters.bytes_sent,
                });
                self.remember_closed_upstream(up);
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
