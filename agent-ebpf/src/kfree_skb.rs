//! `kfree_skb`, kept only for one drop reason (`TCP_LISTEN_OVERFLOW`, numbered by this kernel):
//! tp_btf on 6.11+ (the listener passed as `rx_sk`), the classic tracepoint elsewhere; on
//! kernels without that drop reason, kprobes on the functions that make the drop.

use aya_ebpf::{
    macros::{btf_tracepoint, kprobe, tracepoint},
    programs::{BtfTracePointContext, ProbeContext, TracePointContext},
};
use drainwatch_common::{
    EventKind, Tuple,
    kfree_skb::{Event, Fields},
};

use crate::ring::{reserve, submit};
use crate::util::{
    CONFIG, Ns, Record, btf_net, btf_sock_netns, btf_sock_tuple, cfg, fill_header_sock, kread, ld,
    skb_netns, sock_netns, sock_tuple, zeroed,
};

/// tp_btf, 6.11+: `kfree_skb(struct sk_buff *skb, void *location, enum skb_drop_reason reason,
/// struct sock *rx_sk)`.
#[btf_tracepoint(function = "kfree_skb")]
pub fn kfree_skb_btf(ctx: BtfTracePointContext) -> i32 {
    if crate::util::attach_only() {
        return 0;
    }
    let reason: u32 = ctx.arg(2);
    // Every freed packet passes here: leave before anything else.
    if reason != cfg(&CONFIG.kfree_skb.listen_overflow) {
        return 0;
    }
    let skb: *const u8 = ctx.arg(0);
    let rx_sk: *const u8 = ctx.arg(3);
    let k = &CONFIG.kernel;
    let mut tuple = zeroed::<Tuple>();
    // Either may be NULL (the verifier insists on the checks before any arithmetic).
    let netns = if !rx_sk.is_null() {
        btf_sock_tuple(rx_sk, &mut tuple);
        btf_sock_netns(rx_sk)
    } else if !skb.is_null() {
        ld::<*const u8>(skb, cfg(&k.skb_dev))
            .filter(|dev| !dev.is_null())
            .and_then(|dev| ld::<*const u8>(dev, cfg(&k.net_device_nd_net)))
            .filter(|net| !net.is_null())
            .map_or(Ns::UNKNOWN, btf_net)
    } else {
        Ns::UNKNOWN
    };
    let protocol = if skb.is_null() {
        0
    } else {
        ld::<u16>(skb, cfg(&k.skb_protocol)).map_or(0, |p| u32::from(u16::from_be(p)))
    };
    let Some(mut entry) = reserve::<Event>(EventKind::KfreeSkb) else {
        return 0;
    };
    let ev = unsafe { entry.assume_init_mut() };
    fill_header_sock(&mut ev.header, EventKind::KfreeSkb, netns);
    ev.skbaddr = skb as u64;
    ev.rx_sk = rx_sk as u64;
    ev.tuple = tuple;
    ev.reason = reason;
    ev.protocol = protocol;
    submit(entry);
    0
}

#[tracepoint]
pub fn kfree_skb(ctx: TracePointContext) -> u32 {
    if crate::util::attach_only() {
        return 0;
    }
    try_kfree_skb(&ctx);
    0
}

fn try_kfree_skb(ctx: &TracePointContext) -> Option<()> {
    let rec = Record::load(ctx, EventKind::KfreeSkb);
    let f: Fields = cfg(&CONFIG.kfree_skb);
    // Hot path: every freed packet passes here; leave before doing anything else.
    let reason = rec.get::<u32>(f.reason)?;
    if reason != f.listen_overflow {
        return None;
    }
    let skbaddr = rec.get::<u64>(f.skbaddr).unwrap_or(0);
    let rx_sk = rec.get::<u64>(f.rx_sk).unwrap_or(0);
    let netns = if rx_sk != 0 {
        sock_netns(EventKind::KfreeSkb, rx_sk)
    } else {
        skb_netns(EventKind::KfreeSkb, skbaddr)
    };
    let mut entry = reserve::<Event>(EventKind::KfreeSkb)?;
    let ev = unsafe { entry.assume_init_mut() };
    fill_header_sock(&mut ev.header, EventKind::KfreeSkb, netns);
    ev.skbaddr = skbaddr;
    ev.rx_sk = rx_sk;
    ev.tuple = zeroed::<Tuple>();
    sock_tuple(EventKind::KfreeSkb, rx_sk, &mut ev.tuple);
    ev.reason = reason;
    ev.protocol = rec.get::<u16>(f.protocol).map_or(0, u32::from);
    submit(entry);
    Some(())
}

/// Kernels before the `TCP_LISTEN_OVERFLOW` drop reason (5.10, 6.1, 6.12 among them): the
/// listener's accept queue checked where the kernel checks it. `tcp_v4_syn_recv_sock(sk, skb,
/// …)` makes a completed handshake's socket; its first statement is `if
/// (sk_acceptq_is_full(sk)) goto exit_overflow;` (`sk_ack_backlog > sk_max_ack_backlog`),
/// which counts `ListenOverflows` and drops the handshake. Read at entry, the same comparison
/// says whether this call is that drop. The reason is written as `u32::MAX`, which the decoder
/// names `TCP_LISTEN_OVERFLOW`: no number exists on these kernels.
#[kprobe]
pub fn kprobe_tcp_v4_syn_recv_sock(ctx: ProbeContext) -> u32 {
    if crate::util::attach_only() {
        return 0;
    }
    syn_recv_sock(&ctx, false);
    0
}

/// `tcp_v6_syn_recv_sock` hands an IPv4 packet (a v4-mapped connection to an IPv6 listener)
/// to `tcp_v4_syn_recv_sock`, which reports it: such calls are skipped here.
#[kprobe]
pub fn kprobe_tcp_v6_syn_recv_sock(ctx: ProbeContext) -> u32 {
    if crate::util::attach_only() {
        return 0;
    }
    syn_recv_sock(&ctx, true);
    0
}

const ETH_P_IP: u16 = 0x0800;

#[inline(always)]
fn syn_recv_sock(ctx: &ProbeContext, v6: bool) -> Option<()> {
    const KIND: EventKind = EventKind::KfreeSkb;
    let k = &CONFIG.kernel;
    let sk = ctx.arg::<*const u8>(0).map_or(0, |p| p as u64);
    let skb = ctx.arg::<*const u8>(1).map_or(0, |p| p as u64);
    let backlog = kread::<u32>(KIND, sk, cfg(&k.sock_ack_backlog))?;
    let max = kread::<u32>(KIND, sk, cfg(&k.sock_max_ack_backlog))?;
    if backlog <= max {
        return None;
    }
    let protocol = kread::<u16>(KIND, skb, cfg(&k.skb_protocol)).map_or(0, u16::from_be);
    if v6 && protocol == ETH_P_IP {
        return None;
    }
    let netns = sock_netns(KIND, sk);
    let mut entry = reserve::<Event>(KIND)?;
    let ev = unsafe { entry.assume_init_mut() };
    fill_header_sock(&mut ev.header, KIND, netns);
    ev.skbaddr = skb;
    ev.rx_sk = sk;
    ev.tuple = zeroed::<Tuple>();
    sock_tuple(KIND, sk, &mut ev.tuple);
    ev.reason = u32::MAX;
    ev.protocol = u32::from(protocol);
    submit(entry);
    Some(())
}
