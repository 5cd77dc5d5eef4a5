//! `inet_sk_error_report`: an error reported on a TCP socket. Preferred: tp_btf, the socket
//! read with plain loads; fallback: the classic tracepoint, whose record has no socket.

use aya_ebpf::{
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};
use drainwatch_common::{
    EventKind, Tuple,
    inet_sk_error_report::{Event, Fields},
};

use crate::ring::{reserve, submit};
use crate::util::{
    CONFIG, IPPROTO_TCP, Record, btf_inet_sport, btf_sock_netns, btf_sock_tuple, cfg,
    count_filtered, fill_header_sock, ld, out_of_scope, task_netns, tp_tuple, zeroed,
};

/// tp_btf: `inet_sk_error_report(const struct sock *sk)`; the socket read with plain loads,
/// and its own network namespace (the classic record has no socket: the task's is used).
#[btf_tracepoint(function = "inet_sk_error_report")]
pub fn inet_sk_error_report_btf(ctx: BtfTracePointContext) -> i32 {
    if crate::util::attach_only() {
        return 0;
    }
    let sk: *const u8 = ctx.arg(0);
    let k = &CONFIG.kernel;
    if ld::<u16>(sk, cfg(&k.sock_protocol)) != Some(IPPROTO_TCP) {
        return 0;
    }
    if crate::loopback::lean() {
        count_filtered(EventKind::InetSkErrorReport);
        return 0;
    }
    let netns = btf_sock_netns(sk);
    let mut tuple = zeroed::<Tuple>();
    btf_sock_tuple(sk, &mut tuple);
    // A failed connect has given up its port by now (tcp_done runs first).
    if tuple.sport == 0 {
        tuple.sport = btf_inet_sport(sk);
    }
    if out_of_scope(EventKind::InetSkErrorReport, netns, &tuple) {
        return 0;
    }
    let Some(mut entry) = reserve::<Event>(EventKind::InetSkErrorReport) else {
        return 0;
    };
    let ev = unsafe { entry.assume_init_mut() };
    fill_header_sock(&mut ev.header, EventKind::InetSkErrorReport, netns);
    ev.tuple = tuple;
    ev.error = ld::<i32>(sk, cfg(&k.sock_err)).unwrap_or(0);
    ev._pad = 0;
    submit(entry);
    0
}

#[tracepoint]
pub fn inet_sk_error_report(ctx: TracePointContext) -> u32 {
    if crate::util::attach_only() {
        return 0;
    }
    try_inet_sk_error_report(&ctx);
    0
}

fn try_inet_sk_error_report(ctx: &TracePointContext) -> Option<()> {
    let rec = Record::load(ctx, EventKind::InetSkErrorReport);
    let f: Fields = cfg(&CONFIG.inet_sk_error_report);
    if rec.get::<u16>(f.protocol)? != IPPROTO_TCP {
        return None;
    }
    if crate::loopback::lean() {
        count_filtered(EventKind::InetSkErrorReport);
        return None;
    }
    // The format has no socket pointer: the namespace is the current task's, which is the
    // socket owner's only in process context (userspace knows which case it has).
    let netns = task_netns(EventKind::InetSkErrorReport);
    let mut tuple = zeroed::<Tuple>();
    tp_tuple(&rec, &f.addr, &mut tuple);
    if out_of_scope(EventKind::InetSkErrorReport, netns, &tuple) {
        return None;
    }
    let mut entry = reserve::<Event>(EventKind::InetSkErrorReport)?;
    let ev = unsafe { entry.assume_init_mut() };
    fill_header_sock(&mut ev.header, EventKind::InetSkErrorReport, netns);
    ev.tuple = tuple;
    ev.error = rec.get::<i32>(f.error).unwrap_or(0);
    ev._pad = 0;
    submit(entry);
    Some(())
}
