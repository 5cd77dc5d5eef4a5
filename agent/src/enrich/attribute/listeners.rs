//! Listeners: their opening and closing, the accept path (arrivals, how long accept() kept
//! a connection waiting, overflows) and samples of accept-queue depths and the namespace's
//! listen counters from procfs.
//!
//! Listeners are kept by (namespace inode, port), each with the cookie of its namespace where
//! a record of the listener itself gave it (its `listen()` or its close; a scan cannot): a
//! record of another namespace at a reused inode (a replacement's) never matches it.

use std::{net::SocketAddr, sync::Arc};

use super::{Enricher, Key};
use crate::{
    capture::event::{Accepted, Endpoints, ListenOverflow, StateChange},
    enrich::{
        host::HostView,
        netstat::{NetstatError, parse_listen_counters},
    },
    model::{
        ContainerIdentity, Fact, HashMap, HashSet, Mono, Netns, Observation, Workload,
        netns::cookies_agree, observation::ListenSample,
    },
};

/// Containers' listening sockets by (network namespace inode, port); the last member of each
/// entry is its namespace's cookie (0: unknown).
#[derive(Debug, Default)]
pub(super) struct Listeners {
    /// Open listeners: owner and address.
    pub(super) open: HashMap<(u32, u16), (Key, SocketAddr, u64)>,
    /// Listeners that were closed: former owner, and when.
    pub(super) closed: HashMap<(u32, u16), (Key, Mono, u64)>,
    /// Listeners a container closed in an earlier run, and when its new run started (it
    /// restarted in place): a refusal there from then on is its start's, not its stop's.
    pub(super) reserved: HashMap<(u32, u16), (Key, Mono, u64)>,
    /// Accept-queue limits of listeners opened while the agent ran.
    pub(super) backlog_limits: HashMap<(u32, u16), u32>,
}

impl Listeners {
    /// The open listener at `port` of `ns`, unless it is another namespace's at the inode.
    pub(super) fn open_at(&self, ns: Netns, port: u16) -> Option<&(Key, SocketAddr, u64)> {
        let e = self.open.get(&(ns.inum, port))?;
        cookies_agree(e.2, ns.cookie).then_some(e)
    }

    /// The closed listener at `port` of `ns`, likewise.
    pub(super) fn closed_at(&self, ns: Netns, port: u16) -> Option<&(Key, Mono, u64)> {
        let e = self.closed.get(&(ns.inum, port))?;
        cookies_agree(e.2, ns.cookie).then_some(e)
    }

    /// The reserved listener at `port` of `ns`, likewise.
    pub(super) fn reserved_at(&self, ns: Netns, port: u16) -> Option<&(Key, Mono, u64)> {
        let e = self.reserved.get(&(ns.inum, port))?;
        cookies_agree(e.2, ns.cookie).then_some(e)
    }
}

impl<H: HostView> Enricher<H> {
    pub(super) fn listener_opened(
        &mut self,
        s: &StateChange,
        conn: Endpoints,
        out: &mut Vec<Observation>,
    ) {
        let ns = s.meta.ns();
        let at = (ns.inum, conn.local.port());
        if let Some(limit) = s.max_ack_backlog {
            self.listeners.backlog_limits.insert(at, limit);
        }
        if let Some(key) = self.container_of_task(s.meta.tgid, s.meta.cgroup_id, out) {
            // Its own process's listen(): the socket's namespace is the container's.
            self.learn_cookie(&key, ns);
            let key = Key::new(key);
            self.listeners
                .open
                .insert(at, (key.clone(), conn.local, ns.cookie));
            self.listeners.closed.remove(&at);
            self.listeners.reserved.remove(&at);
            out.push(Observation::ListenerOpened {
                key,
                addr: conn.local,
                netns: ns,
            });
        }
    }

    pub(super) fn listener_closed(
        &mut self,
        ns: Netns,
        conn: Endpoints,
        at: Mono,
        out: &mut Vec<Observation>,
    ) {
        let port = conn.local.port();
        self.listeners.backlog_limits.remove(&(ns.inum, port));
        // An entry of another namespace at the inode is one whose close was never seen: the
        // namespace is gone, the entry stays as it was.
        if self.listeners.open_at(ns, port).is_none() {
            return;
        }
        if let Some((key, addr, cookie)) = self.listeners.open.remove(&(ns.inum, port)) {
            // The close's record knows the namespace's cookie where a scan could not.
            self.learn_cookie(&key, ns);
            let cookie = if cookie == 0 { ns.cookie } else { cookie };
            self.listeners
                .closed
                .insert((ns.inum, addr.port()), (key.clone(), at, cookie));
            out.push(Observation::ListenerClosed { key, addr });
        }
    }

    /// A record of `ns` made by the container `key`'s own processes or listeners: its
    /// namespace's cookie, if not known yet (see `model::netns`).
    pub(super) fn learn_cookie(&mut self, key: &str, ns: Netns) {
        if let Some(c) = self.containers.get_mut(key)
            && c.netns_cookie == 0
            && c.netns == Some(ns.inum)
        {
            c.netns_cookie = ns.cookie;
        }
    }

    /// The container whose listener on `port` took an arrival at `at`: the open one, or one
    /// closed after it (an arrival held in the kernel, `--hold`, comes with its connection's
    /// next record, which may follow its listener's close: a cut at exit).
    pub(super) fn arrival_owner(&self, ns: Netns, port: u16, at: Mono) -> Option<Key> {
        if let Some((key, ..)) = self.listeners.open_at(ns, port) {
            return Some(key.clone());
        }
        let (key, closed_at, _) = self.listeners.closed_at(ns, port)?;
        (at < *closed_at).then(|| key.clone())
    }

    /// What happened on one of a container's listeners, for the per-listener metrics and
    /// storms.
    pub(super) fn listener_fact(
        &self,
        key: &Key,
        port: u16,
        fact: Fact,
        out: &mut Vec<Observation>,
    ) {
        if let Some(c) = self.containers.get(key.as_str()) {
            out.push(Observation::Listener {
                container: Arc::clone(&c.identity),
                port,
                fact,
            });
        }
    }

    /// The accept() that took a queued connection: how long it waited.
    pub(super) fn accepted(&mut self, a: &Accepted, out: &mut Vec<Observation>) {
        let Some((key, at, port)) = self.sockets.take_queued(a.skaddr) else {
            return;
        };
        // Its own connection: the namespace is the container's (the accept hooks leave the
        // cookie out; an accept the kernel held comes with its connection's, which has it).
        self.learn_cookie(&key, a.meta.ns());
        let Some(waited) = a.meta.ts_ns.checked_sub(at) else {
            return;
        };
        self.listener_fact(&key, port, Fact::AcceptWait(waited as f64 / 1e9), out);
    }

    /// A completed handshake dropped because the listener's accept queue was full.
    pub(super) fn overflow(&self, o: &ListenOverflow, out: &mut Vec<Observation>) {
        let Some(port) = o.listener.map(|l| l.port()) else {
            return;
        };
        if let Some((key, ..)) = self.listeners.open_at(o.meta.ns(), port) {
            self.listener_fact(key, port, Fact::Overflow, out);
        }
    }

    /// Samples the listen path from procfs: each listener's accept queue (depth and limit) and
    /// each network namespace's listen counters. `only` restricts the sample to some workloads'
    /// containers, plus those never sampled yet. A container's descriptors are walked only when
    /// its namespace's listeners changed, so a sample reads a few small files per container.
    pub fn sample_listen_path(
        &mut self,
        only: Option<&HashSet<Workload>>,
    ) -> (ListenSample, Vec<NetstatError>) {
        let mut out = ListenSample {
            complete: only.is_none(),
            ..ListenSample::default()
        };
        let mut errors = Vec::new();
        let mut keys: Vec<&String> = self
            .containers
            .iter()
            .filter(|(_, c)| c.gone_at.is_none() && c.main_pid.is_some())
            .filter(|(_, c)| {
                !c.sampled
                    || only.is_none_or(|w| {
                        w.contains(&(c.identity.namespace.clone(), c.identity.workload.clone()))
                    })
            })
            .map(|(k, _)| k)
            .collect();
        keys.sort_by_key(|k| &self.containers[*k].identity.name);
        let keys: Vec<String> = keys.into_iter().cloned().collect();
        let mut namespaces = HashSet::default();
        let mut counters = Vec::new();
        for key in keys {
            let Some(c) = self.containers.get_mut(&key) else {
                continue;
            };
            let Some(pid) = c.main_pid else { continue };
            c.sampled = true;
            let socks = self.host.listeners(pid);
            // Which listeners are its own is read from its descriptors (hundreds of readlinks
            // for a busy server: a second per full sample of 1,000 containers) only when the
            // namespace's listeners changed since the last read: a container adopted since
            // (a replacement) has read none yet.
            let mut seen: Vec<u64> = socks
                .iter()
                .filter(|s| s.listening)
                .map(|s| s.inode)
                .collect();
            seen.sort_unstable();
            if c.listening_seen.as_ref() != Some(&seen) {
                let own: HashSet<u64> = self.host.socket_inodes(pid).into_iter().collect();
                c.listening_seen = Some(seen);
                c.listener_inodes = socks
                    .iter()
                    .filter(|s| s.listening && own.contains(&s.inode))
                    .map(|s| s.inode)
                    .collect();
            }
            for s in socks
                .iter()
                .filter(|s| c.listener_inodes.contains(&s.inode))
            {
                let port = s.local.port();
                let limit = c
                    .netns
                    .and_then(|ns| self.listeners.backlog_limits.get(&(ns, port)));
                out.queues.push((
                    ContainerIdentity::clone(&c.identity),
                    port,
                    s.rx_queue,
                    limit.copied(),
                ));
            }
            // A pod's containers share one namespace: its counters go under the first
            // container (by name) that listens in it.
            let owns = !c.listener_inodes.is_empty();
            if let Some(ns) = c.netns {
                counters.push((owns, ns, pid, ContainerIdentity::clone(&c.identity)));
            }
        }
        counters.sort_by_key(|(owns, ..)| !owns);
        for (_, ns, pid, identity) in counters {
            if !namespaces.insert(ns) {
                continue;
            }
            let Some(text) = self.host.netstat(pid) else {
                continue;
            };
            match parse_listen_counters(&text) {
                Ok(c) => out.netns.push((identity, c)),
                Err(e) => errors.push(e),
            }
        }
        (out, errors)
    }
}
