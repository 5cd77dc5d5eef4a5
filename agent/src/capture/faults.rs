//! Failures inside the programs (`drainwatch_common::faults`): their counts, read from the
//! per-CPU `FAULTS` map. The reader polls them; `telemetry::internal::EbpfFaults` counts and
//! logs them.

use std::borrow::Borrow;

use aya::maps::{MapData, PerCpuArray};
pub use drainwatch_common::faults::FaultKind;
use drainwatch_common::{EventKind, faults};

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
                (EventKind::SockLength, FaultKind::StormFull, 7),
            ]
        );
    }
}
