use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use drainwatch_common::{
    EventKind, Tuple,
    inet_sock_set_state::{Event, Fields},
};

use crate::util::{
    CONFIG, IPPROTO_TCP, Record, cfg, fill_header_task, kread, out_of_scope, reserve, sock_netns,
    submit, tp_tuple,
};

/// Whether `state` has its bit in `mask` (states outside 0..32 pass: no filter can name them).
#[inline(always)]
fn in_mask(mask: u32, state: i32) -> bool {
    !(0..32).contains(&state) || mask & (1 << state) != 0
}

#[tracepoint]
pub fn inet_sock_set_state(ctx: TracePointContext) -> u32 {
    try_inet_sock_set_state(&ctx);
    0
}

fn try_inet_sock_set_state(ctx: &TracePointContext) -> Option<()> {
    let rec = Record::load(ctx);
    let f: Fields = cfg(&CONFIG.inet_sock_set_state);
    if rec.get::<u16>(f.protocol)? != IPPROTO_TCP {
        return None;
    }
    let oldstate = rec.get::<i32>(f.oldstate).unwrap_or(-1);
    let newstate = rec.get::<i32>(f.newstate).unwrap_or(-1);
    if !in_mask(f.emit_old, oldstate) {
        return None;
    }
    let skaddr = rec.get::<u64>(f.skaddr).unwrap_or(0);
    let netns = sock_netns(skaddr);
    let mut tuple = Tuple::default();
    tp_tuple(&rec, &f.addr, &mut tuple);
    let listener = in_mask(f.backlog_new, newstate)
        || (in_mask(f.backlog_new, oldstate) && in_mask(f.listener_closed_new, newstate));
    if !listener && out_of_scope(EventKind::InetSockSetState, netns, &tuple) {
        return None;
    }
    let mut entry = reserve::<Event>(EventKind::InetSockSetState)?;
    let ev = unsafe { entry.assume_init_mut() };
    fill_header_task(
        &mut ev.header,
        EventKind::InetSockSetState,
        netns,
        in_mask(f.task_new, newstate),
    );
    ev.skaddr = skaddr;
    ev.tuple = tuple;
    ev.oldstate = oldstate;
    ev.newstate = newstate;
    let k = &CONFIG.kernel;
    // Helper calls are most of a program's cost: only the transitions that need the
    // counters (a connection leaving ESTABLISHED or CLOSE_WAIT) read them.
    if in_mask(f.counters_old, oldstate) {
        ev.bytes_received = kread::<u64>(skaddr, cfg(&k.tcp_bytes_received)).unwrap_or(0);
        ev.bytes_sent = kread::<u64>(skaddr, cfg(&k.tcp_bytes_sent)).unwrap_or(0);
        ev.rcv_nxt = kread::<u32>(skaddr, cfg(&k.tcp_rcv_nxt)).unwrap_or(0);
        ev.copied_seq = kread::<u32>(skaddr, cfg(&k.tcp_copied_seq)).unwrap_or(0);
        ev.lrcvtime = kread::<u32>(skaddr, cfg(&k.tcp_lrcvtime)).unwrap_or(0);
        ev.lsndtime = kread::<u32>(skaddr, cfg(&k.tcp_lsndtime)).unwrap_or(0);
    } else {
        ev.bytes_received = 0;
        ev.bytes_sent = 0;
        ev.rcv_nxt = 0;
        ev.copied_seq = 0;
        ev.lrcvtime = 0;
        ev.lsndtime = 0;
    }
    // listen() sets the limit before the socket enters LISTEN.
    ev.max_ack_backlog = if in_mask(f.backlog_new, newstate) {
        kread::<u32>(skaddr, cfg(&k.sock_max_ack_backlog)).unwrap_or(0)
    } else {
        0
    };
    ev._pad = 0;
    submit(entry);
    Some(())
}
