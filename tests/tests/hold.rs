//! `--hold` (experimental): the kernel holds a connection's arrival and accept until its next
//! record carries them. Real programs in the real kernel: the events the agent gets must be
//! the ones it gets without the hold, in the same order, while the records are fewer. Needs
//! root.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    time::Duration,
};

use drainwatch::capture::event::Event;
use drainwatch_tests::Harness;

const RING: u32 = 1 << 22;
const HOOKS: &[&str] = &["socket_states", "accept_wait", "resets_received"];
/// Clean connections per run, and one aborted after them.
const CLEAN: usize = 40;

/// Records the kernel sent of `kind`, as the reader counted them.
fn records(h: &Harness, kind: &str) -> f64 {
    let text = h.metrics.encode_prometheus().unwrap();
    let key = format!("drainwatch_events_total{{kind=\"{kind}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(key.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// `n` connections to a fresh loopback listener, both ends kept open: the listener's address,
/// the clients' addresses (the ground truth), and the open pairs; once the kernel has seen
/// them.
fn open_connections(
    n: usize,
) -> (
    SocketAddr,
    std::collections::BTreeSet<SocketAddr>,
    Vec<(TcpStream, TcpStream)>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let server = listener.local_addr().unwrap();
    let mut open = Vec::with_capacity(n);
    let mut peers = std::collections::BTreeSet::new();
    for _ in 0..n {
        let c = TcpStream::connect(server).unwrap();
        let (s, peer) = listener.accept().unwrap();
        peers.insert(peer);
        open.push((c, s));
    }
    std::thread::sleep(Duration::from_millis(100));
    (server, peers, open)
}

/// What the server side of each connection to a fresh listener showed, one line per event in
/// stream order (time stripped, as each run's clocks differ), and whether the stream's stamps
/// never went back for it; then the record counts of the run: (state changes, accepts).
fn run(hold: bool) -> (Vec<Vec<String>>, bool, (f64, f64)) {
    let mut h = Harness::start_lean_as(HOOKS, RING, hold);
    h.events();
    let before = (
        records(&h, "inet_sock_set_state"),
        records(&h, "inet_csk_accept"),
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let server = listener.local_addr().unwrap();
    let mut clients: Vec<SocketAddr> = Vec::new();
    let mut byte = [0u8; 1];
    for i in 0..CLEAN {
        let mut c = TcpStream::connect(server).unwrap();
        if i % 10 == 0 {
            // A few wait in the accept queue a while: the wait must survive the hold.
            std::thread::sleep(Duration::from_millis(20));
        }
        let (mut s, peer) = listener.accept().unwrap();
        clients.push(peer);
        c.write_all(b"q").unwrap();
        s.read_exact(&mut byte).unwrap();
        s.write_all(b"a").unwrap();
        c.read_exact(&mut byte).unwrap();
        // The server closes first on even connections (a held arrival carried by FIN_WAIT1),
        // the client on odd ones (carried by CLOSE_WAIT).
        if i % 2 == 0 {
            drop(s);
            assert_eq!(c.read(&mut byte).unwrap(), 0);
            drop(c);
        } else {
            drop(c);
            assert_eq!(s.read(&mut byte).unwrap(), 0);
            drop(s);
        }
    }
    // Aborted by the client: the server's side gets a RST while held.
    let c = TcpStream::connect(server).unwrap();
    let (s, peer) = listener.accept().unwrap();
    clients.push(peer);
    socket2::SockRef::from(&c)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(c);
    std::thread::sleep(Duration::from_millis(50));
    drop(s);
    std::thread::sleep(Duration::from_millis(200));
    let events = h.events();
    let after = (
        records(&h, "inet_sock_set_state"),
        records(&h, "inet_csk_accept"),
    );
    let mut ordered = true;
    let lines = clients
        .iter()
        .map(|peer| {
            let mine = |c: &Option<drainwatch::capture::event::Endpoints>| {
                c.is_some_and(|c| c.local == server && c.remote == *peer)
            };
            let mut last = 0;
            let mut wait = None;
            let mut arrived = 0;
            let lines: Vec<String> = events
                .iter()
                .filter_map(|e| {
                    let line = match e {
                        Event::StateChange(s) if mine(&s.conn) => {
                            if s.new.and_then(|n| n.name()) == Some("TCP_ESTABLISHED") {
                                arrived = s.meta.ts_ns;
                            }
                            format!(
                                "{}->{}",
                                s.old.and_then(|n| n.name()).unwrap_or("?"),
                                s.new.and_then(|n| n.name()).unwrap_or("?")
                            )
                        }
                        Event::Accepted(a) if mine(&a.conn) => {
                            assert_eq!(a.meta.tgid, std::process::id(), "accept() ran here");
                            wait = Some(a.meta.ts_ns.saturating_sub(arrived));
                            "accept".into()
                        }
                        Event::ResetReceived(r) if mine(&r.conn) => "rst-in".into(),
                        _ => return None,
                    };
                    ordered &= e.meta().ts_ns >= last;
                    last = e.meta().ts_ns;
                    Some(line)
                })
                .collect();
            // Every accept here came within a second of its arrival.
            assert!(
                wait.is_some_and(|w| w < 1_000_000_000),
                "{lines:?}: {wait:?}"
            );
            lines
        })
        .collect();
    (lines, ordered, (after.0 - before.0, after.1 - before.1))
}

#[test]
fn held_connections_unfold_to_the_events_they_make_unheld_from_fewer_records() {
    let (plain, plain_ordered, plain_records) = run(false);
    let (held, held_ordered, held_records) = run(true);
    assert!(plain_ordered && held_ordered, "stamps went back");
    // The sequences, connection by connection (even: server first; odd: client first; last:
    // aborted).
    assert_eq!(held, plain);
    assert_eq!(
        held[0],
        [
            "TCP_SYN_RECV->TCP_ESTABLISHED",
            "accept",
            "TCP_ESTABLISHED->TCP_FIN_WAIT1"
        ]
    );
    assert_eq!(
        held[1],
        [
            "TCP_SYN_RECV->TCP_ESTABLISHED",
            "accept",
            "TCP_ESTABLISHED->TCP_CLOSE_WAIT",
            "TCP_CLOSE_WAIT->TCP_LAST_ACK"
        ]
    );
    assert_eq!(
        held[CLEAN],
        [
            "TCP_SYN_RECV->TCP_ESTABLISHED",
            "accept",
            "rst-in",
            "TCP_ESTABLISHED->TCP_CLOSE"
        ]
    );
    // Unheld: an arrival, an accept and a close (two for a client's) per connection. Held: the
    // close alone, and one record more for the aborted connection. Others' traffic on the
    // host may add to either.
    let n = CLEAN as f64;
    assert!(
        plain_records.0 >= 2.0 * n && plain_records.1 >= n,
        "{plain_records:?}"
    );
    assert!(
        held_records.0 < 1.75 * n,
        "state-change records {held_records:?}"
    );
    assert!(held_records.1 < 0.1 * n, "accept records {held_records:?}");
}

/// The agent's side of the hold: a namespace marked hot has its arrivals sent as they come,
/// and what the kernel held there is taken over (as the events its record would have made),
/// once: the connection's close then carries nothing.
#[test]
fn a_hot_namespace_is_sent_as_it_comes_and_what_was_held_there_is_taken_over_once() {
    let mut h = Harness::start_lean_as(HOOKS, RING, true);
    let mut hold = h.capture.take_hold().expect("the hold's maps");
    let ns = drainwatch_tests::own_netns();
    h.events();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let server = listener.local_addr().unwrap();
    let held = TcpStream::connect(server).unwrap();
    let (held_s, held_peer) = listener.accept().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let mine = |e: &Event, peer: SocketAddr| match e {
        Event::StateChange(s) => s
            .conn
            .is_some_and(|c| c.local == server && c.remote == peer),
        Event::Accepted(a) => a
            .conn
            .is_some_and(|c| c.local == server && c.remote == peer),
        _ => false,
    };
    let count = |events: &[Event], peer| events.iter().filter(|e| mine(e, peer)).count();
    assert_eq!(count(&h.events(), held_peer), 0, "held: nothing sent");
    // Hot: what was held is taken over, arrival then accept.
    let new = hold.set_hot(&[ns].into()).unwrap();
    assert_eq!(new, [ns].into());
    let mut taken = Vec::new();
    hold.take_over(|n, _| n == ns, &mut taken).unwrap();
    let taken: Vec<&Event> = taken.iter().filter(|e| mine(e, held_peer)).collect();
    assert!(
        matches!(
            taken.as_slice(),
            [Event::StateChange(s), Event::Accepted(a)]
                if s.meta.ts_ns < a.meta.ts_ns && a.meta.tgid == std::process::id()
        ),
        "{taken:#?}"
    );
    // Its close carries nothing more; a new connection's arrival and accept come at once.
    drop(held_s);
    drop(held);
    let c = TcpStream::connect(server).unwrap();
    let (s, peer) = listener.accept().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let events = h.events();
    assert_eq!(count(&events, held_peer), 1, "the close alone: {events:#?}");
    assert_eq!(count(&events, peer), 2, "arrival and accept: {events:#?}");
    // Cold again: the next one is held.
    assert!(hold.set_hot(&Default::default()).unwrap().is_empty());
    drop((c, s));
    let c = TcpStream::connect(server).unwrap();
    let (_s, peer) = listener.accept().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(count(&h.events(), peer), 0, "held again");
    drop(c);
}

/// A take-over reads the whole map in batches: thousands held at once are each taken over
/// exactly once, whole (arrival, then its accept by this process), and none of them again.
#[test]
fn thousands_held_at_once_are_each_taken_over_once_whole() {
    // More than one batch call reads (`CHUNK`, 4,096).
    const N: usize = 5000;
    drainwatch_tests::lab::storm::raise_nofile(N as u64 * 2 + 512);
    let mut h = Harness::start_lean_as(HOOKS, RING, true);
    let mut hold = h.capture.take_hold().expect("the hold's maps");
    let ns = drainwatch_tests::own_netns();
    h.events();
    // Ground truth: the peers this test made, each open on both ends.
    let (server, peers, open) = open_connections(N);
    let mine = |conn: Option<drainwatch::capture::event::Endpoints>| {
        conn.filter(|c| c.local == server && peers.contains(&c.remote))
            .map(|c| c.remote)
    };
    assert_eq!(
        h.events()
            .iter()
            .filter(|e| match e {
                Event::StateChange(s) => mine(s.conn).is_some(),
                Event::Accepted(a) => mine(a.conn).is_some(),
                _ => false,
            })
            .count(),
        0,
        "all held: nothing sent"
    );
    let mut taken = Vec::new();
    let sweep = hold.take_over(|n, _| n == ns, &mut taken).unwrap();
    assert!(sweep.held >= N, "{sweep:?}");
    // Each peer: its arrival, then its accept, once.
    let mut seen: std::collections::BTreeMap<SocketAddr, Vec<(&str, u64)>> = Default::default();
    for e in &taken {
        let (peer, what) = match e {
            Event::StateChange(s) => (mine(s.conn), "arrival"),
            Event::Accepted(a) => {
                let p = mine(a.conn);
                assert!(p.is_none() || a.meta.tgid == std::process::id());
                (p, "accept")
            }
            _ => (None, ""),
        };
        if let Some(p) = peer {
            seen.entry(p).or_default().push((what, e.meta().ts_ns));
        }
    }
    assert_eq!(
        seen.keys()
            .copied()
            .collect::<std::collections::BTreeSet<_>>(),
        peers
    );
    for (peer, evs) in &seen {
        assert!(
            matches!(evs.as_slice(), [("arrival", a), ("accept", b)] if a < b),
            "{peer}: {evs:?}"
        );
    }
    assert!(sweep.taken >= N, "{sweep:?}");
    // Taken: a second take-over finds none of them.
    let mut again = Vec::new();
    hold.take_over(|n, _| n == ns, &mut again).unwrap();
    assert!(
        again.iter().all(|e| match e {
            Event::StateChange(s) => mine(s.conn).is_none(),
            Event::Accepted(a) => mine(a.conn).is_none(),
            _ => true,
        }),
        "taken twice"
    );
    drop(open);
}

/// Past its size (`--hold-entries`) the hold sends arrivals as they come, each counted
/// (`hold_full`): with room for 16, of 40 connections at most 16 are held, and every other one
/// arrives as records of its own, arrival then accept.
#[test]
fn past_its_size_the_hold_sends_arrivals_as_they_come_and_counts_them() {
    use drainwatch::model::TcpState;
    use drainwatch_common::faults::FaultKind;
    const ROOM: u32 = 16;
    const N: usize = 40;
    let mut h = Harness::start_lean_holding(HOOKS, RING, ROOM);
    let full = |h: &Harness| h.fault_count(FaultKind::HoldFull);
    let full_before = full(&h);
    h.events();
    let (server, peers, open) = open_connections(N);
    // What each of this test's connections sent, in order.
    let mut sent: std::collections::BTreeMap<SocketAddr, Vec<&str>> = Default::default();
    let events = h.events();
    for e in &events {
        let (conn, what) = match e {
            Event::StateChange(s) if s.new == Some(TcpState::Established) => (s.conn, "arrival"),
            Event::StateChange(s) => (s.conn, "other step"),
            Event::Accepted(a) => (a.conn, "accept"),
            _ => (None, ""),
        };
        if let Some(c) = conn.filter(|c| c.local == server && peers.contains(&c.remote)) {
            sent.entry(c.remote).or_default().push(what);
        }
    }
    let held = N - sent.len();
    assert!(held <= ROOM as usize, "{held} held with room for {ROOM}");
    for (peer, what) in &sent {
        assert_eq!(what, &["arrival", "accept"], "{peer}");
    }
    let counted = full(&h) - full_before;
    assert!(
        counted >= sent.len() as u64,
        "{} sent past the hold's size, {counted} counted",
        sent.len()
    );
    drop(open);
}
