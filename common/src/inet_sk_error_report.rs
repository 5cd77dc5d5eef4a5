//! `sock:inet_sk_error_report`: the kernel reported an error on a socket, e.g. ECONNREFUSED to a
//! connect() answered by RST, ECONNRESET, ETIMEDOUT, EHOSTUNREACH. Only `IPPROTO_TCP` is emitted.

use crate::{Header, Tuple, config::NO_FIELD};

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
    pub sport: u16,
    pub dport: u16,
    pub family: u16,
    pub protocol: u16,
    pub saddr: u16,
    pub daddr: u16,
    pub saddr_v6: u16,
    pub daddr_v6: u16,
    pub _pad: u16,
}

impl Fields {
    pub const ABSENT: Self = Self {
        error: NO_FIELD,
        sport: NO_FIELD,
        dport: NO_FIELD,
        family: NO_FIELD,
        protocol: NO_FIELD,
        saddr: NO_FIELD,
        daddr: NO_FIELD,
        saddr_v6: NO_FIELD,
        daddr_v6: NO_FIELD,
        _pad: 0,
    };
}

pod!(Event, Fields);
