//! The agent's own metrics (prometheus-client). Label values are closed sets: hook kinds, loss
//! stages, plan signals and hooks. prometheus-client appends `_total` to counters and `_info` to
//! info metrics itself.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, info::Info},
    registry::Registry,
};

use drainwatch_common::EventKind;

use crate::capture::{event::kind_name, plan::SignalStatus};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LossStage {
    Ringbuf,
    Queue,
    Decode,
}

impl LossStage {
    pub const ALL: [LossStage; 3] = [LossStage::Ringbuf, LossStage::Queue, LossStage::Decode];
    pub fn as_str(self) -> &'static str {
        match self {
            LossStage::Ringbuf => "ringbuf",
            LossStage::Queue => "queue",
            LossStage::Decode => "decode",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StageLabels {
    stage: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ProbeLabels {
    signal: String,
    hook: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct SignalLabels {
    signal: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    kernel: String,
}

pub struct Metrics {
    pub registry: Registry,
    events: Family<KindLabels, Counter>,
    lost: Family<StageLabels, Counter>,
    probe_attached: Family<ProbeLabels, Gauge>,
    probe_degraded: Family<SignalLabels, Gauge>,
}

impl Metrics {
    pub fn new(kernel: &str) -> Self {
        let mut registry = Registry::default();
        let events = Family::<KindLabels, Counter>::default();
        let lost = Family::<StageLabels, Counter>::default();
        let probe_attached = Family::<ProbeLabels, Gauge>::default();
        let probe_degraded = Family::<SignalLabels, Gauge>::default();
        registry.register(
            "drainwatch_events",
            "Events received from the kernel, by hook",
            events.clone(),
        );
        registry.register(
            "drainwatch_events_lost",
            "Events lost before processing, by stage: ringbuf (kernel could not reserve), queue (consumer behind), decode (malformed record)",
            lost.clone(),
        );
        registry.register(
            "drainwatch_probe_attached",
            "1 for the hook each signal uses, 0 for hooks tried that failed on this kernel",
            probe_attached.clone(),
        );
        registry.register(
            "drainwatch_probe_degraded",
            "1 when the hook a signal uses lacks fields or offsets on this kernel (see the start-up log)",
            probe_degraded.clone(),
        );
        registry.register(
            "drainwatch_build",
            "drainwatch version and the kernel it runs on",
            Info::new(BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_string(),
                kernel: kernel.to_string(),
            }),
        );
        // Every closed-set series exists from the start, so rates and alerts see zeros.
        for k in EventKind::ALL {
            let _ = events.get_or_create(&KindLabels {
                kind: kind_name(k).into(),
            });
        }
        for s in LossStage::ALL {
            let _ = lost.get_or_create(&StageLabels {
                stage: s.as_str().into(),
            });
        }
        Self {
            registry,
            events,
            lost,
            probe_attached,
            probe_degraded,
        }
    }

    pub fn event_received(&self, kind: EventKind) {
        self.events
            .get_or_create(&KindLabels {
                kind: kind_name(kind).into(),
            })
            .inc();
    }

    pub fn lost(&self, stage: LossStage, n: u64) {
        self.lost
            .get_or_create(&StageLabels {
                stage: stage.as_str().into(),
            })
            .inc_by(n);
    }

    pub fn lost_count(&self, stage: LossStage) -> u64 {
        self.lost
            .get_or_create(&StageLabels {
                stage: stage.as_str().into(),
            })
            .get()
    }

    pub fn events_count(&self, kind: EventKind) -> u64 {
        self.events
            .get_or_create(&KindLabels {
                kind: kind_name(kind).into(),
            })
            .get()
    }

    pub fn record_plan(&self, statuses: &[SignalStatus]) {
        for st in statuses {
            let chosen = st.chosen();
            for (hook, _) in &st.tried {
                let v = i64::from(chosen == Some(hook.as_str()));
                self.probe_attached
                    .get_or_create(&ProbeLabels {
                        signal: st.signal.into(),
                        hook: hook.clone(),
                    })
                    .set(v);
            }
            self.probe_degraded
                .get_or_create(&SignalLabels {
                    signal: st.signal.into(),
                })
                .set(i64::from(chosen.is_some() && !st.degraded.is_empty()));
        }
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
        let m = Metrics::new("6.18.44");
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
    fn plan_outcome_becomes_attached_gauges() {
        let m = Metrics::new("k");
        m.record_plan(&[
            SignalStatus {
                signal: "accept_wait",
                title: "accept wait",
                tried: vec![("kretprobe:inet_csk_accept".into(), Err("no kprobes".into()))],
                degraded: vec![],
                unavailable: "",
            },
            SignalStatus {
                signal: "resets_sent",
                title: "resets sent",
                tried: vec![("tracepoint:tcp:tcp_send_reset".into(), Ok(()))],
                degraded: vec!["no field reason".into()],
                unavailable: "",
            },
        ]);
        let text = m.encode_openmetrics().unwrap();
        assert!(text.contains("drainwatch_probe_attached{signal=\"accept_wait\",hook=\"kretprobe:inet_csk_accept\"} 0"), "{text}");
        assert!(text.contains("drainwatch_probe_attached{signal=\"resets_sent\",hook=\"tracepoint:tcp:tcp_send_reset\"} 1"), "{text}");
        assert!(
            text.contains("drainwatch_probe_degraded{signal=\"resets_sent\"} 1"),
            "{text}"
        );
    }
}
