//! `syscalls:sys_exit_accept4` and `syscalls:sys_exit_accept`: accept() returned a new
//! connection's file descriptor. The program follows the descriptor to its socket (offsets from
//! BTF) and emits an `inet_csk_accept::Event`: the same fact the kprobe gives, from syscall
//! tracepoints that every kernel has.

use crate::fields::NO_FIELD;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fields {
    /// `long ret`: the new descriptor, or a negative errno.
    pub ret: u16,
    pub _pad: u16,
}

impl Fields {
    pub const ABSENT: Self = Self {
        ret: NO_FIELD,
        _pad: 0,
    };
}

pod!(Fields);
