//! The clients' side of a pod deletion, counted by the clients themselves: slow requests in
//! flight when the stop comes, and a prober that keeps connecting through the deletion and
//! records what each attempt met (an answer, a cut, a refusal, nothing).

use std::{
    fs,
    io::{ErrorKind, Read, Write},
    net::{SocketAddr, SocketAddrV4, TcpStream},
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use super::network::require_bridge_route;
use crate::lab::client::{Method, Outcome, RequestRecord, request, request_bytes};

/// Slow `GET /work` requests, each on its own connection, running in the background.
pub struct InFlight {
    pub ids: Vec<String>,
    handles: Vec<JoinHandle<RequestRecord>>,
}

impl InFlight {
    /// Sends `n` requests of `ms` ms of work to `addr` (ids `<tag>-<i>`) after checking the
    /// route to it, and returns once the server has logged the start of every one (its
    /// `requests.log` in `log_dir`), 10 s at most.
    pub fn start(addr: SocketAddrV4, n: usize, ms: u64, tag: &str, log_dir: &Path) -> InFlight {
        require_bridge_route((*addr.ip()).into()).unwrap_or_else(|e| panic!("{e}"));
        let ids: Vec<String> = (0..n).map(|i| format!("{tag}-{i}")).collect();
        let handles = ids
            .iter()
            .map(|id| {
                let id = id.clone();
                // Bounded: the work plus a margin; a cut ends it at once.
                let timeout = Duration::from_millis(ms) + Duration::from_secs(10);
                std::thread::Builder::new()
                    .name(format!("cri-req-{id}"))
                    .spawn(move || request(addr.into(), &id, ms, timeout))
                    .expect("spawn a request thread")
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        let log = log_dir.join("requests.log");
        loop {
            let text = fs::read_to_string(&log).unwrap_or_default();
            let started =
                |id: &String| text.lines().any(|l| l.starts_with(&format!("start {id} ")));
            if ids.iter().all(started) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the server did not start all of {ids:?} within 10 s: {text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        InFlight { ids, handles }
    }

    /// Every request's record, once each has ended.
    pub fn finish(self) -> Vec<RequestRecord> {
        self.handles
            .into_iter()
            .map(|h| h.join().expect("request thread panicked"))
            .collect()
    }
}

/// Whether a request was cut: the connection was made and sent, no complete response came
/// (EOF or a reset instead).
pub fn was_cut(r: &RequestRecord) -> bool {
    matches!(&r.outcome, Outcome::Error(e) if !e.starts_with("connect:"))
}

/// What one connection attempt met.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// Connected and answered in full.
    Answered,
    /// Connected, then EOF or a reset before a complete response.
    Cut,
    /// The connect was refused (RST: the address there, nothing listening).
    Refused,
    /// No answer to the SYN within the connect timeout, or no host (the address gone).
    Unreachable,
    /// Anything else (a bug in the lab, not a pod's doing).
    Other(String),
}

/// One attempt and when it started.
#[derive(Clone, Debug)]
pub struct Probe {
    pub at: Instant,
    pub attempt: Attempt,
}

/// Connects to `addr` every `period` until stopped (or `max` attempts), each after checking
/// the route to it: it stops, recording the reason, as soon as the route does not go via the
/// lab's bridge.
pub struct Prober {
    stop: Arc<AtomicBool>,
    probes: Arc<Mutex<Vec<Probe>>>,
    handle: Option<JoinHandle<Option<String>>>,
}

/// How long an attempt waits for the SYN's answer: a vanished pod address gets none.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

impl Prober {
    pub fn start(addr: SocketAddrV4, period: Duration, max: usize) -> Prober {
        let stop = Arc::new(AtomicBool::new(false));
        let probes = Arc::new(Mutex::new(Vec::new()));
        let (s, p) = (stop.clone(), probes.clone());
        let handle = std::thread::Builder::new()
            .name("cri-prober".into())
            .spawn(move || {
                for n in 0..max {
                    if s.load(Ordering::SeqCst) {
                        return None;
                    }
                    if let Err(e) = require_bridge_route((*addr.ip()).into()) {
                        return Some(e);
                    }
                    let at = Instant::now();
                    let attempt = attempt(addr.into(), &format!("probe-{n}"));
                    p.lock().expect("probes lock").push(Probe { at, attempt });
                    crate::lab::clock::sleep_until(at + period);
                }
                None
            })
            .expect("spawn the prober");
        Prober {
            stop,
            probes,
            handle: Some(handle),
        }
    }

    /// How many attempts so far met `kind`.
    pub fn count(&self, kind: &Attempt) -> usize {
        self.probes
            .lock()
            .expect("probes lock")
            .iter()
            .filter(|p| &p.attempt == kind)
            .count()
    }

    /// Stops it and returns every attempt; panics if it stopped for a missing route.
    pub fn finish(mut self) -> Vec<Probe> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let reason = h.join().expect("prober panicked");
            assert!(reason.is_none(), "the prober stopped: {reason:?}");
        }
        self.probes.lock().expect("probes lock").clone()
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// One attempt: connect, `GET /work?ms=0`, read the response to its end.
fn attempt(addr: SocketAddr, id: &str) -> Attempt {
    let mut s = match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
        Ok(s) => s,
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => return Attempt::Refused,
        Err(e)
            if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::HostUnreachable)
                || e.raw_os_error() == Some(libc::EHOSTUNREACH) =>
        {
            return Attempt::Unreachable;
        }
        Err(e) => return Attempt::Other(format!("connect: {e}")),
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    if s.write_all(&request_bytes(Method::Get, id, 0)).is_err() {
        return Attempt::Cut;
    }
    let mut buf = Vec::new();
    match s.read_to_end(&mut buf) {
        Ok(_) if complete(&buf) => Attempt::Answered,
        Err(_) if complete(&buf) => Attempt::Answered,
        Ok(_) | Err(_) => Attempt::Cut,
    }
}

/// A whole `200` response (backend.py always sends Content-Length).
fn complete(buf: &[u8]) -> bool {
    let text = String::from_utf8_lossy(buf);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    let len = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse::<usize>().ok())?
    });
    head.starts_with("HTTP/1.1 200") && len == Some(body.len())
}

/// The attempts' counts by kind, for a test's report and assertions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeCounts {
    pub answered: usize,
    pub cut: usize,
    pub refused: usize,
    pub unreachable: usize,
    pub other: usize,
}

impl ProbeCounts {
    pub fn of(probes: &[Probe]) -> ProbeCounts {
        let mut c = ProbeCounts::default();
        for p in probes {
            match p.attempt {
                Attempt::Answered => c.answered += 1,
                Attempt::Cut => c.cut += 1,
                Attempt::Refused => c.refused += 1,
                Attempt::Unreachable => c.unreachable += 1,
                Attempt::Other(_) => c.other += 1,
            }
        }
        c
    }
}
