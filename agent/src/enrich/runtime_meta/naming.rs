//! The workload naming rules (see the parent module's documentation): from a pod name, from a
//! container name and its Compose label, from a systemd unit.

use serde_json::{Map, Value};

use super::ContainerMeta;

const COMPOSE_SERVICE: &str = "com.docker.compose.service";

/// A container of a Kubernetes pod: the workload from the pod name.
pub(super) fn kube_meta(name: &str, namespace: &str, pod: &str) -> ContainerMeta {
    ContainerMeta {
        name: name.to_string(),
        namespace: namespace.to_string(),
        pod: pod.to_string(),
        workload: workload_from_pod_name(pod),
    }
}

/// A container outside Kubernetes: the Compose service wins over the name.
pub(super) fn local_meta(name: String, labels: &Map<String, Value>) -> ContainerMeta {
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

/// The alphabet of Kubernetes' random name suffixes and of pod-template hashes
/// (`k8s.io/apimachinery/pkg/util/rand`): no vowels, no 0, 1 or 3.
const KUBE_ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// Whether `s` has the shape of a pod-template hash: 6–10 characters of that alphabet, or 6–10
/// digits (Kubernetes before 1.12 hashed differently). Also the test the Kubernetes API's
/// owner references go through (`kube::workload`).
pub(in crate::enrich) fn looks_like_hash(s: &str) -> bool {
    (6..=10).contains(&s.len())
        && (s.bytes().all(|b| KUBE_ALPHANUMS.contains(&b)) || s.bytes().all(|b| b.is_ascii_digit()))
}

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
            && looks_like_hash(hash)
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

/// A plain service: `app@2.service` → name `app@2.service`, workload `app`.
pub(super) fn systemd_meta(unit: &str) -> ContainerMeta {
    let stem = unit.strip_suffix(".service").unwrap_or(unit);
    let workload = stem.split_once('@').map_or(stem, |(template, _)| template);
    ContainerMeta {
        name: unit.to_string(),
        workload: workload.to_string(),
        ..ContainerMeta::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
