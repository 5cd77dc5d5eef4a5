//! `--auth kube` with the real agent binary: its Kubernetes client (from a kubeconfig) pointed
//! at a local API-server double that answers TokenReviews and SubjectAccessReviews and counts
//! them. Tokens, Host headers, `--auth-metrics`, the counters, `drainwatch report` with
//! `DRAINWATCH_TOKEN`, and an API server gone (fail closed).

use std::{
    io::{Read, Write},
    net::TcpStream,
    sync::atomic::Ordering,
    time::Duration,
};

use drainwatch_tests::{
    agent::{Agent, binary, metric_sum},
    kube_api::ApiDouble,
};
use serde_json::Value;

/// GET with a Host header and maybe a token: status and body.
fn get(port: u16, path: &str, host: &str, token: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_string())
}

fn auth_count(port: u16, result: &str) -> f64 {
    let (status, text) = get(port, "/metrics", "localhost", Some("bob"));
    assert_eq!(status, 200);
    metric_sum(
        &text,
        "drainwatch_auth_requests_total",
        &[("result", result)],
    )
}

#[test]
fn the_agent_asks_the_api_server_and_fails_closed_without_it() {
    let api = ApiDouble::start("127.0.0.1");
    let kubeconfig =
        std::env::temp_dir().join(format!("dw-auth-{}.kubeconfig", std::process::id()));
    api.kubeconfig(&kubeconfig, None);
    let env = format!("KUBECONFIG={}", kubeconfig.display());
    let agent = Agent::start_wrapped(
        &["env", &env],
        &[
            "--kube",
            "on",
            "--node-name",
            "n1",
            "--auth",
            "kube",
            "--auth-metrics",
        ],
    );
    let port = agent.port;
    let here = format!("127.0.0.1:{port}");

    assert_eq!(get(port, "/api/v1/stops", &here, None).0, 401);
    assert_eq!(get(port, "/api/v1/stops", &here, Some("mallory")).0, 401);
    let (status, body) = get(port, "/api/v1/stops", &here, Some("alice"));
    assert_eq!(status, 200);
    assert!(serde_json::from_str::<Value>(&body).unwrap().is_array());
    assert_eq!(get(port, "/", "localhost", Some("bob")).0, 403);
    assert_eq!(get(port, "/metrics", &here, None).0, 401);
    assert_eq!(get(port, "/metrics", &here, Some("bob")).0, 200);
    assert_eq!(get(port, "/healthz", "anything", None).0, 200);
    assert_eq!(get(port, "/", "rebound.evil.example", Some("alice")).0, 421);
    // mallory, alice (2), bob on / (2), bob on /metrics (2).
    assert_eq!(api.reviews.load(Ordering::SeqCst), 7);
    // Cached: asked again, nothing reaches the API server.
    assert_eq!(get(port, "/api/v1/deploys", &here, Some("alice")).0, 200);
    assert_eq!(api.reviews.load(Ordering::SeqCst), 7);

    // drainwatch report with and without a token.
    let report = |token: Option<&str>| {
        let mut c = std::process::Command::new(binary());
        c.args(["report", "--agent", &here])
            .env_remove("DRAINWATCH_TOKEN");
        if let Some(t) = token {
            c.env("DRAINWATCH_TOKEN", t);
        }
        c.output().unwrap()
    };
    let refused = report(None);
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("401"));
    let ok = report(Some("alice"));
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );

    let text = get(port, "/metrics", &here, Some("bob")).1;
    assert_eq!(
        metric_sum(
            &text,
            "drainwatch_http_rejected_total",
            &[("reason", "host")]
        ),
        1.0
    );
    assert_eq!(
        auth_count(port, "unauthenticated"),
        4.0,
        "none, mallory, /metrics, report"
    );
    assert_eq!(auth_count(port, "denied"), 1.0);
    assert_eq!(auth_count(port, "error"), 0.0);

    // The API server goes: a token not cached is refused (503), counted; probes still answer.
    api.down.store(true, Ordering::SeqCst);
    assert_eq!(get(port, "/api/v1/stops", &here, Some("carol")).0, 503);
    assert_eq!(auth_count(port, "error"), 1.0);
    assert_eq!(get(port, "/readyz", &here, None).0, 200);
    let _ = std::fs::remove_file(&kubeconfig);
}
