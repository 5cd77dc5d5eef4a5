//! Where the programs find what they read: the offsets of tracepoint format fields (`NO_FIELD`
//! where this kernel's format lacks one), the address fields many tracepoints share, and kernel
//! struct member offsets from BTF (`NO_OFFSET` where BTF lacks one). Each hook's `Fields` is
//! built from these; `config::Config` gathers them for the programs.

/// A tracepoint field this kernel's format does not have.
pub const NO_FIELD: u16 = u16::MAX;
/// A struct member BTF did not resolve.
pub const NO_OFFSET: u32 = u32::MAX;

/// Offsets of the address fields many tracepoints share (`TCP_EVENT_STRUCTURE` and friends):
/// family, host-order ports, IPv4 addresses and (optional) IPv6 addresses.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddrFields {
    pub family: u16,
    pub sport: u16,
    pub dport: u16,
    pub saddr: u16,
    pub daddr: u16,
    pub saddr_v6: u16,
    pub daddr_v6: u16,
    pub _pad: u16,
}

/// The family of an address pair recorded by a tracepoint without a `family` field (5.10's
/// `tcp_send_reset` and `tcp_receive_reset`): they store an IPv4 socket's addresses in the IPv6
/// fields as IPv4-mapped (`::ffff:a.b.c.d`) and an IPv6 socket's as they are.
pub fn family_of_v6(saddr_v6: &[u8; 16]) -> u16 {
    let mapped =
        saddr_v6[..10].iter().all(|b| *b == 0) && saddr_v6[10] == 0xff && saddr_v6[11] == 0xff;
    if mapped {
        crate::AF_INET
    } else {
        crate::AF_INET6
    }
}

impl AddrFields {
    pub const ABSENT: Self = Self {
        family: NO_FIELD,
        sport: NO_FIELD,
        dport: NO_FIELD,
        saddr: NO_FIELD,
        daddr: NO_FIELD,
        saddr_v6: NO_FIELD,
        daddr_v6: NO_FIELD,
        _pad: 0,
    };
}

/// Byte offsets of kernel struct members, resolved from `/sys/kernel/btf/vmlinux`.
/// Offsets are from the start of the named struct (`sock_*` from `struct sock`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelOffsets {
    pub sock_net: u32,
    pub sock_family: u32,
    pub sock_state: u32,
    pub sock_num: u32,
    pub sock_dport: u32,
    pub sock_rcv_saddr: u32,
    pub sock_daddr: u32,
    pub sock_v6_rcv_saddr: u32,
    pub sock_v6_daddr: u32,
    pub net_inum: u32,
    pub task_nsproxy: u32,
    pub task_exit_code: u32,
    pub nsproxy_net_ns: u32,
    pub skb_dev: u32,
    pub net_device_nd_net: u32,
    /// `struct tcp_sock` counters, read when a connection changes state.
    pub tcp_bytes_received: u32,
    pub tcp_bytes_sent: u32,
    pub tcp_rcv_nxt: u32,
    pub tcp_copied_seq: u32,
    pub tcp_lsndtime: u32,
    pub tcp_lrcvtime: u32,
    pub tcp_data_segs_in: u32,
    pub tcp_data_segs_out: u32,
    /// `tcp_sock.snd_wl1`: the sequence number of the peer's segment that last moved the send
    /// window (`tcp_update_wl`), on the fast path the one that acknowledged new data.
    pub tcp_snd_wl1: u32,
    /// `tcp_sock.snd_una` / `snd_nxt`: the first byte this side sent that the peer has not
    /// acknowledged, and the next it will send.
    pub tcp_snd_una: u32,
    pub tcp_snd_nxt: u32,
    /// `tcp_sock.retrans_stamp`: a connecting socket's first SYN (`tcp_connect`).
    pub tcp_retrans_stamp: u32,
    /// From a task to the socket behind one of its file descriptors (accept's return value).
    pub task_files: u32,
    pub files_fdt: u32,
    pub fdtable_fd: u32,
    pub fdtable_max_fds: u32,
    pub file_private_data: u32,
    pub socket_sk: u32,
    pub sock_max_ack_backlog: u32,
    /// For the BTF-typed state-change program, which reads the socket itself.
    pub sock_protocol: u32,
    /// `tcp_sock` to `inet_sock.inet_sport`: the local port, still there when a socket moving
    /// to CLOSE has already given up `skc_num`.
    pub tcp_inet_sport: u32,
    /// `sock.sk_err`: the error `inet_sk_error_report` reports.
    pub sock_err: u32,
    /// `sk_buff` members the tp_btf reset program reads a socket-less RST's packet through.
    pub skb_head: u32,
    pub skb_data: u32,
    pub skb_network_header: u32,
    pub skb_protocol: u32,
    /// `sock.sk_ack_backlog`: connections in a listener's accept queue (the listen-overflow
    /// kprobes compare it with `sk_max_ack_backlog`).
    pub sock_ack_backlog: u32,
    /// `net.net_cookie`: a namespace's id, never reused (a `u64` set at creation from 5.12;
    /// an `atomic64_t` made on first use before): every socket record's `netns_cookie`, and
    /// the key of the programs' per-CPU cache of the last namespace's inode
    /// (`util::NETNS_SEEN`).
    pub net_cookie: u32,
}

impl KernelOffsets {
    pub const UNRESOLVED: Self = Self {
        sock_net: NO_OFFSET,
        sock_family: NO_OFFSET,
        sock_state: NO_OFFSET,
        sock_num: NO_OFFSET,
        sock_dport: NO_OFFSET,
        sock_rcv_saddr: NO_OFFSET,
        sock_daddr: NO_OFFSET,
        sock_v6_rcv_saddr: NO_OFFSET,
        sock_v6_daddr: NO_OFFSET,
        net_inum: NO_OFFSET,
        task_nsproxy: NO_OFFSET,
        task_exit_code: NO_OFFSET,
        nsproxy_net_ns: NO_OFFSET,
        skb_dev: NO_OFFSET,
        net_device_nd_net: NO_OFFSET,
        tcp_bytes_received: NO_OFFSET,
        tcp_bytes_sent: NO_OFFSET,
        tcp_rcv_nxt: NO_OFFSET,
        tcp_copied_seq: NO_OFFSET,
        tcp_lsndtime: NO_OFFSET,
        tcp_lrcvtime: NO_OFFSET,
        tcp_data_segs_in: NO_OFFSET,
        tcp_data_segs_out: NO_OFFSET,
        tcp_snd_wl1: NO_OFFSET,
        tcp_snd_una: NO_OFFSET,
        tcp_snd_nxt: NO_OFFSET,
        tcp_retrans_stamp: NO_OFFSET,
        task_files: NO_OFFSET,
        files_fdt: NO_OFFSET,
        fdtable_fd: NO_OFFSET,
        fdtable_max_fds: NO_OFFSET,
        file_private_data: NO_OFFSET,
        socket_sk: NO_OFFSET,
        sock_max_ack_backlog: NO_OFFSET,
        sock_protocol: NO_OFFSET,
        tcp_inet_sport: NO_OFFSET,
        sock_err: NO_OFFSET,
        skb_head: NO_OFFSET,
        skb_data: NO_OFFSET,
        skb_network_header: NO_OFFSET,
        skb_protocol: NO_OFFSET,
        sock_ack_backlog: NO_OFFSET,
        net_cookie: NO_OFFSET,
    };
}

pod!(KernelOffsets, AddrFields);

const _: () = assert!(core::mem::size_of::<AddrFields>() == 16);
const _: () = assert!(core::mem::size_of::<KernelOffsets>() == 172);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_family_comes_from_the_ipv6_fields() {
        let mut mapped = [0u8; 16];
        mapped[10..].copy_from_slice(&[0xff, 0xff, 127, 0, 0, 1]);
        assert_eq!(family_of_v6(&mapped), crate::AF_INET);
        let mut loopback6 = [0u8; 16];
        loopback6[15] = 1;
        assert_eq!(family_of_v6(&loopback6), crate::AF_INET6);
        assert_eq!(family_of_v6(&[0; 16]), crate::AF_INET6);
    }
}
