//! Types shared by the eBPF programs (`agent-ebpf`) and the agent: one module per kernel hook,
//! named after the hook (its `Event` record and the `Fields` its program reads), the table of
//! hooks (`hooks.rs`), the header every event starts with, and the start-up configuration the
//! agent hands to the programs as globals.
//!
//! Every struct is `#[repr(C)]`, 8-byte aligned at most (ring-buffer records must be) and laid
//! out without implicit padding, so the bytes the kernel writes are the bytes userspace reads.
#![no_std]

/// Marks types as plain data for aya (userspace only).
macro_rules! pod {
    ($($t:ty),*) => {
        $(
            #[cfg(feature = "user")]
            unsafe impl aya::Pod for $t {}
        )*
    };
}

pub mod hooks;

pub mod cgroup_rmdir;
pub mod config;
pub mod faults;
pub mod fields;
pub mod inet_csk_accept;
pub mod inet_sk_error_report;
pub mod inet_sock_set_state;
pub mod kfree_skb;
pub mod sched_process_exit;
pub mod signal_generate;
pub mod sock_length;
pub mod sys_exit_accept;
pub mod tcp_receive_reset;
pub mod tcp_send_reset;
pub mod watch;

pub use hooks::EventKind;

pub const TASK_COMM_LEN: usize = 16;

/// Written by every program: who was running, where, and when.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Header {
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC nanoseconds.
    pub ts_ns: u64,
    /// v2 cgroup id of the current task. 0 where a program leaves it out (state changes that
    /// mostly run in softirq, for an unrelated task).
    pub cgroup_id: u64,
    pub kind: u32,
    /// Thread id and thread-group id of the current task (in softirq, whichever task the
    /// packet interrupted).
    pub pid: u32,
    pub tgid: u32,
    /// Network namespace inode: of the socket when there is one, else of the current task.
    /// procfs names namespaces by it, and the kernel gives a freed one's to the next.
    pub netns: u32,
    /// The current task's command; empty where `cgroup_id` is left out.
    pub comm: [u8; TASK_COMM_LEN],
    /// The same namespace's cookie (`net.net_cookie`): unique for the kernel's lifetime, so
    /// it tells a replacement's namespace from the one whose inode it reused. 0 where the
    /// kernel has none (before 5.12 it is made on first use, if ever), and on records of a
    /// task's namespace read by probe reads (signals, exits, cgroup removals: attributed by
    /// process), which save the read.
    pub netns_cookie: u64,
}

pub const AF_INET: u16 = 2;
pub const AF_INET6: u16 = 10;

/// A TCP 4-tuple as the kernel reported it. IPv4 addresses use the first 4 bytes of the arrays.
/// Ports are in host byte order. Aligned to 8 so that the eBPF side zeroes and copies it with
/// word stores: at byte alignment LLVM's BPF backend calls an out-of-line memset instead.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tuple {
    pub family: u16,
    pub sport: u16,
    pub dport: u16,
    pub _pad: u16,
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
}

pod!(Header, Tuple);

// The layouts are a contract with the kernel side: no implicit padding, ring-buffer friendly.
const _: () = assert!(core::mem::size_of::<Header>() == 56);
const _: () = assert!(core::mem::size_of::<Tuple>() == 40);

/// Marks a value the kernel did not provide (field absent from this kernel's format).
pub const ABSENT_U32: u32 = u32::MAX;
