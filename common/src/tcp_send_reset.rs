//! `tcp:tcp_send_reset`: this host sent a RST. Since 6.10 it carries `reason` (`enum
//! sk_rst_reason`) and the addresses as 28-byte `sockaddr_in`/`sockaddr_in6` blobs; before, ports
//! and addresses were separate fields. `skaddr` is NULL for a RST answering a packet that matched
//! no socket (e.g. a SYN to a closed port).

use crate::{Header, Tuple, config::NO_FIELD};

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Event {
    pub header: Header,
    pub skaddr: u64,
    pub tuple: Tuple,
    /// TCP state of the socket, -1 without a socket or field.
    pub state: i32,
    /// `enum sk_rst_reason`, `ABSENT_U32` on kernels before 6.10.
    pub reason: u32,
}

/// Field offsets in the tracepoint record; `NO_FIELD` where this kernel has none.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fields {
    pub skbaddr: u16,
    pub skaddr: u16,
    pub state: u16,
    pub reason: u16,
    /// 6.10+: `saddr`/`daddr` are sockaddr blobs (`sockaddr_layout` = 1).
    pub saddr: u16,
    pub daddr: u16,
    pub sockaddr_layout: u16,
    /// Before 6.10: separate fields.
    pub sport: u16,
    pub dport: u16,
    pub family: u16,
    pub saddr_v6: u16,
    pub daddr_v6: u16,
}

impl Fields {
    pub const ABSENT: Self = Self {
        skbaddr: NO_FIELD,
        skaddr: NO_FIELD,
        state: NO_FIELD,
        reason: NO_FIELD,
        saddr: NO_FIELD,
        daddr: NO_FIELD,
        sockaddr_layout: 0,
        sport: NO_FIELD,
        dport: NO_FIELD,
        family: NO_FIELD,
        saddr_v6: NO_FIELD,
        daddr_v6: NO_FIELD,
    };
}

pod!(Event, Fields);
