//! The keep-alive lab: persistent HTTP/1.1 clients reusing their connections to a backend
//! that is stopped meanwhile, of two kinds:
//! - [`ClientKind::Plain`]: one connection per client, reused without any check (Python's
//!   `http.client`, most hand-written clients), written here;
//! - [`ClientKind::Pool`]: Node's own `http.Agent({keepAlive: true})` shared by all clients
//!   (`tests/lab/keepalive/pool.js`, run by the host's Node): while a connection waits in the
//!   pool Node keeps reading it, so a server FIN drops it before reuse and the next request
//!   opens a new connection (refused once the listener is closed). Only a FIN arriving after
//!   the request was written still loses it. Node never re-sends a request by itself.
//!
//! against three servers ([`ServerKind`]): the race (Go's `Shutdown`: listener and idle
//! connections closed at SIGTERM), the safe drain (`Connection: close` for 1 s first) and one
//! that never closes keep-alive connections (SIGKILLed at the deadline).
//!
//! Ground truth ([`KaRun`]): each client's own per-request result (errno, whether the
//! connection was reused), the server's request log, and the namespace's own counters
//! (`TcpOutRsts`, `TCPAbortOnClose`); never drainwatch's numbers.

use std::{
    collections::HashSet,
    fs,
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddrV4, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{
    agent::{Agent, metric_sum, stop_record, sync},
    lab::{
        Backend, BackendOpts, Mode, StopTimes,
        clock::instant_of_mono_ns,
        container::{LAB_DIR, WorkEntry, unique_name},
    },
    snmp_tcp, tcp_ext,
};

/// How a client reuses its keep-alive connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientKind {
    /// Reused without a check (Python's `http.client`).
    Plain,
    /// Node's `http.Agent` with `keepAlive`: an idle connection the server closed is dropped.
    Pool,
}

impl ClientKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ClientKind::Plain => "plain",
            ClientKind::Pool => "node-agent",
        }
    }
}

/// How the server ends its keep-alive connections at SIGTERM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerKind {
    /// `Drain` with no delay: the listener and every idle connection closed at once.
    Race,
    /// `Drain` with `Connection: close` on every response for 1 s, then the closes.
    Safe,
    /// `KeepAlive`: never closes them; SIGKILLed at the deadline.
    NeverCloses,
}

impl ServerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ServerKind::Race => "race",
            ServerKind::Safe => "safe",
            ServerKind::NeverCloses => "never-closes",
        }
    }
}

/// One keep-alive stop.
#[derive(Clone, Debug)]
pub struct KaSpec {
    pub client: ClientKind,
    pub server: ServerKind,
    pub clients: usize,
    /// A client's pause between its requests, drawn in this range (ms).
    pub gap_ms: (u64, u64),
    /// The work each request asks of the server, drawn in this range (ms).
    pub work_ms: (u64, u64),
    /// Traffic before the stop.
    pub traffic: Duration,
    pub grace_secs: u32,
    pub seed: u64,
}

impl KaSpec {
    /// The lab's fixed shape: 20 clients, a request of 20–200 ms every 0–300 ms, the stop 2 s
    /// into the traffic, a grace of 10 s (4 s for the server that is killed).
    pub fn new(client: ClientKind, server: ServerKind) -> KaSpec {
        KaSpec {
            client,
            server,
            clients: 20,
            gap_ms: (0, 300),
            work_ms: (20, 200),
            traffic: Duration::from_secs(2),
            grace_secs: if server == ServerKind::NeverCloses {
                4
            } else {
                10
            },
            seed: 4300,
        }
    }
}

/// One request as its client saw it.
#[derive(Clone, Debug)]
pub struct KaRequest {
    pub id: String,
    /// Sent on a connection that had carried an earlier request.
    pub reused: bool,
    /// The client's port (its connection), when known.
    pub port: Option<u16>,
    /// When its connection was opened (plain clients), the request written, and it ended.
    pub connected: Option<Instant>,
    pub sent: Instant,
    pub ended: Instant,
    /// Answered in full.
    pub ok: bool,
    /// Why not: the errno's name (`ECONNRESET`, `ECONNREFUSED`, `EPIPE`), `eof` (closed with
    /// no answer), or the library's code.
    pub code: Option<String>,
}

/// Whether the server lets the client reuse the connection after a response.
#[derive(Debug, PartialEq, Eq)]
pub enum Reuse {
    KeepAlive,
    /// `Connection: close`.
    Close,
}

fn errno_name(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ECONNRESET) => "ECONNRESET".into(),
        Some(libc::EPIPE) => "EPIPE".into(),
        Some(libc::ECONNREFUSED) => "ECONNREFUSED".into(),
        Some(libc::ETIMEDOUT) | Some(libc::EAGAIN) => "ETIMEDOUT".into(),
        Some(n) => format!("errno {n}"),
        None => e.kind().to_string(),
    }
}

/// One plain keep-alive connection: requests until one fails, the server answers `Connection:
/// close` (as every client honours it: the client moves on), or `until`; no reconnect and no
/// check of the connection before reuse. Request ids are `c<n>-<k>`.
pub fn plain_client(
    addr: SocketAddrV4,
    n: usize,
    seed: u64,
    (gap, work): ((u64, u64), (u64, u64)),
    until: Instant,
) -> Vec<KaRequest> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut out = Vec::new();
    let mut s = TcpStream::connect_timeout(&addr.into(), Duration::from_secs(2)).expect("connect");
    let connected = Instant::now();
    let port = s.local_addr().ok().map(|a| a.port());
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    for k in 0.. {
        if Instant::now() > until {
            break;
        }
        let id = format!("c{n}-{k}");
        let ms = rng.u64(work.0..=work.1);
        let req = format!(
            "GET /work?ms={ms}&id={id} HTTP/1.1\r\nHost: lab\r\nUser-Agent: keepalive-client\r\n\r\n"
        );
        let sent = Instant::now();
        let answer = match s.write_all(req.as_bytes()) {
            Ok(()) => read_response(&mut s, &id),
            Err(e) => Err(errno_name(&e)),
        };
        out.push(KaRequest {
            id,
            reused: k > 0,
            port,
            connected: Some(connected),
            sent,
            ended: Instant::now(),
            ok: answer.is_ok(),
            code: answer.as_ref().err().cloned(),
        });
        if answer != Ok(Reuse::KeepAlive) {
            break;
        }
        thread::sleep(Duration::from_millis(rng.u64(gap.0..=gap.1)));
    }
    out
}

/// Reads one response (headers, then Content-Length bytes): an error unless it answered `id`.
pub fn read_response(s: &mut TcpStream, id: &str) -> Result<Reuse, String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                let ok = head.starts_with("http/1.1 200")
                    && &buf[end + 4..end + 4 + len] == id.as_bytes();
                let close = head.lines().any(|l| l == "connection: close");
                return match (ok, close) {
                    (false, _) => Err(format!("bad answer: {}", head.lines().next().unwrap_or(""))),
                    (true, true) => Ok(Reuse::Close),
                    (true, false) => Ok(Reuse::KeepAlive),
                };
            }
        }
        match s.read(&mut chunk) {
            Ok(0) => return Err("eof".into()),
            Err(e) => return Err(errno_name(&e)),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The host's Node (Node 20: `http.Agent` is part of it).
const NODE: &str = "/usr/bin/node";

/// The Node pool client script.
pub fn pool_script() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/lab/keepalive/pool.js"
    ))
}

/// `pool.js` running on the host against `addr`; its log in `log`.
struct PoolClient {
    child: Child,
    log: PathBuf,
    ready: mpsc::Receiver<()>,
}

impl PoolClient {
    fn spawn(addr: SocketAddrV4, spec: &KaSpec, for_ms: u64, log: PathBuf) -> PoolClient {
        let num = |v: u64| v.to_string();
        let mut child = Command::new(NODE)
            .arg(pool_script())
            .args([
                "--host",
                &addr.ip().to_string(),
                "--port",
                &num(addr.port().into()),
            ])
            .args([
                "--clients",
                &spec.clients.to_string(),
                "--seed",
                &num(spec.seed),
            ])
            .args([
                "--gap-min",
                &num(spec.gap_ms.0),
                "--gap-max",
                &num(spec.gap_ms.1),
            ])
            .args([
                "--work-min",
                &num(spec.work_ms.0),
                "--work-max",
                &num(spec.work_ms.1),
            ])
            .args(["--for-ms", &num(for_ms), "--log"])
            .arg(&log)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {NODE} {}: {e}", pool_script().display()));
        let out = child.stdout.take().expect("piped stdout");
        let (tx, ready) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if line == "ready" {
                    let _ = tx.send(());
                }
            }
        });
        PoolClient { child, log, ready }
    }

    /// Every loop had its first answer: every client holds a pooled connection.
    fn wait_ready(&mut self) {
        if self.ready.recv_timeout(Duration::from_secs(10)).is_err() {
            let _ = self.child.kill();
            panic!(
                "the Node pool client never had every first answer: {}",
                fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }

    /// Its requests and how many pooled connections it dropped on the server's FIN, once it
    /// has ended by itself (bounded).
    fn join(mut self, bound: Duration) -> (Vec<KaRequest>, u64) {
        let deadline = Instant::now() + bound;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    assert!(status.success(), "the Node pool client failed: {status}");
                    break;
                }
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    panic!("the Node pool client did not end within {bound:?}");
                }
            }
        }
        let text = fs::read_to_string(&self.log).expect("the pool client's log");
        let (mut reqs, mut fins) = (Vec::new(), 0);
        for line in text.lines() {
            let v: Value = serde_json::from_str(line).expect("a JSON line");
            if v.get("idle_fin").is_some() {
                fins += 1;
                continue;
            }
            let ns = |k: &str| {
                v[k].as_str()
                    .and_then(|s| s.parse().ok())
                    .map(instant_of_mono_ns)
                    .unwrap_or_else(|| panic!("{k} in {line}"))
            };
            reqs.push(KaRequest {
                id: v["req"].as_str().expect("req").to_string(),
                reused: v["reused"] == true,
                port: v["port"].as_u64().and_then(|p| u16::try_from(p).ok()),
                connected: None,
                sent: ns("sent"),
                ended: ns("ended"),
                ok: v["ok"] == true,
                code: v["code"].as_str().map(str::to_string),
            });
        }
        (reqs, fins)
    }
}

/// What one keep-alive stop did, by the clients, the server and the kernel.
pub struct KaRun {
    pub spec: KaSpec,
    pub requests: Vec<KaRequest>,
    /// Pooled connections the Node pool dropped on the server's FIN before reusing them.
    pub idle_fins: u64,
    /// The server's request log.
    pub log: Vec<WorkEntry>,
    /// The namespace's `TCPAbortOnClose` over the stop: connections the server (or its exit)
    /// closed with a request unread, reset by the close.
    pub unread: u64,
    /// The namespace's `Tcp: OutRsts` over the stop.
    pub out_rsts: u64,
    /// drainwatch's `drainwatch_connection_resets_total{direction="sent"}` over the stop.
    pub rsts_metric: f64,
    pub exit_code: i32,
    pub stop: StopTimes,
    pub record: Value,
}

impl KaRun {
    /// Starts the server and `spec`'s clients, stops the server after the traffic, and reads
    /// every truth and the agent's record.
    pub fn run(agent: &Agent, spec: &KaSpec) -> KaRun {
        let (mode, drain_delay) = match spec.server {
            ServerKind::Race => (Mode::Drain, Some(Duration::ZERO)),
            ServerKind::Safe => (Mode::Drain, Some(Duration::from_secs(1))),
            ServerKind::NeverCloses => (Mode::KeepAlive, None),
        };
        let name = format!("ka{}", spec.server.as_str().replace('-', ""));
        let b = Backend::start(
            &name,
            mode,
            BackendOpts {
                drain_delay,
                ..BackendOpts::default()
            },
        );
        agent.wait_adopted(&b.container);
        b.require_route();
        let addr = b.addr();
        // Long enough to outlive the stop: clients end at a failure or `Connection: close`.
        let traffic_for = spec.traffic + Duration::from_secs(u64::from(spec.grace_secs) + 4);
        let (mut pool, mut plain) = (None, Vec::new());
        match spec.client {
            ClientKind::Plain => {
                let until = Instant::now() + traffic_for;
                let shape = (spec.gap_ms, spec.work_ms);
                plain = (0..spec.clients)
                    .map(|n| {
                        let seed = spec.seed * 1000 + n as u64;
                        thread::spawn(move || plain_client(addr, n, seed, shape, until))
                    })
                    .collect();
            }
            ClientKind::Pool => {
                let log = PathBuf::from(LAB_DIR).join(format!("{}.jsonl", unique_name("pool")));
                let mut p = PoolClient::spawn(addr, spec, traffic_for.as_millis() as u64, log);
                p.wait_ready();
                pool = Some(p);
            }
        }
        thread::sleep(spec.traffic);
        let ns_pid = b.netns_pid();
        let sent_rsts = |agent: &Agent| {
            metric_sum(
                &agent.metrics_text(),
                "drainwatch_connection_resets_total",
                &[("container", b.container.as_str()), ("direction", "sent")],
            )
        };
        sync(agent);
        let (rsts_before, metric_before) = (snmp_tcp(ns_pid, "OutRsts"), sent_rsts(agent));
        let unread_before = tcp_ext(ns_pid, "TCPAbortOnClose");
        let stop = b.stop(spec.grace_secs);
        let (requests, idle_fins) = match pool {
            Some(p) => {
                let path = p.log.clone();
                let out = p.join(traffic_for + Duration::from_secs(15));
                let _ = fs::remove_file(path);
                out
            }
            None => (
                plain
                    .into_iter()
                    .flat_map(|c| c.join().expect("client"))
                    .collect(),
                0,
            ),
        };
        let exit_code = b.exit_code();
        let record = stop_record(agent, &b.id);
        sync(agent);
        KaRun {
            spec: spec.clone(),
            requests,
            idle_fins,
            log: b.work_log(),
            unread: tcp_ext(ns_pid, "TCPAbortOnClose") - unread_before,
            out_rsts: snmp_tcp(ns_pid, "OutRsts") - rsts_before,
            rsts_metric: sent_rsts(agent) - metric_before,
            exit_code,
            stop,
            record,
        }
    }

    pub fn failed(&self) -> impl Iterator<Item = &KaRequest> {
        self.requests.iter().filter(|r| !r.ok)
    }

    fn seen(&self) -> HashSet<&str> {
        self.log.iter().map(|e| e.id.as_str()).collect()
    }

    /// Failed requests on reused connections that the server never logged: reset by the
    /// closed socket they reached, or unread at the server's close (`unread`).
    pub fn lost_on_reuse(&self) -> u64 {
        let seen = self.seen();
        self.failed()
            .filter(|r| r.reused && !seen.contains(r.id.as_str()))
            .count() as u64
    }

    /// The truth of `sent_after_close`: requests that reached a connection the server had
    /// already closed, i.e. [`lost_on_reuse`](Self::lost_on_reuse) less those its close reset
    /// unread (in flight at the close: cuts). None if the kernel counted more unread than the
    /// clients lost (a truth that does not add up).
    pub fn sent_after_close(&self) -> Option<u64> {
        self.lost_on_reuse().checked_sub(self.unread)
    }

    /// Of [`sent_after_close`](Self::sent_after_close), how many may instead have been read by
    /// a killed server that died before logging them (cuts). Only a SIGKILLed server can: its
    /// connections all close at the exit, so a request sent before any client saw the exit
    /// (the earliest failure) reached a live socket, and only the kernel's `TCPAbortOnClose`
    /// tells how many of those were unread; the rest were read, unlogged. 0 for a server that
    /// exits by itself (it logs every request it reads).
    pub fn read_unlogged_at_most(&self) -> u64 {
        if self.exit_code != 137 {
            return 0;
        }
        let Some(first) = self.failed().map(|r| r.ended).min() else {
            return 0;
        };
        let seen = self.seen();
        let before = self
            .failed()
            .filter(|r| r.reused && !seen.contains(r.id.as_str()) && r.sent < first)
            .count() as u64;
        before.saturating_sub(self.unread)
    }

    /// `sent_after_close` as the truth knows it: `(lo, hi)`, hi less those that may have been
    /// read unlogged (see [`read_unlogged_at_most`](Self::read_unlogged_at_most)).
    pub fn sent_after_close_range(&self) -> Option<(u64, u64)> {
        let hi = self.sent_after_close()?;
        Some((hi.saturating_sub(self.read_unlogged_at_most()), hi))
    }

    /// `inflight_cut` as the truth knows it: the server's cuts and the unread, and up to
    /// [`read_unlogged_at_most`](Self::read_unlogged_at_most) more.
    pub fn inflight_cut_range(&self) -> (u64, u64) {
        let lo = self.cut_in_server() + self.unread;
        (lo, lo + self.read_unlogged_at_most())
    }

    /// Failed requests the server had read (its log has their start): cut in flight, whether
    /// its work ended or not (a response its close or its kill cut off is lost all the same).
    pub fn cut_in_server(&self) -> u64 {
        self.cuts().count() as u64
    }

    /// The failed requests the server had read.
    fn cuts(&self) -> impl Iterator<Item = &KaRequest> {
        let started: HashSet<&str> = self
            .log
            .iter()
            .filter(|e| e.started)
            .map(|e| e.id.as_str())
            .collect();
        self.failed()
            .filter(move |r| started.contains(r.id.as_str()))
    }

    /// The stop's outcome by the truth: SIGKILLed at the deadline (exit 137); else its listener
    /// closed early if a client's connect was refused; else drained.
    pub fn outcome(&self) -> &'static str {
        if self.exit_code == 137 {
            "killed_at_deadline"
        } else if self.refused() > 0 {
            "listener_closed_early"
        } else {
            "drained"
        }
    }

    /// New connections refused (the pool's, once its connection was dropped).
    pub fn refused(&self) -> u64 {
        self.failed()
            .filter(|r| r.code.as_deref() == Some("ECONNREFUSED"))
            .count() as u64
    }

    /// Failed requests on new connections that are neither refused nor seen by the server:
    /// none is expected (reported, so a surprise shows).
    pub fn lost_on_new(&self) -> u64 {
        let seen = self.seen();
        self.failed()
            .filter(|r| {
                !r.reused
                    && r.code.as_deref() != Some("ECONNREFUSED")
                    && !seen.contains(r.id.as_str())
            })
            .count() as u64
    }

    /// drainwatch's `loss.<field>` (u64::MAX if absent).
    pub fn loss(&self, field: &str) -> u64 {
        self.record["loss"][field].as_u64().unwrap_or(u64::MAX)
    }

    /// The record's `resets_sent`, summed over its reasons.
    pub fn record_rsts(&self) -> u64 {
        self.record["loss"]["resets_sent"]
            .as_object()
            .map_or(0, |m| m.values().filter_map(Value::as_u64).sum())
    }

    /// Asserts that the verdict names the requests sent to closed connections exactly when
    /// there were some (`n`).
    pub fn assert_verdict_names(&self, n: u64) {
        let verdict = self.verdict();
        if n == 0 {
            assert!(!verdict.contains("already closed"), "{verdict}");
            return;
        }
        let requests = if n == 1 {
            "1 request".to_string()
        } else {
            format!("{n} requests")
        };
        assert!(
            verdict.contains(&format!(
                "{requests} reached keep-alive connections it had already closed"
            )),
            "{verdict}"
        );
    }

    pub fn verdict(&self) -> &str {
        self.record["verdict"].as_str().unwrap_or_default()
    }

    /// How long its connection had been idle when `r` was sent: since the answer to the
    /// connection's previous request (the same client port) reached the client. The pool's
    /// LIFO reuse hands a request the connection another client's answer just freed, so this
    /// is often far shorter than the client's own pause.
    pub fn connection_idle(&self, r: &KaRequest) -> Option<Duration> {
        let port = r.port?;
        self.requests
            .iter()
            .filter(|p| p.port == Some(port) && p.ok && p.ended <= r.sent)
            .map(|p| r.sent - p.ended)
            .min()
    }

    /// Cuts (failed requests the server read) whose connection carried the previous answer
    /// less than one kernel tick before: the server received the request in the same tick
    /// as it sent that answer, or the next: the cuts the tick clocks (`lrcvtime`, `lsndtime`)
    /// cannot order, which drainwatch counts from the peer's acknowledgement (printed: they
    /// were missed before). A cut on a connection idle for a tick or more is never in this
    /// set (the server's gap between its answer and the next request is longer than the
    /// client's).
    pub fn same_tick_cuts(&self) -> u64 {
        let tick = kernel_tick();
        self.cuts()
            .filter(|r| r.reused)
            .filter(|r| self.connection_idle(r).is_none_or(|d| d < tick))
            .count() as u64
    }

    /// Each failed request, one line each: its id, connection, errno, whether the server
    /// started and ended it, and when it was sent and ended after the stop was issued (ms).
    pub fn failures(&self) -> String {
        let log: HashSet<(&str, bool)> = self
            .log
            .iter()
            .map(|e| (e.id.as_str(), e.started))
            .collect();
        let ms = |t: Instant| {
            if t >= self.stop.issued {
                format!("+{:.1}", (t - self.stop.issued).as_secs_f64() * 1e3)
            } else {
                format!("-{:.1}", (self.stop.issued - t).as_secs_f64() * 1e3)
            }
        };
        let idle = |r: &KaRequest| {
            self.connection_idle(r)
                .map(|d| format!(" connection idle {:.1} ms", d.as_secs_f64() * 1e3))
        };
        self.failed()
            .map(|r| {
                format!(
                    "  {} port {} {} {} server:{}{} sent {} ended {}{}\n",
                    r.id,
                    r.port.map_or("-".into(), |p| p.to_string()),
                    if r.reused { "reused" } else { "new" },
                    r.code.as_deref().unwrap_or("?"),
                    if log.contains(&(r.id.as_str(), true)) {
                        "started"
                    } else {
                        "-"
                    },
                    if log.contains(&(r.id.as_str(), false)) {
                        ",ended"
                    } else {
                        ""
                    },
                    ms(r.sent),
                    ms(r.ended),
                    if r.reused {
                        idle(r).unwrap_or_default()
                    } else {
                        String::new()
                    }
                )
            })
            .collect()
    }

    /// Truth against drainwatch, one line.
    pub fn report(&self) -> String {
        let codes = {
            let mut c: Vec<String> = self
                .failed()
                .map(|r| {
                    format!(
                        "{}{}",
                        r.code.as_deref().unwrap_or("?"),
                        if r.reused { "/reused" } else { "/new" }
                    )
                })
                .collect();
            c.sort();
            c.dedup_by(|a, b| a == b);
            c
        };
        format!(
            "{} clients vs {} server: {} requests, {} failed ({codes:?}); lost on reuse {} - \
             unread {} = sent after close {:?} (less up to {} read unlogged at the kill; \
             drainwatch {}); cut in server {} + unread {} \
             (drainwatch inflight_cut {}; {} of the cuts within a tick of their connection's \
             previous answer); refused {} (drainwatch {}); lost on new {}; pool \
             dropped {} idle connections on FIN; OutRsts +{}, record {}, metric +{}; \
             idle_closed {}, sessions_cut {}; resets {}; exit {}; verdict: {}",
            self.spec.client.as_str(),
            self.spec.server.as_str(),
            self.requests.len(),
            self.failed().count(),
            self.lost_on_reuse(),
            self.unread,
            self.sent_after_close(),
            self.read_unlogged_at_most(),
            self.record["loss"]["sent_after_close"],
            self.cut_in_server(),
            self.unread,
            self.record["loss"]["inflight_cut"],
            self.same_tick_cuts(),
            self.refused(),
            self.record["loss"]["refused"],
            self.lost_on_new(),
            self.idle_fins,
            self.out_rsts,
            self.record_rsts(),
            self.rsts_metric,
            self.record["loss"]["idle_closed"],
            self.record["loss"]["sessions_cut"],
            self.record["loss"]["resets_sent"],
            self.exit_code,
            self.verdict()
        )
    }
}

/// The kernel's tick (1 / `CONFIG_HZ`) from its config in `/boot`; 10 ms (HZ=100, the
/// coarsest) when it cannot be read.
pub fn kernel_tick() -> Duration {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let config = fs::read_to_string(format!("/boot/config-{}", release.trim())).unwrap_or_default();
    config
        .lines()
        .find_map(|l| l.strip_prefix("CONFIG_HZ="))
        .and_then(|hz| hz.trim().parse::<u64>().ok())
        .filter(|hz| *hz > 0)
        .map_or(Duration::from_millis(10), |hz| {
            Duration::from_micros(1_000_000 / hz)
        })
}
