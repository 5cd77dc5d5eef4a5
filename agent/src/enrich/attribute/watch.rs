//! The watch set: what the kernel filter must keep of the host namespace's traffic, derived
//! from what the enricher knows (pure), and a generation that changes when it may have.

use super::Enricher;
use crate::{capture::watch::WatchSet, enrich::host::HostView};

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
            ..WatchSet::default()
        };
        let Some(host) = self.host_netns else {
            return set;
        };
        for (ip, key) in &self.by_ip {
            if self.containers.get(key).and_then(|c| c.netns) != Some(host) {
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
}
