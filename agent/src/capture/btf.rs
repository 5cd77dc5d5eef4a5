//! Kernel struct member offsets from BTF (`/sys/kernel/btf/vmlinux`), handed to the programs so
//! no layout is compiled in. Rust eBPF objects carry no CO-RE relocations: this replaces them.

use btf_rs::{Btf, Type};
use drainwatch_common::fields::{KernelOffsets, NO_OFFSET};

#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error(
        "cannot read kernel BTF from {path}: {source} (drainwatch needs a kernel built with CONFIG_DEBUG_INFO_BTF)"
    )]
    Read { path: String, source: btf_rs::Error },
}

pub fn load(path: &str) -> Result<Btf, BtfError> {
    Btf::from_file(path).map_err(|source| BtfError::Read {
        path: path.to_string(),
        source,
    })
}

/// Strips typedefs and qualifiers down to a struct or union.
fn struct_of(btf: &Btf, mut ty: Type) -> Option<btf_rs::Struct> {
    for _ in 0..16 {
        ty = match ty {
            Type::Struct(s) | Type::Union(s) => return Some(s),
            Type::Typedef(t) => btf.resolve_chained_type(&t).ok()?,
            Type::Const(t) | Type::Volatile(t) | Type::Restrict(t) => {
                btf.resolve_chained_type(&t).ok()?
            }
            _ => return None,
        };
    }
    None
}

/// Members one lookup may visit, across its anonymous structs and unions: 6.18's deepest
/// (`task_struct.nsproxy`) visits 135. A malformed BTF whose anonymous members nest into each
/// other would otherwise take exponential time (found by the `btf` fuzz target).
const VISITS: u32 = 2_000;

/// Member `name` of `s` and its byte offset in `s`, looking through anonymous struct and union
/// members (at most 8 deep).
fn find_member(btf: &Btf, s: &btf_rs::Struct, name: &str) -> Option<(u32, btf_rs::Member)> {
    fn walk(
        btf: &Btf,
        s: &btf_rs::Struct,
        name: &str,
        depth: u32,
        visits: &mut u32,
    ) -> Option<(u32, btf_rs::Member)> {
        if depth > 8 {
            return None;
        }
        for m in &s.members {
            *visits = visits.checked_sub(1)?;
            let m_name = btf.resolve_name(m).unwrap_or_default();
            if m_name == name {
                return (m.bitfield_size().unwrap_or(0) == 0 && m.bit_offset() % 8 == 0)
                    .then(|| (m.bit_offset() / 8, m.clone()));
            }
            if m_name.is_empty() {
                let inner = btf
                    .resolve_chained_type(m)
                    .ok()
                    .and_then(|t| struct_of(btf, t));
                if let Some((off, found)) =
                    inner.and_then(|i| walk(btf, &i, name, depth + 1, visits))
                {
                    return Some((m.bit_offset() / 8 + off, found));
                }
            }
        }
        None
    }
    let mut visits = VISITS;
    walk(btf, s, name, 0, &mut visits)
}

/// Offset of a dotted member path (`"__sk_common.skc_net"`) in the named struct.
pub fn offset_of(btf: &Btf, strukt: &str, path: &str) -> Option<u32> {
    let ty = btf
        .resolve_types_by_name(strukt)
        .ok()?
        .into_iter()
        .find(|t| matches!(t, Type::Struct(_)))?;
    let mut s = struct_of(btf, ty)?;
    let mut total = 0;
    let mut parts = path.split('.').peekable();
    while let Some(part) = parts.next() {
        let (offset, member) = find_member(btf, &s, part)?;
        total += offset;
        if parts.peek().is_some() {
            s = struct_of(btf, btf.resolve_chained_type(&member).ok()?)?;
        }
    }
    Some(total)
}

/// Where a resolved offset goes in the configuration.
type Slot = fn(&mut KernelOffsets) -> &mut u32;

/// Which members the programs read, as (struct, member path, slot).
const MEMBERS: &[(&str, &str, Slot)] = &[
    ("sock", "__sk_common.skc_net", |k| &mut k.sock_net),
    ("sock", "__sk_common.skc_family", |k| &mut k.sock_family),
    ("sock", "__sk_common.skc_state", |k| &mut k.sock_state),
    ("sock", "__sk_common.skc_num", |k| &mut k.sock_num),
    ("sock", "__sk_common.skc_dport", |k| &mut k.sock_dport),
    ("sock", "__sk_common.skc_rcv_saddr", |k| {
        &mut k.sock_rcv_saddr
    }),
    ("sock", "__sk_common.skc_daddr", |k| &mut k.sock_daddr),
    ("sock", "__sk_common.skc_v6_rcv_saddr", |k| {
        &mut k.sock_v6_rcv_saddr
    }),
    ("sock", "__sk_common.skc_v6_daddr", |k| &mut k.sock_v6_daddr),
    ("net", "ns.inum", |k| &mut k.net_inum),
    ("net", "net_cookie", |k| &mut k.net_cookie),
    ("task_struct", "nsproxy", |k| &mut k.task_nsproxy),
    ("task_struct", "exit_code", |k| &mut k.task_exit_code),
    ("nsproxy", "net_ns", |k| &mut k.nsproxy_net_ns),
    ("sk_buff", "dev", |k| &mut k.skb_dev),
    ("net_device", "nd_net", |k| &mut k.net_device_nd_net),
    ("tcp_sock", "bytes_received", |k| &mut k.tcp_bytes_received),
    ("tcp_sock", "bytes_sent", |k| &mut k.tcp_bytes_sent),
    ("tcp_sock", "rcv_nxt", |k| &mut k.tcp_rcv_nxt),
    ("tcp_sock", "copied_seq", |k| &mut k.tcp_copied_seq),
    ("tcp_sock", "lsndtime", |k| &mut k.tcp_lsndtime),
    ("tcp_sock", "inet_conn.icsk_ack.lrcvtime", |k| {
        &mut k.tcp_lrcvtime
    }),
    ("tcp_sock", "data_segs_in", |k| &mut k.tcp_data_segs_in),
    ("tcp_sock", "data_segs_out", |k| &mut k.tcp_data_segs_out),
    ("tcp_sock", "snd_wl1", |k| &mut k.tcp_snd_wl1),
    ("tcp_sock", "snd_una", |k| &mut k.tcp_snd_una),
    ("tcp_sock", "snd_nxt", |k| &mut k.tcp_snd_nxt),
    ("tcp_sock", "retrans_stamp", |k| &mut k.tcp_retrans_stamp),
    ("task_struct", "files", |k| &mut k.task_files),
    ("files_struct", "fdt", |k| &mut k.files_fdt),
    ("fdtable", "fd", |k| &mut k.fdtable_fd),
    ("fdtable", "max_fds", |k| &mut k.fdtable_max_fds),
    ("file", "private_data", |k| &mut k.file_private_data),
    ("socket", "sk", |k| &mut k.socket_sk),
    ("sock", "sk_max_ack_backlog", |k| {
        &mut k.sock_max_ack_backlog
    }),
    ("sock", "sk_ack_backlog", |k| &mut k.sock_ack_backlog),
    ("sock", "sk_protocol", |k| &mut k.sock_protocol),
    ("sock", "sk_err", |k| &mut k.sock_err),
    ("sk_buff", "head", |k| &mut k.skb_head),
    ("sk_buff", "data", |k| &mut k.skb_data),
    ("sk_buff", "network_header", |k| &mut k.skb_network_header),
    ("sk_buff", "protocol", |k| &mut k.skb_protocol),
    ("tcp_sock", "inet_conn.icsk_inet.inet_sport", |k| {
        &mut k.tcp_inet_sport
    }),
];

/// Whether every network namespace has its cookie from its creation: `net.net_cookie` is a
/// plain `u64` (5.12+). Before, it is an `atomic64_t` made on first use, if ever (mostly 0
/// in records), or absent (before 5.7): namespaces are then told apart by inode alone, and a
/// replacement whose namespace reused a stopped container's inode is taken for it.
pub fn net_cookie_at_creation(btf: &Btf) -> bool {
    let Some(net) = btf
        .resolve_types_by_name("net")
        .ok()
        .and_then(|t| t.into_iter().find(|t| matches!(t, Type::Struct(_))))
        .and_then(|t| struct_of(btf, t))
    else {
        return false;
    };
    let Some((_, member)) = find_member(btf, &net, "net_cookie") else {
        return false;
    };
    let mut ty = btf.resolve_chained_type(&member).ok();
    for _ in 0..8 {
        ty = match ty {
            Some(Type::Int(_)) => return true,
            Some(Type::Typedef(t)) => btf.resolve_chained_type(&t).ok(),
            Some(Type::Volatile(t)) | Some(Type::Const(t)) => btf.resolve_chained_type(&t).ok(),
            _ => return false,
        };
    }
    false
}

/// Resolves every member the programs read. Unresolved ones stay `NO_OFFSET` and are listed
/// (`struct.member`) so the attach plan can report what they cost.
pub fn kernel_offsets(btf: &Btf) -> (KernelOffsets, Vec<String>) {
    let mut k = KernelOffsets::UNRESOLVED;
    let mut missing = Vec::new();
    for (strukt, path, slot) in MEMBERS {
        match offset_of(btf, strukt, path) {
            Some(off) => *slot(&mut k) = off,
            None => {
                *slot(&mut k) = NO_OFFSET;
                missing.push(format!("{strukt}.{path}"));
            }
        }
    }
    (k, missing)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Offset of a direct member as an independent reader, bpftool, prints it.
    fn bpftool_offset(strukt: &str, member: &str) -> u32 {
        let raw = std::process::Command::new("bpftool")
            .args([
                "btf",
                "dump",
                "file",
                "/sys/kernel/btf/vmlinux",
                "format",
                "raw",
            ])
            .output()
            .expect("bpftool must be installed (cargo xtask setup installs it)");
        assert!(raw.status.success(), "bpftool failed");
        let raw = String::from_utf8_lossy(&raw.stdout);
        let head = format!("STRUCT '{strukt}' size=");
        let pos = raw.find(&head).unwrap_or_else(|| panic!("{head} missing"));
        for line in raw[pos..].lines().skip(1) {
            if !line.starts_with('\t') {
                break;
            }
            if line.trim_start().starts_with(&format!("'{member}' ")) {
                let bits = line.split("bits_offset=").nth(1).unwrap();
                let bits: u32 = bits.split_whitespace().next().unwrap().parse().unwrap();
                return bits / 8;
            }
        }
        panic!("{strukt}.{member} is not a direct member in bpftool's output");
    }

    #[test]
    fn resolves_every_member_on_this_kernel_and_agrees_with_bpftool() {
        let btf = load("/sys/kernel/btf/vmlinux").expect("this machine has kernel BTF");
        let (k, missing) = kernel_offsets(&btf);
        assert!(missing.is_empty(), "unresolved: {missing:?}");
        assert_eq!(k.task_exit_code, bpftool_offset("task_struct", "exit_code"));
        assert_eq!(k.task_nsproxy, bpftool_offset("task_struct", "nsproxy"));
        assert_eq!(k.nsproxy_net_ns, bpftool_offset("nsproxy", "net_ns"));
        assert_eq!(k.net_device_nd_net, bpftool_offset("net_device", "nd_net"));
        assert_eq!(
            k.tcp_bytes_received,
            bpftool_offset("tcp_sock", "bytes_received")
        );
        assert_eq!(k.tcp_lsndtime, bpftool_offset("tcp_sock", "lsndtime"));
        assert_eq!(
            k.tcp_data_segs_in,
            bpftool_offset("tcp_sock", "data_segs_in")
        );
        assert_eq!(
            k.tcp_data_segs_out,
            bpftool_offset("tcp_sock", "data_segs_out")
        );
        assert_eq!(k.tcp_snd_wl1, bpftool_offset("tcp_sock", "snd_wl1"));
        assert_eq!(k.tcp_snd_una, bpftool_offset("tcp_sock", "snd_una"));
        assert_eq!(k.tcp_snd_nxt, bpftool_offset("tcp_sock", "snd_nxt"));
        assert_eq!(k.files_fdt, bpftool_offset("files_struct", "fdt"));
        assert_eq!(k.fdtable_fd, bpftool_offset("fdtable", "fd"));
        assert_eq!(k.socket_sk, bpftool_offset("socket", "sk"));
        assert_eq!(
            k.sock_max_ack_backlog,
            bpftool_offset("sock", "sk_max_ack_backlog")
        );
        // tcp_sock starts with inet_connection_sock; lrcvtime lies inside its icsk_ack struct.
        let icsk_ack = bpftool_offset("inet_connection_sock", "icsk_ack");
        assert_eq!(bpftool_offset("tcp_sock", "inet_conn"), 0);
        assert!(
            k.tcp_lrcvtime > icsk_ack && k.tcp_lrcvtime < icsk_ack + 32,
            "{}",
            k.tcp_lrcvtime
        );
        // __sk_common is the first member of struct sock.
        assert_eq!(offset_of(&btf, "sock", "__sk_common"), Some(0));
        assert_eq!(k.sock_family, bpftool_offset("sock_common", "skc_family"));
        assert_eq!(k.sock_state, bpftool_offset("sock_common", "skc_state"));
        // skc_num sits in an anonymous struct inside an anonymous union, right after skc_dport.
        assert_eq!(k.sock_num, k.sock_dport + 2);
        // sk_buff.dev is inside anonymous unions too; it shares its slot with dev_scratch.
        assert_eq!(Some(k.skb_dev), offset_of(&btf, "sk_buff", "dev_scratch"));
    }

    #[test]
    fn this_kernel_gives_every_namespace_its_cookie_at_creation() {
        let btf = load("/sys/kernel/btf/vmlinux").expect("this machine has kernel BTF");
        assert!(
            net_cookie_at_creation(&btf),
            "6.18's net.net_cookie is a u64"
        );
        let (k, _) = kernel_offsets(&btf);
        assert_eq!(k.net_cookie, bpftool_offset("net", "net_cookie"));
    }

    #[test]
    fn unknown_members_are_reported_not_guessed() {
        let btf = load("/sys/kernel/btf/vmlinux").unwrap();
        assert_eq!(offset_of(&btf, "task_struct", "no_such_member"), None);
        assert_eq!(offset_of(&btf, "no_such_struct", "x"), None);
    }

    #[test]
    fn missing_btf_file_is_a_clear_error() {
        let Err(err) = load("/nonexistent/vmlinux") else {
            panic!("loading a missing file succeeded");
        };
        let err = err.to_string();
        assert!(err.contains("/nonexistent/vmlinux"), "{err}");
        assert!(err.contains("CONFIG_DEBUG_INFO_BTF"), "{err}");
    }
}
