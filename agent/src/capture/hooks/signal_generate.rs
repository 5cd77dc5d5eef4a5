//! `signal:signal_generate`: the format fields its program reads, and `Signal`, what its
//! records decode to.

use drainwatch_common::signal_generate::{Event, Fields};

use crate::capture::{
    event::{DecodeError, KernelNames, Meta, c_string, read_record},
    tracefs::Resolver,
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signal {
    /// The sender.
    pub meta: Meta,
    pub sig: i32,
    pub target_pid: i32,
    pub target_comm: String,
    pub group: bool,
    pub result: Delivery,
}

/// What the kernel did with the signal: `signal_generate`'s `result`, the kernel's
/// `enum trace_signal_result` (include/trace/events/signal.h; the format prints it as a bare
/// number, so the numbering is the header's, unchanged since 3.x).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// `TRACE_SIGNAL_DELIVERED`, and `ALREADY_PENDING` (an earlier one will be).
    Delivered,
    /// `TRACE_SIGNAL_IGNORED`: dropped, the target ignores it (`SIG_IGN`, or a namespace's
    /// init without a handler).
    Ignored,
    /// Queue overflow or lost info, or a kernel without the field: not known to be ignored.
    Unknown,
}

impl Delivery {
    fn from_result(result: i32) -> Self {
        match result {
            0 | 2 => Delivery::Delivered,
            1 => Delivery::Ignored,
            _ => Delivery::Unknown,
        }
    }
}

pub fn fields(r: &mut Resolver) -> Fields {
    let mut f = Fields::ABSENT;
    f.sig = r.required("sig", 4);
    f.pid = r.required("pid", 4);
    f.comm = r.optional("comm", 16);
    f.code = r.optional("code", 4);
    f.group = r.optional("group", 4);
    f.result = r.optional("result", 4);
    f
}

pub fn decode(bytes: &[u8], _names: &KernelNames) -> Result<Signal, DecodeError> {
    let e: Event = read_record("signal_generate", bytes)?;
    Ok(Signal {
        meta: Meta::from(&e.header),
        sig: e.sig,
        target_pid: e.target_pid,
        target_comm: c_string(&e.target_comm),
        group: e.group == 1,
        result: Delivery::from_result(e.result),
    })
}

#[cfg(test)]
mod tests {
    use drainwatch_common::EventKind;

    use super::*;
    use crate::capture::{
        event::tests::{bytes_of, header},
        tracefs::tests::fixture,
    };

    #[test]
    fn fields_on_6_18() {
        let fmt = fixture("6.18", "signal_generate");
        let mut r = Resolver::new(&fmt);
        let f = fields(&mut r);
        assert_eq!(
            (f.sig, f.code, f.comm, f.pid, f.group, f.result),
            (8, 16, 20, 36, 40, 44)
        );
        assert!(r.missing_required.is_empty() && r.missing_optional.is_empty());
    }

    #[test]
    fn decodes_sigterm_sender_and_target() {
        let mut target_comm = [0u8; 16];
        target_comm[..6].copy_from_slice(b"server");
        let e = Event {
            header: header(EventKind::SignalGenerate),
            sig: 15,
            target_pid: 4242,
            group: 1,
            result: 0,
            code: 0,
            _pad: 0,
            target_comm,
        };
        let d = decode(&bytes_of(&e), &KernelNames::default()).unwrap();
        assert_eq!(
            (d.sig, d.target_pid, d.target_comm.as_str(), d.group),
            (15, 4242, "server", true)
        );
        assert_eq!(d.meta.tgid, 1000);
        assert_eq!(d.result, Delivery::Delivered);
    }

    #[test]
    fn the_kernels_result_numbering() {
        // The eBPF side writes -1 where the kernel lacks the field.
        let got: Vec<Delivery> = [0, 1, 2, 3, 4, -1]
            .into_iter()
            .map(Delivery::from_result)
            .collect();
        use Delivery::*;
        assert_eq!(
            got,
            [Delivered, Ignored, Delivered, Unknown, Unknown, Unknown]
        );
    }
}
