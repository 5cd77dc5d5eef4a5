//! `tcp:tcp_send_reset`: this host sent a RST. Since 6.10 it carries `reason` (`enum
//! sk_rst_reason`) and the addresses as 28-byte `sockaddr_in`/`sockaddr_in6` blobs; before, ports
//! and addresses were separate fields. `skaddr` is NULL for a RST answering a packet that matched
//! no socket (e.g. a SYN to a closed port).

use crate::{
    Header, Tuple,
    fields::{AddrFields, NO_FIELD},
};

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
    /// The TCP flags of the segment the RST answers, or'ed with `ANSWERED_READ`; 0 when
    /// unknown (an active reset answers no segment, or the packet could not be read).
    pub answered: u32,
    /// The answered segment's payload in bytes (IP length less the IP and TCP headers), read
    /// with `answered`: data at a socket its process had closed, or a bare FIN/ACK/SYN (0).
    pub answered_payload: u32,
}

/// `Event::answered`: the answered segment's flags were read.
pub const ANSWERED_READ: u32 = 0x100;
pub const TCP_SYN: u32 = 0x02;
pub const TCP_ACK: u32 = 0x10;

/// Whether the RST answered a connection attempt (a SYN without ACK: a refused connect);
/// `None` when the answered segment is unknown.
pub fn answers_syn(answered: u32) -> Option<bool> {
    (answered & ANSWERED_READ != 0).then_some(answered & (TCP_SYN | TCP_ACK) == TCP_SYN)
}

/// Whether the RST answered a segment that carried data (a request written to a connection
/// the other side had closed, not its FIN or ACK); `None` when the answered segment is unknown.
pub fn answers_data(answered: u32, answered_payload: u32) -> Option<bool> {
    (answered & ANSWERED_READ != 0).then_some(answered_payload > 0)
}

/// Field offsets in the tracepoint record; `NO_FIELD` where this kernel has none.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fields {
    pub skbaddr: u16,
    pub skaddr: u16,
    pub state: u16,
    pub reason: u16,
    /// 6.10+: `saddr`/`daddr` are 28-byte sockaddr blobs; `NO_FIELD` on older layouts.
    pub sockaddr_saddr: u16,
    pub sockaddr_daddr: u16,
    /// Before 6.10: separate family, port and address fields.
    pub addr: AddrFields,
    /// For the tp_btf program: bit `1 << state` for the states of sockets that are not full
    /// sockets (TIME_WAIT, NEW_SYN_RECV), whose RSTs the tracepoint describes from the packet.
    pub not_full_states: u32,
}

impl Fields {
    pub const ABSENT: Self = Self {
        skbaddr: NO_FIELD,
        skaddr: NO_FIELD,
        state: NO_FIELD,
        reason: NO_FIELD,
        sockaddr_saddr: NO_FIELD,
        sockaddr_daddr: NO_FIELD,
        addr: AddrFields::ABSENT,
        not_full_states: 0,
    };
}

pod!(Event, Fields);

// The layout is a contract with the kernel side (see the crate root).
const _: () = assert!(core::mem::size_of::<Event>() == 120);
