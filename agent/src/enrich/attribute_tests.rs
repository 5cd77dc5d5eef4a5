//! Attribution driven by synthetic events against a fake host.

use std::net::{IpAddr, SocketAddr};

use super::{
    attribute::Enricher,
    cgroup_path::CgroupOwner,
    host::{HostView, ProcInfo, SocketEntry},
    netstat::ListenCounters,
    runtime_meta::ContainerMeta,
};
use crate::{
    capture::event::{
        CgroupRemoved, Endpoints, Event, Exit, ExitStatus, IoStep, Meta, Named, ResetSent, Signal,
        StateChange, TcpCounters, UpstreamIo,
    },
    capture::hooks::signal_generate::Delivery,
    model::{
        ExitInfo, Fact, HashSet, Netns, Observation as O, ResetDirection, TcpState, UpstreamStep,
        stop::IgnoredSignal,
    },
};

const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const NS: u32 = 4026532177;
const HOST_NS: u32 = 4026531840;

fn path() -> String {
    format!("/libpod_parent/libpod-{ID}")
}

#[derive(Default)]
struct FakeHost {
    procs: Vec<ProcInfo>,
    /// (pid, start in kernel monotonic ns) of the processes whose start is known.
    start_times: Vec<(u32, u64)>,
    /// Walks of every process (`container_pids`) so far.
    walks: std::cell::Cell<u32>,
    /// Sockets processes opened since (pid, inode), which a test adds to.
    opened: std::rc::Rc<std::cell::RefCell<Vec<(u32, u64)>>>,
}

impl HostView for FakeHost {
    fn container_pids(&self) -> Vec<(u32, String)> {
        self.walks.set(self.walks.get() + 1);
        self.procs
            .iter()
            .filter_map(|p| Some((p.pid, p.cgroup_path.clone()?)))
            .collect()
    }
    fn process(&self, pid: u32) -> Option<ProcInfo> {
        self.procs.iter().find(|p| p.pid == pid).cloned()
    }
    fn start_ns(&self, pid: u32) -> Option<u64> {
        self.start_times
            .iter()
            .find(|(p, _)| *p == pid)
            .map(|(_, at)| *at)
    }
    fn sockets(&self, _pid: u32) -> Vec<SocketEntry> {
        let entry = |inode, local: &str, remote: &str, listening| SocketEntry {
            inode,
            local: local.parse().unwrap(),
            remote: remote.parse().unwrap(),
            listening,
            established: !listening,
            rx_queue: if listening { 3 } else { 0 },
        };
        vec![
            entry(11, "0.0.0.0:8080", "0.0.0.0:0", true),
            entry(12, "10.88.0.5:8080", "10.88.0.1:40000", false),
            // A socket of another container sharing the namespace (a pod's sidecar).
            entry(13, "0.0.0.0:9090", "0.0.0.0:0", true),
            // nginx on the host.
            entry(21, "0.0.0.0:80", "0.0.0.0:0", true),
        ]
    }
    fn socket_inodes(&self, pid: u32) -> Vec<u64> {
        let mut own = match pid {
            101 => vec![11, 12],
            60 => vec![21],
            _ => vec![],
        };
        own.extend(
            self.opened
                .borrow()
                .iter()
                .filter(|(p, _)| *p == pid)
                .map(|(_, inode)| *inode),
        );
        own
    }
    fn local_ips(&self, _pid: u32) -> Vec<IpAddr> {
        vec!["10.88.0.5".parse().unwrap()]
    }
    fn cgroup_v2_id(&self, _path: &str) -> Option<u64> {
        Some(777)
    }
    fn netstat(&self, pid: u32) -> Option<String> {
        (pid == 101).then(|| "TcpExt: ListenOverflows ListenDrops\nTcpExt: 7 9\n".to_string())
    }
    fn metadata(&self, _owner: &CgroupOwner) -> ContainerMeta {
        ContainerMeta {
            name: "web-2".into(),
            namespace: String::new(),
            pod: String::new(),
            workload: "web".into(),
        }
    }
}

fn proc(pid: u32, ppid: u32, comm: &str, ns_pid: u32, in_container: bool) -> ProcInfo {
    ProcInfo {
        pid,
        ppid,
        comm: comm.into(),
        ns_pid: Some(ns_pid),
        netns: Some(if in_container { NS } else { HOST_NS }),
        cgroup_path: in_container.then(path),
    }
}

/// catatonit (pid 100, pid 1 inside) runs python (pid 101); runc (pid 50) is outside.
fn enricher() -> Enricher<FakeHost> {
    let host = FakeHost {
        procs: vec![
            proc(50, 1, "runc", 50, false),
            proc(100, 90, "catatonit", 1, true),
            proc(101, 100, "python3", 2, true),
        ],
        start_times: Vec::new(),
        ..Default::default()
    };
    Enricher::new(host)
}

fn meta(tgid: u32, netns: u32, cgroup_id: u64) -> Meta {
    Meta {
        ts_ns: 1,
        pid: tgid,
        tgid,
        comm: "x".into(),
        cgroup_id,
        netns,
        netns_cookie: 0,
    }
}

fn named(name: &str) -> Option<Named> {
    Some(Named {
        value: 0,
        name: Some(name.into()),
    })
}

fn tcp(name: &str) -> Option<TcpState> {
    Some(TcpState::from_kernel_name(Some(name), 0))
}

fn conn(local: &str, remote: &str) -> Option<Endpoints> {
    Some(Endpoints {
        local: local.parse().unwrap(),
        remote: remote.parse().unwrap(),
    })
}

fn state(
    sk: u64,
    netns: u32,
    old: &str,
    new: &str,
    c: Option<Endpoints>,
    counters: TcpCounters,
) -> Event {
    Event::StateChange(StateChange {
        meta: meta(0, netns, 0),
        skaddr: sk,
        conn: c,
        old: tcp(old),
        new: tcp(new),
        counters,
        max_ack_backlog: None,
        held: None,
        failure: None,
    })
}

fn pending() -> TcpCounters {
    TcpCounters {
        bytes_received: 100,
        bytes_sent: 0,
        unread: 0,
        last_received: 10,
        last_sent: 5,
        ..TcpCounters::default()
    }
}

#[test]
fn a_scan_finds_the_container_its_main_process_listeners_and_connections() {
    let mut e = enricher();
    let obs = e.scan();
    let [
        O::Container {
            identity,
            listeners,
            inbound,
        },
    ] = obs.as_slice()
    else {
        panic!("{obs:#?}")
    };
    assert_eq!(identity.id, ID);
    assert_eq!(
        (
            identity.runtime.as_str(),
            identity.name.as_str(),
            identity.workload.as_str()
        ),
        ("podman", "web-2", "web")
    );
    assert_eq!(listeners, &["0.0.0.0:8080".parse::<SocketAddr>().unwrap()]);
    assert_eq!(inbound.len(), 1);
    assert!(e.scan().is_empty(), "a second scan adopts nothing new");
}

#[test]
fn signals_from_outside_count_and_forwarding_inside_does_not() {
    let mut e = enricher();
    e.scan();
    let sig_as = |sender: u32, target: i32, result| {
        Event::Signal(Signal {
            meta: meta(sender, HOST_NS, 0),
            sig: 15,
            target_pid: target,
            target_comm: String::new(),
            group: true,
            result,
        })
    };
    let sig = |sender: u32, target: i32| sig_as(sender, target, Delivery::Delivered);
    let obs = e.on_event(&sig(50, 100));
    assert!(
        matches!(obs.as_slice(), [O::Signal { sig: 15, sender, ignored: None, .. }] if sender.comm == "x" && sender.pid == 50),
        "{obs:#?}"
    );
    // Dropped by the kernel: at its PID 1 (a namespace's init without a handler), or at a
    // process that ignores it.
    let mut ignored = |target| match e
        .on_event(&sig_as(50, target, Delivery::Ignored))
        .as_slice()
    {
        [O::Signal { ignored, .. }] => *ignored,
        other => panic!("{other:#?}"),
    };
    assert_eq!(ignored(100), Some(IgnoredSignal::Pid1WithoutHandler));
    assert_eq!(ignored(101), Some(IgnoredSignal::IgnoredByProcess));
    // catatonit forwarding SIGTERM to python: inside the container.
    assert!(e.on_event(&sig(100, 101)).is_empty());
    // A signal between host processes.
    assert!(e.on_event(&sig(50, 1)).is_empty());
    // To the main process directly: a stop too.
    assert!(matches!(
        e.on_event(&sig(50, 101)).as_slice(),
        [O::Signal { .. }]
    ));
    // To another of its processes (an exec'd probe the runtime kills at its timeout): no stop.
    e.host_mut().procs.push(proc(102, 100, "sh", 3, true));
    e.scan();
    assert!(e.on_event(&sig(50, 102)).is_empty(), "not its main process");
}

#[test]
fn the_main_process_exit_counts_and_a_reused_pid_is_not_the_container() {
    let mut e = enricher();
    e.scan();
    let exit = |pid: u32, status: ExitStatus| {
        Event::Exit(Exit {
            meta: meta(pid, NS, 777),
            status,
        })
    };
    // catatonit is the init shim: its exit is not the main process's.
    assert!(e.on_event(&exit(100, ExitStatus::Exited(143))).is_empty());
    let obs = e.on_event(&exit(
        101,
        ExitStatus::Killed {
            signal: 15,
            core: false,
        },
    ));
    assert!(
        matches!(
            obs.as_slice(),
            [O::Exit {
                exit: ExitInfo {
                    code: Some(143),
                    signal: Some(15)
                },
                ..
            }]
        ),
        "{obs:#?}"
    );
    // Pid 101 reused later by a host process: not the container's any more.
    e.host_mut().procs.retain(|p| p.pid != 101);
    e.host_mut().procs.push(proc(101, 1, "cron", 101, false));
    let sig = Event::Signal(Signal {
        meta: meta(50, HOST_NS, 0),
        sig: 15,
        target_pid: 101,
        target_comm: String::new(),
        group: true,
        result: Delivery::Delivered,
    });
    assert!(e.on_event(&sig).is_empty());
}

#[test]
fn a_syn_to_a_closed_listener_is_refused_only_in_that_namespace() {
    let mut e = enricher();
    e.scan();
    let closed = state(
        0xf1,
        NS,
        "TCP_LISTEN",
        "TCP_CLOSE",
        conn("0.0.0.0:8080", "0.0.0.0:0"),
        TcpCounters::default(),
    );
    assert!(matches!(
        e.on_event(&closed).as_slice(),
        [O::ListenerClosed { .. }]
    ));
    let rst = |netns: u32, port: u16, answers_syn: Option<bool>| {
        Event::ResetSent(ResetSent {
            meta: meta(0, netns, 0),
            skaddr: 0,
            conn: conn(&format!("10.88.0.5:{port}"), "10.88.0.1:50000"),
            state: None,
            reason: named("NO_SOCKET"),
            answers_syn,
            answers_data: None,
        })
    };
    let namespace_reset = |obs: &[O]| {
        matches!(obs, [O::Reset { container, direction: ResetDirection::Sent, reason, on_connection: false, .. }]
            if container.id == ID && reason == "NO_SOCKET")
    };
    // Each is the namespace's RST (its container's, the only one there); a refusal is held
    // for the attempt's own side (see `refusals`), then reported unjoined.
    assert!(namespace_reset(&e.on_event(&rst(NS, 8080, Some(true)))));
    assert!(namespace_reset(&e.on_event(&rst(NS, 9999, Some(true)))));
    // Data to a closed port (no SYN) is a RST but no refused connect.
    assert!(namespace_reset(&e.on_event(&rst(NS, 7777, Some(false)))));
    // The answered segment unknown: only the former listening address tells a refusal.
    assert!(namespace_reset(&e.on_event(&rst(NS, 6666, None))));
    assert!(
        e.on_event(&rst(HOST_NS, 8080, Some(true))).is_empty(),
        "the host's namespace is no container's"
    );
    let flushed = e.flush(2_000_000_000);
    assert!(
        matches!(flushed.as_slice(), [
            O::Refused { key, at: 1, upstream: None, .. },
            O::RefusedAt { container, netns: Netns { inum: NS, cookie: 0 }, port: 9999, at: 1, upstream: None, .. },
        ] if key.as_str() == ID && container.id == ID),
        "{flushed:#?}"
    );
    assert!(e.flush(3_000_000_000).is_empty());
}

#[test]
fn a_pods_own_resets_go_to_the_port_holder_else_to_the_pod_as_a_whole() {
    let mut e = enricher();
    e.scan();
    let rst = |port: u16| {
        Event::ResetSent(ResetSent {
            meta: meta(0, NS, 0),
            skaddr: 0,
            conn: conn(&format!("10.88.0.5:{port}"), "10.88.0.1:50000"),
            state: None,
            reason: named("NO_SOCKET"),
            answers_syn: Some(false),
            answers_data: None,
        })
    };
    let owner = |obs: Vec<O>| match obs.as_slice() {
        [O::Reset { container, .. }] => (container.id.clone(), container.name.clone()),
        other => panic!("{other:#?}"),
    };
    assert_eq!(
        owner(e.on_event(&rst(5555))),
        (ID.to_string(), "web-2".into())
    );
    // A second container joins the namespace (a pod's sidecar).
    e.add_test_container("sidecar", NS);
    // The port of the first one's listener is still its own; any other is the pod's.
    assert_eq!(
        owner(e.on_event(&rst(8080))),
        (ID.to_string(), "web-2".into())
    );
    assert_eq!(
        owner(e.on_event(&rst(5555))),
        (String::new(), String::new())
    );
}

#[test]
fn a_refusal_seen_from_the_attempts_side_names_a_proxys_socket_only() {
    let mut e = enricher();
    e.scan();
    let closed = state(
        0xf1,
        NS,
        "TCP_LISTEN",
        "TCP_CLOSE",
        conn("0.0.0.0:8080", "0.0.0.0:0"),
        TcpCounters::default(),
    );
    e.on_event(&closed);
    // One attempt from 10.88.0.1:`port` on socket 0xd1 by `tgid`: connect(), the container's
    // namespace answers the SYN, the connecting socket receives the RST and closes.
    let mut attempt = |tgid: u32, port: u16| {
        let mut connect = state(
            0xd1,
            HOST_NS,
            "TCP_CLOSE",
            "TCP_SYN_SENT",
            conn("0.0.0.0:0", "10.88.0.5:8080"),
            TcpCounters::default(),
        );
        if let Event::StateChange(c) = &mut connect {
            c.meta.tgid = tgid;
            c.meta.comm = "nginx".into();
        }
        e.on_event(&connect);
        let client = format!("10.88.0.1:{port}");
        let sent = Event::ResetSent(ResetSent {
            meta: meta(0, NS, 0),
            skaddr: 0,
            conn: conn("10.88.0.5:8080", &client),
            state: None,
            reason: named("NO_SOCKET"),
            answers_syn: Some(true),
            answers_data: None,
        });
        assert!(
            matches!(
                e.on_event(&sent).as_slice(),
                [O::Reset {
                    on_connection: false,
                    ..
                }]
            ),
            "the refusal held"
        );
        let received = Event::ResetReceived(crate::capture::event::ResetReceived {
            meta: meta(0, HOST_NS, 0),
            skaddr: 0xd1,
            sock_cookie: 0,
            conn: conn(&client, "10.88.0.5:8080"),
            state: tcp("TCP_SYN_SENT"),
        });
        e.on_event(&received);
        let failed = state(
            0xd1,
            HOST_NS,
            "TCP_SYN_SENT",
            "TCP_CLOSE",
            conn(&client, "10.88.0.5:8080"),
            TcpCounters::default(),
        );
        e.on_event(&failed)
    };
    // pid 60 listens (a proxy): its attempt is named.
    let obs = attempt(60, 41_234);
    assert!(
        matches!(obs.as_slice(), [O::UpstreamClosed { sock: 0xd1, .. }, O::Refused { key, at: 1, upstream: Some(0xd1), .. }] if key.as_str() == ID),
        "{obs:#?}"
    );
    // The kernel reuses the address at once for another process's socket: not the proxy's.
    let obs = attempt(70, 41_235);
    assert!(
        matches!(
            obs.as_slice(),
            [O::Refused {
                key,
                at: 1,
                upstream: None,
                ..
            }] if key.as_str() == ID
        ),
        "{obs:?}"
    );
    assert!(e.flush(u64::MAX / 2).is_empty(), "each counted once");
}

/// `ev` as if it happened at `ts` (kernel monotonic ns).
fn stamped(mut ev: Event, ts: u64) -> Event {
    match &mut ev {
        Event::StateChange(c) => c.meta.ts_ns = ts,
        Event::ResetSent(r) => r.meta.ts_ns = ts,
        Event::ResetReceived(r) => r.meta.ts_ns = ts,
        _ => {}
    }
    ev
}

#[test]
fn failed_attempts_are_dated_at_their_syn_not_when_the_client_gave_up() {
    const S: u64 = 1_000_000_000;
    let mut e = enricher();
    e.scan();
    let step = |sk, old, new, local: &str, remote: &str, ts| {
        stamped(
            state(
                sk,
                HOST_NS,
                old,
                new,
                conn(local, remote),
                TcpCounters::default(),
            ),
            ts,
        )
    };
    // SYN at 10 s to the vanished address; the client gave up 2 s later (its connect timeout).
    e.on_event(&step(
        0xc1,
        "TCP_CLOSE",
        "TCP_SYN_SENT",
        "10.88.0.1:0",
        "10.88.0.5:8080",
        10 * S,
    ));
    let obs = e.on_event(&step(
        0xc1,
        "TCP_SYN_SENT",
        "TCP_CLOSE",
        "10.88.0.1:40001",
        "10.88.0.5:8080",
        12 * S,
    ));
    assert!(
        matches!(obs.as_slice(), [O::Unreachable { key, at, .. }] if key.as_str() == ID && *at == 10 * S),
        "{obs:#?}"
    );
    // Its SYN unseen: dated when it failed, as before.
    let obs = e.on_event(&step(
        0xc2,
        "TCP_SYN_SENT",
        "TCP_CLOSE",
        "10.88.0.1:40002",
        "10.88.0.5:8080",
        13 * S,
    ));
    assert!(matches!(obs.as_slice(), [O::Unreachable { at, .. }] if *at == 13 * S));
    // A connect that succeeds leaves nothing behind; nor does one to an address that is no
    // container's (loopback: its later steps may never come).
    e.on_event(&step(
        0xc3,
        "TCP_CLOSE",
        "TCP_SYN_SENT",
        "10.88.0.1:0",
        "10.88.0.5:8080",
        14 * S,
    ));
    e.on_event(&step(
        0xc3,
        "TCP_SYN_SENT",
        "TCP_ESTABLISHED",
        "10.88.0.1:40003",
        "10.88.0.5:8080",
        14 * S + 1,
    ));
    e.on_event(&step(
        0xc4,
        "TCP_CLOSE",
        "TCP_SYN_SENT",
        "127.0.0.1:0",
        "127.0.0.1:8080",
        15 * S,
    ));
    let connecting = |e: &crate::enrich::Enricher<_>| {
        e.state()
            .into_iter()
            .find(|s| s.map == crate::model::state::StateMap::Connecting)
            .map(|s| (s.entries, s.dropped))
    };
    assert_eq!(connecting(&e), Some((0, 0)));
    // An entry whose socket's next step was lost is not believed minutes later.
    e.on_event(&step(
        0xc5,
        "TCP_CLOSE",
        "TCP_SYN_SENT",
        "10.88.0.1:0",
        "10.88.0.5:8080",
        20 * S,
    ));
    let obs = e.on_event(&step(
        0xc5,
        "TCP_SYN_SENT",
        "TCP_CLOSE",
        "10.88.0.1:40005",
        "10.88.0.5:8080",
        400 * S,
    ));
    assert!(matches!(obs.as_slice(), [O::Unreachable { at, .. }] if *at == 400 * S));

    // A refused attempt whose first SYN went unanswered: the RST answered its retransmission
    // 1 s later; the attempt is dated at its SYN.
    let closed = state(
        0xf1,
        NS,
        "TCP_LISTEN",
        "TCP_CLOSE",
        conn("0.0.0.0:8080", "0.0.0.0:0"),
        TcpCounters::default(),
    );
    e.on_event(&stamped(closed, 30 * S));
    e.on_event(&step(
        0xd1,
        "TCP_CLOSE",
        "TCP_SYN_SENT",
        "0.0.0.0:0",
        "10.88.0.5:8080",
        31 * S,
    ));
    let sent = Event::ResetSent(ResetSent {
        meta: meta(0, NS, 0),
        skaddr: 0,
        conn: conn("10.88.0.5:8080", "10.88.0.1:41234"),
        state: None,
        reason: named("NO_SOCKET"),
        answers_syn: Some(true),
        answers_data: None,
    });
    e.on_event(&stamped(sent, 32 * S));
    let received = Event::ResetReceived(crate::capture::event::ResetReceived {
        meta: meta(0, HOST_NS, 0),
        skaddr: 0xd1,
        sock_cookie: 0,
        conn: conn("10.88.0.1:41234", "10.88.0.5:8080"),
        state: tcp("TCP_SYN_SENT"),
    });
    e.on_event(&stamped(received, 32 * S + 1));
    let obs = e.on_event(&step(
        0xd1,
        "TCP_SYN_SENT",
        "TCP_CLOSE",
        "10.88.0.1:41234",
        "10.88.0.5:8080",
        32 * S + 2,
    ));
    assert!(
        matches!(obs.as_slice(), [O::Refused { at, .. }] if *at == 31 * S),
        "{obs:#?}"
    );
}

#[test]
fn inbound_connections_close_by_container_or_by_peer() {
    let mut e = enricher();
    e.scan();
    let est = state(
        0xa1,
        NS,
        "TCP_SYN_RECV",
        "TCP_ESTABLISHED",
        conn("10.88.0.5:8080", "10.88.0.1:41000"),
        TcpCounters::default(),
    );
    assert!(matches!(
        e.on_event(&est).as_slice(),
        [
            O::InboundEstablished { sock: 0xa1, .. },
            O::Listener {
                fact: Fact::Arrival,
                ..
            }
        ]
    ));
    let cut = state(
        0xa1,
        NS,
        "TCP_ESTABLISHED",
        "TCP_FIN_WAIT1",
        conn("10.88.0.5:8080", "10.88.0.1:41000"),
        pending(),
    );
    assert!(matches!(
        e.on_event(&cut).as_slice(),
        [O::InboundClosed {
            sock: 0xa1,
            by_container: true,
            pending: true,
            ..
        }]
    ));

    let est = state(
        0xa2,
        NS,
        "TCP_SYN_RECV",
        "TCP_ESTABLISHED",
        conn("10.88.0.5:8080", "10.88.0.1:41001"),
        TcpCounters::default(),
    );
    e.on_event(&est);
    let peer_fin = state(
        0xa2,
        NS,
        "TCP_ESTABLISHED",
        "TCP_CLOSE_WAIT",
        conn("10.88.0.5:8080", "10.88.0.1:41001"),
        TcpCounters::default(),
    );
    assert!(e.on_event(&peer_fin).is_empty());
    let last_ack = state(
        0xa2,
        NS,
        "TCP_CLOSE_WAIT",
        "TCP_LAST_ACK",
        conn("10.88.0.5:8080", "10.88.0.1:41001"),
        pending(),
    );
    assert!(matches!(
        e.on_event(&last_ack).as_slice(),
        [O::InboundClosed {
            by_container: false,
            ..
        }]
    ));

    // A RST the kernel sends right after the close is still the container's.
    let rst = Event::ResetSent(ResetSent {
        meta: meta(0, NS, 0),
        skaddr: 0xa1,
        conn: None,
        state: None,
        reason: named("TCP_ABORT_ON_CLOSE"),
        answers_syn: None,
        answers_data: None,
    });
    assert!(
        matches!(e.on_event(&rst).as_slice(), [O::Reset { reason, direction: ResetDirection::Sent, on_connection: true, .. }] if reason == "TCP_ABORT_ON_CLOSE")
    );
    // Its time-wait socket's RST names the same connection: still its.
    let same = Event::ResetSent(ResetSent {
        meta: meta(0, NS, 0),
        skaddr: 0xa1,
        conn: conn("10.88.0.5:8080", "10.88.0.1:41000"),
        state: None,
        reason: named("TCP_TIMEWAIT_SOCKET"),
        answers_syn: Some(false),
        answers_data: None,
    });
    assert!(matches!(
        e.on_event(&same).as_slice(),
        [O::Reset {
            on_connection: true,
            ..
        }]
    ));
    // Its memory freed and taken by a loopback connect the kernel filter kept from the agent:
    // that socket's refusal is no longer the closed connection's.
    let reused = Event::ResetReceived(crate::capture::event::ResetReceived {
        meta: meta(0, NS, 0),
        skaddr: 0xa1,
        sock_cookie: 0,
        conn: conn("127.0.0.1:50000", "127.0.0.1:9090"),
        state: tcp("TCP_SYN_SENT"),
    });
    assert!(matches!(
        e.on_event(&reused).as_slice(),
        [O::Reset {
            on_connection: false,
            direction: ResetDirection::Received,
            ..
        }]
    ));
}

#[test]
fn a_closed_sockets_rst_answers_a_request_only_for_data_to_its_listening_port_in_its_namespace() {
    let mut e = enricher().with_host_netns(HOST_NS);
    e.scan();
    let c = conn("10.88.0.5:8080", "10.88.0.1:41001");
    e.on_event(&state(
        0xa1,
        NS,
        "TCP_SYN_RECV",
        "TCP_ESTABLISHED",
        c,
        TcpCounters::default(),
    ));
    e.on_event(&state(
        0xa1,
        NS,
        "TCP_ESTABLISHED",
        "TCP_FIN_WAIT1",
        c,
        TcpCounters::default(),
    ));
    e.on_event(&state(
        0xa1,
        NS,
        "TCP_FIN_WAIT1",
        "TCP_CLOSE",
        c,
        TcpCounters::default(),
    ));
    // The kernel gave the freed socket's address to a client's socket on the node, which
    // resets a stream's last event after its own close (seen in the SSE lab by bpftrace):
    // the host's RST, never the stopping container's.
    let rst = |netns, local: &str, remote: &str| {
        Event::ResetSent(ResetSent {
            meta: meta(0, netns, 0),
            skaddr: 0xa1,
            conn: conn(local, remote),
            state: None,
            reason: named("TCP_ABORT_ON_DATA"),
            answers_syn: Some(false),
            answers_data: Some(true),
        })
    };
    assert!(
        e.on_event(&rst(HOST_NS, "10.88.0.1:52890", "10.88.0.5:8080"))
            .is_empty()
    );
    // In its own namespace, the closed socket's: data to its listening port, a request at a
    // connection it had closed.
    assert!(matches!(
        e.on_event(&rst(NS, "10.88.0.5:8080", "10.88.0.1:41001"))
            .as_slice(),
        [O::Reset {
            on_connection: true,
            answers_request: true,
            ..
        }]
    ));
    // Data to a port it never listened on: an upstream answering a connection it had opened
    // and closed itself (a proxy leaving a stream), no client's request.
    assert!(matches!(
        e.on_event(&rst(NS, "10.88.0.5:51000", "10.88.0.9:80"))
            .as_slice(),
        [O::Reset {
            answers_request: false,
            ..
        }]
    ));
}

#[test]
fn a_connection_found_by_the_scan_is_followed_by_its_tuple() {
    let mut e = enricher();
    let obs = e.scan();
    let [O::Container { inbound, .. }] = obs.as_slice() else {
        panic!()
    };
    let seeded = inbound[0];
    let close = state(
        0xbeef,
        NS,
        "TCP_ESTABLISHED",
        "TCP_FIN_WAIT1",
        conn("10.88.0.5:8080", "10.88.0.1:40000"),
        pending(),
    );
    let obs = e.on_event(&close);
    assert!(
        matches!(obs.as_slice(), [O::InboundClosed { sock, pending: true, .. }] if *sock == seeded),
        "{obs:#?}"
    );
}

#[test]
fn a_refused_connect_is_not_also_unreachable() {
    let mut e = enricher();
    e.scan();
    let rst = Event::ResetReceived(crate::capture::event::ResetReceived {
        meta: meta(0, HOST_NS, 0),
        skaddr: 0xd1,
        sock_cookie: 0,
        conn: conn("10.88.0.1:41234", "10.88.0.5:8080"),
        state: tcp("TCP_SYN_SENT"),
    });
    e.on_event(&rst);
    let closed = state(
        0xd1,
        HOST_NS,
        "TCP_SYN_SENT",
        "TCP_CLOSE",
        conn("10.88.0.1:41234", "10.88.0.5:8080"),
        TcpCounters::default(),
    );
    assert!(e.on_event(&closed).is_empty());
}

#[test]
fn failed_connects_to_its_address_and_its_cgroup_removal() {
    let mut e = enricher();
    e.scan();
    let attempt = state(
        0xc1,
        HOST_NS,
        "TCP_SYN_SENT",
        "TCP_CLOSE",
        conn("10.88.0.1:0", "10.88.0.5:8080"),
        TcpCounters::default(),
    );
    assert!(matches!(
        e.on_event(&attempt).as_slice(),
        [O::Unreachable { .. }]
    ));
    let other = state(
        0xc2,
        HOST_NS,
        "TCP_SYN_SENT",
        "TCP_CLOSE",
        conn("10.88.0.1:0", "10.88.0.9:8080"),
        TcpCounters::default(),
    );
    assert!(e.on_event(&other).is_empty());
    let rmdir = |p: String| {
        Event::CgroupRemoved(CgroupRemoved {
            meta: meta(0, HOST_NS, 0),
            id: 777,
            hierarchy: 0,
            level: 2,
            path: p,
        })
    };
    assert!(matches!(
        e.on_event(&rmdir(path())).as_slice(),
        [O::CgroupRemoved { .. }]
    ));
    let other = |id| {
        Event::CgroupRemoved(CgroupRemoved {
            id,
            ..match rmdir("/system.slice/cron.service".into()) {
                Event::CgroupRemoved(c) => c,
                _ => unreachable!(),
            }
        })
    };
    assert!(e.on_event(&other(778)).is_empty(), "another cgroup");
    // A path cut at 256 bytes: the container's cgroup id still names it.
    let cut: String = format!("/kubepods.slice/{}", "x".repeat(240));
    assert!(matches!(
        e.on_event(&rmdir(cut)).as_slice(),
        [O::CgroupRemoved { key }] if key.as_str() == ID
    ));
}

#[test]
fn an_attempt_to_an_ended_containers_address_is_announced_from_its_syn_to_its_next_step() {
    const S: u64 = 1_000_000_000;
    let mut e = enricher();
    e.scan();
    let step = |sk, old, new, ts| {
        let c = conn("10.88.0.1:40001", "10.88.0.5:8080");
        stamped(state(sk, HOST_NS, old, new, c, TcpCounters::default()), ts)
    };
    // Running: a connect to it costs no observation.
    assert!(
        e.on_event(&step(0xa1, "TCP_CLOSE", "TCP_SYN_SENT", S))
            .is_empty()
    );
    assert!(
        e.on_event(&step(0xa1, "TCP_SYN_SENT", "TCP_ESTABLISHED", S + 1))
            .is_empty()
    );
    let rmdir = Event::CgroupRemoved(CgroupRemoved {
        meta: meta(0, HOST_NS, 0),
        id: 777,
        hierarchy: 0,
        level: 2,
        path: path(),
    });
    assert!(matches!(
        e.on_event(&rmdir).as_slice(),
        [O::CgroupRemoved { .. }]
    ));
    // Gone: the SYN is announced, and its failure 40 s later ends it, dated at the SYN.
    let obs = e.on_event(&step(0xa2, "TCP_CLOSE", "TCP_SYN_SENT", 2 * S));
    assert!(
        matches!(obs.as_slice(), [O::AttemptBegan { key, sock: 0xa2, at }] if key.as_str() == ID && *at == 2 * S),
        "{obs:#?}"
    );
    let obs = e.on_event(&step(0xa2, "TCP_SYN_SENT", "TCP_CLOSE", 42 * S));
    assert!(
        matches!(obs.as_slice(), [O::AttemptEnded { sock: 0xa2, .. }, O::Unreachable { at, .. }] if *at == 2 * S),
        "{obs:#?}"
    );
    // A socket address reused with its earlier attempt's end unseen: that one ends first.
    e.on_event(&step(0xa3, "TCP_CLOSE", "TCP_SYN_SENT", 50 * S));
    let obs = e.on_event(&step(0xa3, "TCP_CLOSE", "TCP_SYN_SENT", 60 * S));
    assert!(
        matches!(obs.as_slice(), [O::AttemptEnded { sock: 0xa3, .. }, O::AttemptBegan { sock: 0xa3, at, .. }] if *at == 60 * S),
        "{obs:#?}"
    );
}

#[test]
fn runc_init_before_it_names_itself_is_not_the_main_process() {
    // `runc init` as it joined the cgroup: `/proc/self/exe`, in the host's PID namespace.
    let mut e = Enricher::new(FakeHost {
        procs: vec![proc(100, 50, "exe", 100, true)],
        ..Default::default()
    });
    let adopted = |obs: &[O]| {
        obs.iter()
            .filter(|o| matches!(o, O::Container { .. }))
            .count()
    };
    assert_eq!(
        adopted(&e.scan()),
        0,
        "nothing adopted while runc creates it"
    );
    // Its PID 1 and the entrypoint: adopted once, as a first run (no restart).
    e.host_mut().procs = vec![
        proc(103, 50, "podman-init", 1, true),
        proc(104, 103, "python3", 2, true),
    ];
    let obs = e.scan();
    assert_eq!(adopted(&obs), 1, "{obs:#?}");
    assert!(
        !obs.iter()
            .any(|o| matches!(o, O::Started { restart: true, .. })),
        "{obs:#?}"
    );
    assert!(e.scan().is_empty(), "the same run");
}

#[test]
fn a_container_removed_before_any_of_its_processes_was_seen_is_counted_once() {
    let mut e = enricher();
    e.scan();
    let rmdir = |path: String, hierarchy| {
        Event::CgroupRemoved(CgroupRemoved {
            meta: meta(0, HOST_NS, 0),
            id: 901,
            hierarchy,
            level: 2,
            path,
        })
    };
    let never = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";
    for hierarchy in [0, 3] {
        let gone = e.on_event(&rmdir(format!("/libpod_parent/libpod-{never}"), hierarchy));
        assert!(gone.is_empty(), "{gone:?}");
    }
    // Its monitor, a plain service and a known container are no unseen container.
    e.on_event(&rmdir(
        format!("/machine.slice/libpod-conmon-{never}.scope"),
        0,
    ));
    e.on_event(&rmdir("/system.slice/cron.service".into(), 0));
    e.on_event(&rmdir(path(), 0));
    assert_eq!(e.unseen_containers(), 1);
}

#[test]
fn a_gone_container_resolves_until_the_retention_window_ends() {
    let mut e = enricher();
    e.scan();
    let closed = state(
        0xf1,
        NS,
        "TCP_LISTEN",
        "TCP_CLOSE",
        conn("0.0.0.0:8080", "0.0.0.0:0"),
        TcpCounters::default(),
    );
    e.on_event(&closed);
    let mut rmdir = CgroupRemoved {
        meta: meta(0, HOST_NS, 0),
        id: 777,
        hierarchy: 0,
        level: 2,
        path: path(),
    };
    rmdir.meta.ts_ns = 1_000;
    e.on_event(&Event::CgroupRemoved(rmdir));
    let attempt = state(
        0xc1,
        HOST_NS,
        "TCP_SYN_SENT",
        "TCP_CLOSE",
        conn("10.88.0.1:0", "10.88.0.5:8080"),
        TcpCounters::default(),
    );
    e.expire(1_000 + 299, 300);
    assert_eq!(e.on_event(&attempt).len(), 1, "still within retention");
    e.expire(1_000 + 300, 300);
    assert_eq!(e.container_count(), 0);
    assert!(e.on_event(&attempt).is_empty(), "forgotten");
}

#[test]
fn a_proxy_connection_cut_names_the_proxy_its_worker_and_what_the_backend_left_unread() {
    let mut e = enricher();
    e.scan();
    let mut connect = match state(
        0xe1,
        HOST_NS,
        "TCP_CLOSE",
        "TCP_SYN_SENT",
        conn("0.0.0.0:0", "10.88.0.5:8080"),
        TcpCounters::default(),
    ) {
        Event::StateChange(mut s) => {
            s.meta.tgid = 60;
            s.meta.comm = "nginx".into();
            s.meta.ts_ns = 500;
            s
        }
        _ => unreachable!(),
    };
    let generation = e.watch_generation();
    let opened = e.on_event(&Event::StateChange(connect.clone()));
    assert!(
        matches!(&opened[..], [crate::model::Observation::UpstreamOpened { sock: 0xe1, proxy, .. }] if proxy.tgid == 60),
        "{opened:?}"
    );
    // Found a proxy: the kernel follows its connects from now on; this one the agent adds.
    assert_ne!(e.watch_generation(), generation);
    assert_eq!(e.watch_set().proxies.into_iter().collect::<Vec<_>>(), [60]);
    assert_eq!(e.take_follow(), [0xe1]);
    connect.old = tcp("TCP_SYN_SENT");
    connect.new = tcp("TCP_ESTABLISHED");
    connect.conn = conn("10.88.0.1:50000", "10.88.0.5:8080");
    assert!(e.on_event(&Event::StateChange(connect)).is_empty());
    // The container accepts it and dies with 7 bytes of it unread.
    e.on_event(&state(
        0xa9,
        NS,
        "TCP_SYN_RECV",
        "TCP_ESTABLISHED",
        conn("10.88.0.5:8080", "10.88.0.1:50000"),
        TcpCounters::default(),
    ));
    let mut counters = pending();
    counters.bytes_received = 120;
    counters.unread = 7;
    let obs = e.on_event(&state(
        0xa9,
        NS,
        "TCP_ESTABLISHED",
        "TCP_CLOSE",
        conn("10.88.0.5:8080", "10.88.0.1:50000"),
        counters,
    ));
    assert!(
        matches!(
            obs.as_slice(),
            [
                O::UpstreamPeerClosed {
                    sock: 0xe1,
                    unread: 7,
                    ..
                },
                O::InboundClosed { pending: true, .. }
            ]
        ),
        "{obs:#?}"
    );
    // nginx's side: the reset closes its socket before its worker reads the error.
    e.on_event(&state(
        0xe1,
        HOST_NS,
        "TCP_ESTABLISHED",
        "TCP_CLOSE",
        conn("10.88.0.1:50000", "10.88.0.5:8080"),
        TcpCounters::default(),
    ));
    let mut m = meta(60, 0, 0);
    m.pid = 61;
    let cut = Event::UpstreamIo(UpstreamIo {
        meta: m,
        skaddr: 0xe1,
        step: IoStep::Cut {
            bytes: 120,
            started_at: 400,
            ret: -104,
        },
    });
    let obs = e.on_event(&cut);
    assert!(
        matches!(
            obs.as_slice(),
            [O::UpstreamRequest {
                sock: 0xe1,
                tid: 61,
                step: UpstreamStep::Cut { bytes: 120, started_at: 400 },
                proxy,
                ..
            }] if proxy.name == "nginx" && proxy.tgid == 60
        ),
        "{obs:#?}"
    );
    // A socket that is no proxy's connection to a container says nothing.
    let Event::UpstreamIo(mut other) = cut.clone() else {
        unreachable!()
    };
    other.skaddr = 0xe9;
    assert!(e.on_event(&Event::UpstreamIo(other)).is_empty());
    // Another process (no proxy) connects to the container on the closed socket's address,
    // and the kernel follows it too: its cut is not the proxy's, whether its connect reached
    // the agent or not.
    let Event::UpstreamIo(mut foreign) = cut.clone() else {
        unreachable!()
    };
    foreign.meta.tgid = 50;
    assert!(e.on_event(&Event::UpstreamIo(foreign)).is_empty());
    let Event::StateChange(mut reused) = state(
        0xe1,
        HOST_NS,
        "TCP_CLOSE",
        "TCP_SYN_SENT",
        conn("0.0.0.0:0", "10.88.0.5:8080"),
        TcpCounters::default(),
    ) else {
        unreachable!()
    };
    reused.meta.tgid = 50; // holds no listening socket
    assert!(e.on_event(&Event::StateChange(reused)).is_empty());
    assert!(e.on_event(&cut).is_empty(), "a cut on the reused socket");
}

#[test]
fn a_reset_failing_a_proxys_first_send_is_a_cut_of_zero_bytes_once_established() {
    let mut e = enricher();
    e.scan();
    let Event::StateChange(mut connect) = state(
        0xe3,
        HOST_NS,
        "TCP_CLOSE",
        "TCP_SYN_SENT",
        conn("0.0.0.0:0", "10.88.0.5:8080"),
        TcpCounters::default(),
    ) else {
        unreachable!()
    };
    connect.meta.tgid = 60;
    connect.meta.comm = "haproxy".into();
    e.on_event(&Event::StateChange(connect.clone()));
    let mut m = meta(60, 0, 0);
    m.pid = 61;
    let unsent = Event::UpstreamIo(UpstreamIo {
        meta: m,
        skaddr: 0xe3,
        step: IoStep::Cut {
            bytes: 0,
            started_at: 900,
            ret: -32,
        },
    });
    // Still connecting (a refused attempt's failed send): its state change tells.
    assert!(e.on_event(&unsent).is_empty());
    connect.old = tcp("TCP_SYN_SENT");
    connect.new = tcp("TCP_ESTABLISHED");
    connect.conn = conn("10.88.0.1:50002", "10.88.0.5:8080");
    e.on_event(&Event::StateChange(connect));
    let obs = e.on_event(&unsent);
    assert!(
        matches!(
            obs.as_slice(),
            [O::UpstreamRequest {
                sock: 0xe3,
                tid: 61,
                step: UpstreamStep::Cut {
                    bytes: 0,
                    started_at: 900
                },
                ..
            }]
        ),
        "{obs:#?}"
    );
}

#[test]
fn a_process_without_a_listener_is_no_proxy() {
    let mut e = enricher();
    e.scan();
    let mut s = match state(
        0xe2,
        HOST_NS,
        "TCP_CLOSE",
        "TCP_SYN_SENT",
        conn("0.0.0.0:0", "10.88.0.5:8080"),
        TcpCounters::default(),
    ) {
        Event::StateChange(s) => s,
        _ => unreachable!(),
    };
    s.meta.tgid = 50; // runc: holds no listening socket
    assert!(e.on_event(&Event::StateChange(s)).is_empty());
}

/// A proxy may connect to a container before it listens (Envoy health-checks its clusters
/// before its listeners are up): found no proxy then, it is looked at again after
/// `NOT_A_PROXY_FOR`, not taken for none until it exits.
#[test]
fn a_process_that_listens_after_its_first_connect_is_a_proxy_once_looked_at_again() {
    let host = FakeHost {
        procs: vec![
            proc(100, 90, "catatonit", 1, true),
            proc(101, 100, "python3", 2, true),
        ],
        ..Default::default()
    };
    let opened = host.opened.clone();
    let mut e = Enricher::new(host);
    e.scan();
    let connect = |sock: u64, at_s: u64| {
        let mut ev = state(
            sock,
            HOST_NS,
            "TCP_CLOSE",
            "TCP_SYN_SENT",
            conn("0.0.0.0:0", "10.88.0.5:8080"),
            TcpCounters::default(),
        );
        if let Event::StateChange(s) = &mut ev {
            s.meta.tgid = 70;
            s.meta.ts_ns = at_s * 1_000_000_000;
        }
        ev
    };
    let opened_upstream = |obs: &[O]| {
        obs.iter()
            .any(|o| matches!(o, O::UpstreamOpened { proxy, .. } if proxy.tgid == 70))
    };
    assert!(
        !opened_upstream(&e.on_event(&connect(0xf1, 10))),
        "no listener yet"
    );
    // It listens (nginx's socket of the fake host's table) from now on.
    opened.borrow_mut().push((70, 21));
    assert!(
        !opened_upstream(&e.on_event(&connect(0xf2, 12))),
        "within the time it is taken for none"
    );
    assert!(
        opened_upstream(&e.on_event(&connect(0xf3, 16))),
        "looked at again"
    );
    assert_eq!(e.watch_set().proxies.into_iter().collect::<Vec<_>>(), [70]);
}

#[test]
fn listener_facts_arrivals_accept_wait_overflows_and_queues() {
    let mut e = enricher();
    e.scan();
    let mut est = state(
        0xa5,
        NS,
        "TCP_SYN_RECV",
        "TCP_ESTABLISHED",
        conn("10.88.0.5:8080", "10.88.0.1:41005"),
        TcpCounters::default(),
    );
    if let Event::StateChange(s) = &mut est {
        s.meta.ts_ns = 1_000_000_000;
    }
    // The listener facts among what an event says.
    let fact = |obs: Vec<O>| {
        obs.into_iter().find_map(|o| match o {
            O::Listener {
                container,
                port,
                fact,
            } => Some((container.name.clone(), port, fact)),
            _ => None,
        })
    };
    assert_eq!(
        fact(e.on_event(&est)),
        Some(("web-2".into(), 8080, Fact::Arrival))
    );
    let accept = |sk| {
        Event::Accepted(crate::capture::event::Accepted {
            meta: Meta {
                ts_ns: 1_250_000_000,
                ..meta(101, NS, 777)
            },
            skaddr: sk,
            conn: conn("10.88.0.5:8080", "10.88.0.1:41005"),
        })
    };
    assert_eq!(
        fact(e.on_event(&accept(0xa5))),
        Some(("web-2".into(), 8080, Fact::AcceptWait(0.25)))
    );
    assert_eq!(fact(e.on_event(&accept(0xa5))), None, "accepted once");
    assert_eq!(
        fact(e.on_event(&accept(0xbad))),
        None,
        "not a container's connection"
    );
    let overflow = Event::ListenOverflow(crate::capture::event::ListenOverflow {
        meta: meta(0, NS, 0),
        listener: Some("0.0.0.0:8080".parse().unwrap()),
        reason: Named {
            value: 40,
            name: Some("TCP_LISTEN_OVERFLOW".into()),
        },
    });
    assert_eq!(
        fact(e.on_event(&overflow)),
        Some(("web-2".into(), 8080, Fact::Overflow))
    );
    // Queue depth and limit of its own listener only (not the sidecar's 9090).
    let (sample, _) = e.sample_listen_path(None);
    let q: Vec<_> = sample
        .queues
        .into_iter()
        .map(|(c, p, d, l)| (c.name, p, d, l))
        .collect();
    // The limit is unknown for a listener opened before the agent started...
    assert_eq!(q, [("web-2".to_string(), 8080, 3, None)]);
    let ns: Vec<_> = sample.netns.into_iter().map(|(c, n)| (c.name, n)).collect();
    assert_eq!(
        ns,
        [(
            "web-2".to_string(),
            ListenCounters {
                overflows: 7,
                drops: 9
            }
        )]
    );
    // ...and known from the kernel for one opened since.
    let mut listen = state(
        5,
        NS,
        "TCP_CLOSE",
        "TCP_LISTEN",
        conn("0.0.0.0:8080", "0.0.0.0:0"),
        TcpCounters::default(),
    );
    if let Event::StateChange(s) = &mut listen {
        s.meta = meta(101, NS, 777);
        s.max_ack_backlog = Some(128);
    }
    e.on_event(&listen);
    // A fast sample of the workload reuses the listener found by the full one.
    let web: HashSet<_> = [(String::new(), "web".to_string())].into_iter().collect();
    let (fast, _) = e.sample_listen_path(Some(&web));
    assert_eq!(fast.queues.len(), 1);
    assert_eq!(fast.queues[0].3, Some(128));
    let other: HashSet<_> = [(String::new(), "api".to_string())].into_iter().collect();
    let (none, _) = e.sample_listen_path(Some(&other));
    assert!(none.queues.is_empty() && none.netns.is_empty());
}

#[test]
fn a_container_restarted_in_place_is_adopted_again_with_its_new_main_process() {
    let mut e = enricher();
    e.scan();
    let exit = Event::Exit(Exit {
        meta: meta(101, NS, 777),
        status: ExitStatus::Killed {
            signal: 15,
            core: false,
        },
    });
    assert_eq!(e.on_event(&exit).len(), 1);
    // The runtime starts it again under the same id: new init and main process.
    e.host_mut().procs.retain(|p| p.pid != 100 && p.pid != 101);
    e.host_mut().procs.push(proc(200, 90, "catatonit", 1, true));
    e.host_mut().procs.push(proc(201, 200, "python3", 2, true));
    let obs = e.scan();
    assert!(
        matches!(obs.as_slice(), [O::Container { .. }]),
        "adopted again: {obs:#?}"
    );
    let exit = Event::Exit(Exit {
        meta: meta(201, NS, 777),
        status: ExitStatus::Exited(0),
    });
    assert!(
        matches!(e.on_event(&exit).as_slice(), [O::Exit { .. }]),
        "the new main process's exit counts"
    );
}

#[test]
fn a_scan_while_the_main_process_exits_is_no_restart() {
    let mut e = enricher();
    e.scan();
    // The server is gone from /proc; its init shim is still there, about to exit.
    e.host_mut().procs.retain(|p| p.pid != 101);
    assert!(e.scan().is_empty(), "the same run: nothing adopted again");
    let exit = Event::Exit(Exit {
        meta: meta(101, NS, 777),
        status: ExitStatus::Exited(1),
    });
    assert!(
        matches!(e.on_event(&exit).as_slice(), [O::Exit { .. }]),
        "the server is still the main process"
    );
}

#[test]
fn a_container_caught_while_runc_creates_it_is_adopted_once_its_pid_1_exists() {
    // What a scan finds during `podman run` (seen on this machine): `runc init`, in the
    // container's cgroup but not yet in its pid namespace, about to exit 0.
    let mut e = Enricher::new(FakeHost {
        procs: vec![proc(90, 80, "runc:[0:PARENT]", 90, true)],
        start_times: Vec::new(),
        ..Default::default()
    });
    assert!(e.scan().is_empty(), "nothing adopted while runc bootstraps");
    let exit = Event::Exit(Exit {
        meta: meta(90, NS, 777),
        status: ExitStatus::Exited(0),
    });
    assert!(
        e.on_event(&exit).is_empty(),
        "runc's exit is not the container's"
    );
    e.host_mut().procs = vec![
        proc(100, 80, "catatonit", 1, true),
        proc(101, 100, "python3", 2, true),
    ];
    let obs = e.scan();
    assert!(
        matches!(obs.as_slice(), [O::Container { .. }]),
        "adopted: {obs:#?}"
    );
    let exit = Event::Exit(Exit {
        meta: meta(101, NS, 777),
        status: ExitStatus::Exited(1),
    });
    assert!(
        matches!(e.on_event(&exit).as_slice(), [O::Exit { .. }]),
        "the server is its main process"
    );
}

#[test]
fn the_watch_set_holds_container_addresses_outside_the_host_namespace() {
    let mut e = enricher().with_host_netns(HOST_NS);
    let before = e.watch_generation();
    e.scan();
    assert_ne!(
        e.watch_generation(),
        before,
        "a new container may change it"
    );
    let set = e.watch_set();
    assert_eq!(
        set.addrs.into_iter().collect::<Vec<_>>(),
        ["10.88.0.5".parse::<IpAddr>().unwrap()]
    );
    assert!(
        set.ports.is_empty(),
        "its listeners are in its own namespace"
    );
    // Without a host namespace to filter there is nothing to say.
    let mut all = enricher();
    all.scan();
    assert_eq!(all.watch_set(), Default::default());
}

#[test]
fn a_host_network_containers_listeners_are_watched_until_it_is_forgotten() {
    let host_proc = |pid, ppid, comm: &str, ns_pid| ProcInfo {
        netns: Some(HOST_NS),
        ..proc(pid, ppid, comm, ns_pid, true)
    };
    let mut e = Enricher::new(FakeHost {
        procs: vec![
            host_proc(100, 90, "catatonit", 1),
            host_proc(101, 100, "python3", 2),
        ],
        start_times: Vec::new(),
        ..Default::default()
    })
    .with_host_netns(HOST_NS);
    e.scan();
    let set = e.watch_set();
    assert!(
        set.addrs.is_empty(),
        "its addresses are the host's: {set:?}"
    );
    assert_eq!(set.ports.into_iter().collect::<Vec<_>>(), [8080]);

    // Closed, it still counts refused connects: still watched.
    let generation = e.watch_generation();
    e.on_event(&state(
        0xf1,
        HOST_NS,
        "TCP_LISTEN",
        "TCP_CLOSE",
        conn("0.0.0.0:8080", "0.0.0.0:0"),
        TcpCounters::default(),
    ));
    assert_ne!(e.watch_generation(), generation);
    assert_eq!(e.watch_set().ports.into_iter().collect::<Vec<_>>(), [8080]);

    let mut rmdir = CgroupRemoved {
        meta: meta(0, HOST_NS, 0),
        id: 777,
        hierarchy: 0,
        level: 2,
        path: path(),
    };
    rmdir.meta.ts_ns = 1_000;
    e.on_event(&Event::CgroupRemoved(rmdir));
    e.expire(1_000 + 300, 300);
    assert_eq!(e.watch_set(), Default::default());
}

#[test]
fn a_shim_adopted_before_its_entrypoint_started_gets_its_main_process_at_the_next_scan() {
    // Seen with `podman run --init`: a scan between podman-init's start and its first fork.
    let mut e = Enricher::new(FakeHost {
        procs: vec![proc(100, 80, "podman-init", 1, true)],
        start_times: Vec::new(),
        ..Default::default()
    });
    assert!(matches!(e.scan().as_slice(), [O::Container { .. }]));
    e.host_mut().procs = vec![
        proc(100, 80, "podman-init", 1, true),
        proc(106, 100, "python3", 6, true),
    ];
    assert!(e.scan().is_empty(), "the same container, not a new run");
    let exit = |pid, code| {
        Event::Exit(Exit {
            meta: meta(pid, NS, 777),
            status: ExitStatus::Exited(code),
        })
    };
    assert!(
        matches!(e.on_event(&exit(106, 143)).as_slice(), [O::Exit { .. }]),
        "the entrypoint is its main process"
    );
}

#[test]
fn an_entrypoint_that_forks_the_server_and_exits_is_not_the_container_exiting() {
    // A wrapper (a pyenv shim, a script) is the shim's first child; the server it started is
    // reparented to the shim and lives on.
    let mut e = Enricher::new(FakeHost {
        procs: vec![
            proc(100, 80, "podman-init", 1, true),
            proc(102, 100, "bash", 2, true),
        ],
        start_times: Vec::new(),
        ..Default::default()
    });
    assert!(matches!(e.scan().as_slice(), [O::Container { .. }]));
    e.host_mut().procs = vec![
        proc(100, 80, "podman-init", 1, true),
        proc(106, 100, "python3", 6, true),
    ];
    let exit = |pid, code| {
        Event::Exit(Exit {
            meta: meta(pid, NS, 777),
            status: ExitStatus::Exited(code),
        })
    };
    assert!(
        e.on_event(&exit(102, 0)).is_empty(),
        "the wrapper's exit is not the container's"
    );
    assert!(
        matches!(e.on_event(&exit(106, 143)).as_slice(), [O::Exit { .. }]),
        "the server is its main process now"
    );
}

#[test]
fn a_proxy_connection_to_a_pods_shared_address_belongs_to_the_container_listening_there() {
    // A network holder (podman's `--network container:`, a pod's pause) holds the same
    // address in the same namespace, but no listener: the backend is the one listening.
    const HOLDER: &str = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";
    let mut e = enricher();
    e.host_mut().procs.push(ProcInfo {
        pid: 200,
        ppid: 90,
        comm: "pause".into(),
        ns_pid: Some(1),
        netns: Some(NS),
        cgroup_path: Some(format!("/libpod_parent/libpod-{HOLDER}")),
    });
    e.scan();
    assert_eq!(e.container_count(), 2);
    let connect = match state(
        0xe1,
        HOST_NS,
        "TCP_CLOSE",
        "TCP_SYN_SENT",
        conn("0.0.0.0:0", "10.88.0.5:8080"),
        TcpCounters::default(),
    ) {
        Event::StateChange(mut s) => {
            s.meta.tgid = 60;
            s.meta.comm = "nginx".into();
            s
        }
        _ => unreachable!(),
    };
    e.on_event(&Event::StateChange(connect));
    let cut = Event::UpstreamIo(UpstreamIo {
        meta: meta(60, 0, 0),
        skaddr: 0xe1,
        step: IoStep::Cut {
            bytes: 120,
            started_at: 1,
            ret: 0,
        },
    });
    let obs = e.on_event(&cut);
    assert!(
        matches!(obs.as_slice(), [O::UpstreamRequest { key, .. }] if key.as_str() == ID),
        "{obs:#?}"
    );
}

#[test]
fn a_restart_in_place_is_found_at_its_first_refusal_and_the_gap_is_split_at_its_pid_1() {
    let mut e = enricher();
    e.scan();
    let closed = state(
        0xf1,
        NS,
        "TCP_LISTEN",
        "TCP_CLOSE",
        conn("0.0.0.0:8080", "0.0.0.0:0"),
        TcpCounters::default(),
    );
    e.on_event(&closed);
    // The run ends: its processes are gone, its main process's exit is the container's.
    e.host_mut().procs.retain(|p| p.pid == 50);
    let exit = Event::Exit(Exit {
        meta: meta(101, NS, 777),
        status: ExitStatus::Exited(0),
    });
    assert!(matches!(e.on_event(&exit).as_slice(), [O::Exit { .. }]));
    let syn = |ts: u64, port: u16| {
        let mut m = meta(0, NS, 0);
        m.ts_ns = ts;
        Event::ResetSent(ResetSent {
            meta: m,
            skaddr: 0,
            conn: conn("10.88.0.5:8080", &format!("10.88.0.1:{port}")),
            state: None,
            reason: named("NO_SOCKET"),
            answers_syn: Some(true),
            answers_data: None,
        })
    };
    // No new run yet: the old run's stop's.
    e.on_event(&syn(1_000, 40_001));
    // The runtime starts the new run's PID 1 at 2 µs, still its own process (no main
    // process to adopt yet).
    e.host_mut()
        .procs
        .push(proc(200, 80, "runc:[1:CHILD]", 1, true));
    e.host_mut().start_times.push((200, 2_000));
    // Within the recheck interval of the last look: taken as the stop's for now, until the
    // next look (the refusal still waits in the enricher) finds the new run.
    e.on_event(&syn(3_000, 40_002));
    let later = 20_000_000;
    let at_later = e.on_event(&syn(later, 40_003));
    assert!(
        matches!(at_later.as_slice(), [O::Reset { .. }]),
        "{at_later:#?}"
    );
    // The entrypoint runs: the next refusal adopts the new run, with its start.
    e.host_mut().procs[1] = proc(200, 80, "catatonit", 1, true);
    e.host_mut().procs.push(proc(201, 200, "python3", 2, true));
    let obs = e.on_event(&syn(2 * later, 40_004));
    assert!(
        matches!(
            obs.as_slice(),
            [
                O::Reset { .. },
                O::Container { .. },
                O::Started {
                    at: 2_000,
                    restart: true,
                    ..
                }
            ]
        ),
        "{obs:#?}"
    );
    // A refusal of before the new run, seen late, is still the old run's.
    e.on_event(&syn(1_500, 40_005));
    let mut flushed = e.flush(u64::MAX / 2);
    flushed.sort_by_key(|o| match o {
        O::Refused { at, .. } | O::RefusedAt { at, .. } => *at,
        _ => 0,
    });
    let kinds: Vec<(u64, &str)> = flushed
        .iter()
        .map(|o| match o {
            O::Refused { at, .. } => (*at, "stop"),
            O::RefusedAt { at, port: 8080, .. } => (*at, "start"),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            (1_000, "stop"),
            (1_500, "stop"),
            (3_000, "start"),
            (later, "start"),
            (2 * later, "start")
        ]
    );
}

#[test]
fn a_proxy_connection_closed_before_the_agent_follows_it_is_not_added_to_the_kernel_map() {
    // An entry added for a socket already freed would outlive it, and the next socket at
    // its address (a client connection the proxy accepted) would be read as its requests.
    let mut e = enricher();
    e.scan();
    let at = |mut s: StateChange| {
        s.meta.tgid = 60;
        s.meta.comm = "nginx".into();
        s.meta.ts_ns = 500;
        Event::StateChange(s)
    };
    let step = |old, new, c| match state(
        0xe1,
        HOST_NS,
        old,
        new,
        conn(c, "10.88.0.5:8080"),
        TcpCounters::default(),
    ) {
        Event::StateChange(s) => at(s),
        _ => unreachable!(),
    };
    e.on_event(&step("TCP_CLOSE", "TCP_SYN_SENT", "0.0.0.0:0"));
    e.on_event(&step("TCP_SYN_SENT", "TCP_ESTABLISHED", "10.88.0.1:50000"));
    e.on_event(&step("TCP_ESTABLISHED", "TCP_CLOSE", "10.88.0.1:50000"));
    assert!(e.take_follow().is_empty());
}

#[test]
fn a_closing_connection_says_how_long_it_was_quiet_once_the_tick_is_learned() {
    use crate::model::activity::Activity;
    let mut e = enricher();
    e.scan();
    let at = |sk, ts_ns, old: &str, new: &str, port, counters| {
        let mut ev = state(
            sk,
            NS,
            old,
            new,
            conn("10.88.0.5:8080", &format!("10.88.0.1:{port}")),
            counters,
        );
        if let Event::StateChange(s) = &mut ev {
            s.meta.ts_ns = ts_ns;
        }
        ev
    };
    // A stream: its request at jiffy 1000, an event per 50 jiffies (HZ=250: 200 ms) up to
    // jiffy 1750, closed at 1775 (100 ms later).
    let stream = TcpCounters {
        bytes_received: 90,
        bytes_sent: 4000,
        last_received: 1000,
        last_sent: 1750,
        now: 1775,
        segs_in: 1,
        segs_out: 16,
        ..TcpCounters::default()
    };
    let close = |e: &mut Enricher<_>, sk, ts| {
        e.on_event(&at(
            sk,
            0,
            "TCP_SYN_RECV",
            "TCP_ESTABLISHED",
            sk as u16,
            TcpCounters::default(),
        ));
        let obs = e.on_event(&at(
            sk,
            ts,
            "TCP_ESTABLISHED",
            "TCP_FIN_WAIT1",
            sk as u16,
            stream,
        ));
        match obs.as_slice() {
            [O::InboundClosed { activity, port, .. }] => {
                assert_eq!(*port, 8080);
                *activity
            }
            other => panic!("{other:?}"),
        }
    };
    // The first close anchors the clock: its rate is unknown yet.
    let first = close(&mut e, 41_001, 10 * 1_000_000_000);
    assert_eq!((first.quiet_for, first.sending_for), (None, None));
    assert!(!first.active());
    // 3 s and 750 jiffies later: HZ=250.
    let later = TcpCounters {
        last_received: 1750,
        last_sent: 2500,
        now: 2525,
        ..stream
    };
    e.on_event(&at(
        41_002,
        0,
        "TCP_SYN_RECV",
        "TCP_ESTABLISHED",
        41_002,
        TcpCounters::default(),
    ));
    let obs = e.on_event(&at(
        41_002,
        13 * 1_000_000_000,
        "TCP_ESTABLISHED",
        "TCP_FIN_WAIT1",
        41_002,
        later,
    ));
    let [O::InboundClosed { activity, .. }] = obs.as_slice() else {
        panic!("{obs:?}")
    };
    assert_eq!(
        *activity,
        Activity {
            quiet_for: Some(100_000_000),
            sending_for: Some(3_000_000_000),
            segs_in: 1,
            segs_out: 16,
            reset: false,
        }
    );
    assert!(activity.active() && activity.streaming());
}

#[test]
fn a_container_whose_processes_vanished_without_a_cgroup_removal_goes_after_30_s() {
    let mut e = enricher();
    e.scan();
    // Time passes by events (a signal between host processes says nothing else).
    let at = |e: &mut Enricher<FakeHost>, secs: u64| {
        let mut m = meta(50, HOST_NS, 0);
        m.ts_ns = secs * 1_000_000_000;
        e.on_event(&Event::Signal(Signal {
            meta: m,
            sig: 0,
            target_pid: 1,
            target_comm: String::new(),
            group: false,
            result: Delivery::Delivered,
        }))
    };
    at(&mut e, 100);
    // Its processes are gone, their exits and the cgroup's removal never reported.
    e.host_mut().procs.retain(|p| p.pid == 50);
    assert!(e.scan().is_empty());
    at(&mut e, 129);
    assert!(e.scan().is_empty(), "29 s: not yet");
    at(&mut e, 130);
    assert_eq!(
        e.scan(),
        [O::Vanished {
            key: std::sync::Arc::new(ID.into())
        }]
    );
    assert!(e.scan().is_empty(), "once");
}

#[test]
fn a_new_process_of_a_known_container_is_mapped_without_walking_proc() {
    let mut e = enricher();
    e.scan();
    let walks = e.host_mut().walks.get();
    // A fork-and-kill loop inside the container: each signal names a new pid of it.
    for pid in 200..210 {
        e.host_mut().procs.push(proc(pid, 101, "sh", pid, true));
        let sig = Event::Signal(Signal {
            meta: meta(50, HOST_NS, 0),
            sig: 15,
            target_pid: pid as i32,
            target_comm: String::new(),
            group: true,
            result: Delivery::Delivered,
        });
        assert!(e.on_event(&sig).is_empty(), "not its main process: no stop");
    }
    assert_eq!(
        e.host_mut().walks.get(),
        walks,
        "no walk of /proc per new pid"
    );
}

/// `--hold`: a connection's arrival may come with its close, after a scan found the connection
/// or after its listener closed.
#[test]
fn a_held_arrival_is_no_second_connection_and_keeps_the_listener_it_arrived_at() {
    let at = |ts, ev: Event| match ev {
        Event::StateChange(mut s) => {
            s.meta.ts_ns = ts;
            Event::StateChange(s)
        }
        other => other,
    };
    let mut e = enricher();
    let obs = e.scan();
    let [O::Container { inbound, .. }] = obs.as_slice() else {
        panic!()
    };
    let seeded = inbound[0];
    let scanned = conn("10.88.0.5:8080", "10.88.0.1:40000");
    let arrival = |sk, c| {
        state(
            sk,
            NS,
            "TCP_SYN_RECV",
            "TCP_ESTABLISHED",
            c,
            Default::default(),
        )
    };
    // The scan's connection, by its handshake: an arrival, by the scan's id (not a second
    // connection), with its peer (a client's return is matched by it).
    let obs = e.on_event(&at(50, arrival(0xbeef, scanned)));
    assert!(
        matches!(
            obs.as_slice(),
            [
                O::InboundEstablished { sock, peer, .. },
                O::Listener {
                    fact: Fact::Arrival,
                    ..
                }
            ] if *sock == seeded && *peer == "10.88.0.1".parse::<std::net::IpAddr>().unwrap()
        ),
        "{obs:#?}"
    );
    // The listener closes at 200 (the exit), then the connections cut there come: one that
    // arrived at 100 is the container's; one at 300 arrived at no listener of it.
    let listener_closed = state(
        0x1,
        NS,
        "TCP_LISTEN",
        "TCP_CLOSE",
        conn("10.88.0.5:8080", "0.0.0.0:0"),
        Default::default(),
    );
    let obs = e.on_event(&at(200, listener_closed));
    assert!(
        matches!(obs.as_slice(), [O::ListenerClosed { .. }]),
        "{obs:#?}"
    );
    let early = conn("10.88.0.5:8080", "10.88.0.1:40001");
    let obs = e.on_event(&at(100, arrival(0xa1, early)));
    assert!(
        matches!(
            obs.as_slice(),
            [O::InboundEstablished { sock: 0xa1, .. }, O::Listener { .. }]
        ),
        "{obs:#?}"
    );
    let late = conn("10.88.0.5:8080", "10.88.0.1:40002");
    assert!(e.on_event(&at(300, arrival(0xa2, late))).is_empty());
    // The closes: the scan's by its id, the early one by its address.
    let close = |sk, c| state(sk, NS, "TCP_ESTABLISHED", "TCP_CLOSE", c, pending());
    let obs = e.on_event(&at(201, close(0xbeef, scanned)));
    assert!(
        matches!(obs.as_slice(), [O::InboundClosed { sock, pending: true, .. }] if *sock == seeded),
        "{obs:#?}"
    );
    let obs = e.on_event(&at(201, close(0xa1, early)));
    assert!(
        matches!(obs.as_slice(), [O::InboundClosed { sock: 0xa1, .. }]),
        "{obs:#?}"
    );
}

#[test]
fn a_pods_address_and_namespace_are_its_apps_never_its_sandboxs() {
    let attempt = |port: u16| {
        state(
            0xc1,
            HOST_NS,
            "TCP_SYN_SENT",
            "TCP_CLOSE",
            conn("10.88.0.1:0", &format!("10.88.0.5:{port}")),
            TcpCounters::default(),
        )
    };
    let unreachable_on = |obs: Vec<O>| match obs.as_slice() {
        [O::Unreachable { key, .. }] => key.to_string(),
        other => panic!("{other:#?}"),
    };
    let ip: IpAddr = "10.88.0.5".parse().unwrap();
    // The sandbox adopted first (as the kubelet starts it), then the app; and the other way.
    for sandbox_first in [true, false] {
        let mut e = enricher();
        if sandbox_first {
            e.add_test_sandbox("pause", NS, ip);
            e.scan();
        } else {
            e.scan();
            e.add_test_sandbox("pause", NS, ip);
        }
        // To the port the app listened on, and to one nobody did: the app's.
        assert_eq!(unreachable_on(e.on_event(&attempt(8080))), ID);
        assert_eq!(unreachable_on(e.on_event(&attempt(7070))), ID);
        // The pod's own RST at a port no listener claims: the app's, not the pod's whole.
        let rst = Event::ResetSent(ResetSent {
            meta: meta(0, NS, 0),
            skaddr: 0,
            conn: conn("10.88.0.5:5555", "10.88.0.1:50000"),
            state: None,
            reason: named("NO_SOCKET"),
            answers_syn: Some(false),
            answers_data: None,
        });
        assert!(
            matches!(e.on_event(&rst).as_slice(), [O::Reset { container, .. }] if container.id == ID),
            "sandbox first: {sandbox_first}"
        );
    }
}

/// A replacement at the same address whose namespace reused the stopped container's inode
/// (podman: the old container stopped, the new one started): its RSTs are its own, told apart
/// by the namespace cookie. Without cookies (a kernel that has none) only the inode tells,
/// and they are the old container's.
#[test]
fn a_replacements_refusals_and_resets_are_its_own_though_its_namespace_reused_the_inode() {
    const NEW_ID: &str = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";
    let (old_cookie, new_cookie) = (41, 57);
    let run = |cookies: bool| {
        let cookie = |c: u64| if cookies { c } else { 0 };
        let mut e = enricher();
        e.scan();
        // The old server closes its listener (the close's record carries its namespace's
        // cookie), exits, and its cgroup goes.
        let mut closed = state(
            0xf1,
            NS,
            "TCP_LISTEN",
            "TCP_CLOSE",
            conn("0.0.0.0:8080", "0.0.0.0:0"),
            TcpCounters::default(),
        );
        if let Event::StateChange(s) = &mut closed {
            s.meta.netns_cookie = cookie(old_cookie);
        }
        e.on_event(&closed);
        e.host_mut().procs.retain(|p| p.pid == 50);
        let exit = Event::Exit(Exit {
            meta: meta(101, NS, 777),
            status: ExitStatus::Exited(0),
        });
        e.on_event(&exit);
        let rmdir = Event::CgroupRemoved(CgroupRemoved {
            meta: meta(0, HOST_NS, 0),
            id: 777,
            hierarchy: 0,
            level: 2,
            path: path(),
        });
        e.on_event(&rmdir);
        // The replacement's namespace, at the same inode, answers a SYN and a late FIN of an
        // old connection before its server listens, and before a scan knows it.
        let rst = |ts: u64, ns_cookie: u64, port: u16, answers_syn: bool| {
            let mut m = meta(0, NS, 0);
            m.ts_ns = ts;
            m.netns_cookie = cookie(ns_cookie);
            Event::ResetSent(ResetSent {
                meta: m,
                skaddr: 0,
                conn: conn("10.88.0.5:8080", &format!("10.88.0.1:{port}")),
                state: None,
                reason: named("NO_SOCKET"),
                answers_syn: Some(answers_syn),
                answers_data: None,
            })
        };
        let mut obs = e.on_event(&rst(1_000, new_cookie, 40_001, true));
        obs.extend(e.on_event(&rst(2_000, new_cookie, 40_002, false)));
        let new_path = format!("/libpod_parent/libpod-{NEW_ID}");
        let new_proc = |pid, ppid, comm: &str, ns_pid| ProcInfo {
            cgroup_path: Some(new_path.clone()),
            ..proc(pid, ppid, comm, ns_pid, true)
        };
        e.host_mut().procs.push(new_proc(200, 80, "catatonit", 1));
        e.host_mut().procs.push(new_proc(201, 200, "node", 2));
        e.host_mut().start_times.push((200, 500));
        obs.extend(e.scan());
        obs.extend(e.on_event(&rst(3_000, new_cookie, 40_003, true)));
        obs.extend(e.flush(u64::MAX / 2));
        (obs, e.resets_by_inode())
    };
    let whose = |obs: &[O]| -> Vec<(&'static str, String)> {
        obs.iter()
            .filter_map(|o| match o {
                O::Reset { container, .. } => Some(("reset", container.id.clone())),
                O::Refused { key, .. } => Some(("refused", key.to_string())),
                O::RefusedAt {
                    container, netns, ..
                } => {
                    assert_eq!(netns.inum, NS);
                    Some(("refused_at", container.id.clone()))
                }
                _ => None,
            })
            .collect()
    };
    let new = |k: &'static str| (k, NEW_ID.to_string());
    let old = |k: &'static str| (k, ID.to_string());
    let (obs, by_inode) = run(true);
    assert_eq!(by_inode, 0);
    assert!(
        obs.iter().any(
            |o| matches!(o, O::Started { identity, fresh_netns: true, .. } if identity.id == NEW_ID)
        ),
        "{obs:#?}"
    );
    // Each RST the replacement's, the refusals its start's (`RefusedAt`), none the old stop's.
    assert_eq!(
        whose(&obs),
        [
            new("reset"),
            new("reset"),
            new("reset"),
            new("refused_at"),
            new("refused_at")
        ],
        "{obs:#?}"
    );
    // By inode alone they are the old container's: its stop's refusals, its resets, counted.
    let (obs, by_inode) = run(false);
    assert_eq!(by_inode, 3);
    assert_eq!(
        whose(&obs),
        [
            old("reset"),
            old("reset"),
            old("reset"),
            old("refused"),
            old("refused")
        ]
    );
}

/// A Service's DNAT, as the kernel's connection tracking would answer for one client.
struct Dnat {
    vip: std::net::SocketAddr,
    /// A Service whose endpoints are all gone.
    empty: std::net::SocketAddr,
    pod: std::net::SocketAddr,
}

impl crate::enrich::nat::Resolve for Dnat {
    fn resolve(
        &mut self,
        _from: std::net::SocketAddr,
        to: std::net::SocketAddr,
    ) -> Result<Option<std::net::SocketAddr>, crate::enrich::nat::NatError> {
        Ok(match to {
            t if t == self.vip => Some(self.pod),
            // A Service with no endpoints: rejected before it was tracked.
            t if t == self.empty => None,
            t => Some(t),
        })
    }

    fn served_by(
        &mut self,
        to: std::net::SocketAddr,
    ) -> Result<Vec<std::net::SocketAddr>, crate::enrich::nat::NatError> {
        // The empty Service's tracked connections, made while it had its pod.
        Ok(if to == self.empty {
            vec![self.pod]
        } else {
            Vec::new()
        })
    }
}

/// An enricher (scanned) on a node whose connection tracking has `Dnat`'s Service and an empty one.
fn behind_a_service() -> crate::enrich::Enricher<FakeHost> {
    let dnat = Dnat {
        vip: "10.96.0.10:80".parse().unwrap(),
        empty: "10.96.0.11:80".parse().unwrap(),
        pod: "10.88.0.5:8080".parse().unwrap(),
    };
    let mut e = enricher().with_nat(crate::enrich::nat::Nat::new(Box::new(dnat)));
    e.scan();
    e
}

/// A host socket's connect from `local` to `remote` failing, as the tp_btf program reads it.
fn failed_connect(sk: u64, local: &str, remote: &str, syn_at: Option<u64>, errno: i32) -> Event {
    let mut ev = state(
        sk,
        HOST_NS,
        "TCP_SYN_SENT",
        "TCP_CLOSE",
        conn(local, remote),
        TcpCounters::default(),
    );
    if let Event::StateChange(c) = &mut ev {
        c.failure =
            Some(crate::capture::hooks::inet_sock_set_state::ConnectFailure { syn_at, errno });
    }
    ev
}

#[test]
fn a_failed_connect_through_a_services_virtual_ip_counts_on_the_pod_it_was_sent_to() {
    use crate::model::nat::NatOutcome;
    const S: u64 = 1_000_000_000;
    let mut e = behind_a_service();
    let failed = |sk, remote: &str, syn_at, errno| {
        stamped(
            failed_connect(sk, "10.0.2.15:40001", remote, syn_at, errno),
            12 * S,
        )
    };
    // Its SYN from its socket (10 s), the client gave up at 12 s: on the pod DNAT chose.
    let obs = e.on_event(&failed(0xd1, "10.96.0.10:80", Some(10 * S), 0));
    assert!(
        matches!(obs.as_slice(), [O::Unreachable { key, at, .. }] if key.as_str() == ID && *at == 10 * S),
        "{obs:#?}"
    );
    // An address nobody translated and no container has: nothing, counted.
    assert!(
        e.on_event(&failed(0xd2, "192.0.2.9:443", None, libc::ETIMEDOUT))
            .is_empty()
    );
    let lookups = e.nat_lookups();
    let count = |o| lookups.iter().find(|(k, _)| *k == o).map(|(_, c)| *c);
    assert_eq!(count(NatOutcome::Translated), Some(1));
    assert_eq!(count(NatOutcome::Untranslated), Some(1));
    // A container's own address is never looked up.
    e.on_event(&failed(0xd3, "10.88.0.5:8080", None, 0));
    assert_eq!(e.nat_lookups().iter().map(|(_, c)| c).sum::<u64>(), 2);
    // kube-proxy's reject of a Service with no endpoints (an ICMP port unreachable: no RST,
    // no entry): on the pod that had served it, apart from refusals.
    let obs = e.on_event(&failed(
        0xd4,
        "10.96.0.11:80",
        Some(11 * S),
        libc::ECONNREFUSED,
    ));
    assert!(
        matches!(obs.as_slice(), [O::ServiceRejected { key, at }] if key.as_str() == ID && *at == 11 * S),
        "{obs:#?}"
    );
    // Unanswered while that address is being rejected: the node rate-limited its ICMP
    // answer (a pod's or a remote client's connect), the same reject.
    let obs = e.on_event(&failed(0xd5, "10.96.0.11:80", Some(10 * S), 0));
    assert!(
        matches!(obs.as_slice(), [O::ServiceRejected { at, .. }] if *at == 10 * S),
        "{obs:#?}"
    );
    // Unanswered elsewhere (the client gave up): not a rejection.
    assert!(
        e.on_event(&failed(0xd6, "10.96.0.12:80", None, 0))
            .is_empty()
    );
    let lookups = e.nat_lookups();
    let count = |o| lookups.iter().find(|(k, _)| *k == o).map(|(_, c)| *c);
    assert_eq!(
        (count(NatOutcome::Rejected), count(NatOutcome::Untranslated)),
        (Some(2), Some(2))
    );
}

#[test]
fn a_pods_refusal_through_a_virtual_ip_is_its_refusal_never_a_services_reject() {
    let mut e = behind_a_service();
    // Its listener closed; a SYN through the virtual IP reaches it (DNAT) and is refused.
    e.on_event(&state(
        0xf1,
        NS,
        "TCP_LISTEN",
        "TCP_CLOSE",
        conn("0.0.0.0:8080", "0.0.0.0:0"),
        TcpCounters::default(),
    ));
    let client = "10.88.0.1:41000";
    e.on_event(&Event::ResetSent(ResetSent {
        meta: meta(0, NS, 0),
        skaddr: 0,
        conn: conn("10.88.0.5:8080", client),
        state: None,
        reason: named("NO_SOCKET"),
        answers_syn: Some(true),
        answers_data: None,
    }));
    // The client's socket names the virtual IP, its RST filtered in the kernel; conntrack
    // forgot the entry (its only answer was a RST), as it never had a rejected one's.
    let failed = failed_connect(0xd9, client, "10.96.0.11:80", Some(0), libc::ECONNREFUSED);
    let obs = e.on_event(&failed);
    assert!(
        matches!(obs.as_slice(), [O::Refused { key, .. }] if key.as_str() == ID),
        "{obs:#?}"
    );
    let lookups = e.nat_lookups();
    assert!(
        lookups.iter().all(|(_, n)| *n == 0),
        "never looked up: {lookups:?}"
    );
}

/// A sidecar proxying to its app over loopback (issue 43 item 4): a process in the app's
/// namespace that listens and connects to 127.0.0.1 at the app's port is a proxy to the app;
/// the app's own loopback connect to itself is none, nor is one in another namespace.
#[test]
fn a_sidecar_connecting_over_loopback_to_its_pods_app_is_a_proxy_to_the_app() {
    let mut e = enricher();
    e.scan();
    assert!(
        e.watch_set().pod_listeners.is_empty(),
        "a namespace of one container: its loopback connects stay dropped in the kernel"
    );
    e.add_test_container("sidecar", NS);
    assert_eq!(
        e.watch_set().pod_listeners.into_iter().collect::<Vec<_>>(),
        [(NS, 8080)],
        "the kernel keeps loopback connects to the shared namespace's listeners"
    );
    let connect = |sock: u64, tgid: u32, ns: u32| {
        let mut ev = state(
            sock,
            ns,
            "TCP_CLOSE",
            "TCP_SYN_SENT",
            conn("127.0.0.1:0", "127.0.0.1:8080"),
            TcpCounters::default(),
        );
        if let Event::StateChange(s) = &mut ev {
            s.meta.tgid = tgid;
            s.meta.comm = "nginx".into();
        }
        ev
    };
    let opened = |obs: &[O]| {
        obs.iter().find_map(|o| match o {
            O::UpstreamOpened { key, proxy, .. } => Some((key.to_string(), proxy.tgid)),
            _ => None,
        })
    };
    // The app itself (pid 101) checking its own port: no proxy.
    assert_eq!(opened(&e.on_event(&connect(0xe0, 101, NS))), None);
    // Another namespace's loopback: nothing listens there.
    assert_eq!(opened(&e.on_event(&connect(0xe2, 60, NS + 1))), None);
    // The sidecar's worker (tgid 60 holds a listener): a proxy to the app.
    assert_eq!(
        opened(&e.on_event(&connect(0xe1, 60, NS))),
        Some((ID.to_string(), 60))
    );
    assert_eq!(e.watch_set().proxies.into_iter().collect::<Vec<_>>(), [60]);
    let mut est = connect(0xe1, 60, NS);
    if let Event::StateChange(s) = &mut est {
        s.old = tcp("TCP_SYN_SENT");
        s.new = tcp("TCP_ESTABLISHED");
        s.conn = conn("127.0.0.1:50000", "127.0.0.1:8080");
    }
    e.on_event(&est);
    // The app's side of the same connection names the sidecar's socket; the same loopback
    // tuple in another pod would not (every pod has 127.0.0.1).
    let inbound = |ns: u32| {
        state(
            0xa9,
            ns,
            "TCP_SYN_RECV",
            "TCP_ESTABLISHED",
            conn("127.0.0.1:8080", "127.0.0.1:50000"),
            TcpCounters::default(),
        )
    };
    let upstream = |obs: &[O]| {
        obs.iter().find_map(|o| match o {
            O::InboundEstablished { upstream, .. } => Some(*upstream),
            _ => None,
        })
    };
    assert_eq!(upstream(&e.on_event(&inbound(NS))), Some(Some(0xe1)));
    // Cut by the app with 7 bytes unread: the sidecar's socket is told.
    let mut counters = pending();
    counters.unread = 7;
    let obs = e.on_event(&state(
        0xa9,
        NS,
        "TCP_ESTABLISHED",
        "TCP_CLOSE",
        conn("127.0.0.1:8080", "127.0.0.1:50000"),
        counters,
    ));
    assert!(
        matches!(
            obs.as_slice(),
            [
                O::UpstreamPeerClosed {
                    sock: 0xe1,
                    unread: 7,
                    ..
                },
                O::InboundClosed {
                    upstream: Some(0xe1),
                    ..
                }
            ]
        ),
        "{obs:#?}"
    );
}

/// The host_network flake: a short connection's records came after the arrival of the next
/// connection at the same (reused) kernel address. Its close must not end that one.
#[test]
fn an_earlier_connections_records_that_come_late_leave_the_one_now_at_its_address() {
    const MS: u64 = 1_000_000;
    let mut e = enricher();
    e.scan();
    let c1 = conn("10.88.0.5:8080", "10.88.0.1:41000");
    let c2 = conn("10.88.0.5:8080", "10.88.0.1:41001");
    let at = |ev, ms| stamped(ev, 1_000 * MS + ms * MS);
    let est2 = at(
        state(
            0xa1,
            NS,
            "TCP_SYN_RECV",
            "TCP_ESTABLISHED",
            c2,
            TcpCounters::default(),
        ),
        11,
    );
    assert!(matches!(
        e.on_event(&est2).as_slice(),
        [O::InboundEstablished { sock: 0xa1, .. }, ..]
    ));
    // The earlier connection's arrival and close, stamped before it, come now: ignored.
    let est1 = at(
        state(
            0xa1,
            NS,
            "TCP_SYN_RECV",
            "TCP_ESTABLISHED",
            c1,
            TcpCounters::default(),
        ),
        0,
    );
    assert!(e.on_event(&est1).is_empty());
    let close1 = at(
        state(
            0xa1,
            NS,
            "TCP_ESTABLISHED",
            "TCP_FIN_WAIT1",
            c1,
            TcpCounters::default(),
        ),
        1,
    );
    assert!(e.on_event(&close1).is_empty());
    // The current connection's own close is still seen, and cut.
    let cut = at(
        state(0xa1, NS, "TCP_ESTABLISHED", "TCP_FIN_WAIT1", c2, pending()),
        100,
    );
    assert!(matches!(
        e.on_event(&cut).as_slice(),
        [O::InboundClosed {
            sock: 0xa1,
            by_container: true,
            pending: true,
            ..
        }]
    ));
}
