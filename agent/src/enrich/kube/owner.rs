//! Pure: the workload that owns a pod (what a rollout replaces) and the revision that made it,
//! from the pod's controller owner reference and labels, with no other API call.

use k8s_openapi::api::core::v1::Pod;

use crate::enrich::runtime_meta::looks_like_hash;

/// The workload a pod belongs to: what a rollout replaces, and which rollout made the pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Workload {
    /// Deployment, StatefulSet, DaemonSet, Job, CronJob, ReplicaSet, StaticPod, Pod, or the
    /// kind of a custom controller.
    pub kind: String,
    pub name: String,
    /// The pod template's hash: `pod-template-hash` for a Deployment's pods,
    /// `controller-revision-hash` for a StatefulSet's or DaemonSet's, the static pod's config
    /// hash; "" when there is none (a Job, a bare pod).
    pub revision: String,
}

const POD_TEMPLATE_HASH: &str = "pod-template-hash";
const CONTROLLER_REVISION_HASH: &str = "controller-revision-hash";
/// The kubelet's hash of a static pod's manifest, on its mirror pod.
const CONFIG_HASH: &str = "kubernetes.io/config.hash";

/// The workload that owns a pod, from its controller's owner reference and its labels.
///
/// No extra API call and no extra RBAC (the agent may only list and watch pods): the owner of a
/// ReplicaSet, and of a Job, is derived from naming conventions of their controllers instead of
/// reading the ReplicaSet or Job:
/// - ReplicaSet `<deployment>-<pod-template-hash>` (the Deployment controller's naming):
///   Deployment `<deployment>`, revision the hash. Kubernetes before 1.11 hashed the name and
///   the label differently: then a `-<hash>` shaped last part still names the Deployment. A
///   ReplicaSet without the label is a bare ReplicaSet.
/// - Job `<cronjob>-<scheduled time in minutes>` (the CronJob controller's naming, 8+ digits):
///   CronJob `<cronjob>`, so every run of a CronJob is one workload (metric series stay
///   bounded); other Jobs are themselves.
/// - StatefulSet, DaemonSet: revision from `controller-revision-hash` (a StatefulSet's is its
///   ControllerRevision's name `<sts>-<hash>`: only the hash is kept).
/// - A mirror pod (owner kind Node): a static pod, named without the `-<node>` suffix the
///   kubelet appends, revision its config hash.
/// - No owner: a bare pod, the pod itself.
pub fn workload(pod: &Pod) -> Workload {
    let meta = &pod.metadata;
    let pod_name = meta.name.clone().unwrap_or_default();
    let label = |k: &str| {
        meta.labels
            .as_ref()
            .and_then(|l| l.get(k))
            .cloned()
            .unwrap_or_default()
    };
    let owners = meta.owner_references.as_deref().unwrap_or_default();
    let Some(owner) = owners
        .iter()
        .find(|o| o.controller == Some(true))
        .or(owners.first())
    else {
        return Workload {
            kind: "Pod".into(),
            name: pod_name,
            revision: String::new(),
        };
    };
    let w = |kind: &str, name: &str, revision: String| Workload {
        kind: kind.into(),
        name: name.into(),
        revision,
    };
    match owner.kind.as_str() {
        "ReplicaSet" => {
            let hash = label(POD_TEMPLATE_HASH);
            if hash.is_empty() {
                return w("ReplicaSet", &owner.name, String::new());
            }
            if let Some(base) = owner.name.strip_suffix(&format!("-{hash}"))
                && !base.is_empty()
            {
                return w("Deployment", base, hash);
            }
            match owner.name.rsplit_once('-') {
                Some((base, suffix)) if !base.is_empty() && looks_like_hash(suffix) => {
                    w("Deployment", base, suffix.to_string())
                }
                _ => w("ReplicaSet", &owner.name, hash),
            }
        }
        "StatefulSet" | "DaemonSet" => {
            let rev = label(CONTROLLER_REVISION_HASH);
            let rev = rev
                .strip_prefix(&format!("{}-", owner.name))
                .map_or(rev.clone(), str::to_string);
            w(&owner.kind, &owner.name, rev)
        }
        "Job" => match owner.name.rsplit_once('-') {
            Some((base, minutes))
                if !base.is_empty()
                    && minutes.len() >= 8
                    && minutes.bytes().all(|b| b.is_ascii_digit()) =>
            {
                w("CronJob", base, String::new())
            }
            _ => w("Job", &owner.name, String::new()),
        },
        "Node" => {
            let name = pod_name
                .strip_suffix(&format!("-{}", owner.name))
                .filter(|b| !b.is_empty())
                .unwrap_or(&pod_name);
            let hash = meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(CONFIG_HASH))
                .cloned()
                .unwrap_or_default();
            w("StaticPod", name, hash)
        }
        _ => {
            let rev = Some(label(CONTROLLER_REVISION_HASH))
                .filter(|r| !r.is_empty())
                .unwrap_or_else(|| label(POD_TEMPLATE_HASH));
            w(&owner.kind, &owner.name, rev)
        }
    }
}
