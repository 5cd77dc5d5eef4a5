//! A Kubernetes API-server double for the agent's `--auth kube`: it answers TokenReviews and
//! SubjectAccessReviews and counts them; every other path (the pod watch) is a 404, so names
//! come from the runtime's state. Plain HTTP from a kubeconfig.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
};

use serde_json::{Value, json};

/// Tokens: `alice` may read everything, `bob` only /metrics; others are not authenticated.
pub struct ApiDouble {
    /// `ip:port` it serves on.
    pub addr: String,
    /// TokenReviews and SubjectAccessReviews answered.
    pub reviews: Arc<AtomicUsize>,
    /// Set: connections are closed unanswered (the API server gone).
    pub down: Arc<AtomicBool>,
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

impl ApiDouble {
    /// Serves on `ip` (loopback, or an address of a network the test made for containers).
    pub fn start(ip: &str) -> Self {
        let l = TcpListener::bind((ip, 0)).unwrap();
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

    /// A kubeconfig at `path` pointing at this double, as the agent's user (token `agent`) in
    /// the namespace `drainwatch`; `ca`, a certificate authority file as the client will see
    /// its path (unused over plain HTTP, but kube-rs loads the system's roots without one, and
    /// an image without them cannot build a client; a pod's in-cluster config always has one).
    pub fn kubeconfig(&self, path: &Path, ca: Option<&str>) {
        let ca = ca.map_or(String::new(), |c| format!(", certificate-authority: {c}"));
        std::fs::write(
            path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters: [{{name: d, cluster: {{server: \"http://{}\"{ca}}}}}]\n\
                 users: [{{name: u, user: {{token: agent}}}}]\n\
                 contexts: [{{name: c, context: {{cluster: d, user: u, namespace: drainwatch}}}}]\n\
                 current-context: c\n",
                self.addr
            ),
        )
        .unwrap();
    }
}
