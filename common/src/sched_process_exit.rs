//! `sched:sched_process_exit`: a task exited. The format carries no exit code: the program reads
//! `task_struct.exit_code` (a wait status) at the BTF offset. Emitted for thread-group exits only.

use crate::{Header, fields::NO_FIELD};

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Event {
    pub header: Header,
    /// Wait status: `(code << 8)` for exit(code), the signal number (| 0x80 for a core) if killed.
    /// `ABSENT_U32 as i32` when BTF gave no offset.
    pub exit_code: i32,
    /// 1 when this was the last thread of its group.
    pub group_dead: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fields {
    pub pid: u16,
    pub group_dead: u16,
}

impl Fields {
    pub const ABSENT: Self = Self {
        pid: NO_FIELD,
        group_dead: NO_FIELD,
    };
}

pod!(Event, Fields);

// The layout is a contract with the kernel side (see the crate root).
const _: () = assert!(core::mem::size_of::<Event>() == 64);
