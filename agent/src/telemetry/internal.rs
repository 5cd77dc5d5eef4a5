//! The agent's internal events (Vector's instrumentation rule): each is a type whose `emit`
//! both counts and logs, so nothing is logged without being counted or counted without the
//! log saying why. Counting is never rate-limited; repeated log lines are, to one line per
//! event type (and stage or file) per [`RateLimit::WINDOW`], the next line carrying how many
//! were suppressed.

use std::{
    fmt::Display,
    sync::atomic::{AtomicU64, Ordering},
};

use super::{
    Telemetry,
    labels::{LossStage, ProcfsFile},
};
use crate::model::{Mono, SECOND, monotonic_now};

/// At most one log line per window; the rest are counted as suppressed.
#[derive(Debug, Default)]
pub struct RateLimit {
    /// When the next line may be logged (kernel monotonic time; 0: now).
    next: AtomicU64,
    suppressed: AtomicU64,
}

impl RateLimit {
    pub const WINDOW: Mono = 10 * SECOND;

    /// Whether a line may be logged at `now`: then how many were suppressed since the last.
    pub fn allow(&self, now: Mono) -> Option<u64> {
        let next = self.next.load(Ordering::Relaxed);
        if now >= next
            && self
                .next
                .compare_exchange(
                    next,
                    now.saturating_add(Self::WINDOW),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Ordering::Relaxed));
        }
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// One limiter per event type, per stage or file where those differ in cause.
#[derive(Debug, Default)]
pub struct Limits {
    lost: [RateLimit; LossStage::ALL.len()],
    procfs: [RateLimit; ProcfsFile::ALL.len()],
    watch_failed: RateLimit,
    ebpf_log: RateLimit,
}

/// Logs through `limit`: nothing when suppressed, `suppressed = n` when lines were.
macro_rules! log_limited {
    ($limit:expr, $level:ident, $($rest:tt)+) => {
        match $limit.allow(monotonic_now()) {
            None => {}
            Some(0) => tracing::$level!($($rest)+),
            Some(suppressed) => tracing::$level!(suppressed, $($rest)+),
        }
    };
}

/// Records the kernel shed (`shed`) or could not reserve (`ringbuf`), or the pipeline had no
/// room for (`queue`). Malformed records are [`DecodeFailed`].
pub struct EventsLost {
    pub stage: LossStage,
    pub n: u64,
}

impl EventsLost {
    pub fn emit(&self, t: &Telemetry) {
        t.agent.lost(self.stage, self.n);
        let why = match self.stage {
            LossStage::Shed => {
                "packet-path events past the kernel's per-CPU budget were shed (--packet-events-per-cpu)"
            }
            LossStage::Ringbuf => "the kernel found the ring buffer full (--ring-buffer-bytes)",
            LossStage::Queue => "the pipeline fell behind and its queue was full (--queue-events)",
            LossStage::Decode => "malformed records",
        };
        log_limited!(
            t.limits.lost[self.stage.index()],
            warn,
            stage = self.stage.as_str(),
            n = self.n,
            "events lost: {why}"
        );
    }
}

/// A ring-buffer record that did not decode: counted as `decode` loss.
pub struct DecodeFailed<E> {
    pub error: E,
}

impl<E: Display> DecodeFailed<E> {
    pub fn emit(&self, t: &Telemetry) {
        t.agent.lost(LossStage::Decode, 1);
        log_limited!(
            t.limits.lost[LossStage::Decode.index()],
            warn,
            error = %self.error,
            "dropping a malformed ring-buffer record"
        );
    }
}

/// A procfs file that could not be read or parsed.
pub struct ProcfsUnreadable<E> {
    pub file: ProcfsFile,
    pub error: E,
}

impl<E: Display> ProcfsUnreadable<E> {
    pub fn emit(&self, t: &Telemetry) {
        t.agent.procfs_error(self.file);
        log_limited!(
            t.limits.procfs[self.file.index()],
            debug,
            error = %self.error,
            "unreadable net/{}",
            self.file.as_str()
        );
    }
}

/// The watch maps were brought to the wanted set (or as far as they had room).
pub struct WatchUpdated {
    pub addresses: usize,
    pub ports: usize,
    pub refused: u64,
}

impl WatchUpdated {
    /// Not rate-limited: a debug line per change of the wanted set, which follows container
    /// and listener churn, not event volume.
    pub fn emit(&self, t: &Telemetry) {
        t.agent
            .watch_applied(self.addresses, self.ports, self.refused);
        tracing::debug!(
            addresses = self.addresses,
            ports = self.ports,
            "watch maps updated"
        );
    }
}

/// Upstream sockets of a proxy the agent found open were given to the kernel to follow; it
/// had no room for `refused` of them.
pub struct UpstreamsFollowed {
    pub refused: u64,
}

impl UpstreamsFollowed {
    pub fn emit(&self, t: &Telemetry) {
        if self.refused > 0 {
            t.agent.upstreams_refused(self.refused);
            log_limited!(
                t.limits.watch_failed,
                warn,
                refused = self.refused,
                "the upstream socket map is full (--upstream-entries): these proxy connections' requests are not followed"
            );
        }
    }
}

/// The storming namespaces were written to the kernel (`capture::storming`).
pub struct StormingSet {
    pub refused: u64,
}

impl StormingSet {
    pub fn emit(&self, t: &Telemetry) {
        if self.refused > 0 {
            t.agent.storm_netns_refused(self.refused);
            log_limited!(
                t.limits.watch_failed,
                warn,
                refused = self.refused,
                "the storming namespace map is full: these namespaces' connect-time work is not timed"
            );
        }
    }
}

/// Updating the watch maps failed part-way.
pub struct WatchUpdateFailed<E> {
    pub error: E,
}

impl<E: Display> WatchUpdateFailed<E> {
    pub fn emit(&self, t: &Telemetry) {
        t.agent.watch_update_failed();
        log_limited!(
            t.limits.watch_failed,
            warn,
            error = %self.error,
            "updating the watch maps failed"
        );
    }
}

/// The kernel's running count of one eBPF program failure (`drainwatch_common::faults`), as
/// the reader polled it. Counted always; logged (target `drainwatch::ebpf`) when the count
/// reaches a power of two it had not reached at the last poll: the 1st, 2nd, 4th, 8th…
/// failure, so one that fires on every packet costs a line per doubling, not per packet.
pub struct EbpfFaults {
    pub kind: drainwatch_common::EventKind,
    pub fault: drainwatch_common::faults::FaultKind,
    pub total: u64,
}

impl EbpfFaults {
    pub fn emit(&self, t: &Telemetry) {
        let before = t.agent.ebpf_faults(self.kind, self.fault, self.total);
        if new_power_of_two(before, self.total) {
            tracing::warn!(
                target: "drainwatch::ebpf",
                hook = self.kind.name(),
                fault = self.fault.as_str(),
                total = self.total,
                "eBPF program failure (logged at powers of two; every one is counted)"
            );
        }
    }
}

/// How many of the lifecycle programs' log records (`capture::ebpf_log`) the agent has logged
/// since load, as the reader drained them: counted, not logged again.
pub struct EbpfLogRecords {
    pub total: u64,
}

impl EbpfLogRecords {
    pub fn emit(&self, t: &Telemetry) {
        t.agent.ebpf_log_records(self.total);
    }
}

/// The eBPF programs' log failed: `setup` when it could not be set up at start (the agent
/// goes on without it), else a record that could not be decoded.
pub struct EbpfLogFailed<E> {
    pub setup: bool,
    pub error: E,
}

impl<E: Display> EbpfLogFailed<E> {
    pub fn emit(&self, t: &Telemetry) {
        t.agent.ebpf_log_failed();
        if self.setup {
            tracing::warn!(
                error = %self.error,
                "the eBPF programs' log cannot be set up: what the lifecycle programs cannot read is counted (drainwatch_ebpf_faults_total), not logged from the kernel"
            );
        } else {
            log_limited!(
                t.limits.ebpf_log,
                warn,
                error = %self.error,
                "an eBPF log record was not logged"
            );
        }
    }
}

/// Whether a count going from `before` to `now` reached a power of two on the way.
fn new_power_of_two(before: u64, now: u64) -> bool {
    now > before && (before == 0 || now.ilog2() > before.ilog2())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SECOND;

    #[test]
    fn faults_log_at_each_new_power_of_two() {
        let logged: Vec<(u64, u64)> = [
            (0, 0),
            (0, 1),
            (1, 2),
            (2, 3),
            (3, 4),
            (4, 7),
            (7, 9),
            (9, 15),
            (15, 100),
        ]
        .into_iter()
        .filter(|&(b, n)| new_power_of_two(b, n))
        .collect();
        assert_eq!(logged, [(0, 1), (1, 2), (3, 4), (7, 9), (15, 100)]);
        let t = Telemetry::new("k");
        for total in [1, 5, 5] {
            EbpfFaults {
                kind: drainwatch_common::EventKind::TcpSendReset,
                fault: drainwatch_common::faults::FaultKind::KernelRead,
                total,
            }
            .emit(&t);
        }
        let text = t.encode_prometheus().unwrap();
        assert!(
            text.contains(
                "drainwatch_ebpf_faults_total{kind=\"tcp_send_reset\",fault=\"kernel_read\"} 5\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn ebpf_log_records_follow_the_drained_total_and_failures_are_counted() {
        let t = Telemetry::new("k");
        for total in [0, 2, 2, 5] {
            EbpfLogRecords { total }.emit(&t);
        }
        EbpfLogFailed {
            setup: true,
            error: "no AYA_LOGS",
        }
        .emit(&t);
        let text = t.encode_prometheus().unwrap();
        assert!(
            text.contains("drainwatch_ebpf_log_records_total 5\n"),
            "{text}"
        );
        assert!(
            text.contains("drainwatch_ebpf_log_failures_total 1\n"),
            "{text}"
        );
    }

    #[test]
    fn one_line_per_window_then_the_suppressed_count() {
        let l = RateLimit::default();
        let t0 = 1_000 * SECOND;
        assert_eq!(l.allow(t0), Some(0));
        assert_eq!(l.allow(t0 + 1), None);
        assert_eq!(l.allow(t0 + 9 * SECOND), None);
        assert_eq!(l.allow(t0 + 10 * SECOND), Some(2));
        assert_eq!(l.allow(t0 + 10 * SECOND), None);
        assert_eq!(l.allow(t0 + 25 * SECOND), Some(1));
    }

    #[test]
    fn every_emit_counts_whether_or_not_it_logs() {
        let t = Telemetry::new("k");
        for _ in 0..5 {
            EventsLost {
                stage: LossStage::Queue,
                n: 2,
            }
            .emit(&t);
            DecodeFailed { error: "short" }.emit(&t);
            ProcfsUnreadable {
                file: ProcfsFile::Netstat,
                error: "no TcpExt",
            }
            .emit(&t);
            WatchUpdateFailed { error: "E2BIG" }.emit(&t);
        }
        assert_eq!(t.lost_count(LossStage::Queue), 10);
        assert_eq!(t.lost_count(LossStage::Decode), 5);
        assert_eq!(t.lost_count(LossStage::Ringbuf), 0);
        let text = t.encode_prometheus().unwrap();
        assert!(
            text.contains("drainwatch_procfs_errors_total{file=\"netstat\"} 5\n"),
            "{text}"
        );
        assert!(
            text.contains("drainwatch_watch_update_failures_total 5\n"),
            "{text}"
        );
        // Logged once each; the rest wait for the next window.
        assert_eq!(
            t.limits.lost[LossStage::Queue.index()]
                .suppressed
                .load(Ordering::Relaxed),
            4
        );
        WatchUpdated {
            addresses: 3,
            ports: 1,
            refused: 2,
        }
        .emit(&t);
        let text = t.encode_prometheus().unwrap();
        assert!(
            text.contains("drainwatch_watch_entries{map=\"addresses\"} 3\n"),
            "{text}"
        );
        UpstreamsFollowed { refused: 5 }.emit(&t);
        let text = t.encode_prometheus().unwrap();
        for line in [
            "drainwatch_watch_map_full_total{map=\"addresses\"} 2\n",
            "drainwatch_watch_map_full_total{map=\"upstream_sockets\"} 5\n",
        ] {
            assert!(text.contains(line), "{text}");
        }
    }
}
