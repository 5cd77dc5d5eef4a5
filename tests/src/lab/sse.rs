//! Long-lived streams with a real server-sent-events backend (`backend.py --mode stream`) in
//! podman: every stream ends at its own deadline (the rotation) with a final `event: rotate`,
//! and on SIGTERM the server closes its listener and lets open streams run to their deadlines
//! (the Mercure-style drain). Two containers of one workload (old, new); N clients, each
//! holding one stream at a time, started a rotation apart so deadlines spread, reconnecting at
//! once whenever a stream ends (as EventSource does), to where "routing" points: the old
//! server, until the test moves routing to the new one just before it stops the old.
//!
//! The clients' truth, per stream: where, when it connected and ended, and whether the final
//! event came (a rotation) or not (a cut: EOF or reset without it). The server's own
//! `stream-open` / `stream-end` lines (none for a stream SIGKILL cut) cross-check it.

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
    Backend, BackendOpts, Mode, StopTimes, clock, container::unique_name, storm::COMPOSE_SERVICE,
};

#[derive(Clone, Debug)]
pub struct SseSpec {
    pub clients: usize,
    /// Each stream's lifetime, and the period of its events.
    pub rotation: Duration,
    pub event: Duration,
    /// `podman stop -t`.
    pub grace_secs: u32,
    pub workload: String,
}

impl SseSpec {
    pub fn new(clients: usize, rotation: Duration, grace_secs: u32) -> SseSpec {
        SseSpec {
            clients,
            rotation,
            event: Duration::from_millis(200),
            grace_secs,
            workload: unique_name("sse"),
        }
    }
}

/// One stream a client held.
#[derive(Clone, Debug)]
pub struct StreamRecord {
    pub client: usize,
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
    /// From the old server's log: streams opened, and ended by itself (at a deadline).
    pub server_opened: usize,
    pub server_ended: usize,
}

fn opts(spec: &SseSpec) -> BackendOpts {
    BackendOpts {
        labels: vec![(COMPOSE_SERVICE.into(), spec.workload.clone())],
        stream: Some((spec.rotation, spec.event)),
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
    let mut rec = StreamRecord {
        client,
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

impl SseLab {
    pub fn setup(spec: SseSpec) -> SseLab {
        let old = Backend::start("old", Mode::Stream, opts(&spec));
        let new = Backend::start("new", Mode::Stream, opts(&spec));
        SseLab { spec, old, new }
    }

    /// Streams for two rotations (every client, started up to one apart, rotated once), routing moved
    /// to the new server, the old one stopped, every client streaming from the new one, then
    /// the clients stop. Once per lab.
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
        let stagger = spec.rotation / n as u32;
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
        thread::sleep(2 * spec.rotation + Duration::from_millis(500));
        let rotated_clients = {
            let st = sh.streams.lock().unwrap();
            let mut c: Vec<usize> = st.iter().filter(|r| r.rotated).map(|r| r.client).collect();
            c.sort_unstable();
            c.dedup();
            c.len()
        };
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
        let streams = std::mem::take(&mut *sh.streams.lock().unwrap());
        let failed_connects = *sh.failed.lock().unwrap();
        let events = self.old.events();
        let sigterm = events
            .iter()
            .find(|e| e.kind == "sigterm")
            .map(|e| e.mono_ns)
            .expect("the old server logged its SIGTERM");
        let count = |k: &str| events.iter().filter(|e| e.kind == k).count();
        assert_eq!(
            rotated_clients, n,
            "every client rotated once before the stop"
        );
        SseRun {
            spec,
            stop,
            old_exit_code: self.old.exit_code(),
            sigterm,
            streams,
            failed_connects,
            server_opened: count("stream-open"),
            server_ended: count("stream-end"),
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

    pub fn report(&self) -> String {
        let lifetimes = self.rotation_lifetimes();
        let mean = lifetimes.iter().sum::<f64>() / lifetimes.len().max(1) as f64;
        format!(
            "{} clients, streams of {:?} (events every {:?}), grace {} s: old exited {}; {} streams \
             in all, on the old server {} cut and {} rotated after SIGTERM; {} reconnects to the \
             new one; {} failed connects; the old server opened {} and ended {} itself; mean \
             rotation lifetime {mean:.3} s\n",
            self.spec.clients,
            self.spec.rotation,
            self.spec.event,
            self.spec.grace_secs,
            self.old_exit_code,
            self.streams.len(),
            self.cut_on_old(),
            self.rotated_on_old_in_stop(),
            self.reconnects(),
            self.failed_connects,
            self.server_opened,
            self.server_ended,
        )
    }
}
