//! One module per kernel hook, named like the hook: which format fields its program reads
//! (`fields`) and how its records decode (`decode`).

pub mod cgroup_rmdir;
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
