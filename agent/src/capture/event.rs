//! Decoded events: what the rest of the pipeline consumes. Raw ring-buffer records become these
//! in the hook modules (`hooks::*::decode`); nothing downstream sees kernel layouts.

use std::{
    collections::BTreeMap,
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
};

use drainwatch_common::{AF_INET, AF_INET6, EventKind, Header, Tuple};

pub use crate::model::TcpState;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("record of {got} bytes is shorter than the {want} a {kind} event needs")]
    Short {
        kind: &'static str,
        got: usize,
        want: usize,
    },
    #[error("record of {0} bytes has no header")]
    NoHeader(usize),
    #[error("unknown event kind {0}")]
    UnknownKind(u32),
}

/// Reads a `#[repr(C)]` record from the front of `bytes`. The types are plain integers and
/// byte arrays, so any bit pattern is a valid value.
pub fn read_record<T: aya::Pod>(kind: &'static str, bytes: &[u8]) -> Result<T, DecodeError> {
    let want = std::mem::size_of::<T>();
    if bytes.len() < want {
        return Err(DecodeError::Short {
            kind,
            got: bytes.len(),
            want,
        });
    }
    // SAFETY: length checked above; read_unaligned copes with any alignment; T is Pod.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// The kind of a raw record, from its header.
pub fn record_kind(bytes: &[u8]) -> Result<EventKind, DecodeError> {
    const KIND_AT: usize = std::mem::offset_of!(Header, kind);
    let raw = bytes
        .get(KIND_AT..KIND_AT + 4)
        .ok_or(DecodeError::NoHeader(bytes.len()))?;
    let v = u32::from_ne_bytes([raw[0], raw[1], raw[2], raw[3]]);
    EventKind::from_u32(v).ok_or(DecodeError::UnknownKind(v))
}

pub fn kind_name(kind: EventKind) -> &'static str {
    match kind {
        EventKind::TcpSendReset => "tcp_send_reset",
        EventKind::TcpReceiveReset => "tcp_receive_reset",
        EventKind::InetSockSetState => "inet_sock_set_state",
        EventKind::InetSkErrorReport => "inet_sk_error_report",
        EventKind::SignalGenerate => "signal_generate",
        EventKind::SchedProcessExit => "sched_process_exit",
        EventKind::CgroupRmdir => "cgroup_rmdir",
        EventKind::KfreeSkb => "kfree_skb",
        EventKind::InetCskAccept => "inet_csk_accept",
    }
}

/// Who was on the CPU and where. In softirq context (packet paths) the task is whatever was
/// interrupted: attribute those events by socket, namespace and address instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    pub ts_ns: u64,
    pub pid: u32,
    pub tgid: u32,
    pub comm: String,
    pub cgroup_id: u64,
    pub netns: u32,
}

impl From<&Header> for Meta {
    fn from(h: &Header) -> Self {
        Self {
            ts_ns: h.ts_ns,
            pid: h.pid,
            tgid: h.tgid,
            comm: c_string(&h.comm),
            cgroup_id: h.cgroup_id,
            netns: h.netns,
        }
    }
}

/// A NUL-terminated kernel string, lossily as UTF-8.
pub fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// A connection's two ends from this host's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Endpoints {
    pub local: SocketAddr,
    pub remote: SocketAddr,
}

impl Endpoints {
    /// `None` when the kernel gave no address family (e.g. a socket not yet bound).
    pub fn from_tuple(t: &Tuple) -> Option<Self> {
        let ip = |a: &[u8; 16]| -> Option<IpAddr> {
            match t.family {
                AF_INET => Some(IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3]))),
                AF_INET6 => Some(IpAddr::V6(Ipv6Addr::from(*a))),
                _ => None,
            }
        };
        Some(Self {
            local: SocketAddr::new(ip(&t.saddr)?, t.sport),
            remote: SocketAddr::new(ip(&t.daddr)?, t.dport),
        })
    }
}

/// A kernel enum value with the name this kernel gives it (from its tracefs symbol tables).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    pub value: u32,
    pub name: Option<String>,
}

impl fmt::Display for Named {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(n) => f.write_str(n),
            None => write!(f, "{}", self.value),
        }
    }
}

/// This kernel's names for the enums events carry, read from format files at start-up.
#[derive(Debug, Clone, Default)]
pub struct KernelNames {
    pub rst_reasons: BTreeMap<u64, String>,
    pub drop_reasons: BTreeMap<u64, String>,
    pub tcp_states: BTreeMap<u64, String>,
}

impl KernelNames {
    fn lookup(table: &BTreeMap<u64, String>, v: u32) -> Named {
        Named {
            value: v,
            name: table.get(&u64::from(v)).cloned(),
        }
    }
    pub fn rst_reason(&self, v: u32) -> Named {
        Self::lookup(&self.rst_reasons, v)
    }
    pub fn drop_reason(&self, v: u32) -> Named {
        Self::lookup(&self.drop_reasons, v)
    }
    /// `None` for the -1 the programs write when no state was readable.
    pub fn tcp_state(&self, v: i32) -> Option<TcpState> {
        let v = u32::try_from(v).ok()?;
        let name = self.tcp_states.get(&u64::from(v)).map(String::as_str);
        Some(TcpState::from_kernel_name(name, v))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResetSent {
    pub meta: Meta,
    /// 0 when the RST answered a packet that matched no socket.
    pub skaddr: u64,
    pub conn: Option<Endpoints>,
    pub state: Option<TcpState>,
    /// `None` on kernels before 6.10 (no reason in the tracepoint).
    pub reason: Option<Named>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResetReceived {
    pub meta: Meta,
    pub skaddr: u64,
    pub sock_cookie: u64,
    pub conn: Option<Endpoints>,
    pub state: Option<TcpState>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateChange {
    pub meta: Meta,
    pub skaddr: u64,
    pub conn: Option<Endpoints>,
    pub old: Option<TcpState>,
    pub new: Option<TcpState>,
    pub counters: TcpCounters,
    /// Entering LISTEN: the accept queue's limit, when BTF gave its offset.
    pub max_ack_backlog: Option<u32>,
}

/// A connection's `tcp_sock` counters at a state change.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpCounters {
    pub bytes_received: u64,
    pub bytes_sent: u64,
    /// Bytes received but not yet read by the application.
    pub unread: u32,
    /// Jiffies of the last data segment received and sent.
    pub last_received: u32,
    pub last_sent: u32,
}

impl TcpCounters {
    /// Whether the peer was waiting for an answer: data arrived after the last data this side
    /// sent, or sits unread. Jiffies are coarse (4 ms at HZ=250): a request that arrives in the
    /// same tick as the previous response counts as answered.
    pub fn request_pending(&self) -> bool {
        if self.unread > 0 {
            return true;
        }
        if self.bytes_received == 0 {
            return false;
        }
        // Wrapping comparison, as the kernel's own `after()` does.
        self.bytes_sent == 0 || (self.last_received.wrapping_sub(self.last_sent) as i32) > 0
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketError {
    pub meta: Meta,
    pub conn: Option<Endpoints>,
    /// Positive errno, e.g. 111 ECONNREFUSED.
    pub errno: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signal {
    /// The sender.
    pub meta: Meta,
    pub sig: i32,
    pub target_pid: i32,
    pub target_comm: String,
    pub group: bool,
    /// `TRACE_SIGNAL_*`: 0 delivered, 1 ignored, 2 already pending, ...
    pub result: i32,
}

/// How a process ended, decoded from the kernel's wait status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Exited(i32),
    Killed {
        signal: i32,
        core: bool,
    },
    /// BTF gave no offset for `task_struct.exit_code`.
    Unknown,
}

impl ExitStatus {
    pub fn from_wait_status(status: i32) -> Self {
        if status == drainwatch_common::ABSENT_U32 as i32 {
            return Self::Unknown;
        }
        match status & 0x7f {
            0 => Self::Exited((status >> 8) & 0xff),
            sig => Self::Killed {
                signal: sig,
                core: status & 0x80 != 0,
            },
        }
    }

    /// The shell's convention: the exit code, or 128 + the killing signal (143 for SIGTERM).
    pub fn shell_code(self) -> Option<i32> {
        match self {
            Self::Exited(c) => Some(c),
            Self::Killed { signal, .. } => Some(128 + signal),
            Self::Unknown => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    pub meta: Meta,
    pub status: ExitStatus,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupRemoved {
    pub meta: Meta,
    pub id: u64,
    /// Hierarchy id: 0 is cgroup v2.
    pub hierarchy: i32,
    pub level: i32,
    pub path: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenOverflow {
    pub meta: Meta,
    /// The listener's address, when the kernel passed the listening socket.
    pub listener: Option<SocketAddr>,
    pub reason: Named,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    pub meta: Meta,
    pub skaddr: u64,
    pub conn: Option<Endpoints>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    ResetSent(ResetSent),
    ResetReceived(ResetReceived),
    StateChange(StateChange),
    SocketError(SocketError),
    Signal(Signal),
    Exit(Exit),
    CgroupRemoved(CgroupRemoved),
    ListenOverflow(ListenOverflow),
    Accepted(Accepted),
}

impl Event {
    pub fn meta(&self) -> &Meta {
        match self {
            Event::ResetSent(e) => &e.meta,
            Event::ResetReceived(e) => &e.meta,
            Event::StateChange(e) => &e.meta,
            Event::SocketError(e) => &e.meta,
            Event::Signal(e) => &e.meta,
            Event::Exit(e) => &e.meta,
            Event::CgroupRemoved(e) => &e.meta,
            Event::ListenOverflow(e) => &e.meta,
            Event::Accepted(e) => &e.meta,
        }
    }

    pub fn kind(&self) -> EventKind {
        match self {
            Event::ResetSent(_) => EventKind::TcpSendReset,
            Event::ResetReceived(_) => EventKind::TcpReceiveReset,
            Event::StateChange(_) => EventKind::InetSockSetState,
            Event::SocketError(_) => EventKind::InetSkErrorReport,
            Event::Signal(_) => EventKind::SignalGenerate,
            Event::Exit(_) => EventKind::SchedProcessExit,
            Event::CgroupRemoved(_) => EventKind::CgroupRmdir,
            Event::ListenOverflow(_) => EventKind::KfreeSkb,
            Event::Accepted(_) => EventKind::InetCskAccept,
        }
    }
}

/// Decodes one raw ring-buffer record.
pub fn decode(bytes: &[u8], names: &KernelNames) -> Result<Event, DecodeError> {
    use super::hooks::*;
    Ok(match record_kind(bytes)? {
        EventKind::TcpSendReset => Event::ResetSent(tcp_send_reset::decode(bytes, names)?),
        EventKind::TcpReceiveReset => {
            Event::ResetReceived(tcp_receive_reset::decode(bytes, names)?)
        }
        EventKind::InetSockSetState => {
            Event::StateChange(inet_sock_set_state::decode(bytes, names)?)
        }
        EventKind::InetSkErrorReport => Event::SocketError(inet_sk_error_report::decode(bytes)?),
        EventKind::SignalGenerate => Event::Signal(signal_generate::decode(bytes)?),
        EventKind::SchedProcessExit => Event::Exit(sched_process_exit::decode(bytes)?),
        EventKind::CgroupRmdir => Event::CgroupRemoved(cgroup_rmdir::decode(bytes)?),
        EventKind::KfreeSkb => Event::ListenOverflow(kfree_skb::decode(bytes, names)?),
        EventKind::InetCskAccept => Event::Accepted(inet_csk_accept::decode(bytes)?),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The bytes of a record, as the ring buffer delivers them.
    pub fn bytes_of<T: aya::Pod>(v: &T) -> Vec<u8> {
        // SAFETY: T is Pod: plain integers and arrays without padding.
        unsafe {
            std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>())
        }
        .to_vec()
    }

    pub fn header(kind: EventKind) -> Header {
        let mut comm = [0u8; 16];
        comm[..4].copy_from_slice(b"curl");
        Header {
            ts_ns: 123_456_789,
            cgroup_id: 42,
            kind: kind as u32,
            pid: 1001,
            tgid: 1000,
            netns: 4026531840,
            comm,
        }
    }

    pub fn v4_tuple(s: [u8; 4], sp: u16, d: [u8; 4], dp: u16) -> Tuple {
        let mut t = Tuple {
            family: AF_INET,
            sport: sp,
            dport: dp,
            ..Tuple::default()
        };
        t.saddr[..4].copy_from_slice(&s);
        t.daddr[..4].copy_from_slice(&d);
        t
    }

    #[test]
    fn exit_status_follows_wait_status_encoding() {
        assert_eq!(ExitStatus::from_wait_status(0), ExitStatus::Exited(0));
        assert_eq!(ExitStatus::from_wait_status(3 << 8), ExitStatus::Exited(3));
        let term = ExitStatus::from_wait_status(15);
        assert_eq!(
            term,
            ExitStatus::Killed {
                signal: 15,
                core: false
            }
        );
        assert_eq!(term.shell_code(), Some(143));
        assert_eq!(ExitStatus::from_wait_status(9).shell_code(), Some(137));
        assert_eq!(
            ExitStatus::from_wait_status(0x80 | 11),
            ExitStatus::Killed {
                signal: 11,
                core: true
            }
        );
        assert_eq!(ExitStatus::from_wait_status(-1), ExitStatus::Unknown);
        assert_eq!(ExitStatus::Unknown.shell_code(), None);
    }

    #[test]
    fn tuples_become_socket_addresses_for_both_families() {
        let t = v4_tuple([127, 0, 0, 1], 40000, [10, 88, 0, 2], 8080);
        let e = Endpoints::from_tuple(&t).unwrap();
        assert_eq!(e.local.to_string(), "127.0.0.1:40000");
        assert_eq!(e.remote.to_string(), "10.88.0.2:8080");
        let mut t6 = Tuple {
            family: AF_INET6,
            sport: 443,
            dport: 50000,
            ..Tuple::default()
        };
        t6.saddr[15] = 1;
        t6.daddr = "fd00::2".parse::<Ipv6Addr>().unwrap().octets();
        let e6 = Endpoints::from_tuple(&t6).unwrap();
        assert_eq!(e6.local.to_string(), "[::1]:443");
        assert_eq!(e6.remote.to_string(), "[fd00::2]:50000");
        assert_eq!(Endpoints::from_tuple(&Tuple::default()), None);
    }

    #[test]
    fn garbage_records_are_errors_not_panics() {
        let names = KernelNames::default();
        assert_eq!(decode(&[], &names), Err(DecodeError::NoHeader(0)));
        let mut b = bytes_of(&header(EventKind::TcpSendReset));
        assert!(matches!(decode(&b, &names), Err(DecodeError::Short { .. })));
        b[16..20].copy_from_slice(&77u32.to_ne_bytes());
        assert_eq!(decode(&b, &names), Err(DecodeError::UnknownKind(77)));
    }

    #[test]
    fn a_request_is_pending_when_data_came_after_the_last_answer() {
        let answered = TcpCounters {
            bytes_received: 100,
            bytes_sent: 2000,
            unread: 0,
            last_received: 500,
            last_sent: 510,
        };
        assert!(!answered.request_pending());
        let waiting = TcpCounters {
            last_received: 520,
            ..answered
        };
        assert!(waiting.request_pending());
        let unread = TcpCounters {
            unread: 7,
            ..answered
        };
        assert!(unread.request_pending());
        let first_request = TcpCounters {
            bytes_sent: 0,
            last_sent: 0,
            ..answered
        };
        assert!(first_request.request_pending());
        let idle = TcpCounters::default();
        assert!(!idle.request_pending());
        // Jiffies wrap: 3 ticks after u32::MAX is still "after".
        let wrapped = TcpCounters {
            last_received: 2,
            last_sent: u32::MAX - 1,
            ..answered
        };
        assert!(wrapped.request_pending());
    }

    #[test]
    fn comm_stops_at_nul() {
        assert_eq!(c_string(b"nginx\0garbage"), "nginx");
        assert_eq!(c_string(b"0123456789abcdef"), "0123456789abcdef");
    }
}
