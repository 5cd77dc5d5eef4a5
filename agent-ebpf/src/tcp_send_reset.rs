//! `tcp:tcp_send_reset`: this host sent a RST. Preferred: tp_btf (6.10+), the socket read with
//! plain loads and a socket-less RST's tuple from the packet it answers; fallbacks: the classic
//! tracepoint, then kprobes on the functions that send resets.

use aya_ebpf::{
    helpers::bpf_probe_read_kernel,
    macros::{btf_tracepoint, kprobe, tracepoint},
    programs::{BtfTracePointContext, ProbeContext, TracePointContext},
};
use drainwatch_common::{
    ABSENT_U32, AF_INET, AF_INET6, EventKind, Tuple,
    faults::FaultKind,
    fields::NO_FIELD,
    tcp_send_reset::{ANSWERED_READ, Event, Fields},
};

use crate::ring::{reserve, submit};
use crate::{
    fault::fault,
    util::{
        CONFIG, Ns, Record, btf_inet_sport, btf_net, btf_sock_netns, btf_sock_tuple, cfg,
        fill_header_sock, kread, ld, out_of_scope, skb_netns, sock_netns, sock_state, sock_tuple,
        tp_tuple, zeroed,
    },
};

/// tp_btf, 6.10+: `tcp_send_reset(const struct sock *sk, const struct sk_buff *skb, enum
/// sk_rst_reason reason)`. The tuple as the classic record has it: from a full socket, else
/// reversed from the packet answered (`skb->data` is its TCP header then).
#[btf_tracepoint(function = "tcp_send_reset")]
pub fn tcp_send_reset_btf(ctx: BtfTracePointContext) -> i32 {
    if crate::util::attach_only() {
        return 0;
    }
    let sk: *const u8 = ctx.arg(0);
    let skb: *const u8 = ctx.arg(1);
    let reason: u32 = ctx.arg(2);
    let k = &CONFIG.kernel;
    let f: Fields = cfg(&CONFIG.tcp_send_reset);
    let mut tuple = zeroed::<Tuple>();
    // Both may be NULL (the verifier insists on the checks before any arithmetic).
    let (netns, state) = if sk.is_null() {
        if skb.is_null() {
            return 0;
        }
        let netns = ld::<*const u8>(skb, cfg(&k.skb_dev))
            .and_then(|dev| ld::<*const u8>(dev, cfg(&k.net_device_nd_net)))
            .map_or(Ns::UNKNOWN, btf_net);
        (netns, -1)
    } else {
        let state = ld::<u8>(sk, cfg(&k.sock_state)).map_or(-1, i32::from);
        (btf_sock_netns(sk), state)
    };
    let full = !sk.is_null() && (0..32).contains(&state) && f.not_full_states & (1 << state) == 0;
    let (mut answered, mut payload) = (0, 0);
    // The answered segment, full socket or not (its payload tells data at a closed socket from
    // a late FIN or ACK); its tuple only where no full socket gives one.
    if !skb.is_null() {
        let mut scratch = zeroed::<Tuple>();
        let t = if full { &mut scratch } else { &mut tuple };
        if let (Some(head), Some(data), Some(nh)) = (
            ld::<u64>(skb, cfg(&k.skb_head)),
            ld::<u64>(skb, cfg(&k.skb_data)),
            ld::<u16>(skb, cfg(&k.skb_network_header)),
        ) {
            answered = packet(head, data, nh, t, &mut payload);
        }
    }
    if full {
        btf_sock_tuple(sk, &mut tuple);
        // An aborted connection may have given up `skc_num` already.
        if tuple.sport == 0 {
            tuple.sport = btf_inet_sport(sk);
        }
    }
    if out_of_scope(EventKind::TcpSendReset, netns, &tuple) {
        return 0;
    }
    if full {
        crate::inet_sock_set_state::emit_held_only(sk as u64, netns, &tuple);
    }
    let Some(mut entry) = reserve::<Event>(EventKind::TcpSendReset) else {
        return 0;
    };
    let ev = unsafe { entry.assume_init_mut() };
    fill_header_sock(&mut ev.header, EventKind::TcpSendReset, netns);
    ev.skaddr = sk as u64;
    ev.tuple = tuple;
    ev.state = state;
    ev.reason = reason;
    ev.answered = answered;
    ev.answered_payload = payload;
    submit(entry);
    0
}

/// The 4-tuple of the packet a RST answers, reversed (local = its destination), from the IP
/// header at `head + nh` and the TCP header at `data`; returns its flags or'ed with
/// `ANSWERED_READ` (0 if unread), its payload length in `payload`. The packet bytes are
/// behind plain `unsigned char *` members, which the verifier does not let a program load
/// through.
#[inline(always)]
fn packet(head: u64, data: u64, nh: u16, t: &mut Tuple, payload: &mut u32) -> u32 {
    // Ports, then the flags byte at offset 13.
    let Ok(th) = (unsafe { bpf_probe_read_kernel(data as *const [u8; 14]) }) else {
        fault(EventKind::TcpSendReset, FaultKind::PacketRead);
        return 0;
    };
    // IPv4's 20 bytes or IPv6's 40, whichever the version nibble says.
    let Ok(ip) = (unsafe { bpf_probe_read_kernel((head + u64::from(nh)) as *const [u8; 40]) })
    else {
        fault(EventKind::TcpSendReset, FaultKind::PacketRead);
        return 0;
    };
    t.dport = u16::from_be_bytes([th[0], th[1]]);
    t.sport = u16::from_be_bytes([th[2], th[3]]);
    // Payload = IP length less both headers (IPv6's `payload_len` excludes its own header).
    let tcp_len = u32::from(th[12] >> 4) * 4;
    let ip_data = if ip[0] >> 4 == 6 {
        t.family = AF_INET6;
        t.daddr.copy_from_slice(&ip[8..24]);
        t.saddr.copy_from_slice(&ip[24..40]);
        u32::from(u16::from_be_bytes([ip[4], ip[5]]))
    } else {
        t.family = AF_INET;
        t.daddr[..4].copy_from_slice(&ip[12..16]);
        t.saddr[..4].copy_from_slice(&ip[16..20]);
        u32::from(u16::from_be_bytes([ip[2], ip[3]])).saturating_sub(u32::from(ip[0] & 0xf) * 4)
    };
    *payload = ip_data.saturating_sub(tcp_len);
    ANSWERED_READ | u32::from(th[13])
}

/// [`packet`] for an untyped `sk_buff` pointer (classic tracepoint, kprobes).
#[inline(always)]
fn packet_probe(skb: u64, t: &mut Tuple, payload: &mut u32) -> u32 {
    let k = &CONFIG.kernel;
    let kind = EventKind::TcpSendReset;
    match (
        kread::<u64>(kind, skb, cfg(&k.skb_head)),
        kread::<u64>(kind, skb, cfg(&k.skb_data)),
        kread::<u16>(kind, skb, cfg(&k.skb_network_header)),
    ) {
        (Some(head), Some(data), Some(nh)) => packet(head, data, nh, t, payload),
        _ => 0,
    }
}

#[tracepoint]
pub fn tcp_send_reset(ctx: TracePointContext) -> u32 {
    if crate::util::attach_only() {
        return 0;
    }
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
    let rec = Record::load(ctx, EventKind::TcpSendReset);
    let f: Fields = cfg(&CONFIG.tcp_send_reset);
    let skaddr = rec.get::<u64>(f.skaddr).unwrap_or(0);
    let netns = if skaddr != 0 {
        sock_netns(EventKind::TcpSendReset, skaddr)
    } else {
        rec.get::<u64>(f.skbaddr)
            .map_or(Ns::UNKNOWN, |skb| skb_netns(EventKind::TcpSendReset, skb))
    };
    let mut tuple = zeroed::<Tuple>();
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
    // The record has the tuple; only the answered segment's flags and payload come from the
    // packet (none for an active reset).
    let (mut answered, mut payload) = (0, 0);
    if let Some(skb) = rec.get::<u64>(f.skbaddr).filter(|skb| *skb != 0) {
        let mut scratch = zeroed::<Tuple>();
        answered = packet_probe(skb, &mut scratch, &mut payload);
    }
    if out_of_scope(EventKind::TcpSendReset, netns, &tuple) {
        return None;
    }
    let mut entry = reserve::<Event>(EventKind::TcpSendReset)?;
    let ev = unsafe { entry.assume_init_mut() };
    fill_header_sock(&mut ev.header, EventKind::TcpSendReset, netns);
    ev.skaddr = skaddr;
    ev.answered = answered;
    ev.answered_payload = payload;
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
    let skb: u64 = if has_skb {
        ctx.arg::<*const u8>(1).map_or(0, |p| p as u64)
    } else {
        0
    };
    let mut tuple = zeroed::<Tuple>();
    let (mut answered, mut payload) = (0, 0);
    if sk != 0 && skb != 0 {
        let mut scratch = zeroed::<Tuple>();
        answered = packet_probe(skb, &mut scratch, &mut payload);
    }
    let netns = if sk != 0 {
        sock_tuple(EventKind::TcpSendReset, sk, &mut tuple);
        // An abort (close with SO_LINGER 0) resets from tcp_disconnect() after the socket gave
        // up `skc_num`: the port is still in `inet_sport`, as the tp_btf program reads it
        // (found by the kernel matrix on 5.10 and 6.1, where this program is the one used).
        if tuple.sport == 0 {
            tuple.sport = u16::from_be(
                kread::<u16>(
                    EventKind::TcpSendReset,
                    sk,
                    cfg(&CONFIG.kernel.tcp_inet_sport),
                )
                .unwrap_or(0),
            );
        }
        sock_netns(EventKind::TcpSendReset, sk)
    } else if skb != 0 {
        answered = packet_probe(skb, &mut tuple, &mut payload);
        skb_netns(EventKind::TcpSendReset, skb)
    } else {
        Ns::UNKNOWN
    };
    if out_of_scope(EventKind::TcpSendReset, netns, &tuple) {
        return None;
    }
    let mut entry = reserve::<Event>(EventKind::TcpSendReset)?;
    let ev = unsafe { entry.assume_init_mut() };
    fill_header_sock(&mut ev.header, EventKind::TcpSendReset, netns);
    ev.skaddr = sk;
    ev.tuple = tuple;
    ev.state = if sk == 0 {
        -1
    } else {
        sock_state(EventKind::TcpSendReset, sk)
    };
    ev.reason = ABSENT_U32;
    ev.answered = answered;
    ev.answered_payload = payload;
    submit(entry);
    Some(())
}

#[kprobe]
pub fn kprobe_tcp_v4_send_reset(ctx: ProbeContext) -> u32 {
    if crate::util::attach_only() {
        return 0;
    }
    probe_send_reset(&ctx, true);
    0
}

#[kprobe]
pub fn kprobe_tcp_v6_send_reset(ctx: ProbeContext) -> u32 {
    if crate::util::attach_only() {
        return 0;
    }
    probe_send_reset(&ctx, true);
    0
}

#[kprobe]
pub fn kprobe_tcp_send_active_reset(ctx: ProbeContext) -> u32 {
    if crate::util::attach_only() {
        return 0;
    }
    probe_send_reset(&ctx, false);
    0
}
