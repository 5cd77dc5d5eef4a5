//! The kernel-facing checks of the matrix: each action is done once, with every plan loaded,
//! and each plan's events are checked exact against it (pids, addresses, ports, reasons, exit
//! codes), by what the plan's chosen hook offers.

use std::{
    net::{SocketAddr, TcpListener, TcpStream},
    panic::{AssertUnwindSafe, catch_unwind},
    time::Duration,
};

use drainwatch::capture::{event::Event, plan::SignalStatus};

use super::{
    Loaded, Runner,
    processes::{cgroup, check_cgroup, check_killed, child},
    queues::{accept, check_accept, check_overflow, overflow},
};
use crate::own_netns;

const ALL: &[&str] = &["natural", "classic", "kprobes"];
/// The accept path as the kernel decides it, as the agent loads it, and classic.
const ACCEPTS: &[&str] = &["natural", "held", "classic"];
const NATURAL: &[&str] = &["natural"];

pub fn run(r: &mut Runner, loaded: &mut [Loaded]) {
    scenario(r, loaded, "refused_connect", ALL, refused, check_refused);
    scenario(r, loaded, "abort", ALL, abort, check_abort);
    scenario(r, loaded, "accept_wait", ACCEPTS, accept, check_accept);
    scenario(r, loaded, "listen_overflow", ALL, overflow, check_overflow);
    scenario(
        r,
        loaded,
        "sigterm_143",
        NATURAL,
        || child(libc::SIGTERM),
        |l, c, e| check_killed(l, c, e, libc::SIGTERM, 143),
    );
    scenario(
        r,
        loaded,
        "sigkill_137",
        NATURAL,
        || child(libc::SIGKILL),
        |l, c, e| check_killed(l, c, e, libc::SIGKILL, 137),
    );
    scenario(r, loaded, "cgroup_removal", NATURAL, cgroup, check_cgroup);
}

/// Does `act` once and checks every loaded plan of `variants` with `check`.
fn scenario<C>(
    r: &mut Runner,
    loaded: &mut [Loaded],
    name: &str,
    variants: &[&str],
    act: impl FnOnce() -> C,
    check: impl Fn(&Loaded, &C, &[Event]) -> String,
) {
    let mine: Vec<usize> = (0..loaded.len())
        .filter(|&i| variants.contains(&loaded[i].variant.name))
        .filter(|&i| r.wanted(&format!("{name}[{}]", loaded[i].variant.name)))
        .collect();
    if mine.is_empty() {
        return;
    }
    for l in loaded.iter_mut() {
        l.take();
    }
    let ctx = catch_unwind(AssertUnwindSafe(act));
    let events: Vec<Vec<Event>> = loaded.iter_mut().map(Loaded::take).collect();
    for i in mine {
        let l = &loaded[i];
        let test = format!("{name}[{}]", l.variant.name);
        match &ctx {
            Ok(c) => r.check(&test, || check(l, c, &events[i])),
            Err(p) => {
                let msg = super::message(&**p);
                r.check(&test, || panic!("the action itself failed: {msg}"));
            }
        }
    }
}

/// Whether the chosen reset hook reports the kernel's reason (6.10+ hooks do; kprobes and
/// the pre-6.10 tracepoint cannot).
fn has_reason(st: &SignalStatus) -> bool {
    match st.chosen() {
        Some(h) if h.starts_with("tp_btf:") => true,
        Some("tracepoint:tcp:tcp_send_reset") => st.degraded.is_empty(),
        _ => false,
    }
}

/// Whether the chosen reset hook sees resets sent with no socket (all but the pre-6.10
/// tracepoint, which the plan marks degraded for exactly that).
fn sees_socketless(st: &SignalStatus) -> bool {
    !st.degraded.iter().any(|d| d.contains("no socket"))
}

fn reason_name(r: &Option<drainwatch::capture::event::Named>) -> Option<&str> {
    r.as_ref().and_then(|n| n.name.as_deref())
}

fn closed_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("local addr")
}

/// SO_LINGER 0: close() sends a RST instead of a FIN.
fn abort_on_close(s: &TcpStream) {
    socket2::SockRef::from(s)
        .set_linger(Some(Duration::ZERO))
        .expect("SO_LINGER 0");
}

fn refused() -> SocketAddr {
    let target = closed_port();
    let err = TcpStream::connect(target).expect_err("nothing listens");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
    target
}

/// A refused connect: the socket-less RST the closed port answers with, the RST the client
/// receives in SYN_SENT, and its ECONNREFUSED.
fn check_refused(l: &Loaded, target: &SocketAddr, events: &[Event]) -> String {
    let mut said = Vec::new();
    let mut client = None;
    if let Some(st) = l.status("resets_sent") {
        let sent: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                Event::ResetSent(r) if r.conn.is_some_and(|c| c.local == *target) => Some(r),
                _ => None,
            })
            .collect();
        if st.chosen().is_none() || !sees_socketless(st) {
            assert_eq!(sent.len(), 0, "{}: {sent:#?}", st.summary());
            said.push(format!("no socket-less RST ({})", st.summary()));
        } else {
            assert_eq!(sent.len(), 1, "one RST from {target}: {events:#?}");
            let s = sent[0];
            assert_eq!(s.skaddr, 0, "no socket owns a closed port");
            let want = has_reason(st).then_some("NO_SOCKET");
            assert_eq!(reason_name(&s.reason), want, "{s:?}");
            assert_eq!(
                s.meta.netns,
                own_netns(),
                "namespace from the packet's device"
            );
            let c = s.conn.map(|c| c.remote).expect("tuple");
            assert_eq!(c.ip(), target.ip());
            client = Some(c);
            said.push(format!("RST {target}->{c} reason {want:?}"));
        }
    }
    if let Some(st) = l.status("resets_received") {
        let got: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                Event::ResetReceived(r) if r.conn.is_some_and(|c| c.remote == *target) => Some(r),
                _ => None,
            })
            .collect();
        assert!(st.chosen().is_some(), "{}", st.summary());
        assert_eq!(got.len(), 1, "{events:#?}");
        let c = got[0].conn.map(|c| c.local).expect("tuple");
        if let Some(client) = client {
            assert_eq!(
                c, client,
                "the RST sent went to the client that received one"
            );
        }
        assert_eq!(c.ip(), target.ip());
        assert_ne!(got[0].skaddr, 0);
        assert_eq!(got[0].state.and_then(|s| s.name()), Some("TCP_SYN_SENT"));
        assert_eq!(got[0].meta.netns, own_netns());
        said.push(format!("RST received by {c} in SYN_SENT"));
        client = Some(c);
    }
    if let Some(st) = l.status("socket_errors") {
        let errs: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                Event::SocketError(s) if s.conn.is_some_and(|c| c.remote == *target) => Some(s),
                _ => None,
            })
            .collect();
        if st.chosen().is_none() {
            assert!(errs.is_empty());
            said.push(format!("no socket errors ({})", st.summary()));
        } else {
            assert_eq!(errs.len(), 1, "{events:#?}");
            assert_eq!(errs[0].errno, libc::ECONNREFUSED);
            if let Some(client) = client {
                assert_eq!(errs[0].conn.map(|c| c.local), Some(client));
            }
            said.push("ECONNREFUSED".into());
        }
    }
    said.join("; ")
}

struct Aborted {
    server: SocketAddr,
    client: SocketAddr,
}

fn abort() -> Aborted {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let server = listener.local_addr().expect("addr");
    let c = TcpStream::connect(server).expect("connect");
    let client = c.local_addr().expect("addr");
    let (s, _) = listener.accept().expect("accept");
    abort_on_close(&c);
    drop(c);
    // The server side has the RST once it reads: wait for it, so its event is in.
    let mut s = s;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let _ = std::io::Read::read(&mut s, &mut [0; 8]);
    Aborted { server, client }
}

/// An abort (close with SO_LINGER 0): the RST from this process's close, received by the
/// server side in ESTABLISHED, and the client socket's states.
fn check_abort(l: &Loaded, a: &Aborted, events: &[Event]) -> String {
    let mut said = Vec::new();
    if let Some(st) = l.status("resets_sent") {
        let sent: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                Event::ResetSent(r) if r.conn.is_some_and(|c| c.local == a.client) => Some(r),
                _ => None,
            })
            .collect();
        if st.chosen().is_none() {
            assert!(sent.is_empty());
            return format!("no RST: {}", st.summary());
        }
        assert_eq!(
            sent.len(),
            1,
            "{} from {}: {events:#?}",
            st.summary(),
            a.client
        );
        let s = sent[0];
        assert_eq!(s.conn.map(|c| c.remote), Some(a.server));
        assert_ne!(s.skaddr, 0);
        assert_eq!(s.meta.tgid, std::process::id(), "sent by close() here");
        assert_eq!(s.meta.netns, own_netns());
        // close() with SO_LINGER 0 goes through tcp_disconnect(), which reports TCP_STATE.
        let want = has_reason(st).then_some("TCP_STATE");
        assert_eq!(reason_name(&s.reason), want, "{s:?}");
        said.push(format!(
            "RST {}->{} pid {} reason {want:?}",
            a.client, a.server, s.meta.tgid
        ));
    }
    if l.status("resets_received").is_some() {
        let got = events
            .iter()
            .filter(|e| {
                matches!(e, Event::ResetReceived(r) if r.conn.is_some_and(|c| c.local == a.server && c.remote == a.client)
                    && r.state.and_then(|s| s.name()) == Some("TCP_ESTABLISHED"))
            })
            .count();
        assert_eq!(got, 1, "the server side got it in ESTABLISHED: {events:#?}");
        said.push("received in ESTABLISHED".into());
    }
    if l.status("socket_states").is_some() {
        let sk = events.iter().find_map(|e| match e {
            Event::StateChange(s)
                if s.conn.is_some_and(|c| c.local == a.client)
                    && s.new.and_then(|n| n.name()) == Some("TCP_ESTABLISHED") =>
            {
                Some(s.skaddr)
            }
            _ => None,
        });
        let sk = sk.expect("the client's ESTABLISHED transition");
        let path: Vec<String> = events
            .iter()
            .filter_map(|e| match e {
                Event::StateChange(s) if s.skaddr == sk => Some(format!(
                    "{}->{}",
                    s.old.and_then(|n| n.name()).unwrap_or("?"),
                    s.new.and_then(|n| n.name()).unwrap_or("?")
                )),
                _ => None,
            })
            .collect();
        assert_eq!(
            path,
            [
                "TCP_CLOSE->TCP_SYN_SENT",
                "TCP_SYN_SENT->TCP_ESTABLISHED",
                "TCP_ESTABLISHED->TCP_CLOSE"
            ]
        );
        said.push("client CLOSE->SYN_SENT->ESTABLISHED->CLOSE".into());
    }
    said.join("; ")
}
