//! Kubernetes Events: each settled stop or start that lost users' connections becomes one Warning event on its pod (`ConnectionLossOnStop` / `ConnectionLossOnStart`,
//! the verdict as the note), so `kubectl describe pod` and `kubectl get events` show it where
//! people look. Published with kube-runtime's `Recorder` (events.k8s.io/v1; it turns a repeat
//! of the same reason and note on the same pod into a series update, a patch).
//!
//! One event per record id (ids are remembered while the record is kept), at most
//! `--kube-events-per-minute` per agent (a token bucket: past it events are dropped, not
//! queued), every outcome counted in `drainwatch_kube_events_total{result}`.

use std::{collections::HashSet, sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Client,
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};
use tokio::sync::watch as shutdown_watch;

use super::{
    api::{self, Clock},
    http::State,
};
use crate::model::{
    ContainerIdentity, Mono, SECOND, monotonic_now, start::Start, stop::Stop, storm::Storm,
};

/// The events' reasons (`kubectl get events` REASON).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    ConnectionLossOnStop,
    ConnectionLossOnStart,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::ConnectionLossOnStop => "ConnectionLossOnStop",
            Reason::ConnectionLossOnStart => "ConnectionLossOnStart",
        }
    }

    fn action(self) -> &'static str {
        match self {
            Reason::ConnectionLossOnStop => "Stop",
            Reason::ConnectionLossOnStart => "Start",
        }
    }
}

/// What became of a record's event, as `drainwatch_kube_events_total{result}` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

const EMITTED: &str = "emitted";
const RATE_LIMITED: &str = "rate_limited";
const FAILED: &str = "failed";

#[derive(Clone, Default)]
pub struct EventMetrics {
    results: Family<ResultLabels, Counter>,
}

impl EventMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "drainwatch_kube_events",
            "Kubernetes Events for settled stops and starts that lost connections, by result: emitted, rate_limited (past --kube-events-per-minute, dropped), failed (the API refused or was unreachable; not retried)",
            m.results.clone(),
        );
        for result in [EMITTED, RATE_LIMITED, FAILED] {
            let _ = m.results.get_or_create(&ResultLabels { result });
        }
        m
    }

    fn inc(&self, result: &'static str) {
        self.results.get_or_create(&ResultLabels { result }).inc();
    }

    pub fn get(&self, result: &'static str) -> u64 {
        self.results.get_or_create(&ResultLabels { result }).get()
    }
}

/// A token bucket: `per_minute` tokens a minute, at most `per_minute` at once.
#[derive(Debug)]
struct Bucket {
    per_minute: u32,
    tokens: f64,
    last: Mono,
}

impl Bucket {
    fn new(per_minute: u32, now: Mono) -> Self {
        Self {
            per_minute,
            tokens: f64::from(per_minute),
            last: now,
        }
    }

    fn take(&mut self, now: Mono) -> bool {
        let cap = f64::from(self.per_minute);
        let elapsed = now.saturating_sub(self.last) as f64 / (60 * SECOND) as f64;
        self.tokens = (self.tokens + elapsed * cap).min(cap);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// One event to publish.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub id: String,
    pub reason: Reason,
    pub container: ContainerIdentity,
    pub verdict: String,
}

/// Events' note: at most 1 kB (the API's limit), cut at a character boundary.
fn note(text: &str) -> String {
    let mut end = text.len().min(1024);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// A pod's uid, for the event's `regarding` (from the agent's pod store).
pub type UidOf = Box<dyn Fn(&ContainerIdentity) -> Option<String> + Send>;

/// Picks, rate-limits and publishes; owns the ids already handled.
pub struct Emitter {
    recorder: Recorder,
    bucket: Bucket,
    seen: HashSet<String>,
    metrics: EventMetrics,
    uid_of: UidOf,
}

impl Emitter {
    pub fn new(
        client: Client,
        node: &str,
        per_minute: u32,
        metrics: EventMetrics,
        uid_of: UidOf,
    ) -> Self {
        let reporter = Reporter {
            controller: "drainwatch".into(),
            instance: Some(format!("drainwatch-{node}")),
        };
        Self {
            recorder: Recorder::new(client, reporter),
            bucket: Bucket::new(per_minute, monotonic_now()),
            seen: HashSet::new(),
            metrics,
            uid_of,
        }
    }

    /// The settled records of pods not handled yet that lost connections (under the
    /// correlator's lock: no I/O). Forgets ids no longer kept, so `seen` stays as small as the
    /// records.
    pub fn select(
        &mut self,
        stops: &[Stop],
        starts: &[Start],
        storms: &[Storm],
        clock: &Clock,
    ) -> Vec<Candidate> {
        let kept: HashSet<&str> = stops
            .iter()
            .map(|s| s.id.as_str())
            .chain(starts.iter().map(|s| s.id.as_str()))
            .collect();
        self.seen.retain(|id| kept.contains(id.as_str()));
        let new = |id: &str, settled: bool, c: &ContainerIdentity| {
            settled && !c.pod.is_empty() && !self.seen.contains(id)
        };
        let stops: Vec<Stop> = stops
            .iter()
            .filter(|s| new(&s.id, s.settled, &s.container))
            .cloned()
            .collect();
        let starts: Vec<Start> = starts
            .iter()
            .filter(|s| new(&s.id, s.settled, &s.container))
            .cloned()
            .collect();
        let mut out = Vec::new();
        for v in api::stop_views(&stops, storms, clock) {
            self.seen.insert(v.id.clone());
            if let Some(s) = stops.iter().find(|s| s.id == v.id)
                && s.loss.lost_any()
            {
                out.push(Candidate {
                    id: v.id,
                    reason: Reason::ConnectionLossOnStop,
                    container: s.container.clone(),
                    verdict: v.verdict,
                });
            }
        }
        for v in api::start_views(&starts, clock) {
            self.seen.insert(v.id.clone());
            if let Some(s) = starts.iter().find(|s| s.id == v.id)
                && s.loss.refused_before_listen > 0
            {
                out.push(Candidate {
                    id: v.id,
                    reason: Reason::ConnectionLossOnStart,
                    container: s.container.clone(),
                    verdict: v.verdict,
                });
            }
        }
        out
    }

    /// Marks the records already settled as handled: those of a previous run (resumed from
    /// the checkpoint) had their events then.
    pub fn prime(&mut self, stops: &[Stop], starts: &[Start]) {
        let settled = stops
            .iter()
            .filter(|s| s.settled)
            .map(|s| &s.id)
            .chain(starts.iter().filter(|s| s.settled).map(|s| &s.id));
        self.seen.extend(settled.cloned());
    }

    /// Publishes what the bucket allows, counting each result.
    pub async fn publish(&mut self, now: Mono, candidates: Vec<Candidate>) {
        for c in candidates {
            if !self.bucket.take(now) {
                self.metrics.inc(RATE_LIMITED);
                tracing::debug!(record = %c.id, "Kubernetes event dropped: rate limit");
                continue;
            }
            let regarding = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(c.container.pod.clone()),
                namespace: Some(c.container.namespace.clone()),
                uid: (self.uid_of)(&c.container),
                field_path: (!c.container.name.is_empty())
                    .then(|| format!("spec.containers{{{}}}", c.container.name)),
                ..Default::default()
            };
            let event = Event {
                type_: EventType::Warning,
                reason: c.reason.as_str().into(),
                note: Some(note(&c.verdict)),
                action: c.reason.action().into(),
                secondary: None,
            };
            match self.recorder.publish(&event, &regarding).await {
                Ok(()) => self.metrics.inc(EMITTED),
                Err(e) => {
                    self.metrics.inc(FAILED);
                    tracing::warn!(record = %c.id, pod = %c.container.pod, "Kubernetes event not published: {e}");
                }
            }
        }
    }
}

/// Every `every`, turns the correlator's newly settled records into events, until shutdown;
/// times in the verdicts as the API writes them (`State::clock`).
pub async fn run(
    mut emitter: Emitter,
    state: Arc<State>,
    every: Duration,
    mut shutdown: shutdown_watch::Receiver<bool>,
) {
    if let Ok(t) = state.correlator.lock() {
        emitter.prime(t.stops(), t.starts());
    }
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => break,
        }
        let clock = state.clock();
        let candidates = match state.correlator.lock() {
            Ok(t) => emitter.select(t.stops(), t.starts(), t.storms(), &clock),
            Err(_) => continue,
        };
        emitter.publish(monotonic_now(), candidates).await;
    }
}
