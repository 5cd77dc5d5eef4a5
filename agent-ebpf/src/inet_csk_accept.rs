//! `inet_csk_accept` returned (kretprobe): a connection left a listener's accept queue. Also
//! `emit_accepted`, which the accept syscall tracepoints (`sys_exit_accept`) share.

use aya_ebpf::{macros::kretprobe, programs::RetProbeContext};
use drainwatch_common::{EventKind, Tuple, inet_csk_accept::Event};

use crate::ring::{reserve, submit};
use crate::{
    sock_head::sock_netns_tuple,
    util::{fill_header_task, out_of_scope, zeroed},
};

/// Needs kprobes: where they are missing the plan falls back to the accept syscall tracepoints.
#[kretprobe]
pub fn kretprobe_inet_csk_accept(ctx: RetProbeContext) -> u32 {
    if crate::util::attach_only() {
        return 0;
    }
    let sk = ctx.ret::<*const u8>() as u64;
    if sk != 0 {
        emit_accepted(sk);
    }
    0
}

/// Reports that accept() handed `sk` to the application (both accept hooks use it).
#[inline(always)]
pub fn emit_accepted(sk: u64) -> Option<()> {
    // A held connection's accept waits with its arrival (`hold`): no record, and no read of
    // the socket (it was in scope when it arrived).
    if crate::hold::on() && crate::hold::accept(sk) {
        return None;
    }
    let mut tuple = zeroed::<Tuple>();
    let netns = sock_netns_tuple(EventKind::InetCskAccept, sk, &mut tuple);
    if out_of_scope(EventKind::InetCskAccept, netns, &tuple) {
        return None;
    }
    crate::storm_answers::on_accept(sk, netns.inum, tuple.sport);
    let mut entry = reserve::<Event>(EventKind::InetCskAccept)?;
    let ev = unsafe { entry.assume_init_mut() };
    // No cgroup or command: the agent reads an accept by its socket and time only, so the two
    // helper calls that fetch them are saved.
    fill_header_task(&mut ev.header, EventKind::InetCskAccept, netns, false);
    ev.skaddr = sk;
    ev.tuple = tuple;
    submit(entry);
    Some(())
}
