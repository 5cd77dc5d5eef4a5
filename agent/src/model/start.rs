//! The start record: one per container start the agent saw (a new container, or one restarted
//! in place), from its PID 1's start to its first `listen()` and `accept()`, with the connects
//! refused at its address before it listened: it was routed to before it was ready. Built by
//! `correlate::starts`; the API, page, report and metrics read it.

use serde::{Deserialize, Serialize};

use super::{ContainerIdentity, Mono};

/// Most refusal times a start keeps (to tell a balancer's checks among them when it
/// settles); the counts stay exact beyond it.
pub const MAX_REFUSALS_KEPT: usize = 10_000;
/// Most refusal times a start's timeline draws (the API and the page).
pub const MAX_REFUSALS_DRAWN: usize = 500;

/// What a start cost.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StartLoss {
    pub probes: StartProbes,
    /// Connects refused at a port between the start and its first `listen()` there.
    pub refused_before_listen: u64,
}

/// Health checks refused during start-up: normal (a kubelet probe before the server listens),
/// not loss.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StartProbes {
    pub refused: u64,
}

/// Serialized only into the agent's own checkpoint; the API has its own view.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Start {
    pub id: String,
    pub container: ContainerIdentity,
    /// Restarted in place (same container, new PID 1).
    pub restart: bool,
    /// Its network namespace's inode (from procfs) and cookie (from its first listen's own
    /// record; None where the kernel has none: refusals are then matched by inode and time
    /// only, and a namespace that reused a stopped container's inode cannot be told from it).
    pub netns: Option<u32>,
    #[serde(default)]
    pub netns_cookie: Option<u64>,
    /// The namespace was made for it (no other container but a pod's sandbox in it): refusals
    /// it sent before the PID 1 started (a runtime sets the network up first) are its too.
    #[serde(default)]
    pub fresh_netns: bool,
    pub started_at: Mono,
    pub first_listen_at: Option<Mono>,
    pub first_accept_at: Option<Mono>,
    /// Ports it listened on, in order, with when it first did.
    pub ports: Vec<(u16, Mono)>,
    pub loss: StartLoss,
    /// When the refused requests happened, in order (capped: [`MAX_REFUSALS_KEPT`]).
    pub refused_at: Vec<Mono>,
    /// When the refused health checks happened (capped likewise): a tick they took is not
    /// a request's to take when the start settles.
    pub probe_refused_at: Vec<Mono>,
    /// Refusals of its namespace dropped at the waiting cap before a listen could take them:
    /// the counts may be short by this many.
    pub refusals_lost: u64,
    /// Kernel events lost anywhere on their way while it was open: its counts may be short.
    pub events_lost: u64,
    /// eBPF program faults while it was open that lose what it reads (see `Lost`).
    #[serde(default)]
    pub ebpf_faults: u64,
    /// It will not change any more.
    pub settled: bool,
}

impl Start {
    /// Start → first listen, seconds.
    pub fn listen_after_seconds(&self) -> Option<f64> {
        self.first_listen_at
            .map(|l| l.saturating_sub(self.started_at) as f64 / 1e9)
    }
}
