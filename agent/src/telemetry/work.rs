//! The pipeline's periodic work that grows with the node: the containers it follows, what
//! each listen-path sample costs (it reads a few procfs files per running container), and
//! what reading the connections the kernel holds costs (`--hold`: every 5 s, and when a
//! namespace turns hot).

use std::sync::atomic::AtomicU64;

use crate::model::nat::NatOutcome;

use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

/// Which containers a listen-path sample read.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum SampleScope {
    /// Every running container (every ten seconds).
    All,
    /// Stopping or storming workloads' and new containers' (up to ten times a second).
    Some,
}

impl EncodeLabelValue for SampleScope {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        let s = match self {
            SampleScope::All => "all",
            SampleScope::Some => "some",
        };
        EncodeLabelValue::encode(&s, encoder)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ScopeLabels {
    scope: SampleScope,
}

pub struct WorkMetrics {
    containers: Gauge,
    sample_seconds: [Histogram; 2],
    sample_cpu: [Counter<f64, AtomicU64>; 2],
    held: Gauge,
    hold_sweep_seconds: Histogram,
    taken_over: Counter,
    nat_lookups: Family<NatLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NatLabels {
    result: &'static str,
}

impl WorkMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let containers = Gauge::default();
        let seconds = Family::<ScopeLabels, Histogram>::new_with_constructor(|| {
            // 100 µs (a few containers) to 5 s (thousands behind a slow procfs).
            Histogram::new([
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0, 2.5, 5.0,
            ])
        });
        let cpu = Family::<ScopeLabels, Counter<f64, AtomicU64>>::default();
        registry.register(
            "drainwatch_containers",
            "Running containers the agent follows",
            containers.clone(),
        );
        registry.register(
            "drainwatch_listen_sample_seconds",
            "Wall time of each listen-path sample (accept queues and listen counters read from procfs), by scope: all running containers, or some",
            seconds.clone(),
        );
        registry.register(
            "drainwatch_listen_sample_cpu_seconds",
            "CPU time the pipeline thread spent in listen-path samples, by scope",
            cpu.clone(),
        );
        let held = Gauge::default();
        registry.register(
            "drainwatch_hold_entries",
            "Connections the kernel held (--hold) at the last take-over: arrivals waiting for their connection's next record",
            held.clone(),
        );
        // 10 µs (a few held) to 2.5 s (a full map behind a slow machine).
        let hold_sweep_seconds = Histogram::new([
            0.00001, 0.0001, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        ]);
        registry.register(
            "drainwatch_hold_take_over_seconds",
            "Wall time of each take-over of held connections (reading the kernel's map and removing what is taken), before the pipeline handles them",
            hold_sweep_seconds.clone(),
        );
        let taken_over = Counter::default();
        registry.register(
            "drainwatch_hold_taken_over",
            "Held connections the agent took over from the kernel (a hot namespace, or held for 10 s)",
            taken_over.clone(),
        );
        let nat_lookups = Family::<NatLabels, Counter>::default();
        registry.register(
            "drainwatch_nat_lookups",
            "Connection-tracking lookups of failed connects to addresses no container has (a Service's virtual IP), by result: translated (to a pod), untranslated, not_found, failed, capped (over 200 a second); none when the agent cannot look up (not in the host's network namespace, or without CAP_NET_ADMIN: said at start-up)",
            nat_lookups.clone(),
        );
        let scopes = [SampleScope::All, SampleScope::Some];
        Self {
            held,
            hold_sweep_seconds,
            taken_over,
            nat_lookups,
            containers,
            sample_seconds: scopes.map(|scope| seconds.get_or_create_owned(&ScopeLabels { scope })),
            sample_cpu: scopes.map(|scope| cpu.get_or_create_owned(&ScopeLabels { scope })),
        }
    }

    pub fn containers(&self, n: usize) {
        self.containers.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// One sample: its wall and CPU time, in seconds.
    pub fn listen_sample(&self, scope: SampleScope, wall: f64, cpu: f64) {
        let i = scope as usize;
        self.sample_seconds[i].observe(wall);
        self.sample_cpu[i].inc_by(cpu.max(0.0));
    }

    /// The enricher's running counts of connection-tracking lookups.
    pub fn nat_lookups(&self, counts: &[(NatOutcome, u64)]) {
        for (outcome, total) in counts {
            let c = self.nat_lookups.get_or_create(&NatLabels {
                result: outcome.label(),
            });
            let now = c.get();
            if *total > now {
                c.inc_by(total - now);
            }
        }
    }

    /// One take-over of held connections: what the kernel held, what was taken, how long it took.
    pub fn hold_take_over(&self, held: usize, taken: usize, seconds: f64) {
        self.held.set(i64::try_from(held).unwrap_or(i64::MAX));
        self.taken_over.inc_by(taken as u64);
        self.hold_sweep_seconds.observe(seconds);
    }
}

/// CPU time of the calling thread, in seconds.
pub fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the timespec it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

#[cfg(test)]
mod tests {
    use crate::telemetry::Telemetry;

    #[test]
    fn samples_count_by_scope_and_containers_are_a_gauge() {
        let t = Telemetry::new("k");
        t.work.containers(3);
        t.work.listen_sample(super::SampleScope::All, 0.002, 0.001);
        t.work.hold_take_over(7, 2, 0.003);
        let text = t.encode_prometheus().unwrap();
        assert!(text.contains("drainwatch_hold_entries 7\n"), "{text}");
        assert!(
            text.contains("drainwatch_hold_taken_over_total 2\n"),
            "{text}"
        );
        assert!(
            text.contains("drainwatch_hold_take_over_seconds_count 1\n"),
            "{text}"
        );
        assert!(text.contains("drainwatch_containers 3"), "{text}");
        assert!(
            text.contains("drainwatch_listen_sample_seconds_count{scope=\"all\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("drainwatch_listen_sample_seconds_count{scope=\"some\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("drainwatch_listen_sample_cpu_seconds_total{scope=\"all\"} 0.001"),
            "{text}"
        );
    }
}
