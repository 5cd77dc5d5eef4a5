//! drainwatch's eBPF programs: one module per kernel hook, each a thin wrapper that copies what
//! the hook offers into a ring-buffer record. Field and struct offsets are not compiled in: the
//! agent reads them from tracefs and BTF at start-up and writes them into `CONFIG`. Reads that
//! fail are counted and logged (`fault`).
#![no_std]
#![no_main]

mod cgroup_rmdir;
mod fault;
mod hold;
mod inet_csk_accept;
mod inet_sk_error_report;
mod inet_sock_set_state;
mod kfree_skb;
mod loopback;
mod ring;
mod sched_process_exit;
mod signal_generate;
mod sock_head;
mod sock_length;
mod storm_answers;
mod sys_exit_accept;
mod tcp_receive_reset;
mod tcp_send_reset;
mod util;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
