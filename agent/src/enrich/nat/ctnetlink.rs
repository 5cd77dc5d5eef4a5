//! ctnetlink's wire format for the two requests `nat` makes (a GET by original tuple, a dump
//! by original destination), and the socket that sends them.

use std::{
    io,
    net::{IpAddr, SocketAddr},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use super::NatError;

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const CTA_FILTER: u16 = 25;
const CTA_FILTER_ORIG_FLAGS: u16 = 1;
/// `CTA_FILTER_F_CTA_IP_DST | CTA_FILTER_F_CTA_PROTO_NUM | CTA_FILTER_F_CTA_PROTO_DST_PORT`
/// (`net/netfilter/nf_internals.h`): a dump of the entries to one address and port.
const FILTER_TO_DESTINATION: u32 = (1 << 1) | (1 << 3) | (1 << 5);
const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const NLMSG_HDRLEN: usize = 16;
const NFGENMSG_LEN: usize = 4;

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn put_attr(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(align4(buf.len()), 0);
}

fn nested(buf: &mut Vec<u8>, kind: u16, fill: impl FnOnce(&mut Vec<u8>)) {
    let start = buf.len();
    buf.extend_from_slice(&[0; 4]);
    fill(buf);
    let len = (buf.len() - start) as u16;
    buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    buf[start + 2..start + 4].copy_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
}

fn ip_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// A TCP connection's tuple as ctnetlink names it. An IPv4-mapped IPv6 address is looked up
/// as IPv4 (a dual-stack socket's IPv4 connect), as conntrack tracks the packets.
fn family_of(from: SocketAddr, to: SocketAddr) -> Option<(u8, IpAddr, IpAddr)> {
    let canon = |a: SocketAddr| a.ip().to_canonical();
    match (canon(from), canon(to)) {
        (a @ IpAddr::V4(_), b @ IpAddr::V4(_)) => Some((libc::AF_INET as u8, a, b)),
        (a @ IpAddr::V6(_), b @ IpAddr::V6(_)) => Some((libc::AF_INET6 as u8, a, b)),
        _ => None,
    }
}

/// The `IPCTNL_MSG_CT_GET` request for the entry whose original tuple is `from` → `to` (TCP).
pub fn encode_get(from: SocketAddr, to: SocketAddr, seq: u32) -> Option<Vec<u8>> {
    let (family, src, dst) = family_of(from, to)?;
    let (src_kind, dst_kind) = ip_kinds(family);
    Some(request(family, NLM_F_REQUEST, seq, |b| {
        nested(b, CTA_TUPLE_ORIG, |b| {
            nested(b, CTA_TUPLE_IP, |b| {
                put_attr(b, src_kind, &ip_bytes(src));
                put_attr(b, dst_kind, &ip_bytes(dst));
            });
            proto(b, Some(from.port()), to.port());
        });
    }))
}

/// The dump of every TCP entry whose original destination is `to` (the kernel filters from
/// 5.9 on; before, it sends all and `parse_dump` keeps those).
pub fn encode_dump_to(to: SocketAddr, seq: u32) -> Vec<u8> {
    let ip = to.ip().to_canonical();
    let family = if ip.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    } as u8;
    let (_, dst_kind) = ip_kinds(family);
    request(family, NLM_F_REQUEST | NLM_F_DUMP, seq, |b| {
        nested(b, CTA_TUPLE_ORIG, |b| {
            nested(b, CTA_TUPLE_IP, |b| put_attr(b, dst_kind, &ip_bytes(ip)));
            proto(b, None, to.port());
        });
        nested(b, CTA_FILTER, |b| {
            put_attr(
                b,
                CTA_FILTER_ORIG_FLAGS,
                &FILTER_TO_DESTINATION.to_ne_bytes(),
            );
        });
    })
}

fn ip_kinds(family: u8) -> (u16, u16) {
    if family == libc::AF_INET as u8 {
        (CTA_IP_V4_SRC, CTA_IP_V4_DST)
    } else {
        (CTA_IP_V6_SRC, CTA_IP_V6_DST)
    }
}

fn proto(b: &mut Vec<u8>, src_port: Option<u16>, dst_port: u16) {
    nested(b, CTA_TUPLE_PROTO, |b| {
        put_attr(b, CTA_PROTO_NUM, &[libc::IPPROTO_TCP as u8]);
        if let Some(p) = src_port {
            put_attr(b, CTA_PROTO_SRC_PORT, &p.to_be_bytes());
        }
        put_attr(b, CTA_PROTO_DST_PORT, &dst_port.to_be_bytes());
    });
}

/// A ctnetlink request: the netlink and nfnetlink headers, then `attrs`.
fn request(family: u8, flags: u16, seq: u32, attrs: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut buf = vec![0; NLMSG_HDRLEN];
    buf.extend_from_slice(&[family, 0, 0, 0]);
    attrs(&mut buf);
    let len = buf.len() as u32;
    buf[0..4].copy_from_slice(&len.to_ne_bytes());
    let kind = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET;
    buf[4..6].copy_from_slice(&kind.to_ne_bytes());
    buf[6..8].copy_from_slice(&flags.to_ne_bytes());
    buf[8..12].copy_from_slice(&seq.to_ne_bytes());
    buf
}

/// The attributes of one level: (type without flags, payload).
fn attrs(mut b: &[u8]) -> impl Iterator<Item = Result<(u16, &[u8]), NatError>> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let kind = u16::from_ne_bytes([b[2], b[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > b.len() {
            b = &[];
            return Some(Err(NatError::Malformed("attribute length")));
        }
        let payload = &b[4..len];
        b = &b[align4(len).min(b.len())..];
        Some(Ok((kind, payload)))
    })
}

fn find(b: &[u8], kind: u16) -> Result<Option<&[u8]>, NatError> {
    for a in attrs(b) {
        let (k, p) = a?;
        if k == kind {
            return Ok(Some(p));
        }
    }
    Ok(None)
}

/// One end of a tuple attribute: its source, or its destination.
fn tuple_end(t: &[u8], source: bool) -> Result<SocketAddr, NatError> {
    let ip = find(t, CTA_TUPLE_IP)?.ok_or(NatError::Malformed("no CTA_TUPLE_IP"))?;
    let proto = find(t, CTA_TUPLE_PROTO)?.ok_or(NatError::Malformed("no CTA_TUPLE_PROTO"))?;
    let (v4, v6, port) = if source {
        (CTA_IP_V4_SRC, CTA_IP_V6_SRC, CTA_PROTO_SRC_PORT)
    } else {
        (CTA_IP_V4_DST, CTA_IP_V6_DST, CTA_PROTO_DST_PORT)
    };
    let addr = if let Some(a) = find(ip, v4)? {
        let o: [u8; 4] = a.try_into().map_err(|_| NatError::Malformed("IPv4 size"))?;
        IpAddr::from(o)
    } else {
        let a = find(ip, v6)?.ok_or(NatError::Malformed("no address"))?;
        let o: [u8; 16] = a.try_into().map_err(|_| NatError::Malformed("IPv6 size"))?;
        IpAddr::from(o)
    };
    let port = find(proto, port)?.ok_or(NatError::Malformed("no port"))?;
    let port: [u8; 2] = port
        .try_into()
        .map_err(|_| NatError::Malformed("port size"))?;
    Ok(SocketAddr::new(addr, u16::from_be_bytes(port)))
}

/// An entry's original destination and its reply's source (where it was really sent).
fn entry_ends(msg: &[u8], len: usize) -> Result<(SocketAddr, SocketAddr), NatError> {
    let body = msg
        .get(NLMSG_HDRLEN + NFGENMSG_LEN..len)
        .ok_or(NatError::Malformed("short entry"))?;
    let orig = find(body, CTA_TUPLE_ORIG)?.ok_or(NatError::Malformed("no original tuple"))?;
    let reply = find(body, CTA_TUPLE_REPLY)?.ok_or(NatError::Malformed("no reply tuple"))?;
    Ok((tuple_end(orig, false)?, tuple_end(reply, true)?))
}

/// The netlink messages in one datagram: (type, the message).
fn messages(mut b: &[u8]) -> impl Iterator<Item = Result<(u16, &[u8]), NatError>> {
    std::iter::from_fn(move || {
        if b.len() < NLMSG_HDRLEN {
            return None;
        }
        let len = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize;
        if len < NLMSG_HDRLEN || len > b.len() {
            b = &[];
            return Some(Err(NatError::Malformed("message length")));
        }
        let kind = u16::from_ne_bytes([b[4], b[5]]);
        let msg = &b[..len];
        b = &b[align4(len).min(b.len())..];
        Some(Ok((kind, msg)))
    })
}

/// One datagram of the answer to `encode_dump_to(to)`: the pods `to` was translated to, and
/// whether the dump is done.
pub fn parse_dump(buf: &[u8], to: SocketAddr, out: &mut Vec<SocketAddr>) -> Result<bool, NatError> {
    for m in messages(buf) {
        let (kind, msg) = m?;
        match kind {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                return match parse_reply(msg) {
                    Ok(_) => Ok(true),
                    Err(e) => Err(e),
                };
            }
            k if k == (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW => {
                let (dst, real) = entry_ends(msg, msg.len())?;
                if same(dst, to) && !same(real, to) {
                    out.push(real);
                }
            }
            _ => return Err(NatError::Malformed("not a conntrack entry")),
        }
    }
    Ok(false)
}

pub(super) fn same(a: SocketAddr, b: SocketAddr) -> bool {
    a.ip().to_canonical() == b.ip().to_canonical() && a.port() == b.port()
}

/// The answer to `encode_get`: the reply tuple's source (the real destination), `None` when
/// the kernel has no such entry.
pub fn parse_reply(msg: &[u8]) -> Result<Option<SocketAddr>, NatError> {
    if msg.len() < NLMSG_HDRLEN {
        return Err(NatError::Malformed("short message"));
    }
    let len = (u32::from_ne_bytes([msg[0], msg[1], msg[2], msg[3]]) as usize).min(msg.len());
    let kind = u16::from_ne_bytes([msg[4], msg[5]]);
    if kind == NLMSG_ERROR {
        let code = msg
            .get(NLMSG_HDRLEN..NLMSG_HDRLEN + 4)
            .ok_or(NatError::Malformed("short error"))?;
        let errno = -i32::from_ne_bytes([code[0], code[1], code[2], code[3]]);
        return match errno {
            libc::ENOENT => Ok(None),
            e => Err(NatError::Io(io::Error::from_raw_os_error(e))),
        };
    }
    if kind != (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW {
        return Err(NatError::Malformed("not a conntrack entry"));
    }
    let body = msg
        .get(NLMSG_HDRLEN + NFGENMSG_LEN..len)
        .ok_or(NatError::Malformed("short entry"))?;
    let reply = find(body, CTA_TUPLE_REPLY)?.ok_or(NatError::Malformed("no reply tuple"))?;
    tuple_end(reply, true).map(Some)
}

/// A ctnetlink socket of the host's network namespace.
pub struct Conntrack {
    fd: OwnedFd,
    seq: u32,
}

impl Conntrack {
    /// Opens it when the agent runs in the host's network namespace (`in_host_netns`, as the
    /// agent found it): a socket keeps the namespace it was made in.
    pub fn open(in_host_netns: bool) -> Result<Self, NatError> {
        if !in_host_netns {
            return Err(NatError::NotHostNetns);
        }
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_NETFILTER,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error().into());
        }
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // A lookup is answered at once or never: the pipeline does not wait longer.
        let timeout = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&timeout as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error().into());
        }
        Ok(Self { fd, seq: 0 })
    }

    fn send(&mut self, req: &[u8]) -> Result<(), NatError> {
        let sent = unsafe { libc::send(self.fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
        if sent < 0 {
            return Err(io::Error::last_os_error().into());
        }
        Ok(())
    }

    /// The next datagram answering request `self.seq` (answers to earlier requests that timed
    /// out are skipped).
    fn recv<'b>(&self, buf: &'b mut [u8]) -> Result<&'b [u8], NatError> {
        loop {
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                return Err(io::Error::last_os_error().into());
            }
            let n = n as usize;
            if n >= 12 && u32::from_ne_bytes([buf[8], buf[9], buf[10], buf[11]]) != self.seq {
                continue;
            }
            return Ok(&buf[..n]);
        }
    }

    /// Where `from` → `to` was really sent: `Ok(None)` when not tracked.
    pub fn lookup(
        &mut self,
        from: SocketAddr,
        to: SocketAddr,
    ) -> Result<Option<SocketAddr>, NatError> {
        self.seq = self.seq.wrapping_add(1);
        let req = encode_get(from, to, self.seq).ok_or(NatError::Malformed("mixed families"))?;
        self.send(&req)?;
        let mut buf = [0u8; 4096];
        parse_reply(self.recv(&mut buf)?)
    }

    /// Where the tracked connections to `to` were really sent (one address per entry).
    pub fn served_by(&mut self, to: SocketAddr) -> Result<Vec<SocketAddr>, NatError> {
        self.seq = self.seq.wrapping_add(1);
        self.send(&encode_dump_to(to, self.seq))?;
        let mut out = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        // Bounded: a table of a million entries is some 4,000 datagrams.
        for _ in 0..MAX_DUMP_DATAGRAMS {
            if parse_dump(self.recv(&mut buf)?, to, &mut out)? {
                return Ok(out);
            }
        }
        Err(NatError::Malformed("dump without an end"))
    }
}

/// Datagrams one dump may take (64 KiB each).
const MAX_DUMP_DATAGRAMS: usize = 16_384;

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// A reply as the kernel builds it (nested attributes flagged), for an entry DNATed from
    /// `vip` to `pod`.
    fn entry(client: SocketAddr, vip: SocketAddr, pod: SocketAddr) -> Vec<u8> {
        let mut buf = vec![0; NLMSG_HDRLEN];
        buf.extend_from_slice(&[libc::AF_INET as u8, 0, 0, 0]);
        let tuple = |b: &mut Vec<u8>, kind, src: SocketAddr, dst: SocketAddr| {
            nested(b, kind, |b| {
                nested(b, CTA_TUPLE_IP, |b| {
                    put_attr(b, CTA_IP_V4_SRC, &ip_bytes(src.ip()));
                    put_attr(b, CTA_IP_V4_DST, &ip_bytes(dst.ip()));
                });
                nested(b, CTA_TUPLE_PROTO, |b| {
                    put_attr(b, CTA_PROTO_NUM, &[6]);
                    put_attr(b, CTA_PROTO_SRC_PORT, &src.port().to_be_bytes());
                    put_attr(b, CTA_PROTO_DST_PORT, &dst.port().to_be_bytes());
                });
            });
        };
        tuple(&mut buf, CTA_TUPLE_ORIG, client, vip);
        tuple(&mut buf, CTA_TUPLE_REPLY, pod, client);
        put_attr(&mut buf, 3, &0x1a8u32.to_be_bytes());
        let len = buf.len() as u32;
        buf[0..4].copy_from_slice(&len.to_ne_bytes());
        buf[4..6]
            .copy_from_slice(&((NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW).to_ne_bytes());
        buf
    }

    #[test]
    fn the_reply_tuple_names_the_pod_a_virtual_ip_was_translated_to() {
        let (client, vip, pod) = (
            sa("10.0.2.15:40000"),
            sa("10.96.0.10:80"),
            sa("10.88.0.7:8080"),
        );
        assert_eq!(parse_reply(&entry(client, vip, pod)).unwrap(), Some(pod));
    }

    #[test]
    fn a_request_carries_the_original_tuple_and_an_unknown_entry_is_none() {
        let req = encode_get(sa("10.0.2.15:40000"), sa("10.96.0.10:80"), 7).unwrap();
        assert_eq!(
            u32::from_ne_bytes(req[0..4].try_into().unwrap()) as usize,
            req.len()
        );
        assert_eq!(u16::from_ne_bytes([req[4], req[5]]), 0x0101);
        let orig = find(&req[NLMSG_HDRLEN + NFGENMSG_LEN..], CTA_TUPLE_ORIG)
            .unwrap()
            .unwrap();
        let ip = find(orig, CTA_TUPLE_IP).unwrap().unwrap();
        assert_eq!(find(ip, CTA_IP_V4_DST).unwrap(), Some(&[10, 96, 0, 10][..]));
        // A mapped IPv4 socket is looked up as IPv4; mixed families not at all.
        assert!(encode_get(sa("[::ffff:10.0.2.15]:1"), sa("10.96.0.10:80"), 1).is_some());
        assert!(encode_get(sa("[fd00::1]:1"), sa("10.96.0.10:80"), 1).is_none());
        let mut err = vec![0; NLMSG_HDRLEN + 4];
        err[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        err[NLMSG_HDRLEN..].copy_from_slice(&(-libc::ENOENT).to_ne_bytes());
        assert_eq!(parse_reply(&err).unwrap(), None);
        err[NLMSG_HDRLEN..].copy_from_slice(&(-libc::EPERM).to_ne_bytes());
        assert!(matches!(parse_reply(&err), Err(NatError::Io(_))));
    }

    #[test]
    fn a_dump_keeps_the_translated_entries_to_the_address_until_done() {
        let vip = sa("10.96.0.10:80");
        let mut datagram = entry(sa("10.0.2.15:1"), vip, sa("10.88.0.7:8080"));
        // An entry to another address (an old kernel's unfiltered dump) and an untranslated one.
        datagram.extend(entry(
            sa("10.0.2.15:2"),
            sa("10.96.0.99:80"),
            sa("10.88.0.8:8080"),
        ));
        datagram.extend(entry(sa("10.0.2.15:3"), vip, vip));
        let mut out = Vec::new();
        assert!(
            !parse_dump(&datagram, vip, &mut out).unwrap(),
            "more to come"
        );
        assert_eq!(out, vec![sa("10.88.0.7:8080")]);
        let mut done = vec![0u8; NLMSG_HDRLEN + 4];
        done[0..4].copy_from_slice(&((NLMSG_HDRLEN + 4) as u32).to_ne_bytes());
        done[4..6].copy_from_slice(&NLMSG_DONE.to_ne_bytes());
        assert!(parse_dump(&done, vip, &mut out).unwrap());
        let req = encode_dump_to(vip, 3);
        assert_eq!(
            u16::from_ne_bytes([req[6], req[7]]),
            NLM_F_REQUEST | NLM_F_DUMP
        );
        let filter = find(&req[NLMSG_HDRLEN + NFGENMSG_LEN..], CTA_FILTER)
            .unwrap()
            .unwrap();
        assert_eq!(
            find(filter, CTA_FILTER_ORIG_FLAGS).unwrap(),
            Some(&FILTER_TO_DESTINATION.to_ne_bytes()[..])
        );
    }

    #[test]
    fn malformed_answers_are_errors_not_panics() {
        let good = entry(
            sa("10.0.2.15:40000"),
            sa("10.96.0.10:80"),
            sa("10.88.0.7:8080"),
        );
        for cut in 0..good.len() {
            let mut m = good[..cut].to_vec();
            if m.len() >= 4 {
                m[0..4].copy_from_slice(&(cut as u32).to_ne_bytes());
            }
            let _ = parse_reply(&m);
        }
        let mut bad = good.clone();
        bad[NLMSG_HDRLEN + NFGENMSG_LEN] = 0xff;
        assert!(parse_reply(&bad).is_err());
    }
}
