use aya_ebpf::{
    macros::{kprobe, tracepoint},
    programs::{ProbeContext, TracePointContext},
};
use drainwatch_common::{
    ABSENT_U32, AF_INET6, EventKind, Tuple,
    config::NO_FIELD,
    tcp_send_reset::{Event, Fields},
};

use crate::util::{
    CONFIG, Record, cfg, fill_header, out_of_scope, reserve, skb_netns, sock_netns, sock_state,
    sock_tuple, submit, tp_tuple,
};

#[tracepoint]
pub fn tcp_send_reset(ctx: TracePointContext) -> u32 {
    try_tcp_send_reset(&ctx);
    0
}

/// Decodes a `sockaddr_in`/`sockaddr_in6` blob (6.10+ layout): family, port (network order),
/// then the IPv4 address at 4 or the IPv6 address at 8.
#[inline(always)]
fn sockaddr(blob: &[u8; 28], family: &mut u16, port: &mut u16, addr: &mut [u8; 16]) {
    *family = u16::from_ne_bytes([blob[0], blob[1]]);
    *port = u16::from_be_bytes([blob[2], blob[3]]);
    if *family == AF_INET6 {
        addr.copy_from_slice(&blob[8..24]);
    } else {
        addr[..4].copy_from_slice(&blob[4..8]);
    }
}

fn try_tcp_send_reset(ctx: &TracePointContext) -> Option<()> {
    let rec = Record::load(ctx);
    let f: Fields = cfg(&CONFIG.tcp_send_reset);
    let skaddr = rec.get::<u64>(f.skaddr).unwrap_or(0);
    let netns = if skaddr != 0 {
        sock_netns(skaddr)
    } else {
        rec.get::<u64>(f.skbaddr).map_or(0, skb_netns)
    };
    let mut tuple = Tuple::default();
    if f.sockaddr_saddr != NO_FIELD {
        let t = &mut tuple;
        let mut dfamily = 0;
        if let Some(s) = rec.get::<[u8; 28]>(f.sockaddr_saddr) {
            sockaddr(&s, &mut t.family, &mut t.sport, &mut t.saddr);
        }
        if let Some(d) = rec.get::<[u8; 28]>(f.sockaddr_daddr) {
            sockaddr(&d, &mut dfamily, &mut t.dport, &mut t.daddr);
        }
    } else {
        tp_tuple(&rec, &f.addr, &mut tuple);
    }
    if out_of_scope(EventKind::TcpSendReset, netns, &tuple) {
        return None;
    }
    let mut entry = reserve::<Event>(EventKind::TcpSendReset)?;
    let ev = unsafe { entry.assume_init_mut() };
    fill_header(&mut ev.header, EventKind::TcpSendReset, netns);
    ev.skaddr = skaddr;
    ev.tuple = tuple;
    ev.state = if skaddr == 0 {
        -1
    } else {
        rec.get::<i32>(f.state).unwrap_or(-1)
    };
    ev.reason = rec.get::<u32>(f.reason).unwrap_or(ABSENT_U32);
    submit(entry);
    Some(())
}

/// Fallback for kernels whose tracepoint misses socket-less resets: the first argument of
/// `tcp_v4_send_reset`, `tcp_v6_send_reset` and `tcp_send_active_reset` is the socket (NULL
/// when none matched), the second of the first two the packet answered. No reason here.
#[inline(always)]
fn probe_send_reset(ctx: &ProbeContext, has_skb: bool) -> Option<()> {
    let sk: u64 = ctx.arg::<*const u8>(0).map_or(0, |p| p as u64);
    let netns = if sk != 0 {
        sock_netns(sk)
    } else if has_skb {
        ctx.arg::<*const u8>(1).map_or(0, |p| skb_netns(p as u64))
    } else {
        0
    };
    let mut tuple = Tuple::default();
    sock_tuple(sk, &mut tuple);
    if out_of_scope(EventKind::TcpSendReset, netns, &tuple) {
        return None;
    }
    let mut entry = reserve::<Event>(EventKind::TcpSendReset)?;
    let ev = unsafe { entry.assume_init_mut() };
    fill_header(&mut ev.header, EventKind::TcpSendReset, netns);
    ev.skaddr = sk;
    ev.tuple = tuple;
    ev.state = if sk == 0 { -1 } else { sock_state(sk) };
    ev.reason = ABSENT_U32;
    submit(entry);
    Some(())
}

#[kprobe]
pub fn kprobe_tcp_v4_send_reset(ctx: ProbeContext) -> u32 {
    probe_send_reset(&ctx, true);
    0
}

#[kprobe]
pub fn kprobe_tcp_v6_send_reset(ctx: ProbeContext) -> u32 {
    probe_send_reset(&ctx, true);
    0
}

#[kprobe]
pub fn kprobe_tcp_send_active_reset(ctx: ProbeContext) -> u32 {
    probe_send_reset(&ctx, false);
    0
}
