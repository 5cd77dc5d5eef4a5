//! The network namespace of every record, from the real programs: they keep the inode of the
//! last namespace they read per CPU (keyed by the namespace's cookie), so records of
//! namespaces made and freed one after another, interleaved with the host's, must each name
//! their own. Ground truth is the inode of `/proc/thread-self/ns/net` where the sockets were
//! made. Needs root.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    os::unix::fs::MetadataExt,
};

use drainwatch::capture::event::{Endpoints, Event};
use drainwatch_tests::Harness;

const HOOKS: &[&str] = &["socket_states", "accept_wait"];
const ROUNDS: usize = 6;

/// The inode of this thread's network namespace.
fn my_netns() -> u32 {
    let ino = std::fs::metadata("/proc/thread-self/ns/net")
        .expect("ns/net")
        .ino();
    u32::try_from(ino).expect("namespace inodes are 32-bit")
}

/// Brings `lo` up in this thread's namespace (a new one has it down).
fn loopback_up() {
    // SAFETY: plain socket and ioctl calls on a zeroed `ifreq` naming "lo".
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        assert!(fd >= 0, "socket");
        let mut req: libc::ifreq = std::mem::zeroed();
        for (d, s) in req.ifr_name.iter_mut().zip(b"lo\0") {
            *d = *s as libc::c_char;
        }
        assert_eq!(
            libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req),
            0,
            "SIOCGIFFLAGS"
        );
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        assert_eq!(
            libc::ioctl(fd, libc::SIOCSIFFLAGS, &mut req),
            0,
            "SIOCSIFFLAGS"
        );
        libc::close(fd);
    }
}

/// Three connections to a fresh loopback listener in this thread's namespace: the listener's
/// port and the namespace's inode.
fn connections() -> (u16, u32) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let mut byte = [0u8; 1];
    for _ in 0..3 {
        let mut c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        let (mut s, _) = listener.accept().expect("accept");
        c.write_all(b"q").expect("write");
        s.read_exact(&mut byte).expect("read");
        drop(s);
        assert_eq!(c.read(&mut byte).expect("eof"), 0);
    }
    (port, my_netns())
}

/// The same in a namespace of its own, made for it and freed when the thread ends.
fn connections_in_new_netns() -> (u16, u32) {
    std::thread::spawn(|| {
        // SAFETY: unshare(2) of this thread's network namespace only.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
        loopback_up();
        connections()
    })
    .join()
    .expect("namespace thread")
}

/// Whether a record is of the listener on `port` or one of its connections.
fn on(conn: &Option<Endpoints>, port: u16) -> bool {
    conn.is_some_and(|c| c.local.port() == port)
}

#[test]
fn each_record_names_its_own_namespace_as_namespaces_come_and_go() {
    let mut h = Harness::start(HOOKS, 1 << 22);
    h.events();
    let host = my_netns();
    let mut rounds = Vec::new();
    for _ in 0..ROUNDS {
        rounds.push(connections_in_new_netns());
        rounds.push(connections());
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    let events = h.events();
    let made: std::collections::BTreeSet<u32> = rounds.iter().map(|r| r.1).collect();
    assert!(
        made.len() > 2,
        "namespaces made one after another had inodes {made:?}"
    );
    for (port, netns) in &rounds {
        let mine: Vec<u32> = events
            .iter()
            .filter_map(|e| match e {
                Event::StateChange(s) if on(&s.conn, *port) => Some(s.meta.netns),
                Event::Accepted(a) if on(&a.conn, *port) => Some(a.meta.netns),
                _ => None,
            })
            .collect();
        // Each connection's arrival, accept and close at least, and the listener's opening.
        assert!(mine.len() >= 10, "port {port}: {} records", mine.len());
        assert!(
            mine.iter().all(|n| n == netns),
            "port {port} (namespace {netns}, host {host}): records named {mine:?}"
        );
    }
}
