use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use drainwatch_common::{
    EventKind, Tuple,
    inet_sock_set_state::{Event, Fields},
};

use crate::util::{
    CONFIG, IPPROTO_TCP, cfg, field, fill_header, kread, reserve, sock_netns, tp_tuple,
};

#[tracepoint]
pub fn inet_sock_set_state(ctx: TracePointContext) -> u32 {
    try_inet_sock_set_state(&ctx);
    0
}

fn try_inet_sock_set_state(ctx: &TracePointContext) -> Option<()> {
    let f: Fields = cfg(&CONFIG.inet_sock_set_state);
    if field::<u16>(ctx, f.protocol)? != IPPROTO_TCP {
        return None;
    }
    let skaddr = field::<u64>(ctx, f.skaddr).unwrap_or(0);
    let mut entry = reserve::<Event>(EventKind::InetSockSetState)?;
    let ev = unsafe { entry.assume_init_mut() };
    fill_header(
        &mut ev.header,
        EventKind::InetSockSetState,
        sock_netns(skaddr),
    );
    ev.skaddr = skaddr;
    ev.tuple = Tuple::default();
    tp_tuple(ctx, &f.addr, &mut ev.tuple);
    ev.oldstate = field::<i32>(ctx, f.oldstate).unwrap_or(-1);
    ev.newstate = field::<i32>(ctx, f.newstate).unwrap_or(-1);
    let k = &CONFIG.kernel;
    ev.bytes_received = kread::<u64>(skaddr, cfg(&k.tcp_bytes_received)).unwrap_or(0);
    ev.bytes_sent = kread::<u64>(skaddr, cfg(&k.tcp_bytes_sent)).unwrap_or(0);
    ev.rcv_nxt = kread::<u32>(skaddr, cfg(&k.tcp_rcv_nxt)).unwrap_or(0);
    ev.copied_seq = kread::<u32>(skaddr, cfg(&k.tcp_copied_seq)).unwrap_or(0);
    ev.lrcvtime = kread::<u32>(skaddr, cfg(&k.tcp_lrcvtime)).unwrap_or(0);
    ev.lsndtime = kread::<u32>(skaddr, cfg(&k.tcp_lsndtime)).unwrap_or(0);
    // listen() sets the limit before the socket enters LISTEN; userspace keeps it only for
    // that transition (state numbers come from the format, not from here).
    ev.max_ack_backlog = kread::<u32>(skaddr, cfg(&k.sock_max_ack_backlog)).unwrap_or(0);
    ev._pad = 0;
    entry.submit(0);
    Some(())
}
