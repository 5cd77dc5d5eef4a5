//! `drainwatch report --cluster`, the real binary: a kubeconfig pointing at a local API-server
//! double (plain HTTP on loopback) that lists three agent pods and answers the pod proxy for
//! two of them, halves of one rollout; for the third it answers what the API server does when
//! it cannot reach a pod (503). Not privileged.

use std::{
    io::{Read, Write},
    net::TcpListener,
    process::{Command, Output},
};

use drainwatch::export::cluster::ClusterReport;
use drainwatch_tests::agent::binary;
use serde_json::{Value, json};

fn pod(name: &str, node: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "drainwatch"},
        "spec": {"nodeName": node, "containers": [{"name": "drainwatch"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    })
}

/// One agent's report API: its node's stop of the rollout of shop/web replacing revision abc.
fn agent(doc: &str, id: &str, at: &str) -> Value {
    match doc {
        "stops" => json!([{
            "id": id, "sigterm_at": at, "settled": true, "outcome": "drained",
            "loss": {"inflight_cut": 1},
            "container": {"name": "web", "namespace": "shop", "pod": format!("web-{id}"),
                          "workload": "web", "workload_kind": "Deployment", "revision": "abc"}
        }]),
        "deploys" => json!([{
            "id": format!("web-{id}"), "namespace": "shop", "workload": "web",
            "workload_kind": "Deployment", "started_at": at, "last_stop_at": at,
            "revisions": ["abc"], "stops": [id], "outcomes": {"drained": 1},
            "loss": {"inflight_cut": 1}
        }]),
        _ => json!([]),
    }
}

fn answer(path: &str) -> (u16, Value) {
    if path.starts_with("/api/v1/namespaces/drainwatch/pods?") {
        let items = [
            pod("drainwatch-a", "node-a"),
            pod("drainwatch-b", "node-b"),
            pod("drainwatch-c", "node-c"),
        ];
        return (
            200,
            json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}),
        );
    }
    let doc = path.rsplit('/').next().unwrap_or_default();
    if path.contains("/pods/drainwatch-a:9464/proxy/api/v1/") {
        return (200, agent(doc, "a1", "2026-12-04T10:00:01.000Z"));
    }
    if path.contains("/pods/drainwatch-b:9464/proxy/api/v1/") {
        return (200, agent(doc, "b1", "2026-12-04T10:00:09.000Z"));
    }
    (
        503,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 503,
               "reason": "ServiceUnavailable", "message": "error trying to reach service: dial tcp 10.0.3.7:9464: connect: connection refused"}),
    )
}

/// The double: one request per connection (`Connection: close`), each answered by `answer`.
fn serve() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head);
                let path = head.split(' ').nth(1).unwrap_or_default().to_string();
                let (status, body) = answer(&path);
                let body = body.to_string();
                let _ = write!(
                    s,
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    port
}

fn report(port: u16, args: &[&str]) -> Output {
    let kubeconfig = std::env::temp_dir().join(format!("dw-cluster-{port}.kubeconfig"));
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: double, cluster: {{server: \"http://127.0.0.1:{port}\"}}}}]\nusers: [{{name: u, user: {{token: t}}}}]\ncontexts: [{{name: c, context: {{cluster: double, user: u}}}}]\ncurrent-context: c\n"
        ),
    )
    .unwrap();
    let out = Command::new(binary())
        .args(["report", "--cluster"])
        .args(args)
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&kubeconfig);
    out
}

#[test]
fn the_binary_merges_two_nodes_and_names_the_third_that_did_not_answer() {
    let port = serve();

    let out = report(port, &["--json"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("1 of 3 agents did not answer: drainwatch-c on node-c"),
        "{stderr}"
    );
    let r: ClusterReport = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r.agents, 3);
    assert_eq!(r.deploys.len(), 1, "{r:#?}");
    assert_eq!(r.deploys[0].nodes, ["node-a", "node-b"]);
    assert_eq!(r.deploys[0].deploy.stops, ["a1", "b1"]);
    assert_eq!(r.deploys[0].deploy.loss.inflight_cut, 2);
    assert_eq!(r.unanswered.len(), 1);
    assert_eq!(r.unanswered[0].node, "node-c");
    assert!(
        r.unanswered[0].error.contains("503 ServiceUnavailable"),
        "{:?}",
        r.unanswered
    );

    let out = report(port, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text.starts_with(
            "CLUSTER: 2 of 3 agents answered\nNO ANSWER from drainwatch-c on node node-c"
        ),
        "{text}"
    );
    assert!(text.contains("  nodes: node-a, node-b\n"), "{text}");

    // The gate over every node: one line, the two nodes' stops (1 request cut each), and the
    // third's missing stops fail it on their own.
    for (since, stops, cut) in [
        ("30d", 2, "requests-cut 2 > 0"),
        ("1m", 0, "requests-cut 0,"),
    ] {
        let out = report(port, &["--gate", "shop/web", "--since", since]);
        let line = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{line}");
        assert_eq!(line.lines().count(), 1, "{line}");
        assert!(
            line.starts_with(&format!(
                "drainwatch gate FAIL shop/web: {stops} stop(s) in the last "
            )),
            "{line}"
        );
        assert!(line.contains(cut), "{line}");
        assert!(
            line.ends_with("; 1 agent(s) did not answer: their nodes' stops are missing\n"),
            "{line}"
        );
    }
}

#[test]
fn without_any_cluster_configuration_it_exits_2() {
    let missing = std::env::temp_dir().join("dw-no-such.kubeconfig");
    let out = Command::new(binary())
        .args(["report", "--cluster"])
        .env("KUBECONFIG", &missing)
        .env("HOME", std::env::temp_dir())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).starts_with("drainwatch report --cluster: "),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
