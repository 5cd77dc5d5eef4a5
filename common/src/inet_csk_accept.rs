//! `inet_csk_accept` return (kretprobe, where the kernel has kprobes): an application's accept()
//! took a connection off a listener's queue. Paired with the connection's SYN_RECV→ESTABLISHED
//! state change it gives the accept wait.

use crate::{Header, Tuple};

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Event {
    pub header: Header,
    pub skaddr: u64,
    pub tuple: Tuple,
}

pod!(Event);

// The layout is a contract with the kernel side (see the crate root).
const _: () = assert!(core::mem::size_of::<Event>() == 104);
