//! Failures that leave an event incomplete (a kernel read that failed, a path cut short): each
//! is counted in `FAULTS`, per (event kind, fault kind) and per CPU, for the agent to export,
//! and logged through aya-log on its 1st, 2nd, 4th, 8th… occurrence on a CPU. A failure that
//! fires on every packet thus costs a counter increment, not a log record: the kernel has no
//! cheap wall clock to rate-limit by time, and the powers of two need nothing but the count.
//!
//! Only failure branches call `fault`; the success paths are unchanged.

use aya_ebpf::{macros::map, maps::PerCpuArray};
use drainwatch_common::{
    EventKind,
    faults::{self, FaultKind},
};

#[map]
static FAULTS: PerCpuArray<u64> = PerCpuArray::with_max_entries(faults::SLOTS, 0);

/// Counts (and maybe logs) one failure. Inlined where it is called so that the names are
/// constants there; the counting and logging are one out-of-line function all share.
#[inline(always)]
pub fn fault(kind: EventKind, fault: FaultKind) {
    record(faults::slot(kind, fault), kind.name(), fault.as_str());
}

/// A BPF subprogram (not inlined): the log record's serialization exists once per program,
/// not once per failure branch.
#[inline(never)]
fn record(slot: u32, hook: &'static str, fault: &'static str) {
    let Some(n) = FAULTS.get_ptr_mut(slot) else {
        return;
    };
    let n = unsafe {
        *n += 1;
        *n
    };
    if n.is_power_of_two() {
        aya_log_ebpf::warn!(
            &(),
            target: "drainwatch::ebpf",
            "{} {}: failure {} on this CPU (logged at powers of two; every one is counted)",
            hook,
            fault,
            n
        );
    }
}
