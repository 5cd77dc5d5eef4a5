//! `signal:signal_generate`: a signal was sent. The header describes the sender (the current
//! task); only the signals in `SIGNALS` are emitted.

use crate::{Header, TASK_COMM_LEN, fields::NO_FIELD};

pub const SIGINT: i32 = 2;
pub const SIGQUIT: i32 = 3;
pub const SIGKILL: i32 = 9;
pub const SIGTERM: i32 = 15;
/// The signals a container stop is made of.
pub const SIGNALS: [i32; 4] = [SIGINT, SIGQUIT, SIGKILL, SIGTERM];

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Event {
    pub header: Header,
    pub sig: i32,
    /// Target thread id (a process's pid when sent to the process).
    pub target_pid: i32,
    /// 1 when sent to the whole thread group.
    pub group: i32,
    /// `TRACE_SIGNAL_*`: 0 delivered, 1 ignored, 2 already pending, 3 overflow, 4 lose info.
    pub result: i32,
    pub code: i32,
    pub _pad: u32,
    pub target_comm: [u8; TASK_COMM_LEN],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fields {
    pub sig: u16,
    pub code: u16,
    pub comm: u16,
    pub pid: u16,
    pub group: u16,
    pub result: u16,
}

impl Fields {
    pub const ABSENT: Self = Self {
        sig: NO_FIELD,
        code: NO_FIELD,
        comm: NO_FIELD,
        pid: NO_FIELD,
        group: NO_FIELD,
        result: NO_FIELD,
    };
}

pod!(Event, Fields);

// The layout is a contract with the kernel side (see the crate root).
const _: () = assert!(core::mem::size_of::<Event>() == 96);
