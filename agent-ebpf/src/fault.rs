//! Failures that leave an event incomplete (a kernel read that failed, a path cut short): each
//! is counted in `FAULTS`, per (event kind, fault kind) and per CPU. The agent polls the counts,
//! exports them and logs each pair at its 1st, 2nd, 4th, 8th… failure
//! (`telemetry::internal::EbpfFaults`).
//!
//! The lifecycle programs (`EventKind::lifecycle`: signals, exits, cgroup removals) also log
//! what they could not read through aya-log (target `drainwatch::ebpf`, the agent's
//! `capture::ebpf_log` hands the records to tracing): which read, at which offset, for which
//! task, at the 1st, 2nd, 4th, 8th… failure of the pair on a CPU (the kernel has no cheap
//! wall clock to rate-limit by time; powers of two need nothing but the count).
//!
//! The packet-path programs do not log: they did once, from a subprogram every failure
//! branch called, and the verifiers of 5.10 and 6.1 gave up on the classic tracepoint programs
//! (a million instructions processed: the log record's serialization verified again for each
//! of a program's dozen failure branches). `kind` is a constant wherever `fault` is inlined,
//! so their branches compile to the counter's increment alone, as before. Only failure
//! branches call `fault`; the success paths are unchanged.

use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::map, maps::PerCpuArray};
use drainwatch_common::{
    EventKind,
    faults::{self, FaultKind},
};

#[map]
static FAULTS: PerCpuArray<u64> = PerCpuArray::with_max_entries(faults::SLOTS, 0);

/// Counts one failure, where what failed has no offset (a whole record, a path).
#[inline(always)]
pub fn fault(kind: EventKind, fault: FaultKind) {
    fault_at(kind, fault, 0);
}

/// Counts one failure of a read at `offset` (in the tracepoint's record, or in the kernel
/// struct read), and logs it from a lifecycle program.
#[inline(always)]
pub fn fault_at(kind: EventKind, fault: FaultKind, offset: u32) {
    let slot = faults::slot(kind, fault);
    if kind.lifecycle() {
        counted_and_logged(
            (u64::from(offset) << 32) | u64::from(slot),
            kind.name(),
            fault.as_str(),
        );
    } else if let Some(n) = FAULTS.get_ptr_mut(slot) {
        unsafe { *n += 1 };
    }
}

/// A BPF subprogram (not inlined): the log record's serialization exists once per program.
/// Five registers at most: the offset and the slot share one.
#[inline(never)]
fn counted_and_logged(offset_slot: u64, hook: &'static str, fault: &'static str) {
    let Some(n) = FAULTS.get_ptr_mut(offset_slot as u32) else {
        return;
    };
    let n = unsafe {
        *n += 1;
        *n
    };
    if n.is_power_of_two() {
        let pid_tgid = bpf_get_current_pid_tgid();
        aya_log_ebpf::warn!(
            &(),
            target: "drainwatch::ebpf",
            "{} {}: the read at offset {} (pid {}, thread {}); failure {} of the kind on this CPU (logged at powers of two, every one counted in drainwatch_ebpf_faults_total)",
            hook,
            fault,
            (offset_slot >> 32) as u32,
            (pid_tgid >> 32) as u32,
            pid_tgid as u32,
            n
        );
    }
}
