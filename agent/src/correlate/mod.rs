//! Correlate: turns attributed observations into container stop timelines, the connection loss
//! each stop caused, and deploys. Pure: fed observations and a clock (kernel monotonic
//! nanoseconds), no I/O, so every rule is unit-tested without a kernel.

pub mod deploys;
pub mod retries;
pub mod stops;
pub mod storms;

use std::net::SocketAddr;

use serde::Serialize;

/// Kernel monotonic time, nanoseconds (`bpf_ktime_get_ns`).
pub type Mono = u64;

pub const SECOND: Mono = 1_000_000_000;

/// Who a container is, as reports and metrics name it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize)]
pub struct ContainerIdentity {
    pub id: String,
    pub runtime: String,
    pub name: String,
    pub namespace: String,
    pub pod: String,
    pub workload: String,
    /// Kind of the owning workload (Deployment, StatefulSet, DaemonSet, Job, CronJob, …) from
    /// the Kubernetes API; "" without it.
    pub workload_kind: String,
    /// The rollout the container belongs to: the pod template hash; "" when unknown.
    pub revision: String,
    /// The node its pod runs on (Kubernetes API); "" when unknown.
    pub node: String,
    /// What the pod spec says about stopping it; rendered on stop records, not part of the
    /// container object.
    #[serde(skip)]
    pub stop_policy: StopPolicy,
}

/// What the pod spec (Kubernetes API) says about stopping a container; None when unknown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct StopPolicy {
    /// `terminationGracePeriodSeconds` (or the deletion's own grace period).
    pub grace_configured_seconds: Option<i64>,
    /// Whether the container has a preStop hook.
    pub prestop: Option<bool>,
}

/// A process outside the container that sent it a stop signal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Sender {
    pub pid: u32,
    pub comm: String,
}

/// How a container's main process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitInfo {
    /// The shell's convention: exit code, or 128 + signal.
    pub code: Option<i32>,
    /// The signal that killed it, if one did.
    pub signal: Option<i32>,
}

/// Something the attribution stage established about one container. `key` is the container id.
#[derive(Debug, Clone, PartialEq)]
pub enum Observation {
    /// The container exists (scan or first event). `listeners` and `inbound` seed state when
    /// the agent starts while the container runs.
    Container {
        identity: ContainerIdentity,
        listeners: Vec<SocketAddr>,
        inbound: Vec<u64>,
    },
    /// A stop signal from outside the container.
    Signal {
        key: String,
        sig: i32,
        sender: Sender,
    },
    /// The container's main process exited.
    Exit {
        key: String,
        exit: ExitInfo,
    },
    ListenerOpened {
        key: String,
        addr: SocketAddr,
    },
    ListenerClosed {
        key: String,
        addr: SocketAddr,
    },
    /// A connection to one of its listeners completed its handshake.
    InboundEstablished {
        key: String,
        sock: u64,
    },
    /// An inbound connection ended. `by_container`: the container closed or reset it (not the
    /// peer); `pending`: a request was waiting for an answer.
    InboundClosed {
        key: String,
        sock: u64,
        by_container: bool,
        pending: bool,
    },
    /// The container's stack sent a RST on one of its connections.
    ResetSent {
        key: String,
        reason: String,
    },
    /// A SYN to a listening address it had closed was answered with RST.
    Refused {
        key: String,
    },
    /// A connection attempt from this node to an address it held, after it was gone.
    Unreachable {
        key: String,
    },
    CgroupRemoved {
        key: String,
    },
    /// What is known about who the container is changed (the Kubernetes API learned its
    /// pod after it was adopted with the runtime's names, or its pod spec changed).
    Identity {
        identity: ContainerIdentity,
    },
    /// A proxy process on this node opened a connection to the container (`key`).
    UpstreamOpened {
        key: String,
        sock: u64,
        proxy: retries::Proxy,
    },
    /// That connection closed after the proxy sent `bytes_sent` bytes on it.
    UpstreamClosed {
        key: String,
        sock: u64,
        bytes_sent: u64,
    },
    /// The container cut a proxy's connection with a request of `request_bytes` pending.
    UpstreamCut {
        key: String,
        proxy: retries::Proxy,
        request_bytes: u64,
        upstream_opened_at: Mono,
    },
}

impl Observation {
    pub fn key(&self) -> &str {
        match self {
            Observation::Container { identity, .. } | Observation::Identity { identity } => {
                &identity.id
            }
            Observation::Signal { key, .. }
            | Observation::Exit { key, .. }
            | Observation::ListenerOpened { key, .. }
            | Observation::ListenerClosed { key, .. }
            | Observation::InboundEstablished { key, .. }
            | Observation::InboundClosed { key, .. }
            | Observation::ResetSent { key, .. }
            | Observation::Refused { key }
            | Observation::Unreachable { key }
            | Observation::CgroupRemoved { key }
            | Observation::UpstreamOpened { key, .. }
            | Observation::UpstreamClosed { key, .. }
            | Observation::UpstreamCut { key, .. } => key,
        }
    }
}

#[cfg(test)]
mod tests;
