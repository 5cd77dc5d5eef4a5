//! Loopback connection churn, the workload the agent's probes sit on: each round opens and
//! closes a connection, connects to a closed port (a reset) and aborts a connection with
//! SO_LINGER 0 (a reset from the closing side). Prints one JSON line with what it did.
//!
//! churn <seconds> <threads> [<max connections per second, 0 = unbounded>] [thirds|pod|clean]
//!
//! The mix: `thirds` (the default) makes each of the three kinds a third of the connections;
//! `pod` is a server's day: of every ten connections eight carry a one-byte request and answer
//! and close cleanly with the server closing first (as an HTTP server ending a response does),
//! one is refused and one aborted; `clean` is `pod`'s clean connections alone.

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

/// Connections per round of each mix.
#[derive(Clone, Copy)]
enum Mix {
    /// One closed normally (the client first), one refused, one aborted.
    Thirds,
    /// Eight closed normally (the server first), one refused, one aborted.
    Pod,
    /// Eight closed normally (the server first), as `Pod`'s, and none failing.
    Clean,
}

impl Mix {
    fn clean(self) -> u64 {
        match self {
            Mix::Thirds => 1,
            Mix::Pod | Mix::Clean => 8,
        }
    }

    /// A refused and an aborted connection after the clean ones, or none.
    fn fails(self) -> bool {
        !matches!(self, Mix::Clean)
    }

    fn per_round(self) -> u64 {
        self.clean() + if self.fails() { 2 } else { 0 }
    }
}

fn abort(s: &TcpStream) {
    // Best effort: a failed option only makes this connection close with a FIN.
    let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
}

/// A port nothing listens on: bound and closed again.
fn closed_port() -> Result<SocketAddr, String> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(|e| e.to_string())?;
    l.local_addr().map_err(|e| e.to_string())
}

fn worker(
    stop: &AtomicBool,
    done: &AtomicU64,
    per_thread_rate: f64,
    mix: Mix,
) -> Result<(), String> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let refused = closed_port()?;
    let start = Instant::now();
    let mut rounds: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        if per_thread_rate > 0.0 {
            let due = start
                + Duration::from_secs_f64((rounds * mix.per_round()) as f64 / per_thread_rate);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
        for _ in 0..mix.clean() {
            let mut c = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
            let (mut s, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
            c.write_all(b"x").map_err(|e| format!("write: {e}"))?;
            match mix {
                // The client closes first; the server's close, with the byte unread, resets.
                Mix::Thirds => drop((c, s)),
                // A request and its answer, then the server closes first, cleanly.
                Mix::Pod | Mix::Clean => {
                    let mut b = [0u8; 1];
                    s.read_exact(&mut b).map_err(|e| format!("read: {e}"))?;
                    s.write_all(b"y").map_err(|e| format!("write: {e}"))?;
                    drop(s);
                    c.read_exact(&mut b).map_err(|e| format!("read: {e}"))?;
                    drop(c);
                }
            }
        }
        if mix.fails() {
            // Refused: RST from the kernel, ECONNREFUSED here.
            if TcpStream::connect(refused).is_ok() {
                return Err(format!("{refused} unexpectedly accepted"));
            }
            // Aborted: linger 0 turns close into a reset.
            let c = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
            let (s, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
            abort(&c);
            drop(c);
            drop(s);
        }
        rounds += 1;
        done.fetch_add(mix.per_round(), Ordering::Relaxed);
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, default: f64| -> f64 {
        args.get(i)
            .map(|a| a.parse().unwrap_or_else(|_| panic!("not a number: {a}")))
            .unwrap_or(default)
    };
    let seconds = num(0, 5.0);
    let threads = num(1, 2.0).max(1.0) as usize;
    let rate = num(2, 0.0);
    let mix = match args.get(3).map(String::as_str) {
        None | Some("thirds") => Mix::Thirds,
        Some("pod") => Mix::Pod,
        Some("clean") => Mix::Clean,
        Some(other) => panic!("unknown mix {other}: thirds, pod or clean"),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (stop, done) = (stop.clone(), done.clone());
            std::thread::spawn(move || worker(&stop, &done, rate / threads as f64, mix))
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        let result = h.join().unwrap_or_else(|_| Err("a worker panicked".into()));
        if let Err(e) = result {
            eprintln!("churn: {e}");
            std::process::exit(1);
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let n = done.load(Ordering::Relaxed);
    println!(
        "{}",
        serde_json::json!({
            "connections": n,
            "seconds": elapsed,
            "per_second": n as f64 / elapsed,
        })
    );
}
