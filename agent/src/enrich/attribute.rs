//! Attribution: which container each kernel event belongs to, turned into the observations
//! the stop tracker consumes. Process-context events (signals, exits, listen(), close()) are
//! attributed by process; packet-path events (a RST answering a SYN to a closed port, a
//! handshake completing) by network namespace, address and port, never by the current task.

use std::{
    collections::{HashMap, HashSet},
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use super::{
    cgroup_path::{CgroupOwner, parse_cgroup_path},
    host::{HostView, ProcInfo},
    kube::{self, SharedStore},
    netstat::{ListenCounters, NetstatError, parse_listen_counters},
};
use crate::{
    capture::{
        event::{Event, ExitStatus, Named},
        watch::WatchSet,
    },
    correlate::{
        ContainerIdentity, ExitInfo, Mono, Observation, Sender, retries::Proxy, storms::Workload,
    },
};

/// A proxy's connection to a container.
#[derive(Debug, Clone)]
struct Upstream {
    sock: u64,
    key: String,
    proxy: Proxy,
    opened_at: Mono,
}

/// Init shims that forward signals to the real main process (`--init`, tini, dumb-init).
const INIT_SHIMS: &[&str] = &[
    "catatonit",
    "podman-init",
    "tini",
    "docker-init",
    "dumb-init",
];

/// The runtime's own processes while it creates a container: `runc init` and its first two
/// stages (`runc:[0:PARENT]`, `runc:[1:CHILD]`) join the container's cgroup and exit within
/// milliseconds, before the container's PID 1 (`runc:[2:INIT]`) execs the entrypoint.
fn bootstrapping(p: &ProcInfo) -> bool {
    matches!(p.comm.as_str(), "runc" | "crun")
        || p.comm.starts_with("runc:[0")
        || p.comm.starts_with("runc:[1")
}

#[derive(Debug, Default)]
struct Container {
    identity: ContainerIdentity,
    main_pid: Option<u32>,
    /// The container's PID 1 (an init shim or the main process itself).
    init_pid: Option<u32>,
    netns: Option<u32>,
    /// Its listening sockets' inodes as of the last full listen-path sample.
    listener_inodes: HashSet<u64>,
    /// Whether its listen path was sampled yet: the first sample is a storm's baseline.
    sampled: bool,
    /// When its cgroup was removed (kernel monotonic ns).
    gone_at: Option<u64>,
    /// The identity the runtime's state gave it, before the Kubernetes API's names.
    runtime_identity: ContainerIdentity,
    /// The pod uid its cgroup path names, for the sandbox (whose id no pod status lists).
    pod_uid: Option<String>,
}

/// One sample of the listen path (see [`Enricher::sample_listen_path`]).
#[derive(Debug, Default)]
pub struct ListenSample {
    /// (container, port, accept-queue depth, its limit) of each sampled listener. The limit is
    /// known for listeners opened while the agent ran (procfs does not show it).
    pub queues: Vec<(ContainerIdentity, u16, u32, Option<u32>)>,
    /// Each sampled network namespace's counters, under the container that owns it.
    pub netns: Vec<(ContainerIdentity, ListenCounters)>,
    /// netstat files that could not be parsed.
    pub errors: Vec<NetstatError>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Fact {
    /// A connection completed its handshake.
    Arrival,
    /// accept() took a connection that had waited this many seconds.
    AcceptWait(f64),
    /// A completed handshake was dropped: the accept queue was full.
    Overflow,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ListenerFact {
    pub container: ContainerIdentity,
    pub port: u16,
    pub fact: Fact,
}

/// A container id shared by what points at the container many times over (its connections):
/// one allocation per listener instead of a 64-byte String per connection. `Arc<String>`
/// rather than `Arc<str>`: a thin pointer, 8 bytes less in every connection's entry.
type Key = Arc<String>;

/// A TCP socket the enricher follows: an inbound connection to a container's listener. One
/// per open connection, so kept small (24 bytes; 32 with its map key): 100,000 connections
/// take 4 MiB here.
#[derive(Debug, Clone)]
struct Tracked {
    key: Key,
    /// While accept() has not taken it: when its handshake completed.
    queued_at: Mono,
    /// While accept() has not taken it: the listener's port; 0 otherwise (no listener has
    /// port 0), which is how `queued()` tells.
    queued_port: u16,
    /// The peer closed (FIN) or reset first: whatever the container does next is no cut.
    peer_done: bool,
}

// Guards the size the comment above promises.
const _: () = assert!(size_of::<Tracked>() <= 24);

impl Tracked {
    fn new(key: Key, queued: Option<(Mono, u16)>) -> Self {
        let (queued_at, queued_port) = queued.unwrap_or_default();
        Self {
            key,
            queued_at,
            queued_port,
            peer_done: false,
        }
    }

    /// When its handshake completed and the listener port, until accept() takes it.
    fn queued(&self) -> Option<(Mono, u16)> {
        (self.queued_port != 0).then_some((self.queued_at, self.queued_port))
    }

    fn take_queued(&mut self) -> Option<(Mono, u16)> {
        let q = self.queued();
        self.queued_port = 0;
        q
    }
}

pub struct Enricher<H> {
    host: H,
    containers: HashMap<String, Container>,
    by_pid: HashMap<u32, String>,
    by_cgroup: HashMap<u64, String>,
    /// Open listeners: (netns, port) → owner and address.
    listeners: HashMap<(u32, u16), (Key, SocketAddr)>,
    /// Listeners that were closed: (netns, port) → former owner.
    closed_listeners: HashMap<(u32, u16), String>,
    /// Accept-queue limits of listeners opened while the agent ran: (netns, port) → limit.
    backlog_limits: HashMap<(u32, u16), u32>,
    sockets: HashMap<u64, Tracked>,
    /// Inbound connections found by a scan (no kernel address yet): (netns, local, remote) → id.
    seeded: HashMap<(u32, SocketAddr, SocketAddr), u64>,
    /// Kernel address → the id a scan gave the same connection before its first event.
    adopted: HashMap<u64, u64>,
    next_seed: u64,
    by_ip: HashMap<IpAddr, String>,
    /// Open connections from proxy processes to containers, by kernel address.
    upstreams: HashMap<u64, Upstream>,
    /// The same, by (proxy's local, container's) address, kept a while after they close:
    /// how the container side of a cut finds the proxy.
    upstream_by_tuple: HashMap<(SocketAddr, SocketAddr), Upstream>,
    upstream_order: std::collections::VecDeque<(SocketAddr, SocketAddr)>,
    /// Whether a process is a proxy (it holds a listening socket), cached until it exits.
    proxies: HashMap<u32, Option<Proxy>>,
    /// Connect attempts answered with RST: refused (counted from the RST), not unreachable.
    refused_attempts: HashSet<u64>,
    /// Connections closed recently, for a RST the kernel sends after the state change.
    recent: HashMap<u64, Key>,
    recent_order: std::collections::VecDeque<u64>,
    /// Pids known not to be in any container (until they exit).
    not_containers: HashSet<u32>,
    /// Pod metadata from the Kubernetes API, when it is used.
    kube: Option<SharedStore>,
    /// The store's generation the identities were last checked against.
    kube_generation: Option<u64>,
    /// The host's network namespace, where only traffic touching a container is captured.
    host_netns: Option<u32>,
    /// Bumped whenever addresses or listeners behind `watch_set` may have changed.
    watch_generation: u64,
}

fn state(n: &Option<Named>) -> &str {
    n.as_ref().and_then(|n| n.name.as_deref()).unwrap_or("")
}

impl<H: HostView> Enricher<H> {
    pub fn new(host: H) -> Self {
        Self {
            host,
            containers: HashMap::new(),
            by_pid: HashMap::new(),
            by_cgroup: HashMap::new(),
            listeners: HashMap::new(),
            closed_listeners: HashMap::new(),
            backlog_limits: HashMap::new(),
            sockets: HashMap::new(),
            seeded: HashMap::new(),
            adopted: HashMap::new(),
            next_seed: 1,
            by_ip: HashMap::new(),
            refused_attempts: HashSet::new(),
            upstreams: HashMap::new(),
            upstream_by_tuple: HashMap::new(),
            upstream_order: std::collections::VecDeque::new(),
            proxies: HashMap::new(),
            recent: HashMap::new(),
            recent_order: std::collections::VecDeque::new(),
            not_containers: HashSet::new(),
            kube: None,
            kube_generation: None,
            host_netns: None,
            watch_generation: 0,
        }
    }

    /// The host's network namespace (the agent's own), for `watch_set`.
    pub fn with_host_netns(mut self, netns: u32) -> Self {
        self.host_netns = Some(netns);
        self
    }

    /// Changes whenever `watch_set` may have.
    pub fn watch_generation(&self) -> u64 {
        self.watch_generation
    }

    /// What the kernel must keep of the host namespace's traffic: every container address
    /// outside the host namespace (a host-network container's addresses are the host's), and
    /// the ports of listeners in it that containers own or owned (refused connects to them
    /// still count).
    pub fn watch_set(&self) -> WatchSet {
        let mut set = WatchSet::default();
        let Some(host) = self.host_netns else {
            return set;
        };
        for (ip, key) in &self.by_ip {
            if self.containers.get(key).and_then(|c| c.netns) != Some(host) {
                set.addrs.insert(*ip);
            }
        }
        let ports = self.listeners.keys().chain(self.closed_listeners.keys());
        set.ports
            .extend(ports.filter(|(ns, _)| *ns == host).map(|(_, port)| *port));
        set
    }

    /// Names containers from the Kubernetes API's pods where the store knows them.
    pub fn with_kube(mut self, store: SharedStore) -> Self {
        self.kube = Some(store);
        self
    }

    /// The identity the API gives a container, over its runtime-state one.
    fn kube_identity(&self, base: &ContainerIdentity, pod_uid: Option<&str>) -> ContainerIdentity {
        self.kube
            .as_ref()
            .and_then(|s| s.lock().ok()?.lookup(&base.id, pod_uid))
            .map_or_else(|| base.clone(), |k| kube::named(base, &k))
    }

    /// When the store changed: containers whose API identity changed (their pod became
    /// known, or its spec changed) get it, announced as `Observation::Identity`.
    fn refresh_identities(&mut self) -> Vec<Observation> {
        let Some(store) = self.kube.clone() else {
            return Vec::new();
        };
        let Ok(store) = store.lock() else {
            return Vec::new();
        };
        if self.kube_generation == Some(store.generation()) {
            return Vec::new();
        }
        self.kube_generation = Some(store.generation());
        let mut out = Vec::new();
        for c in self.containers.values_mut() {
            let Some(k) = store.lookup(&c.runtime_identity.id, c.pod_uid.as_deref()) else {
                continue;
            };
            let identity = kube::named(&c.runtime_identity, &k);
            if identity != c.identity {
                c.identity = identity.clone();
                out.push(Observation::Identity { identity });
            }
        }
        out
    }

    /// Forgets containers gone for longer than `retention`, with everything that pointed at
    /// them (listeners, addresses, connections), so late events resolve until then and
    /// memory stays bounded after.
    pub fn expire(&mut self, now: u64, retention: u64) {
        let expired: HashSet<String> = self
            .containers
            .iter()
            .filter(|(_, c)| {
                c.gone_at
                    .is_some_and(|g| now >= g.saturating_add(retention))
            })
            .map(|(k, _)| k.clone())
            .collect();
        if expired.is_empty() {
            return;
        }
        self.watch_generation += 1;
        self.containers.retain(|k, _| !expired.contains(k));
        self.by_pid.retain(|_, k| !expired.contains(k));
        self.by_cgroup.retain(|_, k| !expired.contains(k));
        self.listeners
            .retain(|_, (k, _)| !expired.contains(k.as_str()));
        self.closed_listeners.retain(|_, k| !expired.contains(k));
        self.by_ip.retain(|_, k| !expired.contains(k));
        self.recent.retain(|_, k| !expired.contains(k.as_str()));
        let sockets = &mut self.sockets;
        sockets.retain(|_, t| !expired.contains(t.key.as_str()));
        self.seeded.retain(|_, id| sockets.contains_key(id));
    }

    #[cfg(test)]
    pub fn host_mut(&mut self) -> &mut H {
        &mut self.host
    }

    /// Whether a running container's listen path was never sampled (found since the last
    /// sample, by a scan or by one of its events).
    pub fn has_unsampled(&self) -> bool {
        self.containers
            .values()
            .any(|c| !c.sampled && c.gone_at.is_none() && c.main_pid.is_some())
    }

    pub fn container_count(&self) -> usize {
        self.containers.len()
    }

    /// Finds running containers (at start-up, then periodically): their processes, main
    /// process, namespace, addresses, listeners and open inbound connections.
    pub fn scan(&mut self) -> Vec<Observation> {
        let mut groups: HashMap<String, (CgroupOwner, String, Vec<u32>)> = HashMap::new();
        for (pid, path) in self.host.container_pids() {
            let Some(owner) = parse_cgroup_path(&path) else {
                continue;
            };
            groups
                .entry(owner.id.clone())
                .or_insert_with(|| (owner, path, Vec::new()))
                .2
                .push(pid);
        }
        let mut out = Vec::new();
        for (key, (owner, path, pids)) in groups {
            // Known, and still the same run: a container restarted in place (same id) has a
            // new PID 1 and is adopted again. A run is its PID 1, not its main process: while
            // the main process exits, a scan may find the init shim alone, which is no restart.
            let known = self.containers.get(&key).is_some_and(|c| {
                let alive = |pid: Option<u32>| pid.is_some_and(|m| pids.contains(&m));
                c.gone_at.is_none() && (alive(c.init_pid) || alive(c.main_pid))
            });
            // Only a container to adopt needs its processes' details.
            let procs: Vec<ProcInfo> = if known {
                Vec::new()
            } else {
                pids.iter().filter_map(|p| self.host.process(*p)).collect()
            };
            // Caught while the runtime creates it, its only processes are about to exit: a
            // later scan or event adopts it once its PID 1 exists.
            let created =
                procs.iter().any(|p| p.ns_pid == Some(1)) || !procs.iter().any(bootstrapping);
            if !known && (procs.is_empty() || !created) {
                continue;
            }
            for pid in &pids {
                self.by_pid.insert(*pid, key.clone());
                self.not_containers.remove(pid);
            }
            if !known {
                out.extend(self.adopt(&key, &owner, &path, &procs));
            }
        }
        out.extend(self.refresh_identities());
        out
    }

    fn adopt(
        &mut self,
        key: &str,
        owner: &CgroupOwner,
        path: &str,
        procs: &[ProcInfo],
    ) -> Vec<Observation> {
        let meta = self.host.metadata(owner);
        let identity = ContainerIdentity {
            id: owner.id.clone(),
            runtime: owner.runtime.as_str().to_string(),
            name: meta.name,
            namespace: meta.namespace,
            pod: meta.pod,
            workload: meta.workload,
            ..Default::default()
        };
        let runtime_identity = identity.clone();
        let identity = self.kube_identity(&identity, owner.pod_uid.as_deref());
        let main = main_process(procs);
        let netns = main.and_then(|p| p.netns);
        let main_pid = main.map(|p| p.pid);
        if let Some(id) = self.host.cgroup_v2_id(path) {
            self.by_cgroup.insert(id, key.to_string());
        }
        self.watch_generation += 1;
        let ips = main_pid.map(|p| self.host.local_ips(p)).unwrap_or_default();
        for ip in &ips {
            self.by_ip.insert(*ip, key.to_string());
        }
        let mut listeners = Vec::new();
        let mut inbound = Vec::new();
        let shared: Key = Arc::new(key.to_string());
        if let (Some(pid), Some(ns)) = (main_pid, netns) {
            // A pod's containers share one namespace: only the sockets this container's
            // processes hold are its own.
            let own: HashSet<u64> = procs
                .iter()
                .flat_map(|p| self.host.socket_inodes(p.pid))
                .collect();
            let socks: Vec<_> = self
                .host
                .sockets(pid)
                .into_iter()
                .filter(|s| own.contains(&s.inode))
                .collect();
            for s in socks.iter().filter(|s| s.listening) {
                self.listeners
                    .insert((ns, s.local.port()), (shared.clone(), s.local));
                listeners.push(s.local);
            }
            let ports: HashSet<u16> = listeners.iter().map(SocketAddr::port).collect();
            for s in socks
                .iter()
                .filter(|s| s.established && ports.contains(&s.local.port()))
            {
                let id = self.next_seed;
                self.next_seed += 1;
                self.seeded.insert((ns, s.local, s.remote), id);
                self.sockets.insert(id, Tracked::new(shared.clone(), None));
                inbound.push(id);
            }
        }
        self.containers.insert(
            key.to_string(),
            Container {
                identity: identity.clone(),
                main_pid,
                init_pid: procs.iter().find(|p| p.ns_pid == Some(1)).map(|p| p.pid),
                netns,
                listener_inodes: HashSet::new(),
                sampled: false,
                gone_at: None,
                runtime_identity,
                pod_uid: owner.pod_uid.clone(),
            },
        );
        vec![Observation::Container {
            identity,
            listeners,
            inbound,
        }]
    }

    /// The container a process belongs to, looking it up (and adopting its container) when
    /// the pid is new.
    fn container_of_pid(&mut self, pid: u32, out: &mut Vec<Observation>) -> Option<String> {
        if let Some(k) = self.by_pid.get(&pid) {
            return Some(k.clone());
        }
        if pid == 0 || self.not_containers.contains(&pid) {
            return None;
        }
        let in_container = self
            .host
            .process(pid)
            .and_then(|p| p.cgroup_path)
            .and_then(|path| parse_cgroup_path(&path))
            .is_some();
        if !in_container {
            self.not_containers.insert(pid);
            return None;
        }
        out.extend(self.scan());
        self.by_pid.get(&pid).cloned()
    }

    fn container_of_task(
        &mut self,
        pid: u32,
        cgroup_id: u64,
        out: &mut Vec<Observation>,
    ) -> Option<String> {
        if let Some(k) = self.by_cgroup.get(&cgroup_id) {
            return Some(k.clone());
        }
        self.container_of_pid(pid, out)
    }

    /// Turns one kernel event into what it means for containers.
    pub fn on_event(&mut self, ev: &Event) -> Vec<Observation> {
        let mut out = Vec::new();
        match ev {
            Event::Signal(s) => {
                let target = u32::try_from(s.target_pid).ok();
                let Some(key) = target.and_then(|t| self.container_of_pid(t, &mut out)) else {
                    return out;
                };
                let sender = self.container_of_task(s.meta.tgid, s.meta.cgroup_id, &mut out);
                if sender.as_deref() != Some(key.as_str()) {
                    out.push(Observation::Signal {
                        key,
                        sig: s.sig,
                        sender: Sender {
                            pid: s.meta.tgid,
                            comm: s.meta.comm.clone(),
                        },
                    });
                }
            }
            Event::Exit(x) => {
                let pid = x.meta.tgid;
                let key = self.by_pid.remove(&pid);
                self.not_containers.remove(&pid);
                self.proxies.remove(&pid);
                let Some(key) = key else { return out };
                let is_main = self.containers.get(&key).and_then(|c| c.main_pid) == Some(pid);
                if is_main {
                    let exit = match x.status {
                        ExitStatus::Exited(code) => ExitInfo {
                            code: Some(code),
                            signal: None,
                        },
                        ExitStatus::Killed { signal, .. } => ExitInfo {
                            code: x.status.shell_code(),
                            signal: Some(signal),
                        },
                        ExitStatus::Unknown => ExitInfo {
                            code: None,
                            signal: None,
                        },
                    };
                    out.push(Observation::Exit { key, exit });
                }
            }
            Event::StateChange(s) => self.on_state(s, &mut out),
            Event::ResetSent(r) => {
                if r.skaddr != 0 {
                    if let Some(key) = self.socket_owner(r.skaddr) {
                        out.push(Observation::ResetSent {
                            key: key.to_string(),
                            reason: r
                                .reason
                                .as_ref()
                                .map_or_else(|| "unknown".into(), ToString::to_string),
                        });
                    }
                } else if let Some(conn) = r.conn {
                    // No socket answered: a SYN to a port nobody listens on (any more).
                    let ns = r.meta.netns;
                    let port = conn.local.port();
                    let open = self.listeners.contains_key(&(ns, port));
                    if !open && let Some(key) = self.closed_listeners.get(&(ns, port)) {
                        out.push(Observation::Refused { key: key.clone() });
                    }
                }
            }
            Event::ResetReceived(r) if state(&r.state) == "TCP_SYN_SENT" => {
                self.refused_attempts.insert(r.skaddr);
            }
            Event::ResetReceived(r) => {
                if let Some(conn) = r.conn
                    && let Some(t) = self.tracked(r.skaddr, r.meta.netns, conn)
                {
                    t.peer_done = true;
                }
            }
            Event::CgroupRemoved(c) => {
                if let Some(owner) = parse_cgroup_path(&c.path)
                    && let Some(container) = self.containers.get_mut(&owner.id)
                {
                    container.gone_at.get_or_insert(c.meta.ts_ns);
                    out.push(Observation::CgroupRemoved { key: owner.id });
                }
            }
            Event::SocketError(_) | Event::ListenOverflow(_) | Event::Accepted(_) => {}
        }
        out
    }

    fn on_state(&mut self, s: &crate::capture::event::StateChange, out: &mut Vec<Observation>) {
        let (old, new) = (state(&s.old), state(&s.new));
        let ns = s.meta.netns;
        let Some(conn) = s.conn else { return };
        if self.on_upstream(s, old, new, conn, out) {
            return;
        }
        if old == "TCP_LISTEN" || new == "TCP_LISTEN" {
            self.watch_generation += 1;
        }
        match (old, new) {
            ("TCP_CLOSE", "TCP_LISTEN") => {
                if let Some(limit) = s.max_ack_backlog {
                    self.backlog_limits.insert((ns, conn.local.port()), limit);
                }
                if let Some(key) = self.container_of_task(s.meta.tgid, s.meta.cgroup_id, out) {
                    self.listeners
                        .insert((ns, conn.local.port()), (Arc::new(key.clone()), conn.local));
                    self.closed_listeners.remove(&(ns, conn.local.port()));
                    out.push(Observation::ListenerOpened {
                        key,
                        addr: conn.local,
                    });
                }
            }
            ("TCP_LISTEN", "TCP_CLOSE") => {
                self.backlog_limits.remove(&(ns, conn.local.port()));
                if let Some((key, addr)) = self.listeners.remove(&(ns, conn.local.port())) {
                    self.closed_listeners
                        .insert((ns, addr.port()), key.to_string());
                    out.push(Observation::ListenerClosed {
                        key: key.to_string(),
                        addr,
                    });
                }
            }
            ("TCP_SYN_RECV", "TCP_ESTABLISHED") => {
                if let Some((key, _)) = self.listeners.get(&(ns, conn.local.port())) {
                    let key = key.clone();
                    out.push(Observation::InboundEstablished {
                        key: key.to_string(),
                        sock: s.skaddr,
                    });
                    self.sockets.insert(
                        s.skaddr,
                        Tracked::new(key, Some((s.meta.ts_ns, conn.local.port()))),
                    );
                }
            }
            ("TCP_SYN_SENT", "TCP_CLOSE") => {
                // An attempt that never connected and was not refused: to a gone container's
                // address, unreachable.
                if self.refused_attempts.remove(&s.skaddr) {
                    return;
                }
                if let Some(key) = self.by_ip.get(&conn.remote.ip()) {
                    out.push(Observation::Unreachable { key: key.clone() });
                }
            }
            ("TCP_ESTABLISHED", "TCP_CLOSE_WAIT") => {
                if let Some(t) = self.tracked(s.skaddr, ns, conn) {
                    t.peer_done = true;
                }
            }
            ("TCP_ESTABLISHED", _) | ("TCP_CLOSE_WAIT", _) => {
                let Some(t) = self.tracked(s.skaddr, ns, conn).cloned() else {
                    return;
                };
                self.sockets.remove(&s.skaddr);
                self.remember_closed(s.skaddr, &t.key);
                let by_container = !t.peer_done && old == "TCP_ESTABLISHED";
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

    const RECENT: usize = 8192;

    /// The proxy a process is, if it is one: it holds a listening socket. Named by its
    /// container's workload, or its command outside containers.
    fn proxy(&mut self, tgid: u32, comm: &str) -> Option<Proxy> {
        if let Some(p) = self.proxies.get(&tgid) {
            return p.clone();
        }
        let own: HashSet<u64> = self.host.socket_inodes(tgid).into_iter().collect();
        let listens = !own.is_empty()
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
        });
        self.proxies.insert(tgid, p.clone());
        p
    }

    /// Follows proxies' connections to containers; true when the state change was one.
    fn on_upstream(
        &mut self,
        s: &crate::capture::event::StateChange,
        old: &str,
        new: &str,
        conn: crate::capture::event::Endpoints,
        out: &mut Vec<Observation>,
    ) -> bool {
        match (old, new) {
            ("TCP_CLOSE", "TCP_SYN_SENT") => {
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
                self.upstreams.insert(s.skaddr, up);
                out.push(Observation::UpstreamOpened {
                    key,
                    sock: s.skaddr,
                    proxy,
                });
                true
            }
            ("TCP_SYN_SENT", "TCP_ESTABLISHED") => {
                let Some(up) = self.upstreams.get(&s.skaddr).cloned() else {
                    return false;
                };
                let tuple = (conn.local, conn.remote);
                if self.upstream_by_tuple.insert(tuple, up).is_none() {
                    self.upstream_order.push_back(tuple);
                }
                while self.upstream_order.len() > Self::RECENT {
                    if let Some(old) = self.upstream_order.pop_front() {
                        self.upstream_by_tuple.remove(&old);
                    }
                }
                true
            }
            (_, "TCP_CLOSE_WAIT") => self.upstreams.contains_key(&s.skaddr),
            ("TCP_SYN_SENT", _) | ("TCP_ESTABLISHED", _) | ("TCP_CLOSE_WAIT", _) => {
                let Some(up) = self.upstreams.remove(&s.skaddr) else {
                    return false;
                };
                out.push(Observation::UpstreamClosed {
                    key: up.key,
                    sock: up.sock,
                    bytes_sent: s.counters.bytes_sent,
                });
                // A failed attempt goes on to be judged refused or unreachable below.
                !(old == "TCP_SYN_SENT" && new == "TCP_CLOSE")
            }
            _ => false,
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

    /// RSTs on containers' connections, for the steady-state reset metric: (container,
    /// direction, reason). Resets received carry no reason in the kernel.
    pub fn resets(&self, ev: &Event) -> Vec<(ContainerIdentity, &'static str, String)> {
        let (skaddr, direction, reason) = match ev {
            Event::ResetSent(r) if r.skaddr != 0 => (
                r.skaddr,
                "sent",
                r.reason
                    .as_ref()
                    .map_or_else(|| "unknown".into(), ToString::to_string),
            ),
            Event::ResetReceived(r) => (r.skaddr, "received", "none".to_string()),
            _ => return Vec::new(),
        };
        self.socket_owner(skaddr)
            .and_then(|k| self.containers.get(k.as_str()))
            .map(|c| vec![(c.identity.clone(), direction, reason)])
            .unwrap_or_default()
    }

    /// What an event says about one of a container's listeners, for the per-listener metrics.
    pub fn listener_fact(&mut self, ev: &Event) -> Option<ListenerFact> {
        let (key, port, what) = match ev {
            // The accept() that took a queued connection: how long it waited.
            Event::Accepted(a) => {
                let t = self.sockets.get_mut(&a.skaddr)?;
                let (at, port) = t.take_queued()?;
                let waited = a.meta.ts_ns.checked_sub(at)? as f64 / 1e9;
                (t.key.clone(), port, Fact::AcceptWait(waited))
            }
            // A handshake completed on one of its listeners.
            Event::StateChange(s)
                if state(&s.old) == "TCP_SYN_RECV" && state(&s.new) == "TCP_ESTABLISHED" =>
            {
                let t = self.sockets.get(&s.skaddr)?;
                let (_, port) = t.queued()?;
                (t.key.clone(), port, Fact::Arrival)
            }
            Event::ListenOverflow(o) => {
                let port = o.listener?.port();
                let (key, _) = self.listeners.get(&(o.meta.netns, port))?;
                (key.clone(), port, Fact::Overflow)
            }
            _ => return None,
        };
        let c = self.containers.get(key.as_str())?;
        Some(ListenerFact {
            container: c.identity.clone(),
            port,
            fact: what,
        })
    }

    /// Samples the listen path from procfs: each listener's accept queue (depth and limit) and
    /// each network namespace's listen counters. `only` restricts the sample to some workloads'
    /// containers, plus those never sampled yet, and reuses the listener sockets the last
    /// full sample found, so a fast sample reads a few small files per container and walks no
    /// descriptors except a new container's.
    pub fn sample_listen_path(&mut self, only: Option<&HashSet<Workload>>) -> ListenSample {
        let mut out = ListenSample::default();
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
        let mut namespaces = HashSet::new();
        let mut counters = Vec::new();
        for key in keys {
            let Some(c) = self.containers.get_mut(&key) else {
                continue;
            };
            let Some(pid) = c.main_pid else { continue };
            c.sampled = true;
            let socks = self.host.listeners(pid);
            // A container adopted since the last full sample (a replacement) has none yet.
            if only.is_none() || c.listener_inodes.is_empty() {
                let own: HashSet<u64> = self.host.socket_inodes(pid).into_iter().collect();
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
                let limit = c.netns.and_then(|ns| self.backlog_limits.get(&(ns, port)));
                out.queues
                    .push((c.identity.clone(), port, s.rx_queue, limit.copied()));
            }
            // A pod's containers share one namespace: its counters go under the first
            // container (by name) that listens in it.
            let owns = !c.listener_inodes.is_empty();
            if let Some(ns) = c.netns {
                counters.push((owns, ns, pid, c.identity.clone()));
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
                Err(e) => out.errors.push(e),
            }
        }
        out
    }

    /// The id the tracker knows a connection by.
    fn sock_id(&mut self, skaddr: u64) -> u64 {
        self.adopted.remove(&skaddr).unwrap_or(skaddr)
    }

    /// A followed socket by kernel address, adopting one a scan found by its 4-tuple.
    fn tracked(
        &mut self,
        skaddr: u64,
        ns: u32,
        conn: crate::capture::event::Endpoints,
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

/// The process a container is about: its init, or the init's first child when the init is a
/// shim that only forwards signals.
fn main_process(procs: &[ProcInfo]) -> Option<&ProcInfo> {
    let init = procs.iter().find(|p| p.ns_pid == Some(1));
    match init {
        Some(i) if INIT_SHIMS.contains(&i.comm.as_str()) => procs
            .iter()
            .filter(|p| p.ppid == i.pid)
            .min_by_key(|p| p.pid)
            .or(Some(i)),
        Some(i) => Some(i),
        None => procs.iter().min_by_key(|p| p.pid),
    }
}
