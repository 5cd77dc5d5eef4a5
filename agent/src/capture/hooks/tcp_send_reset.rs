//! `tcp:tcp_send_reset`: the format fields its program reads, and `ResetSent`, what its
//! records decode to.

use drainwatch_common::{
    ABSENT_U32,
    tcp_send_reset::{Event, Fields, answers_data, answers_syn},
};

use crate::capture::{
    event::{DecodeError, Endpoints, KernelNames, Meta, Named, TcpState, read_record},
    tracefs::Resolver,
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResetSent {
    pub meta: Meta,
    /// 0 when the RST answered a packet that matched no socket.
    pub skaddr: u64,
    pub conn: Option<Endpoints>,
    pub state: Option<TcpState>,
    /// `None` on kernels before 6.10 (no reason in the tracepoint).
    pub reason: Option<Named>,
    /// Whether it answered a connection attempt (a SYN): a refused connect. `None` when the
    /// answered segment is unknown (an active reset answers none).
    pub answers_syn: Option<bool>,
    /// Whether the segment it answered carried data (a request written to a socket its
    /// process had closed), not a bare FIN, ACK or SYN. `None` when the segment is unknown.
    pub answers_data: Option<bool>,
}

/// Since 6.10 the addresses are 28-byte sockaddr blobs and `reason` exists; before, separate
/// port/family/address fields and no reason.
pub fn fields(r: &mut Resolver) -> Fields {
    let mut f = Fields::ABSENT;
    f.skaddr = r.required("skaddr", 8);
    f.skbaddr = r.optional("skbaddr", 8);
    f.state = r.optional("state", 4);
    f.reason = r.optional("reason", 4);
    if r.has("saddr", 28) {
        f.sockaddr_saddr = r.required("saddr", 28);
        f.sockaddr_daddr = r.required("daddr", 28);
    } else {
        f.addr = r.addr();
    }
    f.not_full_states = ["TCP_TIME_WAIT", "TCP_NEW_SYN_RECV"]
        .iter()
        .filter_map(|n| r.format().symbol_value("state", n))
        .filter(|v| *v < 32)
        .fold(0, |m, v| m | 1 << v);
    f
}

pub fn decode(bytes: &[u8], names: &KernelNames) -> Result<ResetSent, DecodeError> {
    let e: Event = read_record("tcp_send_reset", bytes)?;
    Ok(ResetSent {
        meta: Meta::from(&e.header),
        skaddr: e.skaddr,
        conn: Endpoints::from_tuple(&e.tuple),
        state: names.tcp_state(e.state),
        reason: (e.reason != ABSENT_U32).then(|| names.rst_reason(e.reason)),
        answers_syn: answers_syn(e.answered),
        answers_data: answers_data(e.answered, e.answered_payload),
    })
}

#[cfg(test)]
mod tests {
    use drainwatch_common::{EventKind, fields::NO_FIELD};

    use super::*;
    use crate::capture::{
        event::tests::{bytes_of, header, v4_tuple},
        tracefs::tests::fixture,
    };

    #[test]
    fn fields_on_6_18_use_sockaddr_blobs_and_reason() {
        let fmt = fixture("6.18", "tcp_send_reset");
        let mut r = Resolver::new(&fmt);
        let f = fields(&mut r);
        assert_eq!(
            (
                f.skbaddr,
                f.skaddr,
                f.state,
                f.reason,
                f.sockaddr_saddr,
                f.sockaddr_daddr
            ),
            (8, 16, 24, 28, 32, 60)
        );
        assert_eq!(f.addr.sport, NO_FIELD);
        assert!(r.missing_required.is_empty() && r.missing_optional.is_empty());
    }

    #[test]
    fn fields_before_6_10_use_separate_ports_and_miss_the_reason() {
        let fmt = fixture("6.1", "tcp_send_reset");
        let mut r = Resolver::new(&fmt);
        let f = fields(&mut r);
        assert_eq!(f.sockaddr_saddr, NO_FIELD);
        let a = f.addr;
        assert_eq!(
            (
                a.sport, a.dport, a.family, a.saddr, a.daddr, a.saddr_v6, a.daddr_v6
            ),
            (28, 30, 32, 34, 38, 42, 58)
        );
        assert_eq!(f.reason, NO_FIELD);
        assert!(r.missing_required.is_empty());
        assert_eq!(r.missing_optional, ["reason"]);
    }

    #[test]
    fn decodes_a_socketless_reset_with_its_reason() {
        let names = KernelNames {
            rst_reasons: fixture("6.18", "tcp_send_reset").symbols("reason"),
            ..Default::default()
        };
        let e = Event {
            header: header(EventKind::TcpSendReset),
            skaddr: 0,
            tuple: v4_tuple([127, 0, 0, 1], 9, [127, 0, 0, 1], 51000),
            state: -1,
            reason: 1,
            // It answered a SYN.
            answered: drainwatch_common::tcp_send_reset::ANSWERED_READ | 0x02,
            answered_payload: 0,
        };
        let d = decode(&bytes_of(&e), &names).unwrap();
        assert_eq!(d.skaddr, 0);
        assert_eq!(d.answers_syn, Some(true));
        assert_eq!(d.reason.unwrap().name.as_deref(), Some("NO_SOCKET"));
        assert_eq!(d.state, None);
        let conn = d.conn.unwrap();
        assert_eq!(conn.local.to_string(), "127.0.0.1:9");
        assert_eq!(conn.remote.to_string(), "127.0.0.1:51000");
        assert_eq!(
            (d.meta.pid, d.meta.tgid, &*d.meta.comm),
            (1001, 1000, "curl")
        );
    }

    #[test]
    fn reason_is_absent_on_old_kernels() {
        let e = Event {
            header: header(EventKind::TcpSendReset),
            skaddr: 0xffff_8880_0000_1000,
            tuple: v4_tuple([10, 0, 0, 1], 80, [10, 0, 0, 2], 40000),
            state: 1,
            reason: ABSENT_U32,
            answered: 0,
            answered_payload: 0,
        };
        let d = decode(&bytes_of(&e), &KernelNames::default()).unwrap();
        assert_eq!(d.reason, None);
        assert_eq!(d.answers_syn, None);
        assert_eq!(d.state, Some(crate::model::TcpState::Other(1)));
    }

    #[test]
    fn tells_a_time_wait_reset_answering_data_from_one_answering_a_bare_fin() {
        use drainwatch_common::tcp_send_reset::ANSWERED_READ;
        let names = KernelNames {
            rst_reasons: fixture("6.18", "tcp_send_reset").symbols("reason"),
            ..Default::default()
        };
        // What bpftrace saw in the keep-alive lab: a request (PSH|ACK, 18 bytes) at a closed
        // server's time-wait socket; then a client's FIN|ACK with nothing in it.
        let rst = |answered, answered_payload| Event {
            header: header(EventKind::TcpSendReset),
            skaddr: 0xffff_8880_0000_2000,
            tuple: v4_tuple([10, 88, 0, 5], 8080, [10, 88, 0, 1], 45604),
            state: 6,
            reason: 9,
            answered,
            answered_payload,
        };
        let data = decode(&bytes_of(&rst(ANSWERED_READ | 0x18, 18)), &names).unwrap();
        assert_eq!(data.answers_data, Some(true));
        assert_eq!(
            data.reason.unwrap().name.as_deref(),
            Some("TCP_TIMEWAIT_SOCKET")
        );
        let fin = decode(&bytes_of(&rst(ANSWERED_READ | 0x11, 0)), &names).unwrap();
        assert_eq!(fin.answers_data, Some(false));
        let unread = decode(&bytes_of(&rst(0, 0)), &names).unwrap();
        assert_eq!(unread.answers_data, None);
    }
}
