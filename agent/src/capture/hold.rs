//! `--hold`'s maps (`agent-ebpf/src/hold.rs`): the namespaces whose arrivals the kernel must
//! send as they come (`HOT_NETNS`), and taking over the connections it holds (`HOLD`): their
//! arrival and accept become the events a record carrying them would have made.

use std::{
    collections::BTreeSet,
    os::fd::{AsFd, AsRawFd, FromRawFd},
};

use aya::maps::{HashMap, IterableMap, MapData, MapError};
use drainwatch_common::inet_sock_set_state::HoldEntry;

use super::{
    CaptureError,
    event::{self, Endpoints, Event, Meta, StateChange},
    hooks::inet_sock_set_state::Held,
};

pub struct Hold {
    entries: HashMap<MapData, u64, HoldEntry>,
    hot: HashMap<MapData, u32, u8>,
    current: BTreeSet<u32>,
}

impl Hold {
    pub(super) fn take(ebpf: &mut aya::Ebpf) -> Result<Self, CaptureError> {
        let entries = ebpf.take_map("HOLD").ok_or(CaptureError::NoMap("HOLD"))?;
        let hot = ebpf
            .take_map("HOT_NETNS")
            .ok_or(CaptureError::NoMap("HOT_NETNS"))?;
        Ok(Self {
            entries: HashMap::try_from(entries)?,
            hot: HashMap::try_from(hot)?,
            current: BTreeSet::new(),
        })
    }

    /// Makes `HOT_NETNS` say `want`; returns the namespaces that turned hot, whose held
    /// connections are then for `take_over`.
    pub fn set_hot(&mut self, want: &BTreeSet<u32>) -> Result<BTreeSet<u32>, MapError> {
        for gone in self.current.difference(want) {
            self.hot.remove(gone)?;
        }
        let new: BTreeSet<u32> = want.difference(&self.current).copied().collect();
        for ns in &new {
            self.hot.insert(ns, 1, 0)?;
        }
        self.current = want.clone();
        Ok(new)
    }

    /// Takes over the held connections `which` picks (by namespace and arrival time), onto
    /// `out` as the events their next record would have made, oldest first. Whichever of the
    /// kernel's next record and this removes an entry first has it, whole (`take_entry`).
    pub fn take_over(
        &mut self,
        which: impl Fn(u32, u64) -> bool,
        out: &mut Vec<Event>,
    ) -> Result<usize, MapError> {
        let picked: Vec<u64> = self
            .entries
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, e)| which(e.netns, e.held.arrived_ns))
            .map(|(sk, _)| sk)
            .collect();
        let start = out.len();
        for sk in picked {
            if let Some(e) = take_entry(&self.entries, sk)? {
                unfold(sk, &e, out);
            }
        }
        out[start..].sort_by_key(|e| e.meta().ts_ns);
        Ok(out.len() - start)
    }
}

/// What a record carrying `e` would have unfolded to (`event::unfold`), less the record.
fn unfold(sk: u64, e: &HoldEntry, out: &mut Vec<Event>) {
    let held = Held::of(&e.held);
    let carrier = StateChange {
        meta: Meta {
            ts_ns: held.map_or(0, |h| h.arrived_at),
            pid: 0,
            tgid: 0,
            comm: Default::default(),
            cgroup_id: 0,
            netns: e.netns,
        },
        skaddr: sk,
        conn: Endpoints::from_tuple(&e.tuple),
        old: None,
        new: None,
        counters: Default::default(),
        max_ack_backlog: None,
        held,
    };
    event::unfold(Event::StateChange(carrier), out);
}

/// `BPF_MAP_LOOKUP_AND_DELETE_ELEM` on a hash map (5.14+), which aya offers for queues and
/// stacks only, hand-written here: reading and removing in one step is what keeps an accept
/// the kernel notes in the entry meanwhile from being lost. `None`: the kernel took it first.
fn take_entry(
    map: &HashMap<MapData, u64, HoldEntry>,
    sk: u64,
) -> Result<Option<HoldEntry>, MapError> {
    let mut value = HoldEntry::default();
    let fd = map.map().fd().as_fd().as_raw_fd();
    match lookup_and_delete(fd, &sk, &mut value) {
        Ok(()) => Ok(Some(value)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(io_error) => Err(MapError::SyscallError(aya::sys::SyscallError {
            call: "bpf_map_lookup_and_delete_elem",
            io_error,
        })),
    }
}

/// The `bpf_attr` of the element commands.
#[repr(C)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

fn bpf<T>(cmd: libc::c_long, attr: &T) -> std::io::Result<libc::c_long> {
    // SAFETY: `attr` is the kernel's `bpf_attr` layout for `cmd`, and any pointers in it point
    // at memory of the sizes the map was made with, live for the call.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *const T, size_of::<T>()) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn lookup_and_delete<K, V>(fd: i32, key: &K, value: &mut V) -> std::io::Result<()> {
    const BPF_MAP_LOOKUP_AND_DELETE_ELEM: libc::c_long = 21;
    let attr = ElemAttr {
        map_fd: fd as u32,
        _pad: 0,
        key: key as *const K as u64,
        value: value as *mut V as u64,
        flags: 0,
    };
    bpf(BPF_MAP_LOOKUP_AND_DELETE_ELEM, &attr).map(drop)
}

/// Whether this kernel can read and remove a hash map's element in one step (5.14+), tried on
/// a map of its own: without it a held connection could not be handed over whole, so nothing
/// is held.
pub fn kernel_can_hand_over() -> bool {
    const BPF_MAP_CREATE: libc::c_long = 0;
    const BPF_MAP_TYPE_HASH: u32 = 1;
    #[repr(C)]
    struct CreateAttr {
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        map_flags: u32,
    }
    let create = CreateAttr {
        map_type: BPF_MAP_TYPE_HASH,
        key_size: 8,
        value_size: 8,
        max_entries: 1,
        map_flags: 0,
    };
    let Ok(fd) = bpf(BPF_MAP_CREATE, &create) else {
        return false;
    };
    // SAFETY: a descriptor the kernel just returned, owned here alone.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) };
    let mut value = 0u64;
    // Empty: ENOENT where the command exists for hash maps (EINVAL or ENOTSUPP before).
    lookup_and_delete(fd.as_raw_fd(), &0u64, &mut value)
        .is_err_and(|e| e.raw_os_error() == Some(libc::ENOENT))
}
