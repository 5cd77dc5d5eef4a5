//! What the host network namespace's traffic is kept for. Most connections in the host
//! namespace (kubelet, sshd, node agents talking to each other on loopback) touch no container:
//! the programs drop them before reserving a record, unless one end is in these maps, which the
//! agent keeps equal to what it knows of containers.

use crate::AF_INET;

/// `WATCH_PORTS` entries: one byte per port (an array, so the lookup is inlined). Ports of
/// listeners that host-network containers own or owned. Index 0 is never a port: it is set
/// when any port is, so a program can skip per-socket work while none is.
pub const PORTS: u32 = 65536;
pub const ANY_PORT: u32 = 0;

/// Capacity of `WATCH_ADDRS`: containers' addresses outside the host namespace.
pub const ADDRS: u32 = 16384;

/// Capacity of `POD_LISTENERS`: listening ports (open or closed) in pods' namespaces that more
/// than one container shares, by [`pod_listener`]. A loopback connect to one is another
/// container's (a sidecar's) proxying: kept whole. `POD_PORTS` (one byte per port, as
/// `WATCH_PORTS`) says which ports have any entry, so most loopback connects cost no lookup.
pub const POD_LISTENERS: u32 = 16384;

/// The `POD_LISTENERS` key of `port` in the namespace of inode `inum`.
#[inline(always)]
pub fn pod_listener(inum: u32, port: u16) -> u64 {
    (u64::from(inum) << 16) | u64::from(port)
}

/// A `WATCH_ADDRS` key: an IPv4 address (first 4 bytes, rest zero) or an IPv6 one. Aligned to
/// 4 for word stores on the eBPF side (see `Tuple`).
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Addr {
    pub addr: [u8; 16],
    pub family: u16,
    pub _pad: u16,
}

impl Addr {
    /// The key for an address as the kernel reports it; IPv4-mapped IPv6 addresses (a
    /// dual-stack socket talking IPv4) become the IPv4 key. `None` for loopback and unset
    /// addresses, which are never a container's from the host namespace.
    #[inline(always)]
    pub fn of(family: u16, a: &[u8; 16]) -> Option<Self> {
        let v4 = |b: &[u8]| {
            let b = [b[0], b[1], b[2], b[3]];
            // Shifted into place rather than copied into a zeroed array, which the eBPF side
            // would zero with a byte-at-a-time `memset` call.
            let addr = (u128::from(u32::from_be_bytes(b)) << 96).to_be_bytes();
            (b[0] != 127 && b != [0, 0, 0, 0]).then_some(Self {
                addr,
                family: AF_INET,
                _pad: 0,
            })
        };
        if family == AF_INET {
            return v4(&a[..4]);
        }
        let mapped = a[..10] == [0; 10] && a[10] == 0xff && a[11] == 0xff;
        if mapped {
            return v4(&a[12..]);
        }
        let unset_or_loopback = a[..15] == [0; 15] && a[15] <= 1;
        (!unset_or_loopback).then_some(Self {
            addr: *a,
            family,
            _pad: 0,
        })
    }
}

pod!(Addr);

const _: () = assert!(core::mem::size_of::<Addr>() == 20);
