//! `skb:kfree_skb`, filtered in the kernel to one drop reason: `TCP_LISTEN_OVERFLOW` (a
//! listener's accept queue was full). The reason's number differs between kernels; the agent
//! reads it from the format's symbol table.

use crate::{Header, Tuple, fields::NO_FIELD};

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Event {
    pub header: Header,
    pub skbaddr: u64,
    /// The listening socket, when the kernel passes it (`rx_sk`, 6.11+); 0 otherwise.
    pub rx_sk: u64,
    /// The listener's local address and port (read from `rx_sk` through BTF offsets).
    pub tuple: Tuple,
    pub reason: u32,
    pub protocol: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fields {
    pub skbaddr: u16,
    pub rx_sk: u16,
    pub protocol: u16,
    pub reason: u16,
    /// The `enum skb_drop_reason` value to keep (`TCP_LISTEN_OVERFLOW`); `u32::MAX` if unknown.
    pub listen_overflow: u32,
}

impl Fields {
    pub const ABSENT: Self = Self {
        skbaddr: NO_FIELD,
        rx_sk: NO_FIELD,
        protocol: NO_FIELD,
        reason: NO_FIELD,
        listen_overflow: u32::MAX,
    };
}

pod!(Event, Fields);

// The layout is a contract with the kernel side (see the crate root).
const _: () = assert!(core::mem::size_of::<Event>() == 120);
