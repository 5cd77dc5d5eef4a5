//! `report --cluster`'s real I/O (`cluster_kube::collect`: pod list, pod proxy, merge) against
//! a local API-server double serving the DaemonSet's pods and two agents' answers, one broken.

use std::time::Duration;

use serde_json::json;

use super::{
    cluster_kube,
    kube_double::{Double, HANG},
};

fn pod(name: &str, node: &str, ready: bool) -> serde_json::Value {
    json!({
        "metadata": {"name": name, "namespace": "drainwatch", "labels": {"app.kubernetes.io/name": "drainwatch"}},
        "spec": {"nodeName": node, "containers": [{"name": "drainwatch"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}
    })
}

/// One agent's report API: one stop of the rollout of web replacing revision abc.
fn agent(path: &str, id: &str, at: &str, cut: u64) -> String {
    let v = match path.rsplit('/').next().unwrap_or_default() {
        "stops" => json!([{
            "id": id, "sigterm_at": at, "settled": true, "outcome": "drained",
            "loss": {"inflight_cut": cut},
            "container": {"name": "web", "namespace": "shop", "pod": format!("web-{id}"), "workload": "web", "revision": "abc"}
        }]),
        "deploys" => json!([{
            "id": format!("web-{id}"), "namespace": "shop", "workload": "web", "workload_kind": "Deployment",
            "started_at": at, "last_stop_at": at, "revisions": ["abc"], "stops": [id],
            "outcomes": {"drained": 1}, "loss": {"inflight_cut": cut}
        }]),
        _ => json!([]),
    };
    v.to_string()
}

#[tokio::test]
async fn merges_the_agents_that_answer_through_the_pod_proxy_and_names_those_that_do_not() {
    let api = Double::start(|a| {
        let proxy = "/api/v1/namespaces/drainwatch/pods/";
        if a.path.starts_with("/api/v1/namespaces/drainwatch/pods?") {
            assert!(
                a.path.contains("labelSelector=app.kubernetes.io%2Fname%3Ddrainwatch"),
                "{}",
                a.path
            );
            let list = json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": [
                pod("drainwatch-aaaaa", "node-a", true),
                pod("drainwatch-bbbbb", "node-b", true),
                pod("drainwatch-ccccc", "node-c", true),
                pod("drainwatch-ddddd", "node-d", true),
                pod("drainwatch-eeeee", "node-e", false),
            ]});
            return (200, list.to_string());
        }
        let Some(rest) = a.path.strip_prefix(proxy) else {
            return (404, "{}".into());
        };
        let (pod, api_path) = rest.split_once(":9464/proxy").unwrap();
        match pod {
            "drainwatch-aaaaa" => (200, agent(api_path, "a1", "2026-12-04T10:00:01.000Z", 2)),
            "drainwatch-bbbbb" => (200, agent(api_path, "b1", "2026-12-04T10:00:30.000Z", 3)),
            // What the API server says when it cannot reach the pod.
            "drainwatch-ccccc" => (
                503,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 503,
                       "reason": "ServiceUnavailable",
                       "message": "error trying to reach service: dial tcp 10.0.3.7:9464: connect: connection refused"})
                .to_string(),
            ),
            _ => (200, "<html>not the agent</html>".into()),
        }
    })
    .await;
    let target = cluster_kube::Target {
        namespace: "drainwatch".into(),
        selector: "app.kubernetes.io/name=drainwatch".into(),
        port: 9464,
        timeout: Duration::from_secs(10),
        agent_token: Some("s3cret".into()),
        window: Duration::from_secs(600),
    };
    let r = cluster_kube::collect(&cluster_kube::client(api.config()).unwrap(), &target)
        .await
        .unwrap();

    assert_eq!(r.agents, 5);
    assert_eq!(r.deploys.len(), 1, "{r:#?}");
    let d = &r.deploys[0];
    assert_eq!(d.nodes, ["node-a", "node-b"]);
    assert_eq!(d.deploy.stops, ["a1", "b1"]);
    assert_eq!(d.deploy.loss.inflight_cut, 5);
    assert_eq!(r.stops.len(), 2);
    assert_eq!(r.stops[0].container.node, "node-b");
    let failed: Vec<(&str, &str)> = r
        .unanswered
        .iter()
        .map(|f| (f.node.as_str(), f.error.as_str()))
        .collect();
    assert_eq!(failed.len(), 3, "{failed:?}");
    assert_eq!(failed[0].0, "node-c");
    assert!(
        failed[0].1.ends_with(": 503 ServiceUnavailable: error trying to reach service: dial tcp 10.0.3.7:9464: connect: connection refused"),
        "{failed:?}"
    );
    assert!(
        failed[1].0 == "node-d" && failed[1].1.contains("not valid JSON"),
        "{failed:?}"
    );
    assert_eq!(failed[2], ("node-e", "pod not ready"));

    let asked = api.asked();
    let proxied: Vec<_> = asked
        .iter()
        .filter(|a| a.path.contains("/proxy/"))
        .collect();
    // Four documents from each of the four ready agents; none from the pod not ready.
    assert_eq!(
        proxied.len(),
        16,
        "{:?}",
        proxied.iter().map(|a| &a.path).collect::<Vec<_>>()
    );
    assert!(proxied.iter().all(|a| a.method == "GET"
        && a.headers.get(cluster_kube::AGENT_TOKEN_HEADER).unwrap() == "Bearer s3cret"));

    let text = super::cluster::render(&r);
    assert!(
        text.starts_with("CLUSTER: 2 of 5 agents answered\n"),
        "{text}"
    );
    assert!(
        text.contains("NO ANSWER from drainwatch-ccccc on node node-c"),
        "{text}"
    );
}

#[tokio::test]
async fn an_agent_that_hangs_is_named_after_the_timeout() {
    let api = Double::start(|a| {
        if a.path.contains("/proxy/") {
            return (HANG, String::new());
        }
        let list = json!({"kind": "PodList", "apiVersion": "v1", "metadata": {},
                          "items": [pod("drainwatch-aaaaa", "node-a", true)]});
        (200, list.to_string())
    })
    .await;
    let target = cluster_kube::Target {
        namespace: "drainwatch".into(),
        selector: "app.kubernetes.io/name=drainwatch".into(),
        port: 9464,
        timeout: Duration::from_millis(300),
        agent_token: None,
        window: Duration::from_secs(600),
    };
    let r = cluster_kube::collect(&cluster_kube::client(api.config()).unwrap(), &target)
        .await
        .unwrap();
    assert_eq!(r.unanswered.len(), 1);
    assert!(
        r.unanswered[0].error.starts_with("no answer within"),
        "{r:?}"
    );
}
