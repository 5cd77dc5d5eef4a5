//! `tcp:tcp_receive_reset`: a RST arrived on a socket. Preferred: tp_btf, the socket read with
//! plain loads; fallback: the classic tracepoint.

use aya_ebpf::{
    helpers::generated::bpf_get_socket_cookie,
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};
use drainwatch_common::{
    EventKind, Tuple,
    tcp_receive_reset::{Event, Fields},
};

use crate::ring::{reserve, submit};
use crate::util::{
    CONFIG, Record, btf_sock_netns, btf_sock_tuple, cfg, fill_header_sock, ld, out_of_scope,
    sock_netns, sock_state, tp_tuple, zeroed,
};

/// tp_btf: `tcp_receive_reset(struct sock *sk)`; the socket read with plain loads.
#[btf_tracepoint(function = "tcp_receive_reset")]
pub fn tcp_receive_reset_btf(ctx: BtfTracePointContext) -> i32 {
    if crate::util::attach_only() {
        return 0;
    }
    let sk: *const u8 = ctx.arg(0);
    let netns = btf_sock_netns(sk);
    let mut tuple = zeroed::<Tuple>();
    btf_sock_tuple(sk, &mut tuple);
    if out_of_scope(EventKind::TcpReceiveReset, netns, &tuple) {
        return 0;
    }
    crate::inet_sock_set_state::emit_held_only(sk as u64, netns, &tuple);
    let Some(mut entry) = reserve::<Event>(EventKind::TcpReceiveReset) else {
        return 0;
    };
    let ev = unsafe { entry.assume_init_mut() };
    fill_header_sock(&mut ev.header, EventKind::TcpReceiveReset, netns);
    ev.skaddr = sk as u64;
    // As the classic record has it: the cookie, assigned on first use.
    ev.sock_cookie = unsafe { bpf_get_socket_cookie(sk as *mut _) };
    ev.tuple = tuple;
    ev.state = ld::<u8>(sk, cfg(&CONFIG.kernel.sock_state)).map_or(-1, i32::from);
    ev._pad = 0;
    submit(entry);
    0
}

#[tracepoint]
pub fn tcp_receive_reset(ctx: TracePointContext) -> u32 {
    if crate::util::attach_only() {
        return 0;
    }
    try_tcp_receive_reset(&ctx);
    0
}

fn try_tcp_receive_reset(ctx: &TracePointContext) -> Option<()> {
    let rec = Record::load(ctx, EventKind::TcpReceiveReset);
    let f: Fields = cfg(&CONFIG.tcp_receive_reset);
    let skaddr = rec.get::<u64>(f.skaddr).unwrap_or(0);
    let netns = sock_netns(EventKind::TcpReceiveReset, skaddr);
    let mut tuple = zeroed::<Tuple>();
    tp_tuple(&rec, &f.addr, &mut tuple);
    if out_of_scope(EventKind::TcpReceiveReset, netns, &tuple) {
        return None;
    }
    let mut entry = reserve::<Event>(EventKind::TcpReceiveReset)?;
    let ev = unsafe { entry.assume_init_mut() };
    fill_header_sock(&mut ev.header, EventKind::TcpReceiveReset, netns);
    ev.skaddr = skaddr;
    ev.sock_cookie = rec.get::<u64>(f.sock_cookie).unwrap_or(0);
    ev.tuple = tuple;
    ev.state = sock_state(EventKind::TcpReceiveReset, skaddr);
    ev._pad = 0;
    submit(entry);
    Some(())
}
