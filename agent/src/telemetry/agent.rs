//! The agent's own health: events received and filtered by hook, events lost by stage, the
//! watch maps, which probes attached, procfs files it could not parse, and its build. Every
//! label here is a closed set, so each series is created at registration (rates and alerts
//! see zeros) and its handle kept: the reader's per-event count is an array index and an
//! atomic add, no lookup, no allocation.

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge, info::Info},
    registry::Registry,
};

use drainwatch_common::{EventKind, faults::FaultKind};

use super::labels::{
    BuildLabels, Fault, FaultLabels, FileLabels, Hook, KindLabels, LossStage, MapLabels,
    ProbeLabels, ProcfsFile, SignalLabels, StageLabels, WatchMap,
};

const KINDS: usize = EventKind::ALL.len();

/// One signal's attach result, as the plan (`capture::plan::SignalStatus`) reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attach<'a> {
    pub signal: &'a str,
    /// Every hook tried, in order, and whether it attached.
    pub tried: Vec<(&'a str, bool)>,
    /// Whether the hook used lacks fields or offsets on this kernel.
    pub degraded: bool,
}

impl Attach<'_> {
    /// The hook the signal uses: the first that attached.
    fn chosen(&self) -> Option<&str> {
        self.tried.iter().find(|(_, ok)| *ok).map(|(h, _)| *h)
    }
}

pub struct AgentMetrics {
    events: [Counter; KINDS],
    filtered: [Counter; KINDS],
    shed: [Counter; KINDS],
    lost: [Counter; LossStage::ALL.len()],
    /// Entries a kernel map had no room for: container addresses, proxies' upstream sockets
    /// the agent found (the kernel's own refusals are the fault `upstream_full`).
    addresses_full: Counter,
    upstreams_full: Counter,
    storm_netns_full: Counter,
    /// `addresses`, `ports`.
    watch_entries: [Gauge; 2],
    watch_failures: Counter,
    http_closed: Counter,
    probe_attached: Family<ProbeLabels, Gauge>,
    probe_degraded: Family<SignalLabels, Gauge>,
    procfs_errors: [Counter; ProcfsFile::ALL.len()],
    /// Per hook, per fault kind: what the eBPF programs could not do.
    faults: [[Counter; FaultKind::ALL.len()]; KINDS],
    /// The lifecycle programs' log records handed to tracing, and the log's failures.
    ebpf_log_records: Counter,
    ebpf_log_failures: Counter,
}

impl AgentMetrics {
    pub fn register(registry: &mut Registry, kernel: &str) -> Self {
        let events = Family::<KindLabels, Counter>::default();
        let filtered = Family::<KindLabels, Counter>::default();
        let shed = Family::<KindLabels, Counter>::default();
        let watch_full = Family::<MapLabels, Counter>::default();
        let watch_entries = Family::<MapLabels, Gauge>::default();
        let watch_failures = Counter::default();
        let http_closed = Counter::default();
        let lost = Family::<StageLabels, Counter>::default();
        let probe_attached = Family::<ProbeLabels, Gauge>::default();
        let probe_degraded = Family::<SignalLabels, Gauge>::default();
        let procfs_errors = Family::<FileLabels, Counter>::default();
        let faults = Family::<FaultLabels, Counter>::default();
        let ebpf_log_records = Counter::default();
        let ebpf_log_failures = Counter::default();
        registry.register(
            "drainwatch_events",
            "Events received from the kernel, by hook",
            events.clone(),
        );
        registry.register(
            "drainwatch_events_filtered",
            "Events dropped in the kernel as out of scope, by hook: host-namespace connections that touch no container (--host-traffic all keeps them), and records no part of the agent reads (a loopback connect's steps after SYN_SENT but its failure, socket error reports)",
            filtered.clone(),
        );
        registry.register(
            "drainwatch_events_shed",
            "Packet-path events shed in the kernel, by hook: past the per-CPU budget (--packet-events-per-cpu); also in drainwatch_events_lost_total{stage=\"shed\"}. Lifecycle events (signals, exits, cgroup removals) are never shed",
            shed.clone(),
        );
        registry.register(
            "drainwatch_http_connections_closed",
            "HTTP connections the agent closed to stay within its connection limit: the ones idle longest when another arrived, or new ones when every connection was mid-request",
            http_closed.clone(),
        );
        registry.register(
            "drainwatch_watch_map_full",
            "Entries a kernel map had no room for, by map: container addresses (host-side traffic to them is not captured), proxies' upstream sockets the agent found open (their requests are not followed; connects the kernel could not follow are drainwatch_ebpf_faults_total{fault=\"upstream_full\"}), storming namespaces (their connections' answers are not timed; connections the kernel could not follow are drainwatch_ebpf_faults_total{fault=\"storm_full\"})",
            watch_full.clone(),
        );
        registry.register(
            "drainwatch_watch_entries",
            "What the kernel keeps the host namespace's connections for: container addresses, and ports of host-network containers' listeners",
            watch_entries.clone(),
        );
        registry.register(
            "drainwatch_watch_update_failures",
            "Updates of the kernel's watch maps that failed part-way (see the log): host-side traffic of the containers they would have added may go uncaptured",
            watch_failures.clone(),
        );
        registry.register(
            "drainwatch_events_lost",
            "Events lost before processing, by stage: shed (past the kernel's per-CPU budget), ringbuf (kernel could not reserve), queue (consumer behind), decode (malformed record)",
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
        registry.register(
            "drainwatch_procfs_errors",
            "procfs files that could not be parsed, by file",
            procfs_errors.clone(),
        );
        registry.register(
            "drainwatch_ebpf_faults",
            "What the eBPF programs could not do, by hook and fault: kernel reads that failed, paths cut at the record's size (each also logged under drainwatch::ebpf, at powers of two)",
            faults.clone(),
        );
        registry.register(
            "drainwatch_ebpf_log_records",
            "Log records of the lifecycle eBPF programs (signals, exits, cgroup removals: what they could not read, at powers of two of each fault's count per CPU) the agent logged under drainwatch::ebpf",
            ebpf_log_records.clone(),
        );
        registry.register(
            "drainwatch_ebpf_log_failures",
            "The eBPF programs' log failed: it could not be set up at start (its records are then not shown), or a record could not be decoded (see the log). Faults are counted in drainwatch_ebpf_faults_total either way",
            ebpf_log_failures.clone(),
        );
        // Every closed-set series exists from the start, and its handle is kept.
        let per_kind = |family: &Family<KindLabels, Counter>| {
            EventKind::ALL.map(|k| family.get_or_create_owned(&KindLabels { kind: Hook(k) }))
        };
        Self {
            events: per_kind(&events),
            filtered: per_kind(&filtered),
            shed: per_kind(&shed),
            lost: LossStage::ALL.map(|stage| lost.get_or_create_owned(&StageLabels { stage })),
            addresses_full: watch_full.get_or_create_owned(&MapLabels {
                map: WatchMap::Addresses,
            }),
            upstreams_full: watch_full.get_or_create_owned(&MapLabels {
                map: WatchMap::UpstreamSockets,
            }),
            storm_netns_full: watch_full.get_or_create_owned(&MapLabels {
                map: WatchMap::StormNamespaces,
            }),
            watch_entries: [WatchMap::Addresses, WatchMap::Ports]
                .map(|map| watch_entries.get_or_create_owned(&MapLabels { map })),
            watch_failures,
            http_closed,
            probe_attached,
            probe_degraded,
            procfs_errors: ProcfsFile::ALL
                .map(|file| procfs_errors.get_or_create_owned(&FileLabels { file })),
            ebpf_log_records,
            ebpf_log_failures,
            faults: EventKind::ALL.map(|k| {
                FaultKind::ALL.map(|f| {
                    faults.get_or_create_owned(&FaultLabels {
                        kind: Hook(k),
                        fault: Fault(f),
                    })
                })
            }),
        }
    }

    pub fn event_received(&self, kind: EventKind) {
        self.events[kind.index()].inc();
    }

    pub fn events_count(&self, kind: EventKind) -> u64 {
        self.events[kind.index()].get()
    }

    /// Events the kernel dropped as out of scope since the last poll.
    pub fn filtered(&self, kind: EventKind, n: u64) {
        self.filtered[kind.index()].inc_by(n);
    }

    pub fn http_connections_closed(&self, n: u64) {
        self.http_closed.inc_by(n);
    }

    pub fn shed(&self, kind: EventKind, n: u64) {
        self.shed[kind.index()].inc_by(n);
    }

    /// Brings a (hook, fault) counter up to the kernel's total since load; returns what it
    /// was before.
    pub fn ebpf_faults(&self, kind: EventKind, fault: FaultKind, total: u64) -> u64 {
        let Some(c) = self
            .faults
            .get(kind.index())
            .and_then(|per_kind| per_kind.get(fault as usize))
        else {
            return total;
        };
        let before = c.get();
        if let Some(grew) = total.checked_sub(before) {
            c.inc_by(grew);
        }
        before
    }

    /// Brings the log-record counter up to the total logged since load. Counted by
    /// `internal::EbpfLogRecords`.
    pub(super) fn ebpf_log_records(&self, total: u64) {
        if let Some(grew) = total.checked_sub(self.ebpf_log_records.get()) {
            self.ebpf_log_records.inc_by(grew);
        }
    }

    /// Counted by `internal::EbpfLogFailed`, which also logs.
    pub(super) fn ebpf_log_failed(&self) {
        self.ebpf_log_failures.inc();
    }

    /// eBPF program faults that lose part of a record's inputs (`FaultKind::loses_input`),
    /// and upstream sockets the agent found that the kernel had no room to follow.
    pub fn input_faults(&self) -> u64 {
        let kernel: u64 = self
            .faults
            .iter()
            .flat_map(|per_kind| FaultKind::ALL.iter().zip(per_kind))
            .filter(|(f, _)| f.loses_input())
            .map(|(_, c)| c.get())
            .sum();
        kernel + self.upstreams_full.get()
    }

    pub fn lost_count(&self, stage: LossStage) -> u64 {
        self.lost[stage.index()].get()
    }

    /// Counted by `internal::EventsLost` and `internal::DecodeFailed`, which also log.
    pub(super) fn lost(&self, stage: LossStage, n: u64) {
        self.lost[stage.index()].inc_by(n);
    }

    /// Counted by `internal::ProcfsUnreadable`, which also logs.
    pub(super) fn procfs_error(&self, file: ProcfsFile) {
        self.procfs_errors[file.index()].inc();
    }

    /// After the watch maps were updated: what they hold, and what did not fit. Counted by
    /// `internal::WatchUpdated`, which also logs.
    pub(super) fn watch_applied(&self, addresses: usize, ports: usize, refused: u64) {
        self.addresses_full.inc_by(refused);
        for (gauge, n) in self.watch_entries.iter().zip([addresses, ports]) {
            gauge.set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Upstream sockets the agent found open that `UPSTREAM_SOCKS` had no room for. Counted
    /// by `internal::UpstreamsFollowed`.
    pub(super) fn upstreams_refused(&self, refused: u64) {
        self.upstreams_full.inc_by(refused);
    }

    /// Storming namespaces `STORM_NETNS` had no room for. Counted by
    /// `internal::StormingSet`.
    pub(super) fn storm_netns_refused(&self, refused: u64) {
        self.storm_netns_full.inc_by(refused);
    }

    /// Counted by `internal::WatchUpdateFailed`, which also logs.
    pub(super) fn watch_update_failed(&self) {
        self.watch_failures.inc();
    }

    /// Which hook each signal uses (1) and which it tried that failed (0); whether the signal
    /// is degraded: its hook lacks fields or offsets, or no hook could attach at all.
    pub fn record_plan(&self, plan: &[Attach<'_>]) {
        for st in plan {
            let chosen = st.chosen();
            for (hook, _) in &st.tried {
                let v = i64::from(chosen == Some(*hook));
                self.probe_attached
                    .get_or_create(&ProbeLabels {
                        signal: st.signal.into(),
                        hook: (*hook).into(),
                    })
                    .set(v);
            }
            self.probe_degraded
                .get_or_create(&SignalLabels {
                    signal: st.signal.into(),
                })
                .set(i64::from(chosen.is_none() || st.degraded));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Attach, EventKind, FaultKind};
    use crate::telemetry::Telemetry;

    /// What open records are told was lost: the faults that lose part of what a record reads
    /// (a retry chain, an upstream connection unfollowed, by the kernel or the agent), not a
    /// full hold (its arrivals were sent) nor a stale entry's drop (a correction).
    #[test]
    fn input_faults_are_the_faults_that_lose_what_a_record_reads() {
        let m = Telemetry::new("k");
        m.agent
            .ebpf_faults(EventKind::InetSockSetState, FaultKind::HoldFull, 5);
        m.agent
            .ebpf_faults(EventKind::InetSockSetState, FaultKind::StaleEntry, 2);
        m.agent
            .ebpf_faults(EventKind::InetSockSetState, FaultKind::UpstreamFull, 3);
        m.agent
            .ebpf_faults(EventKind::SockLength, FaultKind::ChainLost, 1);
        m.agent.upstreams_refused(4);
        assert_eq!(m.lost().faults, 3 + 1 + 4);
        assert_eq!(m.lost().events, 0);
    }

    #[test]
    fn plan_outcome_becomes_attached_gauges() {
        let m = Telemetry::new("k");
        m.agent.record_plan(&[
            // No kprobes here: the one hook tried failed.
            Attach {
                signal: "accept_wait",
                tried: vec![("kretprobe:inet_csk_accept", false)],
                degraded: false,
            },
            // Attached, but without the field `reason`.
            Attach {
                signal: "resets_sent",
                tried: vec![("tracepoint:tcp:tcp_send_reset", true)],
                degraded: true,
            },
        ]);
        let text = m.encode_openmetrics().unwrap();
        assert!(text.contains("drainwatch_probe_attached{signal=\"accept_wait\",hook=\"kretprobe:inet_csk_accept\"} 0"), "{text}");
        assert!(text.contains("drainwatch_probe_attached{signal=\"resets_sent\",hook=\"tracepoint:tcp:tcp_send_reset\"} 1"), "{text}");
        assert!(
            text.contains("drainwatch_probe_degraded{signal=\"resets_sent\"} 1"),
            "{text}"
        );
        // Nothing attached: the signal is lost on this kernel, which is degraded too.
        assert!(
            text.contains("drainwatch_probe_degraded{signal=\"accept_wait\"} 1"),
            "{text}"
        );
    }
}
