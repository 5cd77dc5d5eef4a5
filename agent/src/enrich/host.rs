//! The host as the attribution stage sees it: processes, their cgroups and network
//! namespaces, sockets, addresses, and container metadata. `HostView` is the seam between the
//! pure attribution logic and the filesystem; `Procfs` is the real one (thin I/O over the
//! `procfs` crate and cgroupfs), tests use a fake.

use std::{
    io::Read as _,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
};

use super::{cgroup_path::CgroupOwner, runtime_meta::ContainerMeta};

/// One process, as far as attribution cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcInfo {
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
    /// The pid inside its innermost pid namespace (1 for a container's init).
    pub ns_pid: Option<u32>,
    pub netns: Option<u32>,
    /// The container cgroup path chosen from /proc/<pid>/cgroup, if it names one.
    pub cgroup_path: Option<String>,
}

/// A TCP socket from /proc/<pid>/net/tcp{,6}.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketEntry {
    pub inode: u64,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub listening: bool,
    pub established: bool,
    /// For a listener: connections waiting in its accept queue (the receive queue column of
    /// /proc/net/tcp; its send queue column is 0 for listeners, not the limit).
    pub rx_queue: u32,
}

pub trait HostView {
    /// The pids in containers (whose cgroup names one), each with its container cgroup path:
    /// the listing a scan walks every second. Full details come from [`HostView::process`],
    /// read only for a container the scan does not know yet.
    fn container_pids(&self) -> Vec<(u32, String)>;
    fn process(&self, pid: u32) -> Option<ProcInfo>;
    /// TCP sockets of `pid`'s network namespace.
    fn sockets(&self, pid: u32) -> Vec<SocketEntry>;
    /// The listening TCP sockets of `pid`'s network namespace only: cheap however many
    /// connections it holds (see [`listening_prefix`]).
    fn listeners(&self, pid: u32) -> Vec<SocketEntry> {
        self.sockets(pid)
            .into_iter()
            .filter(|s| s.listening)
            .collect()
    }
    /// Inodes of the sockets `pid` has open: which of a shared namespace's sockets are its.
    fn socket_inodes(&self, pid: u32) -> Vec<u64>;
    /// Local addresses of `pid`'s network namespace (loopback excluded).
    fn local_ips(&self, pid: u32) -> Vec<IpAddr>;
    /// The cgroup v2 id (the directory's inode) of a container cgroup path.
    fn cgroup_v2_id(&self, path: &str) -> Option<u64>;
    /// When `pid` started, in kernel monotonic ns (to the clock tick); `None` if unknown.
    fn start_ns(&self, _pid: u32) -> Option<u64> {
        None
    }
    /// The processes of one container cgroup path (as `container_pids` names it): cheaper
    /// than walking every process when only that container is asked about.
    fn cgroup_pids(&self, path: &str) -> Vec<u32> {
        self.container_pids()
            .into_iter()
            .filter(|(_, p)| p == path)
            .map(|(pid, _)| pid)
            .collect()
    }
    fn metadata(&self, owner: &CgroupOwner) -> ContainerMeta;
    /// The text of `pid`'s network namespace's `net/netstat`.
    fn netstat(&self, pid: u32) -> Option<String>;
}

/// Local IPv4 addresses from a `/proc/<pid>/net/fib_trie` text: the `/32 host LOCAL` leaves.
/// Hand-written: procfs does not parse fib_trie.
pub fn local_ipv4_from_fib_trie(text: &str) -> Vec<Ipv4Addr> {
    let mut out = Vec::new();
    let mut last: Option<Ipv4Addr> = None;
    for line in text.lines() {
        let t = line.trim_start_matches([' ', '|', '+', '-']).trim();
        if let Ok(ip) = t.parse::<Ipv4Addr>() {
            last = Some(ip);
        } else if t.starts_with("/32 host LOCAL")
            && let Some(ip) = last
            && !ip.is_loopback()
            && !out.contains(&ip)
        {
            out.push(ip);
        }
    }
    out
}

/// The size of each read of a TCP table's listening prefix (see `Procfs::listeners`).
const PREFIX_READ: usize = 512;

/// The header and the LISTEN lines that open a `/proc/<pid>/net/tcp{,6}` text: the kernel prints
/// listening sockets first (its iterator walks the listening hash before the established one),
/// so reading stops at the first other state. Printing the rest costs the kernel a walk of the
/// established hash per read(): with a few thousand connections in a reconnect storm, about a
/// second for the whole file, measured. Hand-written: procfs parses whole tables only.
pub fn listening_prefix(r: impl std::io::BufRead) -> std::io::Result<String> {
    let mut out = String::new();
    for (i, line) in r.lines().enumerate() {
        let line = line?;
        if i > 0 && line.split_whitespace().nth(3) != Some("0A") {
            break;
        }
        out.push_str(&line);
        out.push('\n');
    }
    Ok(out)
}

/// TCP sockets in use (listening ones included) from a namespace's `net/sockstat` (`TCP:`)
/// or `net/sockstat6` (`TCP6:`) text.
pub fn tcp_in_use(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("TCP: ").or_else(|| l.strip_prefix("TCP6: ")))?
        .split_whitespace()
        .skip_while(|w| *w != "inuse")
        .nth(1)?
        .parse()
        .ok()
}

fn socket_entry(e: procfs::net::TcpNetEntry) -> SocketEntry {
    SocketEntry {
        inode: e.inode,
        local: e.local_address,
        remote: e.remote_address,
        listening: e.state == procfs::net::TcpState::Listen,
        established: e.state == procfs::net::TcpState::Established,
        rx_queue: e.rx_queue,
    }
}

/// The inode of a `/proc/<pid>/ns/net` link target, `net:[4026531840]`.
pub fn netns_inode(link: &str) -> Option<u32> {
    link.strip_prefix("net:[")?
        .strip_suffix(']')?
        .parse::<u64>()
        .ok()
        .map(|i| i as u32)
}

/// The real host: `/proc` and cgroupfs, possibly mounted elsewhere (DaemonSet).
pub struct Procfs {
    pub proc_root: PathBuf,
    pub cgroup_root: PathBuf,
    /// Prefix for runtime state directories (`/` on the host, `/host` in a DaemonSet pod).
    pub host_root: PathBuf,
}

impl Procfs {
    /// The TCP tables of `pid`'s namespace that hold any socket (`tcp`, `tcp6`). Reading a
    /// table costs the kernel a walk of the host's whole established hash (every namespace's
    /// connections) past the namespace's last entry; a table with none still costs that walk,
    /// twice. Measured with 1,000 namespaces and 200,000 sockets: 20 ms a walk, and most
    /// containers have no IPv6 socket. `sockstat` is per-namespace counters: no walk.
    fn tcp_tables(&self, pid: u32) -> Vec<&'static str> {
        let net = self.proc_root.join(pid.to_string()).join("net");
        [("tcp", "sockstat"), ("tcp6", "sockstat6")]
            .into_iter()
            .filter(|(_, stat)| {
                std::fs::read_to_string(net.join(stat))
                    .ok()
                    .and_then(|t| tcp_in_use(&t))
                    .is_none_or(|n| n > 0)
            })
            .map(|(table, _)| table)
            .collect()
    }

    fn info(&self, p: &procfs::process::Process) -> Option<ProcInfo> {
        let cgroup_text =
            std::fs::read_to_string(self.proc_root.join(p.pid.to_string()).join("cgroup")).ok();
        self.info_with_cgroup(p, cgroup_text)
    }

    fn info_with_cgroup(
        &self,
        p: &procfs::process::Process,
        cgroup_text: Option<String>,
    ) -> Option<ProcInfo> {
        let status = p.status().ok()?;
        // One readlink: procfs's `namespaces()` stats every namespace link of the process,
        // which was most of the agent's CPU at rest (the scan runs every second).
        let netns = std::fs::read_link(self.proc_root.join(p.pid.to_string()).join("ns/net"))
            .ok()
            .and_then(|l| netns_inode(&l.to_string_lossy()));
        Some(ProcInfo {
            pid: p.pid as u32,
            ppid: status.ppid as u32,
            comm: status.name,
            ns_pid: status
                .nspid
                .as_ref()
                .and_then(|v| v.last())
                .map(|p| *p as u32),
            netns,
            cgroup_path: cgroup_text
                .and_then(|t| super::cgroup_path::container_path_from_proc_cgroup(&t)),
        })
    }
}

impl HostView for Procfs {
    // Walked by hand, not with `procfs::process::all_processes`: that opens a directory
    // handle per pid, and reading a whole file through std stats and seeks it first, which
    // tripled the syscalls of a walk that runs every second over every process of the node.
    // Here a process in no container costs one open, two reads and a close.
    fn container_pids(&self) -> Vec<(u32, String)> {
        let Ok(dir) = std::fs::read_dir(&self.proc_root) else {
            return Vec::new();
        };
        let mut buf = Vec::with_capacity(4096);
        dir.filter_map(Result::ok)
            .filter_map(|e| {
                let pid: u32 = e.file_name().to_str()?.parse().ok()?;
                buf.clear();
                // Through `take`: `File::read_to_end` would stat and seek for a size first.
                std::fs::File::open(e.path().join("cgroup"))
                    .and_then(|f| f.take(1 << 16).read_to_end(&mut buf))
                    .ok()?;
                let path = super::cgroup_path::container_path_from_proc_cgroup(
                    std::str::from_utf8(&buf).ok()?,
                )?;
                super::cgroup_path::parse_cgroup_path(&path)?;
                Some((pid, path))
            })
            .collect()
    }

    fn process(&self, pid: u32) -> Option<ProcInfo> {
        let p =
            procfs::process::Process::new_with_root(self.proc_root.join(pid.to_string())).ok()?;
        self.info(&p)
    }

    fn sockets(&self, pid: u32) -> Vec<SocketEntry> {
        let Ok(p) = procfs::process::Process::new_with_root(self.proc_root.join(pid.to_string()))
        else {
            return Vec::new();
        };
        let tables = self.tcp_tables(pid);
        let v4 = tables.contains(&"tcp").then(|| p.tcp().unwrap_or_default());
        let v6 = tables
            .contains(&"tcp6")
            .then(|| p.tcp6().unwrap_or_default());
        v4.into_iter()
            .chain(v6)
            .flatten()
            .map(socket_entry)
            .collect()
    }

    fn listeners(&self, pid: u32) -> Vec<SocketEntry> {
        use procfs::FromBufReadSI;
        let dir = self.proc_root.join(pid.to_string()).join("net");
        self.tcp_tables(pid)
            .into_iter()
            .filter_map(|f| {
                let file = std::fs::File::open(dir.join(f)).ok()?;
                // Small reads: the kernel fills each read() to its size, and every entry past
                // the listeners is found by walking the host's established hash (all
                // namespaces). 8 KiB reads walked it for 27 entries, a few ms with 200,000
                // sockets on the host; 512 bytes, for about 3.
                let text =
                    listening_prefix(std::io::BufReader::with_capacity(PREFIX_READ, file)).ok()?;
                procfs::net::TcpNetEntries::from_buf_read(
                    text.as_bytes(),
                    procfs::current_system_info(),
                )
                .ok()
            })
            .flat_map(|t| t.0)
            .map(socket_entry)
            .filter(|s| s.listening)
            .collect()
    }

    fn socket_inodes(&self, pid: u32) -> Vec<u64> {
        let Ok(p) = procfs::process::Process::new_with_root(self.proc_root.join(pid.to_string()))
        else {
            return Vec::new();
        };
        let Ok(fds) = p.fd() else { return Vec::new() };
        fds.filter_map(Result::ok)
            .filter_map(|fd| match fd.target {
                procfs::process::FDTarget::Socket(inode) => Some(inode),
                _ => None,
            })
            .collect()
    }

    fn local_ips(&self, pid: u32) -> Vec<IpAddr> {
        let base = self.proc_root.join(pid.to_string()).join("net");
        let mut ips: Vec<IpAddr> = std::fs::read_to_string(base.join("fib_trie"))
            .map(|t| {
                local_ipv4_from_fib_trie(&t)
                    .into_iter()
                    .map(IpAddr::V4)
                    .collect()
            })
            .unwrap_or_default();
        if let Ok(p) = procfs::process::Process::new_with_root(self.proc_root.join(pid.to_string()))
        {
            // Global IPv6 addresses from if_inet6 (procfs parses it per process root).
            if let Ok(text) = std::fs::read_to_string(base.join("if_inet6")) {
                for line in text.lines() {
                    let Some(hex) = line.split_whitespace().next() else {
                        continue;
                    };
                    if let Ok(v) = u128::from_str_radix(hex, 16) {
                        let ip = std::net::Ipv6Addr::from(v);
                        if !ip.is_loopback() && (ip.segments()[0] & 0xffc0) != 0xfe80 {
                            ips.push(IpAddr::V6(ip));
                        }
                    }
                }
            }
            drop(p);
        }
        ips
    }

    /// `/proc/<pid>/stat`'s start time, in clock ticks since boot (boot time equals kernel
    /// monotonic time on a node that never suspends).
    fn start_ns(&self, pid: u32) -> Option<u64> {
        let p =
            procfs::process::Process::new_with_root(self.proc_root.join(pid.to_string())).ok()?;
        let ticks = p.stat().ok()?.starttime;
        let hz = procfs::ticks_per_second().max(1);
        Some(ticks.saturating_mul(1_000_000_000 / hz))
    }

    fn cgroup_pids(&self, path: &str) -> Vec<u32> {
        let rel = path.trim_start_matches('/');
        [
            self.cgroup_root.join("unified").join(rel),
            self.cgroup_root.join(rel),
        ]
        .into_iter()
        .find_map(|p| std::fs::read_to_string(p.join("cgroup.procs")).ok())
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
    }

    fn cgroup_v2_id(&self, path: &str) -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        let rel = path.trim_start_matches('/');
        [
            self.cgroup_root.join("unified").join(rel),
            self.cgroup_root.join(rel),
        ]
        .into_iter()
        .find(|p| p.join("cgroup.procs").exists() && is_v2(p))
        .and_then(|p| std::fs::metadata(p).ok())
        .map(|m| m.ino())
    }

    fn netstat(&self, pid: u32) -> Option<String> {
        std::fs::read_to_string(self.proc_root.join(pid.to_string()).join("net/netstat")).ok()
    }

    fn metadata(&self, owner: &CgroupOwner) -> ContainerMeta {
        super::runtime_meta::lookup(&self.host_root, owner)
    }
}

/// A cgroup v2 directory has `cgroup.controllers`; v1 ones do not.
fn is_v2(dir: &Path) -> bool {
    dir.join("cgroup.controllers").exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_local_addresses_from_a_container_fib_trie() {
        let text = include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/procfs/podman-container-fib_trie.txt"
        ));
        assert_eq!(
            local_ipv4_from_fib_trie(text),
            [Ipv4Addr::new(10, 88, 0, 21)]
        );
        assert!(local_ipv4_from_fib_trie("garbage\n/32 host LOCAL\n").is_empty());
    }

    #[test]
    fn lists_only_the_pids_whose_cgroup_is_a_container() {
        let root = std::env::temp_dir().join(format!("drainwatch-proc-{}", std::process::id()));
        let fixture = |name: &str| {
            std::fs::read(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("fixtures/cgroup")
                    .join(name),
            )
            .expect("fixture")
        };
        for (pid, text) in [
            ("7", fixture("podman-runc-cgroupfs-hybrid.txt")),
            ("8", fixture("host-process-v1.txt")),
            ("9", fixture("podman-runc-cgroupfs-hybrid-conmon.txt")),
            // Not a process.
            ("self-ish", fixture("podman-runc-cgroupfs-hybrid.txt")),
        ] {
            std::fs::create_dir_all(root.join(pid)).expect("mkdir");
            std::fs::write(root.join(pid).join("cgroup"), text).expect("write");
        }
        // A process that exited between the directory listing and the read.
        std::fs::create_dir_all(root.join("10")).expect("mkdir");
        let host = Procfs {
            proc_root: root.clone(),
            cgroup_root: root.clone(),
            host_root: root.clone(),
        };
        let pids = host.container_pids();
        std::fs::remove_dir_all(&root).expect("cleanup");
        assert_eq!(
            pids,
            [(
                7,
                "/libpod_parent/libpod-4f4e9086b29e13bebb381f9754f31b75ecb96335aa4d3e86d39a3fd2262b2a44"
                    .to_string()
            )]
        );
    }

    #[test]
    fn reads_tcp_sockets_in_use_from_sockstat() {
        let v4 = "sockets: used 2093\nTCP: inuse 201 orphan 0 tw 0 alloc 203 mem 3\nUDP: inuse 0 mem 0\n";
        assert_eq!(tcp_in_use(v4), Some(201));
        let v6 = "TCP6: inuse 0\nUDP6: inuse 0\nUDPLITE6: inuse 0\nRAW6: inuse 0\n";
        assert_eq!(tcp_in_use(v6), Some(0));
        assert_eq!(tcp_in_use("UDP: inuse 3\n"), None);
        assert_eq!(tcp_in_use("TCP: inuse x\n"), None);
    }

    #[test]
    fn reads_a_network_namespace_link() {
        assert_eq!(netns_inode("net:[4026531840]"), Some(4026531840));
        assert_eq!(netns_inode("mnt:[4026531840]"), None);
        assert_eq!(netns_inode("net:[x]"), None);
    }

    #[test]
    fn reads_only_the_listeners_that_open_a_tcp_table() {
        use procfs::FromBufReadSI;
        // Two listeners (8080 with 2 connections waiting), then six established sockets.
        let text = include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/procfs/net-tcp-6.18.txt"
        ));
        let prefix = listening_prefix(text.as_bytes()).unwrap();
        assert_eq!(prefix.lines().count(), 3, "header and two listeners");
        let entries = procfs::net::TcpNetEntries::from_buf_read(
            prefix.as_bytes(),
            procfs::current_system_info(),
        )
        .unwrap()
        .0;
        let got: Vec<(u16, u32, bool)> = entries
            .into_iter()
            .map(socket_entry)
            .map(|s| (s.local.port(), s.rx_queue, s.listening))
            .collect();
        assert_eq!(got, [(8080, 2, true), (9090, 0, true)]);
        assert_eq!(listening_prefix("".as_bytes()).unwrap(), "");
    }
}
