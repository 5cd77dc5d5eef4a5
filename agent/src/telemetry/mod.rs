//! The agent's metrics (prometheus-client 0.26), on the ground floor so every stage may count:
//! [`Telemetry`] owns the registry and one part per subsystem, each registering its own
//! families (`register(&mut Registry) -> Self`, as linkerd2-proxy does): the agent's own
//! health (`agent`), per-container stop and start families (`stops`, `starts`), the accept path and storms
//! (`listeners`), behind one cardinality cap (`cap`), the periodic work that grows with the node (`work`), and the process's own CPU, memory and
//! descriptors (`process`, read at scrape time). The pipeline reaches it only through
//! [`Telemetry::record`]; the agent's internal events count and log through `internal`.
//! prometheus-client appends `_total` to counters and `_info` to info metrics itself.

pub mod agent;
pub mod cap;
pub mod checkpoint;
pub mod heartbeat;
pub mod internal;
pub mod labels;
pub mod listeners;
pub mod process;
pub mod starts;
pub mod state;
pub mod stops;
pub mod work;

use std::sync::Arc;

use prometheus_client::registry::Registry;

use drainwatch_common::EventKind;

use crate::model::Emitted;

pub use agent::{AgentMetrics, Attach};
pub use cap::MAX_CONTAINERS;
use labels::ContainerLabels;
pub use labels::{LossStage, ProcfsFile};
pub use listeners::ListenerMetrics;
pub use starts::StartMetrics;
pub use stops::StopMetrics;

pub struct Telemetry {
    registry: Registry,
    pub agent: AgentMetrics,
    pub stops: StopMetrics,
    pub starts: StartMetrics,
    pub listeners: ListenerMetrics,
    pub state: state::StateMetrics,
    pub checkpoint: checkpoint::CheckpointMetrics,
    pub work: work::WorkMetrics,
    cap: Arc<cap::Cap>,
    /// The reader's and the pipeline's, for `/healthz`.
    pub heartbeats: heartbeat::Heartbeats,
    limits: internal::Limits,
}

impl Telemetry {
    /// Every family registered, closed label sets at zero; `kernel` goes into the build info.
    pub fn new(kernel: &str) -> Self {
        let mut registry = Registry::default();
        let agent = AgentMetrics::register(&mut registry, kernel);
        let cap = Arc::new(cap::Cap::register(&mut registry));
        let stops = StopMetrics::register(&mut registry, cap.clone());
        let starts = StartMetrics::register(&mut registry, cap.clone());
        let listeners = ListenerMetrics::register(&mut registry, cap.clone());
        let state = state::StateMetrics::register(&mut registry);
        let checkpoint = checkpoint::CheckpointMetrics::register(&mut registry);
        let work = work::WorkMetrics::register(&mut registry);
        registry.register_collector(Box::new(process::ProcessCollector));
        Self {
            registry,
            agent,
            stops,
            starts,
            listeners,
            state,
            checkpoint,
            work,
            cap,
            heartbeats: heartbeat::Heartbeats::default(),
            limits: internal::Limits::default(),
        }
    }

    /// For subsystems registered only when used (the Kubernetes watch's metrics).
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// What the correlator reported: the one way the pipeline reaches the metrics.
    pub fn record(&self, e: &Emitted) {
        match e {
            // A pod's sandbox is never a stop nor a start: no series of its own.
            Emitted::ContainerSeen { container } if container.is_sandbox() => {}
            Emitted::ContainerSeen { container } => {
                self.stops.container_seen(container);
                self.starts.container_seen(container);
                self.cap
                    .hold(&ContainerLabels::from(container), &container.id);
            }
            Emitted::ContainerForgotten { container } => {
                self.cap
                    .forget(&ContainerLabels::from(container), &container.id);
                self.stops.forget_handles();
                self.listeners.forget_handles();
            }
            Emitted::Loss {
                container,
                kind,
                reason,
            } => self.stops.stop_loss(container, *kind, reason.as_deref()),
            Emitted::Settled { stop } => self.stops.stop_settled(stop),
            Emitted::StartSettled { start } => self.starts.start_settled(start),
            Emitted::StopBegan { .. } => {}
            Emitted::StreamRotation { container, seconds } => {
                self.stops.stream_rotation(container, *seconds)
            }
            Emitted::Retry {
                container,
                proxy,
                outcome,
            } => self.stops.retry(container, proxy, *outcome),
            Emitted::Reset {
                container,
                direction,
                reason,
            } => self.stops.connection_reset(container, *direction, reason),
            Emitted::Refused { container } => self.stops.refused_connection(container),
            Emitted::Listener {
                container,
                port,
                fact,
            } => self.listeners.listener_fact(container, *port, fact),
            Emitted::ListenSample(sample) => {
                self.listeners
                    .accept_queues(&sample.queues, sample.complete);
                self.listeners.netns_listen_counters(&sample.netns);
            }
            Emitted::Storm(storm) => self.listeners.storm(storm, true),
            Emitted::StormUpdated(storm) => self.listeners.storm(storm, false),
        }
    }

    pub fn events_count(&self, kind: EventKind) -> u64 {
        self.agent.events_count(kind)
    }

    /// Events lost so far at every stage.
    pub fn lost_total(&self) -> u64 {
        LossStage::ALL.iter().map(|s| self.lost_count(*s)).sum()
    }

    /// What was lost so far that open records must say: events on their way, and faults
    /// that lose part of what a record reads.
    pub fn lost(&self) -> crate::model::stop::Lost {
        crate::model::stop::Lost {
            events: self.lost_total(),
            faults: self.agent.input_faults(),
        }
    }

    pub fn lost_count(&self, stage: LossStage) -> u64 {
        self.agent.lost_count(stage)
    }

    /// OpenMetrics text.
    pub fn encode_openmetrics(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }

    /// Prometheus text format 0.0.4.
    pub fn encode_prometheus(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_zeroed_series_and_build_info() {
        let m = Telemetry::new("6.18.44");
        let text = m.encode_openmetrics().unwrap();
        assert!(
            text.contains("drainwatch_events_total{kind=\"tcp_send_reset\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("drainwatch_events_lost_total{stage=\"ringbuf\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("drainwatch_build_info{version=\"0.1.0\",kernel=\"6.18.44\"} 1"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
        let plain = m.encode_prometheus().unwrap();
        assert!(!plain.contains("# EOF"));
        assert!(
            plain.contains("drainwatch_events_lost_total{stage=\"queue\"} 0"),
            "{plain}"
        );
    }

    #[test]
    fn a_pods_sandbox_gets_no_stop_or_start_series() {
        let m = Telemetry::new("6.18.44");
        for name in ["app", crate::model::SANDBOX_NAME] {
            let container = crate::model::ContainerIdentity {
                id: format!("{name}-id"),
                name: name.into(),
                namespace: "shop".into(),
                pod: "web-7d9f8b6c5d-x2x7q".into(),
                workload: "web".into(),
                ..Default::default()
            };
            m.record(&Emitted::ContainerSeen { container });
        }
        let text = m.encode_prometheus().unwrap();
        assert!(
            text.contains("container=\"app\",outcome=\"drained\"} 0"),
            "{text}"
        );
        assert!(!text.contains("container=\"POD\""), "{text}");
    }
}
