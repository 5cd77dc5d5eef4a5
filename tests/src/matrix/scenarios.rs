//! The kernel-facing checks of the matrix: each action is done once, with every plan loaded,
//! and each plan's events are checked exact against it (pids, addresses, ports, reasons, exit
//! codes), by what the plan's chosen hook offers.

use std::{
    io::Write,
    net::{SocketAddr, TcpListener, TcpStream},
    os::{fd::AsRawFd, unix::process::ExitStatusExt},
    panic::{AssertUnwindSafe, catch_unwind},
    process::Command,
    time::{Duration, Instant},
};

use drainwatch::capture::{
    event::{Event, ExitStatus},
    plan::SignalStatus,
};

use super::{Loaded, Runner};
use crate::{listen_overflows_of, own_netns};

const ALL: &[&str] = &["natural", "classic", "kprobes"];
const BOTH: &[&str] = &["natural", "classic"];
const NATURAL: &[&str] = &["natural"];

pub fn run(r: &mut Runner, loaded: &mut [Loaded]) {
    scenario(r, loaded, "refused_connect", ALL, refused, check_refused);
    scenario(r, loaded, "abort", ALL, abort, check_abort);
    scenario(r, loaded, "accept_wait", BOTH, accept, check_accept);
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
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: valid fd and a correctly sized option value.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0);
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

struct Accepted {
    server: SocketAddr,
    peer: SocketAddr,
    waited: Duration,
}

fn accept() -> Accepted {
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
fn check_accept(l: &Loaded, a: &Accepted, events: &[Event]) -> String {
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

struct Overflowed {
    listener: SocketAddr,
    kernel_count: u64,
    /// The listener and its clients stay open until the events are in: a client's close
    /// would complete its handshake into the still-full queue, a second overflow.
    _open: (TcpListener, [TcpStream; 4]),
}

/// A listener that never accepts, with TCP_DEFER_ACCEPT, so the fourth handshake completes
/// into a full queue: the drop the kernel tags TCP_LISTEN_OVERFLOW (see tests/capture.rs).
fn overflow() -> Overflowed {
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

fn check_overflow(l: &Loaded, o: &Overflowed, events: &[Event]) -> String {
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

struct Child {
    pid: u32,
    status: std::process::ExitStatus,
}

fn child(sig: i32) -> Child {
    let mut c = Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("spawn sleep");
    let pid = c.id();
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
    let status = c.wait().expect("wait");
    Child { pid, status }
}

/// The signal from this process to the child, and the child's exit by it, as a shell's code.
fn check_killed(_: &Loaded, c: &Child, events: &[Event], sig: i32, code: i32) -> String {
    assert_eq!(c.status.signal(), Some(sig));
    let signals: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::Signal(s) if s.target_pid == c.pid as i32 => Some((s.sig, s.meta.tgid)),
            _ => None,
        })
        .collect();
    assert_eq!(signals, [(sig, std::process::id())], "{events:#?}");
    let exits: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::Exit(x) if x.meta.tgid == c.pid => Some(x.status),
            _ => None,
        })
        .collect();
    assert_eq!(
        exits,
        [ExitStatus::Killed {
            signal: sig,
            core: false
        }],
        "{events:#?}"
    );
    assert_eq!(exits[0].shell_code(), Some(code));
    format!(
        "pid {} got signal {sig} from pid {}, exit code {code}",
        c.pid,
        std::process::id()
    )
}

/// The cgroup v2 mount: the root on pure v2 hosts (the matrix's VMs), `unified` on hybrid ones.
pub fn cgroup_v2_root() -> std::path::PathBuf {
    ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .into_iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.join("cgroup.controllers").exists())
        .expect("a cgroup v2 mount")
}

struct Removed {
    name: String,
    id: u64,
}

fn cgroup() -> Removed {
    use std::os::unix::fs::MetadataExt;
    let name = format!("dw-matrix-{}", std::process::id());
    let dir = cgroup_v2_root().join(&name);
    std::fs::create_dir(&dir).expect("mkdir cgroup");
    let id = std::fs::metadata(&dir).expect("stat").ino();
    std::fs::remove_dir(&dir).expect("rmdir cgroup");
    Removed { name, id }
}

fn check_cgroup(_: &Loaded, c: &Removed, events: &[Event]) -> String {
    let got: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::CgroupRemoved(x) if x.path.ends_with(&c.name) => Some(x),
            _ => None,
        })
        .collect();
    assert_eq!(got.len(), 1, "{events:#?}");
    assert_eq!(got[0].id, c.id, "v2 cgroup id = its directory's inode");
    assert_eq!(got[0].path, format!("/{}", c.name));
    assert_eq!((got[0].hierarchy, got[0].level), (0, 1));
    assert_eq!(got[0].meta.tgid, std::process::id(), "rmdir ran here");
    format!(
        "cgroup /{} id {} removed by pid {}",
        c.name, c.id, got[0].meta.tgid
    )
}
