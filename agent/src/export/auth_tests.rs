//! `--auth kube` end to end: the agent's real HTTP server on 127.0.0.1:0, its guard asking a
//! local API-server double (`kube_double`, answering TokenReviews and SubjectAccessReviews as
//! the Kubernetes API does; the reviews it answered are counted) through a real kube client.

use std::{net::SocketAddr, sync::Arc};

use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewStatus, UserInfo},
    authorization::v1::{SubjectAccessReview, SubjectAccessReviewStatus},
};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{
    auth::Verdict,
    guard::{Guard, GuardMetrics, Hosts, KubeAuth},
    http::{State, serve},
    kube_double::{Answer, Asked, Double},
};
use crate::telemetry::Telemetry;

/// The API server's answer to a review: tokens `alice-token` (user alice, allowed everything),
/// `bob-token` (user bob, allowed /metrics only); any other token is not authenticated.
fn review(asked: &Asked) -> Answer {
    let answer = match path_of(asked) {
        TOKEN_REVIEWS => {
            let mut tr: TokenReview = serde_json::from_slice(&asked.body).unwrap();
            let user = match tr.spec.token.as_deref() {
                Some("alice-token") => Some("alice"),
                Some("bob-token") => Some("bob"),
                _ => None,
            };
            tr.status = Some(TokenReviewStatus {
                authenticated: Some(user.is_some()),
                user: user.map(|u| UserInfo {
                    username: Some(u.into()),
                    groups: Some(vec!["system:authenticated".into()]),
                    ..Default::default()
                }),
                ..Default::default()
            });
            serde_json::to_string(&tr).unwrap()
        }
        ACCESS_REVIEWS => {
            let mut sar: SubjectAccessReview = serde_json::from_slice(&asked.body).unwrap();
            let s = &sar.spec;
            let pods_proxy_here = s.resource_attributes.as_ref().is_some_and(|r| {
                r.namespace.as_deref() == Some("drainwatch")
                    && r.resource.as_deref() == Some("pods")
                    && r.subresource.as_deref() == Some("proxy")
                    && r.verb.as_deref() == Some("get")
            });
            let metrics = s
                .non_resource_attributes
                .as_ref()
                .is_some_and(|n| n.path.as_deref() == Some("/metrics"));
            let allowed = match s.user.as_deref() {
                Some("alice") => pods_proxy_here || metrics,
                Some("bob") => metrics,
                _ => false,
            };
            sar.status = Some(SubjectAccessReviewStatus {
                allowed,
                ..Default::default()
            });
            serde_json::to_string(&sar).unwrap()
        }
        other => panic!("unexpected API call {other}"),
    };
    (201, answer)
}

const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
const ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";

/// The path asked, without the query.
fn path_of(asked: &Asked) -> &str {
    asked.path.split('?').next().unwrap_or_default()
}

/// TokenReviews and SubjectAccessReviews the double answered.
fn reviews(api: &Double) -> (usize, usize) {
    let asked = api.asked();
    let count = |path| asked.iter().filter(|a| path_of(a) == path).count();
    (count(TOKEN_REVIEWS), count(ACCESS_REVIEWS))
}

/// The agent's server with `--auth kube` against the API at `api`; its address and counters.
async fn agent(api: SocketAddr, auth_metrics: bool) -> (SocketAddr, GuardMetrics) {
    let url: hyper::Uri = format!("http://{api}").parse().unwrap();
    let client = kube::Client::try_from(kube::Config::new(url)).unwrap();
    let mut registry = Registry::default();
    let metrics = GuardMetrics::register(&mut registry, true);
    let mut state = State::new(
        Arc::new(Telemetry::new("test")),
        Arc::default(),
        600 * crate::model::SECOND,
        None,
    );
    state.guard = Guard {
        hosts: Hosts::new(["drainwatch.example"]),
        auth: Some(KubeAuth::new(client, "drainwatch".into(), auth_metrics)),
        metrics: metrics.clone(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let _keep = _tx;
        serve(listener, Arc::new(state), rx).await;
    });
    (addr, metrics)
}

/// GET `path` with a Host header and maybe a token; the status code.
async fn get(addr: SocketAddr, path: &str, host: &str, token: Option<&str>) -> u16 {
    let auth = token.map(|t| format!("Authorization: Bearer {t}"));
    get_with(addr, path, host, auth.as_deref()).await
}

/// GET `path` with a Host header and maybe one more header line; the status code.
async fn get_with(addr: SocketAddr, path: &str, host: &str, line: Option<&str>) -> u16 {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = line.map_or(String::new(), |l| format!("{l}\r\n"));
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let raw = String::from_utf8_lossy(&raw);
    raw.split(' ').nth(1).unwrap().parse().unwrap()
}

const LOCAL: &str = "127.0.0.1:9464";

#[tokio::test]
async fn tokens_are_reviewed_allowed_denied_and_cached() {
    let api = Double::start(review).await;
    let (addr, m) = agent(api.addr, false).await;

    // No token: 401 without asking anyone.
    assert_eq!(get(addr, "/api/v1/stops", LOCAL, None).await, 401);
    assert_eq!(reviews(&api), (0, 0));
    // A token the API server does not authenticate: 401 after one TokenReview.
    assert_eq!(get(addr, "/", LOCAL, Some("forged")).await, 401);
    assert_eq!(reviews(&api), (1, 0));
    // Authenticated, pods/proxy allowed: served.
    assert_eq!(
        get(addr, "/api/v1/stops", LOCAL, Some("alice-token")).await,
        200
    );
    assert_eq!(reviews(&api), (2, 1));
    // Authenticated, not allowed pods/proxy: 403.
    assert_eq!(
        get(addr, "/api/v1/deploys", LOCAL, Some("bob-token")).await,
        403
    );
    assert_eq!(reviews(&api), (3, 2));
    // Cache hits: the same tokens again ask nothing (allowed and denied alike).
    assert_eq!(get(addr, "/", LOCAL, Some("alice-token")).await, 200);
    assert_eq!(
        get(addr, "/api/v1/storms", LOCAL, Some("bob-token")).await,
        403
    );
    assert_eq!(get(addr, "/", LOCAL, Some("forged")).await, 401);
    assert_eq!(reviews(&api), (3, 2));
    // Open paths need nothing; /metrics is open without --auth-metrics.
    assert_eq!(get(addr, "/healthz", "any.name", None).await, 200);
    assert_eq!(get(addr, "/metrics", LOCAL, None).await, 200);
    assert_eq!(get(addr, "/page.js", LOCAL, None).await, 200);
    // A foreign Host is refused before any token is looked at.
    assert_eq!(
        get(addr, "/", "rebind.evil.example:9464", Some("alice-token")).await,
        421
    );
    assert_eq!(
        get(addr, "/", "drainwatch.example", Some("alice-token")).await,
        200
    );

    // Through the API server's pod proxy, which strips Authorization: the fallback header.
    let proxied = "X-Drainwatch-Authorization: Bearer alice-token";
    assert_eq!(
        get_with(addr, "/api/v1/stops", LOCAL, Some(proxied)).await,
        200
    );

    assert_eq!(m.auth(Verdict::Allowed), 4);
    assert_eq!(m.auth(Verdict::Denied), 2);
    assert_eq!(m.auth(Verdict::Unauthenticated), 3);
    assert_eq!(m.auth(Verdict::Error), 0);
    assert_eq!(m.host_rejected(), 1);
}

#[tokio::test]
async fn metrics_need_their_own_permission_with_auth_metrics() {
    let api = Double::start(review).await;
    let (addr, m) = agent(api.addr, true).await;
    assert_eq!(get(addr, "/metrics", LOCAL, None).await, 401);
    // bob may get /metrics but not the API: the two accesses are cached apart.
    assert_eq!(get(addr, "/metrics", LOCAL, Some("bob-token")).await, 200);
    assert_eq!(get(addr, "/", LOCAL, Some("bob-token")).await, 403);
    assert_eq!(get(addr, "/metrics", LOCAL, Some("bob-token")).await, 200);
    assert_eq!(reviews(&api), (2, 2));
    assert_eq!(m.auth(Verdict::Allowed), 2);
    assert_eq!(m.auth(Verdict::Denied), 1);
}

#[tokio::test]
async fn an_unreachable_api_server_fails_closed_and_is_counted() {
    // A port nobody listens on.
    let gone = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let (addr, m) = agent(gone, true).await;
    assert_eq!(get(addr, "/", LOCAL, Some("alice-token")).await, 503);
    assert_eq!(get(addr, "/metrics", LOCAL, Some("alice-token")).await, 503);
    // Not cached: asked again, refused again.
    assert_eq!(get(addr, "/", LOCAL, Some("alice-token")).await, 503);
    assert_eq!(m.auth(Verdict::Error), 3);
    assert_eq!(m.auth(Verdict::Allowed), 0);
    // The probes still answer.
    assert_eq!(get(addr, "/healthz", LOCAL, None).await, 200);
}

#[test]
fn outside_kubernetes_the_agent_listens_on_loopback_without_auth() {
    use clap::Parser;
    let cli = crate::cli::Cli::try_parse_from(["drainwatch"]).unwrap();
    assert!(cli.listen.ip().is_loopback(), "{}", cli.listen);
    assert_eq!(cli.auth, crate::cli::Auth::None);
    assert!(!cli.auth_metrics && cli.allowed_hosts.is_empty());
    let on = crate::cli::Cli::try_parse_from([
        "drainwatch",
        "--auth",
        "kube",
        "--auth-metrics",
        "--allowed-host",
        "a.example,b.example",
    ])
    .unwrap();
    assert_eq!(on.auth, crate::cli::Auth::Kube);
    assert!(on.auth_metrics);
    assert_eq!(on.allowed_hosts, ["a.example", "b.example"]);
}
