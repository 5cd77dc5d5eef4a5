//! The agent's HTTP endpoints: the deploy page (`/`, with its script `/page.js`), `/metrics`
//! (OpenMetrics or Prometheus text, by `Accept`), the report API (`/api/v1/*`), `/healthz`
//! (the process serves) and `/readyz` (probes are attached).

use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    Request, Response, StatusCode, body::Incoming, header, server::conn::http1, service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Serialize;
use tokio::{net::TcpListener, sync::watch};

use super::{
    api,
    conns::{Conns, Opened},
    page,
};
use crate::telemetry::Telemetry;
use crate::{
    correlate::{Correlator, deploys},
    model::{Mono, monotonic_now},
    pipeline::SharedCorrelator,
};

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The page loads nothing but its own script, and talks to nothing but the agent: names in it
/// come from containers, so even if escaping failed no injected script could run.
const PAGE_CSP: &str = "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

pub struct State {
    pub metrics: Arc<Telemetry>,
    pub ready: AtomicBool,
    pub correlator: SharedCorrelator,
    /// The wall clock's offset in use, re-read at every answer (`api::Clock::follow`).
    clock: std::sync::Mutex<api::Clock>,
    /// Stops of one workload this close together are one deploy.
    pub deploy_window: Mono,
    /// The host name the page shows: the node's (`--node-name`, `NODE_NAME`), else this
    /// machine's (in a pod, the container's UTS name is the pod's, not the node's).
    pub host: String,
}

impl State {
    pub fn new(
        metrics: Arc<Telemetry>,
        correlator: SharedCorrelator,
        deploy_window: Mono,
        node: Option<String>,
    ) -> Self {
        Self {
            metrics,
            ready: AtomicBool::new(false),
            correlator,
            clock: std::sync::Mutex::new(api::Clock::now()),
            deploy_window,
            host: node.filter(|n| !n.is_empty()).unwrap_or_else(hostname),
        }
    }

    /// Monotonic-to-wall-clock conversion for one answer: re-read now, so times follow the
    /// wall clock when NTP or an operator steps it while the agent runs.
    pub fn clock(&self) -> api::Clock {
        let fresh = api::Clock::now();
        match self.clock.lock() {
            Ok(mut c) => {
                *c = c.follow(fresh);
                *c
            }
            Err(_) => fresh,
        }
    }

    /// The deploy page from the same views the report API serves.
    fn page(&self) -> Response<Full<Bytes>> {
        let Ok(t) = self.correlator.lock() else {
            return respond(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                "state unavailable\n",
            );
        };
        let clock = self.clock();
        let grouped = deploys::group(t.stops(), t.starts(), self.deploy_window);
        let deploys = api::deploy_views(&grouped, &clock);
        let stops = api::stop_views(t.stops(), t.storms(), &clock);
        let starts = api::start_views(t.starts(), &clock);
        let storms = api::storm_views(t.storms(), &grouped, &clock);
        drop(t);
        let info = page::PageInfo {
            host: self.host.clone(),
            version: env!("CARGO_PKG_VERSION").into(),
            rendered_at: clock.rfc3339(monotonic_now()),
        };
        let html = page::render(&deploys, &stops, &starts, &storms, &info);
        let mut r = respond(StatusCode::OK, "text/html; charset=utf-8", html);
        secure(&mut r, PAGE_CSP);
        r
    }

    fn json<T: Serialize>(
        &self,
        clock: &api::Clock,
        f: impl FnOnce(&Correlator) -> T,
    ) -> Response<Full<Bytes>> {
        let Ok(t) = self.correlator.lock() else {
            return respond(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                "state unavailable\n",
            );
        };
        let v = f(&t);
        let processed = t.processed_until();
        drop(t);
        match serde_json::to_vec_pretty(&v) {
            Ok(b) => {
                let mut r = respond(StatusCode::OK, "application/json", b);
                // Kernel monotonic time of the newest event processed: a client that caused
                // an event at time T knows the answer includes it once this is >= T.
                r.headers_mut()
                    .insert("x-drainwatch-processed-until-ns", processed.into());
                // Wall-clock minus monotonic ns behind every time in the answer (read for
                // this answer): a client on this host turns them back into monotonic time
                // exactly, however NTP has moved the wall clock since.
                if let Ok(v) = header::HeaderValue::from_str(&clock.offset_ns.to_string()) {
                    r.headers_mut().insert("x-drainwatch-clock-offset-ns", v);
                }
                r
            }
            Err(_) => respond(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                "encoding failed\n",
            ),
        }
    }
}

fn respond(
    status: StatusCode,
    content_type: &str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

/// Headers for the page and its script: a strict CSP, no sniffing, never cached stale.
fn secure(r: &mut Response<Full<Bytes>>, csp: &'static str) {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static(csp),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        header::HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
}

/// This machine's host name (the node, when the agent runs with the host's UTS namespace).
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it or fails.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return String::new();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Prometheus asks for OpenMetrics first in its `Accept`; plain scrapers get 0.0.4 text.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("application/openmetrics-text"))
}

/// `target`: the path with its query (`/api/v1/stops?limit=50&before=<id>`).
pub fn route(
    state: &State,
    method: &hyper::Method,
    target: &str,
    accept: Option<&str>,
) -> Response<Full<Bytes>> {
    if method != hyper::Method::GET && method != hyper::Method::HEAD {
        return respond(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "GET only\n");
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let clock = state.clock();
    let parsed = if path.starts_with("/api/") {
        Page::parse(query)
    } else {
        Ok(Page::default())
    };
    let page = match parsed {
        Ok(p) => p,
        Err(e) => return respond(StatusCode::BAD_REQUEST, "text/plain", format!("{e}\n")),
    };
    match path {
        "/" => state.page(),
        "/page.js" => {
            let mut r = respond(
                StatusCode::OK,
                "text/javascript; charset=utf-8",
                page::SCRIPT,
            );
            secure(&mut r, "default-src 'none'");
            r
        }
        "/metrics" => {
            let (body, ct) = if wants_openmetrics(accept) {
                (state.metrics.encode_openmetrics(), OPENMETRICS)
            } else {
                (state.metrics.encode_prometheus(), PROMETHEUS_TEXT)
            };
            match body {
                Ok(b) => respond(StatusCode::OK, ct, b),
                Err(_) => respond(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    "encoding failed\n",
                ),
            }
        }
        "/api/v1/stops" => state.json(&clock, |t| {
            page.of(api::stop_views(t.stops(), t.storms(), &clock), |v| &v.id)
        }),
        "/api/v1/starts" => state.json(&clock, |t| {
            page.of(api::start_views(t.starts(), &clock), |v| &v.id)
        }),
        "/api/v1/deploys" => state.json(&clock, |t| {
            let deploys = deploys::group(t.stops(), t.starts(), state.deploy_window);
            page.of(api::deploy_views(&deploys, &clock), |v| &v.id)
        }),
        "/api/v1/storms" => state.json(&clock, |t| {
            let deploys = deploys::group(t.stops(), t.starts(), state.deploy_window);
            api::storm_views(t.storms(), &deploys, &clock)
        }),
        "/healthz" => {
            let stalled = state.metrics.heartbeats.stalled(monotonic_now());
            if stalled.is_empty() {
                respond(StatusCode::OK, "text/plain", "ok\n")
            } else {
                let what: Vec<String> = stalled
                    .iter()
                    .map(|(name, ns)| format!("{name} silent for {:.1} s", *ns as f64 / 1e9))
                    .collect();
                respond(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    format!("stalled: {}\n", what.join(", ")),
                )
            }
        }
        "/readyz" if state.ready.load(Ordering::Relaxed) => {
            respond(StatusCode::OK, "text/plain", "ready\n")
        }
        "/readyz" => respond(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "probes not attached yet\n",
        ),
        _ => respond(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try /, /metrics, /api/v1/stops, /api/v1/starts, /api/v1/deploys, /api/v1/storms, /healthz, /readyz\n",
        ),
    }
}

async fn handle_request(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let target = req
        .uri()
        .path_and_query()
        .map_or_else(|| req.uri().path().to_string(), |p| p.as_str().to_string());
    let method = req.method().clone();
    // Rendering (the page, the API, the metrics) runs on the blocking pool: never on a
    // runtime thread the ring-buffer reader needs.
    let rendered =
        tokio::task::spawn_blocking(move || route(&state, &method, &target, accept.as_deref()));
    Ok(rendered.await.unwrap_or_else(|_| {
        respond(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            "rendering failed\n",
        )
    }))
}

/// Connections served at once; one more closes the one idle longest (see `conns`).
pub const MAX_CONNECTIONS: usize = 256;
/// Connections at most, when all of `MAX_CONNECTIONS` are mid-request.
const HARD_CONNECTIONS: usize = MAX_CONNECTIONS + 64;
/// A request's headers must arrive within this...
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// ... and a connection, keep-alive or slow, is closed after this.
const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);

/// An `accept` error of one connection (accept(2)'s "already pending network errors"), not of
/// the listener or the process.
fn one_connection(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionReset, Interrupted};
    matches!(e.kind(), ConnectionAborted | ConnectionReset | Interrupted)
        || matches!(
            e.raw_os_error(),
            Some(
                libc::EPROTO
                    | libc::ENETDOWN
                    | libc::ENOPROTOOPT
                    | libc::EHOSTDOWN
                    | libc::ENONET
                    | libc::EHOSTUNREACH
                    | libc::EOPNOTSUPP
                    | libc::ENETUNREACH
            )
        )
}

/// Serves until `shutdown` turns true.
pub async fn serve(listener: TcpListener, state: Arc<State>, mut shutdown: watch::Receiver<bool>) {
    let conns = Conns::new(MAX_CONNECTIONS, HARD_CONNECTIONS);
    let mut backoff = Duration::from_millis(10);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                // That one connection went before it was accepted (its client reset it in
                // the backlog): the next is unaffected, and waiting would stall /healthz.
                Err(e) if one_connection(&e) => continue,
                Err(e) => {
                    // Out of descriptors, most likely: retrying at once would spin.
                    tracing::warn!(error = %e, wait_ms = backoff.as_millis(), "accept failed");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        backoff = Duration::from_millis(10);
        let (handle, close, evicted) = match conns.open(std::time::Instant::now()) {
            Opened::Served(h, close, evicted) => (h, close, evicted),
            Opened::Refused => {
                state.metrics.agent.http_connections_closed(1);
                continue; // dropping the stream closes it
            }
        };
        state.metrics.agent.http_connections_closed(evicted as u64);
        let state = state.clone();
        tokio::spawn(async move {
            let handle = Arc::new(handle);
            let svc = service_fn(move |req| {
                let (state, handle) = (state.clone(), handle.clone());
                async move {
                    handle.busy();
                    let r = handle_request(state, req).await;
                    handle.idle(std::time::Instant::now());
                    r
                }
            });
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT);
            let conn = builder.serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                r = tokio::time::timeout(CONNECTION_LIFETIME, conn) => match r {
                    Ok(Err(e)) => tracing::debug!(error = %e, "http connection ended with an error"),
                    Err(_) => tracing::debug!("http connection closed at its lifetime"),
                    Ok(Ok(())) => {}
                },
                _ = close => tracing::debug!("idle http connection closed to make room"),
            }
        });
    }
}

/// `?limit=N&before=ID` of a list served newest first: the N after the element `ID`.
#[derive(Debug, Default, PartialEq)]
struct Page {
    limit: Option<usize>,
    before: Option<String>,
}

impl Page {
    fn parse(query: &str) -> Result<Page, String> {
        let mut p = Page::default();
        for pair in query.split('&').filter(|s| !s.is_empty()) {
            match pair.split_once('=') {
                Some(("limit", n)) => {
                    p.limit = Some(n.parse().map_err(|_| format!("limit={n} is no count"))?);
                }
                Some(("before", id)) => p.before = Some(id.to_string()),
                _ => {
                    return Err(format!(
                        "unknown parameter {pair:?}: try limit=N, before=ID"
                    ));
                }
            }
        }
        Ok(p)
    }

    fn of<T>(&self, items: Vec<T>, id: impl Fn(&T) -> &String) -> Vec<T> {
        let start = match &self.before {
            Some(b) => items
                .iter()
                .position(|v| id(v) == b)
                .map_or(items.len(), |i| i + 1),
            None => 0,
        };
        let limit = self.limit.unwrap_or(usize::MAX);
        items.into_iter().skip(start).take(limit).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(ready: bool) -> State {
        let s = State::new(
            Arc::new(Telemetry::new("test")),
            Arc::default(),
            600 * crate::model::SECOND,
            None,
        );
        s.ready.store(ready, Ordering::Relaxed);
        s
    }

    #[test]
    fn the_page_names_the_node_when_it_is_known() {
        let s = |node: Option<&str>| {
            State::new(
                Arc::new(Telemetry::new("test")),
                Arc::default(),
                crate::model::SECOND,
                node.map(str::to_string),
            )
        };
        assert_eq!(s(Some("node-7")).host, "node-7");
        // Outside Kubernetes (or NODE_NAME empty): this machine's name.
        assert_eq!(s(None).host, hostname());
        assert_eq!(s(Some("")).host, hostname());
        assert!(!hostname().is_empty());
    }

    #[test]
    fn an_accept_error_of_one_connection_is_no_reason_to_wait() {
        use std::io::{Error, ErrorKind};
        assert!(one_connection(&Error::from(ErrorKind::ConnectionAborted)));
        assert!(one_connection(&Error::from_raw_os_error(libc::EPROTO)));
        assert!(!one_connection(&Error::from_raw_os_error(libc::EMFILE)));
        assert!(!one_connection(&Error::from_raw_os_error(libc::ENOBUFS)));
    }

    #[test]
    fn negotiates_the_exposition_format() {
        let s = state(true);
        let om = route(
            &s,
            &hyper::Method::GET,
            "/metrics",
            Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"),
        );
        assert_eq!(om.headers()[header::CONTENT_TYPE], OPENMETRICS);
        let plain = route(&s, &hyper::Method::GET, "/metrics", Some("*/*"));
        assert_eq!(plain.headers()[header::CONTENT_TYPE], PROMETHEUS_TEXT);
        let none = route(&s, &hyper::Method::GET, "/metrics", None);
        assert_eq!(none.headers()[header::CONTENT_TYPE], PROMETHEUS_TEXT);
    }

    #[test]
    fn the_report_api_serves_json_arrays() {
        let s = state(true);
        for path in [
            "/api/v1/stops",
            "/api/v1/starts",
            "/api/v1/deploys",
            "/api/v1/storms",
        ] {
            let r = route(&s, &hyper::Method::GET, path, None);
            assert_eq!(r.status(), StatusCode::OK);
            assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
        }
    }

    #[test]
    fn the_page_is_html_with_a_strict_policy_and_its_script() {
        let s = state(true);
        let r = route(&s, &hyper::Method::GET, "/", Some("text/html"));
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(
            r.headers()[header::CONTENT_TYPE],
            "text/html; charset=utf-8"
        );
        let csp = r.headers()[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap();
        assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe-eval"));
        let js = route(&s, &hyper::Method::GET, "/page.js", None);
        assert_eq!(js.status(), StatusCode::OK);
        assert_eq!(
            js.headers()[header::CONTENT_TYPE],
            "text/javascript; charset=utf-8"
        );
    }

    #[test]
    fn lists_page_newest_first_after_a_cursor() {
        let p = Page::parse("limit=2&before=b").unwrap();
        let ids: Vec<String> = ["a", "b", "c", "d", "e"].map(String::from).to_vec();
        assert_eq!(p.of(ids.clone(), |s| s), ["c", "d"]);
        assert_eq!(Page::parse("").unwrap().of(ids.clone(), |s| s), ids);
        // A cursor no longer listed (evicted) gives nothing rather than a repeat.
        let gone = Page::parse("before=zz").unwrap();
        assert!(gone.of(ids, |s| s).is_empty());
        assert!(Page::parse("limit=x").is_err() && Page::parse("order=asc").is_err());
        let s = state(true);
        let bad = route(&s, &hyper::Method::GET, "/api/v1/stops?limit=-1", None);
        assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
        let ok = route(&s, &hyper::Method::GET, "/api/v1/stops?limit=1", None);
        assert_eq!(ok.status(), StatusCode::OK);
    }

    #[test]
    fn liveness_fails_when_the_reader_or_the_pipeline_stalls() {
        let s = state(true);
        let health = |s: &State| route(s, &hyper::Method::GET, "/healthz", None).status();
        assert_eq!(health(&s), StatusCode::OK, "no beat yet: starting");
        s.metrics.heartbeats.reader.beat();
        s.metrics.heartbeats.pipeline.beat();
        assert_eq!(health(&s), StatusCode::OK);
        s.metrics.heartbeats.pipeline.beat_at(1);
        assert_eq!(health(&s), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn readiness_follows_the_probes() {
        assert_eq!(
            route(&state(false), &hyper::Method::GET, "/readyz", None).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            route(&state(true), &hyper::Method::GET, "/readyz", None).status(),
            StatusCode::OK
        );
        assert_eq!(
            route(&state(false), &hyper::Method::GET, "/healthz", None).status(),
            StatusCode::OK
        );
        assert_eq!(
            route(&state(true), &hyper::Method::GET, "/nope", None).status(),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            route(&state(true), &hyper::Method::POST, "/metrics", None).status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
    }
}
