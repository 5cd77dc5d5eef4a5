//! `tcp:tcp_receive_reset`: the format fields its program reads, and `ResetReceived`, what
//! its records decode to.

use drainwatch_common::tcp_receive_reset::{Event, Fields};

use crate::capture::{
    event::{DecodeError, Endpoints, KernelNames, Meta, TcpState, read_record},
    tracefs::Resolver,
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResetReceived {
    pub meta: Meta,
    pub skaddr: u64,
    pub sock_cookie: u64,
    pub conn: Option<Endpoints>,
    pub state: Option<TcpState>,
}

pub fn fields(r: &mut Resolver) -> Fields {
    let mut f = Fields::ABSENT;
    f.skaddr = r.required("skaddr", 8);
    f.addr = r.addr();
    f.sock_cookie = r.optional("sock_cookie", 8);
    f
}

pub fn decode(bytes: &[u8], names: &KernelNames) -> Result<ResetReceived, DecodeError> {
    let e: Event = read_record("tcp_receive_reset", bytes)?;
    Ok(ResetReceived {
        meta: Meta::from(&e.header),
        skaddr: e.skaddr,
        sock_cookie: e.sock_cookie,
        conn: Endpoints::from_tuple(&e.tuple),
        state: names.tcp_state(e.state),
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
        let fmt = fixture("6.18", "tcp_receive_reset");
        let mut r = Resolver::new(&fmt);
        let f = fields(&mut r);
        assert_eq!(
            (
                f.skaddr,
                f.addr.sport,
                f.addr.dport,
                f.addr.family,
                f.addr.saddr,
                f.addr.daddr,
                f.addr.saddr_v6,
                f.addr.daddr_v6,
                f.sock_cookie
            ),
            (8, 16, 18, 20, 22, 26, 30, 46, 64)
        );
        assert!(r.missing_required.is_empty() && r.missing_optional.is_empty());
    }

    #[test]
    fn decodes_state_by_this_kernels_names() {
        let names = KernelNames {
            tcp_states: fixture("6.18", "inet_sock_set_state").symbols("newstate"),
            ..Default::default()
        };
        let e = Event {
            header: header(EventKind::TcpReceiveReset),
            skaddr: 0xffff_8880_0000_2000,
            sock_cookie: 77,
            tuple: v4_tuple([127, 0, 0, 1], 51000, [127, 0, 0, 1], 9),
            state: 2,
            _pad: 0,
        };
        let d = decode(&bytes_of(&e), &names).unwrap();
        assert_eq!(d.state.unwrap().name(), Some("TCP_SYN_SENT"));
        assert_eq!(d.sock_cookie, 77);
        assert_eq!(d.conn.unwrap().remote.port(), 9);
    }
}
