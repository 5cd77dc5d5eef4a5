//! `tcp:tcp_receive_reset`: a RST arrived on one of this host's sockets.

use crate::{
    Header, Tuple,
    fields::{AddrFields, NO_FIELD},
};

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Event {
    pub header: Header,
    pub skaddr: u64,
    /// 0 when the kernel's format has no `sock_cookie`.
    pub sock_cookie: u64,
    pub tuple: Tuple,
    /// TCP state of the socket when the RST arrived (from BTF), -1 if unknown.
    pub state: i32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fields {
    pub skaddr: u16,
    pub sock_cookie: u16,
    pub addr: AddrFields,
}

impl Fields {
    pub const ABSENT: Self = Self {
        skaddr: NO_FIELD,
        sock_cookie: NO_FIELD,
        addr: AddrFields::ABSENT,
    };
}

pod!(Event, Fields);

// The layout is a contract with the kernel side (see the crate root).
const _: () = assert!(core::mem::size_of::<Event>() == 120);
