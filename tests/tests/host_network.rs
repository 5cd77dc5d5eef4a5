//! A host-network container: its listener lives in the host's own network namespace, where the
//! kernel side keeps only connections that touch a container (`--host-traffic containers`, the
//! default). The container's connections must still be followed through its watched port: a
//! request cut by the stop and a connect refused after it are counted exactly, while the
//! host's own loopback traffic beside it is dropped in the kernel and counted as filtered.

use std::{
    io::ErrorKind,
    net::{TcpListener, TcpStream},
    time::Duration,
};

use drainwatch_tests::{
    agent::{Agent, free_port, stop_record, wait_for},
    lab::{Backend, BackendOpts, Mode, container::http_get},
};

#[test]
fn a_host_network_containers_cut_and_refused_connects_count_and_host_traffic_is_filtered() {
    let agent = Agent::start(&[]);
    let b = Backend::start(
        "hostnet",
        Mode::NoHandler,
        BackendOpts {
            port: free_port(),
            host_network: true,
            ..BackendOpts::default()
        },
    );
    // The agent watches the container's port once it has seen its listener.
    wait_for(
        "the agent watches one host port",
        Duration::from_secs(10),
        || agent.metric("drainwatch_watch_entries{map=\"ports\"}") == Some(1.0),
    );

    // One request in flight when the container stops: no SIGTERM handler, so the server dies
    // mid-request.
    let addr = b.addr();
    let inflight =
        std::thread::spawn(move || http_get(addr, "/work?ms=8000&id=hn1", Duration::from_secs(15)));
    wait_for(
        "the backend starts the request",
        Duration::from_secs(10),
        || b.work_log().iter().any(|w| w.started && w.id == "hn1"),
    );
    b.stop(10);
    let client = inflight.join().expect("client thread");
    assert!(client.is_err(), "the request was cut: {client:?}");
    // Nothing listens any more: one connect, refused.
    let refused = TcpStream::connect(addr).expect_err("the listener is gone");
    assert_eq!(refused.kind(), ErrorKind::ConnectionRefused);

    // The host's own loopback connections touch no container: filtered in the kernel.
    let filtered =
        || agent.metric("drainwatch_events_filtered_total{kind=\"inet_sock_set_state\"}");
    let before = filtered().expect("the filtered counter is exported");
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    for _ in 0..10 {
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (a, _) = l.accept().unwrap();
        drop((c, a));
    }
    // connect, SYN-ACK, the child's SYN_RECV and ESTABLISHED, both closes and the last ack:
    // at least 7 transitions a connection (other host traffic only adds).
    wait_for(
        "70 host transitions counted as filtered",
        Duration::from_secs(10),
        || filtered().unwrap_or(0.0) - before >= 70.0,
    );

    let stop = stop_record(&agent, &b.id);
    println!("drainwatch: {stop:#}");
    assert_eq!(stop["outcome"], "exit_at_once", "{stop:#}");
    assert_eq!(
        stop["loss"]["inflight_cut"], 1,
        "the one cut request: {stop:#}"
    );
    assert_eq!(
        stop["loss"]["refused"], 1,
        "the one refused connect: {stop:#}"
    );
}
