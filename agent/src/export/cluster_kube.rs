//! `drainwatch report --cluster`, the I/O: lists the DaemonSet's pods and asks each agent's
//! report API through the API server's pod proxy
//! (`/api/v1/namespaces/{ns}/pods/{pod}:{port}/proxy/api/v1/...`) with the user's credentials,
//! so only `get` on `pods/proxy` is needed, not a route to every node. kube-rs has no typed call
//! for an arbitrary proxy path: the requests are built by hand and sent with `Client::request`.

use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client, api::ListParams};
use serde::de::DeserializeOwned;

use super::cluster::{self, ClusterReport, NodeAnswer, NodeDocs};

/// The header the agent's token travels in through the pod proxy. The API server consumes
/// (and removes) `Authorization` after authenticating the user, so an agent behind the proxy
/// that checks tokens (`--auth kube`) must read it from here.
pub const AGENT_TOKEN_HEADER: &str = "x-drainwatch-authorization";

/// Where the DaemonSet is and how to ask its agents.
#[derive(Debug, Clone)]
pub struct Target {
    pub namespace: String,
    pub selector: String,
    pub port: u16,
    pub timeout: Duration,
    /// Sent to every agent as `x-drainwatch-authorization: Bearer <token>`.
    pub agent_token: Option<String>,
    /// Deploys of one workload this close together are one.
    pub window: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("no Kubernetes client configuration (kubeconfig or in-cluster): {0}")]
    Config(String),
    #[error("cannot list the agents' pods in namespace {namespace} ({selector}): {source}")]
    List {
        namespace: String,
        selector: String,
        source: kube::Error,
    },
    #[error("no agent pods in namespace {namespace} match {selector}")]
    NoAgents { namespace: String, selector: String },
}

/// Why a pod is not asked: not running, or not ready. None when it is.
fn not_ready(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Unknown");
    if phase != "Running" {
        return Some(format!("pod not running (phase {phase})"));
    }
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    (!ready).then(|| "pod not ready".to_string())
}

/// GET one report API path of one agent through the pod proxy, as `T`.
async fn get<T: DeserializeOwned>(
    client: &Client,
    t: &Target,
    pod: &str,
    path: &str,
) -> Result<T, String> {
    let uri = format!(
        "/api/v1/namespaces/{}/pods/{pod}:{}/proxy{path}",
        t.namespace, t.port
    );
    let mut req = hyper::Request::get(uri).header("accept", "application/json");
    if let Some(token) = &t.agent_token {
        req = req.header(AGENT_TOKEN_HEADER, format!("Bearer {token}"));
    }
    let req = req.body(Vec::new()).map_err(|e| e.to_string())?;
    let text = client.request_text(req).await.map_err(|e| match e {
        // The API server's (or the agent's) answer, without kube-rs's debug dump.
        kube::Error::Api(s) => format!("{path}: {} {}: {}", s.code, s.reason, s.message),
        e => format!("{path}: {e}"),
    })?;
    serde_json::from_str(&text).map_err(|e| format!("{path} is not valid JSON: {e}"))
}

async fn ask(client: &Client, t: &Target, pod: &str) -> Result<NodeDocs, String> {
    let (stops, deploys, storms, starts) = tokio::join!(
        get(client, t, pod, "/api/v1/stops"),
        get(client, t, pod, "/api/v1/deploys"),
        get(client, t, pod, "/api/v1/storms"),
        get(client, t, pod, "/api/v1/starts"),
    );
    Ok(NodeDocs {
        stops: stops?,
        deploys: deploys?,
        storms: storms?,
        starts: starts?,
    })
}

/// Asks every agent pod (bounded by the timeout each) and merges what they served.
pub async fn collect(client: &Client, t: &Target) -> Result<ClusterReport, ClusterError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &t.namespace);
    let listed = pods
        .list(&ListParams::default().labels(&t.selector))
        .await
        .map_err(|source| ClusterError::List {
            namespace: t.namespace.clone(),
            selector: t.selector.clone(),
            source,
        })?;
    if listed.items.is_empty() {
        return Err(ClusterError::NoAgents {
            namespace: t.namespace.clone(),
            selector: t.selector.clone(),
        });
    }
    let answers = join_all(listed.items.iter().map(|p| async move {
        let pod = p.metadata.name.clone().unwrap_or_default();
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let docs = match not_ready(p) {
            Some(why) => Err(why),
            None => tokio::time::timeout(t.timeout, ask(client, t, &pod))
                .await
                .unwrap_or_else(|_| Err(format!("no answer within {:?}", t.timeout))),
        };
        NodeAnswer { pod, node, docs }
    }))
    .await;
    Ok(cluster::merge(&answers, t.window))
}

/// The client for the report: without kube-rs's retries of 503 (up to 15, backing off for
/// minutes), which is what the API server answers for an agent it cannot reach: that agent is
/// named at once instead.
pub fn client(mut config: kube::Config) -> Result<Client, ClusterError> {
    config.default_retry = false;
    Client::try_from(config).map_err(|e| ClusterError::Config(e.to_string()))
}

/// `drainwatch report --cluster`: the client from the kubeconfig or the pod's service account
/// (as `Client::try_default`).
pub async fn run(t: &Target) -> Result<ClusterReport, ClusterError> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| ClusterError::Config(e.to_string()))?;
    collect(&client(config)?, t).await
}
