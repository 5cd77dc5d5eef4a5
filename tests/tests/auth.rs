//! `--auth kube` with the real agent binary: its Kubernetes client (from a kubeconfig) pointed
//! at a local API-server double that answers TokenReviews and SubjectAccessReviews and counts
//! them. Tokens, Host headers, `--auth-metrics`, the counters, `drainwatch report` with
//! `DRAINWATCH_TOKEN`, and an API server gone (fail closed).

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use drainwatch_tests::agent::{Agent, binary, metric_sum};
use serde_json::{Value, json};

/// Tokens: `alice` may read everything, `bob` only /metrics; others are not authenticated.
struct Double {
    addr: String,
    reviews: Arc<AtomicUsize>,
    down: Arc<AtomicBool>,
}

fn answer(path: &str, mut body: Value) -> (u16, Value) {
    match path {
        "/apis/authentication.k8s.io/v1/tokenreviews" => {
            let user = match body["spec"]["token"].as_str() {
                Some("alice") => Some("alice"),
                Some("bob") => Some("bob"),
                _ => None,
            };
            body["status"] = json!({"authenticated": user.is_some(),
                "user": user.map(|u| json!({"username": u}))});
            (201, body)
        }
        "/apis/authorization.k8s.io/v1/subjectaccessreviews" => {
            let s = &body["spec"];
            let pods_proxy = s["resourceAttributes"]
                == json!({"namespace": "drainwatch", "verb": "get", "group": "",
                    "version": "v1", "resource": "pods", "subresource": "proxy"});
            let metrics = s["nonResourceAttributes"] == json!({"path": "/metrics", "verb": "get"});
            let allowed = match s["user"].as_str() {
                Some("alice") => pods_proxy || metrics,
                Some("bob") => metrics,
                _ => false,
            };
            body["status"] = json!({"allowed": allowed});
            (201, body)
        }
        // The pod watch: nothing here.
        _ => (
            404,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404}),
        ),
    }
}

fn serve(mut s: TcpStream, reviews: &AtomicUsize) -> Option<()> {
    let mut r = BufReader::new(s.try_clone().ok()?);
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let path = line.split(' ').nth(1)?.split('?').next()?.to_string();
    let mut len = 0;
    loop {
        let mut h = String::new();
        r.read_line(&mut h).ok()?;
        if h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            len = v.trim().parse().ok()?;
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if path.contains("review") {
        reviews.fetch_add(1, Ordering::SeqCst);
    }
    let (status, answer) = answer(&path, body);
    let text = answer.to_string();
    write!(
        s,
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    )
    .ok()
}

impl Double {
    fn start() -> Self {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let (reviews, down) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (r, d) = (reviews.clone(), down.clone());
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                // "Down": connections are closed unanswered.
                if !d.load(Ordering::SeqCst) {
                    let r = r.clone();
                    std::thread::spawn(move || serve(s, &r));
                }
            }
        });
        Self {
            addr,
            reviews,
            down,
        }
    }
}

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
    let api = Double::start();
    let kubeconfig =
        std::env::temp_dir().join(format!("dw-auth-{}.kubeconfig", std::process::id()));
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: d, cluster: {{server: \"http://{}\"}}}}]\n\
             users: [{{name: u, user: {{token: agent}}}}]\n\
             contexts: [{{name: c, context: {{cluster: d, user: u, namespace: drainwatch}}}}]\n\
             current-context: c\n",
            api.addr
        ),
    )
    .unwrap();
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
