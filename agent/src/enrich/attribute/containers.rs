//! Containers: found from the processes' cgroups (at start-up, every second, and when an
//! event names a pid not seen yet), adopted with their main process, namespace, addresses,
//! listeners and open connections, and named from the runtime's state or the Kubernetes API.

use std::{
    net::{IpAddr, SocketAddr},
    ops::Not,
    sync::Arc,
};

use super::{
    Container, Enricher, Key, MAX_NOT_CONTAINERS,
    processes::{bootstrapping, is_shim, main_process},
};
use crate::model::state::make_room_in_set;
use crate::{
    enrich::{
        cgroup_path::{CgroupOwner, parse_cgroup_path},
        host::{HostView, ProcInfo},
        kube::{self, SharedStore},
    },
    model::{ContainerIdentity, HashMap, HashSet, Mono, Observation},
};

/// A container none of whose processes scans found for this long, its cgroup's removal
/// unseen, is gone.
const VANISH_AFTER: Mono = 30 * crate::model::SECOND;

/// How often a refusal may make the enricher look whether an ended container restarted.
const RECHECK: Mono = 10_000_000;

impl<H: HostView> Enricher<H> {
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
            if identity != *c.identity {
                c.identity = Arc::new(identity.clone());
                out.push(Observation::Identity {
                    identity: Box::new(identity),
                });
            }
        }
        out
    }

    /// Finds running containers (at start-up, then periodically): their processes, main
    /// process, namespace, addresses, listeners and open inbound connections.
    pub fn scan(&mut self) -> Vec<Observation> {
        let mut groups: HashMap<String, (CgroupOwner, String, Vec<u32>)> = HashMap::default();
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
        let now = self.refusals.event_time();
        self.reconcile(&groups, now, &mut out);
        for (key, (owner, path, pids)) in groups {
            self.scan_group(key, &owner, &path, &pids, &mut out);
        }
        out.extend(self.refresh_identities());
        self.scanned = true;
        self.replay_unowned(now, &mut out);
        out
    }

    /// What the scan says no longer exists: pids no container holds any more leave
    /// `by_pid`; a container none of whose processes was found for [`VANISH_AFTER`], and whose
    /// cgroup's removal was never seen, is gone.
    fn reconcile(
        &mut self,
        groups: &HashMap<String, (CgroupOwner, String, Vec<u32>)>,
        now: Mono,
        out: &mut Vec<Observation>,
    ) {
        // Main processes and inits stay until their exit event, which may still be on its way
        // (its process already gone from /proc): it is what ends their stop.
        let mut keep: HashSet<u32> = groups.values().flat_map(|g| g.2.iter().copied()).collect();
        keep.extend(
            self.containers
                .values()
                .flat_map(|c| [c.main_pid, c.init_pid])
                .flatten(),
        );
        self.by_pid.retain(|pid, _| keep.contains(pid));
        for (key, c) in self.containers.iter_mut() {
            if c.gone_at.is_some() || groups.contains_key(key) {
                c.missing_since = None;
                continue;
            }
            let since = *c.missing_since.get_or_insert(now);
            if now >= since.saturating_add(VANISH_AFTER) {
                c.gone_at = Some(now);
                out.push(Observation::Vanished {
                    key: key.clone().into(),
                });
            }
        }
    }

    /// One container's processes, as a scan found them: adopted when new or restarted.
    fn scan_group(
        &mut self,
        key: String,
        owner: &CgroupOwner,
        path: &str,
        pids: &[u32],
        out: &mut Vec<Observation>,
    ) {
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
        let created = procs.iter().any(|p| p.ns_pid == Some(1)) || !procs.iter().any(bootstrapping);
        if !known && (main_process(&procs).is_none() || !created) {
            return;
        }
        for pid in pids {
            self.by_pid.insert(*pid, key.clone());
            self.not_containers.remove(pid);
        }
        if !known {
            out.extend(self.adopt(&key, owner, path, &procs));
        } else if self.containers.get(&key).is_some_and(|c| c.shim_as_main) {
            // Adopted while its init shim had not started the entrypoint yet: the shim
            // stood in as the main process until now.
            let procs: Vec<ProcInfo> = pids.iter().filter_map(|p| self.host.process(*p)).collect();
            if let Some(main) = main_process(&procs).filter(|m| is_shim(m).not()) {
                let main = (main.pid, main.netns);
                self.replace_main(&key, main);
            }
        }
    }

    /// Whether a container whose run ended (its main process exited) has been restarted in
    /// place since: its cgroup alone is read, at most every `RECHECK` of event time, so that
    /// a refusal in the gap goes to the new run's start and not the old one's stop.
    pub(super) fn recheck_ended(&mut self, key: &str, now: Mono, out: &mut Vec<Observation>) {
        let Some(c) = self.containers.get_mut(key) else {
            return;
        };
        if !c.run_ended || now < c.rechecked_at.saturating_add(RECHECK) {
            return;
        }
        c.rechecked_at = now;
        let path = c.cgroup_path.clone();
        let Some(owner) = parse_cgroup_path(&path) else {
            return;
        };
        let pids = self.host.cgroup_pids(&path);
        if pids.is_empty() {
            return;
        }
        self.scan_group(key.to_string(), &owner, &path, &pids, out);
        // Not adopted yet (its PID 1 is still the runtime's, before its exec): the new run
        // has started all the same, when that PID 1 did.
        let old_init = match self.containers.get(key) {
            Some(c) if c.run_ended && c.next_run_at.is_none() => c.init_pid,
            _ => return,
        };
        let pid1 = pids.iter().copied().find(|p| {
            Some(*p) != old_init && self.host.process(*p).is_some_and(|i| i.ns_pid == Some(1))
        });
        let at = pid1.and_then(|p| self.host.start_ns(p));
        if let Some(c) = self.containers.get_mut(key) {
            c.next_run_at = at;
            if let Some(at) = at {
                let identity = Arc::clone(&c.identity);
                self.refusals.reassign(key, at, &identity);
            }
        }
    }

    /// When a container's main process exits while its init shim lives on with another child
    /// (an entrypoint that forked the real server and exited, a wrapper script), that child
    /// is the main process now and the exit is not the container's. `None`: it is.
    pub(super) fn successor(&mut self, key: &str, exited: u32) -> Option<u32> {
        let init = self
            .containers
            .get(key)?
            .init_pid
            .filter(|i| *i != exited)?;
        if !self.host.process(init).is_some_and(|p| is_shim(&p)) {
            return None;
        }
        let next = self
            .host
            .container_pids()
            .into_iter()
            .filter(|(pid, path)| {
                *pid != exited && parse_cgroup_path(path).is_some_and(|o| o.id == key)
            })
            .filter_map(|(pid, _)| self.host.process(pid))
            .filter(|p| p.ppid == init && !bootstrapping(p))
            .min_by_key(|p| p.pid)?;
        let main = (next.pid, next.netns);
        self.by_pid.insert(next.pid, key.to_string());
        self.replace_main(key, main);
        Some(main.0)
    }

    /// A new main process: its listeners are sampled afresh.
    fn replace_main(&mut self, key: &str, (pid, netns): (u32, Option<u32>)) {
        if let Some(c) = self.containers.get_mut(key) {
            tracing::debug!(container = %c.identity.name, from = ?c.main_pid, to = pid, "main process");
            c.main_pid = Some(pid);
            c.shim_as_main = false;
            if netns.is_some_and(|n| c.netns != Some(n)) {
                c.netns_cookie = 0;
            }
            c.netns = netns.or(c.netns);
            c.listener_inodes.clear();
            c.listening_seen = None;
            c.sampled = false;
        }
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
        let restart = self.containers.contains_key(key);
        let init_pid = procs.iter().find(|p| p.ns_pid == Some(1)).map(|p| p.pid);
        let run_started = init_pid
            .or(main.map(|m| m.pid))
            .and_then(|p| self.host.start_ns(p));
        if restart {
            // Its listeners of the run before: refusals there from this run's start on are
            // its start's (those before, seen late, still the old run's stop's).
            let closed: Vec<(u32, u16)> = self
                .listeners
                .closed
                .iter()
                .filter(|(_, (k, ..))| k.as_str() == key)
                .map(|(at, _)| *at)
                .collect();
            if let (Some(since), Some(c)) = (run_started, self.containers.get(key)) {
                let identity = Arc::clone(&c.identity);
                self.refusals.reassign(key, since, &identity);
            }
            for at in closed {
                if let Some((k, _, cookie)) = self.listeners.closed.remove(&at) {
                    self.listeners
                        .reserved
                        .insert(at, (k, run_started.unwrap_or(0), cookie));
                }
            }
        }
        tracing::debug!(
            container = %identity.name,
            main = ?main.map(|p| (p.pid, &p.comm)),
            processes = ?procs.iter().map(|p| (p.pid, p.ns_pid, &p.comm)).collect::<Vec<_>>(),
            "container adopted"
        );
        let netns = main.and_then(|p| p.netns);
        let main_pid = main.map(|p| p.pid);
        if let Some(id) = self.host.cgroup_v2_id(path) {
            self.by_cgroup.insert(id, key.to_string());
        }
        self.watch_generation += 1;
        let ips = main_pid.map(|p| self.host.local_ips(p)).unwrap_or_default();
        let shared = Key::new(key.to_string());
        for ip in ips {
            self.claim_address(ip, &shared, &identity);
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
                // Found by a scan: its namespace's cookie is not known yet.
                self.listeners
                    .open
                    .insert((ns, s.local.port()), (shared.clone(), s.local, 0));
                listeners.push(s.local);
            }
            let ports: HashSet<u16> = listeners.iter().map(SocketAddr::port).collect();
            for s in socks
                .iter()
                .filter(|s| s.established && ports.contains(&s.local.port()))
            {
                let id = self.sockets.seed_id(ns, s.local, s.remote);
                self.sockets.follow(id, shared.clone(), None);
                inbound.push(id);
            }
        }
        let shared_identity = Arc::new(identity.clone());
        // A namespace made for it (no other container but a sandbox in it, no earlier run of
        // its own) counted nothing before it.
        let fresh_netns = !restart
            && netns.is_some_and(|ns| {
                !self.containers.values().any(|c| {
                    c.netns == Some(ns)
                        && c.gone_at.is_none()
                        && !c.run_ended
                        && !c.identity.is_sandbox()
                })
            });
        // Started while the agent ran (not found by its first scan): a start record.
        let started = run_started
            .filter(|_| self.scanned)
            .map(|at| Observation::Started {
                identity: Arc::clone(&shared_identity),
                at,
                netns,
                restart,
                fresh_netns,
            });
        self.containers.insert(
            key.to_string(),
            Box::new(Container {
                identity: shared_identity,
                main_pid,
                init_pid,
                shim_as_main: main.is_some_and(|m| m.ns_pid == Some(1) && is_shim(m)),
                netns,
                netns_cookie: 0,
                listener_inodes: HashSet::default(),
                listening_seen: None,
                sampled: false,
                gone_at: None,
                runtime_identity,
                pod_uid: owner.pod_uid.clone(),
                cgroup_path: path.to_string(),
                run_ended: false,
                rechecked_at: 0,
                next_run_at: None,
                missing_since: None,
            }),
        );
        let mut out = vec![Observation::Container {
            identity: Box::new(identity),
            listeners,
            inbound,
        }];
        out.extend(started);
        out
    }

    /// A pod's containers share its address: it is its app's, never its sandbox's, whatever
    /// order they were adopted in (attempts to a vanished pod address are the app's).
    pub(super) fn claim_address(&mut self, ip: IpAddr, key: &Key, identity: &ContainerIdentity) {
        let app_holds = self
            .by_ip
            .get(&ip)
            .and_then(|k| self.containers.get(k.as_str()))
            .is_some_and(|c| c.gone_at.is_none() && !c.identity.is_sandbox());
        if !identity.is_sandbox() || !app_holds {
            self.by_ip.insert(ip, key.clone());
        }
    }

    /// The container a process belongs to, looking it up (and adopting its container) when
    /// the pid is new.
    pub(super) fn container_of_pid(
        &mut self,
        pid: u32,
        out: &mut Vec<Observation>,
    ) -> Option<String> {
        if let Some(k) = self.by_pid.get(&pid) {
            return Some(k.clone());
        }
        if pid == 0 || self.not_containers.contains(&pid) {
            return None;
        }
        let owner = self
            .host
            .process(pid)
            .and_then(|p| p.cgroup_path)
            .and_then(|path| parse_cgroup_path(&path));
        let Some(owner) = owner else {
            make_room_in_set(
                &mut self.not_containers,
                MAX_NOT_CONTAINERS,
                &pid,
                &mut self.dropped.not_containers,
            );
            self.not_containers.insert(pid);
            return None;
        };
        // A new process of a container known and running (a fork, an exec'd probe): no
        // need to walk /proc for it, which a fork-and-kill loop would make once per event.
        if self
            .containers
            .get(&owner.id)
            .is_some_and(|c| c.gone_at.is_none() && !c.run_ended)
        {
            self.by_pid.insert(pid, owner.id.clone());
            return Some(owner.id);
        }
        out.extend(self.scan());
        self.by_pid.get(&pid).cloned()
    }

    pub(super) fn container_of_task(
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
}
