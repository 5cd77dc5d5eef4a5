//! A client pod on the node: a network namespace of its own on a subnet of its own, routed
//! through the host as a CNI plugin routes a pod. Its connects to a Service's virtual IP go
//! through the host's PREROUTING (kube-proxy's DNAT) and FORWARD (its no-endpoint rejects), not
//! the OUTPUT path a node-local client takes, and its answers come back through conntrack's
//! reverse translation (the endpoints are on another subnet, podman's, so nothing is bridged
//! around the host).
//!
//! Safety (see `lab::net`): the namespace has no default route, only the virtual range through
//! the host, and no resolver; its subnet is one of [`LAB_SUBNETS`](super::net::LAB_SUBNETS), so
//! it has the fallback blackhole. The veth pair and the namespace are removed on drop, and a
//! killed run's by the next.

use std::{
    fs::File,
    net::Ipv4Addr,
    os::fd::{AsRawFd, OwnedFd},
};

use super::net::{POD_CLIENT_SUBNET, ensure_fallback, ip};

/// The namespace's name (`ip netns`), the host's end of the pair and the pod's.
const NETNS: &str = "dwlab-podclient";
const HOST_IF: &str = "dwpc-host";
const POD_IF: &str = "dwpc-pod";
/// The host's end (the pod's gateway) and the pod's address, in [`POD_CLIENT_SUBNET`].
const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 90, 7, 1);
pub const POD_IP: Ipv4Addr = Ipv4Addr::new(10, 90, 7, 2);

/// The client pod's namespace, removed on drop.
#[derive(Debug)]
pub struct PodClient {
    ns: OwnedFd,
}

fn remove() {
    ip(&["link", "del", HOST_IF]).ok();
    ip(&["netns", "del", NETNS]).ok();
}

impl PodClient {
    /// Makes the namespace with a route to `routed` (the Service range) through the host.
    pub fn create(routed: &str) -> Result<PodClient, String> {
        remove();
        ensure_fallback(POD_CLIENT_SUBNET)?;
        let gw = format!("{GATEWAY}/24");
        let pod = format!("{POD_IP}/24");
        let gw_ip = GATEWAY.to_string();
        let steps: [&[&str]; 8] = [
            &["netns", "add", NETNS],
            &[
                "link", "add", HOST_IF, "type", "veth", "peer", "name", POD_IF,
            ],
            &["link", "set", POD_IF, "netns", NETNS],
            &["addr", "add", &gw, "dev", HOST_IF],
            &["link", "set", HOST_IF, "up"],
            &["-n", NETNS, "addr", "add", &pod, "dev", POD_IF],
            &["-n", NETNS, "link", "set", POD_IF, "up"],
            &["-n", NETNS, "route", "add", routed, "via", &gw_ip],
        ];
        for step in steps {
            if let Err(e) = ip(step) {
                remove();
                return Err(format!("making the client pod: {e}"));
            }
        }
        ip(&["-n", NETNS, "link", "set", "lo", "up"])?;
        let ns = File::open(format!("/run/netns/{NETNS}"))
            .map_err(|e| format!("opening the client pod's namespace: {e}"))?;
        Ok(PodClient { ns: ns.into() })
    }

    /// Moves the calling thread into the pod's network namespace (for good: call it on a
    /// thread of its own).
    pub fn enter(&self) {
        // SAFETY: setns on this thread only, with a namespace fd we hold.
        let rc = unsafe { libc::setns(self.ns.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(
            rc,
            0,
            "entering the client pod: {}",
            std::io::Error::last_os_error()
        );
    }
}

impl Drop for PodClient {
    fn drop(&mut self) {
        remove();
    }
}
