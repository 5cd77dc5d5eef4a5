//! The ring-buffer reader: drains records, decodes them and hands them on through a bounded
//! queue. Every record that does not make it is counted by stage: `ringbuf` (the kernel could
//! not reserve space; per-CPU counters in the `LOST` map), `decode` (a malformed record),
//! `queue` (the consumer fell behind).

use aya::maps::{MapData, PerCpuArray, RingBuf};
use drainwatch_common::EventKind;
use tokio::{io::unix::AsyncFd, sync::watch};

use super::{
    CaptureError,
    event::{self, Event, KernelNames},
};
use crate::telemetry::{
    LossStage, Telemetry,
    internal::{DecodeFailed, EventsLost},
};

pub struct Maps {
    pub ring: RingBuf<MapData>,
    pub lost: PerCpuArray<MapData, u64>,
    /// Events dropped in the kernel as out of scope, per kind (not a loss: counted apart).
    pub filtered: PerCpuArray<MapData, u64>,
}

impl Maps {
    pub(super) fn take(ebpf: &mut aya::Ebpf) -> Result<Self, CaptureError> {
        let ring = ebpf
            .take_map("EVENTS")
            .ok_or(CaptureError::NoMap("EVENTS"))?;
        let lost = ebpf.take_map("LOST").ok_or(CaptureError::NoMap("LOST"))?;
        let filtered = ebpf
            .take_map("FILTERED")
            .ok_or(CaptureError::NoMap("FILTERED"))?;
        Ok(Self {
            ring: RingBuf::try_from(ring)?,
            lost: PerCpuArray::try_from(lost)?,
            filtered: PerCpuArray::try_from(filtered)?,
        })
    }

    /// Records the kernel could not reserve, summed over kinds and CPUs.
    pub fn lost_total(&self) -> u64 {
        self.lost
            .iter()
            .filter_map(Result::ok)
            .map(|per_cpu| per_cpu.iter().sum::<u64>())
            .sum()
    }
}

/// How long a record may wait in the ring buffer when the host is quiet.
pub const DRAIN_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

pub struct Reader {
    ring: AsyncFd<RingBuf<MapData>>,
    lost: PerCpuArray<MapData, u64>,
    lost_seen: u64,
    filtered: PerCpuArray<MapData, u64>,
    filtered_seen: [u64; EventKind::COUNT as usize],
    names: KernelNames,
    telemetry: std::sync::Arc<Telemetry>,
    tx: crate::queue::Sender<Event>,
    /// The programs' fault counters (`Capture::take_faults`), polled with the loss counters.
    faults: Option<super::faults::Faults>,
}

impl Reader {
    pub fn new(
        maps: Maps,
        names: KernelNames,
        telemetry: std::sync::Arc<Telemetry>,
        tx: crate::queue::Sender<Event>,
    ) -> Result<Self, CaptureError> {
        Ok(Self {
            // SAFETY: the RingBuf owns its map fd and keeps it open, unchanged, for as long as
            // the AsyncFd holds it.
            ring: unsafe { AsyncFd::register(maps.ring) }.map_err(std::io::Error::from)?,
            lost: maps.lost,
            lost_seen: 0,
            filtered: maps.filtered,
            filtered_seen: [0; EventKind::COUNT as usize],
            names,
            telemetry,
            tx,
            faults: None,
        })
    }

    /// Also brings the eBPF programs' fault counters to telemetry, with the loss counters.
    pub fn with_faults(mut self, faults: super::faults::Faults) -> Self {
        self.faults = Some(faults);
        self
    }

    /// Reads every record available now; returns how many were read.
    pub fn drain(&mut self) -> usize {
        let mut n = 0;
        let ring = self.ring.get_mut();
        while let Some(item) = ring.next() {
            n += 1;
            match event::decode(&item, &self.names) {
                Ok(ev) => {
                    self.telemetry.agent.event_received(ev.kind());
                    if self.tx.try_send(ev).is_err() {
                        EventsLost {
                            stage: LossStage::Queue,
                            n: 1,
                        }
                        .emit(&self.telemetry);
                    }
                }
                Err(error) => DecodeFailed { error }.emit(&self.telemetry),
            }
        }
        n
    }

    /// Brings the `ringbuf` loss counter and the filtered counters up to the kernel's
    /// per-CPU totals.
    pub fn poll_lost(&mut self) {
        for kind in EventKind::ALL {
            let i = kind.index();
            let Ok(per_cpu) = self.filtered.get(&(i as u32), 0) else {
                continue;
            };
            let total: u64 = per_cpu.iter().sum();
            if total > self.filtered_seen[i] {
                self.telemetry
                    .agent
                    .filtered(kind, total - self.filtered_seen[i]);
                self.filtered_seen[i] = total;
            }
        }
        let total: u64 = self
            .lost
            .iter()
            .filter_map(Result::ok)
            .map(|per_cpu| per_cpu.iter().sum::<u64>())
            .sum();
        for (kind, fault, n) in self.faults.iter().flat_map(|f| f.read()) {
            self.telemetry.agent.ebpf_faults(kind, fault, n);
        }
        if total > self.lost_seen {
            EventsLost {
                stage: LossStage::Ringbuf,
                n: total - self.lost_seen,
            }
            .emit(&self.telemetry);
            self.lost_seen = total;
        }
    }

    /// Runs until `shutdown` turns true, then drains what is left.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        // The programs wake the reader only when the buffer fills up (see `submit` in the
        // eBPF crate): below that, records wait at most this long, in batches.
        let mut drain = tokio::time::interval(DRAIN_INTERVAL);
        drain.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.telemetry.heartbeats.reader.beat();
            tokio::select! {
                guard = self.ring.readable_mut() => {
                    match guard {
                        Ok(mut g) => {
                            g.clear_ready();
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "ring buffer poll failed; capture stops");
                            break;
                        }
                    }
                    self.drain();
                }
                _ = drain.tick() => {
                    self.drain();
                }
                _ = tick.tick() => self.poll_lost(),
                _ = shutdown.changed() => break,
            }
        }
        self.drain();
        self.poll_lost();
    }
}
