//! `sock:inet_sk_error_report`: the kernel reported an error on a socket, e.g. ECONNREFUSED to a
//! connect() answered by RST, ECONNRESET, ETIMEDOUT, EHOSTUNREACH. Only `IPPROTO_TCP` is emitted.

use crate::{
    Header, Tuple,
    fields::{AddrFields, NO_FIELD},
};

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Event {
    pub header: Header,
    pub tuple: Tuple,
    /// Positive errno.
    pub error: i32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fields {
    pub error: u16,
    pub protocol: u16,
    pub addr: AddrFields,
}

impl Fields {
    pub const ABSENT: Self = Self {
        error: NO_FIELD,
        protocol: NO_FIELD,
        addr: AddrFields::ABSENT,
    };
}

pod!(Event, Fields);

// The layout is a contract with the kernel side (see the crate root).
const _: () = assert!(core::mem::size_of::<Event>() == 104);
