//! A container's full accept queue, seen by the agent as the kernel counts it: a listener with
//! a backlog of 2 that never accepts, and a burst of connects into it.

use std::{
    io::Write,
    net::{SocketAddr, TcpStream},
    time::{Duration, Instant},
};

use drainwatch_tests::{
    agent::Agent,
    lab::container::{Backend, BackendOpts, Mode},
    listen_overflows_of,
};

const HOLD_PORT: u16 = 9000;
const BACKLOG: u32 = 2;

/// The value of the first series of `name` whose labels include every one of `labels`.
fn series(text: &str, name: &str, labels: &[String]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| labels.iter().all(|x| l.contains(x.as_str())))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn a_full_accept_queue_overflows_as_many_times_as_the_kernel_counts() {
    let agent = Agent::start(&[]);
    let b = Backend::start(
        "ovf",
        Mode::NoHandler,
        BackendOpts {
            hold: Some((HOLD_PORT, BACKLOG)),
            ..BackendOpts::default()
        },
    );
    let pid = b.pid.to_string();
    let mine = [format!("container=\"{}\"", b.container)];
    let listener = [mine[0].clone(), format!("port=\"{HOLD_PORT}\"")];
    let deadline = Instant::now() + Duration::from_secs(25);
    while series(
        &agent.metrics_text(),
        "drainwatch_accept_queue_limit",
        &listener,
    )
    .is_none()
    {
        assert!(
            Instant::now() < deadline,
            "the agent never sampled the held listener"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(listen_overflows_of(&pid), 0, "a new namespace starts at 0");

    // Twelve clients at once against a queue of BACKLOG + 1: most SYNs or handshakes are
    // dropped. The clients are closed right after, so no retransmission adds more later.
    let addr = SocketAddr::from((b.ip, HOLD_PORT));
    let clients: Vec<_> = (0..12)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
                c.write_all(b"x").ok()?;
                Some(c)
            })
        })
        .collect();
    let connected = clients
        .into_iter()
        .filter_map(|t| t.join().expect("client thread"))
        .count();
    let kernel = listen_overflows_of(&pid);
    assert!(
        kernel > 0,
        "the burst overflowed nothing ({connected} connected)"
    );

    // The agent samples the namespace every 10 s: wait (bounded) until it agrees with the
    // kernel at a moment the kernel's count is not moving.
    let deadline = Instant::now() + Duration::from_secs(25);
    let (seen, kernel, text) = loop {
        let before = listen_overflows_of(&pid);
        let text = agent.metrics_text();
        let seen = series(&text, "drainwatch_netns_listen_overflows_total", &mine);
        let after = listen_overflows_of(&pid);
        if before == after && seen == Some(after as f64) {
            break (seen, after, text);
        }
        assert!(
            Instant::now() < deadline,
            "agent {seen:?} vs kernel {after} (was {kernel} right after the burst)"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("{connected} clients connected; ListenOverflows {kernel}; agent {seen:?}");
    let drops = series(&text, "drainwatch_netns_listen_drops_total", &mine).unwrap();
    assert!(
        drops >= kernel as f64,
        "every overflow is a listen drop: {drops}"
    );
    assert_eq!(
        series(&text, "drainwatch_accept_queue_depth", &listener),
        Some(f64::from(BACKLOG + 1)),
        "the queue holds backlog + 1 connections"
    );
    assert_eq!(
        series(&text, "drainwatch_accept_queue_limit", &listener),
        Some(f64::from(BACKLOG))
    );
    // Overflows with a drop reason are a subset: a SYN that meets a full queue is freed
    // without one.
    let tagged = series(&text, "drainwatch_listen_overflows_total", &listener).unwrap_or(0.0);
    assert!(
        tagged <= kernel as f64,
        "{tagged} tagged overflows > {kernel}"
    );
}
