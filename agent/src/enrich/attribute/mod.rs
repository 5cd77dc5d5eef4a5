//! Attribution: which container each kernel event belongs to, turned into the observations
//! the correlator consumes. Process-context events (signals, exits, listen(), close()) are
//! attributed by process; packet-path events (a RST answering a SYN to a closed port, a
//! handshake completing) by network namespace, address and port, never by the current task.
//!
//! One [`Enricher`], its jobs in files of their own: `containers` (finding and naming them),
//! `processes` (which of a container's processes is its main one), `sockets` (their inbound
//! connections), `resets` (every RST and refused connect of their namespaces), `upstreams`
//! (proxies' connections to them), `listeners` (the accept path) and `watch` (what the kernel
//! filter must keep).

mod containers;
mod listeners;
mod processes;
mod refusals;
mod resets;
mod sockets;
mod upstreams;
mod watch;

use listeners::Listeners;
use refusals::Refusals;
use resets::Unowned;
use sockets::Sockets;
use upstreams::Upstreams;

use std::{net::IpAddr, sync::Arc};

use super::{
    cgroup_path::{Runtime, parse_cgroup_path},
    host::HostView,
    kube::SharedStore,
    nat::{Nat, NatOutcome},
};
use crate::{
    capture::{
        event::{Event, ExitStatus},
        hooks::signal_generate::Delivery,
        jiffies::JiffyClock,
    },
    model::{
        ContainerIdentity, ExitInfo, HashMap, HashSet, Observation, Sender,
        state::{StateMap, StateStat, make_room_in_set},
        stop::IgnoredSignal,
    },
};

#[derive(Debug, Default)]
struct Container {
    /// Shared with the observations that name it (resets, listener facts).
    identity: Arc<ContainerIdentity>,
    main_pid: Option<u32>,
    /// The container's PID 1 (an init shim or the main process itself).
    init_pid: Option<u32>,
    /// The main process is the init shim itself, for lack of a child when it was adopted: each
    /// scan looks for the entrypoint the shim starts.
    shim_as_main: bool,
    netns: Option<u32>,
    /// Its namespace's cookie (0: not known yet), from a record of its own processes or
    /// listeners (procfs shows the inode only): tells its namespace from a later one that
    /// reuses the inode (see `model::netns`).
    netns_cookie: u64,
    /// Its listening sockets' inodes, as its descriptors last said.
    listener_inodes: HashSet<u64>,
    /// Every listening inode of its namespace (sorted) when its descriptors were last read.
    listening_seen: Option<Vec<u64>>,
    /// Whether its listen path was sampled yet: the first sample is a storm's baseline.
    sampled: bool,
    /// When its cgroup was removed (kernel monotonic ns).
    gone_at: Option<u64>,
    /// The identity the runtime's state gave it, before the Kubernetes API's names.
    runtime_identity: ContainerIdentity,
    /// The pod uid its cgroup path names, for the sandbox (whose id no pod status lists).
    pod_uid: Option<String>,
    cgroup_path: String,
    /// Its main process exited (a restart in place adopts it again: see `recheck_ended`).
    run_ended: bool,
    rechecked_at: crate::model::Mono,
    /// When a new run's PID 1 started, found before the run could be adopted.
    next_run_at: Option<crate::model::Mono>,
    /// Since when scans have found none of its processes (its cgroup's removal unseen).
    missing_since: Option<crate::model::Mono>,
}

/// A container id shared by what points at the container many times over (its connections,
/// the observations about them): one allocation per listener instead of a 64-byte String per
/// connection.
type Key = crate::model::observation::ContainerKey;

/// Caps of the collections that shrink only at an event (a close, an exit): one lost on the
/// way would leave its entry behind for good. Far above what a node holds.
const MAX_UPSTREAMS: usize = 65_536;
const MAX_INBOUND: usize = 262_144;
const MAX_REFUSED_ATTEMPTS: usize = 65_536;
/// Connects to containers in flight (from their SYN to their next step).
const MAX_CONNECTING: usize = 65_536;
const MAX_NOT_CONTAINERS: usize = 65_536;
/// Unseen containers remembered, so that each (and each of its hierarchies' removals) counts
/// once.
const MAX_UNSEEN: usize = 4096;

/// What those caps dropped.
#[derive(Debug, Default)]
struct Dropped {
    upstreams: u64,
    inbound: u64,
    refused_attempts: u64,
    connecting: u64,
    not_containers: u64,
}

pub struct Enricher<H> {
    host: H,
    /// Boxed: a `Container` is about 450 bytes and a map of 1,000 has 2,048 slots, half empty.
    containers: HashMap<String, Box<Container>>,
    by_pid: HashMap<u32, String>,
    by_cgroup: HashMap<u64, String>,
    by_ip: HashMap<IpAddr, Key>,
    listeners: Listeners,
    sockets: Sockets,
    upstreams: Upstreams,
    refusals: Refusals,
    unowned_rsts: Unowned,
    /// Pids known not to be in any container (until they exit).
    not_containers: HashSet<u32>,
    /// Containers whose cgroup went before any of their processes was seen (their whole life
    /// between two scans, their processes gone before their first event got here): no record
    /// can be made of them, so they are counted (`unseen_containers`), each once.
    unseen: HashSet<String>,
    unseen_total: u64,
    /// Pod metadata from the Kubernetes API, when it is used.
    kube: Option<SharedStore>,
    /// The store's generation the identities were last checked against.
    kube_generation: Option<u64>,
    /// The host's network namespace, where only traffic touching a container is captured.
    host_netns: Option<u32>,
    /// Bumped whenever addresses or listeners behind `watch_set` may have changed.
    watch_generation: u64,
    /// The first scan is done: containers adopted from now on started while the agent ran.
    scanned: bool,
    /// The kernel's tick, for how long a closing connection had been quiet.
    jiffies: JiffyClock,
    /// Where failed connects to addresses no container has were really sent (Services).
    nat: Nat,
    dropped: Dropped,
}

impl<H: HostView> Enricher<H> {
    pub fn new(host: H) -> Self {
        Self {
            host,
            containers: HashMap::default(),
            by_pid: HashMap::default(),
            by_cgroup: HashMap::default(),
            by_ip: HashMap::default(),
            listeners: Listeners::default(),
            sockets: Sockets::default(),
            upstreams: Upstreams::default(),
            refusals: Refusals::default(),
            unowned_rsts: Unowned::default(),
            not_containers: HashSet::default(),
            unseen: HashSet::default(),
            unseen_total: 0,
            kube: None,
            kube_generation: None,
            host_netns: None,
            watch_generation: 0,
            scanned: false,
            jiffies: JiffyClock::default(),
            nat: Nat::default(),
            dropped: Dropped::default(),
        }
    }

    /// Failed connects to addresses no container has are looked up through `nat`.
    pub fn with_nat(mut self, nat: Nat) -> Self {
        self.nat = nat;
        self
    }

    /// `drainwatch_nat_lookups_total`: empty when no lookup can be made.
    pub fn nat_lookups(&self) -> Vec<(NatOutcome, u64)> {
        self.nat.counts()
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
            .open
            .retain(|_, (k, ..)| !expired.contains(k.as_str()));
        self.listeners
            .closed
            .retain(|_, (k, ..)| !expired.contains(k.as_str()));
        self.listeners
            .reserved
            .retain(|_, (k, ..)| !expired.contains(k.as_str()));
        self.by_ip.retain(|_, k| !expired.contains(k.as_str()));
        self.sockets
            .recent
            .retain(|_, (k, _)| !expired.contains(k.as_str()));
        self.sockets.retain(|k| !expired.contains(k.as_str()));
    }

    /// Its capped collections, for `drainwatch_state_*`.
    pub fn state(&self) -> Vec<StateStat> {
        let stat = |map, entries, capacity, dropped| StateStat {
            map,
            entries,
            capacity,
            dropped,
        };
        let d = &self.dropped;
        vec![
            stat(
                StateMap::Upstreams,
                self.upstreams.open.len(),
                MAX_UPSTREAMS,
                d.upstreams,
            ),
            stat(
                StateMap::InboundSockets,
                self.sockets.tracked.len(),
                MAX_INBOUND,
                d.inbound,
            ),
            stat(
                StateMap::RefusedAttempts,
                self.sockets.refused_attempts.len(),
                MAX_REFUSED_ATTEMPTS,
                d.refused_attempts,
            ),
            stat(
                StateMap::Connecting,
                self.sockets.connecting.len(),
                MAX_CONNECTING,
                d.connecting,
            ),
            stat(
                StateMap::NotContainers,
                self.not_containers.len(),
                MAX_NOT_CONTAINERS,
                d.not_containers,
            ),
        ]
    }

    /// Containers whose cgroup went before any of their processes was seen, in all.
    pub fn unseen_containers(&self) -> u64 {
        self.unseen_total
    }

    /// Refusals that waited long enough for an attempt on this node to claim them (see
    /// `refusals`); called with the periodic work.
    pub fn flush(&mut self, now: u64) -> Vec<Observation> {
        let mut out = Vec::new();
        self.refusals.flush(now, &mut out);
        out
    }

    #[cfg(test)]
    pub fn host_mut(&mut self) -> &mut H {
        &mut self.host
    }

    /// A pod's sandbox (`POD`) in namespace `ns`, holding `ip`, adopted as a scan would.
    #[cfg(test)]
    pub fn add_test_sandbox(&mut self, id: &str, ns: u32, ip: IpAddr) {
        let identity = ContainerIdentity {
            id: id.into(),
            name: crate::model::SANDBOX_NAME.into(),
            pod: "web-7d9f8b6c5d-x2x7q".into(),
            ..Default::default()
        };
        self.claim_address(ip, &Key::new(id.into()), &identity);
        self.add_test_member(identity, ns);
    }

    /// A container in namespace `ns` with nothing else known (a pod's sidecar).
    #[cfg(test)]
    pub fn add_test_container(&mut self, id: &str, ns: u32) {
        let identity = ContainerIdentity {
            id: id.into(),
            name: id.into(),
            ..Default::default()
        };
        self.add_test_member(identity, ns);
    }

    #[cfg(test)]
    fn add_test_member(&mut self, identity: ContainerIdentity, ns: u32) {
        self.containers.insert(
            identity.id.clone(),
            Box::new(Container {
                identity: Arc::new(identity),
                netns: Some(ns),
                ..Default::default()
            }),
        );
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

    /// Containers whose cgroup is still there.
    pub fn running_containers(&self) -> usize {
        self.containers
            .values()
            .filter(|c| c.gone_at.is_none())
            .count()
    }

    /// Turns one kernel event into what it means for containers: the one place events are
    /// matched.
    pub fn on_event(&mut self, ev: &Event) -> Vec<Observation> {
        let mut out = Vec::new();
        self.on_event_into(ev, &mut out);
        out
    }

    /// [`Self::on_event`] into a buffer the caller keeps (no allocation per event).
    pub fn on_event_into(&mut self, ev: &Event, out: &mut Vec<Observation>) {
        self.refusals.event_at(ev.meta().ts_ns);
        match ev {
            Event::Signal(s) => {
                let target = u32::try_from(s.target_pid).ok();
                let Some(key) = target.and_then(|t| self.container_of_pid(t, out)) else {
                    return;
                };
                // A stop is a signal to the container's main process or its init: one to any
                // other of its processes (an exec probe the runtime kills, a worker) is not.
                let aimed = self.containers.get(&key).is_some_and(|c| {
                    let main = [c.main_pid, c.init_pid];
                    main.iter().all(Option::is_none) || main.contains(&target)
                });
                let sender = self.container_of_task(s.meta.tgid, s.meta.cgroup_id, out);
                if aimed && sender.as_deref() != Some(key.as_str()) {
                    let to_init = self.containers.get(&key).and_then(|c| c.init_pid) == target;
                    let ignored = (s.result == Delivery::Ignored).then_some(if to_init {
                        IgnoredSignal::Pid1WithoutHandler
                    } else {
                        IgnoredSignal::IgnoredByProcess
                    });
                    out.push(Observation::Signal {
                        key: key.into(),
                        sig: s.sig,
                        ignored,
                        sender: Sender {
                            pid: s.meta.tgid,
                            comm: s.meta.comm.to_string(),
                        },
                    });
                }
            }
            Event::Exit(x) => {
                let pid = x.meta.tgid;
                let key = self.by_pid.remove(&pid);
                self.not_containers.remove(&pid);
                if self
                    .upstreams
                    .proxies
                    .remove(&pid)
                    .is_some_and(|p| p.is_ok())
                {
                    self.watch_generation += 1; // the kernel's proxy map
                }
                let Some(key) = key else { return };
                let is_main = self.containers.get(&key).and_then(|c| c.main_pid) == Some(pid);
                if is_main && self.successor(&key, pid).is_none() {
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
                    if let Some(c) = self.containers.get_mut(&key) {
                        c.run_ended = true;
                    }
                    out.push(Observation::Exit {
                        key: key.into(),
                        exit,
                    });
                }
            }
            Event::StateChange(s) => self.on_state(s, out),
            Event::ResetSent(r) => self.reset_sent(r, out),
            Event::ResetReceived(r) => self.reset_received(r, out),
            Event::CgroupRemoved(c) => {
                // By path, else (a path cut at the record's 256 bytes, a nesting the parser
                // does not know) by the v2 cgroup id the container was adopted with.
                let owner = parse_cgroup_path(&c.path);
                let key = owner
                    .as_ref()
                    .map(|o| o.id.clone())
                    .filter(|k| self.containers.contains_key(k))
                    .or_else(|| (c.hierarchy == 0).then(|| self.by_cgroup.get(&c.id).cloned())?);
                if let Some(key) = key
                    && let Some(container) = self.containers.get_mut(&key)
                {
                    container.gone_at.get_or_insert(c.meta.ts_ns);
                    out.push(Observation::CgroupRemoved { key: key.into() });
                } else if let Some(o) = owner.filter(|o| o.runtime != Runtime::Systemd)
                    && !self.unseen.contains(&o.id)
                {
                    tracing::debug!(id = %o.id, "a container's cgroup went before any of its processes was seen");
                    make_room_in_set(&mut self.unseen, MAX_UNSEEN, &o.id, &mut 0);
                    self.unseen.insert(o.id);
                    self.unseen_total += 1;
                }
            }
            Event::Accepted(a) => self.accepted(a, out),
            Event::ListenOverflow(o) => self.overflow(o, out),
            Event::UpstreamIo(io) => self.upstream_io(io, out),
            Event::SocketError(_) => {}
        }
    }
}
