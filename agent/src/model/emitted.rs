//! What the correlator reports as it happens: the only input telemetry has from the pipeline.

use std::sync::Arc;

use super::{
    ContainerIdentity, Fact, ListenSample, LossKind, Mono, ResetDirection, start::Start,
    stop::Stop, storm::Storm,
};

/// What became of a request a backend cut (`correlate::retries`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RetryOutcome {
    /// Re-sent to another backend after the cut one had read it: done twice (or maybe).
    /// `added_seconds`: from the original request's start to the retry's.
    Duplicate { added_seconds: f64 },
    /// Re-sent after the cut backend died with it unread: done once.
    Unexecuted { added_seconds: f64 },
    /// Not re-sent: the client saw an error.
    Abort,
}

impl RetryOutcome {
    /// The loss it counts as against the cut backend's stop.
    pub fn loss(self) -> LossKind {
        match self {
            RetryOutcome::Duplicate { .. } => LossKind::RetryDuplicates,
            RetryOutcome::Unexecuted { .. } => LossKind::RetriedUnexecuted,
            RetryOutcome::Abort => LossKind::UpstreamAborts,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Emitted {
    /// A container was announced (scan or first event).
    ContainerSeen { container: ContainerIdentity },
    /// A container gone longer than the retention window was forgotten: its series may go.
    ContainerForgotten { container: ContainerIdentity },
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
    /// The upper percentile (p95) of the stream lifetimes learned on a container's listeners
    /// (see `Stop::stream_lifetimes`).
    StreamRotation {
        container: ContainerIdentity,
        seconds: f64,
    },
    /// A stop will not change any more.
    Settled { stop: Box<Stop> },
    /// A start will not change any more.
    StartSettled { start: Box<Start> },
    /// What a proxy did about a request the container cut, stop or not.
    Retry {
        container: ContainerIdentity,
        proxy: String,
        outcome: RetryOutcome,
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
    /// A storm already reported resumed (more of the same stop's clients came back after a
    /// quiet spell) and ended again: its record, updated (one return, one record).
    StormUpdated(Box<Storm>),
}
