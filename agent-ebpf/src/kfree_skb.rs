use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use drainwatch_common::{
    EventKind, Tuple,
    kfree_skb::{Event, Fields},
};

use crate::util::{
    CONFIG, Record, cfg, fill_header, reserve, skb_netns, sock_netns, sock_tuple, submit,
};

#[tracepoint]
pub fn kfree_skb(ctx: TracePointContext) -> u32 {
    try_kfree_skb(&ctx);
    0
}

fn try_kfree_skb(ctx: &TracePointContext) -> Option<()> {
    let rec = Record::load(ctx);
    let f: Fields = cfg(&CONFIG.kfree_skb);
    // Hot path: every freed packet passes here; leave before doing anything else.
    let reason = rec.get::<u32>(f.reason)?;
    if reason != f.listen_overflow {
        return None;
    }
    let skbaddr = rec.get::<u64>(f.skbaddr).unwrap_or(0);
    let rx_sk = rec.get::<u64>(f.rx_sk).unwrap_or(0);
    let netns = if rx_sk != 0 {
        sock_netns(rx_sk)
    } else {
        skb_netns(skbaddr)
    };
    let mut entry = reserve::<Event>(EventKind::KfreeSkb)?;
    let ev = unsafe { entry.assume_init_mut() };
    fill_header(&mut ev.header, EventKind::KfreeSkb, netns);
    ev.skbaddr = skbaddr;
    ev.rx_sk = rx_sk;
    ev.tuple = Tuple::default();
    sock_tuple(rx_sk, &mut ev.tuple);
    ev.reason = reason;
    ev.protocol = rec.get::<u16>(f.protocol).map_or(0, u32::from);
    submit(entry);
    Some(())
}
