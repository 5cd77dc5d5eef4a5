//! The lifecycle programs' log records (`agent-ebpf/src/fault.rs`: what a signal, exit or
//! cgroup-removal program could not read), which aya-log carries from the kernel in the
//! `AYA_LOGS` ring and this module hands to `tracing` (target `drainwatch::ebpf`). The reader
//! drains them when it polls the loss counters (`Reader::with_log`).
//!
//! The log is an addition: the fault counters count every failure whether the log works or
//! not. Without it (its map cannot be taken, a record cannot be decoded) the agent warns,
//! counts (`drainwatch_ebpf_log_failures_total`) and goes on.

use std::{
    panic::{AssertUnwindSafe, catch_unwind},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use tracing_log::log::{Log, Metadata, Record};

/// Bytes of the `AYA_LOGS` ring (aya-log's default is 128 KiB): records come at powers of
/// two of a fault's count per CPU, a few hundred bytes each; when it is full the kernel drops
/// the record, and the fault is still counted.
pub const LOG_RING_BYTES: u32 = 32 * 1024;

/// Hands aya-log's records to `tracing` (`tracing_log::format_trace`: the event keeps the
/// record's level, target and the program's file and line, and tracing's filter applies),
/// counting them. Given to `EbpfLogger` directly rather than installed as the global `log`
/// logger, so the records arrive whether or not a subscriber bridges `log`.
struct Forward {
    records: Arc<AtomicU64>,
}

impl Log for Forward {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &Record<'_>) {
        self.records.fetch_add(1, Ordering::Relaxed);
        let _ = tracing_log::format_trace(record);
    }

    fn flush(&self) {}
}

/// The programs' log ring, taken from the loaded object before any program loads (they
/// reference the map: its fd must stay open until they are loaded; `Capture::load`).
pub struct EbpfLog {
    logger: aya_log::EbpfLogger<Forward>,
    records: Arc<AtomicU64>,
}

/// A record aya-log could not decode (it panics on one): it and the rest of that drain are
/// not logged; the next drain goes on after it.
#[derive(Debug, thiserror::Error)]
#[error("an eBPF log record could not be decoded: {0}")]
pub struct Undecodable(String);

impl EbpfLog {
    pub(super) fn take(ebpf: &mut aya::Ebpf) -> Result<Self, aya_log::Error> {
        let records = Arc::new(AtomicU64::new(0));
        let logger = aya_log::EbpfLogger::init_with_logger(
            ebpf,
            Forward {
                records: records.clone(),
            },
        )?;
        Ok(Self { logger, records })
    }

    /// Logs every record waiting in the ring; returns how many were logged since load.
    pub fn drain(&mut self) -> Result<u64, Undecodable> {
        let logger = &mut self.logger;
        catch_unwind(AssertUnwindSafe(|| logger.flush())).map_err(|p| {
            Undecodable(
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default(),
            )
        })?;
        Ok(self.records.load(Ordering::Relaxed))
    }
}
