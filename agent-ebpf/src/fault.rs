//! Failures that leave an event incomplete (a kernel read that failed, a path cut short): each
//! is counted in `FAULTS`, per (event kind, fault kind) and per CPU. The agent polls the counts,
//! exports them and logs each pair at its 1st, 2nd, 4th, 8th… failure
//! (`telemetry::internal::EbpfFaults`).
//!
//! No logging here: the programs logged through aya-log once, from a subprogram every failure
//! branch called, and the verifiers of 5.10 and 6.1 gave up on the classic tracepoint programs
//! (a million instructions processed: the log record's serialization verified again for each
//! of a program's dozen failure branches). Only failure branches call `fault`; the success
//! paths are unchanged.

use aya_ebpf::{macros::map, maps::PerCpuArray};
use drainwatch_common::{
    EventKind,
    faults::{self, FaultKind},
};

#[map]
static FAULTS: PerCpuArray<u64> = PerCpuArray::with_max_entries(faults::SLOTS, 0);

/// Counts one failure.
#[inline(always)]
pub fn fault(kind: EventKind, fault: FaultKind) {
    if let Some(n) = FAULTS.get_ptr_mut(faults::slot(kind, fault)) {
        unsafe { *n += 1 };
    }
}
