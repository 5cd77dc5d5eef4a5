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

use std::{collections::BTreeMap, fs::File, io::Read, path::Path};

use serde::Serialize;
use serde_json::{Map, Value};

use super::cgroup_path::{CgroupOwner, Runtime};

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

/// The name the kubelet gives a pod's sandbox (pause) container.
const SANDBOX_NAME: &str = "POD";

// containerd's CRI plugin (pkg/cri/annotations/annotations.go).
const CRI_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
const CRI_CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
const CRI_SANDBOX_NAME: &str = "io.kubernetes.cri.sandbox-name";
const CRI_SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";

// CRI-O (pkg/annotations/internal.go), plus the kubelet's labels it copies into annotations.
const CRIO_CONTAINER_TYPE: &str = "io.kubernetes.cri-o.ContainerType";
const CRIO_LABELS: &str = "io.kubernetes.cri-o.Labels";
const CRIO_METADATA: &str = "io.kubernetes.cri-o.Metadata";
const CRIO_KUBE_NAME: &str = "io.kubernetes.cri-o.KubeName";
const CRIO_NAMESPACE: &str = "io.kubernetes.cri-o.Namespace";
const CRIO_SANDBOX_NAME: &str = "io.kubernetes.cri-o.SandboxName";
const CRIO_CONTAINER_NAME: &str = "io.kubernetes.cri-o.ContainerName";
const KUBE_POD_NAME: &str = "io.kubernetes.pod.name";
const KUBE_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
const KUBE_CONTAINER_NAME: &str = "io.kubernetes.container.name";
const DOCKER_K8S_TYPE: &str = "io.kubernetes.docker.type";
const COMPOSE_SERVICE: &str = "com.docker.compose.service";

/// Pure: annotations from an OCI runtime spec (`config.json`) as containerd and CRI-O fill
/// them. None when it has no Kubernetes annotations (podman's, Docker's, plain containerd's).
pub fn from_oci_config(json: &str) -> Result<Option<ContainerMeta>, MetaError> {
    let spec: Value = serde_json::from_str(json)?;
    let Some(annotations) = spec.get("annotations") else {
        return Ok(None);
    };
    let annotations = annotations
        .as_object()
        .ok_or(MetaError::Shape("annotations is not an object"))?;
    let get = |key: &str| {
        annotations
            .get(key)
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
    };

    if let Some(pod) = get(CRI_SANDBOX_NAME) {
        let name = if get(CRI_CONTAINER_TYPE) == Some("sandbox") {
            SANDBOX_NAME
        } else {
            get(CRI_CONTAINER_NAME).unwrap_or_default()
        };
        return Ok(Some(kube_meta(
            name,
            get(CRI_SANDBOX_NAMESPACE).unwrap_or_default(),
            pod,
        )));
    }

    let crio_type = get(CRIO_CONTAINER_TYPE);
    if crio_type.is_none() && get(KUBE_POD_NAME).is_none() {
        return Ok(None);
    }
    // CRI-O copies the kubelet's labels both as annotations and as one JSON annotation; older
    // versions and crictl-made pods have only its own keys, hence the chain of fallbacks.
    let labels =
        get(CRIO_LABELS).and_then(|l| serde_json::from_str::<BTreeMap<String, String>>(l).ok());
    let label = |key: &str| {
        labels
            .as_ref()
            .and_then(|l| l.get(key))
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    };
    let sandbox_fields = get(CRIO_SANDBOX_NAME).and_then(|s| kubelet_name_fields(s, 5));
    let is_sandbox = crio_type == Some("sandbox");

    let pod = get(KUBE_POD_NAME)
        .or_else(|| label(KUBE_POD_NAME))
        .or_else(|| is_sandbox.then(|| get(CRIO_KUBE_NAME)).flatten())
        .or_else(|| sandbox_fields.as_ref().map(|f| f[1]));
    let Some(pod) = pod else {
        return Ok(None);
    };
    let namespace = get(KUBE_POD_NAMESPACE)
        .or_else(|| label(KUBE_POD_NAMESPACE))
        .or_else(|| get(CRIO_NAMESPACE))
        .or_else(|| sandbox_fields.as_ref().map(|f| f[2]))
        .unwrap_or_default();
    let metadata_name = get(CRIO_METADATA)
        .and_then(|m| serde_json::from_str::<Value>(m).ok())
        .and_then(|m| m.get("name").and_then(Value::as_str).map(str::to_string));
    let name = if is_sandbox {
        SANDBOX_NAME.to_string()
    } else {
        get(KUBE_CONTAINER_NAME)
            .or_else(|| label(KUBE_CONTAINER_NAME))
            .map(str::to_string)
            .or(metadata_name)
            .or_else(|| {
                get(CRIO_CONTAINER_NAME)
                    .and_then(|n| kubelet_name_fields(n, 6))
                    .map(|f| f[1].to_string())
            })
            .unwrap_or_default()
    };
    Ok(Some(kube_meta(&name, namespace, pod)))
}

/// Pure: podman's own state for a container.
///
/// podman 4.x keeps the name in containers/storage's `containers.json` (a JSON array of
/// `{"id", "names": [...]}`; the OCI `config.json` it writes carries neither name nor labels)
/// and the labels only in its libpod database `bolt_state.db` (bucket `ctr` → `<id>` →
/// `config`, the container's JSON config). Pass the database when it is readable: labels are
/// only used for the Compose service, so a missing, newer (podman 5's SQLite `db.sql`) or
/// torn database costs the workload label, never the name. None when `id` is not in
/// `containers.json`.
pub fn from_podman(
    containers_json: &str,
    id: &str,
    bolt_state: Option<&[u8]>,
) -> Result<Option<ContainerMeta>, MetaError> {
    let containers: Value = serde_json::from_str(containers_json)?;
    let containers = containers
        .as_array()
        .ok_or(MetaError::Shape("containers.json is not an array"))?;
    let Some(entry) = containers
        .iter()
        .find(|c| c.get("id").and_then(Value::as_str) == Some(id))
    else {
        return Ok(None);
    };
    let name = entry
        .get("names")
        .and_then(Value::as_array)
        .and_then(|names| names.first())
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let labels = bolt_state
        .and_then(|db| podman_labels(db, id))
        .unwrap_or_default();
    Ok(Some(local_meta(name, &labels)))
}

/// The labels podman's libpod database holds for a container, None when unreadable.
fn podman_labels(db: &[u8], id: &str) -> Option<Map<String, Value>> {
    let config = bolt::Db::open(db)
        .ok()?
        .get(&[b"ctr", id.as_bytes()], b"config")
        .ok()??;
    let config: Value = serde_json::from_slice(config).ok()?;
    config.get("labels")?.as_object().cloned()
}

/// Pure: Docker's /var/lib/docker/containers/<id>/config.v2.json ("Name": "/web-1",
/// Config.Labels incl. com.docker.compose.service). Containers the kubelet made through
/// dockershim or cri-dockerd carry the pod in their `io.kubernetes.*` labels.
pub fn from_docker_config_v2(json: &str) -> Result<ContainerMeta, MetaError> {
    let config: Value = serde_json::from_str(json)?;
    let name = config
        .get("Name")
        .and_then(Value::as_str)
        .ok_or(MetaError::Shape("no Name"))?;
    let name = name.strip_prefix('/').unwrap_or(name).to_string();
    // Labels are null for a container created without any.
    let labels = match config.get("Config").and_then(|c| c.get("Labels")) {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(labels)) => labels.clone(),
        Some(_) => return Err(MetaError::Shape("Config.Labels is not an object")),
    };
    let label = |key: &str| {
        labels
            .get(key)
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
    };
    if let Some(pod) = label(KUBE_POD_NAME) {
        let name = if label(DOCKER_K8S_TYPE) == Some("podsandbox") {
            SANDBOX_NAME
        } else {
            label(KUBE_CONTAINER_NAME).unwrap_or(&name)
        };
        return Ok(kube_meta(
            name,
            label(KUBE_POD_NAMESPACE).unwrap_or_default(),
            pod,
        ));
    }
    Ok(local_meta(name, &labels))
}

fn kube_meta(name: &str, namespace: &str, pod: &str) -> ContainerMeta {
    ContainerMeta {
        name: name.to_string(),
        namespace: namespace.to_string(),
        pod: pod.to_string(),
        workload: workload_from_pod_name(pod),
    }
}

/// A container outside Kubernetes: the Compose service wins over the name.
fn local_meta(name: String, labels: &Map<String, Value>) -> ContainerMeta {
    let workload = match labels.get(COMPOSE_SERVICE).and_then(Value::as_str) {
        Some(service) if !service.is_empty() => service.to_string(),
        _ => workload_from_container_name(&name),
    };
    ContainerMeta {
        name,
        workload,
        ..ContainerMeta::default()
    }
}

/// The `_`-separated fields of a kubelet-made name: `k8s_<pod>_<ns>_<uid>_<attempt>` for a
/// sandbox (n = 5), `k8s_<container>_<pod>_<ns>_<uid>_<attempt>` for a container (n = 6).
/// Kubernetes names never hold `_`, so the split is exact.
fn kubelet_name_fields(name: &str, n: usize) -> Option<Vec<&str>> {
    let fields: Vec<&str> = name.split('_').collect();
    (fields.len() == n && fields[0] == "k8s" && fields.iter().all(|f| !f.is_empty()))
        .then_some(fields)
}

/// The alphabet of Kubernetes' random name suffixes and of pod-template hashes
/// (`k8s.io/apimachinery/pkg/util/rand`): no vowels, no 0, 1 or 3.
const KUBE_ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// The workload rule for Kubernetes pods: the owning controller's name, from the pod name.
///
/// - Deployment: `<deploy>-<pod-template-hash>-<5 random>` → `<deploy>`; the hash is 6–10
///   characters of the same alphabet, or 6–10 digits on Kubernetes before 1.12 (and the
///   minute number a CronJob puts in its Jobs' names, so `<cronjob>-<time>-<5>` → `<cronjob>`).
/// - DaemonSet, Job, bare ReplicaSet: `<name>-<5 random>` → `<name>` (random: the alphabet
///   above, or any digit as older Kubernetes drew them).
/// - StatefulSet: `<sts>-<ordinal>` → `<sts>`.
/// - Anything else (a bare pod): the pod name.
///
/// A static pod (`<name>-<node name>`) keeps its node suffix: nothing in the name says where
/// the node name starts.
pub fn workload_from_pod_name(pod: &str) -> String {
    let Some((rest, last)) = pod.rsplit_once('-') else {
        return pod.to_string();
    };
    if rest.is_empty() {
        return pod.to_string();
    }
    // Kubernetes before 1.8 drew suffixes from all ten digits (`kube-dns-3097350089-49d91`).
    if last.len() == 5
        && last
            .bytes()
            .all(|b| KUBE_ALPHANUMS.contains(&b) || b.is_ascii_digit())
    {
        if let Some((base, hash)) = rest.rsplit_once('-')
            && !base.is_empty()
            && (6..=10).contains(&hash.len())
            && (hash.bytes().all(|b| KUBE_ALPHANUMS.contains(&b))
                || hash.bytes().all(|b| b.is_ascii_digit()))
        {
            return base.to_string();
        }
        return rest.to_string();
    }
    if last.bytes().all(|b| b.is_ascii_digit()) {
        return rest.to_string();
    }
    pod.to_string()
}

/// The workload rule outside Kubernetes: the container name without a trailing replica
/// number: `web-2`, `web_2`, `web.2` → `web` (Compose v1 `proj_web_1`, v2 `proj-web-1`,
/// Swarm `svc.1`); `web` → `web`.
///
/// Only an all-digit last part is a replica number: `app-v2` stays `app-v2`, since a version
/// in a name is part of what the container is (`app-v1` and `app-v2` are two deployments, not
/// two replicas). A leading `/` (Docker's form) is dropped.
pub fn workload_from_container_name(name: &str) -> String {
    let name = name.strip_prefix('/').unwrap_or(name);
    if let Some((base, number)) = name.rsplit_once(['-', '_', '.'])
        && !base.is_empty()
        && !number.is_empty()
        && number.bytes().all(|b| b.is_ascii_digit())
    {
        return base.to_string();
    }
    name.to_string()
}

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
/// - containerd: `/run/containerd/io.containerd.runtime.v2.task/{k8s.io,moby,default}/<id>/config.json`
///   (and the v1 shim's `/run/containerd/io.containerd.runtime.v1.linux/k8s.io/<id>/config.json`);
/// - CRI-O: `/run/containers/storage/overlay-containers/<id>/userdata/config.json`, then its
///   persistent copy under `/var/lib/containers/storage/…`;
/// - Docker: `/var/lib/docker/containers/<id>/config.v2.json`;
/// - podman (rootful): `/var/lib/containers/storage/overlay-containers/containers.json` with
///   `/var/lib/containers/storage/libpod/bolt_state.db`.
pub fn lookup(root: &Path, owner: &CgroupOwner) -> ContainerMeta {
    if owner.runtime == Runtime::Systemd {
        return systemd_meta(&owner.id);
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
        Runtime::Containerd => {
            let v2 = ["k8s.io", "moby", "default"].into_iter().map(|ns| {
                format!("run/containerd/io.containerd.runtime.v2.task/{ns}/{id}/config.json")
            });
            let v1 = std::iter::once(format!(
                "run/containerd/io.containerd.runtime.v1.linux/k8s.io/{id}/config.json"
            ));
            v2.chain(v1).find_map(|rel| {
                read_text(&root.join(rel)).and_then(|t| from_oci_config(&t).ok().flatten())
            })
        }
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

/// A plain service: `app@2.service` → name `app@2.service`, workload `app`.
fn systemd_meta(unit: &str) -> ContainerMeta {
    let stem = unit.strip_suffix(".service").unwrap_or(unit);
    let workload = stem.split_once('@').map_or(stem, |(template, _)| template);
    ContainerMeta {
        name: unit.to_string(),
        workload: workload.to_string(),
        ..ContainerMeta::default()
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

/// A read-only reader for the one thing asked of a bbolt database (podman's
/// `bolt_state.db`): the value under a key inside nested buckets. It follows the B+tree from
/// the newest valid meta page, so pages that older transactions freed (which still hold
/// removed containers' configs) are never seen. Every offset is bounds-checked: the file may be
/// torn or not bbolt at all.
mod bolt {
    const MAGIC: u32 = 0xED0C_DAED;
    const VERSION: u32 = 2;
    const PAGE_HEADER: usize = 16;
    const ELEMENT: usize = 16;
    const BRANCH_PAGE: u16 = 0x01;
    const LEAF_PAGE: u16 = 0x02;
    const BUCKET_LEAF: u32 = 0x01;
    /// B+trees this deep would hold far more than any state file; deeper means a cycle.
    const MAX_DEPTH: usize = 32;

    /// An opened database: the file's bytes and where its newest root bucket is.
    pub struct Db<'a> {
        data: &'a [u8],
        page_size: usize,
        root: u64,
    }

    /// Where a B+tree node lives: a file page, or inline in its parent bucket's value.
    #[derive(Clone, Copy)]
    enum Node<'a> {
        Page(u64),
        Inline(&'a [u8]),
    }

    impl<'a> Db<'a> {
        /// Reads the two meta pages and keeps the valid one of the newest transaction.
        pub fn open(data: &'a [u8]) -> Result<Self, &'static str> {
            // Page 0's meta says the page size that locates page 1's.
            let page_size = meta(data, 0)
                .map(|m| m.page_size)
                .ok_or("no valid meta page")?;
            [0, page_size]
                .into_iter()
                .filter_map(|offset| meta(data, offset))
                .filter(|m| m.page_size == page_size)
                .max_by_key(|m| m.txid)
                .map(|m| Db {
                    data,
                    page_size,
                    root: m.root,
                })
                .ok_or("no valid meta page")
        }

        /// The value of `key` in the bucket reached through `buckets`, None when absent.
        pub fn get(&self, buckets: &[&[u8]], key: &[u8]) -> Result<Option<&'a [u8]>, &'static str> {
            let mut node = Node::Page(self.root);
            for name in buckets {
                match self.find(node, name, 0)? {
                    Some((flags, value)) if flags & BUCKET_LEAF != 0 => node = bucket_root(value)?,
                    _ => return Ok(None),
                }
            }
            Ok(self
                .find(node, key, 0)?
                .filter(|(flags, _)| flags & BUCKET_LEAF == 0)
                .map(|(_, v)| v))
        }

        fn page(&self, id: u64) -> Result<&'a [u8], &'static str> {
            let start = usize::try_from(id)
                .ok()
                .and_then(|id| id.checked_mul(self.page_size))
                .ok_or("page id out of range")?;
            let header = self
                .data
                .get(start..start + PAGE_HEADER)
                .ok_or("page beyond the file")?;
            let overflow = u32_at(header, 12).ok_or("short page header")? as usize;
            let len = overflow
                .checked_add(1)
                .and_then(|n| n.checked_mul(self.page_size))
                .ok_or("page too large")?;
            // The last page of a file may be shorter than its overflow claims if torn.
            let end = start.saturating_add(len).min(self.data.len());
            self.data.get(start..end).ok_or("page beyond the file")
        }

        /// Finds `key` in the B+tree at `node`: its leaf flags and value.
        fn find(
            &self,
            node: Node<'a>,
            key: &[u8],
            depth: usize,
        ) -> Result<Option<(u32, &'a [u8])>, &'static str> {
            if depth > MAX_DEPTH {
                return Err("tree too deep");
            }
            let page = match node {
                Node::Page(id) => self.page(id)?,
                Node::Inline(bytes) => bytes,
            };
            let flags = u16_at(page, 8).ok_or("short page header")?;
            let count = usize::from(u16_at(page, 10).ok_or("short page header")?);
            if flags & LEAF_PAGE != 0 {
                for i in 0..count {
                    let at = PAGE_HEADER + i * ELEMENT;
                    let (eflags, pos, ksize, vsize) = (
                        u32_at(page, at),
                        u32_at(page, at + 4),
                        u32_at(page, at + 8),
                        u32_at(page, at + 12),
                    );
                    let (Some(eflags), Some(pos), Some(ksize), Some(vsize)) =
                        (eflags, pos, ksize, vsize)
                    else {
                        return Err("short leaf element");
                    };
                    let k_start = at + pos as usize;
                    let k_end = k_start + ksize as usize;
                    let k = page.get(k_start..k_end).ok_or("leaf key beyond the page")?;
                    if k == key {
                        let value = page
                            .get(k_end..k_end + vsize as usize)
                            .ok_or("leaf value beyond the page")?;
                        return Ok(Some((eflags, value)));
                    }
                }
                return Ok(None);
            }
            if flags & BRANCH_PAGE == 0 || matches!(node, Node::Inline(_)) {
                return Err("neither a branch nor a leaf page");
            }
            // The child to descend into is the last whose first key is <= key (bbolt's rule).
            let mut child = None;
            for i in 0..count {
                let at = PAGE_HEADER + i * ELEMENT;
                let (Some(pos), Some(ksize), Some(pgid)) =
                    (u32_at(page, at), u32_at(page, at + 4), u64_at(page, at + 8))
                else {
                    return Err("short branch element");
                };
                let k_start = at + pos as usize;
                let k = page
                    .get(k_start..k_start + ksize as usize)
                    .ok_or("branch key beyond the page")?;
                if i > 0 && k > key {
                    break;
                }
                child = Some(pgid);
            }
            match child {
                Some(pgid) => self.find(Node::Page(pgid), key, depth + 1),
                None => Ok(None),
            }
        }
    }

    /// A bucket value: its root page, or (root 0) an inline page right after the header.
    fn bucket_root(value: &[u8]) -> Result<Node<'_>, &'static str> {
        match u64_at(value, 0).ok_or("short bucket header")? {
            0 => Ok(Node::Inline(value.get(16..).ok_or("short inline bucket")?)),
            root => Ok(Node::Page(root)),
        }
    }

    struct Meta {
        page_size: usize,
        root: u64,
        txid: u64,
    }

    /// The meta page at `offset`, None unless its magic, version and checksum hold.
    fn meta(data: &[u8], offset: usize) -> Option<Meta> {
        let m = data.get(offset + PAGE_HEADER..offset + PAGE_HEADER + 64)?;
        let valid = u32_at(m, 0)? == MAGIC
            && u32_at(m, 4)? == VERSION
            && u64_at(m, 56)? == fnv1a64(&m[..56]);
        let page_size = u32_at(m, 8)? as usize;
        (valid && page_size >= 512).then_some(Meta {
            page_size,
            root: u64_at(m, 16)?,
            txid: u64_at(m, 48)?,
        })
    }

    fn fnv1a64(bytes: &[u8]) -> u64 {
        bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    // bbolt writes native-endian integers; every platform podman runs on is little-endian.
    fn u16_at(b: &[u8], at: usize) -> Option<u16> {
        Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
    }
    fn u32_at(b: &[u8], at: usize) -> Option<u32> {
        Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
    }
    fn u64_at(b: &[u8], at: usize) -> Option<u64> {
        Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let path = format!("{}/fixtures/runtime/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn fixture_bytes(name: &str) -> Vec<u8> {
        let path = format!("{}/fixtures/runtime/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn meta(name: &str, namespace: &str, pod: &str, workload: &str) -> ContainerMeta {
        ContainerMeta {
            name: name.into(),
            namespace: namespace.into(),
            pod: pod.into(),
            workload: workload.into(),
        }
    }

    const PODMAN_WEB: &str = "129bf6a9c38081e34c6565211c48068ff79bc11ddbccd067768ca64b035eb65c";
    const PODMAN_API: &str = "9ae4d580024f41a3ee6cdd658972c90da8b35c1b48fbccd72a4e8dcee2bfdc7a";
    /// Created and removed in the same store before the fixture was taken: its config is
    /// still in pages bbolt freed.
    const PODMAN_REMOVED: &str = "a23659ea44c7178cc25a2257ce55b04e7b557e1bd18a6b77651e955e75c22237";

    #[test]
    fn containerd_container_of_a_deployment() {
        let got = from_oci_config(&fixture("containerd-container-nginx.json"))
            .ok()
            .flatten();
        assert_eq!(
            got,
            Some(meta("nginx", "default", "nginx-7848d4b86f-xztfp", "nginx"))
        );
    }

    #[test]
    fn containerd_sandbox_is_named_pod() {
        let got = from_oci_config(&fixture("containerd-sandbox-aks.json"))
            .ok()
            .flatten();
        assert_eq!(
            got,
            Some(meta("POD", "develop", "web-with-logger", "web-with-logger"))
        );
    }

    #[test]
    fn crio_container_and_sandbox() {
        // crictl-made on CRI-O: no kubelet labels, so the CRI-O keys' fallbacks are exercised.
        let got = from_oci_config(&fixture("crio-container.json"))
            .ok()
            .flatten();
        assert_eq!(
            got,
            Some(meta(
                "podsandbox1-redis",
                "redhat.test.crio",
                "podsandbox1",
                "podsandbox1"
            ))
        );
        let got = from_oci_config(&fixture("crio-sandbox.json"))
            .ok()
            .flatten();
        assert_eq!(
            got,
            Some(meta(
                "POD",
                "redhat.test.crio",
                "podsandbox1",
                "podsandbox1"
            ))
        );
    }

    #[test]
    fn oci_config_without_kubernetes_annotations_is_none() {
        // podman's own config.json, captured here.
        assert_eq!(
            from_oci_config(&fixture("podman/web-2.config.json")).ok(),
            Some(None)
        );
        assert_eq!(
            from_oci_config(r#"{"ociVersion":"1.0.2"}"#).ok(),
            Some(None)
        );
        assert!(from_oci_config("{\"annotations\":").is_err());
        assert!(from_oci_config(r#"{"annotations":[1]}"#).is_err());
    }

    #[test]
    fn podman_name_and_labels_from_the_state_captured_here() {
        let containers = fixture("podman/containers.json");
        let db = fixture_bytes("podman/bolt_state.db");
        assert_eq!(
            from_podman(&containers, PODMAN_WEB, Some(&db))
                .ok()
                .flatten(),
            Some(meta("web-2", "", "", "web"))
        );
        // `shop_api_1` with com.docker.compose.service=api: the label wins over the name.
        assert_eq!(
            from_podman(&containers, PODMAN_API, Some(&db))
                .ok()
                .flatten(),
            Some(meta("shop_api_1", "", "", "api"))
        );
        // Without the database: the name still decides.
        assert_eq!(
            from_podman(&containers, PODMAN_API, None).ok().flatten(),
            Some(meta("shop_api_1", "", "", "shop_api"))
        );
        assert_eq!(
            from_podman(&containers, PODMAN_REMOVED, Some(&db)).ok(),
            Some(None)
        );
    }

    #[test]
    fn bolt_reader_sees_live_containers_only() {
        let db = fixture_bytes("podman/bolt_state.db");
        let Ok(db) = bolt::Db::open(&db) else {
            panic!("fixture database does not open")
        };
        let labels = |id: &str| {
            db.get(&[b"ctr", id.as_bytes()], b"config")
                .ok()
                .flatten()
                .and_then(|c| serde_json::from_slice::<Value>(c).ok())
                .and_then(|c| c.get("labels").cloned())
        };
        assert_eq!(labels(PODMAN_WEB), Some(serde_json::json!({"app": "web"})));
        assert_eq!(labels(PODMAN_REMOVED), None);
        // A key that is a bucket is not a value, and the other way round.
        assert_eq!(db.get(&[], b"ctr").ok(), Some(None));
        assert_eq!(
            db.get(&[b"ctr", PODMAN_WEB.as_bytes(), b"config"], b"x")
                .ok(),
            Some(None)
        );
    }

    #[test]
    fn bolt_reader_survives_garbage() {
        let db = fixture_bytes("podman/bolt_state.db");
        assert!(bolt::Db::open(&[]).is_err());
        // The first meta page fits in 100 bytes; the tree it points to does not.
        if let Ok(d) = bolt::Db::open(&db[..100]) {
            assert!(d.get(&[b"ctr", PODMAN_WEB.as_bytes()], b"config").is_err());
        }
        assert!(bolt::Db::open(b"{\"not\":\"bolt\"}").is_err());
        // Truncated after the meta pages, and every single-byte corruption of the first pages:
        // errors or answers, never a panic.
        for len in [8192, 12288, 20000, db.len() / 2] {
            if let Ok(d) = bolt::Db::open(&db[..len]) {
                let _ = d.get(&[b"ctr", PODMAN_WEB.as_bytes()], b"config");
            }
        }
        let mut bad = db.clone();
        for at in (8192..bad.len()).step_by(97) {
            let saved = bad[at];
            bad[at] = saved.wrapping_add(0x5b);
            if let Ok(d) = bolt::Db::open(&bad) {
                let _ = d.get(&[b"ctr", PODMAN_WEB.as_bytes()], b"config");
            }
            bad[at] = saved;
        }
        assert!(
            from_podman(
                &fixture("podman/containers.json"),
                PODMAN_WEB,
                Some(&db[..5000])
            )
            .is_ok()
        );
        assert!(from_podman("[{\"id\":", PODMAN_WEB, None).is_err());
    }

    #[test]
    fn docker_compose_kubernetes_and_plain_containers() {
        // docker inspect of a Compose 1.29 container with container_name: gitea, service server.
        assert_eq!(
            from_docker_config_v2(&fixture("docker-compose-gitea.json")).ok(),
            Some(meta("gitea", "", "", "server"))
        );
        // A kubelet (dockershim) container.
        assert_eq!(
            from_docker_config_v2(&fixture("docker-k8s-container.config.v2.json")).ok(),
            Some(meta(
                "app",
                "default",
                "inf-hulk-demo-ebs",
                "inf-hulk-demo-ebs"
            ))
        );
        // Plain `docker run --name x-ui`.
        assert_eq!(
            from_docker_config_v2(&fixture("docker-plain.config.v2.json")).ok(),
            Some(meta("x-ui", "", "", "x-ui"))
        );
        assert!(from_docker_config_v2("{}").is_err());
        assert!(from_docker_config_v2("nope").is_err());
    }

    #[test]
    fn workload_from_real_pod_names() {
        for (pod, workload) in [
            ("nginx-7848d4b86f-xztfp", "nginx"), // Deployment (kube03a write-up)
            ("shell-79b95cc8b5-z2v4j", "shell"), // Deployment (istio/istio#55139)
            ("tomcat-55c4cc5fcd-7l6x4", "tomcat"), // Deployment
            ("kube-dns-3097350089-49d91", "kube-dns"), // Deployment, numeric hash (cri-o/cri-o#943)
            ("calico-node-hx7cw", "calico-node"), // DaemonSet (opencontainers/runc#4620)
            ("web-0", "web"),                    // StatefulSet
            ("web-with-logger", "web-with-logger"), // bare pod (AKS write-up)
            ("inf-hulk-demo-ebs", "inf-hulk-demo-ebs"),
            ("podsandbox1", "podsandbox1"),
            ("backup-28465920-x7k2p", "backup"), // CronJob → Job → pod
            ("", ""),
            ("-x7k2p", "-x7k2p"),
        ] {
            assert_eq!(workload_from_pod_name(pod), workload, "{pod}");
        }
    }

    #[test]
    fn workload_from_container_names() {
        for (name, workload) in [
            ("web-2", "web"),
            ("web_2", "web"),
            ("web.2", "web"),
            ("web", "web"),
            ("app-v2", "app-v2"),
            ("/web-1", "web"),
            ("docker_migrate_1", "docker_migrate"), // Compose 1.21 (docker events sample)
            ("shop_api_1", "shop_api"),
            ("2", "2"),
            ("web-", "web-"),
        ] {
            assert_eq!(workload_from_container_name(name), workload, "{name}");
        }
    }

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
        let crio_id = "49ecc282021562c567a8159ef424a06cdd8637efdca5953de9794eafe29adcad";
        let docker_id = "7b0daafdf04e524422669e29358ec860f9516488532feb0e2e0e26c8bb259738";
        write(
            &format!(
                "run/containerd/io.containerd.runtime.v2.task/k8s.io/{containerd_id}/config.json"
            ),
            fixture("containerd-container-nginx.json").as_bytes(),
        );
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
