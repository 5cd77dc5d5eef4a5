//! What the HTTP server checks before it serves a request: the Host header (against DNS
//! rebinding), and with `--auth kube` a bearer token, asked of the API server with a
//! TokenReview and a SubjectAccessReview (decisions and cache in `auth.rs`). Thin I/O.

use std::{
    net::IpAddr,
    sync::{
        Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Instant,
};

use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec},
    authorization::v1::SubjectAccessReview,
};
use kube::{Api, Client, api::PostParams};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

use super::auth::{self, Access, Cache, Verdict};

/// Where a client reaching the agent through the API server's pod proxy (`drainwatch report
/// --cluster`) puts its `Bearer <token>`: the API server strips `Authorization` from proxied
/// requests (kubernetes#34076). Read only when `Authorization` is absent.
pub const PROXIED_AUTHORIZATION: &str = "x-drainwatch-authorization";

/// The names a request's Host header may carry. Any IP literal is admitted: a DNS-rebinding
/// page runs under the attacker's name, never under an address, so only names need listing.
#[derive(Debug, Clone, Default)]
pub struct Hosts {
    names: Vec<String>,
}

impl Hosts {
    /// `localhost`, plus the node name, this machine's host name and `--allowed-host`.
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>) -> Self {
        let mut v = vec!["localhost".to_string()];
        v.extend(names.into_iter().filter_map(|n| {
            let n = normalize(n);
            (!n.is_empty()).then_some(n)
        }));
        v.sort();
        v.dedup();
        Self { names: v }
    }

    /// Whether a Host header names this agent. No header (HTTP/1.0) is refused too: every
    /// browser sends one.
    pub fn admits(&self, header: Option<&str>) -> bool {
        let Some(h) = header else { return false };
        let host = strip_port(h.trim());
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        bare.parse::<IpAddr>().is_ok() || self.names.contains(&normalize(host))
    }
}

fn normalize(name: &str) -> String {
    name.trim().trim_end_matches('.').to_ascii_lowercase()
}

/// `host:port` → `host`, `[v6]:port` → `[v6]`; a bare IPv6 address stays whole.
fn strip_port(h: &str) -> &str {
    if h.starts_with('[') {
        return h.find(']').map_or(h, |i| &h[..=i]);
    }
    match h.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            host
        }
        _ => h,
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// The checks' counters.
#[derive(Clone, Default)]
pub struct GuardMetrics {
    rejected: Family<ReasonLabels, Counter>,
    auth: Family<ResultLabels, Counter>,
    evictions: Counter,
}

impl GuardMetrics {
    /// The Host check's counter always; the auth ones only with `auth`, so an agent without it
    /// exports nothing about it.
    pub fn register(registry: &mut Registry, auth: bool) -> Self {
        let m = Self::default();
        registry.register(
            "drainwatch_http_rejected",
            "Requests refused before they were served, by reason: host (421: the Host header names neither an address nor a name this agent answers to, see --allowed-host)",
            m.rejected.clone(),
        );
        let _ = m.rejected.get_or_create(&ReasonLabels { reason: "host" });
        if auth {
            registry.register(
                "drainwatch_auth_requests",
                "Requests that needed a token (--auth kube), by result: allowed, unauthenticated (401: no token or the TokenReview refused it), denied (403: the SubjectAccessReview refused it), error (503: the Kubernetes API could not be asked; refused, fail closed)",
                m.auth.clone(),
            );
            registry.register(
                "drainwatch_auth_cache_evictions",
                "Fresh token decisions dropped from the full cache (1024 entries) to make room",
                m.evictions.clone(),
            );
            for v in Verdict::ALL {
                let _ = m.auth.get_or_create(&ResultLabels { result: v.as_str() });
            }
        }
        m
    }

    pub fn auth(&self, v: Verdict) -> u64 {
        self.auth
            .get_or_create(&ResultLabels { result: v.as_str() })
            .get()
    }

    pub fn host_rejected(&self) -> u64 {
        self.rejected
            .get_or_create(&ReasonLabels { reason: "host" })
            .get()
    }

    pub fn evictions(&self) -> u64 {
        self.evictions.get()
    }
}

/// `--auth kube`: the client that asks, and what it asks.
pub struct KubeAuth {
    client: Client,
    /// The agent's namespace, where `pods/proxy` is checked.
    namespace: String,
    /// `--auth-metrics`: `/metrics` needs a token too.
    metrics: bool,
    cache: Mutex<Cache>,
    /// The last review failed: logged once per outage, not per request.
    failing: AtomicBool,
}

impl KubeAuth {
    pub fn new(client: Client, namespace: String, metrics: bool) -> Self {
        Self {
            client,
            namespace,
            metrics,
            cache: Mutex::new(Cache::new(auth::CACHE_ENTRIES)),
            failing: AtomicBool::new(false),
        }
    }

    fn failed(&self, what: &str, e: &kube::Error) -> Verdict {
        if !self.failing.swap(true, Ordering::Relaxed) {
            tracing::warn!(error = %e, "{what} failed: refusing requests until the Kubernetes API answers (drainwatch_auth_requests_total{{result=\"error\"}})");
        }
        Verdict::Error
    }

    /// Asks the API server: the token's user, then whether that user may read `access`.
    async fn review(&self, token: &str, access: Access) -> Verdict {
        let tr = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.into()),
                audiences: None,
            },
            ..Default::default()
        };
        let answered = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &tr)
            .await;
        let status = match answered {
            Ok(r) => r.status,
            Err(e) => return self.failed("TokenReview", &e),
        };
        if self.failing.swap(false, Ordering::Relaxed) {
            tracing::info!("the Kubernetes API answers token reviews again");
        }
        let user = match auth::authenticated(status) {
            Ok(user) => user,
            Err(v) => return v,
        };
        let sar = SubjectAccessReview {
            spec: auth::review_spec(&user, access, &self.namespace),
            ..Default::default()
        };
        match Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &sar)
            .await
        {
            Ok(r) => auth::authorized(r.status),
            Err(e) => self.failed("SubjectAccessReview", &e),
        }
    }
}

/// Why a request is refused, each with its status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// 421 Misdirected Request.
    Host,
    /// 401, with `WWW-Authenticate: Bearer`.
    Unauthenticated,
    /// 403.
    Denied,
    /// 503: the token could not be checked, so the request is refused (fail closed).
    Unavailable,
}

/// The checks, in the order the server applies them.
pub struct Guard {
    pub hosts: Hosts,
    pub auth: Option<KubeAuth>,
    pub metrics: GuardMetrics,
}

impl Guard {
    /// Host check with `localhost` and addresses only, no auth: for tests of the routes.
    pub fn without_auth() -> Self {
        Self {
            hosts: Hosts::new([]),
            auth: None,
            metrics: GuardMetrics::default(),
        }
    }

    /// None: serve it. The probes are exempt from both checks (the kubelet sends neither a
    /// token nor, reliably, a name).
    pub async fn check(
        &self,
        path: &str,
        host: Option<&str>,
        authorization: Option<&str>,
    ) -> Option<Refusal> {
        if auth::PROBES.contains(&path) {
            return None;
        }
        if !self.hosts.admits(host) {
            self.metrics
                .rejected
                .get_or_create(&ReasonLabels { reason: "host" })
                .inc();
            return Some(Refusal::Host);
        }
        let auth = self.auth.as_ref()?;
        let access = auth::access_for(path, auth.metrics)?;
        let verdict = match auth::bearer(authorization) {
            None => Verdict::Unauthenticated,
            Some(token) => {
                let cached = auth
                    .cache
                    .lock()
                    .ok()
                    .and_then(|mut c| c.get(token, access, Instant::now()));
                match cached {
                    Some(v) => v,
                    None => {
                        let v = auth.review(token, access).await;
                        if let Ok(mut c) = auth.cache.lock() {
                            let evicted = c.put(token, access, v, Instant::now());
                            self.metrics.evictions.inc_by(evicted);
                        }
                        v
                    }
                }
            }
        };
        self.metrics
            .auth
            .get_or_create(&ResultLabels {
                result: verdict.as_str(),
            })
            .inc();
        match verdict {
            Verdict::Allowed => None,
            Verdict::Unauthenticated => Some(Refusal::Unauthenticated),
            Verdict::Denied => Some(Refusal::Denied),
            Verdict::Error => Some(Refusal::Unavailable),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_addresses_and_known_names_only() {
        let h = Hosts::new(["node-1", "Drainwatch.Example.", ""]);
        for ok in [
            "127.0.0.1:9464",
            "127.0.0.1",
            "[::1]:9464",
            "::1",
            "10.244.1.7:9464",
            "localhost:9464",
            "LOCALHOST",
            "node-1:9464",
            "drainwatch.example:80",
            "localhost.",
        ] {
            assert!(h.admits(Some(ok)), "{ok}");
        }
        for bad in [
            "evil.example:9464",
            "127.0.0.1.nip.io:9464",
            "localhost.evil.example",
            "node-1.evil.example",
            "",
        ] {
            assert!(!h.admits(Some(bad)), "{bad}");
        }
        assert!(!h.admits(None));
    }

    #[tokio::test]
    async fn refuses_a_foreign_host_and_counts_it_but_never_the_probes() {
        let mut registry = Registry::default();
        let g = Guard {
            metrics: GuardMetrics::register(&mut registry, false),
            ..Guard::without_auth()
        };
        assert_eq!(g.check("/", Some("127.0.0.1:9464"), None).await, None);
        assert_eq!(
            g.check("/api/v1/stops", Some("rebind.evil.example"), None)
                .await,
            Some(Refusal::Host)
        );
        assert_eq!(g.check("/healthz", Some("whatever"), None).await, None);
        assert_eq!(g.metrics.host_rejected(), 1);
        assert_eq!(g.metrics.auth(Verdict::Allowed), 0, "no auth: not counted");
    }
}
