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
    /// The last take-over's reading of `HOLD`, kept between take-overs.
    keys: Vec<u64>,
    values: Vec<HoldEntry>,
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
            keys: Vec::new(),
            values: Vec::new(),
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
    ) -> Result<Sweep, MapError> {
        let fd = self.entries.map().fd().as_fd().as_raw_fd();
        read_all(fd, &mut self.keys, &mut self.values).map_err(|io_error| {
            MapError::SyscallError(aya::sys::SyscallError {
                call: "bpf_map_lookup_batch",
                io_error,
            })
        })?;
        let (start, mut taken) = (out.len(), 0);
        for (sk, e) in self.keys.iter().zip(&self.values) {
            if which(e.netns, e.held.arrived_ns)
                && let Some(e) = take_entry(fd, *sk)?
            {
                unfold(*sk, &e, out);
                taken += 1;
            }
        }
        out[start..].sort_by_key(|e| e.meta().ts_ns);
        Ok(Sweep {
            held: self.keys.len(),
            taken,
        })
    }
}

/// What one take-over found: the connections the kernel held, and those taken over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sweep {
    pub held: usize,
    pub taken: usize,
}

/// Entries read per `BPF_MAP_LOOKUP_BATCH` call.
const CHUNK: usize = 4096;

/// Every entry of the hash map `fd` now, into `keys` and `values` (replacing what they held),
/// read with `BPF_MAP_LOOKUP_BATCH` (5.6+; aya has no batch calls, so hand-written): a call
/// per 4,096 entries where iterating made two per entry, and a walk by bucket, which the
/// kernel's removals meanwhile cannot send back to the start as they do `get_next_key` when
/// the previous key went.
fn read_all(fd: i32, keys: &mut Vec<u64>, values: &mut Vec<HoldEntry>) -> std::io::Result<()> {
    const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
    keys.clear();
    values.clear();
    let (mut cursor, mut next) = (0u32, 0u32);
    let mut chunk = CHUNK;
    let mut first = true;
    loop {
        let at = keys.len();
        keys.resize(at + chunk, 0);
        values.resize(at + chunk, HoldEntry::default());
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                &cursor as *const u32 as u64
            },
            out_batch: &mut next as *mut u32 as u64,
            keys: keys[at..].as_mut_ptr() as u64,
            values: values[at..].as_mut_ptr() as u64,
            count: chunk as u32,
            map_fd: fd as u32,
            elem_flags: 0,
            flags: 0,
        };
        let r = bpf(BPF_MAP_LOOKUP_BATCH, &mut attr);
        let got = (attr.count as usize).min(chunk);
        keys.truncate(at + got);
        values.truncate(at + got);
        match r {
            Ok(_) => {
                (cursor, first, chunk) = (next, false, CHUNK);
            }
            // The end of the table (with the last entries, if any).
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
            // One bucket holds more than a chunk: again, with room for it.
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && got == 0 && chunk < 1 << 20 => {
                chunk *= 2;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The `bpf_attr` of the batch commands; the kernel writes `count` back.
#[repr(C)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
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
            // The map keeps the inode only: attributed by inode (the listener taking it).
            netns: e.netns,
            netns_cookie: 0,
        },
        skaddr: sk,
        conn: Endpoints::from_tuple(&e.tuple),
        old: None,
        new: None,
        counters: Default::default(),
        max_ack_backlog: None,
        held,
        failure: None,
    };
    event::unfold(Event::StateChange(carrier), out);
}

/// `BPF_MAP_LOOKUP_AND_DELETE_ELEM` on a hash map (5.14+), which aya offers for queues and
/// stacks only, hand-written here: reading and removing in one step is what keeps an accept
/// the kernel notes in the entry meanwhile from being lost. `None`: the kernel took it first.
fn take_entry(fd: i32, sk: u64) -> Result<Option<HoldEntry>, MapError> {
    let mut value = HoldEntry::default();
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

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<libc::c_long> {
    // SAFETY: `attr` is the kernel's `bpf_attr` layout for `cmd` (which may write into it),
    // and any pointers in it point at memory of the sizes the map was made with, live for
    // the call.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, size_of::<T>()) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn lookup_and_delete<K, V>(fd: i32, key: &K, value: &mut V) -> std::io::Result<()> {
    const BPF_MAP_LOOKUP_AND_DELETE_ELEM: libc::c_long = 21;
    let mut attr = ElemAttr {
        map_fd: fd as u32,
        _pad: 0,
        key: key as *const K as u64,
        value: value as *mut V as u64,
        flags: 0,
    };
    bpf(BPF_MAP_LOOKUP_AND_DELETE_ELEM, &mut attr).map(drop)
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
    let mut create = CreateAttr {
        map_type: BPF_MAP_TYPE_HASH,
        key_size: 8,
        value_size: 8,
        max_entries: 1,
        map_flags: 0,
    };
    let Ok(fd) = bpf(BPF_MAP_CREATE, &mut create) else {
        return false;
    };
    // SAFETY: a descriptor the kernel just returned, owned here alone.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) };
    let mut value = 0u64;
    // Empty: ENOENT where the command exists for hash maps (EINVAL or ENOTSUPP before).
    lookup_and_delete(fd.as_raw_fd(), &0u64, &mut value)
        .is_err_and(|e| e.raw_os_error() == Some(libc::ENOENT))
}
