//! Thin I/O: the Kubernetes client, the task running kube-runtime's watcher on this node's pods
//! into the store, and the watch's own metrics.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, watcher},
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use tokio::sync::watch as shutdown_watch;

use super::{KubeError, SharedStore, WatchEvent, pod_record};
use crate::model::Mono;

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

/// Why the watch failed, as `drainwatch_kube_watch_errors_total{kind}` counts it.
pub const ERROR_KINDS: [&str; 6] = [
    "list",
    "watch_start",
    "watch_stream",
    "gone",
    "watch_status",
    "invalid_object",
];

/// The watch's own metrics. Registered only when the API is used, so an agent outside
/// Kubernetes exports exactly what it did before.
#[derive(Clone)]
pub struct KubeMetrics {
    errors: Family<KindLabels, Counter>,
    reachable: Gauge,
    pods: Gauge,
    relists: Counter,
}

impl KubeMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            errors: Family::default(),
            reachable: Gauge::default(),
            pods: Gauge::default(),
            relists: Counter::default(),
        };
        registry.register(
            "drainwatch_kube_watch_errors",
            "Failures watching this node's pods on the Kubernetes API, by kind: list, watch_start, watch_stream (connection or decoding), gone (410: the watch expired, a relist follows), watch_status (other error events), invalid_object (a pod without uid or name, dropped)",
            m.errors.clone(),
        );
        registry.register(
            "drainwatch_kube_api_reachable",
            "1 while the last list or watch of the Kubernetes API succeeded, 0 after a failure (names then come from the runtime's state)",
            m.reachable.clone(),
        );
        registry.register(
            "drainwatch_kube_pods",
            "Pods of this node known from the Kubernetes API",
            m.pods.clone(),
        );
        registry.register(
            "drainwatch_kube_relists",
            "Full lists of this node's pods: at start-up and after every expired watch (410 Gone)",
            m.relists.clone(),
        );
        for k in ERROR_KINDS {
            let _ = m.errors.get_or_create(&KindLabels { kind: k.into() });
        }
        m
    }

    fn error(&self, kind: &str) {
        self.errors
            .get_or_create(&KindLabels { kind: kind.into() })
            .inc();
    }

    pub fn errors(&self, kind: &str) -> u64 {
        self.errors
            .get_or_create(&KindLabels { kind: kind.into() })
            .get()
    }

    pub fn reachable(&self) -> i64 {
        self.reachable.get()
    }

    pub fn relists(&self) -> u64 {
        self.relists.get()
    }
}

/// How `--kube` was set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// In-cluster configuration when running in a pod (KUBERNETES_SERVICE_HOST set).
    Auto,
    /// In-cluster configuration or a kubeconfig; failing to load one is a start-up error.
    On,
    Off,
}

/// The client and node to watch, or None when the API is not used. Logs one line saying
/// which. Errors only for `Mode::On`.
pub async fn client_for(
    mode: Mode,
    node: Option<String>,
    in_pod: bool,
) -> Result<Option<(Client, String)>, KubeError> {
    let node = node.filter(|n| !n.is_empty());
    match mode {
        Mode::Off => {
            tracing::info!(
                "Kubernetes API metadata off (--kube off): names come from the runtime's state"
            );
            return Ok(None);
        }
        Mode::Auto if !in_pod => {
            tracing::info!(
                "Kubernetes API metadata off: not running in a pod (KUBERNETES_SERVICE_HOST unset); names come from the runtime's state"
            );
            return Ok(None);
        }
        _ => {}
    }
    let Some(node) = node else {
        if mode == Mode::On {
            return Err(KubeError::NoNodeName);
        }
        tracing::warn!(
            "Kubernetes API metadata off: no node name (set --node-name, or NODE_NAME from the downward API's spec.nodeName); names come from the runtime's state"
        );
        return Ok(None);
    };
    let config = if mode == Mode::On {
        kube::Config::infer().await.map_err(|e| e.to_string())
    } else {
        kube::Config::incluster().map_err(|e| e.to_string())
    };
    let client = config.and_then(|c| Client::try_from(c).map_err(|e| e.to_string()));
    match client {
        Ok(c) => {
            tracing::info!(node = %node, "Kubernetes API metadata on: watching this node's pods");
            Ok(Some((c, node)))
        }
        Err(e) if mode == Mode::On => Err(KubeError::Config(e)),
        Err(e) => {
            tracing::warn!(
                "Kubernetes API metadata off: in-cluster configuration unusable ({e}); names come from the runtime's state"
            );
            Ok(None)
        }
    }
}

/// Watches this node's pods (`spec.nodeName=<node>`) and feeds the store until shutdown.
/// kube-runtime's watcher lists, then watches from the list's resourceVersion, and lists
/// again when the watch expires (an ERROR event with code 410); its default backoff spaces
/// retries after failures. `clock` is kernel monotonic time (the store's retention clock).
pub async fn watch_pods(
    client: Client,
    node: String,
    store: SharedStore,
    metrics: KubeMetrics,
    clock: fn() -> Mono,
    mut shutdown: shutdown_watch::Receiver<bool>,
) {
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut stream = std::pin::pin!(watcher(api, config).default_backoff());
    let mut expire = tokio::time::interval(Duration::from_secs(5));
    let mut reachable = None;
    let mut set_reachable = |up: bool, why: &dyn std::fmt::Display| {
        metrics.reachable.set(i64::from(up));
        if reachable != Some(up) {
            if up {
                tracing::info!(node = %node, "Kubernetes API reachable: naming containers from their pods");
            } else {
                tracing::warn!(
                    "Kubernetes API unreachable ({why}): naming containers from the runtime's state until it answers"
                );
            }
            reachable = Some(up);
        }
    };
    loop {
        let item = tokio::select! {
            item = stream.next() => item,
            _ = expire.tick() => {
                if let Ok(mut s) = store.lock() {
                    s.expire(clock());
                    metrics.pods.set(s.live_pods() as i64);
                }
                continue;
            }
            _ = shutdown.changed() => break,
        };
        let Some(item) = item else { break };
        let ev = match item {
            Ok(ev) => ev,
            Err(e) => {
                let kind = match &e {
                    watcher::Error::InitialListFailed(_) => "list",
                    watcher::Error::WatchStartFailed(_) => "watch_start",
                    watcher::Error::WatchFailed(_) => "watch_stream",
                    watcher::Error::WatchError(s) if s.code == 410 => "gone",
                    watcher::Error::WatchError(_) => "watch_status",
                    watcher::Error::NoResourceVersion => "watch_status",
                };
                metrics.error(kind);
                match kind {
                    // The server answered; the watcher relists.
                    "gone" => tracing::debug!("Kubernetes watch expired (410 Gone): relisting"),
                    "list" | "watch_start" => set_reachable(false, &e),
                    _ => tracing::debug!("Kubernetes watch error: {e}"),
                }
                continue;
            }
        };
        let converted = match ev {
            watcher::Event::Init => {
                metrics.relists.inc();
                Some(WatchEvent::Init)
            }
            watcher::Event::InitDone => {
                set_reachable(true, &"");
                Some(WatchEvent::InitDone)
            }
            watcher::Event::Apply(p) => pod_record(&p).map(WatchEvent::Apply).ok(),
            watcher::Event::Delete(p) => pod_record(&p).map(WatchEvent::Delete).ok(),
            watcher::Event::InitApply(p) => pod_record(&p).map(WatchEvent::InitApply).ok(),
        };
        let Some(ev) = converted else {
            metrics.error("invalid_object");
            continue;
        };
        if matches!(ev, WatchEvent::Apply(_) | WatchEvent::Delete(_)) {
            set_reachable(true, &"");
        }
        if let Ok(mut s) = store.lock() {
            s.apply(clock(), ev);
            metrics.pods.set(s.live_pods() as i64);
        }
    }
}
