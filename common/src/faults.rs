//! Failures inside the programs that leave an event incomplete: a kernel read that failed, a
//! path cut short. The programs count each in the per-CPU array `FAULTS`, one entry per
//! (event kind, fault kind) (`slot`); the lifecycle programs also log the first, second,
//! fourth, eighth… of each on a CPU through aya-log. The agent reads the counts
//! (`Capture::faults`).

use crate::EventKind;

/// What went wrong. `as_str` is the `fault` label value: a closed set.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// Copying the tracepoint's record (or reading one field of it) failed: its fields read as
    /// absent.
    RecordRead = 0,
    /// `bpf_probe_read_kernel` of a kernel struct member failed (socket, task, packet device,
    /// file table): the value reads as unknown (0 or -1).
    KernelRead = 1,
    /// The headers of the packet a socket-less RST answers could not be read: no addresses.
    PacketRead = 2,
    /// `cgroup_rmdir`'s path could not be read: the event has no path.
    PathRead = 3,
    /// `cgroup_rmdir`'s path was longer than the record holds (`PATH_LEN`): it is cut.
    PathTruncated = 4,
    /// A proxy thread's retry chain (`sock_length::Chain`) was taken over by another thread
    /// sharing its slot: a retry of that cut, if any, is counted as an abort.
    ChainLost = 5,
    /// An upstream socket's entry outlived the socket (the agent added it just after the
    /// socket was freed): dropped when a new socket took its address, whose I/O it would
    /// otherwise have read as the old socket's requests.
    StaleEntry = 6,
    /// The hold (`--hold`) could not take a connection's arrival (its map full, at
    /// `--hold-entries`): the arrival and the accept were sent as they came.
    HoldFull = 7,
    /// A proxy's connect (or a connect to a container) found `UPSTREAM_SOCKS` full (at
    /// `--upstream-entries`): that connection's requests are not followed, so a cut or retry
    /// on it is not judged.
    UpstreamFull = 8,
    /// A connection accepted in a storming namespace found `STORM_SOCKS` full: its answers
    /// are not timed, so the storm's served capacity leaves it out.
    StormFull = 9,
}

impl FaultKind {
    pub const ALL: [FaultKind; 10] = [
        FaultKind::RecordRead,
        FaultKind::KernelRead,
        FaultKind::PacketRead,
        FaultKind::PathRead,
        FaultKind::PathTruncated,
        FaultKind::ChainLost,
        FaultKind::StaleEntry,
        FaultKind::HoldFull,
        FaultKind::UpstreamFull,
        FaultKind::StormFull,
    ];

    pub const COUNT: u32 = Self::ALL.len() as u32;

    pub const fn as_str(self) -> &'static str {
        match self {
            FaultKind::RecordRead => "record_read",
            FaultKind::KernelRead => "kernel_read",
            FaultKind::PacketRead => "packet_read",
            FaultKind::PathRead => "path_read",
            FaultKind::PathTruncated => "path_truncated",
            FaultKind::ChainLost => "chain_lost",
            FaultKind::StaleEntry => "stale_entry",
            FaultKind::HoldFull => "hold_full",
            FaultKind::UpstreamFull => "upstream_full",
            FaultKind::StormFull => "storm_full",
        }
    }
}

impl FaultKind {
    /// Whether the fault loses part of what a stop or start record reads (an event's field, a
    /// cgroup's path, a retry's chain, a connection's requests): the records open meanwhile
    /// say so. A full hold sends what it could not keep, and a stale entry's drop is a
    /// correction: neither loses anything.
    pub const fn loses_input(self) -> bool {
        !matches!(self, FaultKind::HoldFull | FaultKind::StaleEntry)
    }
}

/// Entries of the `FAULTS` map.
pub const SLOTS: u32 = EventKind::COUNT * FaultKind::COUNT;

/// The `FAULTS` entry of a (kind, fault) pair.
#[inline(always)]
pub const fn slot(kind: EventKind, fault: FaultKind) -> u32 {
    kind.index() as u32 * FaultKind::COUNT + fault as u32
}

/// The pair a `FAULTS` entry counts; `None` past the end.
pub fn pair(slot: u32) -> Option<(EventKind, FaultKind)> {
    let kind = EventKind::ALL.get((slot / FaultKind::COUNT) as usize)?;
    let fault = FaultKind::ALL.get((slot % FaultKind::COUNT) as usize)?;
    Some((*kind, *fault))
}

// `ALL` in discriminant order: `slot` and `pair` rely on it.
const _: () = {
    let mut i = 0;
    while i < FaultKind::ALL.len() {
        assert!(FaultKind::ALL[i] as usize == i);
        i += 1;
    }
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_cover_every_pair_once() {
        let mut seen = [false; SLOTS as usize];
        for kind in EventKind::ALL {
            for fault in FaultKind::ALL {
                let s = slot(kind, fault);
                assert!(!seen[s as usize]);
                seen[s as usize] = true;
                assert_eq!(pair(s), Some((kind, fault)));
            }
        }
        assert!(seen.iter().all(|s| *s));
        assert_eq!(pair(SLOTS), None);
    }

    #[test]
    fn label_values_are_distinct() {
        for a in FaultKind::ALL {
            for b in FaultKind::ALL {
                assert_eq!(a == b, a.as_str() == b.as_str());
            }
        }
    }
}
