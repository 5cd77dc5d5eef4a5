//! `inet_csk_accept` (kretprobe, or the accept syscall tracepoints): `Accepted`, what its
//! records decode to.

use drainwatch_common::inet_csk_accept::Event;

use crate::capture::event::{DecodeError, Endpoints, KernelNames, Meta, read_record};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    pub meta: Meta,
    pub skaddr: u64,
    pub conn: Option<Endpoints>,
}

pub fn decode(bytes: &[u8], _names: &KernelNames) -> Result<Accepted, DecodeError> {
    let e: Event = read_record("inet_csk_accept", bytes)?;
    Ok(Accepted {
        meta: Meta::from(&e.header),
        skaddr: e.skaddr,
        conn: Endpoints::from_tuple(&e.tuple),
    })
}

#[cfg(test)]
mod tests {
    use drainwatch_common::EventKind;

    use super::*;
    use crate::capture::event::tests::{bytes_of, header, v4_tuple};

    #[test]
    fn decodes_the_accepted_connection() {
        let e = Event {
            header: header(EventKind::InetCskAccept),
            skaddr: 7,
            tuple: v4_tuple([127, 0, 0, 1], 8080, [127, 0, 0, 1], 50123),
        };
        let d = decode(&bytes_of(&e), &KernelNames::default()).unwrap();
        assert_eq!(d.conn.unwrap().remote.port(), 50123);
        assert_eq!(d.skaddr, 7);
    }
}
