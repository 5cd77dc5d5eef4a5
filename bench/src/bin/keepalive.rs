//! Keep-alive requests, the load peers publish (a server under persistent connections, e.g.
//! wrk's 100): an HTTP/1.1 server (hyper, as the agent's own /metrics is served) and
//! `connections` clients in one process, each client one keep-alive connection sending a
//! request and reading its answer in a loop for `seconds`. Every connection is open before the
//! clock starts, so the run holds no handshake: only requests. Prints one JSON line with what
//! it did: the clients' count of answers and the server's count of requests it answered (the
//! two must agree).
//!
//! keepalive <seconds> <connections> [<threads>]

use std::{
    convert::Infallible,
    net::{Ipv4Addr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
};

const REQUEST: &[u8] = b"GET /items HTTP/1.1\r\nHost: pod\r\nUser-Agent: drainwatch-bench\r\n\r\n";
const BODY: &[u8] = b"{\"items\":[]}";

async fn serve(listener: TcpListener, answered: Arc<AtomicU64>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let answered = answered.clone();
        tokio::spawn(async move {
            let service = service_fn(move |_: Request<Incoming>| {
                answered.fetch_add(1, Ordering::Relaxed);
                async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(BODY)))) }
            });
            // A client closing between requests ends the connection cleanly.
            let _ = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Where a response ends in `buf` (its headers and `Content-Length` body), once it has all.
fn response_end(buf: &[u8]) -> Result<Option<usize>, String> {
    let Some(head) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let headers = std::str::from_utf8(&buf[..head]).map_err(|e| e.to_string())?;
    if !headers.starts_with("HTTP/1.1 200 ") {
        return Err(format!(
            "not a 200: {}",
            headers.lines().next().unwrap_or("")
        ));
    }
    let length: usize = headers
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .ok_or("no Content-Length")?;
    let end = head + 4 + length;
    Ok((buf.len() >= end).then_some(end))
}

/// One keep-alive connection: requests and answers until `until`; the answers it read.
async fn client(
    mut s: TcpStream,
    start: Arc<tokio::sync::Barrier>,
    until: Duration,
) -> Result<u64, String> {
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    let mut answers = 0u64;
    start.wait().await;
    let t0 = Instant::now();
    while t0.elapsed() < until {
        s.write_all(REQUEST)
            .await
            .map_err(|e| format!("write: {e}"))?;
        loop {
            if let Some(end) = response_end(&buf)? {
                buf.drain(..end);
                break;
            }
            let n = s.read(&mut chunk).await.map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                return Err("the server closed a keep-alive connection".into());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        answers += 1;
    }
    Ok(answers)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, default: f64| -> f64 {
        args.get(i)
            .map(|a| a.parse().unwrap_or_else(|_| panic!("not a number: {a}")))
            .unwrap_or(default)
    };
    let seconds = num(0, 5.0);
    let connections = num(1, 100.0).max(1.0) as usize;
    let threads = num(2, 2.0).max(1.0) as usize;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail("runtime", e));
    let answered = Arc::new(AtomicU64::new(0));
    let (answers, elapsed) = rt.block_on(async {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap_or_else(|e| fail("listen", e));
        let addr: SocketAddr = listener.local_addr().unwrap_or_else(|e| fail("listen", e));
        tokio::spawn(serve(listener, answered.clone()));
        // Every connection open before the clock starts.
        let start = Arc::new(tokio::sync::Barrier::new(connections + 1));
        let mut clients = Vec::with_capacity(connections);
        for _ in 0..connections {
            let s = TcpStream::connect(addr)
                .await
                .unwrap_or_else(|e| fail("connect", e));
            clients.push(tokio::spawn(client(
                s,
                start.clone(),
                Duration::from_secs_f64(seconds),
            )));
        }
        start.wait().await;
        let t0 = Instant::now();
        let mut answers = 0u64;
        for c in clients {
            match c.await {
                Ok(Ok(n)) => answers += n,
                Ok(Err(e)) => fail("client", e),
                Err(e) => fail("client", e),
            }
        }
        (answers, t0.elapsed().as_secs_f64())
    });
    // The clients closed first; the server saw each answer's request before it was read.
    let served = answered.load(Ordering::Relaxed);
    if served != answers {
        fail(
            "counts",
            format!("the server answered {served} requests, the clients read {answers}"),
        );
    }
    println!(
        "{}",
        serde_json::json!({
            "requests": answers,
            "server_answered": served,
            "connections": connections,
            "seconds": elapsed,
            "per_second": answers as f64 / elapsed,
        })
    );
}

fn fail(what: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("keepalive: {what}: {e}");
    std::process::exit(1);
}
