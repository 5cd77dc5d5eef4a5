//! The watch set: what the kernel filter must keep of the host namespace's traffic, derived
//! from what the enricher knows (pure), and a generation that changes when it may have.

use std::collections::BTreeSet;

use super::Enricher;
use crate::{
    capture::watch::WatchSet,
    enrich::host::HostView,
    model::{HashMap, HashSet, Workload},
};

impl<H: HostView> Enricher<H> {
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
        let mut set = WatchSet {
            proxies: self.proxy_tgids().collect(),
            pod_listeners: self.pod_listeners(),
            ..WatchSet::default()
        };
        let Some(host) = self.host_netns else {
            return set;
        };
        for (ip, key) in &self.by_ip {
            if self.containers.get(key.as_str()).and_then(|c| c.netns) != Some(host) {
                set.addrs.insert(*ip);
            }
        }
        let ports = self
            .listeners
            .open
            .keys()
            .chain(self.listeners.closed.keys());
        set.ports
            .extend(ports.filter(|(ns, _)| *ns == host).map(|(_, port)| *port));
        set
    }

    /// Listening ports (open or closed) of the namespaces more than one container (not
    /// counting a pod's sandbox) shares, but the host's: a loopback connect to one may be a
    /// sidecar proxying to its app, which the kernel then keeps whole (see `upstreams`).
    fn pod_listeners(&self) -> BTreeSet<(u32, u16)> {
        let mut members: HashMap<u32, u32> = HashMap::default();
        for c in self.containers.values() {
            if let Some(ns) = c.netns.filter(|ns| Some(*ns) != self.host_netns)
                && !c.identity.is_sandbox()
            {
                *members.entry(ns).or_default() += 1;
            }
        }
        let shared = |ns: &u32| members.get(ns).is_some_and(|n| *n > 1);
        self.listeners
            .open
            .keys()
            .chain(self.listeners.closed.keys())
            .filter(|(ns, _)| shared(ns))
            .copied()
            .collect()
    }

    /// The network namespaces of the containers `keys` names and of those of `workloads`
    /// (`--hold`'s hot namespaces).
    pub fn netns_of(&self, keys: &HashSet<String>, workloads: &HashSet<Workload>) -> BTreeSet<u32> {
        if keys.is_empty() && workloads.is_empty() {
            return BTreeSet::new();
        }
        let of_workload = |c: &super::Container| {
            let id = &c.identity;
            workloads
                .iter()
                .any(|(ns, w)| *ns == id.namespace && *w == id.workload)
        };
        self.containers
            .iter()
            .filter(|(k, c)| keys.contains(k.as_str()) || of_workload(c))
            .filter_map(|(_, c)| c.netns)
            .collect()
    }
}
