//! Who may read the agent (`--auth kube`), the pure part: which paths need a token, what a
//! SubjectAccessReview asks for them, the decision from the API server's two answers, and the
//! cache in front of those calls. kube-rbac-proxy's model, in process; the HTTP and API-server
//! calls are in `guard.rs`.

use std::{collections::HashMap, time::Instant};

use k8s_openapi::api::{
    authentication::v1::{TokenReviewStatus, UserInfo},
    authorization::v1::{
        NonResourceAttributes, ResourceAttributes, SubjectAccessReviewSpec,
        SubjectAccessReviewStatus,
    },
};

/// How long an answer is reused: an allowed one a minute, a refusal ten seconds (a token just
/// granted access works soon), as kube-rbac-proxy's defaults.
pub const ALLOWED_TTL: std::time::Duration = std::time::Duration::from_secs(60);
pub const DENIED_TTL: std::time::Duration = std::time::Duration::from_secs(10);
/// Tokens × accesses remembered; past it the entry expiring first goes, counted.
pub const CACHE_ENTRIES: usize = 1024;

/// What a request reads, and so which permission it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// `/metrics`: `get` on the non-resource URL `/metrics`, the permission Prometheus
    /// servers already hold to scrape the API server and kubelets.
    Metrics,
    /// The page and the report API: `get` on `pods/proxy` in the agent's namespace, the
    /// permission that reads the agent through the API server's proxy anyway. Not the
    /// non-resource URL `/api/*`: the built-in `system:discovery` role grants that to every
    /// authenticated user.
    Api,
}

/// The kubelet's probes: open to anyone, under any Host (it sends no token, nor reliably a
/// name).
pub const PROBES: [&str; 2] = ["/healthz", "/readyz"];

/// The access a path needs, or None for what anyone may read: the probes (`/healthz`,
/// `/readyz`, the kubelet has no token), the page's static script, and `/metrics` unless
/// `metrics` (`--auth-metrics`). Anything else, unknown paths included, needs `Access::Api`.
pub fn access_for(path: &str, metrics: bool) -> Option<Access> {
    match path {
        _ if PROBES.contains(&path) => None,
        "/page.js" => None,
        "/metrics" => metrics.then_some(Access::Metrics),
        _ => Some(Access::Api),
    }
}

/// The SubjectAccessReview for `user` reading `access` (the agent's namespace for `Api`).
pub fn review_spec(user: &UserInfo, access: Access, namespace: &str) -> SubjectAccessReviewSpec {
    let (resource, non_resource) = match access {
        Access::Metrics => (
            None,
            Some(NonResourceAttributes {
                path: Some("/metrics".into()),
                verb: Some("get".into()),
            }),
        ),
        Access::Api => (
            Some(ResourceAttributes {
                namespace: Some(namespace.into()),
                verb: Some("get".into()),
                group: Some(String::new()),
                version: Some("v1".into()),
                resource: Some("pods".into()),
                subresource: Some("proxy".into()),
                ..Default::default()
            }),
            None,
        ),
    };
    SubjectAccessReviewSpec {
        user: user.username.clone(),
        uid: user.uid.clone(),
        groups: user.groups.clone(),
        extra: user.extra.clone(),
        resource_attributes: resource,
        non_resource_attributes: non_resource,
    }
}

/// What became of a request, as `drainwatch_auth_requests_total{result}` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    Allowed,
    /// No token, or the TokenReview did not authenticate it: 401.
    Unauthenticated,
    /// Authenticated, but the SubjectAccessReview did not allow it: 403.
    Denied,
    /// The API server could not be asked or answered nonsense: 503, never cached (fail
    /// closed).
    Error,
}

impl Verdict {
    pub const ALL: [Verdict; 4] = [
        Verdict::Allowed,
        Verdict::Unauthenticated,
        Verdict::Denied,
        Verdict::Error,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allowed => "allowed",
            Verdict::Unauthenticated => "unauthenticated",
            Verdict::Denied => "denied",
            Verdict::Error => "error",
        }
    }
}

/// The token of an `Authorization` header (`Bearer <token>`, scheme case-insensitive).
pub fn bearer(header: Option<&str>) -> Option<&str> {
    let (scheme, token) = header?.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The user a TokenReview's answer authenticated, or the verdict that ends the request.
pub fn authenticated(status: Option<TokenReviewStatus>) -> Result<UserInfo, Verdict> {
    match status {
        Some(TokenReviewStatus {
            authenticated: Some(true),
            user: Some(user),
            ..
        }) if user.username.as_deref().is_some_and(|u| !u.is_empty()) => Ok(user),
        // Authenticated without a user name: nothing to authorize.
        Some(TokenReviewStatus {
            authenticated: Some(true),
            ..
        }) => Err(Verdict::Error),
        _ => Err(Verdict::Unauthenticated),
    }
}

/// The verdict of a SubjectAccessReview's answer (no answer: the API server misbehaved).
pub fn authorized(status: Option<SubjectAccessReviewStatus>) -> Verdict {
    match status {
        Some(s) if s.allowed && s.denied != Some(true) => Verdict::Allowed,
        Some(_) => Verdict::Denied,
        None => Verdict::Error,
    }
}

/// Recent verdicts by token and access. Errors are never kept. The tokens themselves are
/// the keys: compared exactly, held only in this process's memory, as the API server's own
/// token cache does.
#[derive(Debug)]
pub struct Cache {
    entries: HashMap<(String, Access), (Verdict, Instant)>,
    capacity: usize,
}

impl Cache {
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: HashMap::new(),
            capacity: capacity.max(1),
        }
    }

    /// A verdict still fresh at `now`.
    pub fn get(&mut self, token: &str, access: Access, now: Instant) -> Option<Verdict> {
        let key = (token.to_string(), access);
        match self.entries.get(&key) {
            Some((v, until)) if *until > now => Some(*v),
            Some(_) => {
                self.entries.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Keeps a verdict; returns how many fresh entries were evicted to make room (0 or 1).
    pub fn put(&mut self, token: &str, access: Access, verdict: Verdict, now: Instant) -> u64 {
        let ttl = match verdict {
            Verdict::Allowed => ALLOWED_TTL,
            Verdict::Unauthenticated | Verdict::Denied => DENIED_TTL,
            Verdict::Error => return 0,
        };
        let key = (token.to_string(), access);
        let mut evicted = 0;
        if !self.entries.contains_key(&key) && self.entries.len() >= self.capacity {
            self.entries.retain(|_, (_, until)| *until > now);
            if self.entries.len() >= self.capacity {
                // Full of fresh entries: the one expiring first goes. O(n), only when full.
                if let Some(k) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, until))| *until)
                    .map(|(k, _)| k.clone())
                {
                    self.entries.remove(&k);
                    evicted = 1;
                }
            }
        }
        self.entries.insert(key, (verdict, now + ttl));
        evicted
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn probes_and_the_script_are_open_the_rest_needs_a_token() {
        assert_eq!(access_for("/healthz", true), None);
        assert_eq!(access_for("/readyz", true), None);
        assert_eq!(access_for("/page.js", true), None);
        assert_eq!(access_for("/metrics", false), None);
        assert_eq!(access_for("/metrics", true), Some(Access::Metrics));
        assert_eq!(access_for("/", false), Some(Access::Api));
        assert_eq!(access_for("/api/v1/stops", false), Some(Access::Api));
        assert_eq!(access_for("/nope", false), Some(Access::Api));
    }

    #[test]
    fn reads_bearer_tokens_only() {
        assert_eq!(bearer(Some("Bearer abc.def")), Some("abc.def"));
        assert_eq!(bearer(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(Some("Basic dXNlcjpwYXNz")), None);
        assert_eq!(bearer(Some("Bearer ")), None);
        assert_eq!(bearer(Some("Bearer")), None);
        assert_eq!(bearer(None), None);
    }

    #[test]
    fn the_review_asks_for_pods_proxy_or_the_metrics_url_as_the_token_user() {
        let user = UserInfo {
            username: Some("system:serviceaccount:monitoring:prometheus".into()),
            uid: Some("u1".into()),
            groups: Some(vec!["system:serviceaccounts".into()]),
            extra: None,
        };
        let api = review_spec(&user, Access::Api, "drainwatch");
        assert_eq!(api.user, user.username);
        assert_eq!(api.groups, user.groups);
        assert!(api.non_resource_attributes.is_none());
        let r = api.resource_attributes.unwrap();
        assert_eq!(r.namespace.as_deref(), Some("drainwatch"));
        assert_eq!(
            (
                r.verb.as_deref(),
                r.resource.as_deref(),
                r.subresource.as_deref()
            ),
            (Some("get"), Some("pods"), Some("proxy"))
        );
        let m = review_spec(&user, Access::Metrics, "drainwatch");
        assert!(m.resource_attributes.is_none());
        let n = m.non_resource_attributes.unwrap();
        assert_eq!(
            (n.path.as_deref(), n.verb.as_deref()),
            (Some("/metrics"), Some("get"))
        );
    }

    #[test]
    fn decides_from_the_two_reviews() {
        let user = |name: &str| UserInfo {
            username: Some(name.into()),
            ..Default::default()
        };
        let tr = |ok: Option<bool>, u: Option<UserInfo>| {
            Some(TokenReviewStatus {
                authenticated: ok,
                user: u,
                ..Default::default()
            })
        };
        assert_eq!(
            authenticated(tr(Some(true), Some(user("alice")))).unwrap(),
            user("alice")
        );
        assert_eq!(
            authenticated(tr(Some(false), None)),
            Err(Verdict::Unauthenticated)
        );
        assert_eq!(authenticated(tr(None, None)), Err(Verdict::Unauthenticated));
        assert_eq!(authenticated(None), Err(Verdict::Unauthenticated));
        assert_eq!(
            authenticated(tr(Some(true), Some(user("")))),
            Err(Verdict::Error)
        );
        let sar = |allowed, denied| {
            Some(SubjectAccessReviewStatus {
                allowed,
                denied,
                ..Default::default()
            })
        };
        assert_eq!(authorized(sar(true, None)), Verdict::Allowed);
        assert_eq!(authorized(sar(false, None)), Verdict::Denied);
        assert_eq!(authorized(sar(false, Some(true))), Verdict::Denied);
        assert_eq!(authorized(sar(true, Some(true))), Verdict::Denied);
        assert_eq!(authorized(None), Verdict::Error);
    }

    #[test]
    fn the_cache_keeps_allowed_a_minute_refusals_ten_seconds_and_no_errors() {
        let t0 = Instant::now();
        let mut c = Cache::new(8);
        c.put("a", Access::Api, Verdict::Allowed, t0);
        c.put("d", Access::Api, Verdict::Denied, t0);
        c.put("e", Access::Api, Verdict::Error, t0);
        assert_eq!(c.get("a", Access::Api, t0), Some(Verdict::Allowed));
        assert_eq!(c.get("a", Access::Metrics, t0), None, "per access");
        assert_eq!(c.get("e", Access::Api, t0), None, "errors are not kept");
        let t11 = t0 + Duration::from_secs(11);
        assert_eq!(c.get("d", Access::Api, t11), None);
        assert_eq!(c.get("a", Access::Api, t11), Some(Verdict::Allowed));
        assert_eq!(c.get("a", Access::Api, t0 + Duration::from_secs(61)), None);
        assert!(c.is_empty(), "expired entries are dropped when seen");
    }

    #[test]
    fn a_full_cache_drops_expired_entries_first_then_counts_evictions() {
        let t0 = Instant::now();
        let mut c = Cache::new(2);
        assert_eq!(c.put("d", Access::Api, Verdict::Denied, t0), 0);
        assert_eq!(c.put("a", Access::Api, Verdict::Allowed, t0), 0);
        // "d" has expired by t11: room without evicting a fresh entry.
        let t11 = t0 + Duration::from_secs(11);
        assert_eq!(c.put("b", Access::Api, Verdict::Allowed, t11), 0);
        assert_eq!(c.len(), 2);
        // Full of fresh ones: the one expiring first ("a") goes, counted.
        assert_eq!(c.put("c", Access::Api, Verdict::Allowed, t11), 1);
        assert_eq!(c.len(), 2);
        assert_eq!(c.get("a", Access::Api, t11), None);
        assert_eq!(c.get("b", Access::Api, t11), Some(Verdict::Allowed));
        // Refreshing a kept key evicts nothing.
        assert_eq!(c.put("c", Access::Api, Verdict::Denied, t11), 0);
    }
}
