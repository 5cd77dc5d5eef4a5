//! `sock:inet_sk_error_report`: the format fields its program reads, and `SocketError`, what
//! its records decode to.

use drainwatch_common::inet_sk_error_report::{Event, Fields};

use crate::capture::{
    event::{DecodeError, Endpoints, KernelNames, Meta, read_record},
    tracefs::Resolver,
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketError {
    pub meta: Meta,
    pub conn: Option<Endpoints>,
    /// Positive errno, e.g. 111 ECONNREFUSED.
    pub errno: i32,
}

pub fn fields(r: &mut Resolver) -> Fields {
    let mut f = Fields::ABSENT;
    f.error = r.required("error", 4);
    f.protocol = r.required("protocol", 2);
    f.addr = r.addr();
    f
}

pub fn decode(bytes: &[u8], _names: &KernelNames) -> Result<SocketError, DecodeError> {
    let e: Event = read_record("inet_sk_error_report", bytes)?;
    Ok(SocketError {
        meta: Meta::from(&e.header),
        conn: Endpoints::from_tuple(&e.tuple),
        errno: e.error,
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
        let fmt = fixture("6.18", "inet_sk_error_report");
        let mut r = Resolver::new(&fmt);
        let f = fields(&mut r);
        assert_eq!(
            (
                f.error,
                f.addr.sport,
                f.addr.dport,
                f.addr.family,
                f.protocol,
                f.addr.saddr,
                f.addr.daddr
            ),
            (8, 12, 14, 16, 18, 20, 24)
        );
        assert!(r.missing_required.is_empty());
    }

    #[test]
    fn decodes_connection_refused() {
        let e = Event {
            header: header(EventKind::InetSkErrorReport),
            tuple: v4_tuple([127, 0, 0, 1], 51000, [127, 0, 0, 1], 9),
            error: 111,
            _pad: 0,
        };
        let d = decode(&bytes_of(&e), &KernelNames::default()).unwrap();
        assert_eq!(d.errno, 111);
        assert_eq!(d.conn.unwrap().local.port(), 51000);
    }
}
