use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use drainwatch_common::{
    EventKind, Tuple,
    tcp_receive_reset::{Event, Fields},
};

use crate::util::{
    CONFIG, Record, cfg, fill_header, out_of_scope, reserve, sock_netns, sock_state, submit,
    tp_tuple,
};

#[tracepoint]
pub fn tcp_receive_reset(ctx: TracePointContext) -> u32 {
    try_tcp_receive_reset(&ctx);
    0
}

fn try_tcp_receive_reset(ctx: &TracePointContext) -> Option<()> {
    let rec = Record::load(ctx);
    let f: Fields = cfg(&CONFIG.tcp_receive_reset);
    let skaddr = rec.get::<u64>(f.skaddr).unwrap_or(0);
    let netns = sock_netns(skaddr);
    let mut tuple = Tuple::default();
    tp_tuple(&rec, &f.addr, &mut tuple);
    if out_of_scope(EventKind::TcpReceiveReset, netns, &tuple) {
        return None;
    }
    let mut entry = reserve::<Event>(EventKind::TcpReceiveReset)?;
    let ev = unsafe { entry.assume_init_mut() };
    fill_header(&mut ev.header, EventKind::TcpReceiveReset, netns);
    ev.skaddr = skaddr;
    ev.sock_cookie = rec.get::<u64>(f.sock_cookie).unwrap_or(0);
    ev.tuple = tuple;
    ev.state = sock_state(skaddr);
    ev._pad = 0;
    submit(entry);
    Some(())
}
