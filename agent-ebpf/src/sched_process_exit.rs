//! `sched:sched_process_exit`: a process (its last thread) exited; the exit code is read from
//! `task_struct` at the BTF offset, since the format has none.

use aya_ebpf::{helpers::bpf_get_current_task, macros::tracepoint, programs::TracePointContext};
use drainwatch_common::{
    ABSENT_U32, EventKind,
    fields::NO_FIELD,
    sched_process_exit::{Event, Fields},
};

use crate::ring::{reserve, submit_lifecycle_quiet};
use crate::util::{CONFIG, Record, cfg, fill_header, kread, task_netns};

const KIND: EventKind = EventKind::SchedProcessExit;

#[tracepoint]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    if crate::util::attach_only() {
        return 0;
    }
    try_sched_process_exit(&ctx);
    0
}

fn try_sched_process_exit(ctx: &TracePointContext) -> Option<()> {
    let rec = Record::load(ctx, KIND);
    let f: Fields = cfg(&CONFIG.sched_process_exit);
    // A process ends when its last thread does; kernels without `group_dead` fall back to the
    // group leader's exit.
    let group_dead = if f.group_dead == NO_FIELD {
        let pid_tgid = aya_ebpf::helpers::bpf_get_current_pid_tgid();
        pid_tgid as u32 == (pid_tgid >> 32) as u32
    } else {
        rec.get::<u8>(f.group_dead)? != 0
    };
    if !group_dead {
        return None;
    }
    let task = unsafe { bpf_get_current_task() };
    let exit_code =
        kread::<i32>(KIND, task, cfg(&CONFIG.kernel.task_exit_code)).unwrap_or(ABSENT_U32 as i32);
    let mut entry = reserve::<Event>(KIND)?;
    let ev = unsafe { entry.assume_init_mut() };
    fill_header(&mut ev.header, KIND, task_netns(KIND));
    ev.exit_code = exit_code;
    ev.group_dead = 1;
    submit_lifecycle_quiet(entry);
    Some(())
}
