//! Decoded events: what the rest of the pipeline consumes. Raw ring-buffer records become these
//! in the hook modules (`hooks::<stem>::decode`, which also define each decoded type); nothing
//! downstream sees kernel layouts. `events!` below is the agent's list of hooks: one line per
//! event kind of the common table (`drainwatch_common::for_each_hook!`).

use std::{
    collections::BTreeMap,
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::OnceLock,
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
    #[error("sock_length record with unknown phase {0}")]
    UnknownPhase(u32),
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

/// Who was on the CPU and where. In softirq context (packet paths) the task is whatever was
/// interrupted: attribute those events by socket, namespace and address instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    pub ts_ns: u64,
    pub pid: u32,
    pub tgid: u32,
    pub comm: Comm,
    pub cgroup_id: u64,
    /// The namespace's inode and cookie (0 where the kernel has none: see `model::netns`).
    pub netns: u32,
    pub netns_cookie: u64,
}

impl Meta {
    pub fn ns(&self) -> crate::model::Netns {
        crate::model::Netns::new(self.netns, self.netns_cookie)
    }
}

impl From<&Header> for Meta {
    fn from(h: &Header) -> Self {
        Self {
            ts_ns: h.ts_ns,
            pid: h.pid,
            tgid: h.tgid,
            comm: Comm::new(&h.comm),
            cgroup_id: h.cgroup_id,
            netns: h.netns,
            netns_cookie: h.netns_cookie,
        }
    }
}

/// A task's command as the kernel keeps it (at most 16 bytes), inline: every event has one,
/// and a `String` was an allocation per event. Bytes that do not make UTF-8 read as `?`.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Comm {
    len: u8,
    bytes: [u8; 16],
}

impl Comm {
    pub fn new(raw: &[u8]) -> Self {
        let mut c = Self::default();
        let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
        let end = end.min(c.bytes.len());
        c.bytes[..end].copy_from_slice(&raw[..end]);
        if std::str::from_utf8(&c.bytes[..end]).is_err() {
            for b in &mut c.bytes[..end] {
                if !b.is_ascii() {
                    *b = b'?';
                }
            }
        }
        c.len = end as u8;
        c
    }
}

impl std::ops::Deref for Comm {
    type Target = str;
    fn deref(&self) -> &str {
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }
}

impl From<&str> for Comm {
    fn from(s: &str) -> Self {
        Self::new(s.as_bytes())
    }
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, f)
    }
}

impl std::fmt::Display for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self)
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
    /// `tcp_states` as states, made at the first lookup (leave it default).
    pub states: StateTable,
}

/// TCP states indexed by number: every state change record is two or three lookups, which
/// then compare no names.
#[derive(Debug, Clone, Default)]
pub struct StateTable(OnceLock<Vec<TcpState>>);

/// Above any TCP state number: the table stops there (a larger one is named by search).
const STATES_MAX: u64 = 64;

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
        let states = self.states.0.get_or_init(|| {
            let top = self
                .tcp_states
                .keys()
                .copied()
                .filter(|n| *n < STATES_MAX)
                .max()
                .map_or(0, |n| n + 1);
            (0..top).map(|n| self.by_name(n)).collect()
        });
        Some(match states.get(v as usize) {
            Some(s) => *s,
            None => self.by_name(u64::from(v)),
        })
    }

    fn by_name(&self, v: u64) -> TcpState {
        let name = self.tcp_states.get(&v).map(String::as_str);
        TcpState::from_kernel_name(name, v as u32)
    }
}

/// `Event`, its `meta()` and `kind()`, `decode()` and the re-exports of the decoded types,
/// from one line per event kind: `<EventKind variant> => <Event variant>(<hook module>)`. The
/// variant's payload is the type of the same name in `hooks::<stem>`, which also has
/// `decode(bytes, names)`.
macro_rules! events {
    ($($(#[$doc:meta])* $kind:ident => $variant:ident($stem:ident),)*) => {
        $(pub use super::hooks::$stem::$variant;)*

        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum Event {
            $($(#[$doc])* $variant($variant),)*
        }

        impl Event {
            pub fn meta(&self) -> &Meta {
                match self {
                    $(Event::$variant(e) => &e.meta,)*
                }
            }

            pub fn kind(&self) -> EventKind {
                match self {
                    $(Event::$variant(_) => EventKind::$kind,)*
                }
            }
        }

        impl super::merge::Stamped for Event {
            fn stamp(&self) -> u64 {
                self.meta().ts_ns
            }
        }

        /// Decodes one raw ring-buffer record.
        pub fn decode(bytes: &[u8], names: &KernelNames) -> Result<Event, DecodeError> {
            // Exhaustive: a kind of the common table without a line here does not build.
            Ok(match record_kind(bytes)? {
                $(EventKind::$kind => Event::$variant(super::hooks::$stem::decode(bytes, names)?),)*
            })
        }
    };
}

events! {
    TcpSendReset => ResetSent(tcp_send_reset),
    TcpReceiveReset => ResetReceived(tcp_receive_reset),
    InetSockSetState => StateChange(inet_sock_set_state),
    InetSkErrorReport => SocketError(inet_sk_error_report),
    SignalGenerate => Signal(signal_generate),
    SchedProcessExit => Exit(sched_process_exit),
    CgroupRmdir => CgroupRemoved(cgroup_rmdir),
    KfreeSkb => ListenOverflow(kfree_skb),
    InetCskAccept => Accepted(inet_csk_accept),
    SockLength => UpstreamIo(sock_length),
}

pub use super::hooks::{
    inet_sock_set_state::TcpCounters, sched_process_exit::ExitStatus, sock_length::IoStep,
};

/// One decoded record onto `out` as the events it stands for: a state change that carries its
/// connection's held arrival and accept (`--hold`) is preceded by them, stamped when they
/// happened (the merge puts them in time order); a record that only carried them
/// (`HELD_ONLY`, before a reset) is not passed on itself.
pub fn unfold(ev: Event, out: &mut Vec<Event>) {
    let Event::StateChange(s) = &ev else {
        out.push(ev);
        return;
    };
    let Some(held) = s.held else {
        out.push(ev);
        return;
    };
    let meta = |ts_ns, tgid| Meta {
        ts_ns,
        pid: tgid,
        tgid,
        comm: Comm::default(),
        cgroup_id: 0,
        netns: s.meta.netns,
        netns_cookie: s.meta.netns_cookie,
    };
    out.push(Event::StateChange(StateChange {
        meta: meta(held.arrived_at, 0),
        skaddr: s.skaddr,
        conn: s.conn,
        old: Some(TcpState::SynRecv),
        new: Some(TcpState::Established),
        counters: TcpCounters::default(),
        max_ack_backlog: None,
        held: None,
        failure: None,
    }));
    if let Some((at, tgid)) = held.accepted {
        out.push(Event::Accepted(Accepted {
            meta: meta(at, tgid),
            skaddr: s.skaddr,
            conn: s.conn,
        }));
    }
    if s.old.is_some() || s.new.is_some() {
        out.push(ev);
    }
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
            netns_cookie: 1,
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

    /// Names of TCP states only, as 6.18's `inet_sock_set_state` format gives them.
    fn state_names() -> KernelNames {
        KernelNames {
            tcp_states: crate::capture::tracefs::tests::fixture("6.18", "inet_sock_set_state")
                .symbols("newstate"),
            ..Default::default()
        }
    }

    #[test]
    fn a_held_arrival_and_accept_come_back_as_events_before_the_record_that_carried_them() {
        use drainwatch_common::inet_sock_set_state as set_state;
        let names = state_names();
        let record = |old, new, held| set_state::Event {
            header: header(EventKind::InetSockSetState),
            skaddr: 9,
            tuple: v4_tuple([10, 0, 0, 2], 8080, [10, 0, 0, 3], 50000),
            oldstate: old,
            newstate: new,
            bytes_received: 0,
            bytes_sent: 0,
            rcv_nxt: 0,
            copied_seq: 0,
            lrcvtime: 0,
            lsndtime: 0,
            max_ack_backlog: 0,
            jiffies: 0,
            data_segs_in: 0,
            data_segs_out: 0,
            snd_wl1: 0,
            unacked: 0,
            syn_ms: 0,
            error: 0,
            held,
        };
        let unfolded = |e: &set_state::Event| {
            let mut out = Vec::new();
            unfold(decode(&bytes_of(e), &names).unwrap(), &mut out);
            out.iter()
                .map(|e| match e {
                    Event::StateChange(s) => format!(
                        "{:?}->{:?} at {} by {}",
                        s.old, s.new, s.meta.ts_ns, s.meta.tgid
                    ),
                    Event::Accepted(a) => format!("accept at {} by {}", a.meta.ts_ns, a.meta.tgid),
                    other => format!("{other:?}"),
                })
                .collect::<Vec<_>>()
        };
        let held = set_state::Held {
            arrived_ns: 100,
            accepted_ns: 150,
            accept_tgid: 77,
            _pad: 0,
        };
        // ESTABLISHED (1) to FIN_WAIT1 (4), carrying both.
        assert_eq!(
            unfolded(&record(1, 4, held)),
            [
                "Some(SynRecv)->Some(Established) at 100 by 0",
                "accept at 150 by 77",
                "Some(Established)->Some(FinWait1) at 123456789 by 1000",
            ]
        );
        // Never accepted; and a record that carried only them is not passed on.
        let queued = set_state::Held {
            accepted_ns: 0,
            ..held
        };
        let only = set_state::HELD_ONLY;
        assert_eq!(
            unfolded(&record(only, only, queued)),
            ["Some(SynRecv)->Some(Established) at 100 by 0"]
        );
        // Nothing held: the record alone.
        assert_eq!(unfolded(&record(1, 4, set_state::Held::default())).len(), 1);
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
    fn comm_stops_at_nul() {
        assert_eq!(c_string(b"nginx\0garbage"), "nginx");
        assert_eq!(c_string(b"0123456789abcdef"), "0123456789abcdef");
    }

    #[test]
    fn a_comm_is_its_bytes_to_the_nul_and_never_invalid_utf8() {
        assert_eq!(&*Comm::new(b"nginx\0garbage"), "nginx");
        assert_eq!(&*Comm::new(b"0123456789abcdef"), "0123456789abcdef");
        assert_eq!(&*Comm::new("caf\u{e9}".as_bytes()), "caf\u{e9}");
        assert_eq!(&*Comm::new(b"a\xffb\xc3"), "a?b?");
        assert_eq!(&*Comm::from("x".repeat(40).as_str()), "x".repeat(16));
    }

    #[test]
    fn tcp_states_by_number_as_named_and_past_the_table() {
        let names = state_names();
        for _ in 0..2 {
            assert_eq!(names.tcp_state(1), Some(TcpState::Established));
            assert_eq!(names.tcp_state(7), Some(TcpState::Close));
            assert_eq!(names.tcp_state(12), Some(TcpState::NewSynRecv));
            assert_eq!(names.tcp_state(99), Some(TcpState::Other(99)));
            assert_eq!(names.tcp_state(-1), None);
        }
        // No names: every state is a number, none is taken for another.
        assert_eq!(
            KernelNames::default().tcp_state(1),
            Some(TcpState::Other(1))
        );
    }
}
