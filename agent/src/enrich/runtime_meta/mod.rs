//! Container metadata (name, Kubernetes namespace and pod, workload) read from the state files
//! container runtimes keep on the node, so the agent needs no Kubernetes API server.
//!
//! The parsers are pure (text or bytes in, [`ContainerMeta`] out) and tested on real files:
//! see `agent/fixtures/runtime/README.md` for each one's source. [`lookup`] is the thin I/O
//! around them.
//!
//! # Workload
//!
//! The workload is what a rollout replaces, the unit deploys are grouped by:
//! - Kubernetes: the owning controller's name, derived from the pod name
//!   ([`workload_from_pod_name`]). No label is consulted: containerd's OCI spec carries no pod
//!   labels at all, so a label rule would name the same Deployment differently per runtime, and
//!   the common ones (`app.kubernetes.io/name`, `app`) name the application, which a
//!   Deployment shares with its canary and with the chart's other controllers.
//! - Docker and podman: the Compose service (`com.docker.compose.service`, which podman-compose
//!   sets too) when there is one, else the container name without its replica number
//!   ([`workload_from_container_name`]).
//! - systemd services: the unit name without `.service` and without a template instance
//!   (`app@2.service` → `app`).
//!
//! # Pod sandboxes
//!
//! The pause container of a pod (containerd's `container-type: sandbox`, CRI-O's
//! `ContainerType: sandbox`, Docker's `io.kubernetes.docker.type: podsandbox`) is named `POD`,
//! the name the kubelet itself gives it, with the pod's namespace, pod and workload: it owns
//! the pod's network namespace, so what happens there belongs to the pod.

// Public for the fuzz targets (fuzz/fuzz_targets/bolt.rs) only.
#[doc(hidden)]
pub mod bolt;
mod docker;
mod naming;
mod oci;
mod podman;

use std::{fs::File, io::Read, path::Path};

use serde::Serialize;
use serde_json::{Map, Value};

use super::cgroup_path::{CgroupOwner, Runtime};
use crate::model::SANDBOX_NAME;

pub use docker::from_docker_config_v2;
pub use naming::{workload_from_container_name, workload_from_pod_name};
pub use oci::from_oci_config;
pub use podman::from_podman;

pub(super) use naming::looks_like_hash;

/// Who a container is, as far as reports go.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ContainerMeta {
    /// Container name (`POD` for a pod's sandbox).
    pub name: String,
    /// Kubernetes namespace; "" outside Kubernetes.
    pub namespace: String,
    /// Pod name; "" outside Kubernetes.
    pub pod: String,
    /// What a rollout replaces: see the module documentation.
    pub workload: String,
}

/// Why a state file could not be read as metadata.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    /// Not JSON at all (a torn write, a truncated file).
    #[error("invalid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// JSON, but a field the format requires is missing or of another type.
    #[error("unexpected document: {0}")]
    Shape(&'static str),
}

/// The non-empty string under `key` of a JSON object (annotations, labels).
fn non_empty<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    map.get(key)
        .and_then(Value::as_str)
        .filter(|v| !v.is_empty())
}

// The kubelet's own labels: CRI-O copies them into annotations, dockershim and cri-dockerd set
// them on Docker containers.
const KUBE_POD_NAME: &str = "io.kubernetes.pod.name";
const KUBE_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
const KUBE_CONTAINER_NAME: &str = "io.kubernetes.container.name";

/// Where containerd keeps its task state (`state` in its config), relative to the host root:
/// its default; k3s and RKE2 (`/run/k3s/containerd`, k3s' `applyContainerdStateAndAddress`,
/// which RKE2's agent shares); MicroK8s (`--state ${SNAP_COMMON}/run/containerd` in the snap's
/// `args/containerd`).
const CONTAINERD_STATES: [&str; 3] = [
    "run/containerd",
    "run/k3s/containerd",
    "var/snap/microk8s/common/run/containerd",
];

/// Upper bounds on what [`lookup`] reads: state files are small, a bigger one is not one.
const MAX_CONFIG_BYTES: u64 = 4 << 20;
const MAX_DB_BYTES: u64 = 64 << 20;

/// Thin I/O: given a host root prefix ("/" normally, "/host" inside a DaemonSet pod) and a
/// CgroupOwner, try the known state locations of its runtime and return the metadata, or a
/// fallback whose name is the short id (12 chars) when nothing is readable. Never panics on
/// missing or garbage files.
///
/// The owner's runtime is tried first, then the others: a bare id under `kubepods` (cgroupfs
/// driver) is containerd's by default but may be cri-dockerd's, and a containerd task in the
/// `moby` namespace is a Docker container whose name only Docker's file has. Locations:
/// - containerd: `<state>/io.containerd.runtime.v2.task/{k8s.io,moby,default}/<id>/config.json`
///   (and the v1 shim's `<state>/io.containerd.runtime.v1.linux/k8s.io/<id>/config.json`), for
///   each of [`CONTAINERD_STATES`];
/// - CRI-O: `/run/containers/storage/overlay-containers/<id>/userdata/config.json`, then its
///   persistent copy under `/var/lib/containers/storage/…`;
/// - Docker: `/var/lib/docker/containers/<id>/config.v2.json`;
/// - podman (rootful): `/var/lib/containers/storage/overlay-containers/containers.json` with
///   `/var/lib/containers/storage/libpod/bolt_state.db`.
pub fn lookup(root: &Path, owner: &CgroupOwner) -> ContainerMeta {
    if owner.runtime == Runtime::Systemd {
        return naming::systemd_meta(&owner.id);
    }
    let id = owner.id.as_str();
    // The id becomes a path component: only a runtime's 64-hex id may.
    let readable_id = id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit());
    if readable_id {
        let mut order = vec![owner.runtime];
        order.extend(
            [
                Runtime::Containerd,
                Runtime::CriO,
                Runtime::Docker,
                Runtime::Podman,
            ]
            .into_iter()
            .filter(|r| *r != owner.runtime),
        );
        for runtime in order {
            if let Some(meta) = lookup_in(root, runtime, id) {
                return meta;
            }
        }
    }
    let short: String = id.chars().take(12).collect();
    ContainerMeta {
        name: short.clone(),
        workload: short,
        ..ContainerMeta::default()
    }
}

fn lookup_in(root: &Path, runtime: Runtime, id: &str) -> Option<ContainerMeta> {
    match runtime {
        Runtime::Containerd => CONTAINERD_STATES.iter().find_map(|state| {
            let v2 = ["k8s.io", "moby", "default"]
                .into_iter()
                .map(|ns| format!("{state}/io.containerd.runtime.v2.task/{ns}/{id}/config.json"));
            let v1 = std::iter::once(format!(
                "{state}/io.containerd.runtime.v1.linux/k8s.io/{id}/config.json"
            ));
            v2.chain(v1).find_map(|rel| {
                read_text(&root.join(rel)).and_then(|t| from_oci_config(&t).ok().flatten())
            })
        }),
        Runtime::CriO => ["run", "var/lib"].into_iter().find_map(|base| {
            let rel =
                format!("{base}/containers/storage/overlay-containers/{id}/userdata/config.json");
            read_text(&root.join(rel)).and_then(|t| from_oci_config(&t).ok().flatten())
        }),
        Runtime::Docker => {
            let text =
                read_text(&root.join(format!("var/lib/docker/containers/{id}/config.v2.json")))?;
            from_docker_config_v2(&text).ok()
        }
        Runtime::Podman => {
            let storage = root.join("var/lib/containers/storage");
            let containers = read_text(&storage.join("overlay-containers/containers.json"))?;
            let db = read_bytes(&storage.join("libpod/bolt_state.db"), MAX_DB_BYTES);
            from_podman(&containers, id, db.as_deref()).ok().flatten()
        }
        Runtime::Systemd => None,
    }
}

fn read_text(path: &Path) -> Option<String> {
    String::from_utf8(read_bytes(path, MAX_CONFIG_BYTES)?).ok()
}

fn read_bytes(path: &Path, limit: u64) -> Option<Vec<u8>> {
    let mut bytes = Vec::new();
    File::open(path)
        .ok()?
        .take(limit)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::{test_support::*, *};

    #[test]
    fn lookup_reads_each_runtime_layout_under_a_host_root() {
        let root = std::env::temp_dir().join(format!("drainwatch-lookup-{}", std::process::id()));
        let write = |rel: &str, body: &[u8]| {
            let path = root.join(rel);
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).ok();
            }
            std::fs::write(&path, body).ok();
        };
        let containerd_id = "2d538b1bdc00a5f6251c9f47babca6163794a065133bcd2a0a0264a37a533644";
        let k3s_id = "c0ffee1bdc00a5f6251c9f47babca6163794a065133bcd2a0a0264a37a533644";
        let microk8s_id = "beef001bdc00a5f6251c9f47babca6163794a065133bcd2a0a0264a37a533644";
        let crio_id = "49ecc282021562c567a8159ef424a06cdd8637efdca5953de9794eafe29adcad";
        let docker_id = "7b0daafdf04e524422669e29358ec860f9516488532feb0e2e0e26c8bb259738";
        write(
            &format!(
                "run/containerd/io.containerd.runtime.v2.task/k8s.io/{containerd_id}/config.json"
            ),
            fixture("containerd-container-nginx.json").as_bytes(),
        );
        for (state, id) in [
            ("run/k3s/containerd", k3s_id),
            ("var/snap/microk8s/common/run/containerd", microk8s_id),
        ] {
            write(
                &format!("{state}/io.containerd.runtime.v2.task/k8s.io/{id}/config.json"),
                fixture("containerd-container-nginx.json").as_bytes(),
            );
        }
        write(
            &format!("run/containers/storage/overlay-containers/{crio_id}/userdata/config.json"),
            fixture("crio-container.json").as_bytes(),
        );
        write(
            &format!("var/lib/docker/containers/{docker_id}/config.v2.json"),
            fixture("docker-k8s-container.config.v2.json").as_bytes(),
        );
        write(
            "var/lib/containers/storage/overlay-containers/containers.json",
            fixture("podman/containers.json").as_bytes(),
        );
        write(
            "var/lib/containers/storage/libpod/bolt_state.db",
            &fixture_bytes("podman/bolt_state.db"),
        );

        let owner = |runtime, id: &str| CgroupOwner {
            runtime,
            id: id.to_string(),
            pod_uid: None,
        };
        assert_eq!(
            lookup(&root, &owner(Runtime::Containerd, containerd_id)).pod,
            "nginx-7848d4b86f-xztfp"
        );
        // k3s (and RKE2), MicroK8s: containerd's state elsewhere.
        for id in [k3s_id, microk8s_id] {
            assert_eq!(
                lookup(&root, &owner(Runtime::Containerd, id)).pod,
                "nginx-7848d4b86f-xztfp"
            );
        }
        assert_eq!(
            lookup(&root, &owner(Runtime::CriO, crio_id)).name,
            "podsandbox1-redis"
        );
        assert_eq!(
            lookup(&root, &owner(Runtime::Docker, docker_id)).pod,
            "inf-hulk-demo-ebs"
        );
        assert_eq!(
            lookup(&root, &owner(Runtime::Podman, PODMAN_WEB)),
            meta("web-2", "", "", "web")
        );
        // A bare kubepods id guessed as containerd's but kept by cri-dockerd.
        assert_eq!(
            lookup(&root, &owner(Runtime::Containerd, docker_id)).name,
            "app"
        );
        // Nothing readable: the short id.
        let unknown = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        assert_eq!(
            lookup(&root, &owner(Runtime::Docker, unknown)),
            meta("0123456789ab", "", "", "0123456789ab")
        );
        // Garbage where a state file should be.
        write(
            &format!("var/lib/docker/containers/{unknown}/config.v2.json"),
            b"\x00\xff{",
        );
        assert_eq!(
            lookup(&root, &owner(Runtime::Docker, unknown)).name,
            "0123456789ab"
        );
        // An id that is not one never becomes a path.
        assert_eq!(
            lookup(&root, &owner(Runtime::Docker, "../../etc/passwd")).name,
            "../../etc/pa"
        );
        assert_eq!(
            lookup(&root, &owner(Runtime::Systemd, "getty@tty1.service")),
            meta("getty@tty1.service", "", "", "getty")
        );
        assert_eq!(
            lookup(&root, &owner(Runtime::Systemd, "nginx.service")).workload,
            "nginx"
        );
        std::fs::remove_dir_all(&root).ok();
    }
}

#[cfg(test)]
mod test_support;
