//! The agent's HTTP endpoints: `/metrics` (OpenMetrics or Prometheus text, by `Accept`),
//! `/healthz` (the process serves) and `/readyz` (probes are attached).

use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    Request, Response, StatusCode, body::Incoming, header, server::conn::http1, service::service_fn,
};
use hyper_util::rt::TokioIo;
use tokio::{net::TcpListener, sync::watch};

use super::{api, metrics::Metrics};
use crate::correlate::{Mono, deploys, stops::Tracker, storms::Storms};

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

pub struct State {
    pub metrics: Arc<Metrics>,
    pub ready: AtomicBool,
    pub tracker: Arc<std::sync::Mutex<Tracker>>,
    pub storms: Arc<std::sync::Mutex<Storms>>,
    pub clock: api::Clock,
    /// Stops of one workload this close together are one deploy.
    pub deploy_window: Mono,
}

impl State {
    pub fn new(
        metrics: Arc<Metrics>,
        tracker: Arc<std::sync::Mutex<Tracker>>,
        storms: Arc<std::sync::Mutex<Storms>>,
        deploy_window: Mono,
    ) -> Self {
        Self {
            metrics,
            ready: AtomicBool::new(false),
            tracker,
            storms,
            clock: api::Clock::now(),
            deploy_window,
        }
    }

    fn json(&self, f: impl FnOnce(&Tracker) -> serde_json::Value) -> Response<Full<Bytes>> {
        let Ok(t) = self.tracker.lock() else {
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

/// Prometheus asks for OpenMetrics first in its `Accept`; plain scrapers get 0.0.4 text.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("application/openmetrics-text"))
}

pub fn route(
    state: &State,
    method: &hyper::Method,
    path: &str,
    accept: Option<&str>,
) -> Response<Full<Bytes>> {
    if method != hyper::Method::GET && method != hyper::Method::HEAD {
        return respond(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "GET only\n");
    }
    match path {
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
        "/api/v1/stops" => state.json(|t| api::stops_json(t.stops(), &state.clock)),
        "/api/v1/deploys" => state.json(|t| {
            api::deploys_json(
                &deploys::group(t.stops(), state.deploy_window),
                &state.clock,
            )
        }),
        "/api/v1/storms" => state.json(|t| {
            let deploys = deploys::group(t.stops(), state.deploy_window);
            state.storms.lock().map_or(serde_json::Value::Null, |s| {
                api::storms_json(s.storms(), &deploys, &state.clock)
            })
        }),
        "/healthz" => respond(StatusCode::OK, "text/plain", "ok\n"),
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
            "not found: try /metrics, /api/v1/stops, /api/v1/deploys, /healthz, /readyz\n",
        ),
    }
}

async fn handle(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok());
    Ok(route(&state, req.method(), req.uri().path(), accept))
}

/// Serves until `shutdown` turns true.
pub async fn serve(listener: TcpListener, state: Arc<State>, mut shutdown: watch::Receiver<bool>) {
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        let state = state.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| handle(state.clone(), req));
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await
            {
                tracing::debug!(error = %e, "http connection ended with an error");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(ready: bool) -> State {
        let s = State::new(
            Arc::new(Metrics::new("test")),
            Arc::default(),
            Arc::default(),
            600 * crate::correlate::SECOND,
        );
        s.ready.store(ready, Ordering::Relaxed);
        s
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
        for path in ["/api/v1/stops", "/api/v1/deploys", "/api/v1/storms"] {
            let r = route(&s, &hyper::Method::GET, path, None);
            assert_eq!(r.status(), StatusCode::OK);
            assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
        }
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
