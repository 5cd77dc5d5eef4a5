//! Failures inside the programs (`drainwatch_common::faults`): their counts, read from the
//! per-CPU `FAULTS` map, and their log records, which aya-log carries from the kernel
//! (`AYA_LOGS`) and `forward` hands to `tracing`.

use std::borrow::Borrow;

use aya::maps::{MapData, PerCpuArray};
pub use drainwatch_common::faults::FaultKind;
use drainwatch_common::{EventKind, faults};
use tokio::io::unix::AsyncFd;
use tracing_log::log::{Log, Metadata, Record};

use super::CaptureError;

/// The fault counters, taken from the loaded object (`Capture::take_faults`).
pub struct Faults {
    map: PerCpuArray<MapData, u64>,
}

impl Faults {
    pub(super) fn take(ebpf: &mut aya::Ebpf) -> Result<Self, CaptureError> {
        let map = ebpf
            .take_map("FAULTS")
            .ok_or(CaptureError::NoMap("FAULTS"))?;
        Ok(Self {
            map: PerCpuArray::try_from(map)?,
        })
    }

    /// Every (kind, fault) pair with its count since the programs were loaded, summed over
    /// CPUs: `EventKind::ALL` × `FaultKind::ALL`, zeros included.
    pub fn read(&self) -> Vec<(EventKind, FaultKind, u64)> {
        read(&self.map)
    }
}

/// Every pair's count from a `FAULTS` map (owned or borrowed); an unreadable entry counts 0.
pub(super) fn read<T: Borrow<MapData>>(
    map: &PerCpuArray<T, u64>,
) -> Vec<(EventKind, FaultKind, u64)> {
    totals((0..faults::SLOTS).map(|slot| {
        let n = map
            .get(&slot, 0)
            .map(|per_cpu| per_cpu.iter().sum::<u64>())
            .unwrap_or(0);
        (slot, n)
    }))
}

/// (slot, count) pairs to (kind, fault, count), in slot order.
fn totals(slots: impl Iterator<Item = (u32, u64)>) -> Vec<(EventKind, FaultKind, u64)> {
    slots
        .filter_map(|(slot, n)| faults::pair(slot).map(|(k, f)| (k, f, n)))
        .collect()
}

/// Hands aya-log's records to `tracing` (`tracing_log::format_trace`: the event keeps the
/// record's level, target and the program's file and line, and tracing's filter applies).
/// Given to `EbpfLogger` directly rather than installed as the global `log` logger, so the
/// records arrive whether or not a subscriber bridges `log`.
pub(super) struct Forward;

impl Log for Forward {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &Record<'_>) {
        let _ = tracing_log::format_trace(record);
    }

    fn flush(&self) {}
}

/// Drains the programs' log records into `tracing`. Started by `Capture::load` before any
/// program loads (the programs reference the log map, which must stay open until they are):
/// on the current tokio runtime when there is one, else kept undrained (the kernel then
/// drops records once the ring is full; the counts are unaffected).
pub(super) enum LogDrain {
    Task(tokio::task::JoinHandle<()>),
    Undrained {
        _logger: aya_log::EbpfLogger<Forward>,
    },
    /// The object has no log map (no program logs).
    None,
}

impl LogDrain {
    pub(super) fn start(ebpf: &mut aya::Ebpf) -> Self {
        let logger = match aya_log::EbpfLogger::init_with_logger(ebpf, Forward) {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(error = %e, "no eBPF log records");
                return Self::None;
            }
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return Self::Undrained { _logger: logger };
        };
        // SAFETY: the logger owns its ring buffer's map fd and keeps it open, unchanged, for as
        // long as the AsyncFd holds it.
        match unsafe { AsyncFd::register(logger) } {
            Ok(mut fd) => Self::Task(rt.spawn(async move {
                while let Ok(mut guard) = fd.readable_mut().await {
                    guard.get_inner_mut().flush();
                    guard.clear_ready();
                }
            })),
            Err(e) => {
                let (logger, e) = e.into_parts();
                tracing::warn!(error = %e, "eBPF log records cannot be polled: not shown");
                Self::Undrained { _logger: logger }
            }
        }
    }
}

impl Drop for LogDrain {
    fn drop(&mut self) {
        if let Self::Task(task) = self {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_name_each_slot() {
        let t = totals([(0, 3), (1, 0), (faults::SLOTS - 1, 7), (faults::SLOTS, 9)].into_iter());
        assert_eq!(
            t,
            [
                (EventKind::TcpSendReset, FaultKind::RecordRead, 3),
                (EventKind::TcpSendReset, FaultKind::KernelRead, 0),
                (EventKind::SockLength, FaultKind::StaleEntry, 7),
            ]
        );
    }
}
