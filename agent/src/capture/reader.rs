//! The ring-buffer reader: drains both rings (lifecycle and packet path, see `merge`), decodes
//! the records and hands them on in time order through a bounded queue. Every record that does
//! not make it is counted by stage: `shed` (past its CPU's budget in the kernel; per-CPU
//! counters in `SHED`), `ringbuf` (the kernel could not reserve space; `LOST`), `decode` (a
//! malformed record), `queue` (the consumer fell behind).

use aya::maps::{MapData, PerCpuArray, RingBuf};
use drainwatch_common::EventKind;
use tokio::{io::unix::AsyncFd, sync::watch};

use super::{
    CaptureError,
    event::{self, Event, KernelNames},
    merge::Merge,
};
use crate::telemetry::{
    LossStage, Telemetry,
    internal::{DecodeFailed, EbpfFaults, EbpfLogFailed, EbpfLogRecords, EventsLost},
};

pub struct Maps {
    pub ring: RingBuf<MapData>,
    pub lifecycle: RingBuf<MapData>,
    pub lost: PerCpuArray<MapData, u64>,
    /// Packet-path records shed by the kernel's per-CPU budget, per kind.
    pub shed: PerCpuArray<MapData, u64>,
    /// Events dropped in the kernel as out of scope or of no use to the agent, per kind (not a
    /// loss: counted apart).
    pub filtered: PerCpuArray<MapData, u64>,
}

impl Maps {
    pub(super) fn take(ebpf: &mut aya::Ebpf) -> Result<Self, CaptureError> {
        let mut take = |name: &'static str| ebpf.take_map(name).ok_or(CaptureError::NoMap(name));
        Ok(Self {
            ring: RingBuf::try_from(take("EVENTS")?)?,
            lifecycle: RingBuf::try_from(take("LIFECYCLE")?)?,
            lost: PerCpuArray::try_from(take("LOST")?)?,
            shed: PerCpuArray::try_from(take("SHED")?)?,
            filtered: PerCpuArray::try_from(take("FILTERED")?)?,
        })
    }

    /// Records the kernel could not reserve or shed, summed over kinds and CPUs.
    pub fn lost_total(&self) -> u64 {
        sum(&self.lost) + sum(&self.shed)
    }
}

fn sum(counters: &PerCpuArray<MapData, u64>) -> u64 {
    counters
        .iter()
        .filter_map(Result::ok)
        .map(|per_cpu| per_cpu.iter().sum::<u64>())
        .sum()
}

/// A per-kind counter array's totals over CPUs (zeros for entries that cannot be read).
fn per_kind(counters: &PerCpuArray<MapData, u64>) -> [u64; EventKind::COUNT as usize] {
    let mut out = [0; EventKind::COUNT as usize];
    for (i, n) in out.iter_mut().enumerate() {
        if let Ok(per_cpu) = counters.get(&(i as u32), 0) {
            *n = per_cpu.iter().sum();
        }
    }
    out
}

/// How long a record may wait in the ring buffer when the host is quiet.
pub const DRAIN_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

pub struct Reader {
    ring: AsyncFd<RingBuf<MapData>>,
    lifecycle: AsyncFd<RingBuf<MapData>>,
    merge: Merge<Event>,
    lost: PerCpuArray<MapData, u64>,
    lost_seen: u64,
    shed: PerCpuArray<MapData, u64>,
    shed_seen: [u64; EventKind::COUNT as usize],
    filtered: PerCpuArray<MapData, u64>,
    filtered_seen: [u64; EventKind::COUNT as usize],
    names: KernelNames,
    telemetry: std::sync::Arc<Telemetry>,
    tx: crate::queue::Sender<Event>,
    /// The programs' fault counters (`Capture::take_faults`), polled with the loss counters.
    faults: Option<super::faults::Faults>,
    /// The lifecycle programs' log (`Capture::take_log`), drained with the loss counters.
    log: Option<super::ebpf_log::EbpfLog>,
    /// Kinds dropped on purpose, as if the kernel had had no room (`--test-drop-events`).
    drop: Vec<EventKind>,
    /// Each ring's records of a drain, kept between drains (empty between them).
    lifecycle_read: Vec<Event>,
    packet_read: Vec<Event>,
}

impl Reader {
    pub fn new(
        maps: Maps,
        names: KernelNames,
        telemetry: std::sync::Arc<Telemetry>,
        tx: crate::queue::Sender<Event>,
    ) -> Result<Self, CaptureError> {
        Ok(Self {
            // SAFETY: each RingBuf owns its map fd and keeps it open, unchanged, for as long as
            // the AsyncFd holds it.
            ring: unsafe { AsyncFd::register(maps.ring) }.map_err(std::io::Error::from)?,
            lifecycle: unsafe { AsyncFd::register(maps.lifecycle) }
                .map_err(std::io::Error::from)?,
            merge: Merge::default(),
            lost: maps.lost,
            lost_seen: 0,
            shed: maps.shed,
            shed_seen: [0; EventKind::COUNT as usize],
            filtered: maps.filtered,
            filtered_seen: [0; EventKind::COUNT as usize],
            names,
            telemetry,
            tx,
            faults: None,
            log: None,
            drop: Vec::new(),
            lifecycle_read: Vec::new(),
            packet_read: Vec::new(),
        })
    }

    /// Also brings the eBPF programs' fault counters to telemetry, with the loss counters.
    pub fn with_faults(mut self, faults: super::faults::Faults) -> Self {
        self.faults = Some(faults);
        self
    }

    /// Also hands the lifecycle programs' log records to tracing, with the loss counters; a
    /// log that could not be set up is warned about and counted, and the reader goes on.
    pub fn with_log(mut self, log: Result<super::ebpf_log::EbpfLog, String>) -> Self {
        match log {
            Ok(log) => self.log = Some(log),
            Err(error) => EbpfLogFailed { setup: true, error }.emit(&self.telemetry),
        }
        self
    }

    /// Drops every record of `kinds`, counted as lost in the ring buffer: for tests of what a
    /// lost event does to a record.
    pub fn dropping(mut self, kinds: Vec<EventKind>) -> Self {
        self.drop = kinds;
        self
    }

    /// Reads every record available now and sends on, in time order, those stamped before
    /// the drain began (see `merge`); returns how many were read.
    pub fn drain(&mut self) -> usize {
        let watermark = crate::model::monotonic_now();
        let (lifecycle, packet) = (&mut self.lifecycle_read, &mut self.packet_read);
        read(
            self.lifecycle.get_mut(),
            &self.names,
            &self.telemetry,
            lifecycle,
        );
        read(self.ring.get_mut(), &self.names, &self.telemetry, packet);
        if !self.drop.is_empty() {
            let before = lifecycle.len() + packet.len();
            lifecycle.retain(|e| !self.drop.contains(&e.kind()));
            packet.retain(|e| !self.drop.contains(&e.kind()));
            let n = (before - lifecycle.len() - packet.len()) as u64;
            if n > 0 {
                EventsLost {
                    stage: LossStage::Ringbuf,
                    n,
                }
                .emit(&self.telemetry);
            }
        }
        let n = lifecycle.len() + packet.len();
        let mut out = Vec::with_capacity(n + self.merge.held());
        self.merge.drain(watermark, lifecycle, packet, &mut out);
        self.send(out);
        n
    }

    fn send(&self, events: Vec<Event>) {
        let refused = self.tx.try_send_all(events);
        if refused > 0 {
            EventsLost {
                stage: LossStage::Queue,
                n: refused as u64,
            }
            .emit(&self.telemetry);
        }
    }

    /// Brings the `ringbuf` and `shed` loss counters and the filtered counters up to the
    /// kernel's per-CPU totals; logs the programs' log records.
    pub fn poll_lost(&mut self) {
        let filtered = per_kind(&self.filtered);
        let shed = per_kind(&self.shed);
        for kind in EventKind::ALL {
            let i = kind.index();
            if filtered[i] > self.filtered_seen[i] {
                self.telemetry
                    .agent
                    .filtered(kind, filtered[i] - self.filtered_seen[i]);
                self.filtered_seen[i] = filtered[i];
            }
            if shed[i] > self.shed_seen[i] {
                let n = shed[i] - self.shed_seen[i];
                self.telemetry.agent.shed(kind, n);
                EventsLost {
                    stage: LossStage::Shed,
                    n,
                }
                .emit(&self.telemetry);
                self.shed_seen[i] = shed[i];
            }
        }
        let total = sum(&self.lost);
        for (kind, fault, total) in self.faults.iter().flat_map(|f| f.read()) {
            EbpfFaults { kind, fault, total }.emit(&self.telemetry);
        }
        match self.log.as_mut().map(super::ebpf_log::EbpfLog::drain) {
            Some(Ok(total)) => EbpfLogRecords { total }.emit(&self.telemetry),
            Some(Err(error)) => EbpfLogFailed {
                setup: false,
                error,
            }
            .emit(&self.telemetry),
            None => {}
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
                    if !ready(guard) {
                        break;
                    }
                    self.drain();
                }
                guard = self.lifecycle.readable_mut() => {
                    if !ready(guard) {
                        break;
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
        let mut rest = Vec::new();
        self.merge.flush(&mut rest);
        self.send(rest);
        self.poll_lost();
    }
}

/// Clears a ring's readiness; false when polling it failed (capture stops).
fn ready(
    guard: std::io::Result<tokio::io::unix::AsyncFdReadyMutGuard<'_, RingBuf<MapData>>>,
) -> bool {
    match guard {
        Ok(mut g) => {
            g.clear_ready();
            true
        }
        Err(e) => {
            tracing::error!(error = %e, "ring buffer poll failed; capture stops");
            false
        }
    }
}

/// Every record `ring` holds now, decoded onto `out` (counted as received, or as a decode
/// failure).
fn read(
    ring: &mut RingBuf<MapData>,
    names: &KernelNames,
    telemetry: &Telemetry,
    out: &mut Vec<Event>,
) {
    while let Some(item) = ring.next() {
        match event::decode(&item, names) {
            Ok(ev) => {
                telemetry.agent.event_received(ev.kind());
                event::unfold(ev, out);
            }
            Err(error) => DecodeFailed { error }.emit(telemetry),
        }
    }
}
