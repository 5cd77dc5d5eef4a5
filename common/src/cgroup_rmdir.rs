//! `cgroup:cgroup_rmdir`: a cgroup directory was removed (a container's cgroup is gone).

use crate::{Header, fields::NO_FIELD};

pub const PATH_LEN: usize = 256;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Event {
    pub header: Header,
    /// Id of the removed cgroup: for the v2 hierarchy, what `bpf_get_current_cgroup_id()` returns.
    pub id: u64,
    /// Hierarchy id: 0 is cgroup v2 (the unified hierarchy).
    pub root: i32,
    pub level: i32,
    /// Bytes of `path` used, including the NUL; 0 if it could not be read.
    pub path_len: u32,
    pub _pad: u32,
    pub path: [u8; PATH_LEN],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fields {
    pub root: u16,
    pub level: u16,
    pub id: u16,
    /// `__data_loc char[] path`: a u32 holding (length << 16 | offset).
    pub path: u16,
}

impl Fields {
    pub const ABSENT: Self = Self {
        root: NO_FIELD,
        level: NO_FIELD,
        id: NO_FIELD,
        path: NO_FIELD,
    };
}

pod!(Event, Fields);

// The layout is a contract with the kernel side (see the crate root).
const _: () = assert!(core::mem::size_of::<Event>() == 336);
