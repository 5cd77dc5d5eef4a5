use aya_ebpf::{macros::kretprobe, programs::RetProbeContext};
use drainwatch_common::{EventKind, Tuple, inet_csk_accept::Event};

use crate::util::{fill_header, reserve, sock_netns, sock_tuple};

/// Needs kprobes: where they are missing the agent reports accept wait as unavailable.
#[kretprobe]
pub fn kretprobe_inet_csk_accept(ctx: RetProbeContext) -> u32 {
    try_inet_csk_accept(&ctx);
    0
}

fn try_inet_csk_accept(ctx: &RetProbeContext) -> Option<()> {
    let sk = ctx.ret::<*const u8>() as u64;
    if sk == 0 {
        return None;
    }
    let mut entry = reserve::<Event>(EventKind::InetCskAccept)?;
    let ev = unsafe { entry.assume_init_mut() };
    fill_header(&mut ev.header, EventKind::InetCskAccept, sock_netns(sk));
    ev.skaddr = sk;
    ev.tuple = Tuple::default();
    sock_tuple(sk, &mut ev.tuple);
    entry.submit(0);
    Some(())
}
