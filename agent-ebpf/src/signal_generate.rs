//! `signal:signal_generate`: a signal was sent; only the signals a container stop is made of
//! (`SIGNALS`) are emitted.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use drainwatch_common::{
    EventKind,
    signal_generate::{Event, Fields, SIGNALS},
};

use crate::ring::{reserve, submit_lifecycle};
use crate::util::{CONFIG, Record, cfg, fill_header, task_netns};

#[tracepoint]
pub fn signal_generate(ctx: TracePointContext) -> u32 {
    if crate::util::attach_only() {
        return 0;
    }
    try_signal_generate(&ctx);
    0
}

fn try_signal_generate(ctx: &TracePointContext) -> Option<()> {
    let rec = Record::load(ctx, EventKind::SignalGenerate);
    let f: Fields = cfg(&CONFIG.signal_generate);
    let sig = rec.get::<i32>(f.sig)?;
    if !SIGNALS.contains(&sig) {
        return None;
    }
    let mut entry = reserve::<Event>(EventKind::SignalGenerate)?;
    let ev = unsafe { entry.assume_init_mut() };
    fill_header(
        &mut ev.header,
        EventKind::SignalGenerate,
        task_netns(EventKind::SignalGenerate),
    );
    ev.sig = sig;
    ev.target_pid = rec.get::<i32>(f.pid).unwrap_or(-1);
    ev.group = rec.get::<i32>(f.group).unwrap_or(-1);
    ev.result = rec.get::<i32>(f.result).unwrap_or(-1);
    ev.code = rec.get::<i32>(f.code).unwrap_or(0);
    ev._pad = 0;
    ev.target_comm = rec.get::<[u8; 16]>(f.comm).unwrap_or([0; 16]);
    submit_lifecycle(entry);
    Some(())
}
