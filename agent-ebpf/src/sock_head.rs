//! A socket's namespace and tuple from one read of its head, for the accept hooks (see
//! [`sock_netns_tuple`]).

use drainwatch_common::{AF_INET, AF_INET6, EventKind, Tuple, fields::NO_OFFSET};

use crate::util::{CONFIG, Ns, cfg, kread, sock_netns, sock_tuple};

/// Words of a `struct sock`'s head read at once by `sock_netns_tuple`: its `sock_common`'s
/// IPv4 addresses, ports, family and namespace pointer lie in the first 64 bytes.
const HEAD_WORDS: usize = 8;

/// The `size`-byte field at `off` of a head read whole, if it lies in it (naturally aligned, so
/// within one word; a little-endian load, as the kernel's own).
#[inline(always)]
fn head_field(head: &[u64; HEAD_WORDS], off: u32, size: u32) -> Option<u64> {
    if off == NO_OFFSET || !off.is_multiple_of(size) || off + size > (HEAD_WORDS * 8) as u32 {
        return None;
    }
    // A match, not an index: the verifier then sees only constant stack offsets.
    let w = match off / 8 {
        0 => head[0],
        1 => head[1],
        2 => head[2],
        3 => head[3],
        4 => head[4],
        5 => head[5],
        6 => head[6],
        7 => head[7],
        _ => return None,
    };
    let v = w >> ((off % 8) * 8);
    Some(if size >= 8 {
        v
    } else {
        v & ((1u64 << (size * 8)) - 1)
    })
}

/// [`sock_netns`] and [`sock_tuple`] from one read of the socket's head (two helper calls for
/// an IPv4 socket where the two made seven: most of an accept hook's time); the fields a
/// kernel put elsewhere, and IPv6 addresses, are read on their own. The namespace's inode
/// only: the agent reads an accept by its socket, and the cookie would be a third call.
#[inline(always)]
pub fn sock_netns_tuple(kind: EventKind, sk: u64, t: &mut Tuple) -> Ns {
    let k = &CONFIG.kernel;
    let Some(head) = kread::<[u64; HEAD_WORDS]>(kind, sk, 0) else {
        return Ns::UNKNOWN;
    };
    let f = |off: u32, size: u32| head_field(&head, off, size);
    let (Some(family), Some(num), Some(dport), Some(net)) = (
        f(cfg(&k.sock_family), 2),
        f(cfg(&k.sock_num), 2),
        f(cfg(&k.sock_dport), 2),
        f(cfg(&k.sock_net), 8),
    ) else {
        sock_tuple(kind, sk, t);
        return Ns {
            inum: sock_netns(kind, sk).inum,
            cookie: 0,
        };
    };
    t.family = family as u16;
    t.sport = num as u16;
    t.dport = u16::from_be(dport as u16);
    if t.family == AF_INET {
        match (f(cfg(&k.sock_rcv_saddr), 4), f(cfg(&k.sock_daddr), 4)) {
            (Some(saddr), Some(daddr)) => {
                t.saddr[..4].copy_from_slice(&(saddr as u32).to_le_bytes());
                t.daddr[..4].copy_from_slice(&(daddr as u32).to_le_bytes());
            }
            _ => sock_tuple(kind, sk, t),
        }
    } else if t.family == AF_INET6 {
        let v6 = |off: u32| kread::<[u8; 16]>(kind, sk, off).unwrap_or([0; 16]);
        t.saddr = v6(cfg(&k.sock_v6_rcv_saddr));
        t.daddr = v6(cfg(&k.sock_v6_daddr));
    }
    Ns {
        inum: kread::<u32>(kind, net, cfg(&k.net_inum)).unwrap_or(0),
        cookie: 0,
    }
}
