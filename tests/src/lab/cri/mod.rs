//! The CRI lab: a pod as Kubernetes makes it, without a kubelet or an API server.
//!
//! The lab starts containerd (Debian's 1.6) by its own PID with a config it writes: its own
//! `root`, the task state at a path the caller picks (`/run/containerd` as on a node,
//! `/run/k3s/containerd` as k3s and RKE2 keep it, or MicroK8s' snap directory), runc with the
//! cgroupfs driver, a CNI bridge on a subnet of the lab's own ([`SUBNET`]), and two images
//! built from the host's busybox and imported with `ctr`: a pause image and an app image. A Rust CRI client ([`Kubelet`]) then
//! plays the kubelet over containerd's socket in the kubelet's order: `RunPodSandbox`,
//! `CreateContainer`, `StartContainer`, and at a pod's deletion `StopContainer(grace)`,
//! `StopPodSandbox`, `RemoveContainer`, `RemovePodSandbox` ([`Pod::delete`]).
//!
//! The app container runs `tests/lab/backend.py` with the host's python through read-only bind
//! mounts, as the podman labs do, behind catatonit (SIGTERM forwarded: the default action kills
//! the server, exit 143) or as PID 1 (the kernel drops SIGTERM for a namespace's init: SIGKILL
//! at the deadline, exit 137).
//!
//! Ground truth comes from outside drainwatch: containerd's own task-exit events
//! ([`TaskExits`], `ctr events`), the clients' own counts ([`traffic`]) and the backend's logs.
//!
//! Network safety: pods get no default route and a loopback resolver; a blackhole route for the
//! subnet (metric 4000) catches anything the bridge's own route no longer covers; every send
//! phase first checks that the pod address routes via the lab's bridge. Everything the lab made
//! (containerd, its shims, mounts, netns, the bridge, the IPAM cache, the `kubepods` cgroups,
//! the state directory) is removed on drop, on failure too, and by the next run if this one was
//! killed.

mod cleanup;
mod containerd;
mod events;
mod image;
mod kubelet;
mod network;
mod pod;
mod spec;
pub mod traffic;

use std::path::PathBuf;

pub use cleanup::cleanup_leftovers;
pub use containerd::Containerd;
pub use events::{TaskExit, TaskExits};
pub use kubelet::Kubelet;
pub use network::require_bridge_route;
pub use pod::{Deletion, Pod, Step};
pub use spec::{AppSpec, Init, PodSpec};

/// The lab's pod network: a /24 of its own, on a bridge of its own.
pub const SUBNET: &str = "10.89.7.0/24";
/// The CNI bridge the lab's network creates (the CNI bridge plugin keeps it after the last pod,
/// so a vanished pod address stays on a local link: attempts time out here).
pub const BRIDGE: &str = "dwcri0";
/// The CNI network's name: host-local keeps its leases in `/var/lib/cni/networks/<name>`.
pub const NETWORK: &str = "dwcri";
/// The sandbox (pause) image, built locally and imported.
pub const PAUSE_IMAGE: &str = "localhost/dwcri-pause:1";
/// The app image: the same busybox rootfs, the command given by `CreateContainer`.
pub const APP_IMAGE: &str = "localhost/dwcri-app:1";
/// containerd's task state on a node.
pub const STATE_CONTAINERD: &str = "/run/containerd";
/// containerd's task state on k3s and RKE2 nodes.
pub const STATE_K3S: &str = "/run/k3s/containerd";
/// containerd's task state on MicroK8s nodes (`--state ${SNAP_COMMON}/run/containerd`).
pub const STATE_MICROK8S: &str = "/var/snap/microk8s/common/run/containerd";

/// The lab's containerd, its network, a kubelet connected to it and containerd's task events.
/// Dropping it removes every pod it made and everything containerd left.
pub struct CriLab {
    pub kubelet: Kubelet,
    /// containerd's task exits since the lab started.
    pub exits: TaskExits,
    pub containerd: Containerd,
}

impl CriLab {
    /// containerd with its task state at `state` (e.g. [`STATE_CONTAINERD`]), the images
    /// imported, the network's fallback route in place, a kubelet connected and `ctr events`
    /// watching. Fails loudly (containerd's log) if containerd does not come up.
    pub fn start(state: &str) -> CriLab {
        crate::require_root();
        let containerd = Containerd::start(PathBuf::from(state));
        let kubelet = Kubelet::connect(&containerd.socket).unwrap_or_else(|e| {
            panic!(
                "the CRI on {}: {e}\ncontainerd's log:\n{}",
                containerd.socket.display(),
                containerd.log()
            )
        });
        CriLab {
            kubelet,
            exits: TaskExits::watch(&containerd.socket),
            containerd,
        }
    }

    /// Runs `spec` as the kubelet would and waits for its server to listen.
    pub fn run_pod(&mut self, spec: PodSpec) -> Pod {
        Pod::run(self, spec)
    }
}

impl Drop for CriLab {
    fn drop(&mut self) {
        // Pods the test did not delete go first, through the CRI, while containerd still runs.
        self.containerd.remove_pods(&mut self.kubelet);
    }
}
