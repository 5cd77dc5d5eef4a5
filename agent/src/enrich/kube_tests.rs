//! Kubernetes metadata: the pure core on recorded pod objects (`agent/fixtures/kube/`, see its
//! README), the enricher naming containers from the store, and the real kube-runtime watcher
//! against a local HTTP server that replays a recorded list/watch session with a 410 Gone.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::{Request, Response, body::Frame, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use prometheus_client::registry::Registry;
use serde_json::Value;

use super::{
    cgroup_path::CgroupOwner,
    host::{HostView, ProcInfo, SocketEntry},
    kube::*,
    runtime_meta::ContainerMeta,
};
use crate::{
    correlate::stops::Tracker,
    export::api::{Clock, stop_view},
    model::{ContainerIdentity, Observation, SECOND, Sender, monotonic_now},
};

macro_rules! fixture {
    ($name:literal) => {
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/kube/",
            $name
        ))
    };
}

fn pod(text: &str) -> Pod {
    serde_json::from_str(text).expect("fixture is a Pod")
}

fn record(text: &str) -> PodRecord {
    pod_record(&pod(text)).expect("fixture has uid and name")
}

const STS: &str = fixture!("pod-statefulset-crio.json");
const DS: &str = fixture!("pod-daemonset-docker.json");
const OLD_DEPLOY: &str = fixture!("pod-deployment-k8s-1.10-docker.json");
const BARE: &str = fixture!("pod-bare-containerd.json");
const STATIC: &str = fixture!("pod-static-docker.json");
const DEPLOY: &str = fixture!("pod-deployment-containerd-prestop.json");
const JOB: &str = fixture!("pod-job-cronjob-containerd.json");

const NGINX_ID: &str = "a5b63f24b13e5558459486bd5b5b1ba32049864de799b3456a5c94a48894c83a";
const NGINX_OLD_ID: &str = "aace21575819916cdfa3d29c15658c55e922c5167d87d88d2a91cc5b90dbb6df";
const NGINX_UID: &str = "5c5ae1c4-3bd1-4ab8-9f51-2d2b9d3e7a10";

fn w(kind: &str, name: &str, revision: &str) -> Workload {
    Workload {
        kind: kind.into(),
        name: name.into(),
        revision: revision.into(),
    }
}

#[test]
fn container_ids_lose_their_runtime_prefix() {
    assert_eq!(container_id("containerd://757c70c4"), Some("757c70c4"));
    assert_eq!(container_id("cri-o://301e55a5"), Some("301e55a5"));
    assert_eq!(container_id("docker://14572de8"), Some("14572de8"));
    assert_eq!(container_id("containerd://"), None);
    assert_eq!(container_id(""), None);
}

#[test]
fn owner_references_name_each_kind_of_workload_and_its_revision() {
    // StatefulSet: controller-revision-hash is `<sts>-<hash>`; the hash is the revision.
    assert_eq!(
        workload(&pod(STS)),
        w("StatefulSet", "workbench", "5b68f78f58")
    );
    // DaemonSet: the label is the hash alone.
    assert_eq!(
        workload(&pod(DS)),
        w("DaemonSet", "gravity-site", "2853577482")
    );
    // Deployment through its ReplicaSet, label and name agreeing (Kubernetes 1.11+).
    assert_eq!(
        workload(&pod(DEPLOY)),
        w("Deployment", "nginx-deployment", "75675f5897")
    );
    // Kubernetes 1.10: label 1554960883, ReplicaSet bandwagon-5998fb4dd7.
    assert_eq!(
        workload(&pod(OLD_DEPLOY)),
        w("Deployment", "bandwagon", "5998fb4dd7")
    );
    // A CronJob's Job `<cronjob>-<minutes>`.
    assert_eq!(workload(&pod(JOB)), w("CronJob", "hello", ""));
    // Static pod: owner Node, name without `-<node>`, revision the manifest hash.
    assert_eq!(
        workload(&pod(STATIC)),
        w(
            "StaticPod",
            "kube-apiserver",
            "01d7e312da0f9c4176daa8464d4d1a50"
        )
    );
    // No owner.
    assert_eq!(workload(&pod(BARE)), w("Pod", "hello-world", ""));
}

/// Variants of the recorded pods for owners the recordings do not cover.
#[test]
fn bare_replicasets_plain_jobs_and_custom_controllers() {
    let with_owner = |text: &str, kind: &str, name: &str, labels: Value| {
        let mut v: Value = serde_json::from_str(text).unwrap();
        v["metadata"]["ownerReferences"][0]["kind"] = kind.into();
        v["metadata"]["ownerReferences"][0]["name"] = name.into();
        v["metadata"]["labels"] = labels;
        workload(&serde_json::from_value(v).unwrap())
    };
    // The kuard book's bare ReplicaSet "queue": no pod-template-hash label.
    assert_eq!(
        with_owner(
            DEPLOY,
            "ReplicaSet",
            "queue",
            serde_json::json!({"app": "work-queue"})
        ),
        w("ReplicaSet", "queue", "")
    );
    // A Job created by hand: its own name.
    assert_eq!(
        with_owner(
            JOB,
            "Job",
            "db-migrate",
            serde_json::json!({"job-name": "db-migrate"})
        ),
        w("Job", "db-migrate", "")
    );
    // A custom controller (OpenKruise CloneSet) sets controller-revision-hash.
    assert_eq!(
        with_owner(
            DEPLOY,
            "CloneSet",
            "shop",
            serde_json::json!({"controller-revision-hash": "shop-6f9c8d7b5"})
        ),
        w("CloneSet", "shop", "shop-6f9c8d7b5")
    );
}

#[test]
fn pod_records_map_container_ids_to_names_grace_and_prestop() {
    let sts = record(STS);
    assert_eq!(sts.uid, "6de9706e-5065-41b2-84a6-7a568404b0d1");
    assert_eq!(
        (sts.namespace.as_str(), sts.node.as_str()),
        ("project", "user-xz6d2-worker-0-hw2hq")
    );
    assert_eq!(sts.grace_spec_seconds, Some(30));
    assert_eq!(sts.grace_deletion_seconds, None);
    let names: Vec<(&str, &[String], Option<bool>)> = sts
        .containers
        .iter()
        .map(|c| (c.name.as_str(), c.ids.as_slice(), c.prestop))
        .collect();
    assert_eq!(
        names,
        [
            (
                "oauth-proxy",
                &["301e55a5d64e84198a8853a5b73728ed573fb71c8c21b919c54211c76e4553c3".to_string()][..],
                Some(false)
            ),
            (
                "workbench",
                &["1ffcc8a0f9da842efcc209cdf62b7a3143dcffe21344facd0433fb46a39ff659".to_string()][..],
                Some(false)
            ),
        ]
    );
    // The running container and the one before its restart.
    let dep = record(DEPLOY);
    assert_eq!(dep.containers.len(), 1);
    assert_eq!(dep.containers[0].ids, [NGINX_ID, NGINX_OLD_ID]);
    assert_eq!(dep.containers[0].prestop, Some(true));
    // Ready since 2024-06-25T15:19:24Z; a pod whose Ready condition is false (or absent) has
    // no ready time.
    assert_eq!(dep.ready_at, Some(1_719_328_764));
    assert_eq!(record(BARE).ready_at, None);
    let mut v: Value = serde_json::from_str(DEPLOY).unwrap();
    v["status"]["conditions"][2]["status"] = "False".into();
    assert_eq!(
        pod_record(&serde_json::from_value(v).unwrap())
            .unwrap()
            .ready_at,
        None
    );
    let stat = record(STATIC);
    assert_eq!(
        stat.containers[0].ids,
        [
            "9e698d29975f1685151fb5ef39881c9548cca4254ff8b849b90a3aba0b98a422",
            "8effb839686f18678aaef9611a78a2e99a197c2fb2f5aee10b52414b9a415cfb"
        ]
    );
    // A completed Job's container: the id is in state.terminated too (once).
    assert_eq!(
        record(JOB).containers[0].ids,
        ["010f02d103d1db48531327a1fe09797c87c1d50b6a216892319b3af93e0f56e7"]
    );
    // Without uid or name a pod is no record.
    let mut v: Value = serde_json::from_str(BARE).unwrap();
    v["metadata"].as_object_mut().unwrap().remove("uid");
    assert!(matches!(
        pod_record(&serde_json::from_value(v).unwrap()),
        Err(KubeError::Missing("uid"))
    ));
}

#[test]
fn the_store_answers_by_container_id_or_pod_uid_and_keeps_deleted_pods_for_the_retention() {
    let mut store = Store::new(300 * SECOND);
    store.apply(SECOND, WatchEvent::Init);
    store.apply(SECOND, WatchEvent::InitApply(record(DEPLOY)));
    store.apply(SECOND, WatchEvent::InitApply(record(BARE)));
    assert!(!store.synced(), "not synced before the list is complete");
    assert!(
        store.lookup(NGINX_ID, None).is_none(),
        "a list in progress is applied at InitDone"
    );
    store.apply(SECOND, WatchEvent::InitDone);
    assert!(store.synced());
    assert_eq!(store.live_pods(), 2);

    let k = store.lookup(NGINX_ID, None).unwrap();
    assert_eq!(
        k,
        KubeMeta {
            pod: "nginx-deployment-75675f5897-kzszj".into(),
            namespace: "default".into(),
            node: "c1-node1".into(),
            pod_uid: NGINX_UID.into(),
            container: Some("nginx".into()),
            workload: w("Deployment", "nginx-deployment", "75675f5897"),
            grace_configured_seconds: Some(30),
            prestop: Some(true),
            ready_at: Some(1_719_328_764),
        }
    );
    assert_eq!(
        store
            .lookup(NGINX_OLD_ID, None)
            .unwrap()
            .container
            .as_deref(),
        Some("nginx")
    );
    // The sandbox: no status lists its id, its cgroup path names the pod.
    let sandbox = store.lookup("f00d", Some(NGINX_UID)).unwrap();
    assert_eq!(sandbox.container, None);
    assert_eq!(sandbox.prestop, None);
    assert_eq!(sandbox.pod, "nginx-deployment-75675f5897-kzszj");
    assert!(store.lookup("f00d", None).is_none());

    // Deleted with a grace period of its own, then the kubelet's final delete (grace 0).
    let mut v: Value = serde_json::from_str(DEPLOY).unwrap();
    v["metadata"]["deletionGracePeriodSeconds"] = 45.into();
    store.apply(2 * SECOND, WatchEvent::Apply(record(&v.to_string())));
    v["metadata"]["deletionGracePeriodSeconds"] = 0.into();
    store.apply(3 * SECOND, WatchEvent::Delete(record(&v.to_string())));
    assert_eq!(store.deleted(NGINX_UID), Some(true));
    assert_eq!(store.live_pods(), 1);
    assert_eq!(
        store
            .lookup(NGINX_ID, None)
            .unwrap()
            .grace_configured_seconds,
        Some(45)
    );
    store.expire(3 * SECOND + 299 * SECOND);
    assert!(
        store.lookup(NGINX_ID, None).is_some(),
        "within the retention"
    );
    let generation = store.generation();
    store.expire(3 * SECOND + 300 * SECOND);
    assert!(store.lookup(NGINX_ID, None).is_none(), "past the retention");
    assert!(store.lookup(NGINX_OLD_ID, None).is_none());
    assert!(store.generation() > generation);
    assert!(
        store
            .lookup(
                "757c70c48a431c72d2facb2a3fa91c662922687eb9264195379fde9544f38dee",
                None
            )
            .is_some()
    );
}

#[test]
fn a_relist_marks_pods_it_no_longer_lists_as_deleted() {
    let mut store = Store::new(300 * SECOND);
    for ev in [
        WatchEvent::Init,
        WatchEvent::InitApply(record(DEPLOY)),
        WatchEvent::InitApply(record(BARE)),
        WatchEvent::InitDone,
        // 410 Gone: the watcher lists again; the bare pod was deleted meanwhile.
        WatchEvent::Init,
        WatchEvent::InitApply(record(DEPLOY)),
        WatchEvent::InitApply(record(DS)),
        WatchEvent::InitDone,
    ] {
        store.apply(10 * SECOND, ev);
    }
    assert_eq!(
        store.deleted("0b295a7b-7365-44a0-a983-708112008c8b"),
        Some(true)
    );
    assert_eq!(store.deleted(NGINX_UID), Some(false));
    assert_eq!(store.live_pods(), 2);
    // Still answerable until the retention ends.
    assert!(
        store
            .lookup(
                "757c70c48a431c72d2facb2a3fa91c662922687eb9264195379fde9544f38dee",
                None
            )
            .is_some()
    );
}

#[test]
fn a_container_keeps_its_old_ids_across_updates_up_to_a_bound() {
    let mut store = Store::new(300 * SECOND);
    let mut v: Value = serde_json::from_str(DEPLOY).unwrap();
    store.apply(SECOND, WatchEvent::Apply(record(&v.to_string())));
    // Ten more restarts: each update lists the new id and the one before.
    for i in 0..10u32 {
        let prev = v["status"]["containerStatuses"][0]["containerID"].clone();
        v["status"]["containerStatuses"][0]["lastState"]["terminated"]["containerID"] = prev;
        v["status"]["containerStatuses"][0]["containerID"] =
            format!("containerd://{i:064x}").into();
        store.apply(SECOND, WatchEvent::Apply(record(&v.to_string())));
    }
    // The newest eight runs resolve to the container, older ones no longer resolve.
    for i in 2..10u32 {
        let k = store.lookup(&format!("{i:064x}"), None);
        assert_eq!(
            k.and_then(|k| k.container).as_deref(),
            Some("nginx"),
            "run {i}"
        );
    }
    for old in [format!("{:064x}", 1), NGINX_ID.into(), NGINX_OLD_ID.into()] {
        assert!(store.lookup(&old, None).is_none(), "{old}");
    }
}

#[tokio::test]
async fn a_tls_client_builds_with_rustls_and_ring() {
    // The in-cluster configuration is https: building its connector needs a crypto
    // provider (ring, the only one compiled in) and no network.
    let url: hyper::Uri = "https://10.96.0.1:443".parse().unwrap();
    assert!(kube::Client::try_from(kube::Config::new(url)).is_ok());
}

#[test]
fn named_takes_the_api_names_over_the_runtime_ones() {
    let base = ContainerIdentity {
        id: NGINX_ID.into(),
        runtime: "containerd".into(),
        name: "POD".into(),
        namespace: "default".into(),
        pod: "nginx-deployment-75675f5897-kzszj".into(),
        workload: "nginx-deployment".into(),
        ..Default::default()
    };
    let mut store = Store::new(300 * SECOND);
    store.apply(SECOND, WatchEvent::Apply(record(DEPLOY)));
    let app = named(&base, &store.lookup(NGINX_ID, None).unwrap());
    assert_eq!(app.name, "nginx");
    assert_eq!(app.workload_kind, "Deployment");
    assert_eq!(app.revision, "75675f5897");
    assert_eq!(app.node, "c1-node1");
    assert_eq!(app.stop_policy.prestop, Some(true));
    assert_eq!(app.stop_policy.grace_configured_seconds, Some(30));
    assert_eq!(
        (app.id.as_str(), app.runtime.as_str()),
        (NGINX_ID, "containerd")
    );
    let sandbox = named(&base, &store.lookup("f00d", Some(NGINX_UID)).unwrap());
    assert_eq!(
        sandbox.name, "POD",
        "the runtime's name for a container the pod does not list"
    );
    assert_eq!(sandbox.stop_policy.prestop, None);
}

// ---------------------------------------------------------------------------------------
// The enricher: containers adopted before the API knew their pod get its names later, and a
// stop in progress gets the pod's grace period and preStop hook.

const SANDBOX_ID: &str = "b7e2c0b6a1f64f0e9d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e";

fn kubepods_path(id: &str) -> String {
    format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{id}.scope",
        NGINX_UID.replace('-', "_")
    )
}

struct PodHost;

impl PodHost {
    fn processes(&self) -> Vec<ProcInfo> {
        let p = |pid, id: &str, comm: &str| ProcInfo {
            pid,
            ppid: 1,
            comm: comm.into(),
            ns_pid: Some(1),
            netns: Some(4026532300),
            cgroup_path: Some(kubepods_path(id)),
        };
        vec![p(200, SANDBOX_ID, "pause"), p(201, NGINX_ID, "nginx")]
    }
}

impl HostView for PodHost {
    fn container_pids(&self) -> Vec<(u32, String)> {
        self.processes()
            .into_iter()
            .filter_map(|p| Some((p.pid, p.cgroup_path?)))
            .collect()
    }
    fn process(&self, pid: u32) -> Option<ProcInfo> {
        self.processes().into_iter().find(|p| p.pid == pid)
    }
    fn sockets(&self, _pid: u32) -> Vec<SocketEntry> {
        Vec::new()
    }
    fn socket_inodes(&self, _pid: u32) -> Vec<u64> {
        Vec::new()
    }
    fn local_ips(&self, _pid: u32) -> Vec<std::net::IpAddr> {
        Vec::new()
    }
    fn cgroup_v2_id(&self, _path: &str) -> Option<u64> {
        None
    }
    fn netstat(&self, _pid: u32) -> Option<String> {
        None
    }
    /// What containerd's OCI annotations say (runtime_meta).
    fn metadata(&self, owner: &CgroupOwner) -> ContainerMeta {
        ContainerMeta {
            name: if owner.id == SANDBOX_ID {
                "POD"
            } else {
                "nginx"
            }
            .into(),
            namespace: "default".into(),
            pod: "nginx-deployment-75675f5897-kzszj".into(),
            workload: "nginx-deployment".into(),
        }
    }
}

fn identities(obs: &[Observation]) -> Vec<ContainerIdentity> {
    let mut v: Vec<ContainerIdentity> = obs
        .iter()
        .filter_map(|o| match o {
            Observation::Container { identity, .. } | Observation::Identity { identity } => {
                Some(ContainerIdentity::clone(identity))
            }
            _ => None,
        })
        .collect();
    v.sort_by(|a, b| a.id.cmp(&b.id));
    v
}

#[test]
fn containers_found_before_their_pod_get_its_names_and_a_stop_gets_its_policy() {
    let store: SharedStore = Arc::new(Mutex::new(Store::new(300 * SECOND)));
    let mut enricher = super::Enricher::new(PodHost).with_kube(store.clone());
    let mut tracker = Tracker::default();
    let feed = |t: &mut Tracker, obs: Vec<Observation>| {
        for o in obs {
            t.observe(SECOND, o);
        }
    };

    // The API has not answered yet: the runtime's names.
    let first = enricher.scan();
    let ids = identities(&first);
    assert_eq!(ids.len(), 2);
    assert!(
        first
            .iter()
            .all(|o| matches!(o, Observation::Container { .. }))
    );
    let app = ids.iter().find(|i| i.id == NGINX_ID).unwrap();
    assert_eq!(
        (app.name.as_str(), app.workload.as_str()),
        ("nginx", "nginx-deployment")
    );
    assert_eq!(app.workload_kind, "");
    assert_eq!(app.stop_policy.prestop, None);
    feed(&mut tracker, first);
    assert!(enricher.scan().is_empty(), "nothing new, nothing to say");

    // The first list arrives: both containers get the pod's names.
    {
        let mut s = store.lock().unwrap();
        s.apply(SECOND, WatchEvent::Init);
        s.apply(SECOND, WatchEvent::InitApply(record(DEPLOY)));
        s.apply(SECOND, WatchEvent::InitDone);
    }
    let second = enricher.scan();
    assert!(
        second
            .iter()
            .all(|o| matches!(o, Observation::Identity { .. }))
    );
    let ids = identities(&second);
    assert_eq!(
        ids.iter()
            .map(|i| (
                i.name.as_str(),
                i.workload_kind.as_str(),
                i.revision.as_str(),
                i.node.as_str()
            ))
            .collect::<Vec<_>>(),
        [
            ("nginx", "Deployment", "75675f5897", "c1-node1"),
            ("POD", "Deployment", "75675f5897", "c1-node1"),
        ]
    );
    feed(&mut tracker, second);
    assert!(
        enricher.scan().is_empty(),
        "same store generation, nothing to say"
    );

    // SIGTERM: the stop record carries the pod spec's grace period and preStop hook.
    tracker.observe(
        2 * SECOND,
        Observation::Signal {
            key: std::sync::Arc::new(NGINX_ID.into()),
            sig: 15,
            sender: Sender {
                pid: 900,
                comm: "containerd-shim".into(),
            },
            ignored: None,
        },
    );
    let stop = &tracker.stops()[0];
    assert_eq!(stop.grace_configured_seconds, Some(30));
    assert_eq!(stop.prestop, Some(true));

    // `kubectl delete --grace-period=45` during the stop: the record follows.
    let mut v: Value = serde_json::from_str(DEPLOY).unwrap();
    v["metadata"]["deletionGracePeriodSeconds"] = 45.into();
    store
        .lock()
        .unwrap()
        .apply(2 * SECOND, WatchEvent::Apply(record(&v.to_string())));
    let third = enricher.scan();
    assert_eq!(third.len(), 2, "both containers' policy changed: {third:?}");
    feed(&mut tracker, third);
    let json =
        serde_json::to_value(stop_view(&tracker.stops()[0], &Clock { offset_ns: 0 })).unwrap();
    assert_eq!(json["grace_configured_seconds"], 45);
    assert_eq!(json["prestop"], true);
    assert_eq!(json["container"]["workload_kind"], "Deployment");
    assert_eq!(json["container"]["revision"], "75675f5897");
    assert_eq!(json["container"]["node"], "c1-node1");
    assert_eq!(
        json["container"]["pod"],
        "nginx-deployment-75675f5897-kzszj"
    );
    assert!(json["container"].get("stop_policy").is_none());
}

#[test]
fn without_a_store_the_enricher_names_containers_as_before() {
    let mut enricher = super::Enricher::new(PodHost);
    let ids = identities(&enricher.scan());
    assert_eq!(ids.len(), 2);
    assert!(ids.iter().all(|i| i.workload_kind.is_empty()
        && i.revision.is_empty()
        && i.node.is_empty()
        && i.stop_policy == Default::default()));
    assert!(enricher.scan().is_empty());
}

// ---------------------------------------------------------------------------------------
// The real client and watcher against a local server replaying a recorded session:
// list → watch (ADDED, MODIFIED, DELETED, ERROR 410) → list again → watch (BOOKMARK, DELETED).

type Body = BoxBody<Bytes, Infallible>;

/// A stand-in for the API server: answers `GET /api/v1/pods` lists and watches in order
/// from the fixtures and records what it was asked.
struct FakeApi {
    lists: Vec<&'static str>,
    watches: Vec<Vec<String>>,
    requests: Mutex<Vec<(bool, Option<String>, String)>>,
}

impl FakeApi {
    fn respond(&self, req: &Request<hyper::body::Incoming>) -> Response<Body> {
        let query = req.uri().query().unwrap_or_default().to_string();
        let param = |k: &str| {
            query
                .split('&')
                .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
                .map(str::to_string)
        };
        let watching = param("watch").as_deref() == Some("true");
        let mut requests = self.requests.lock().unwrap();
        let n = requests.iter().filter(|r| r.0 == watching).count();
        requests.push((watching, param("resourceVersion"), query.clone()));
        drop(requests);
        let ok = |body: Body| {
            Response::builder()
                .header("content-type", "application/json")
                .body(body)
                .unwrap()
        };
        if req.uri().path() != "/api/v1/pods" {
            return Response::builder()
                .status(404)
                .body(Full::new(Bytes::from_static(b"{}")).boxed())
                .unwrap();
        }
        if !watching {
            let text = self.lists[n.min(self.lists.len() - 1)];
            return ok(Full::new(Bytes::from_static(text.as_bytes())).boxed());
        }
        let lines = self.watches.get(n).cloned().unwrap_or_default();
        let frames = futures::stream::iter(
            lines
                .into_iter()
                .map(|l| Ok::<_, Infallible>(Frame::data(Bytes::from(l + "\n")))),
        );
        // The first watch ends after its 410 (as the server does); later ones stay open.
        if n == 0 {
            ok(StreamBody::new(frames).boxed())
        } else {
            let open = futures::StreamExt::chain(frames, futures::stream::pending());
            ok(BodyExt::boxed(StreamBody::new(open)))
        }
    }
}

async fn serve(api: Arc<FakeApi>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let api = api.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| {
                    let api = api.clone();
                    async move { Ok::<_, Infallible>(api.respond(&req)) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

fn client(addr: SocketAddr) -> kube::Client {
    let url: hyper::Uri = format!("http://{addr}").parse().unwrap();
    kube::Client::try_from(kube::Config::new(url)).unwrap()
}

/// Waits (bounded) until `done` holds, re-checking as the watch task makes progress.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_real_watcher_relists_after_410_gone_and_keeps_deleted_pods() {
    let lines = |text: &str| text.lines().map(str::to_string).collect::<Vec<_>>();
    let mut first = lines(fixture!("watch/watch-1.jsonl"));
    // A pod object without a uid, before the 410: dropped and counted.
    first.insert(
        3,
        r#"{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"no-uid","namespace":"default","resourceVersion":"10700"}}}"#.into(),
    );
    let api = Arc::new(FakeApi {
        lists: vec![fixture!("watch/list-1.json"), fixture!("watch/list-2.json")],
        watches: vec![first, lines(fixture!("watch/watch-2.jsonl"))],
        requests: Mutex::new(Vec::new()),
    });
    let addr = serve(api.clone()).await;
    let store: SharedStore = Arc::new(Mutex::new(Store::new(300 * SECOND)));
    let mut registry = Registry::default();
    let metrics = KubeMetrics::register(&mut registry);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(watch_pods(
        client(addr),
        "c1-node1".into(),
        store.clone(),
        metrics.clone(),
        monotonic_now,
        stop_rx,
    ));

    until("the relist and the final DELETED", || {
        let s = store.lock().unwrap();
        metrics.relists() == 2 && s.deleted(NGINX_UID) == Some(true)
    })
    .await;

    // What the client asked, in order: list, watch from the list's version, list again
    // after the 410, watch from the new list's version.
    let requests = api.requests.lock().unwrap().clone();
    let asked: Vec<(bool, Option<&str>)> = requests
        .iter()
        .map(|(w, rv, _)| (*w, if *w { rv.as_deref() } else { None }))
        .collect();
    assert_eq!(
        asked,
        [
            (false, None),
            (true, Some("10245")),
            (false, None),
            (true, Some("10731")),
        ],
        "{requests:?}"
    );
    for (_, _, query) in &requests {
        assert!(
            query.contains("fieldSelector=spec.nodeName%3Dc1-node1"),
            "only this node's pods: {query}"
        );
    }

    assert_eq!(metrics.errors("gone"), 1);
    assert_eq!(metrics.errors("invalid_object"), 1);
    for kind in ["list", "watch_start", "watch_stream", "watch_status"] {
        assert_eq!(metrics.errors(kind), 0, "{kind}");
    }
    assert_eq!(metrics.relists(), 2);
    assert_eq!(metrics.reachable(), 1);

    {
        let s = store.lock().unwrap();
        // The Deployment's pod: its deletion grace period (45 s, not the spec's 30) survives
        // the final DELETED (grace 0); both its runs resolve.
        let nginx = s.lookup(NGINX_ID, None).unwrap();
        assert_eq!(
            nginx.workload,
            w("Deployment", "nginx-deployment", "75675f5897")
        );
        assert_eq!(nginx.grace_configured_seconds, Some(45));
        assert_eq!(nginx.prestop, Some(true));
        assert_eq!(s.lookup(NGINX_OLD_ID, None).unwrap().pod, nginx.pod);
        // DELETED by the first watch; missing from the relist (deleted while the watch was
        // down); present: job and DaemonSet pods.
        assert_eq!(
            s.deleted("6de9706e-5065-41b2-84a6-7a568404b0d1"),
            Some(true)
        );
        assert_eq!(
            s.deleted("0b295a7b-7365-44a0-a983-708112008c8b"),
            Some(true)
        );
        assert_eq!(
            s.deleted("d8aa9a47-ad0f-4bbe-bc12-ab31605d3211"),
            Some(false)
        );
        assert_eq!(
            s.deleted("c145fe8c-299c-11e9-a200-42010a800006"),
            Some(false)
        );
        assert_eq!(s.live_pods(), 2);
        assert_eq!(
            s.lookup(
                "1ffcc8a0f9da842efcc209cdf62b7a3143dcffe21344facd0433fb46a39ff659",
                None
            )
            .unwrap()
            .workload,
            w("StatefulSet", "workbench", "5b68f78f58"),
            "a deleted pod resolves for the retention window"
        );
        assert_eq!(
            s.lookup(
                "010f02d103d1db48531327a1fe09797c87c1d50b6a216892319b3af93e0f56e7",
                None
            )
            .unwrap()
            .workload,
            w("CronJob", "hello", "")
        );
    }

    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the watch task ends on shutdown")
        .unwrap();
}

#[tokio::test]
async fn an_unreachable_api_is_counted_and_names_stay_the_runtimes() {
    // A port nobody listens on.
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let store: SharedStore = Arc::new(Mutex::new(Store::new(300 * SECOND)));
    let mut registry = Registry::default();
    let metrics = KubeMetrics::register(&mut registry);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(watch_pods(
        client(addr),
        "c1-node1".into(),
        store.clone(),
        metrics.clone(),
        monotonic_now,
        stop_rx,
    ));
    until("a failed list", || metrics.errors("list") >= 1).await;
    assert_eq!(metrics.reachable(), 0);
    assert!(!store.lock().unwrap().synced());
    let mut enricher = super::Enricher::new(PodHost).with_kube(store);
    let ids = identities(&enricher.scan());
    assert!(
        ids.iter()
            .all(|i| i.workload == "nginx-deployment" && i.workload_kind.is_empty())
    );
    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the watch task ends on shutdown")
        .unwrap();
}

#[tokio::test]
async fn outside_kubernetes_auto_and_off_use_no_api() {
    assert!(
        client_for(Mode::Auto, Some("n".into()), false)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        client_for(Mode::Off, Some("n".into()), true)
            .await
            .unwrap()
            .is_none()
    );
    // In a pod without a node name: no API, no error.
    assert!(client_for(Mode::Auto, None, true).await.unwrap().is_none());
    assert!(matches!(
        client_for(Mode::On, None, false).await,
        Err(KubeError::NoNodeName)
    ));
}
