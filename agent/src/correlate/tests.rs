//! The stop state machine driven by synthetic observation sequences.

use std::net::SocketAddr;

use super::{
    deploys,
    stops::{Config, Tracker},
};
use crate::model::{
    ContainerIdentity, Emitted, ExitInfo, LossKind, Mono, Observation as O, ResetDirection,
    RetryOutcome, SECOND, Sender, UpstreamStep,
    stop::{self as stops, Lost, Outcome, SIGKILL, SIGTERM, Stop},
};

const T0: Mono = 1_000 * SECOND;
/// A refused attempt's source: no client of the tests' connections (10.88.0.1).
const PEER: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 88, 0, 200));

fn ms(n: u64) -> Mono {
    T0 + n * 1_000_000
}

fn identity(id: &str, workload: &str) -> ContainerIdentity {
    ContainerIdentity {
        id: id.into(),
        runtime: "podman".into(),
        name: format!("{workload}-1"),
        namespace: String::new(),
        pod: String::new(),
        workload: workload.into(),
        ..Default::default()
    }
}

fn addr() -> SocketAddr {
    "10.88.0.5:8080".parse().unwrap()
}

fn runc() -> Sender {
    Sender {
        pid: 4242,
        comm: "runc".into(),
    }
}

fn key() -> crate::model::observation::ContainerKey {
    crate::model::observation::ContainerKey::new("c1".into())
}

/// A running container with a listener and `conns` open inbound connections.
fn running(conns: u64) -> Tracker {
    let mut t = Tracker::new(Config::default());
    t.observe(
        ms(0),
        O::Container {
            identity: Box::new(identity("c1", "web")),
            listeners: vec![addr()],
            inbound: (1..=conns).collect(),
        },
    );
    t
}

fn only_stop(t: &Tracker) -> &Stop {
    assert_eq!(t.stops().len(), 1, "{:#?}", t.stops());
    &t.stops()[0]
}

fn killed_by(sig: i32) -> ExitInfo {
    ExitInfo {
        code: Some(128 + sig),
        signal: Some(sig),
    }
}

#[test]
fn no_handler_sigterm_cuts_inflight_and_exits_at_once() {
    let mut t = running(3);
    t.observe(
        ms(100),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    t.observe(
        ms(102),
        O::Exit {
            key: key(),
            exit: killed_by(SIGTERM),
        },
    );
    // Exit closes the sockets: two had requests pending, one was idle keep-alive.
    for (sock, pending) in [(1, true), (2, true), (3, false)] {
        t.observe(
            ms(103),
            O::InboundClosed {
                peer: [10, 88, 0, 1].into(),
                key: key(),
                sock,
                by_container: true,
                pending,
                upstream: None,
                request_bytes: 0,
                port: 8080,
                activity: Default::default(),
            },
        );
    }
    t.observe(
        ms(101),
        O::ListenerOpened {
            key: key(),
            addr: addr(),
            netns: Default::default(),
        },
    ); // already known: no duplicate
    t.observe(
        ms(103),
        O::ListenerClosed {
            key: key(),
            addr: addr(),
        },
    );
    t.observe(
        ms(300),
        O::Refused {
            key: key(),
            at: ms(300),
            upstream: None,
            peer: PEER,
        },
    );
    t.observe(ms(600), O::CgroupRemoved { key: key() });
    // Closes at exit wait for their client's return (sessions) until the settle window passes.
    t.tick(ms(600) + 10 * SECOND);
    let s = only_stop(&t);
    assert_eq!(s.sigterm_at, Some(ms(100)));
    assert_eq!(s.sigterm_sender, Some(runc()));
    assert_eq!(s.exit, Some(killed_by(SIGTERM)));
    assert_eq!(
        (s.loss.inflight_cut, s.loss.idle_closed, s.loss.refused),
        (2, 1, 1)
    );
    assert_eq!(
        (s.connections_at_sigterm, s.connections_at_exit),
        (Some(3), Some(3))
    );
    assert_eq!(s.drain_seconds(), Some(0.002));
    assert_eq!(s.grace_seconds(), None);
    assert_eq!(s.listeners.len(), 1);
    assert_eq!(s.listeners[0].closed_at, Some(ms(103)));
    assert_eq!(s.cgroup_removed_at, Some(ms(600)));
    assert_eq!(s.outcome(), Some(Outcome::ExitAtOnce));
}

#[test]
fn closing_the_listener_first_refuses_what_routing_still_sends() {
    let mut t = running(1);
    t.observe(
        ms(0),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    t.observe(
        ms(1),
        O::ListenerClosed {
            key: key(),
            addr: addr(),
        },
    );
    for i in 0..4 {
        t.observe(
            ms(500 + i * 500),
            O::Refused {
                key: key(),
                at: ms(500 + i * 500),
                upstream: None,
                peer: PEER,
            },
        );
    }
    t.observe(
        ms(800),
        O::InboundClosed {
            peer: [10, 88, 0, 1].into(),
            key: key(),
            sock: 1,
            by_container: true,
            pending: false,
            upstream: None,
            request_bytes: 0,
            port: 8080,
            activity: Default::default(),
        },
    );
    t.observe(
        ms(3000),
        O::Exit {
            key: key(),
            exit: ExitInfo {
                code: Some(0),
                signal: None,
            },
        },
    );
    let s = only_stop(&t);
    assert_eq!(
        (s.loss.refused, s.loss.inflight_cut, s.loss.idle_closed),
        (4, 0, 1)
    );
    assert_eq!(s.connections_at_exit, Some(0));
    assert_eq!(s.outcome(), Some(Outcome::ListenerClosedEarly));
}

#[test]
fn readiness_flip_and_drain_is_drained_and_counts_late_accepts() {
    let mut t = running(0);
    t.observe(
        ms(0),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    // Routing keeps sending for a while: accepted after SIGTERM, answered, closed by the server.
    for sock in 10..13 {
        t.observe(
            ms(sock * 100),
            O::InboundEstablished {
                peer: [10, 88, 0, 1].into(),
                key: key(),
                sock,
                upstream: None,
            },
        );
        t.observe(
            ms(sock * 100 + 50),
            O::InboundClosed {
                peer: [10, 88, 0, 1].into(),
                key: key(),
                sock,
                by_container: true,
                pending: false,
                upstream: None,
                request_bytes: 0,
                port: 8080,
                activity: Default::default(),
            },
        );
    }
    t.observe(
        ms(5000),
        O::ListenerClosed {
            key: key(),
            addr: addr(),
        },
    );
    t.observe(
        ms(5100),
        O::Exit {
            key: key(),
            exit: ExitInfo {
                code: Some(0),
                signal: None,
            },
        },
    );
    let s = only_stop(&t);
    assert_eq!(s.loss.accepted_after_sigterm, 3);
    assert_eq!(s.last_accept_at, Some(ms(1200)));
    assert_eq!(s.routing_lag_seconds(), Some(1.2));
    assert_eq!((s.loss.inflight_cut, s.loss.refused), (0, 0));
    assert_eq!(s.outcome(), Some(Outcome::Drained));
}

#[test]
fn sigkill_after_the_grace_period_is_killed_at_deadline() {
    let mut t = running(1);
    t.observe(
        ms(0),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    t.observe(
        ms(10_000),
        O::Signal {
            key: key(),
            sig: SIGKILL,
            sender: runc(),
            ignored: None,
        },
    );
    t.observe(
        ms(10_001),
        O::Exit {
            key: key(),
            exit: killed_by(SIGKILL),
        },
    );
    t.observe(
        ms(10_002),
        O::InboundClosed {
            peer: [10, 88, 0, 1].into(),
            key: key(),
            sock: 1,
            by_container: true,
            pending: true,
            upstream: None,
            request_bytes: 0,
            port: 8080,
            activity: Default::default(),
        },
    );
    let s = only_stop(&t);
    assert_eq!(s.grace_seconds(), Some(10.0));
    assert_eq!(s.loss.inflight_cut, 1);
    assert_eq!(s.outcome(), Some(Outcome::KilledAtDeadline));
}

#[test]
fn an_exit_without_a_stop_signal_is_a_crash() {
    let mut t = running(1);
    t.observe(
        ms(50),
        O::Exit {
            key: key(),
            exit: ExitInfo {
                code: Some(1),
                signal: None,
            },
        },
    );
    t.observe(
        ms(51),
        O::InboundClosed {
            peer: [10, 88, 0, 1].into(),
            key: key(),
            sock: 1,
            by_container: true,
            pending: true,
            upstream: None,
            request_bytes: 0,
            port: 8080,
            activity: Default::default(),
        },
    );
    let s = only_stop(&t);
    assert_eq!(s.sigterm_at, None);
    assert_eq!(s.loss.inflight_cut, 1);
    assert_eq!(s.outcome(), Some(Outcome::Crashed));
}

#[test]
fn a_handshake_seen_after_the_scan_found_its_connection_is_an_accept() {
    let mut t = running(1);
    t.observe(
        ms(0),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    // The scan found socket 1 before its handshake's event came (an agent starting up).
    for _ in 0..2 {
        t.observe(
            ms(10),
            O::InboundEstablished {
                peer: [10, 88, 0, 1].into(),
                key: key(),
                sock: 1,
                upstream: None,
            },
        );
    }
    assert_eq!(only_stop(&t).loss.accepted_after_sigterm, 1, "once");
}

#[test]
fn duplicates_and_out_of_order_events_do_not_double_count() {
    let mut t = running(2);
    // A duplicate close of the same socket, and a close seen before the signal is processed.
    t.observe(
        ms(0),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    t.observe(
        ms(0),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: Sender {
                pid: 1,
                comm: "catatonit".into(),
            },
            ignored: None,
        },
    );
    t.observe(
        ms(5),
        O::InboundClosed {
            peer: [10, 88, 0, 1].into(),
            key: key(),
            sock: 1,
            by_container: true,
            pending: true,
            upstream: None,
            request_bytes: 0,
            port: 8080,
            activity: Default::default(),
        },
    );
    t.observe(
        ms(5),
        O::InboundClosed {
            peer: [10, 88, 0, 1].into(),
            key: key(),
            sock: 1,
            by_container: true,
            pending: true,
            upstream: None,
            request_bytes: 0,
            port: 8080,
            activity: Default::default(),
        },
    );
    t.observe(
        ms(6),
        O::Exit {
            key: key(),
            exit: killed_by(SIGTERM),
        },
    );
    t.observe(
        ms(6),
        O::Exit {
            key: key(),
            exit: killed_by(SIGTERM),
        },
    );
    t.observe(
        ms(7),
        O::InboundEstablished {
            peer: [10, 88, 0, 1].into(),
            key: key(),
            sock: 2,
            upstream: None,
        },
    ); // found by the scan, its handshake seen after the exit: no accept after SIGTERM
    // A peer closing its side is not the container's doing.
    t.observe(
        ms(8),
        O::InboundClosed {
            peer: [10, 88, 0, 1].into(),
            key: key(),
            sock: 2,
            by_container: false,
            pending: true,
            upstream: None,
            request_bytes: 0,
            port: 8080,
            activity: Default::default(),
        },
    );
    // Observations about containers never announced are ignored.
    t.observe(
        ms(9),
        O::Refused {
            key: std::sync::Arc::new("unknown".into()),
            at: ms(9),
            upstream: None,
            peer: PEER,
        },
    );
    let s = only_stop(&t);
    assert_eq!(
        s.sigterm_sender.as_ref().map(|x| x.comm.as_str()),
        Some("runc"),
        "first signal wins"
    );
    assert_eq!((s.loss.inflight_cut, s.loss.accepted_after_sigterm), (1, 0));
    assert_eq!(s.exit_at, Some(ms(6)));
    assert_eq!(t.stops().len(), 1);
}

#[test]
fn unreachable_counts_only_after_the_container_is_gone_and_stops_settle() {
    let mut t = running(0);
    t.observe(
        ms(0),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    t.observe(
        ms(10),
        O::Unreachable {
            key: key(),
            at: ms(10),
            upstream: None,
        },
    ); // still there: not unreachable
    t.observe(
        ms(20),
        O::Exit {
            key: key(),
            exit: killed_by(SIGTERM),
        },
    );
    t.observe(ms(30), O::CgroupRemoved { key: key() });
    t.observe(
        ms(2000),
        O::Unreachable {
            key: key(),
            at: ms(2000),
            upstream: None,
        },
    );
    t.observe(
        ms(4000),
        O::Unreachable {
            key: key(),
            at: ms(4000),
            upstream: None,
        },
    );
    t.tick(ms(5000));
    assert!(!only_stop(&t).settled);
    t.tick(ms(30 + 10_000));
    let s = only_stop(&t);
    assert!(s.settled);
    assert_eq!(s.loss.unreachable, 2);
    // After settling, late attempts are no longer this stop's.
    t.observe(
        ms(20_000),
        O::Unreachable {
            key: key(),
            at: ms(20_000),
            upstream: None,
        },
    );
    assert_eq!(only_stop(&t).loss.unreachable, 2);
    let emitted = t.take_emitted();
    assert!(
        matches!(emitted.first(), Some(Emitted::StopBegan { stop_id, at, .. }) if stop_id == "c1-1" && *at == ms(0)),
        "the stop's beginning is reported first: {emitted:?}"
    );
    let losses = emitted
        .iter()
        .filter(|e| {
            matches!(
                e,
                Emitted::Loss {
                    kind: LossKind::Unreachable,
                    ..
                }
            )
        })
        .count();
    assert_eq!(losses, 2);
    assert!(emitted.iter().any(
        |e| matches!(e, Emitted::Settled { stop } if stop.outcome() == Some(Outcome::ExitAtOnce))
    ));
    // And the container is forgotten after the retention window.
    t.tick(ms(30) + 300 * SECOND);
    assert!(!t.knows("c1"));
}

#[test]
fn a_container_restarted_in_place_gets_a_new_record_for_its_next_stop() {
    let mut t = running(0);
    t.observe(
        ms(0),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    t.observe(
        ms(10),
        O::Exit {
            key: key(),
            exit: killed_by(SIGTERM),
        },
    );
    // The runtime starts it again under the same id: the first stop is over.
    t.observe(
        ms(2000),
        O::Container {
            identity: Box::new(identity("c1", "web")),
            listeners: vec![addr()],
            inbound: vec![],
        },
    );
    assert!(t.stops()[0].settled);
    assert!(
        t.take_emitted()
            .iter()
            .any(|e| matches!(e, Emitted::Settled { .. }))
    );
    // A refusal of the gap before the new run started, which the enricher reported late:
    // still the first stop's, once.
    t.observe(
        ms(2010),
        O::Refused {
            key: key(),
            at: ms(1500),
            upstream: None,
            peer: PEER,
        },
    );
    assert_eq!(t.stops()[0].loss.refused, 1);
    t.observe(
        ms(9000),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    // It serves on for 1.5 s after the signal, then exits 0: it drained.
    t.observe(
        ms(10_500),
        O::Exit {
            key: key(),
            exit: ExitInfo {
                code: Some(0),
                signal: None,
            },
        },
    );
    assert_eq!(t.stops().len(), 2);
    let second = &t.stops()[1];
    assert_eq!(
        (second.id.as_str(), second.sigterm_at, second.outcome()),
        ("c1-2", Some(ms(9000)), Some(Outcome::Drained))
    );
    assert_eq!(
        (t.stops()[0].loss.refused, second.loss.refused),
        (1, 0),
        "the second stop takes none of the first run's refusals"
    );
}

#[test]
fn an_agent_restarted_mid_stop_keeps_the_connections_it_found() {
    // The agent starts while the container drains: the scan seeds 2 open connections, then
    // the exit cuts them; nothing from before the restart is counted twice.
    let mut t = running(2);
    t.observe(
        ms(10),
        O::Exit {
            key: key(),
            exit: ExitInfo {
                code: Some(0),
                signal: None,
            },
        },
    );
    t.observe(
        ms(11),
        O::InboundClosed {
            peer: [10, 88, 0, 1].into(),
            key: key(),
            sock: 1,
            by_container: true,
            pending: true,
            upstream: None,
            request_bytes: 0,
            port: 8080,
            activity: Default::default(),
        },
    );
    t.observe(
        ms(11),
        O::InboundClosed {
            peer: [10, 88, 0, 1].into(),
            key: key(),
            sock: 2,
            by_container: true,
            pending: false,
            upstream: None,
            request_bytes: 0,
            port: 8080,
            activity: Default::default(),
        },
    );
    t.observe(
        ms(11),
        O::InboundClosed {
            peer: [10, 88, 0, 1].into(),
            key: key(),
            sock: 3,
            by_container: true,
            pending: true,
            upstream: None,
            request_bytes: 0,
            port: 8080,
            activity: Default::default(),
        },
    );
    // Closes at exit wait for their client's return (sessions) until the settle window passes.
    t.tick(ms(11) + 10 * SECOND);
    let s = only_stop(&t);
    assert_eq!(s.connections_at_exit, Some(2));
    assert_eq!(
        (s.loss.inflight_cut, s.loss.idle_closed),
        (1, 1),
        "socket 3 was never seen open"
    );
}

#[test]
fn stops_of_one_workload_within_ten_minutes_are_one_deploy() {
    let mut t = Tracker::new(Config::default());
    for (i, id) in ["a", "b", "c"].iter().enumerate() {
        t.observe(
            ms(0),
            O::Container {
                identity: Box::new(identity(id, "web")),
                listeners: vec![],
                inbound: vec![],
            },
        );
        let at = T0 + i as u64 * 120 * SECOND;
        t.observe(
            at,
            O::Signal {
                key: std::sync::Arc::new(id.to_string()),
                sig: SIGTERM,
                sender: runc(),
                ignored: None,
            },
        );
        t.observe(
            at + 2 * SECOND,
            O::Exit {
                key: std::sync::Arc::new(id.to_string()),
                exit: ExitInfo {
                    code: Some(0),
                    signal: None,
                },
            },
        );
    }
    // Another workload in between, and the same workload again 30 minutes later.
    t.observe(
        ms(0),
        O::Container {
            identity: Box::new(identity("x", "api")),
            listeners: vec![],
            inbound: vec![],
        },
    );
    t.observe(
        T0 + 60 * SECOND,
        O::Signal {
            key: std::sync::Arc::new("x".into()),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    t.observe(
        ms(0),
        O::Container {
            identity: Box::new(identity("d", "web")),
            listeners: vec![],
            inbound: vec![],
        },
    );
    t.observe(
        T0 + 1800 * SECOND,
        O::Signal {
            key: std::sync::Arc::new("d".into()),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    let d = deploys::group(t.stops(), &[], 600 * SECOND);
    let summary: Vec<_> = d
        .iter()
        .map(|d| (d.workload.as_str(), d.stops.len(), d.in_progress))
        .collect();
    assert_eq!(summary, [("web", 1, 1), ("api", 1, 1), ("web", 3, 0)]);
    assert_eq!(d[2].outcomes.get(&Outcome::Drained), Some(&3));
}

#[test]
fn an_unreachable_attempt_moves_the_routing_lag_to_its_syn_not_to_the_give_up() {
    let mut t = running(0);
    t.observe(
        ms(0),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    t.observe(
        ms(500),
        O::Exit {
            key: key(),
            exit: killed_by(SIGTERM),
        },
    );
    // The client's last SYN at 1.2 s, to the vanished address; it gave up 2 s later.
    t.observe(
        ms(3200),
        O::Unreachable {
            key: key(),
            at: ms(1200),
            upstream: None,
        },
    );
    let s = only_stop(&t);
    assert_eq!(s.loss.unreachable, 1);
    assert_eq!(s.last_routed_at, Some(ms(1200)));
    assert_eq!(s.routing_lag_seconds(), Some(1.2));
    assert_eq!(
        s.events.iter().map(|e| (e.at, e.kind)).collect::<Vec<_>>(),
        [(ms(1200), LossKind::Unreachable)]
    );
}

#[test]
fn loss_events_keep_their_times_and_routing_lag_counts_refused_attempts() {
    let mut t = running(0);
    t.observe(
        ms(0),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    // Accepted after SIGTERM at 0.4 s and cut by the exit at 1.0 s: open 0.6 s.
    t.observe(
        ms(400),
        O::InboundEstablished {
            peer: [10, 88, 0, 1].into(),
            key: key(),
            sock: 7,
            upstream: None,
        },
    );
    t.observe(
        ms(1000),
        O::Exit {
            key: key(),
            exit: killed_by(SIGTERM),
        },
    );
    t.observe(
        ms(1000),
        O::InboundClosed {
            peer: [10, 88, 0, 1].into(),
            key: key(),
            sock: 7,
            by_container: true,
            pending: true,
            upstream: None,
            request_bytes: 0,
            port: 8080,
            activity: Default::default(),
        },
    );
    // Routing still sends until 3.8 s: refused at the closed address.
    for at in [1500, 2600, 3800] {
        t.observe(
            ms(at),
            O::Refused {
                key: key(),
                at: ms(at),
                upstream: None,
                peer: PEER,
            },
        );
    }
    t.observe(
        ms(3900),
        O::Reset {
            container: std::sync::Arc::new(identity("c1", "web")),
            direction: ResetDirection::Sent,
            reason: "NOT_SPECIFIED".into(),
            on_connection: true,
            answers_request: false,
        },
    );
    // The namespace's own RSTs (a refused connect elsewhere, a socket nobody follows) are
    // the stop's too: its count is the namespace's `TcpOutRsts`.
    t.observe(
        ms(3950),
        O::Reset {
            container: std::sync::Arc::new(identity("c1", "web")),
            direction: ResetDirection::Sent,
            reason: "NO_SOCKET".into(),
            on_connection: false,
            answers_request: false,
        },
    );
    let s = only_stop(&t);
    let events: Vec<_> = s
        .events
        .iter()
        .map(|e| (e.at, e.kind.as_str(), e.open_for))
        .collect();
    assert_eq!(
        events,
        vec![
            (ms(400), "accepted_after_sigterm", None),
            (ms(1000), "inflight_cut", Some(600_000_000)),
            (ms(1500), "refused", None),
            (ms(2600), "refused", None),
            (ms(3800), "refused", None),
        ],
        "resets are counted, not drawn"
    );
    assert_eq!(s.last_routed_at, Some(ms(3800)));
    assert_eq!(s.routing_lag_seconds(), Some(3.8));
    assert_eq!(s.loss.resets_sent.values().sum::<u64>(), 2);
}

#[test]
fn every_rst_the_namespace_sends_in_the_stop_is_counted_time_wait_and_orphans_too() {
    let mut t = running(0);
    let rst = |direction, reason: &str, on_connection| O::Reset {
        container: std::sync::Arc::new(identity("c1", "web")),
        direction,
        reason: reason.into(),
        on_connection,
        // Each answers a request written to a closed socket, or a RST it received.
        answers_request: direction == ResetDirection::Sent,
    };
    // Before the stop: the metrics' only.
    t.observe(ms(10), rst(ResetDirection::Sent, "NO_SOCKET", false));
    t.observe(
        ms(100),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    // A keep-alive client reusing connections the server had closed: two answered by the
    // time-wait socket, one by the orphaned socket still in FIN_WAIT; an abort on a
    // followed connection; a RST it received is no RST sent.
    t.observe(
        ms(200),
        rst(ResetDirection::Sent, "TCP_TIMEWAIT_SOCKET", false),
    );
    t.observe(
        ms(210),
        rst(ResetDirection::Sent, "TCP_TIMEWAIT_SOCKET", false),
    );
    t.observe(
        ms(220),
        rst(ResetDirection::Sent, "TCP_ABORT_ON_DATA", false),
    );
    t.observe(
        ms(230),
        rst(ResetDirection::Sent, "TCP_ABORT_ON_CLOSE", true),
    );
    t.observe(ms(240), rst(ResetDirection::Received, "none", true));
    let s = only_stop(&t);
    let by_reason: Vec<(&str, u64)> = s
        .loss
        .resets_sent
        .iter()
        .map(|(r, n)| (r.as_str(), *n))
        .collect();
    assert_eq!(
        by_reason,
        [
            ("TCP_ABORT_ON_CLOSE", 1),
            ("TCP_ABORT_ON_DATA", 1),
            ("TCP_TIMEWAIT_SOCKET", 2)
        ]
    );
    // The three answering data at a closed socket: requests sent after its close.
    assert_eq!(s.loss.sent_after_close, 3);
    let kinds: Vec<LossKind> = s.events.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [LossKind::SentAfterClose; 3]);
}

#[test]
fn a_closed_sockets_rst_answering_no_data_is_no_request_sent_after_close() {
    let mut t = running(0);
    t.observe(
        ms(100),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    // A client's FIN|ACK (no payload) at the time-wait socket of a stream the server ended,
    // and a SYN in its window: RSTs with a closed socket's reason that no request caused.
    for at in [200, 210] {
        t.observe(
            ms(at),
            O::Reset {
                container: std::sync::Arc::new(identity("c1", "web")),
                direction: ResetDirection::Sent,
                reason: "TCP_TIMEWAIT_SOCKET".into(),
                on_connection: false,
                answers_request: false,
            },
        );
    }
    let s = only_stop(&t);
    assert_eq!(s.loss.sent_after_close, 0);
    assert_eq!(s.loss.resets_sent.values().sum::<u64>(), 2);
    assert!(s.events.is_empty(), "resets are counted, not drawn");
}

#[test]
fn a_cut_of_a_connection_found_by_a_scan_has_no_age_and_events_are_capped() {
    let mut t = running(1);
    t.observe(
        ms(0),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    t.observe(
        ms(10),
        O::InboundClosed {
            peer: [10, 88, 0, 1].into(),
            key: key(),
            sock: 1,
            by_container: true,
            pending: true,
            upstream: None,
            request_bytes: 0,
            port: 8080,
            activity: Default::default(),
        },
    );
    let extra = stops::MAX_LOSS_EVENTS as u64 + 5;
    for i in 0..extra {
        t.observe(
            ms(20 + i),
            O::Refused {
                key: key(),
                at: ms(20 + i),
                upstream: None,
                peer: PEER,
            },
        );
    }
    let s = only_stop(&t);
    assert_eq!(s.events[0].kind.as_str(), "inflight_cut");
    assert_eq!(s.events[0].open_for, None, "its handshake was never seen");
    assert_eq!(s.events.len(), stops::MAX_LOSS_EVENTS);
    assert_eq!(s.events_dropped, 6);
    assert_eq!(s.loss.refused, extra, "every loss still counted");
    assert_eq!(s.last_routed_at, Some(ms(20 + extra - 1)));
}

#[test]
fn a_retry_is_drawn_at_the_cut_it_repeated() {
    let nginx = proxy(77, "nginx", false);
    let mut t = running(0);
    t.observe(
        ms(0),
        O::Container {
            identity: Box::new(identity("c2", "other")),
            listeners: vec![],
            inbound: vec![],
        },
    );
    t.observe(
        ms(0),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    let request = |sock, key: &str, step| O::UpstreamRequest {
        key: std::sync::Arc::new(key.into()),
        sock,
        proxy: nginx.clone(),
        tid: 78,
        step,
    };
    t.observe(
        ms(20),
        request(
            1,
            &key(),
            UpstreamStep::Cut {
                bytes: 120,
                started_at: ms(5),
            },
        ),
    );
    t.observe(
        ms(20),
        request(
            99,
            "c2",
            UpstreamStep::RetryStarted {
                cut_sock: 1,
                cut_at: ms(20),
                started_at: ms(21),
            },
        ),
    );
    t.observe(
        ms(900),
        request(
            99,
            "c2",
            UpstreamStep::RetryEnded {
                cut_sock: 1,
                bytes: 120,
            },
        ),
    );
    t.tick(ms(2000));
    let s = only_stop(&t);
    assert_eq!(s.loss.retry_duplicates, 1);
    let retry = s
        .events
        .iter()
        .find(|e| e.kind.as_str() == "retry_duplicates");
    assert_eq!(retry.map(|e| e.at), Some(ms(20)));
}

#[test]
fn once_events_stop_coming_the_clock_decides_a_cut_after_the_pipelines_lag() {
    let mut t = running(0);
    t.observe(
        ms(0),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    t.observe(
        ms(20),
        O::UpstreamRequest {
            key: key(),
            sock: 1,
            proxy: proxy(77, "nginx", false),
            tid: 78,
            step: UpstreamStep::Cut {
                bytes: 120,
                started_at: ms(18),
            },
        },
    );
    t.tick(ms(5900));
    assert_eq!(only_stop(&t).loss.upstream_aborts, 0, "lag not over");
    t.tick(ms(6100));
    assert_eq!(only_stop(&t).loss.upstream_aborts, 1);
}

#[test]
fn a_retried_request_the_backend_never_read_counts_apart_and_a_cut_without_retry_aborts() {
    let nginx = proxy(77, "nginx", false);
    let mut t = running(0);
    t.observe(
        ms(0),
        O::Container {
            identity: Box::new(identity("c2", "other")),
            listeners: vec![],
            inbound: vec![],
        },
    );
    t.observe(
        ms(0),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    let request = |sock, key: &str, step| O::UpstreamRequest {
        key: std::sync::Arc::new(key.into()),
        sock,
        proxy: nginx.clone(),
        tid: 78,
        step,
    };
    // Socket 1: the backend died with the request unread (and its FIN) in its queue.
    t.observe(
        ms(19),
        O::UpstreamPeerClosed {
            key: key(),
            sock: 1,
            unread: 121,
        },
    );
    for (sock, retry) in [(1, Some(99)), (2, None)] {
        t.observe(
            ms(20),
            request(
                sock,
                &key(),
                UpstreamStep::Cut {
                    bytes: 120,
                    started_at: ms(18),
                },
            ),
        );
        if let Some(r) = retry {
            t.observe(
                ms(20),
                request(
                    r,
                    "c2",
                    UpstreamStep::RetryStarted {
                        cut_sock: sock,
                        cut_at: ms(20),
                        started_at: ms(21),
                    },
                ),
            );
            t.observe(
                ms(25),
                request(
                    r,
                    "c2",
                    UpstreamStep::RetryEnded {
                        cut_sock: sock,
                        bytes: 120,
                    },
                ),
            );
        }
    }
    // The clock alone, with events stopped for less than the pipeline may lag, decides
    // nothing: the retry's events may still be on their way.
    t.tick(ms(2000));
    assert_eq!(only_stop(&t).loss.upstream_aborts, 0);
    // An event past the window does.
    t.processed(ms(1100));
    let s = only_stop(&t);
    assert_eq!(
        (
            s.loss.retry_duplicates,
            s.loss.retried_unexecuted,
            s.loss.upstream_aborts
        ),
        (0, 1, 1)
    );
    let outcomes: Vec<_> = t
        .take_emitted()
        .into_iter()
        .filter_map(|e| match e {
            Emitted::Retry { outcome, .. } => Some(outcome),
            _ => None,
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            RetryOutcome::Unexecuted {
                added_seconds: 0.003
            },
            RetryOutcome::Abort
        ]
    );
}

fn proxy(tgid: u32, name: &str, prober: bool) -> crate::model::Proxy {
    crate::model::Proxy {
        tgid,
        name: name.into(),
        prober,
    }
}

fn stopped_with_listener_closed() -> Tracker {
    let mut t = running(0);
    t.observe(
        ms(0),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    t.observe(
        ms(1),
        O::ListenerClosed {
            key: key(),
            addr: addr(),
        },
    );
    t
}

fn exit_zero(t: &mut Tracker, at: Mono) {
    t.observe(
        at,
        O::Exit {
            key: key(),
            exit: ExitInfo {
                code: Some(0),
                signal: None,
            },
        },
    );
}

#[test]
fn the_kubelets_failed_probes_are_apart_from_requests_and_decide_nothing() {
    let mut t = stopped_with_listener_closed();
    let kubelet = proxy(900, "kubelet", true);
    // A probe accepted after the signal (before the close) is no routed request ...
    t.observe(
        ms(0),
        O::UpstreamOpened {
            key: key(),
            sock: 0xa1,
            proxy: kubelet.clone(),
        },
    );
    t.observe(
        ms(0),
        O::InboundEstablished {
            peer: [10, 88, 0, 1].into(),
            key: key(),
            sock: 11,
            upstream: Some(0xa1),
        },
    );
    // ... and cut with its request pending, it is a probe cut.
    t.observe(
        ms(1),
        O::InboundClosed {
            peer: [10, 88, 0, 1].into(),
            key: key(),
            sock: 11,
            by_container: true,
            pending: true,
            upstream: Some(0xa1),
            request_bytes: 110,
            port: 8080,
            activity: Default::default(),
        },
    );
    for (sock, at) in [(0xa2, 500), (0xa3, 1500)] {
        t.observe(
            ms(at),
            O::UpstreamOpened {
                key: key(),
                sock,
                proxy: kubelet.clone(),
            },
        );
        t.observe(
            ms(at),
            O::Refused {
                key: key(),
                at: ms(at),
                upstream: Some(sock),
                peer: PEER,
            },
        );
    }
    exit_zero(&mut t, ms(2500));
    let s = only_stop(&t);
    assert_eq!(
        (
            s.loss.accepted_after_sigterm,
            s.loss.inflight_cut,
            s.loss.refused
        ),
        (0, 0, 0)
    );
    assert_eq!(
        (
            s.loss.probes.cut,
            s.loss.probes.refused,
            s.loss.probes.by_schedule
        ),
        (1, 2, 0)
    );
    assert_eq!(
        s.routing_lag_seconds(),
        None,
        "a prober checking is not routing"
    );
    assert_eq!(s.outcome(), Some(Outcome::Drained));
    let emitted = t.take_emitted();
    assert!(
        !emitted.iter().any(|e| matches!(e, Emitted::Refused { .. })),
        "no refused request: {emitted:?}"
    );
    let probe_losses = emitted
        .iter()
        .filter(|e| matches!(e, Emitted::Loss { kind, .. } if kind.is_probe()))
        .count();
    assert_eq!(probe_losses, 3);
}

/// HAProxy checking s1 every 2 s (+1 ms) with 38-byte checks, from `ms(0) - 8 s`.
fn checked(t: &mut Tracker) -> Mono {
    let haproxy = proxy(700, "haproxy", false);
    let mut at = ms(0) - 8 * SECOND;
    for sock in 0..4 {
        t.observe(
            at,
            O::UpstreamOpened {
                key: key(),
                sock: 0xc0 + sock,
                proxy: haproxy.clone(),
            },
        );
        t.observe(
            at + 2_000_000,
            O::UpstreamClosed {
                key: key(),
                sock: 0xc0 + sock,
                bytes_sent: 38,
            },
        );
        at += 2001 * 1_000_000;
    }
    at
}

/// A container checked by HAProxy (`checked`), signalled 500 ms before the next tick: the
/// tracker and that tick.
fn checked_then_signalled() -> (Tracker, Mono) {
    let mut t = Tracker::new(Config::default());
    t.observe(
        ms(0) - 9 * SECOND,
        O::Container {
            identity: Box::new(identity("c1", "web")),
            listeners: vec![addr()],
            inbound: vec![],
        },
    );
    let next = checked(&mut t);
    t.observe(
        next - 500_000_000,
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    (t, next)
}

#[test]
fn a_balancers_checks_are_learned_and_only_the_attempt_on_the_tick_is_a_probe() {
    let (mut t, next) = checked_then_signalled();
    t.observe(
        next - 499_000_000,
        O::ListenerClosed {
            key: key(),
            addr: addr(),
        },
    );
    let haproxy = proxy(700, "haproxy", false);
    // A request refused 300 ms before the tick, the check on it, another request 10 ms later.
    for (sock, at) in [
        (0xd1, next - 300_000_000),
        (0xd2, next + 3_000_000),
        (0xd3, next + 13_000_000),
    ] {
        t.observe(
            at,
            O::UpstreamOpened {
                key: key(),
                sock,
                proxy: haproxy.clone(),
            },
        );
        t.observe(
            at,
            O::Refused {
                key: key(),
                at,
                upstream: Some(sock),
                peer: PEER,
            },
        );
    }
    exit_zero(&mut t, next + SECOND);
    let s = only_stop(&t);
    assert_eq!(s.loss.refused, 2);
    assert_eq!((s.loss.probes.refused, s.loss.probes.by_schedule), (1, 1));
    assert_eq!(s.outcome(), Some(Outcome::ListenerClosedEarly));
}

#[test]
fn a_request_accepted_on_a_check_tick_after_sigterm_is_counted_at_its_close() {
    let (mut t, next) = checked_then_signalled();
    let haproxy = proxy(700, "haproxy", false);
    // On the tick: a 120-byte request, then the 38-byte check; both served and closed by
    // HAProxy.
    for (sock, at) in [(0xe1, next + 1_000_000), (0xe2, next + 4_000_000)] {
        t.observe(
            at,
            O::UpstreamOpened {
                key: key(),
                sock,
                proxy: haproxy.clone(),
            },
        );
        t.observe(
            at,
            O::InboundEstablished {
                peer: [10, 88, 0, 1].into(),
                key: key(),
                sock: sock + 0x100,
                upstream: Some(sock),
            },
        );
    }
    for (sock, bytes) in [(0xe1, 120), (0xe2, 38)] {
        t.observe(
            next + 300_000_000,
            O::InboundClosed {
                peer: [10, 88, 0, 1].into(),
                key: key(),
                sock: sock + 0x100,
                by_container: false,
                pending: false,
                upstream: Some(sock),
                request_bytes: bytes,
                port: 8080,
                activity: Default::default(),
            },
        );
    }
    exit_zero(&mut t, next + SECOND);
    let s = only_stop(&t);
    assert_eq!(
        s.loss.accepted_after_sigterm, 1,
        "the request, not the check"
    );
    assert_eq!(s.last_accept_at, Some(next + 1_000_000));
}

#[test]
fn a_request_refused_just_before_the_check_on_its_tick_is_the_request() {
    let mut t = Tracker::new(Config::default());
    t.observe(
        ms(0) - 9 * SECOND,
        O::Container {
            identity: Box::new(identity("c1", "web")),
            listeners: vec![addr()],
            inbound: vec![],
        },
    );
    let next = checked(&mut t);
    t.observe(
        next - 500_000_000,
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    t.observe(
        next - 499_000_000,
        O::ListenerClosed {
            key: key(),
            addr: addr(),
        },
    );
    let haproxy = proxy(700, "haproxy", false);
    // The request connects and is refused 10 ms before the tick, before the check connects.
    for (sock, at) in [(0xf1, next - 10_000_000), (0xf2, next + 2_000_000)] {
        t.observe(
            at,
            O::UpstreamOpened {
                key: key(),
                sock,
                proxy: haproxy.clone(),
            },
        );
        t.observe(
            at,
            O::Refused {
                key: key(),
                at,
                upstream: Some(sock),
                peer: PEER,
            },
        );
    }
    exit_zero(&mut t, next + SECOND);
    let s = only_stop(&t);
    assert_eq!(s.loss.refused, 1);
    assert_eq!((s.loss.probes.refused, s.loss.probes.by_schedule), (1, 1));
    let kinds: Vec<(Mono, LossKind)> = s.events.iter().map(|e| (e.at, e.kind)).collect();
    assert_eq!(
        kinds,
        vec![
            (next - 10_000_000, LossKind::Refused),
            (next + 2_000_000, LossKind::ProbeRefused)
        ],
        "the request is the one off the tick"
    );
}

/// A live stream's activity at its close: data 100 ms ago, sending for `sending_ms` since its
/// one request, in an event per 200 ms.
fn streaming(sending_ms: u64) -> crate::model::activity::Activity {
    crate::model::activity::Activity {
        quiet_for: Some(100 * 1_000_000),
        sending_for: Some(sending_ms * 1_000_000),
        segs_in: 1,
        segs_out: 1 + (sending_ms / 200) as u32,
        reset: false,
    }
}

fn closed(sock: u64, activity: crate::model::activity::Activity) -> O {
    O::InboundClosed {
        peer: [10, 88, 0, 1].into(),
        key: key(),
        sock,
        by_container: true,
        pending: false,
        upstream: None,
        request_bytes: 90,
        port: 8080,
        activity,
    }
}

fn opened(sock: u64) -> O {
    O::InboundEstablished {
        peer: [10, 88, 0, 1].into(),
        key: key(),
        sock,
        upstream: None,
    }
}

#[test]
fn streams_sigkill_cuts_are_streams_cut_and_the_lifetimes_are_learned_before_the_stop() {
    let mut t = running(0);
    // Steady state: a stream opens every 600 ms and its server ends it 5 s later. Lifetimes
    // are trusted once watched for twice the longest (10 s after the first opened).
    let mut steady: Vec<(Mono, O)> = Vec::new();
    for sock in 1..=20 {
        steady.push(((sock - 1) * 600, opened(sock)));
        steady.push(((sock - 1) * 600 + 5_000, closed(sock, streaming(4_990))));
    }
    steady.sort_by_key(|(at, _)| *at);
    for (at, o) in steady {
        t.observe(ms(at), o);
    }
    let rotation: Vec<f64> = t
        .take_emitted()
        .into_iter()
        .filter_map(|e| match e {
            Emitted::StreamRotation { seconds, .. } => Some(seconds),
            _ => None,
        })
        .collect();
    assert_eq!(rotation, vec![5.0], "reported once, when trusted");
    // Three live streams (one only 300 ms old), one idle keep-alive connection.
    for sock in 30..=33 {
        t.observe(ms(20_000 + (sock - 30) * 1_000), opened(sock));
    }
    t.observe(
        ms(23_000),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    // In the grace period one stream reaches its lifetime: the server ended it, not a cut.
    t.observe(ms(25_000), closed(30, streaming(4_990)));
    t.observe(
        ms(25_000),
        O::Signal {
            key: key(),
            sig: SIGKILL,
            sender: runc(),
            ignored: None,
        },
    );
    t.observe(
        ms(25_001),
        O::Exit {
            key: key(),
            exit: killed_by(SIGKILL),
        },
    );
    t.observe(ms(25_002), closed(31, streaming(4_000)));
    t.observe(ms(25_002), closed(32, streaming(3_000)));
    let idle = crate::model::activity::Activity {
        quiet_for: Some(2 * SECOND),
        sending_for: Some(1_000_000),
        segs_in: 3,
        segs_out: 3,
        reset: false,
    };
    t.observe(ms(25_002), closed(33, idle));
    t.observe(ms(25_100), O::CgroupRemoved { key: key() });
    // Closes at exit wait for their client's return (sessions) until the settle window passes.
    t.tick(ms(25_100) + 10 * SECOND);
    let s = only_stop(&t);
    assert_eq!(s.outcome(), Some(Outcome::KilledAtDeadline));
    assert_eq!((s.loss.streams_cut, s.loss.idle_closed), (2, 2));
    assert_eq!(s.loss.inflight_cut, 0);
    let l = s.stream_lifetimes.expect("lifetimes learned");
    assert_eq!((l.p50, l.p95, l.streams), (5 * SECOND, 5 * SECOND, 20));
    assert_eq!(
        s.streams_ended_by_server(),
        crate::model::streams::StreamsEnded {
            on_their_timers: 1,
            at_sigterm: 0
        }
    );
    let cuts: Vec<_> = s
        .events
        .iter()
        .filter(|e| e.kind == LossKind::StreamsCut)
        .map(|e| e.open_for)
        .collect();
    assert_eq!(cuts, vec![Some(4_002 * 1_000_000), Some(3_002 * 1_000_000)]);
}

#[test]
fn streams_the_server_ends_at_once_on_sigterm_are_not_cuts_and_are_reported_apart() {
    let mut t = running(0);
    for sock in 1..=5 {
        t.observe(ms(sock * 100), opened(sock));
    }
    t.observe(
        ms(3_000),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    // Every stream ended with a final event 20 ms after the signal, then a clean exit.
    for sock in 1..=5 {
        t.observe(ms(3_020), closed(sock, streaming(2_800)));
    }
    t.observe(
        ms(3_050),
        O::Exit {
            key: key(),
            exit: ExitInfo {
                code: Some(0),
                signal: None,
            },
        },
    );
    let s = only_stop(&t);
    assert_eq!((s.loss.streams_cut, s.loss.idle_closed), (0, 5));
    assert_eq!(s.stream_lifetimes, None, "nothing learned");
    assert_eq!(
        s.streams_ended_by_server(),
        crate::model::streams::StreamsEnded {
            on_their_timers: 0,
            at_sigterm: 5
        }
    );
}

#[test]
fn request_response_traffic_never_reads_as_streams() {
    // A backend answering keep-alive requests and slow ones, then stopped: its closes at exit
    // are idle, however recent their last response.
    let mut t = running(0);
    let answered = crate::model::activity::Activity {
        quiet_for: Some(30 * 1_000_000),
        sending_for: Some(2 * 1_000_000),
        segs_in: 40,
        segs_out: 80,
        reset: false,
    };
    let slow = crate::model::activity::Activity {
        quiet_for: Some(0),
        sending_for: Some(1_800 * 1_000_000),
        segs_in: 1,
        segs_out: 2,
        reset: false,
    };
    for sock in 1..=4 {
        t.observe(ms(sock), opened(sock));
        t.observe(ms(3_000 + sock), closed(sock, slow));
    }
    for sock in 5..=8 {
        t.observe(ms(4_000), opened(sock));
    }
    t.observe(
        ms(5_000),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    t.observe(ms(5_001), closed(5, slow));
    t.observe(
        ms(5_002),
        O::Exit {
            key: key(),
            exit: killed_by(SIGTERM),
        },
    );
    for sock in 6..=8 {
        t.observe(ms(5_003), closed(sock, answered));
    }
    // Closes at exit wait for their client's return (sessions) until the settle window passes.
    t.tick(ms(5_003) + 10 * SECOND);
    let s = only_stop(&t);
    assert_eq!((s.loss.streams_cut, s.loss.idle_closed), (0, 4));
    assert_eq!(s.stream_lifetimes, None);
}

#[test]
fn a_stop_whose_exit_was_lost_settles_incomplete_once_the_cgroup_is_gone() {
    let mut t = running(1);
    t.observe(
        ms(1_000),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    t.observe(ms(2_000), O::CgroupRemoved { key: key() });
    t.tick(ms(11_900));
    assert!(!only_stop(&t).settled, "the settle delay after the removal");
    t.tick(ms(12_000));
    let s = only_stop(&t);
    assert!(s.settled && !s.complete);
    assert_eq!((s.exit_at, s.outcome()), (None, None));
}

#[test]
fn a_stop_without_an_exit_settles_incomplete_and_the_next_stop_starts_afresh() {
    let mut t = running(1);
    let sig = |t: &mut Tracker, at, sig| {
        t.observe(
            at,
            O::Signal {
                key: key(),
                sig,
                sender: runc(),
                ignored: None,
            },
        )
    };
    // SIGTERM, SIGKILL 10 s later, and no exit ever comes (its event was lost).
    sig(&mut t, ms(1_000), SIGTERM);
    sig(&mut t, ms(11_000), SIGKILL);
    t.tick(ms(40_000));
    assert!(!only_stop(&t).settled, "30 s after SIGKILL, not before");
    t.tick(ms(41_000));
    let s = only_stop(&t);
    assert!(s.settled && !s.complete);
    assert_eq!(s.outcome(), None);
    // The container lives on: its next stop is a record of its own, without the old SIGKILL.
    sig(&mut t, ms(60_000), SIGTERM);
    t.observe(
        ms(60_500),
        O::Exit {
            key: key(),
            exit: killed_by(SIGTERM),
        },
    );
    assert_eq!(t.stops().len(), 2);
    let next = &t.stops()[1];
    assert_eq!((next.sigkill_at, next.complete), (None, true));
    assert_eq!(next.outcome(), Some(Outcome::ExitAtOnce));
}

#[test]
fn a_stop_signal_with_no_exit_and_no_kill_settles_after_the_grace_period_and_a_margin() {
    let mut t = running(0);
    t.observe(
        ms(1_000),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    let limit = super::stops::UNKNOWN_GRACE + super::stops::NO_EXIT_AFTER_KILL;
    t.tick(ms(1_000) + limit - 1);
    assert!(!only_stop(&t).settled);
    t.tick(ms(1_000) + limit);
    assert!(only_stop(&t).settled && !only_stop(&t).complete);
}

#[test]
fn the_record_cap_evicts_settled_stops_past_an_open_one() {
    let mut t = Tracker::new(Config {
        max_stops: 2,
        ..Config::default()
    });
    for (i, id) in ["a", "b", "c"].into_iter().enumerate() {
        t.observe(
            ms(0),
            O::Container {
                identity: Box::new(identity(id, id)),
                listeners: vec![],
                inbound: vec![],
            },
        );
        let at = ms(1_000 * i as u64);
        t.observe(
            at,
            O::Signal {
                key: std::sync::Arc::new(id.into()),
                sig: SIGTERM,
                sender: runc(),
                ignored: None,
            },
        );
        // a stays open (draining); b and c exit and go.
        if id != "a" {
            t.observe(
                at + 1_000_000,
                O::Exit {
                    key: std::sync::Arc::new(id.into()),
                    exit: killed_by(SIGTERM),
                },
            );
            t.observe(
                at + 2_000_000,
                O::CgroupRemoved {
                    key: std::sync::Arc::new(id.into()),
                },
            );
        }
    }
    t.tick(ms(20_000));
    let ids: Vec<&str> = t.stops().iter().map(|s| s.container.id.as_str()).collect();
    assert_eq!(ids, ["a", "c"], "b went, though a is older and open");
    assert_eq!(t.stops_evicted(), 1);
    // a still records its exit.
    t.observe(
        ms(21_000),
        O::Exit {
            key: std::sync::Arc::new("a".into()),
            exit: killed_by(SIGTERM),
        },
    );
    assert!(t.stops()[0].exit_at.is_some());
}

/// A stop that saw `during` lost while it was open (and more before and after it, not its).
fn stop_losing(during: Lost) -> Stop {
    let mut t = running(0);
    t.lost(Lost {
        events: 5,
        faults: 1,
    }); // before any stop: nobody's
    t.observe(
        ms(100),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    t.lost(during);
    t.observe(
        ms(200),
        O::Exit {
            key: key(),
            exit: killed_by(SIGTERM),
        },
    );
    t.observe(ms(300), O::CgroupRemoved { key: key() });
    t.tick(ms(20_000));
    t.lost(Lost {
        events: 7,
        faults: 4,
    }); // after it settled: not its
    only_stop(&t).clone()
}

/// Events lost on their way, or faults that lose part of what a stop reads (a retry chain,
/// an upstream connection the kernel could not follow), each alone: on the record, which
/// settles incomplete; what it saw still decides its outcome.
#[test]
fn losses_while_a_stop_is_open_are_on_its_record_and_make_it_incomplete() {
    for (events, faults) in [(3, 0), (0, 2)] {
        let s = stop_losing(Lost { events, faults });
        assert!(s.settled);
        assert_eq!(
            (s.events_lost, s.ebpf_faults, s.complete),
            (events, faults, false)
        );
        assert_eq!(
            s.outcome(),
            Some(Outcome::ExitAtOnce),
            "what it saw still decides"
        );
    }
}

/// `--hold`: a connection's arrival may reach the tracker only with its close, after the
/// signal and the exit that came between. Counted where it belonged: open at SIGTERM and at
/// exit, accepted before SIGTERM, cut at exit.
#[test]
fn an_arrival_that_comes_after_the_signal_and_exit_it_preceded_is_counted_as_open_at_both() {
    let mut t = running(1);
    let established = |sock| O::InboundEstablished {
        peer: [10, 88, 0, 1].into(),
        key: key(),
        sock,
        upstream: None,
    };
    let closed = |sock, pending| O::InboundClosed {
        peer: [10, 88, 0, 1].into(),
        key: key(),
        sock,
        by_container: true,
        pending,
        upstream: None,
        request_bytes: 10,
        port: 8080,
        activity: Default::default(),
    };
    t.observe(
        ms(100),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    // Accepted after SIGTERM, held too: counted as routed after it.
    t.observe(ms(150), established(20));
    t.observe(ms(160), closed(20, false));
    t.observe(
        ms(200),
        O::Exit {
            key: key(),
            exit: killed_by(SIGTERM),
        },
    );
    // Arrived at 50 and 120 (before SIGTERM, then before exit), cut at exit with a request
    // pending; the scan's connection 1 was idle.
    t.observe(ms(50), established(10));
    t.observe(ms(201), closed(10, true));
    t.observe(ms(120), established(11));
    t.observe(ms(201), closed(11, true));
    // A scan's connection seen by its handshake (late) changes no count: counted already.
    t.observe(ms(60), established(1));
    t.observe(ms(201), closed(1, false));
    t.observe(ms(600), O::CgroupRemoved { key: key() });
    // Closes at exit wait for their client's return (sessions) until the settle window passes.
    t.tick(ms(600) + 10 * SECOND);
    let s = only_stop(&t);
    assert_eq!(
        (s.connections_at_sigterm, s.connections_at_exit),
        (Some(2), Some(3)),
        "1 and 10 at SIGTERM; 1, 10 and 11 at exit"
    );
    assert_eq!(s.loss.accepted_after_sigterm, 2, "20 and 11");
    assert_eq!(s.last_accept_at, Some(ms(150)));
    assert_eq!(
        (s.loss.inflight_cut, s.loss.idle_closed),
        (2, 2),
        "10, 11; 20, 1"
    );
}

/// A pod as the CRI makes it: its sandbox (pause, named `POD`) and its app share the address;
/// the kubelet stops the app, then the sandbox (SIGKILL).
fn pod_member(id: &str, name: &str) -> ContainerIdentity {
    ContainerIdentity {
        id: id.into(),
        runtime: "containerd".into(),
        name: name.into(),
        namespace: "shop".into(),
        pod: "web-7d9f8b6c5d-x2x7q".into(),
        workload: "web".into(),
        ..Default::default()
    }
}

/// A running pod, its sandbox and its app (listening, one connection open): the tracker and
/// their keys.
fn running_pod() -> (
    Tracker,
    crate::model::observation::ContainerKey,
    crate::model::observation::ContainerKey,
) {
    let mut t = Tracker::new(Config::default());
    let sandbox = crate::model::observation::ContainerKey::new("sb".into());
    let app = crate::model::observation::ContainerKey::new("app".into());
    for (k, name, listeners) in [(&sandbox, "POD", vec![]), (&app, "app", vec![addr()])] {
        t.observe(
            ms(0),
            O::Container {
                identity: Box::new(pod_member(k, name)),
                listeners,
                inbound: vec![1],
            },
        );
    }
    (t, sandbox, app)
}

#[test]
fn a_pods_sandbox_is_a_line_on_its_apps_stop_never_a_stop() {
    let (mut t, sandbox, app) = running_pod();
    let signal = |key: &crate::model::observation::ContainerKey, sig| O::Signal {
        key: key.clone(),
        sig,
        sender: Sender {
            pid: 77,
            comm: "containerd-shim".into(),
        },
        ignored: None,
    };
    t.observe(ms(100), signal(&app, SIGTERM));
    t.observe(
        ms(101),
        O::Exit {
            key: app.clone(),
            exit: killed_by(SIGTERM),
        },
    );
    t.observe(ms(300), signal(&sandbox, SIGKILL));
    t.observe(
        ms(301),
        O::Exit {
            key: sandbox.clone(),
            exit: killed_by(SIGKILL),
        },
    );
    t.observe(
        ms(302),
        O::CgroupRemoved {
            key: sandbox.clone(),
        },
    );
    // Attempts to the vanished address are counted on the app (attribution names it).
    t.observe(
        ms(400),
        O::Unreachable {
            key: app.clone(),
            at: ms(400),
            upstream: None,
        },
    );
    let s = only_stop(&t);
    assert_eq!(s.container.name, "app");
    assert_eq!(s.outcome(), Some(Outcome::ExitAtOnce));
    assert_eq!(s.sandbox_stopped_at, Some(ms(301)));
    assert_eq!(s.loss.unreachable, 1);
    let began: Vec<String> = t
        .take_emitted()
        .into_iter()
        .filter_map(|e| match e {
            Emitted::StopBegan { container, .. } => Some(container.name),
            _ => None,
        })
        .collect();
    assert_eq!(began, ["app"]);
    // One deleted pod is one judged stop in its deploy.
    let d = deploys::group(t.stops(), &[], 600 * SECOND);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].outcomes.values().sum::<u64>(), 1);
}

#[test]
fn an_ignored_stop_signal_is_on_the_record() {
    let mut t = running(1);
    t.observe(
        ms(100),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: Some(stops::IgnoredSignal::Pid1WithoutHandler),
        },
    );
    t.observe(
        ms(5_100),
        O::Signal {
            key: key(),
            sig: SIGKILL,
            sender: runc(),
            ignored: None,
        },
    );
    t.observe(
        ms(5_101),
        O::Exit {
            key: key(),
            exit: killed_by(SIGKILL),
        },
    );
    let s = only_stop(&t);
    assert_eq!(
        s.stop_signal_ignored,
        Some(stops::IgnoredSignal::Pid1WithoutHandler)
    );
    assert_eq!(s.outcome(), Some(Outcome::KilledAtDeadline));
}

#[test]
fn a_sandbox_that_ends_a_moment_before_its_app_is_still_a_line_on_the_apps_stop() {
    let (mut t, sandbox, app) = running_pod();
    // podman stops a pod's members together: here the infra's exit comes first.
    t.observe(
        ms(100),
        O::Exit {
            key: sandbox.clone(),
            exit: ExitInfo {
                code: Some(0),
                signal: None,
            },
        },
    );
    t.observe(
        ms(101),
        O::Signal {
            key: app.clone(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    assert_eq!(only_stop(&t).sandbox_stopped_at, Some(ms(100)));
    // A sandbox of the same pod name gone long before (a pod recreated under its name) is not.
    let (mut t, sandbox, app) = running_pod();
    t.observe(
        ms(100),
        O::CgroupRemoved {
            key: sandbox.clone(),
        },
    );
    t.observe(
        ms(60_000),
        O::Signal {
            key: app.clone(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    assert_eq!(only_stop(&t).sandbox_stopped_at, None);
}

/// A quiet connection closed by the exit, from `peer`.
fn closed_from(sock: u64, peer: [u8; 4]) -> O {
    O::InboundClosed {
        peer: peer.into(),
        key: key(),
        sock,
        by_container: true,
        pending: false,
        upstream: None,
        request_bytes: 40,
        port: 8080,
        activity: Default::default(),
    }
}

#[test]
fn sessions_the_exit_cut_are_the_closes_whose_clients_came_back() {
    // A socket server without a SIGTERM handler: SIGKILLed with 4 quiet sessions open (two
    // clients at .7, two at .8, one at .9 closed earlier by the server itself).
    let mut t = running(5);
    let kill = |t: &mut Tracker| {
        t.observe(
            ms(100),
            O::Signal {
                key: key(),
                sig: SIGTERM,
                sender: runc(),
                ignored: None,
            },
        );
        t.observe(ms(150), closed_from(5, [10, 88, 0, 9]));
        t.observe(
            ms(5_100),
            O::Exit {
                key: key(),
                exit: killed_by(SIGKILL),
            },
        );
        for (sock, peer) in [(1, 7), (2, 7), (3, 8), (4, 8)] {
            t.observe(ms(5_101), closed_from(sock, [10, 88, 0, peer]));
        }
        t.observe(ms(5_200), O::CgroupRemoved { key: key() });
    };
    kill(&mut t);
    // The replacement (same workload) comes up; .7's two clients and one of .8's come back
    // within the window, another connection from .8 much later; a check from .8 is no
    // return.
    t.observe(
        ms(5_300),
        O::Container {
            identity: Box::new(identity("c2", "web")),
            listeners: vec![addr()],
            inbound: vec![],
        },
    );
    let c2 = crate::model::observation::ContainerKey::new("c2".into());
    let arrive = |t: &mut Tracker, at: u64, sock: u64, peer: u8| {
        t.observe(
            ms(at),
            O::InboundEstablished {
                key: c2.clone(),
                sock,
                upstream: None,
                peer: [10, 88, 0, peer].into(),
            },
        );
    };
    for (at, sock, peer) in [(6_000, 101, 7), (6_100, 102, 7), (6_200, 103, 8)] {
        arrive(&mut t, at, sock, peer);
    }
    // A return counts at once; a close nobody came back for only when the window passes.
    assert_eq!(
        (
            t.stops()[0].loss.sessions_cut,
            t.stops()[0].loss.idle_closed
        ),
        (3, 1)
    );
    arrive(&mut t, 16_000, 104, 8);
    t.tick(ms(16_000));
    t.tick(ms(5_200) + 10 * SECOND);
    let s = &t.stops()[0];
    assert!(s.settled);
    assert_eq!(
        (s.loss.sessions_cut, s.loss.idle_closed),
        (3, 2),
        "3 came back in time; .8's second and the server's own close at .9 were idle"
    );
    assert!(s.loss.lost_any());
    // The sessions are drawn at their cut, and counted for telemetry.
    assert_eq!(
        s.events
            .iter()
            .filter(|e| e.kind == LossKind::SessionsCut && e.at == ms(5_101))
            .count(),
        3
    );
    let emitted = t.take_emitted();
    let counted = emitted
        .iter()
        .filter(|e| {
            matches!(
                e,
                Emitted::Loss {
                    kind: LossKind::SessionsCut,
                    ..
                }
            )
        })
        .count();
    assert_eq!(counted, 3);
    assert_eq!(t.sessions_waiting(), (0, 0));
}

#[test]
fn a_request_the_exit_cut_stays_a_cut_and_its_clients_return_is_a_first_connection() {
    let mut t = running(2);
    t.observe(
        ms(100),
        O::Exit {
            key: key(),
            exit: killed_by(SIGKILL),
        },
    );
    let mut pending = closed_from(1, [10, 88, 0, 7]);
    if let O::InboundClosed { pending: p, .. } = &mut pending {
        *p = true;
    }
    t.observe(ms(101), pending);
    t.observe(ms(101), closed_from(2, [10, 88, 0, 7]));
    for (at, sock) in [(900, 11), (950, 12)] {
        t.observe(
            ms(at),
            O::InboundEstablished {
                key: key(),
                sock,
                upstream: None,
                peer: [10, 88, 0, 7].into(),
            },
        );
    }
    let s = &t.stops()[0];
    assert_eq!((s.loss.inflight_cut, s.loss.sessions_cut), (1, 1));
    // Both clients came back: two first connections for the storm.
    let back: Vec<_> = t.take_returns().map(|r| r.at).collect();
    assert_eq!(back, [ms(900), ms(950)]);
}

#[test]
fn a_client_refused_by_a_replacement_not_listening_yet_came_back_at_its_refusal() {
    // Two quiet sessions from .7 cut by the exit; the replacement's namespace refuses one
    // client (it does not listen yet), which connects later; the other connects at once.
    let mut t = running(2);
    t.observe(
        ms(100),
        O::Exit {
            key: key(),
            exit: killed_by(SIGKILL),
        },
    );
    // Accepted by a dual-stack listener: the peers are IPv4-mapped, the RST's plain IPv4.
    for sock in [1, 2] {
        let mut close = closed_from(sock, [10, 88, 0, 7]);
        if let O::InboundClosed { peer, .. } = &mut close {
            *peer = std::net::Ipv4Addr::new(10, 88, 0, 7)
                .to_ipv6_mapped()
                .into();
        }
        t.observe(ms(101), close);
    }
    let replacement = std::sync::Arc::new(identity("c2", "web"));
    t.observe(
        ms(400),
        O::RefusedAt {
            container: replacement.clone(),
            netns: crate::model::Netns::by_inode(9),
            port: 8080,
            at: ms(400),
            upstream: None,
            peer: [10, 88, 0, 7].into(),
        },
    );
    assert_eq!(
        t.stops()[0].loss.sessions_cut,
        1,
        "the refused client came back"
    );
    t.observe(
        ms(1_300),
        O::Container {
            identity: Box::new(identity("c2", "web")),
            listeners: vec![addr()],
            inbound: vec![],
        },
    );
    let c2 = crate::model::observation::ContainerKey::new("c2".into());
    for (at, sock) in [(1_400, 101), (1_500, 102)] {
        t.observe(
            ms(at),
            O::InboundEstablished {
                key: c2.clone(),
                sock,
                upstream: None,
                peer: [10, 88, 0, 7].into(),
            },
        );
    }
    let s = &t.stops()[0];
    assert_eq!((s.loss.sessions_cut, s.loss.idle_closed), (2, 0));
    // First attempts: the refusal, then the other client's connection (the refused one's
    // later connection is no second client).
    // Both from one address: which client came back first is not known (the first return
    // is shared, the last is the one left).
    let back: Vec<_> = t.take_returns().map(|r| (r.at, r.shared)).collect();
    assert_eq!(back, [(ms(400), true), (ms(1_400), false)]);
}

#[test]
fn a_cut_on_a_keep_alive_connection_carries_its_requests_age_not_the_connections() {
    let mut t = running(0);
    // Opened at 0 s, 40 requests answered since; SIGTERM at 2 s, SIGKILL at 10 s.
    t.observe(ms(0), opened(5));
    t.observe(
        ms(2_000),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    t.observe(
        ms(10_000),
        O::Exit {
            key: key(),
            exit: killed_by(SIGKILL),
        },
    );
    // Its last request came 150 ms before the kill, unanswered (nothing sent since).
    let pending = crate::model::activity::Activity {
        quiet_for: Some(150 * 1_000_000),
        sending_for: Some(0),
        segs_in: 41,
        segs_out: 40,
        reset: false,
    };
    t.observe(
        ms(10_001),
        O::InboundClosed {
            peer: [10, 88, 0, 1].into(),
            key: key(),
            sock: 5,
            by_container: true,
            pending: true,
            upstream: None,
            request_bytes: 41 * 90,
            port: 8080,
            activity: pending,
        },
    );
    let s = only_stop(&t);
    assert_eq!(s.loss.inflight_cut, 1);
    let e = s.events[0];
    assert_eq!(e.kind, LossKind::InflightCut);
    assert_eq!(e.open_for, Some(10_001 * 1_000_000), "the connection's age");
    assert_eq!(e.request_for, Some(150 * 1_000_000), "the request's");
}

/// The host_network flake: an earlier connection's arrival and close at a reused socket
/// address came after the arrival of the connection now there; its close must not end it.
#[test]
fn an_earlier_connections_late_close_at_a_reused_address_leaves_the_current_one_open() {
    let mut t = running(0);
    t.observe(ms(11), opened(1));
    t.observe(ms(0), opened(1));
    t.observe(ms(1), closed(1, streaming(1)));
    t.observe(
        ms(100),
        O::Signal {
            key: key(),
            sig: SIGTERM,
            sender: runc(),
            ignored: None,
        },
    );
    t.observe(
        ms(101),
        O::Exit {
            key: key(),
            exit: killed_by(SIGTERM),
        },
    );
    // Its own close at the exit: a request pending.
    let mut cut = closed(1, streaming(1));
    if let O::InboundClosed { pending, .. } = &mut cut {
        *pending = true;
    }
    t.observe(ms(102), cut);
    t.observe(ms(200), O::CgroupRemoved { key: key() });
    t.tick(ms(200) + 10 * SECOND);
    let s = only_stop(&t);
    assert_eq!(s.loss.inflight_cut, 1, "{s:?}");
}
