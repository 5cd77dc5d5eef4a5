//! Bare connection attempts as a client's own record of them: when its `connect()` began and
//! what it met. The truth of the labs whose loss is attempts that never connected (a vanished
//! address, a closed listener, a Service without endpoints).

use std::{
    io::ErrorKind,
    net::{SocketAddr, SocketAddrV4, TcpStream},
    time::{Duration, Instant},
};

/// What one attempt met.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Met {
    Connected,
    /// ECONNREFUSED: a RST, or an ICMP port unreachable (a filter's reject).
    Refused,
    /// No answer within the connect timeout, or no host.
    Unanswered,
    Other(String),
}

/// One attempt: when its `connect()` began, and what it met.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub at: Instant,
    pub met: Met,
}

/// Connects to `addr` once, waiting `timeout` for the SYN's answer.
pub fn attempt(addr: SocketAddrV4, timeout: Duration) -> Attempt {
    let at = Instant::now();
    let met = match TcpStream::connect_timeout(&SocketAddr::V4(addr), timeout) {
        Ok(_) => Met::Connected,
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => Met::Refused,
        Err(e)
            if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::HostUnreachable)
                || e.raw_os_error() == Some(libc::EHOSTUNREACH) =>
        {
            Met::Unanswered
        }
        Err(e) => Met::Other(e.to_string()),
    };
    Attempt { at, met }
}

/// How many of `attempts` met `m`.
pub fn count(attempts: &[Attempt], m: &Met) -> usize {
    attempts.iter().filter(|a| &a.met == m).count()
}

/// Those the lab cannot classify (it must not go on with any).
pub fn unclassified(attempts: &[Attempt]) -> Vec<&Attempt> {
    attempts
        .iter()
        .filter(|a| matches!(a.met, Met::Other(_)))
        .collect()
}
