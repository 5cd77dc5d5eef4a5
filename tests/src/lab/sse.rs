//! Long-lived streams with a real server-sent-events backend (`backend.py --mode stream`) in
//! podman: every stream ends at its own deadline with a final `event: rotate`. Its lifetime is
//! drawn per stream ([`Lifetimes`]: all the same, jittered, or widely spread, as a token
//! expiring sooner or a max connection age with jitter make them). On SIGTERM the server closes
//! its listener and either lets open streams run to their deadlines (the Mercure-style drain)
//! or ends them all at once ([`StreamDrain`]). Two containers of one workload (old, new); N
//! clients, each holding one stream at a time, reconnecting at once whenever a stream ends (as
//! EventSource does), to where "routing" points: the old server, until the test moves routing
//! to the new one just before it stops the old. The stop comes after a warm-up (two longest
//! lifetimes, clients started a lifetime apart so deadlines spread) or early (2 s after a
//! fleet that started within half a second: only its shortest streams have ended).
//!
//! The clients' truth, per stream: where, when it connected and ended, and whether the final
//! event came (ended by the server) or not (a cut: EOF or reset without it). The server's own
//! `stream-open` (with the lifetime it drew) and `stream-end` lines (with why: its deadline,
//! SIGTERM; none for a stream SIGKILL cut) cross-check it.

use std::{
    io::{Read, Write},
    net::{SocketAddrV4, TcpStream},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use super::{
    Backend, BackendOpts, Mode, StopTimes, StreamDrain, StreamOpts, clock, container::unique_name,
    storm::COMPOSE_SERVICE,
};

/// How the streams' lifetimes vary, each drawn uniformly up to the longest (`rotation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifetimes {
    /// All the same.
    Fixed,
    /// 0.8–1.0 × the longest: a max connection age with jitter.
    Jittered,
    /// 0.2–1.0 × the longest: tokens expiring sooner.
    Spread,
}

impl Lifetimes {
    /// The shortest lifetime, as a fraction of the longest.
    pub fn min_fraction(self) -> f64 {
        match self {
            Lifetimes::Fixed => 1.0,
            Lifetimes::Jittered => 0.8,
            Lifetimes::Spread => 0.2,
        }
    }

    /// The agent's name for the shape (`stream_lifetimes.shape`).
    pub fn as_str(self) -> &'static str {
        match self {
            Lifetimes::Fixed => "fixed",
            Lifetimes::Jittered => "jittered",
            Lifetimes::Spread => "spread",
        }
    }
}

/// When the old server is stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopAt {
    /// After two longest lifetimes and a second: every client has seen a stream end, and the
    /// agent has watched streams for twice the longest.
    Warm,
    /// 2 s after the fleet started (within half a second): only the shortest streams ended.
    Early,
}

#[derive(Clone, Debug)]
pub struct SseSpec {
    pub clients: usize,
    /// The longest lifetime of a stream (all of them, with [`Lifetimes::Fixed`]).
    pub rotation: Duration,
    pub lifetimes: Lifetimes,
    /// The lifetimes' random seed (the server's).
    pub seed: u64,
    /// The period of the events.
    pub event: Duration,
    pub stop_at: StopAt,
    pub drain: StreamDrain,
    /// `podman stop -t`.
    pub grace_secs: u32,
    pub workload: String,
    /// Connections to the old server's second listener (port [`QUEUED_PORT`], which never
    /// accepts), each sending a stream's request just before the stop: still in its accept
    /// queue when SIGTERM closes that listener, reset by the close.
    pub queued: usize,
}

/// The second listener of [`SseSpec::queued`].
pub const QUEUED_PORT: u16 = 8081;

impl SseSpec {
    /// Fixed lifetimes, events every 200 ms, a warm stop, the Mercure-style drain.
    pub fn new(clients: usize, rotation: Duration, grace_secs: u32) -> SseSpec {
        SseSpec {
            clients,
            rotation,
            lifetimes: Lifetimes::Fixed,
            seed: 1,
            event: Duration::from_millis(200),
            stop_at: StopAt::Warm,
            drain: StreamDrain::Timers,
            grace_secs,
            workload: unique_name("sse"),
            queued: 0,
        }
    }
}

/// One stream a client held.
#[derive(Clone, Debug)]
pub struct StreamRecord {
    pub client: usize,
    /// Its local port (the server logs it as the peer port).
    pub port: u16,
    /// To the new server (routing had moved).
    pub to_new: bool,
    /// `CLOCK_MONOTONIC` ns: `connect()` returned; the stream ended (None: still open when
    /// the clients stopped).
    pub connected: u64,
    pub ended: Option<u64>,
    pub events: u32,
    /// The final `event: rotate` came: a clean end.
    pub rotated: bool,
}

impl StreamRecord {
    pub fn cut(&self) -> bool {
        self.ended.is_some() && !self.rotated
    }
}

pub struct SseLab {
    pub spec: SseSpec,
    pub old: Backend,
    pub new: Backend,
}

pub struct SseRun {
    pub spec: SseSpec,
    pub stop: StopTimes,
    pub old_exit_code: i32,
    /// The old server's SIGTERM (its own log), `CLOCK_MONOTONIC` ns.
    pub sigterm: u64,
    pub streams: Vec<StreamRecord>,
    /// Connects that failed (refused): none is expected, routing moves first.
    pub failed_connects: u64,
    /// From the old server's log: streams opened, and ended by itself (at a deadline or on
    /// SIGTERM).
    pub server_opened: usize,
    pub server_ended: usize,
    /// The old server's own streams, from its log.
    pub server_streams: Vec<ServerStream>,
    /// When the first client connected, `CLOCK_MONOTONIC` ns.
    pub fleet_started: u64,
    /// The queued connections (`SseSpec::queued`) reset after the SIGTERM with no byte of an
    /// answer, by their clients' count.
    pub queued_reset: usize,
}

/// One stream as the server logged it.
#[derive(Clone, Debug)]
pub struct ServerStream {
    pub port: u16,
    pub opened: u64,
    /// The lifetime it drew, ns.
    pub lifetime: u64,
    /// When it ended and why (`deadline`, `sigterm`, `error`); None: still open at the exit.
    pub ended: Option<(u64, String)>,
}

/// The server's `stream-open` and `stream-end` lines, paired by peer port in order.
fn server_streams(events: &[super::container::ServerEvent]) -> Vec<ServerStream> {
    let mut out: Vec<ServerStream> = Vec::new();
    for e in events {
        let f: Vec<&str> = e.detail.split_whitespace().collect();
        let Some(port) = f.first().and_then(|p| p.parse::<u16>().ok()) else {
            continue;
        };
        match e.kind.as_str() {
            "stream-open" => out.push(ServerStream {
                port,
                opened: e.mono_ns,
                lifetime: f.get(1).and_then(|l| l.parse().ok()).unwrap_or(0),
                ended: None,
            }),
            "stream-end" => {
                if let Some(s) = out
                    .iter_mut()
                    .rev()
                    .find(|s| s.port == port && s.ended.is_none())
                {
                    s.ended = Some((e.mono_ns, f.get(2).unwrap_or(&"?").to_string()));
                }
            }
            _ => {}
        }
    }
    out
}

fn opts(spec: &SseSpec, seed: u64) -> BackendOpts {
    BackendOpts {
        hold: (spec.queued > 0).then_some((QUEUED_PORT, 64)),
        labels: vec![(COMPOSE_SERVICE.into(), spec.workload.clone())],
        stream: Some(StreamOpts {
            rotation: spec.rotation,
            lifetime_min: spec.lifetimes.min_fraction(),
            seed,
            event: spec.event,
            drain: spec.drain,
        }),
        ..BackendOpts::default()
    }
}

struct Shared {
    old: SocketAddrV4,
    new: SocketAddrV4,
    routed_new: AtomicBool,
    done: AtomicBool,
    streams: Mutex<Vec<StreamRecord>>,
    failed: Mutex<u64>,
}

/// One stream: connect, ask, read until it ends or the clients stop.
fn hold_stream(sh: &Shared, client: usize) -> Option<StreamRecord> {
    let to_new = sh.routed_new.load(Ordering::SeqCst);
    let addr = if to_new { sh.new } else { sh.old };
    let Ok(mut s) = TcpStream::connect_timeout(&addr.into(), Duration::from_secs(2)) else {
        *sh.failed.lock().unwrap() += 1;
        thread::sleep(Duration::from_millis(20));
        return None;
    };
    let connected = clock::mono_ns();
    let port = s.local_addr().map_or(0, |a| a.port());
    let mut rec = StreamRecord {
        client,
        port,
        to_new,
        connected,
        ended: None,
        events: 0,
        rotated: false,
    };
    s.set_read_timeout(Some(Duration::from_millis(100))).ok()?;
    if s.write_all(b"GET /events HTTP/1.1\r\nHost: lab\r\nAccept: text/event-stream\r\n\r\n")
        .is_err()
    {
        rec.ended = Some(clock::mono_ns());
        return Some(rec);
    }
    let mut body = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if sh.done.load(Ordering::SeqCst) {
                    return Some(rec); // still open: not ended by the server
                }
            }
            Err(_) => break, // reset
        }
    }
    rec.ended = Some(clock::mono_ns());
    let text = String::from_utf8_lossy(&body);
    rec.events = text.matches("data: ").count() as u32;
    rec.rotated = text.contains("event: rotate\n");
    Some(rec)
}

/// One connection left in the accept queue of `addr`: its request sent, then read until it
/// ends. Ok(when it ended) when it ended with no byte of an answer.
fn queued(addr: SocketAddrV4) -> thread::JoinHandle<Option<u64>> {
    let mut s = TcpStream::connect_timeout(&addr.into(), Duration::from_secs(2))
        .expect("connect to the queued listener");
    s.write_all(b"GET /events HTTP/1.1\r\nHost: lab\r\nAccept: text/event-stream\r\n\r\n")
        .expect("send the queued request");
    thread::spawn(move || {
        s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
        let mut b = [0u8; 64];
        match s.read(&mut b) {
            Ok(0) | Err(_) => Some(clock::mono_ns()),
            Ok(_) => None,
        }
    })
}

impl SseLab {
    pub fn setup(spec: SseSpec) -> SseLab {
        let old = Backend::start("old", Mode::Stream, opts(&spec, spec.seed));
        let new = Backend::start("new", Mode::Stream, opts(&spec, spec.seed + 1));
        SseLab { spec, old, new }
    }

    /// Streams until the stop ([`StopAt`]), routing moved to the new server, the old one
    /// stopped, every client streaming from the new one, then the clients stop. Once per lab.
    pub fn run(&mut self) -> SseRun {
        self.old.require_route();
        self.new.require_route();
        let spec = self.spec.clone();
        let sh = Arc::new(Shared {
            old: self.old.addr(),
            new: self.new.addr(),
            routed_new: AtomicBool::new(false),
            done: AtomicBool::new(false),
            streams: Mutex::new(Vec::new()),
            failed: Mutex::new(0),
        });
        let n = spec.clients;
        // Warm: deadlines spread over a lifetime; early: a fleet that starts together.
        let (stagger, before_stop) = match spec.stop_at {
            StopAt::Warm => (
                spec.rotation / n as u32,
                2 * spec.rotation + Duration::from_secs(1),
            ),
            StopAt::Early => (
                Duration::from_millis(500) / n as u32,
                Duration::from_secs(2),
            ),
        };
        let fleet_started = clock::mono_ns();
        let clients: Vec<_> = (0..n)
            .map(|i| {
                let sh = Arc::clone(&sh);
                thread::spawn(move || {
                    thread::sleep(stagger * i as u32);
                    while !sh.done.load(Ordering::SeqCst) {
                        if let Some(r) = hold_stream(&sh, i) {
                            sh.streams.lock().unwrap().push(r);
                        }
                    }
                })
            })
            .collect();
        thread::sleep(before_stop);
        let rotated_clients = {
            let st = sh.streams.lock().unwrap();
            let mut c: Vec<usize> = st.iter().filter(|r| r.rotated).map(|r| r.client).collect();
            c.sort_unstable();
            c.dedup();
            c.len()
        };
        let queued_addr = SocketAddrV4::new(*self.old.addr().ip(), QUEUED_PORT);
        let queued: Vec<_> = (0..spec.queued).map(|_| queued(queued_addr)).collect();
        sh.routed_new.store(true, Ordering::SeqCst);
        let stop = self.old.stop(spec.grace_secs);
        // Every client's stream on the old server ended (podman stop returns once the old
        // server is gone; a client notices within its 100 ms read timeout) ...
        let stopped = clock::mono_ns_of(stop.issued);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !{
            let st = sh.streams.lock().unwrap();
            (0..n).all(|c| {
                st.iter()
                    .any(|r| r.client == c && !r.to_new && r.ended.is_some_and(|e| e >= stopped))
            })
        } {
            assert!(
                Instant::now() < deadline,
                "the clients' streams on the stopped server did not all end"
            );
            thread::sleep(Duration::from_millis(50));
        }
        // ... and they reconnected at once: a second to be streaming from the new one.
        thread::sleep(Duration::from_secs(1));
        sh.done.store(true, Ordering::SeqCst);
        for c in clients {
            c.join().expect("a client thread panicked");
        }
        let queued_ends: Vec<Option<u64>> = queued
            .into_iter()
            .map(|q| q.join().expect("a queued connection's thread panicked"))
            .collect();
        let streams = std::mem::take(&mut *sh.streams.lock().unwrap());
        let failed_connects = *sh.failed.lock().unwrap();
        let events = self.old.events();
        let sigterm = events
            .iter()
            .find(|e| e.kind == "sigterm")
            .map(|e| e.mono_ns)
            .expect("the old server logged its SIGTERM");
        let count = |k: &str| events.iter().filter(|e| e.kind == k).count();
        if spec.stop_at == StopAt::Warm {
            assert_eq!(
                rotated_clients, n,
                "every client rotated once before the stop"
            );
        }
        SseRun {
            spec,
            stop,
            old_exit_code: self.old.exit_code(),
            sigterm,
            streams,
            failed_connects,
            server_opened: count("stream-open"),
            server_ended: count("stream-end"),
            server_streams: server_streams(&events),
            fleet_started,
            queued_reset: queued_ends
                .iter()
                .filter(|e| e.is_some_and(|e| e >= sigterm))
                .count(),
        }
    }
}

impl SseRun {
    /// Streams on the old server that its stop cut (the clients' count).
    pub fn cut_on_old(&self) -> usize {
        self.streams.iter().filter(|r| !r.to_new && r.cut()).count()
    }

    /// Streams on the old server that ended at their rotation after its SIGTERM.
    pub fn rotated_on_old_in_stop(&self) -> usize {
        self.streams
            .iter()
            .filter(|r| !r.to_new && r.rotated && r.ended.is_some_and(|e| e >= self.sigterm))
            .count()
    }

    /// Connects to the new server after the old one's SIGTERM: the clients that came back
    /// because of the stop (one whose stream rotated between routing moving and the signal
    /// went before it).
    pub fn reconnects(&self) -> usize {
        self.streams
            .iter()
            .filter(|r| r.to_new && r.connected >= self.sigterm)
            .count()
    }

    /// Clients that held a stream from the new server in the end.
    pub fn clients_on_new(&self) -> usize {
        let mut c: Vec<usize> = self
            .streams
            .iter()
            .filter(|r| r.to_new)
            .map(|r| r.client)
            .collect();
        c.sort_unstable();
        c.dedup();
        c.len()
    }

    /// Stream lifetimes the clients saw end at a rotation, seconds.
    pub fn rotation_lifetimes(&self) -> Vec<f64> {
        self.streams
            .iter()
            .filter(|r| r.rotated)
            .filter_map(|r| r.ended.map(|e| (e - r.connected) as f64 / 1e9))
            .collect()
    }

    /// The `q` quantile (nearest rank) of the lifetimes the old server drew for its streams,
    /// seconds.
    pub fn drawn_lifetime(&self, q: f64) -> f64 {
        let mut l: Vec<u64> = self.server_streams.iter().map(|s| s.lifetime).collect();
        l.sort_unstable();
        let i = ((q * l.len() as f64).ceil() as usize).clamp(1, l.len().max(1)) - 1;
        l.get(i).map_or(0.0, |v| *v as f64 / 1e9)
    }

    /// Streams the old server ended itself after its SIGTERM, from its log: at their own
    /// deadline, and at once on the signal.
    pub fn server_ended_in_stop(&self) -> (usize, usize) {
        let after = |why: &str| {
            self.server_streams
                .iter()
                .filter(|s| {
                    s.ended
                        .as_ref()
                        .is_some_and(|(at, w)| *at >= self.sigterm && w == why)
                })
                .count()
        };
        (after("deadline"), after("sigterm"))
    }

    /// Streams the old server ended at their own deadline within `within` of its SIGTERM.
    pub fn server_ended_at_deadline_within(&self, within: Duration) -> usize {
        let until = self.sigterm + within.as_nanos() as u64;
        self.server_streams
            .iter()
            .filter(|s| {
                s.ended
                    .as_ref()
                    .is_some_and(|(at, w)| *at >= self.sigterm && *at <= until && w == "deadline")
            })
            .count()
    }

    /// Of the streams the clients saw cut on the old server, those it had never accepted (no
    /// `stream-open` of theirs in its log): connects that waited in its accept queue when it
    /// closed its listener, reset then.
    pub fn cut_unaccepted(&self) -> usize {
        self.streams
            .iter()
            .filter(|r| !r.to_new && r.cut())
            .filter(|r| {
                let end = r.ended.unwrap_or(u64::MAX);
                !self.server_streams.iter().any(|s| {
                    s.port == r.port && s.opened + 100_000_000 >= r.connected && s.opened <= end
                })
            })
            .count()
    }

    pub fn report(&self) -> String {
        let lifetimes = self.rotation_lifetimes();
        let mean = lifetimes.iter().sum::<f64>() / lifetimes.len().max(1) as f64;
        let (deadline, at_once) = self.server_ended_in_stop();
        format!(
            "{} clients, {:?} streams up to {:?} (events every {:?}), {:?} stop {:.1} s after \
             the fleet started, {:?} drain, grace {} s: old exited {}; {} streams in all, on the \
             old server {} cut ({} never accepted) and {} ended by it after SIGTERM ({} at their \
             deadline, {} at once); {} reconnects to the new one; {} failed connects; the old \
             server opened {} and ended {} itself; {} of {} queued connections reset; mean rotation \
             lifetime {mean:.3} s, drawn p50 {:.3} p95 {:.3} max {:.3} s\n",
            self.spec.clients,
            self.spec.lifetimes,
            self.spec.rotation,
            self.spec.event,
            self.spec.stop_at,
            self.sigterm.saturating_sub(self.fleet_started) as f64 / 1e9,
            self.spec.drain,
            self.spec.grace_secs,
            self.old_exit_code,
            self.streams.len(),
            self.cut_on_old(),
            self.cut_unaccepted(),
            self.rotated_on_old_in_stop(),
            deadline,
            at_once,
            self.reconnects(),
            self.failed_connects,
            self.server_opened,
            self.server_ended,
            self.queued_reset,
            self.spec.queued,
            self.drawn_lifetime(0.5),
            self.drawn_lifetime(0.95),
            self.drawn_lifetime(1.0),
        )
    }
}
