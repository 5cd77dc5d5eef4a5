//! What the correlator reports as it happens: the only input telemetry has from the pipeline.

use std::sync::Arc;

use super::{
    ContainerIdentity, Fact, ListenSample, LossKind, Mono, ResetDirection, stop::Stop, storm::Storm,
};

#[derive(Debug, Clone, PartialEq)]
pub enum Emitted {
    /// A container was announced (scan or first event).
    ContainerSeen { container: ContainerIdentity },
    /// Loss counted against a stop (`reason`: a reset's kernel reason).
    Loss {
        container: ContainerIdentity,
        kind: LossKind,
        reason: Option<String>,
    },
    /// A stop began (its first signal, or the exit of a crash).
    StopBegan {
        container: ContainerIdentity,
        stop_id: String,
        at: Mono,
    },
    /// A stop will not change any more.
    Settled { stop: Box<Stop> },
    /// What a proxy did about a request the container cut, stop or not.
    Retry {
        container: ContainerIdentity,
        proxy: String,
        /// `None` for an abort; the latency the retry added for a duplicate.
        added_seconds: Option<f64>,
    },
    /// A RST on one of a container's connections, stop or not.
    Reset {
        container: Arc<ContainerIdentity>,
        direction: ResetDirection,
        reason: String,
    },
    /// A connection refused at an address a known container had closed, stop or not.
    Refused { container: ContainerIdentity },
    /// What happened on one of a container's listeners.
    Listener {
        container: Arc<ContainerIdentity>,
        port: u16,
        fact: Fact,
    },
    /// A sample of the listen path (accept queues, namespace counters).
    ListenSample(Box<ListenSample>),
    /// A reconnect storm ended.
    Storm(Box<Storm>),
}
