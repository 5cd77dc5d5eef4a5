//! A request a reset kept from going out: a proxy connects to a backend, the backend dies with
//! the connection still in its accept queue (the kernel resets it), and the proxy's first send
//! fails. HAProxy logs `SH` and its client gets a 502, though no byte reached the backend; with
//! `retries 0` it happens about once in 50 stops under a steady stream (accuracy seeds Wide 49
//! and 66 once read one abort short). Here it is made to happen every time: the proxy is this
//! test's own thread (the process listens, so the agent takes it for one), and the backend is a
//! gate service that accepts nothing. Ground truth: the proxy's own sends and their errors.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::mpsc,
    time::{Duration, Instant},
};

use drainwatch_tests::{
    accuracy::{loss, settled_stop},
    agent::{Agent, wait_for},
    lab::{Backend, BackendOpts, Mode},
};

/// What the proxy thread saw.
#[derive(Debug)]
struct Seen {
    /// The first send on each of the two queued connections, as the kernel answered it.
    first_sends: Vec<std::io::ErrorKind>,
    /// The status line of the retry's response from `s2`.
    retry_status: String,
}

fn request(id: &str) -> Vec<u8> {
    format!("GET /work?ms=1&id={id} HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n")
        .into_bytes()
}

/// The proxy: two connections to `s1` wait in its accept queue; once `s1` died, a request on
/// the first is given up (an abort) and one on the second is retried on `s2` (retried
/// unexecuted). One thread, as a proxy's worker: the agent follows it by thread.
fn proxy(
    s1: SocketAddr,
    s2: SocketAddr,
    connected: mpsc::Sender<()>,
    stopped: mpsc::Receiver<()>,
) -> Seen {
    // A blocking connect returns once the handshake is done: the connection waits in the
    // accept queue of `s1`, which accepts nothing.
    let queued: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect_timeout(&s1, Duration::from_secs(5)).expect("connect s1"))
        .collect();
    connected.send(()).expect("the test waits");
    stopped.recv().expect("s1 stopped");
    let mut first_sends = Vec::new();
    for (i, mut conn) in queued.into_iter().enumerate() {
        match conn.write(&request(&format!("unsent-{i}"))) {
            Ok(n) => panic!("the send on a reset connection wrote {n} bytes"),
            Err(e) => first_sends.push(e.kind()),
        }
        drop(conn);
    }
    // The second connection's request, again, elsewhere, at once.
    let mut retry = TcpStream::connect_timeout(&s2, Duration::from_secs(5)).expect("connect s2");
    retry.write_all(&request("unsent-1")).expect("send to s2");
    let mut response = String::new();
    retry
        .read_to_string(&mut response)
        .expect("read s2's response");
    Seen {
        first_sends,
        retry_status: response.lines().next().unwrap_or_default().to_string(),
    }
}

#[test]
fn a_request_a_reset_kept_from_going_out_is_an_abort_or_retried_unexecuted() {
    // A proxy listens: this process does from before its first connect to a container (the
    // backends' readiness checks), which the agent would otherwise find made by no proxy
    // (CI once: the proxy's connections were then nobody's, and nothing was judged).
    let _listener = TcpListener::bind("127.0.0.1:0").expect("listen");
    let agent = Agent::start(&[]);
    let watched = agent.watched_addresses();
    let mut s1 = Backend::launch(
        "unsent-s1",
        Mode::Gate,
        BackendOpts {
            gate_workers: Some(0),
            ..BackendOpts::default()
        },
    );
    s1.await_listening_only(Instant::now() + Duration::from_secs(30));
    let s2 = Backend::start("unsent-s2", Mode::NoHandler, BackendOpts::default());
    // Its connections are captured only once the agent keeps host-side traffic to s1 and s2
    // (a connection to a container it has yet to find is nobody's: nothing judged).
    wait_for(
        "the agent to watch s1's and s2's addresses",
        Duration::from_secs(20),
        || agent.watched_addresses() >= watched + 2.0,
    );
    let (connected_tx, connected) = mpsc::channel();
    let (tx, rx) = mpsc::channel();
    let (a1, a2) = (SocketAddr::V4(s1.addr()), SocketAddr::V4(s2.addr()));
    let worker = std::thread::spawn(move || proxy(a1, a2, connected_tx, rx));
    connected.recv().expect("the proxy connected");
    s1.stop(5);
    assert!(s1.wait_exited(Duration::from_secs(10)), "s1 did not exit");
    tx.send(()).expect("the proxy thread is waiting");
    let seen = worker.join().expect("proxy thread");
    println!("proxy saw: {seen:?}");
    use std::io::ErrorKind::{BrokenPipe, ConnectionReset};
    assert!(
        seen.first_sends.len() == 2
            && seen
                .first_sends
                .iter()
                .all(|k| matches!(k, ConnectionReset | BrokenPipe)),
        "both first sends must fail on the reset: {seen:?}"
    );
    assert!(seen.retry_status.contains(" 200 "), "{seen:?}");
    assert!(
        s2.work_log()
            .iter()
            .any(|w| w.id == "unsent-1" && w.started),
        "s2 ran the retry"
    );
    let stop = settled_stop(&agent, &s1.id);
    println!("drainwatch: {}", stop["loss"]);
    assert_eq!(
        (
            loss(&stop, "upstream_aborts"),
            loss(&stop, "retried_unexecuted"),
            loss(&stop, "retry_duplicates"),
        ),
        (1, 1, 0),
        "one request given up, one retried, none done twice"
    );
}
