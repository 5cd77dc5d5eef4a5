//! The kernel's following of proxies' upstream connections (`UPSTREAM_SOCKS`), at its size.
//! Real programs in the running kernel; this process is named a proxy, its connects are its
//! upstream connections, and a cut (a request sent, the backend closing with no answer) is
//! what only a followed connection reports.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    time::Duration,
};

use drainwatch::capture::{event::Event, hooks::sock_length::IoStep, watch::WatchSet};
use drainwatch_common::faults::FaultKind;
use drainwatch_tests::{Harness, agent::wait_for};

const REQUEST: &[u8] = &[b'r'; 123];

/// Past its size (`--upstream-entries`) a proxy's connection is not followed, and each one is
/// counted (`upstream_full`): with room for 16, a proxy holding 40 upstream connections open
/// at once, each cut, reports 16 cuts and counts 24 connections it could not follow. (An LRU,
/// as this map was, evicted the older connections' requests and counted nothing.) The map is
/// a plain hash: entries must go when their sockets do, or it would fill for good.
#[test]
fn past_its_size_a_proxys_connection_is_not_followed_and_is_counted() {
    const ROOM: u32 = 16;
    const N: usize = 40;
    let opts = drainwatch::capture::Options {
        upstream_entries: ROOM,
        ..Harness::options(&["socket_states", "upstream_requests"], 1 << 22)
    };
    let mut h = Harness::start_opts(opts, 1 << 20);
    let mut watch = h.capture.take_watch().expect("watch maps");
    watch
        .apply(&WatchSet {
            proxies: [std::process::id()].into(),
            ..Default::default()
        })
        .expect("naming this process a proxy");
    let full = |h: &Harness| h.fault_count(FaultKind::UpstreamFull);
    let full_before = full(&h);
    h.events();

    // The backend reads each request whole, then closes every connection unanswered.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let backend_addr = listener.local_addr().unwrap();
    let backend = std::thread::spawn(move || {
        let mut conns = Vec::new();
        for _ in 0..N {
            let (mut c, _) = listener.accept().unwrap();
            let mut buf = [0u8; REQUEST.len()];
            c.read_exact(&mut buf).unwrap();
            conns.push(c);
        }
        drop(conns);
    });
    // Every connection open before any closes: the map must hold them all at once.
    let mut upstreams: Vec<TcpStream> = (0..N)
        .map(|_| TcpStream::connect(backend_addr).unwrap())
        .collect();
    for c in &mut upstreams {
        c.write_all(REQUEST).unwrap();
    }
    backend.join().unwrap();
    for c in &mut upstreams {
        let mut buf = [0u8; 16];
        assert_eq!(
            c.read(&mut buf).unwrap(),
            0,
            "the backend closed unanswered"
        );
    }

    let cuts: std::collections::BTreeSet<u64> = h
        .events()
        .iter()
        .filter_map(|e| match e {
            Event::UpstreamIo(io)
                if io.meta.tgid == std::process::id()
                    && matches!(io.step, IoStep::Cut { bytes, ret: 0, .. } if bytes == REQUEST.len() as u64) =>
            {
                Some(io.skaddr)
            }
            _ => None,
        })
        .collect();
    let counted = full(&h) - full_before;
    assert_eq!(
        (cuts.len(), counted),
        (ROOM as usize, N as u64 - u64::from(ROOM)),
        "(connections followed to their cut, connections counted as not followed) of {N} with room for {ROOM}"
    );
    // The agent's own additions (connections a proxy opened before it was named) meet the
    // same full map, and are counted too; once the proxy closes its connections, their
    // entries go and the room is back.
    let fake = [1, 2, 3];
    assert_eq!(watch.follow(&fake).unwrap(), 3, "refused while full");
    drop(upstreams);
    wait_for(
        "the closed connections' entries to go",
        Duration::from_secs(5),
        || watch.follow(&fake[..1]).unwrap() == 0,
    );
}
