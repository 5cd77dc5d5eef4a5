//! The namespaces whose accepted connections the kernel follows through their opening
//! exchanges (`agent-ebpf/src/storm_answers.rs`): `STORM_NETNS`, and `STORMING[0]`, its size,
//! which spares every other socket's send and receive the lookup while it is 0.

use std::collections::BTreeSet;

use aya::maps::{Array, HashMap, MapData, MapError};

use super::CaptureError;

pub struct Storming {
    netns: HashMap<MapData, u32, u8>,
    count: Array<MapData, u32>,
    current: BTreeSet<u32>,
}

impl Storming {
    pub(super) fn take(ebpf: &mut aya::Ebpf) -> Result<Self, CaptureError> {
        let netns = ebpf
            .take_map("STORM_NETNS")
            .ok_or(CaptureError::NoMap("STORM_NETNS"))?;
        let count = ebpf
            .take_map("STORMING")
            .ok_or(CaptureError::NoMap("STORMING"))?;
        Ok(Self {
            netns: HashMap::try_from(netns)?,
            count: Array::try_from(count)?,
            current: BTreeSet::new(),
        })
    }

    /// Makes the maps say `want` (at most `STORM_NETNS` namespaces: the rest are left out,
    /// counted in the return); the count goes up after the entries, down before them.
    pub fn set(&mut self, want: &BTreeSet<u32>) -> Result<u64, MapError> {
        if *want == self.current {
            return Ok(0);
        }
        let cap = drainwatch_common::sock_length::STORM_NETNS as usize;
        let kept: BTreeSet<u32> = want.iter().copied().take(cap).collect();
        let left_out = (want.len() - kept.len()) as u64;
        if kept.len() < self.current.len() {
            self.count.set(0, kept.len() as u32, 0)?;
        }
        for gone in self.current.difference(&kept) {
            self.netns.remove(gone)?;
        }
        for new in kept.difference(&self.current) {
            self.netns.insert(new, 1, 0)?;
        }
        self.count.set(0, kept.len() as u32, 0)?;
        self.current = kept;
        Ok(left_out)
    }
}
