//! `cgroup:cgroup_rmdir`: a cgroup was removed. Copies its id, hierarchy, level and path; a
//! path that cannot be read, or is longer than the record holds (`PATH_LEN`), counts as a fault.

use aya_ebpf::{
    EbpfContext, helpers::bpf_probe_read_kernel_str_bytes, macros::tracepoint,
    programs::TracePointContext,
};
use drainwatch_common::{
    EventKind,
    cgroup_rmdir::{Event, Fields, PATH_LEN},
    faults::FaultKind,
};

use crate::ring::{reserve, submit_lifecycle};
use crate::{
    fault::fault_at,
    util::{CONFIG, Record, cfg, fill_header, task_netns},
};

const KIND: EventKind = EventKind::CgroupRmdir;

#[tracepoint]
pub fn cgroup_rmdir(ctx: TracePointContext) -> u32 {
    if crate::util::attach_only() {
        return 0;
    }
    try_cgroup_rmdir(&ctx);
    0
}

fn try_cgroup_rmdir(ctx: &TracePointContext) -> Option<()> {
    let rec = Record::load(ctx, KIND);
    let f: Fields = cfg(&CONFIG.cgroup_rmdir);
    let mut entry = reserve::<Event>(KIND)?;
    let ev = unsafe { entry.assume_init_mut() };
    fill_header(&mut ev.header, KIND, task_netns(KIND));
    ev.id = rec.get::<u64>(f.id).unwrap_or(0);
    ev.root = rec.get::<i32>(f.root).unwrap_or(-1);
    ev.level = rec.get::<i32>(f.level).unwrap_or(-1);
    ev._pad = 0;
    ev.path_len = 0;
    // `__data_loc`: low 16 bits are the string's offset in the record, high 16 its length.
    // The length includes the NUL: a longer path than the record holds is cut.
    if let Some(loc) = rec.get::<u32>(f.path) {
        let at = loc & 0xffff;
        let src = unsafe { (ctx.as_ptr() as *const u8).add(at as usize) };
        match unsafe { bpf_probe_read_kernel_str_bytes(src, &mut ev.path) } {
            Ok(s) => ev.path_len = s.len() as u32,
            Err(_) => fault_at(KIND, FaultKind::PathRead, at),
        }
        if loc >> 16 > PATH_LEN as u32 {
            fault_at(KIND, FaultKind::PathTruncated, at);
        }
    }
    submit_lifecycle(entry);
    Some(())
}
