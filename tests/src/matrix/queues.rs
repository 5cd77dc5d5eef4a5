//! The matrix's accept-path checks: accept wait and a listen overflow, each exact against the
//! kernel's own counters.

use std::{
    io::Write,
    net::{SocketAddr, TcpListener, TcpStream},
    os::fd::AsRawFd,
    time::{Duration, Instant},
};

use drainwatch::capture::event::Event;

use super::Loaded;
use crate::{listen_overflows_of, own_netns};

pub(super) struct Accepted {
    server: SocketAddr,
    peer: SocketAddr,
    waited: Duration,
}

pub(super) fn accept() -> Accepted {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let server = listener.local_addr().expect("addr");
    let _client = TcpStream::connect(server).expect("connect");
    // The handshake is complete: the connection waits in the accept queue until accept().
    let queued = Instant::now();
    std::thread::sleep(Duration::from_millis(300));
    let (_conn, peer) = listener.accept().expect("accept");
    Accepted {
        server,
        peer,
        waited: queued.elapsed(),
    }
}

/// accept(): the queued connection, in this process, and how long it waited (handshake →
/// accept, kernel time) against what this process measured around it.
pub(super) fn check_accept(l: &Loaded, a: &Accepted, events: &[Event]) -> String {
    let st = l.status("accept_wait").expect("loaded");
    let est: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::StateChange(s)
                if s.conn
                    .is_some_and(|c| c.local == a.server && c.remote == a.peer)
                    && s.new.and_then(|n| n.name()) == Some("TCP_ESTABLISHED") =>
            {
                Some((s.skaddr, s.meta.ts_ns))
            }
            _ => None,
        })
        .collect();
    assert_eq!(est.len(), 1, "{events:#?}");
    let (sk, at) = est[0];
    let acc: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::Accepted(x) if x.skaddr == sk => Some(x),
            _ => None,
        })
        .collect();
    assert_eq!(acc.len(), 1, "{}: {events:#?}", st.summary());
    assert_eq!(acc[0].meta.tgid, std::process::id(), "accept() ran here");
    assert_eq!(
        acc[0].conn.map(|c| (c.local, c.remote)),
        Some((a.server, a.peer))
    );
    let wait = acc[0].meta.ts_ns.saturating_sub(at) as f64 / 1e9;
    // Under TCG a syscall's entry and exit are slower: 50 ms of slack each side.
    assert!(
        (wait - a.waited.as_secs_f64()).abs() < 0.05,
        "accept wait {wait:.3}s, measured {:.3}s",
        a.waited.as_secs_f64()
    );
    format!(
        "{} accepted {} after {wait:.3}s (measured {:.3}s) via {}",
        a.server,
        a.peer,
        a.waited.as_secs_f64(),
        st.chosen().unwrap_or("?")
    )
}

pub(super) struct Overflowed {
    listener: SocketAddr,
    kernel_count: u64,
    /// The listener and its clients stay open until the events are in: a client's close
    /// would complete its handshake into the still-full queue, a second overflow.
    _open: (TcpListener, [TcpStream; 4]),
}

/// A listener that never accepts, with TCP_DEFER_ACCEPT, so the fourth handshake completes
/// into a full queue: the drop the kernel tags TCP_LISTEN_OVERFLOW (see tests/capture.rs).
pub(super) fn overflow() -> Overflowed {
    const BACKLOG: i32 = 2;
    let sock = TcpListener::bind("127.0.0.1:0").expect("bind");
    let listener = sock.local_addr().expect("addr");
    let defer: libc::c_int = 5;
    // SAFETY: valid fd and option values of the right sizes.
    unsafe {
        assert_eq!(
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_DEFER_ACCEPT,
                (&defer as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            ),
            0
        );
        assert_eq!(libc::listen(sock.as_raw_fd(), BACKLOG), 0);
    }
    let before = listen_overflows_of("self");
    let connect =
        || TcpStream::connect_timeout(&listener, Duration::from_secs(5)).expect("connect");
    let send = |c: &mut TcpStream| c.write_all(b"x").expect("send");
    let (mut c1, mut c2) = (connect(), connect());
    send(&mut c1);
    let mut c3 = connect();
    send(&mut c2);
    let mut c4 = connect();
    send(&mut c3);
    send(&mut c4);
    // The drop happens in softirq as the segment arrives: on loopback, before send returns.
    Overflowed {
        listener,
        kernel_count: listen_overflows_of("self") - before,
        _open: (sock, [c1, c2, c3, c4]),
    }
}

pub(super) fn check_overflow(l: &Loaded, o: &Overflowed, events: &[Event]) -> String {
    let st = l.status("listen_overflows").expect("loaded");
    assert_eq!(
        o.kernel_count, 1,
        "the namespace's ListenOverflows moved by one"
    );
    let got: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::ListenOverflow(x) if x.listener == Some(o.listener) => Some(x),
            _ => None,
        })
        .collect();
    if st.chosen().is_none() {
        assert!(got.is_empty());
        return format!(
            "kernel counted 1 overflow; no event: {} (the namespace's TcpExt counter remains)",
            st.summary()
        );
    }
    let all: Vec<_> = events
        .iter()
        .filter(|e| matches!(e, Event::ListenOverflow(_)))
        .collect();
    assert_eq!(got.len(), 1, "{} on {}: {all:#?}", st.summary(), o.listener);
    assert_eq!(got[0].reason.name.as_deref(), Some("TCP_LISTEN_OVERFLOW"));
    assert_eq!(got[0].meta.netns, own_netns());
    format!("overflow on {} (TCP_LISTEN_OVERFLOW)", o.listener)
}
