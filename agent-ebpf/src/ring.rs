//! The two ring buffers the programs write their records to, the per-CPU budget of
//! packet-path records, and reserving and committing a record (when to wake the reader).

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::map,
    maps::{PerCpuArray, RingBuf, ring_buf::RingBufEntry},
};
use drainwatch_common::{EventKind, config::BUDGET_WINDOW_NS};

use crate::util::{CONFIG, cfg, count};

/// Packet-path records. Overridden by the agent before load (`--ring-buffer-bytes`).
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Lifecycle records (`EventKind::lifecycle`): a ring of their own, which no flood of
/// packet-path records can fill.
#[map]
pub static LIFECYCLE: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Packet-path records shed by the per-CPU budget (`Config::packet_events_per_sec`), per
/// kind, per CPU.
#[map]
pub static SHED: PerCpuArray<u64> = PerCpuArray::with_max_entries(EventKind::COUNT, 0);

/// Reserve failures (ring buffer full), per event kind, per CPU.
#[map]
pub static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(EventKind::COUNT, 0);

/// What a CPU has spent of a kind's budget in the current window.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Budget {
    window: u64,
    used: u64,
}

#[map]
static BUDGET: PerCpuArray<Budget> = PerCpuArray::with_max_entries(EventKind::COUNT, 0);

/// Whether this CPU has spent `kind`'s budget for the current window: the record is then
/// shed, and counted. A fixed window per CPU: two helper calls, no lock (programs
/// on one CPU do not preempt each other's map update here but for an interrupt, which at worst
/// lets one record more through).
#[inline(always)]
fn over_budget(kind: EventKind) -> bool {
    let limit = u64::from(cfg(&CONFIG.packet_events_per_window));
    if limit == 0 {
        return false;
    }
    let Some(b) = BUDGET.get_ptr_mut(kind.index() as u32) else {
        return false;
    };
    let window = unsafe { bpf_ktime_get_ns() } >> BUDGET_WINDOW_NS.trailing_zeros();
    let b = unsafe { &mut *b };
    if b.window != window {
        b.window = window;
        b.used = 0;
    }
    if b.used < limit {
        b.used += 1;
        return false;
    }
    count(&SHED, kind);
    true
}

/// Reserves a record on its kind's ring, counting the failure when the ring is full; a
/// packet-path record past its CPU's budget is shed (and counted) first.
#[inline(always)]
pub fn reserve<T: 'static>(kind: EventKind) -> Option<RingBufEntry<T>> {
    let entry = if kind.lifecycle() {
        LIFECYCLE.reserve::<T>(0)
    } else if over_budget(kind) {
        return None;
    } else {
        EVENTS.reserve::<T>(0)
    };
    if entry.is_none() {
        count(&LOST, kind);
    }
    entry
}

/// Commits a lifecycle record, waking the reader if it is waiting: they are few, and a stop's
/// SIGTERM is worth reading at once.
#[inline(always)]
pub fn submit_lifecycle<T>(entry: RingBufEntry<T>) {
    entry.submit(0);
}

/// Commits a lifecycle record without waking the reader, unless the buffer is an eighth full:
/// for process exits, which every process on the node makes. A wakeup is a self-interrupt,
/// which in a VM (Firecracker here) made the exit hook 17 µs a run; the record waits for the
/// reader's next drain instead (`DRAIN_INTERVAL`, 100 ms).
#[inline(always)]
pub fn submit_lifecycle_quiet<T>(entry: RingBufEntry<T>) {
    entry.submit(wakeup(&LIFECYCLE, true));
}

/// The commit flag: wake the reader when `look`ing finds `ring` an eighth full, else not.
#[inline(always)]
fn wakeup(ring: &RingBuf, look: bool) -> u64 {
    if look && ring.query(BPF_RB_AVAIL_DATA) >= ring.query(BPF_RB_RING_SIZE) / 8 {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}

const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;
const BPF_RB_RING_SIZE: u64 = 1;

/// Submits per CPU since the fill level was last looked at.
#[map]
static SUBMITS: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

/// Commits a record without waking the reader, unless the buffer is an eighth full: the agent
/// drains on a short timer, so a busy host costs one wakeup per batch, not one per event. The
/// fill level (two helper calls) is looked at on every 16th record of a CPU only.
#[inline(always)]
pub fn submit<T>(entry: RingBufEntry<T>) {
    let look = SUBMITS.get_ptr_mut(0).is_none_or(|n| unsafe {
        *n = (*n).wrapping_add(1);
        *n % 16 == 0
    });
    entry.submit(wakeup(&EVENTS, look));
}
