//! The load generator: slow `GET /work?ms=M&id=<unique>` requests through HAProxy, on a fixed
//! schedule, with exact per-request outcomes.
//!
//! Traffic is a list of *waves*: at each wave's instant, `per_wave` requests are sent, one every
//! `stagger` (40 ms), each on its own connection (`Connection: close`). With HAProxy's
//! roundrobin (one thread), requests reach the servers in that fixed order, so with the
//! rotation primed (see `scenario`) slot 0, 2, ... of every wave go to the first server and
//! 1, 3, ... to the second while both are UP: which requests a stop hits is decided by the
//! schedule, not by chance. Fresh connections rather than keep-alive: every request is one
//! client connection and one server connection, so a cut or a refusal is one connection's fate,
//! and nothing is ever retried on a reused connection.

use std::{
    collections::BTreeMap,
    fmt,
    io::{Read, Write},
    net::{SocketAddr, SocketAddrV4, TcpStream},
    thread::JoinHandle,
    time::{Duration, Instant},
};

pub use super::schedule::{MAX_REQUESTS, STAGGER, Schedule, Wave};
use super::{clock, haproxy::Haproxy};

/// What the client got for one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// 200 from the backend.
    Ok,
    /// 502: the backend closed or reset the connection before responding.
    Cut,
    /// 503: HAProxy could not connect to the backend (refused, or no server).
    Refused,
    /// 504, or no complete response within the client's timeout.
    Timeout,
    /// Any other status.
    Other(u16),
    /// No HTTP response at all (the connection to HAProxy failed).
    Error(String),
    /// The client gave up before the response was complete and closed its connection.
    GaveUp,
}

impl Outcome {
    /// The outcome for an HTTP status.
    pub fn from_status(status: u16) -> Outcome {
        match status {
            200 => Outcome::Ok,
            502 => Outcome::Cut,
            503 => Outcome::Refused,
            504 => Outcome::Timeout,
            s => Outcome::Other(s),
        }
    }

    /// A short stable label: `ok`, `cut`, `refused`, `timeout`, `other:<status>`, `error`.
    pub fn label(&self) -> String {
        match self {
            Outcome::Ok => "ok".into(),
            Outcome::Cut => "cut".into(),
            Outcome::Refused => "refused".into(),
            Outcome::Timeout => "timeout".into(),
            Outcome::Other(s) => format!("other:{s}"),
            Outcome::Error(_) => "error".into(),
            Outcome::GaveUp => "gave-up".into(),
        }
    }
}

/// The client-side ground truth of one request.
#[derive(Clone, Debug)]
pub struct RequestRecord {
    /// Unique id (`<tag>-w<wave>-s<slot>`), also in the URL, the backend's log and HAProxy's log.
    pub id: String,
    pub wave: usize,
    pub slot: usize,
    /// Work the backend was asked to do.
    pub ms: u64,
    /// When the schedule wanted it sent.
    pub scheduled: Instant,
    /// When the client started connecting.
    pub start: Instant,
    /// When the response was complete (or the request failed).
    pub end: Instant,
    pub status: Option<u16>,
    pub outcome: Outcome,
    /// Client side of the connection to HAProxy.
    pub local: Option<SocketAddr>,
    /// `X-Backend` of the response: which backend answered (only when one did).
    pub x_backend: Option<String>,
    pub body: String,
    /// From HAProxy's log (see [`annotate`]): the server chosen, also for 502 and 503.
    pub server: Option<String>,
    /// From HAProxy's log: termination state (`----`, `SH--`, `SC--`, ...).
    pub flags: Option<String>,
    /// From HAProxy's log: source address of its connection to the server.
    pub server_conn: Option<SocketAddrV4>,
}

impl RequestRecord {
    /// The backend the request went to: HAProxy's choice, else the answering backend.
    pub fn backend(&self) -> Option<&str> {
        self.server.as_deref().or(self.x_backend.as_deref())
    }

    /// How late the request left compared with the schedule.
    pub fn lateness(&self) -> Duration {
        self.start.saturating_duration_since(self.scheduled)
    }
}

/// Load running in the background; [`Load::wait`] returns its records.
pub struct Load {
    pub tag: String,
    pub schedule: Schedule,
    dispatcher: JoinHandle<Vec<JoinHandle<RequestRecord>>>,
}

impl Load {
    /// Starts sending `schedule` to `frontend` in the background. Ids are `<tag>-w<w>-s<s>`
    /// (`tag`: letters, digits and `-` only).
    pub fn start(frontend: SocketAddr, schedule: Schedule, tag: &str) -> Load {
        Load::start_with(frontend, schedule, tag, Method::Get)
    }

    /// As [`Load::start`], every request sent with `method`.
    pub fn start_with(frontend: SocketAddr, schedule: Schedule, tag: &str, method: Method) -> Load {
        assert!(
            tag.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
            "tag {tag:?} must be URL-safe"
        );
        assert!(schedule.len() <= MAX_REQUESTS, "schedule too large");
        let sched = schedule.clone();
        let tag_owned = tag.to_string();
        let dispatcher = std::thread::Builder::new()
            .name("lab-load".into())
            .spawn(move || {
                let mut handles = Vec::with_capacity(sched.len());
                for (w, wave) in sched.waves.iter().enumerate() {
                    for (s, &ms) in wave.ms.iter().enumerate() {
                        let at = sched.dispatch_at(w, s);
                        clock::sleep_until(at);
                        let id = format!("{tag_owned}-w{w}-s{s}");
                        let timeout = Duration::from_millis(ms) + sched.timeout_extra;
                        let give_up = wave.give_up.get(s).copied().flatten();
                        handles.push(
                            std::thread::Builder::new()
                                .name(format!("lab-req-{w}-{s}"))
                                .spawn(move || {
                                    let mut r =
                                        request_until(frontend, &id, ms, timeout, method, give_up);
                                    r.wave = w;
                                    r.slot = s;
                                    r.scheduled = at;
                                    r
                                })
                                .expect("spawn a request thread"),
                        );
                    }
                }
                handles
            })
            .expect("spawn the load dispatcher");
        Load {
            tag: tag.to_string(),
            schedule,
            dispatcher,
        }
    }

    /// Waits for every request to finish (bounded by the schedule and the client timeout) and
    /// returns the records in schedule order.
    pub fn wait(self) -> Vec<RequestRecord> {
        let handles = self.dispatcher.join().expect("load dispatcher panicked");
        handles
            .into_iter()
            .map(|h| h.join().expect("request thread panicked"))
            .collect()
    }
}

/// Sends one `GET /work?ms=<ms>&id=<id>` to `frontend` on a fresh connection and records it.
pub fn request(frontend: SocketAddr, id: &str, ms: u64, timeout: Duration) -> RequestRecord {
    request_with(frontend, id, ms, timeout, Method::Get)
}

/// How a request is sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Method {
    /// `GET /work?...` with no body (idempotent: a proxy may retry it).
    #[default]
    Get,
    /// `POST /work?...` with a body of this many bytes (`x` each): not idempotent, so nginx
    /// does not retry it once it was sent (since 1.9.13, unless `non_idempotent`).
    Post(usize),
}

/// Most body bytes a [`Method::Post`] request may carry (one small write).
pub const MAX_POST_BODY: usize = 16 * 1024;

/// The request text for `/work?ms=<ms>&id=<id>` sent with `method`, in one buffer.
pub fn request_bytes(method: Method, id: &str, ms: u64) -> Vec<u8> {
    match method {
        Method::Get => {
            format!("GET /work?ms={ms}&id={id} HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n")
                .into_bytes()
        }
        Method::Post(n) => {
            assert!(n <= MAX_POST_BODY, "POST body of {n} bytes is too large");
            let mut req = format!(
                "POST /work?ms={ms}&id={id} HTTP/1.1\r\nHost: lab\r\nContent-Type: text/plain\r\n\
                 Content-Length: {n}\r\nConnection: close\r\n\r\n"
            )
            .into_bytes();
            req.resize(req.len() + n, b'x');
            req
        }
    }
}

/// As [`request`], sent with `method` (`POST` carries its body in the same write).
pub fn request_with(
    frontend: SocketAddr,
    id: &str,
    ms: u64,
    timeout: Duration,
    method: Method,
) -> RequestRecord {
    request_until(frontend, id, ms, timeout, method, None)
}

/// As [`request_with`]; the client closes its connection (a FIN, as a browser's tab or a
/// client's own timeout would) at `give_up` if the response is not complete by then.
pub fn request_until(
    frontend: SocketAddr,
    id: &str,
    ms: u64,
    timeout: Duration,
    method: Method,
    give_up: Option<Instant>,
) -> RequestRecord {
    let start = Instant::now();
    let mut rec = RequestRecord {
        id: id.to_string(),
        wave: 0,
        slot: 0,
        ms,
        scheduled: start,
        start,
        end: start,
        status: None,
        outcome: Outcome::Error(String::new()),
        local: None,
        x_backend: None,
        body: String::new(),
        server: None,
        flags: None,
        server_conn: None,
    };
    let deadline = start + timeout;
    let gave_up = |now: Instant| give_up.is_some_and(|g| now >= g);
    let res = (|| -> Result<Vec<u8>, Failure> {
        let mut s = TcpStream::connect_timeout(&frontend, Duration::from_secs(5))
            .map_err(|e| Failure::Error(format!("connect: {e}")))?;
        rec.local = s.local_addr().ok();
        s.set_write_timeout(Some(Duration::from_secs(5))).ok();
        // One write: `write!` on a socket sends each piece as its own segment, and Nagle's
        // algorithm then holds the last one for the peer's delayed ACK (40 ms).
        let req = request_bytes(method, id, ms);
        s.write_all(&req)
            .map_err(|e| Failure::Error(format!("write: {e}")))?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let now = Instant::now();
            if gave_up(now) {
                // Dropping the stream closes it.
                return Err(Failure::GaveUp);
            }
            let left = deadline.saturating_duration_since(now);
            if left.is_zero() {
                return Err(Failure::Timeout);
            }
            let left = give_up.map_or(left, |g| left.min(g.saturating_duration_since(now)));
            s.set_read_timeout(Some(left.max(Duration::from_micros(1))))
                .ok();
            match s.read(&mut chunk) {
                Ok(0) => return Ok(buf),
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    if gave_up(Instant::now()) {
                        return Err(Failure::GaveUp);
                    }
                    return Err(Failure::Timeout);
                }
                Err(e) if !buf.is_empty() => {
                    // A reset after a complete response still leaves the response.
                    let _ = e;
                    return Ok(buf);
                }
                Err(e) => return Err(Failure::Error(format!("read: {e}"))),
            }
        }
    })();
    rec.end = Instant::now();
    match res {
        Ok(buf) => {
            let text = String::from_utf8_lossy(&buf).into_owned();
            let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
            let status = head
                .lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|s| s.parse().ok());
            rec.x_backend = head.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("x-backend")
                    .then(|| v.trim().to_string())
            });
            rec.body = body.to_string();
            rec.status = status;
            rec.outcome = match status {
                Some(s) => Outcome::from_status(s),
                None => Outcome::Error(format!("no status line in {text:?}")),
            };
        }
        Err(Failure::Timeout) => rec.outcome = Outcome::Timeout,
        Err(Failure::GaveUp) => rec.outcome = Outcome::GaveUp,
        Err(Failure::Error(e)) => rec.outcome = Outcome::Error(e),
    }
    rec
}

/// How a request ended without a response.
enum Failure {
    Timeout,
    GaveUp,
    Error(String),
}

/// Fills `server`, `flags` and `server_conn` of each record from HAProxy's log, waiting up to
/// `timeout` for lines still to come. Returns the ids HAProxy never logged.
pub fn annotate(
    records: &mut [RequestRecord],
    haproxy: &Haproxy,
    timeout: Duration,
) -> Vec<String> {
    let ids: Vec<&str> = records.iter().map(|r| r.id.as_str()).collect();
    let logs = haproxy.wait_logged(&ids, timeout);
    let mut missing = Vec::new();
    for r in records.iter_mut() {
        match logs.get(&r.id) {
            Some(l) => {
                r.server = Some(l.server.clone());
                r.flags = Some(l.flags.clone());
                r.server_conn = l.server_conn;
            }
            None => missing.push(r.id.clone()),
        }
    }
    missing
}

/// Counts per outcome, and per server and outcome.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub total: usize,
    pub by_outcome: BTreeMap<String, usize>,
    /// server (HAProxy's choice; `?` when unknown) → outcome label → count.
    pub by_server: BTreeMap<String, BTreeMap<String, usize>>,
}

impl Summary {
    /// Requests with outcome `label` (see [`Outcome::label`]).
    pub fn count(&self, label: &str) -> usize {
        self.by_outcome.get(label).copied().unwrap_or(0)
    }

    /// Requests routed to `server` with outcome `label`.
    pub fn count_on(&self, server: &str, label: &str) -> usize {
        self.by_server
            .get(server)
            .and_then(|m| m.get(label))
            .copied()
            .unwrap_or(0)
    }

    /// Requests routed to `server`.
    pub fn routed_to(&self, server: &str) -> usize {
        self.by_server.get(server).map_or(0, |m| m.values().sum())
    }
}

/// Summarizes records.
pub fn summarize(records: &[RequestRecord]) -> Summary {
    let mut s = Summary {
        total: records.len(),
        ..Default::default()
    };
    for r in records {
        let label = r.outcome.label();
        *s.by_outcome.entry(label.clone()).or_default() += 1;
        *s.by_server
            .entry(r.backend().unwrap_or("?").to_string())
            .or_default()
            .entry(label)
            .or_default() += 1;
    }
    s
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} requests:", self.total)?;
        for (k, v) in &self.by_outcome {
            write!(f, " {k}={v}")?;
        }
        for (server, m) in &self.by_server {
            write!(f, " | {server}:")?;
            for (k, v) in m {
                write!(f, " {k}={v}")?;
            }
        }
        Ok(())
    }
}

/// Sends `ms=0` GETs (at most 4) through a round-robin balancer until one is answered by `s2`,
/// so the next request it routes goes to `s1`. Returns them.
pub fn prime(frontend: SocketAddr, tag: &str) -> Vec<RequestRecord> {
    let mut out = Vec::new();
    for i in 0..4 {
        let id = format!("{tag}-p{i}");
        let r = request(frontend, &id, 0, Duration::from_secs(5));
        assert_eq!(r.outcome, Outcome::Ok, "primer request failed: {r:?}");
        let to_s2 = r.x_backend.as_deref() == Some("s2");
        out.push(r);
        if to_s2 {
            return out;
        }
    }
    panic!("no primer request reached s2: {out:?}");
}
