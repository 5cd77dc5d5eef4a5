//! `sock:inet_sock_set_state`: the format fields and in-kernel state filters its program
//! uses, and `StateChange` (with the connection's `TcpCounters`), what its records decode to.

use drainwatch_common::inet_sock_set_state::{Event, Fields};

use crate::capture::{
    event::{DecodeError, Endpoints, KernelNames, Meta, TcpState, read_record},
    tracefs::Resolver,
};

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
    /// The socket's arrival and accept, held in the kernel and sent with this record
    /// (`--hold`); `event::unfold` turns them back into events of their own.
    pub held: Option<Held>,
    /// A connect's failure (SYN_SENT to CLOSE), as the tp_btf program reads it.
    pub failure: Option<ConnectFailure>,
}

/// Why and since when a connect failed, from its socket (`Event::syn_ms`, `Event::error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectFailure {
    /// When its first SYN went out (monotonic ns, to the millisecond); `None`: not read.
    pub syn_at: Option<u64>,
    /// `sk_err`: `ECONNREFUSED` with no RST received is a filter's ICMP reject (kube-proxy's
    /// answer for a Service with no endpoints); 0: its process gave up before the kernel did.
    pub errno: i32,
}

/// The longest a SYN is believed to have waited for its answer: far beyond any SYN retry
/// time (`tcp_syn_retries` 6: 127 s), well inside the 49 days a 32-bit millisecond wraps.
const MAX_SYN_AGE_MS: u32 = 3_600_000;

impl ConnectFailure {
    /// `syn_ms` is the low 32 bits of the monotonic clock's milliseconds at the SYN, read at
    /// `at_ns` (on the same clock).
    fn of(at_ns: u64, syn_ms: u32, errno: i32) -> Self {
        let now_ms = at_ns / 1_000_000;
        let back = (now_ms as u32).wrapping_sub(syn_ms);
        let syn_at = (syn_ms != 0 && back <= MAX_SYN_AGE_MS && u64::from(back) <= now_ms)
            .then(|| (now_ms - u64::from(back)) * 1_000_000);
        Self { syn_at, errno }
    }
}

/// What the kernel held for a connection (`drainwatch_common::inet_sock_set_state::Held`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// When its handshake completed.
    pub arrived_at: u64,
    /// When accept() took it, and the thread group that did.
    pub accepted: Option<(u64, u32)>,
}

impl Held {
    pub(crate) fn of(h: &drainwatch_common::inet_sock_set_state::Held) -> Option<Self> {
        (h.arrived_ns != 0).then(|| Self {
            arrived_at: h.arrived_ns,
            accepted: (h.accepted_ns != 0).then_some((h.accepted_ns, h.accept_tgid)),
        })
    }
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
    /// Jiffies at the transition (low 32 bits; 0: not read).
    pub now: u32,
    /// Data segments received and sent.
    pub segs_in: u32,
    pub segs_out: u32,
    /// Bytes the peer sent after this side's last data reached it (`rcv_nxt - snd_wl1`: its
    /// segment acknowledging that data, or its first after; `None`: not read, or not
    /// believable): what an unanswered request would be.
    pub since_answer: Option<u32>,
    /// This side's bytes the peer had not acknowledged (`snd_nxt - snd_una`; read with
    /// `since_answer`, else 0).
    pub unacked: u32,
}

/// The fewest bytes a request takes: HTTP/2's smallest (a HEADERS frame, 9 bytes, with
/// `:method`, `:scheme` and `:path` indexed, one byte each); HTTP/1's is 18
/// (`GET / HTTP/1.0\r\n\r\n`). A websocket client's upgrade packet or pong (Socket.IO's `5` and
/// `3` framed and masked: 7 bytes) is shorter: the session's own traffic, which the server
/// never answers by design.
pub const MIN_REQUEST_BYTES: u32 = 12;

impl TcpCounters {
    /// Whether the peer was waiting for an answer: data arrived after the last data this side
    /// sent, or sits unread. Jiffies are coarse (4 ms at HZ=250): a request that arrives in the
    /// same tick as the previous response counts as answered. After an answer, what the peer
    /// sent since it had that answer must be a request's worth ([`MIN_REQUEST_BYTES`]): a
    /// shorter frame (a websocket client's upgrade packet or pong, never answered by design,
    /// read or still unread when the process died) leaves the connection a session, not a
    /// request cut.
    pub fn request_pending(&self) -> bool {
        if self.bytes_received == 0 && self.unread == 0 {
            return false;
        }
        if self.bytes_sent == 0 {
            return true;
        }
        // Wrapping comparison, as the kernel's own `after()` does.
        let after = (self.last_received.wrapping_sub(self.last_sent) as i32) > 0;
        let request = self.since_answer.is_none_or(|b| b >= MIN_REQUEST_BYTES);
        // In the tick of the last answer the clocks cannot order the two. The peer's
        // acknowledgement can: with all this side sent acknowledged (the answer reached the
        // peer), a request's worth sent since that acknowledgement came after the answer.
        // Unacknowledged, the answer was the last word (the request it answered is what
        // `since_answer` counts).
        let in_tick = self.last_received == self.last_sent
            && self.unacked == 0
            && self.since_answer.is_some();
        (self.unread > 0 || after || in_tick) && request
    }

    /// In jiffies: since the last data segment either way, and how long this side had been
    /// sending since the peer's last data (0 when it sent nothing after it). None when the
    /// clock was not read or no data moved.
    pub fn quiet_and_sending(&self) -> Option<(u32, u32)> {
        let (received, sent) = (self.bytes_received > 0, self.bytes_sent > 0);
        if self.now == 0 || !(received || sent) {
            return None;
        }
        // Wrapping differences, as the kernel's own `after()` compares jiffies.
        let ahead = |a: u32, b: u32| (a.wrapping_sub(b) as i32).max(0) as u32;
        let sending = if received && sent {
            ahead(self.last_sent, self.last_received)
        } else {
            0
        };
        let last = match (received, sent) {
            (true, true) if sending > 0 => self.last_sent,
            (true, _) => self.last_received,
            _ => self.last_sent,
        };
        Some((ahead(self.now, last), sending))
    }
}

pub fn fields(r: &mut Resolver) -> Fields {
    let mut f = Fields::ABSENT;
    f.skaddr = r.required("skaddr", 8);
    f.oldstate = r.required("oldstate", 4);
    f.newstate = r.required("newstate", 4);
    f.protocol = r.required("protocol", 2);
    f.addr = r.addr();
    // In-kernel filters by state, from the format's state names; no filter if one is missing.
    let mask = |names: &[&str]| -> Option<u32> {
        names.iter().try_fold(0u32, |m, n| {
            let v = r.format().symbol_value("oldstate", n)?;
            (v < 32).then(|| m | 1 << v)
        })
    };
    f.emit_old = mask(EMIT_OLD).unwrap_or(u32::MAX);
    f.counters_old = mask(&["TCP_ESTABLISHED", "TCP_CLOSE_WAIT"]).unwrap_or(u32::MAX);
    f.backlog_new = mask(&["TCP_LISTEN"]).unwrap_or(u32::MAX);
    f.listener_closed_new = mask(&["TCP_CLOSE"]).unwrap_or(u32::MAX);
    f.task_new = mask(&["TCP_SYN_SENT", "TCP_LISTEN"]).unwrap_or(u32::MAX);
    // No filter here when a name is missing: the program would look every transition up.
    f.connect_new = mask(&["TCP_SYN_SENT"]).unwrap_or(0);
    // No filter (0) when a name is missing: a loopback connect's steps are then all emitted.
    f.loopback_old = mask(&["TCP_SYN_SENT", "TCP_ESTABLISHED", "TCP_CLOSE_WAIT"]).unwrap_or(0);
    let state = |name| {
        r.format()
            .symbol_value("newstate", name)
            .and_then(|v| i32::try_from(v).ok())
            .unwrap_or(-2)
    };
    f.close_state = state("TCP_CLOSE");
    f.last_ack_state = state("TCP_LAST_ACK");
    f.fin_wait1_state = state("TCP_FIN_WAIT1");
    f.syn_recv_state = state("TCP_SYN_RECV");
    f.established_state = state("TCP_ESTABLISHED");
    f
}

/// The old states of every transition the enricher acts on (`enrich/attribute.rs`): a
/// connection's steps after it started closing (FIN_WAIT1, FIN_WAIT2, CLOSING, LAST_ACK,
/// TIME_WAIT onwards) say nothing it needs, and are a third of a connection's transitions.
pub const EMIT_OLD: &[&str] = &[
    "TCP_CLOSE",
    "TCP_LISTEN",
    "TCP_SYN_SENT",
    "TCP_SYN_RECV",
    "TCP_ESTABLISHED",
    "TCP_CLOSE_WAIT",
];

/// `rcv_nxt - snd_wl1` when read (0: not read) and within what the peer ever sent.
fn since_answer(e: &Event) -> Option<u32> {
    let b = e.rcv_nxt.wrapping_sub(e.snd_wl1);
    (e.snd_wl1 != 0 && u64::from(b) <= e.bytes_received).then_some(b)
}

pub fn decode(bytes: &[u8], names: &KernelNames) -> Result<StateChange, DecodeError> {
    let e: Event = read_record("inet_sock_set_state", bytes)?;
    Ok(StateChange {
        meta: Meta::from(&e.header),
        skaddr: e.skaddr,
        conn: Endpoints::from_tuple(&e.tuple),
        old: names.tcp_state(e.oldstate),
        new: names.tcp_state(e.newstate),
        counters: TcpCounters {
            bytes_received: e.bytes_received,
            bytes_sent: e.bytes_sent,
            unread: e.rcv_nxt.wrapping_sub(e.copied_seq),
            last_received: e.lrcvtime,
            last_sent: e.lsndtime,
            now: e.jiffies,
            segs_in: e.data_segs_in,
            segs_out: e.data_segs_out,
            since_answer: since_answer(&e),
            unacked: e.unacked,
        },
        max_ack_backlog: (names.tcp_state(e.newstate) == Some(TcpState::Listen))
            .then_some(e.max_ack_backlog),
        held: Held::of(&e.held),
        failure: (e.syn_ms != 0 || e.error != 0)
            .then(|| ConnectFailure::of(e.header.ts_ns, e.syn_ms, e.error)),
    })
}

#[cfg(test)]
mod tests {
    use drainwatch_common::EventKind;

    use super::*;
    use crate::capture::{
        event::tests::{bytes_of, header, v4_tuple},
        tracefs::tests::fixture,
    };

    #[test]
    fn fields_on_6_18() {
        let fmt = fixture("6.18", "inet_sock_set_state");
        let mut r = Resolver::new(&fmt);
        let f = fields(&mut r);
        assert_eq!(
            (
                f.skaddr,
                f.oldstate,
                f.newstate,
                f.addr.sport,
                f.addr.dport,
                f.addr.family,
                f.protocol,
                f.addr.saddr,
                f.addr.daddr,
                f.addr.saddr_v6,
                f.addr.daddr_v6
            ),
            (8, 16, 20, 24, 26, 28, 30, 32, 36, 40, 56)
        );
        assert!(r.missing_required.is_empty());
        // Numbering of include/net/tcp_states.h, as this format prints it.
        let bit = |s: u32| 1u32 << s;
        assert_eq!(
            f.emit_old,
            bit(7) | bit(10) | bit(2) | bit(3) | bit(1) | bit(8)
        );
        assert_eq!(f.counters_old, bit(1) | bit(8));
        assert_eq!(f.backlog_new, bit(10));
        assert_eq!(f.connect_new, bit(2));
        assert_eq!(f.loopback_old, bit(2) | bit(1) | bit(8));
        assert_eq!(f.close_state, 7);
        assert_eq!(f.last_ack_state, 9);
        assert_eq!(f.fin_wait1_state, 4);
        assert_eq!(f.syn_recv_state, 3);
    }

    #[test]
    fn decodes_close_with_names() {
        let names = KernelNames {
            tcp_states: fixture("6.18", "inet_sock_set_state").symbols("newstate"),
            ..Default::default()
        };
        let e = Event {
            header: header(EventKind::InetSockSetState),
            skaddr: 1,
            tuple: v4_tuple([127, 0, 0, 1], 8080, [127, 0, 0, 1], 50000),
            oldstate: 10,
            newstate: 7,
            bytes_received: 300,
            bytes_sent: 0,
            rcv_nxt: 5,
            copied_seq: u32::MAX - 4,
            lrcvtime: 1000,
            lsndtime: 900,
            max_ack_backlog: 0,
            jiffies: 1100,
            data_segs_in: 3,
            data_segs_out: 9,
            snd_wl1: 0,
            unacked: 0,
            syn_ms: 0,
            error: 0,
            held: Default::default(),
        };
        let d = decode(&bytes_of(&e), &names).unwrap();
        assert_eq!(d.held, None, "nothing held");
        assert_eq!(d.old.unwrap().name(), Some("TCP_LISTEN"));
        assert_eq!(d.new.unwrap().name(), Some("TCP_CLOSE"));
        // The receive queue's ends wrap around the sequence space.
        assert_eq!(d.counters.unread, 10);
        assert!(d.counters.request_pending());
        assert_eq!(
            (d.counters.now, d.counters.segs_in, d.counters.segs_out),
            (1100, 3, 9)
        );
        // Nothing sent: quiet since the last data received, 100 jiffies ago.
        assert_eq!(d.counters.quiet_and_sending(), Some((100, 0)));
    }

    #[test]
    fn quiet_and_sending_time_come_from_the_later_of_the_last_data() {
        let c = |last_received, last_sent, now| TcpCounters {
            bytes_received: 100,
            bytes_sent: 5000,
            last_received,
            last_sent,
            now,
            ..TcpCounters::default()
        };
        // A stream: the request 750 jiffies before its last event, closed 50 after it.
        assert_eq!(c(250, 1000, 1050).quiet_and_sending(), Some((50, 750)));
        // A request after the last answer: quiet since the request, sending nothing.
        assert_eq!(c(1000, 990, 1010).quiet_and_sending(), Some((10, 0)));
        // Across the wrap of 32-bit jiffies.
        assert_eq!(c(u32::MAX - 9, 5, 20).quiet_and_sending(), Some((15, 15)));
        // The clock not read, or nothing ever moved: unknown.
        assert_eq!(c(1, 2, 0).quiet_and_sending(), None);
        assert_eq!(
            TcpCounters {
                now: 9,
                ..TcpCounters::default()
            }
            .quiet_and_sending(),
            None
        );
    }

    #[test]
    fn a_request_is_pending_when_data_came_after_the_last_answer() {
        let answered = TcpCounters {
            bytes_received: 100,
            bytes_sent: 2000,
            unread: 0,
            last_received: 500,
            last_sent: 510,
            ..TcpCounters::default()
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
        // After an answer, a request's worth since the peer had it: the next request.
        let next_request = TcpCounters {
            since_answer: Some(18),
            ..waiting
        };
        assert!(next_request.request_pending());
        // A websocket client's upgrade packet or pong (7 bytes) after the server's last
        // frame: the session's own traffic.
        let pong = TcpCounters {
            since_answer: Some(7),
            ..waiting
        };
        assert!(!pong.request_pending());
        // Still unread when the process died: the same pong.
        assert!(!TcpCounters { unread: 7, ..pong }.request_pending());
        // A request unread after an answer, or no answer yet: pending however short.
        assert!(
            TcpCounters {
                unread: 18,
                since_answer: Some(18),
                ..answered
            }
            .request_pending()
        );
        assert!(
            TcpCounters {
                bytes_sent: 0,
                ..pong
            }
            .request_pending()
        );
    }

    #[test]
    fn in_the_tick_of_the_last_answer_the_peers_acknowledgement_orders_a_request() {
        // A keep-alive pool hands a connection to the next request as soon as its answer is
        // read: both in one 4 ms tick.
        let same_tick = TcpCounters {
            bytes_received: 200,
            bytes_sent: 2000,
            last_received: 500,
            last_sent: 500,
            since_answer: Some(95),
            unacked: 0,
            ..TcpCounters::default()
        };
        assert!(same_tick.request_pending());
        // The answer not yet acknowledged: it answered what `since_answer` counts.
        assert!(
            !TcpCounters {
                unacked: 1200,
                ..same_tick
            }
            .request_pending()
        );
        // Acknowledged with nothing sent since: answered.
        assert!(
            !TcpCounters {
                since_answer: Some(0),
                ..same_tick
            }
            .request_pending()
        );
        // A pong in the tick of the server's ping: a session's frame.
        assert!(
            !TcpCounters {
                since_answer: Some(7),
                ..same_tick
            }
            .request_pending()
        );
        // Not read (the classic tracepoint): the ticks alone, answered.
        assert!(
            !TcpCounters {
                since_answer: None,
                ..same_tick
            }
            .request_pending()
        );
    }

    #[test]
    fn since_answer_is_what_the_peer_sent_after_its_ack_of_the_last_answer() {
        let names = KernelNames::default();
        let ev = |rcv_nxt: u32, snd_wl1: u32, bytes_received: u64| {
            let mut e = Event {
                header: header(EventKind::InetSockSetState),
                skaddr: 1,
                tuple: v4_tuple([10, 0, 0, 2], 8080, [10, 0, 0, 3], 50000),
                oldstate: 1,
                newstate: 4,
                bytes_received,
                bytes_sent: 100,
                rcv_nxt,
                copied_seq: rcv_nxt,
                lrcvtime: 0,
                lsndtime: 0,
                max_ack_backlog: 0,
                jiffies: 0,
                data_segs_in: 0,
                data_segs_out: 0,
                snd_wl1,
                unacked: 0,
                syn_ms: 0,
                error: 0,
                held: Default::default(),
            };
            e.rcv_nxt = rcv_nxt;
            decode(&bytes_of(&e), &names).unwrap().counters.since_answer
        };
        assert_eq!(ev(1007, 1000, 300), Some(7));
        // Across the sequence space's wrap.
        assert_eq!(ev(3, u32::MAX - 3, 300), Some(7));
        // Not read (the classic tracepoint), or beyond what the peer ever sent: unknown.
        assert_eq!(ev(1007, 0, 300), None);
        assert_eq!(ev(1007, 5, 300), None);
    }
}
