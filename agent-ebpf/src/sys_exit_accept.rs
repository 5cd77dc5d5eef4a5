//! `syscalls:sys_exit_accept{,4}`: accept() returned a descriptor, followed to its socket
//! through BTF offsets; emits the same `inet_csk_accept` event as the kretprobe.

use aya_ebpf::{
    EbpfContext as _,
    helpers::{bpf_get_current_task, generated::bpf_get_current_task_btf},
    macros::tracepoint,
    programs::TracePointContext,
};

use drainwatch_common::{EventKind, faults::FaultKind, fields::NO_FIELD, watch};

use crate::{
    fault::fault,
    inet_csk_accept::emit_accepted,
    util::{
        CONFIG, cfg, count_filtered, current_netns, is_host, kread, ld, task_netns, watched_port,
    },
};

/// The program emits `inet_csk_accept` events; its faults count there.
const KIND: EventKind = EventKind::InetCskAccept;

/// `ret`'s offset in the record (after the common fields and `__syscall_nr`).
const RET_AT: u16 = 16;

/// Attached to both `sys_exit_accept4` and `sys_exit_accept` (same layout).
#[tracepoint]
pub fn sys_exit_accept(ctx: TracePointContext) -> u32 {
    if crate::util::attach_only() {
        return 0;
    }
    try_sys_exit_accept::<true>(&ctx);
    0
}

/// The same for kernels without `bpf_get_current_task_btf` (before 5.11), whose verifier
/// rejects a program calling it: the host-namespace check by probe reads (four helper calls
/// where the BTF task needs one). The plan tries `sys_exit_accept` first.
#[tracepoint]
pub fn sys_exit_accept_probe(ctx: TracePointContext) -> u32 {
    if crate::util::attach_only() {
        return 0;
    }
    try_sys_exit_accept::<false>(&ctx);
    0
}

/// The socket behind descriptor `fd` of the current task: task->files->fdt->fd[fd]->
/// private_data (struct socket)->sk.
#[inline(always)]
fn socket_of_fd(fd: u64) -> Option<u64> {
    let k = &CONFIG.kernel;
    let task = unsafe { bpf_get_current_task() };
    let files = kread::<u64>(KIND, task, cfg(&k.task_files))?;
    let fdt = kread::<u64>(KIND, files, cfg(&k.files_fdt))?;
    let max = kread::<u32>(KIND, fdt, cfg(&k.fdtable_max_fds))?;
    if fd >= u64::from(max) {
        return None;
    }
    let fds = kread::<u64>(KIND, fdt, cfg(&k.fdtable_fd))?;
    let file = kread::<u64>(KIND, fds + fd * 8, 0)?;
    let socket = kread::<u64>(KIND, file, cfg(&k.file_private_data))?;
    kread::<u64>(KIND, socket, cfg(&k.socket_sk)).filter(|sk| *sk != 0)
}

/// [`socket_of_fd`] from the BTF task: its files and descriptor table are plain loads, so
/// three helper calls (the descriptor's file, its socket, the socket's sock) where the probe
/// reads made six and `bpf_get_current_task` a seventh. The table's `fd` array is a pointer
/// to pointers, which the verifier hands over as a plain number: read from there on.
#[inline(always)]
fn socket_of_fd_btf(fd: u64) -> Option<u64> {
    let k = &CONFIG.kernel;
    let task = unsafe { bpf_get_current_task_btf() } as *const u8;
    if task.is_null() {
        return None;
    }
    let files = ld::<*const u8>(task, cfg(&k.task_files)).filter(|p| !p.is_null())?;
    let fdt = ld::<*const u8>(files, cfg(&k.files_fdt)).filter(|p| !p.is_null())?;
    let max = ld::<u32>(fdt, cfg(&k.fdtable_max_fds))?;
    if fd >= u64::from(max) {
        return None;
    }
    let fds = ld::<u64>(fdt, cfg(&k.fdtable_fd))?;
    let file = kread::<u64>(KIND, fds + fd * 8, 0)?;
    let socket = kread::<u64>(KIND, file, cfg(&k.file_private_data))?;
    kread::<u64>(KIND, socket, cfg(&k.socket_sk)).filter(|sk| *sk != 0)
}

fn try_sys_exit_accept<const TASK_BTF: bool>(ctx: &TracePointContext) -> Option<()> {
    // One field: read alone, not through a `Record` (a 128-byte copy).
    let off = cfg(&CONFIG.sys_exit_accept.ret);
    if off == NO_FIELD {
        return None;
    }
    // Where every kernel seen puts it, a direct load (the verifier allows one at a constant
    // offset); elsewhere a helper call.
    let ret = if off == RET_AT {
        unsafe {
            core::ptr::read_volatile(ctx.as_ptr().cast::<u8>().add(RET_AT.into()).cast::<i64>())
        }
    } else {
        let Ok(ret) = (unsafe { ctx.read_at::<i64>(usize::from(off)) }) else {
            fault(KIND, FaultKind::RecordRead);
            return None;
        };
        ret
    };
    if ret < 0 {
        return None;
    }
    // In the host namespace only host-network containers' listeners matter, and while there
    // are none the walk to the socket is skipped.
    let netns = if TASK_BTF {
        current_netns()
    } else {
        task_netns(KIND)
    };
    if is_host(netns) && !watched_port(watch::ANY_PORT) {
        count_filtered(KIND);
        return None;
    }
    let sk = if TASK_BTF {
        socket_of_fd_btf(ret as u64)?
    } else {
        socket_of_fd(ret as u64)?
    };
    emit_accepted(sk)
}
