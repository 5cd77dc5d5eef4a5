//! Long-lived connections, the load `--hold`'s take-over reads: opens `n` connections to a
//! listener of its own, both ends held open for `seconds`, then closes them. Prints one JSON
//! line with what it held (the ground truth the agent's take-over count is checked against).
//!
//! held <n> <seconds>

use std::{
    net::{Ipv4Addr, TcpListener, TcpStream},
    time::{Duration, Instant},
};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, default: f64| -> f64 {
        args.get(i)
            .map(|a| a.parse().unwrap_or_else(|_| panic!("not a number: {a}")))
            .unwrap_or(default)
    };
    let n = num(0, 1000.0) as usize;
    let seconds = num(1, 15.0);
    let fail = |what: &str, e: std::io::Error| -> ! {
        eprintln!("held: {what}: {e}");
        std::process::exit(1);
    };
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap_or_else(|e| fail("listen", e));
    let addr = listener.local_addr().unwrap_or_else(|e| fail("listen", e));
    let start = Instant::now();
    let mut open = Vec::with_capacity(n);
    for _ in 0..n {
        let c = TcpStream::connect(addr).unwrap_or_else(|e| fail("connect", e));
        let (s, _) = listener.accept().unwrap_or_else(|e| fail("accept", e));
        open.push((c, s));
    }
    let opened = start.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    drop(open);
    println!(
        "{}",
        serde_json::json!({ "connections": n, "open_seconds": opened, "held_seconds": seconds })
    );
}
