use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use drainwatch_common::{
    EventKind, Tuple,
    inet_sk_error_report::{Event, Fields},
};

use crate::util::{
    CONFIG, IPPROTO_TCP, Record, cfg, fill_header, out_of_scope, reserve, submit, task_netns,
    tp_tuple,
};

#[tracepoint]
pub fn inet_sk_error_report(ctx: TracePointContext) -> u32 {
    try_inet_sk_error_report(&ctx);
    0
}

fn try_inet_sk_error_report(ctx: &TracePointContext) -> Option<()> {
    let rec = Record::load(ctx);
    let f: Fields = cfg(&CONFIG.inet_sk_error_report);
    if rec.get::<u16>(f.protocol)? != IPPROTO_TCP {
        return None;
    }
    // The format has no socket pointer: the namespace is the current task's, which is the
    // socket owner's only in process context (userspace knows which case it has).
    let netns = task_netns();
    let mut tuple = Tuple::default();
    tp_tuple(&rec, &f.addr, &mut tuple);
    if out_of_scope(EventKind::InetSkErrorReport, netns, &tuple) {
        return None;
    }
    let mut entry = reserve::<Event>(EventKind::InetSkErrorReport)?;
    let ev = unsafe { entry.assume_init_mut() };
    fill_header(&mut ev.header, EventKind::InetSkErrorReport, netns);
    ev.tuple = tuple;
    ev.error = rec.get::<i32>(f.error).unwrap_or(0);
    ev._pad = 0;
    submit(entry);
    Some(())
}
