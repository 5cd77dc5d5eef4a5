//! A container whose only job is to keep podman's bridge up: podman deletes the bridge and its
//! route with the last container on the network, and a lab that may still send to a container
//! address after its own containers are gone (no network holder of their own, a proxy or a
//! double on the bridge) keeps one of these for its lifetime (see `lab::net`).

use std::net::Ipv4Addr;

use super::{
    IMAGE,
    names::{setup_once, unique_name},
    podman::{NO_RESOLVER, ULIMITS, inspect, podman},
};
use crate::lab::net::require_bridge_route;

/// A busybox `sleep` on podman's default network, removed on drop.
#[derive(Debug)]
pub struct BridgeHolder {
    pub name: String,
    pub ip: Ipv4Addr,
}

impl BridgeHolder {
    /// Starts it and checks the bridge's route is up; panics otherwise.
    pub fn start(what: &str) -> BridgeHolder {
        setup_once();
        let name = unique_name(&format!("{what}-bridge"));
        let label = format!("drainwatch.lab={}", std::process::id());
        let mut args = vec!["run", "-d", "--name", &name, "--label", &label];
        args.extend(ULIMITS);
        args.extend(NO_RESOLVER);
        // Bounded: outlives no run by more than a day even if never removed.
        args.extend([IMAGE, "/bin/busybox", "sleep", "86400"]);
        podman(&args).unwrap_or_else(|e| panic!("starting the bridge holder: {e}"));
        let mut h = BridgeHolder {
            name,
            ip: Ipv4Addr::UNSPECIFIED,
        };
        let ip = inspect(&h.name, "{{.NetworkSettings.IPAddress}}").expect("its address");
        h.ip = ip
            .parse()
            .unwrap_or_else(|_| panic!("bridge holder address {ip:?} is not IPv4"));
        if let Err(e) = require_bridge_route(h.ip.into()) {
            panic!("the bridge holder is up but its address is not on a bridge: {e}");
        }
        h
    }
}

impl Drop for BridgeHolder {
    fn drop(&mut self) {
        // -t 0: busybox sleep is PID 1 and would ignore SIGTERM for 10 s.
        let _ = podman(&["rm", "-f", "-t", "0", &self.name]);
    }
}
