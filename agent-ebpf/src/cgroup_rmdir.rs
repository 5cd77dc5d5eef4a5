use aya_ebpf::{
    EbpfContext, helpers::bpf_probe_read_kernel_str_bytes, macros::tracepoint,
    programs::TracePointContext,
};
use drainwatch_common::{
    EventKind,
    cgroup_rmdir::{Event, Fields},
};

use crate::util::{CONFIG, Record, cfg, fill_header, reserve, submit, task_netns};

#[tracepoint]
pub fn cgroup_rmdir(ctx: TracePointContext) -> u32 {
    if crate::util::attach_only() {
        return 0;
    }
    try_cgroup_rmdir(&ctx);
    0
}

fn try_cgroup_rmdir(ctx: &TracePointContext) -> Option<()> {
    let rec = Record::load(ctx);
    let f: Fields = cfg(&CONFIG.cgroup_rmdir);
    let mut entry = reserve::<Event>(EventKind::CgroupRmdir)?;
    let ev = unsafe { entry.assume_init_mut() };
    fill_header(&mut ev.header, EventKind::CgroupRmdir, task_netns());
    ev.id = rec.get::<u64>(f.id).unwrap_or(0);
    ev.root = rec.get::<i32>(f.root).unwrap_or(-1);
    ev.level = rec.get::<i32>(f.level).unwrap_or(-1);
    ev._pad = 0;
    ev.path_len = 0;
    // `__data_loc`: low 16 bits are the string's offset in the record, high 16 its length.
    if let Some(loc) = rec.get::<u32>(f.path) {
        let src = unsafe { (ctx.as_ptr() as *const u8).add((loc & 0xffff) as usize) };
        if let Ok(s) = unsafe { bpf_probe_read_kernel_str_bytes(src, &mut ev.path) } {
            ev.path_len = s.len() as u32;
        }
    }
    submit(entry);
    Some(())
}
