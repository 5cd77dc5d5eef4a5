//! Talking to a backend from the host: a `Gate` server's greeting, a one-shot HTTP GET, and
//! the check that keeps the lab from sending to an address off the host.

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddrV4, TcpStream},
    time::Duration,
};

use super::LAB_AGENT;
use crate::lab::net::require_bridge_route;

/// A `Gate` server's greeting line on a fresh connection (closed afterwards).
pub fn greeting(addr: SocketAddrV4, timeout: Duration) -> Result<String, String> {
    if !on_local_link(*addr.ip()) {
        return Err(format!(
            "{} is on no local bridge: its container is gone",
            addr.ip()
        ));
    }
    let s =
        TcpStream::connect_timeout(&addr.into(), timeout).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(timeout)).ok();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(s), &mut line)
        .map_err(|e| format!("read: {e}"))?;
    if line.starts_with("hello ") && line.ends_with('\n') {
        Ok(line)
    } else {
        Err(format!("not a greeting: {line:?}"))
    }
}

/// A one-shot `GET path` over a fresh connection (`Connection: close`): status and body.
pub fn http_get(
    addr: impl Into<std::net::SocketAddr>,
    path: &str,
    timeout: Duration,
) -> Result<(u16, String), String> {
    let addr = addr.into();
    if let std::net::IpAddr::V4(ip) = addr.ip()
        && !ip.is_loopback()
        && !on_local_link(ip)
    {
        return Err(format!("{ip} is on no local bridge: its container is gone"));
    }
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(timeout)).ok();
    s.set_write_timeout(Some(timeout)).ok();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: lab\r\nUser-Agent: {LAB_AGENT}\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&buf);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status line in {text:?}"))?;
    let body = text.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
    Ok((status, body.to_string()))
}

/// Whether `ip` is routed through a local bridge, such as podman's. When the last container
/// leaves it, netavark deletes the bridge and its route, and a stale container address would
/// then meet the fallback blackhole (or, without it, the default route, off the host): the lab
/// never sends anything to such an address. `ip route get`, not `/proc/net/route`: that lists
/// the blackhole like a directly connected network.
pub fn on_local_link(ip: Ipv4Addr) -> bool {
    require_bridge_route(ip.into()).is_ok()
}
