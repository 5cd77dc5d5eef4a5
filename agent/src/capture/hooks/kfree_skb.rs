//! `skb:kfree_skb`: the format fields (and the drop reason to keep) its program uses, and
//! `ListenOverflow`, what its records decode to.

use std::net::SocketAddr;

use drainwatch_common::kfree_skb::{Event, Fields};

use crate::capture::{
    event::{DecodeError, Endpoints, KernelNames, Meta, Named, read_record},
    tracefs::Resolver,
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenOverflow {
    pub meta: Meta,
    /// The listener's address, when the kernel passed the listening socket.
    pub listener: Option<SocketAddr>,
    pub reason: Named,
}

/// The program keeps one drop reason; its number comes from this kernel's symbol table, and
/// without it the hook cannot work (`reason` then counts as missing).
pub fn fields(r: &mut Resolver) -> Fields {
    let mut f = Fields::ABSENT;
    f.reason = r.required("reason", 4);
    f.skbaddr = r.optional("skbaddr", 8);
    f.rx_sk = r.optional("rx_sk", 8);
    f.protocol = r.optional("protocol", 2);
    match r.format().symbol_value("reason", "TCP_LISTEN_OVERFLOW") {
        Some(v) => f.listen_overflow = v as u32,
        None => r.missing_required.push("reason=TCP_LISTEN_OVERFLOW".into()),
    }
    f
}

/// The reason the kprobe fallback writes: kernels that need it have no number for the drop
/// (`kfree_skb.rs` in the eBPF crate), but every record it makes is a listen overflow.
pub const INFERRED: u32 = u32::MAX;

pub fn decode(bytes: &[u8], names: &KernelNames) -> Result<ListenOverflow, DecodeError> {
    let e: Event = read_record("kfree_skb", bytes)?;
    let reason = if e.reason == INFERRED {
        Named {
            value: INFERRED,
            name: Some("TCP_LISTEN_OVERFLOW".into()),
        }
    } else {
        names.drop_reason(e.reason)
    };
    Ok(ListenOverflow {
        meta: Meta::from(&e.header),
        listener: Endpoints::from_tuple(&e.tuple).map(|c| c.local),
        reason,
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
    fn fields_on_6_18_find_the_listen_overflow_number() {
        let fmt = fixture("6.18", "kfree_skb");
        let mut r = Resolver::new(&fmt);
        let f = fields(&mut r);
        assert_eq!(
            (f.skbaddr, f.rx_sk, f.protocol, f.reason, f.listen_overflow),
            (8, 24, 32, 36, 40)
        );
        assert!(r.missing_required.is_empty());
    }

    #[test]
    fn a_format_without_the_reason_symbol_is_unusable() {
        let fmt = crate::capture::tracefs::Format::parse(
            "name: kfree_skb\nformat:\n\tfield:enum skb_drop_reason reason;\toffset:36;\tsize:4;\tsigned:0;\n",
        )
        .unwrap();
        let mut r = Resolver::new(&fmt);
        fields(&mut r);
        assert_eq!(r.missing_required, ["reason=TCP_LISTEN_OVERFLOW"]);
    }

    #[test]
    fn decodes_the_listener() {
        let names = KernelNames {
            drop_reasons: fixture("6.18", "kfree_skb").symbols("reason"),
            ..Default::default()
        };
        let e = Event {
            header: header(EventKind::KfreeSkb),
            skbaddr: 5,
            rx_sk: 6,
            tuple: v4_tuple([10, 88, 0, 5], 8080, [0; 4], 0),
            reason: 40,
            protocol: 0x0800,
        };
        let d = decode(&bytes_of(&e), &names).unwrap();
        assert_eq!(d.listener.unwrap().to_string(), "10.88.0.5:8080");
        assert_eq!(d.reason.to_string(), "TCP_LISTEN_OVERFLOW");
        // The kprobe fallback's records, on a kernel with no number for the reason.
        let kprobe = Event {
            reason: INFERRED,
            ..e
        };
        let d = decode(&bytes_of(&kprobe), &KernelNames::default()).unwrap();
        assert_eq!(d.reason.name.as_deref(), Some("TCP_LISTEN_OVERFLOW"));
        assert_eq!(d.listener.unwrap().to_string(), "10.88.0.5:8080");
    }
}
