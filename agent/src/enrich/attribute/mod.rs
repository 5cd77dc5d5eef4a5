//! Attribution: which container each kernel event belongs to, turned into the observations
//! the correlator consumes. Process-context events (signals, exits, listen(), close()) are
//! attributed by process; packet-path events (a RST answering a SYN to a closed port, a
//! handshake completing) by network namespace, address and port, never by the current task.
//!
//! One [`Enricher`], its jobs in files of their own: `containers` (finding and naming them),
//! `sockets` (their inbound connections), `upstreams` (proxies' connections to them),
//! `listeners` (the accept path) and `watch` (what the kernel filter must keep).

mod containers;
mod listeners;
mod sockets;
mod upstreams;
mod watch;

use std::{
    collections::{HashMap, HashSet},
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use super::{cgroup_path::parse_cgroup_path, host::HostView, kube::SharedStore};
use crate::{
    capture::event::{Event, ExitStatus},
    model::{
        ContainerIdentity, ExitInfo, Mono, Observation, Proxy, ResetDirection, Sender, TcpState,
    },
};

/// A proxy's connection to a container.
#[derive(Debug, Clone)]
pub(super) struct Upstream {
    pub(super) sock: u64,
    pub(super) key: String,
    pub(super) proxy: Proxy,
    pub(super) opened_at: Mono,
}

#[derive(Debug, Default)]
pub(super) struct Container {
    /// Shared with the observations that name it (resets, listener facts).
    pub(super) identity: Arc<ContainerIdentity>,
    pub(super) main_pid: Option<u32>,
    /// The container's PID 1 (an init shim or the main process itself).
    pub(super) init_pid: Option<u32>,
    pub(super) netns: Option<u32>,
    /// Its listening sockets' inodes as of the last full listen-path sample.
    pub(super) listener_inodes: HashSet<u64>,
    /// Whether its listen path was sampled yet: the first sample is a storm's baseline.
    pub(super) sampled: bool,
    /// When its cgroup was removed (kernel monotonic ns).
    pub(super) gone_at: Option<u64>,
    /// The identity the runtime's state gave it, before the Kubernetes API's names.
    pub(super) runtime_identity: ContainerIdentity,
    /// The pod uid its cgroup path names, for the sandbox (whose id no pod status lists).
    pub(super) pod_uid: Option<String>,
}

/// A container id shared by what points at the container many times over (its connections):
/// one allocation per listener instead of a 64-byte String per connection. `Arc<String>`
/// rather than `Arc<str>`: a thin pointer, 8 bytes less in every connection's entry.
pub(super) type Key = Arc<String>;

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

pub struct Enricher<H> {
    pub(super) host: H,
    pub(super) containers: HashMap<String, Container>,
    pub(super) by_pid: HashMap<u32, String>,
    pub(super) by_cgroup: HashMap<u64, String>,
    /// Open listeners: (netns, port) → owner and address.
    pub(super) listeners: HashMap<(u32, u16), (Key, SocketAddr)>,
    /// Listeners that were closed: (netns, port) → former owner.
    pub(super) closed_listeners: HashMap<(u32, u16), String>,
    /// Accept-queue limits of listeners opened while the agent ran: (netns, port) → limit.
    pub(super) backlog_limits: HashMap<(u32, u16), u32>,
    pub(super) sockets: HashMap<u64, Tracked>,
    /// Inbound connections found by a scan (no kernel address yet): (netns, local, remote) → id.
    pub(super) seeded: HashMap<(u32, SocketAddr, SocketAddr), u64>,
    /// Kernel address → the id a scan gave the same connection before its first event.
    pub(super) adopted: HashMap<u64, u64>,
    pub(super) next_seed: u64,
    pub(super) by_ip: HashMap<IpAddr, String>,
    /// Open connections from proxy processes to containers, by kernel address.
    pub(super) upstreams: HashMap<u64, Upstream>,
    /// The same, by (proxy's local, container's) address, kept a while after they close:
    /// how the container side of a cut finds the proxy.
    pub(super) upstream_by_tuple: HashMap<(SocketAddr, SocketAddr), Upstream>,
    pub(super) upstream_order: std::collections::VecDeque<(SocketAddr, SocketAddr)>,
    /// Whether a process is a proxy (it holds a listening socket), cached until it exits.
    pub(super) proxies: HashMap<u32, Option<Proxy>>,
    /// Connect attempts answered with RST: refused (counted from the RST), not unreachable.
    pub(super) refused_attempts: HashSet<u64>,
    /// Connections closed recently, for a RST the kernel sends after the state change.
    pub(super) recent: HashMap<u64, Key>,
    pub(super) recent_order: std::collections::VecDeque<u64>,
    /// Pids known not to be in any container (until they exit).
    pub(super) not_containers: HashSet<u32>,
    /// Pod metadata from the Kubernetes API, when it is used.
    pub(super) kube: Option<SharedStore>,
    /// The store's generation the identities were last checked against.
    pub(super) kube_generation: Option<u64>,
    /// The host's network namespace, where only traffic touching a container is captured.
    pub(super) host_netns: Option<u32>,
    /// Bumped whenever addresses or listeners behind `watch_set` may have changed.
    pub(super) watch_generation: u64,
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

    /// Turns one kernel event into what it means for containers: the one place events are
    /// matched.
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
                    let reason = r
                        .reason
                        .as_ref()
                        .map_or_else(|| "unknown".into(), ToString::to_string);
                    self.reset(r.skaddr, ResetDirection::Sent, reason, &mut out);
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
            Event::ResetReceived(r) => {
                if r.state == Some(TcpState::SynSent) {
                    self.refused_attempts.insert(r.skaddr);
                } else if let Some(conn) = r.conn
                    && let Some(t) = self.tracked(r.skaddr, r.meta.netns, conn)
                {
                    t.peer_done = true;
                }
                self.reset(r.skaddr, ResetDirection::Received, "none".into(), &mut out);
            }
            Event::CgroupRemoved(c) => {
                if let Some(owner) = parse_cgroup_path(&c.path)
                    && let Some(container) = self.containers.get_mut(&owner.id)
                {
                    container.gone_at.get_or_insert(c.meta.ts_ns);
                    out.push(Observation::CgroupRemoved { key: owner.id });
                }
            }
            Event::Accepted(a) => self.accepted(a, &mut out),
            Event::ListenOverflow(o) => self.overflow(o, &mut out),
            Event::SocketError(_) => {}
        }
        out
    }
}
