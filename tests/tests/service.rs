//! Connections through a Kubernetes Service's virtual IP, with kube-proxy's own rule structures
//! in both modes (iptables and nftables; `lab::service`): the client's socket names the
//! virtual IP, which no container has, and conntrack's DNAT decides which pod it reaches.
//!
//! The real agent, real podman containers as the Service's two endpoints, clients on the node
//! connecting to the virtual IP on a fixed beat. Ground truth: each attempt's own outcome and
//! `connect()` time, the endpoints' DNAT rule counters, and the safety table's drop counter
//! (nothing may escape NAT).
//!
//! - **A stale rule**: s1 drains and exits (its address goes with it) while kube-proxy still
//!   sends new connections to it (endpoint propagation lag): every attempt DNATed there after
//!   its exit goes unanswered, counted on s1's stop as unreachable and dated at its SYN.
//! - **The right way**: the endpoint removed first, then SIGTERM: no loss, no bad verdict.
//! - **No endpoints** (a one-replica Recreate rollout): the pod's endpoint goes at SIGTERM and
//!   nothing replaces it; kube-proxy rejects every new connection (ICMP port unreachable, the
//!   client's ECONNREFUSED, no RST): counted on the stopping pod as `no_endpoints`, apart
//!   from its refusals, and the verdict says the Service had no endpoints.

use std::{
    net::SocketAddrV4,
    thread,
    time::{Duration, Instant},
};

use drainwatch_tests::{
    agent::{Agent, api, current_stop, instant, stop_record, sync, wait_for},
    lab::{
        clock::{secs_since, sleep_until},
        connect::{Attempt, Met, attempt, count, unclassified},
        container::{Backend, BackendOpts, BridgeHolder, Mode},
        net::require_bridge_route,
        service::{ProxyMode, Service},
    },
};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const BEAT: Duration = Duration::from_millis(100);
/// kubeadm's default Service CIDR holds it; the lab routes it onto its bridge only.
const VIP: &str = "10.96.0.10:80";

fn known(agent: &Agent, id: &str) {
    wait_for(
        "the agent knows the backend",
        Duration::from_secs(10),
        || {
            api(agent, "/api/v1/starts")
                .1
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| s["container"]["id"] == id)
        },
    );
}

/// Attempts to the virtual IP on a fixed beat while `stop` runs, until `after` past its end.
fn attempts_during(
    vip: SocketAddrV4,
    bridge_ip: SocketAddrV4,
    stop: impl FnOnce() + Send,
    after: Duration,
) -> Vec<Attempt> {
    thread::scope(|scope| {
        let stopping = scope.spawn(stop);
        let mut running = Vec::new();
        let mut next = Instant::now();
        let mut done_at: Option<Instant> = None;
        for _ in 0..400 {
            if done_at.is_some_and(|d| next > d + after) {
                break;
            }
            sleep_until(next);
            // The endpoints' bridge must still route, or nothing is sent.
            if let Err(e) = require_bridge_route((*bridge_ip.ip()).into()) {
                panic!("lab: refusing to send: {e}");
            }
            running.push(scope.spawn(move || attempt(vip, CONNECT_TIMEOUT)));
            next += BEAT;
            if done_at.is_none() && stopping.is_finished() {
                done_at = Some(Instant::now());
            }
        }
        assert!(done_at.is_some(), "the stop did not end within 400 beats");
        stopping.join().expect("stop thread");
        running
            .into_iter()
            .map(|h| h.join().expect("attempt thread"))
            .collect()
    })
}

/// The agent, s1 (which drains 0.8 s and exits, its address going with it) and s2 behind the
/// Service, which the agent knows.
struct Lab {
    agent: Agent,
    s1: Backend,
    s2: Backend,
    service: Service,
    vip: SocketAddrV4,
    /// Keeps the bridge up while anything may still send (bound first, never `..`: dropped
    /// last).
    _bridge: BridgeHolder,
}

impl Lab {
    fn two_endpoints(mode: ProxyMode) -> Lab {
        let bridge_holder = BridgeHolder::start("svc");
        let agent = Agent::start(&[]);
        let s1 = Backend::start("s1", Mode::Drain, BackendOpts::gone_after_drain());
        let s2 = Backend::start("s2", Mode::Drain, BackendOpts::default());
        let bridge = require_bridge_route((*s1.addr().ip()).into()).expect("s1 on the bridge");
        let vip: SocketAddrV4 = VIP.parse().unwrap();
        let service = Service::install(mode, vip, &bridge, &[s1.addr(), s2.addr()])
            .unwrap_or_else(|e| panic!("installing the Service ({}): {e}", mode.name()));
        known(&agent, &s1.id);
        sync(&agent);
        Lab {
            agent,
            s1,
            s2,
            service,
            vip,
            _bridge: bridge_holder,
        }
    }
}

fn stale_rule(mode: ProxyMode) {
    let Lab {
        _bridge,
        agent,
        s1,
        s2,
        service,
        vip,
    } = Lab::two_endpoints(mode);
    let attempts = attempts_during(
        vip,
        s2.addr(),
        || {
            thread::sleep(Duration::from_millis(500));
            s1.stop(10);
        },
        Duration::from_secs(2),
    );
    assert_eq!(s1.exit_code(), 0, "s1 drained and exited 0");
    let others = unclassified(&attempts);
    assert!(
        others.is_empty(),
        "attempts the lab cannot classify: {others:?}"
    );
    let (unanswered, refused) = (
        count(&attempts, &Met::Unanswered),
        count(&attempts, &Met::Refused),
    );
    let to_s1 = service.dnat_count(s1.addr()).expect("s1's DNAT counter");
    let to_s2 = service.dnat_count(s2.addr()).expect("s2's DNAT counter");
    println!(
        "{}: {} attempts: {} connected, {refused} refused, {unanswered} unanswered; DNAT: {to_s1} to s1, {to_s2} to s2",
        mode.name(),
        attempts.len(),
        count(&attempts, &Met::Connected)
    );
    assert_eq!(
        service.escaped().expect("safety counter"),
        0,
        "nothing left the lab un-NATed"
    );
    // The lab checks its backends on their own addresses, never through the virtual IP. An
    // attempt from a source port whose previous connection conntrack still keeps is translated
    // as that one was, without a new NAT evaluation: at most a couple in a run.
    let dnat = to_s1 + to_s2;
    assert!(
        dnat <= attempts.len() as u64 && dnat + 2 >= attempts.len() as u64,
        "every attempt went through the Service's DNAT: {dnat} of {}",
        attempts.len()
    );
    assert!(unanswered >= 3, "attempts DNATed to s1's vanished address");
    assert!(
        to_s1 >= (unanswered + refused) as u64,
        "every failed attempt went to s1"
    );
    let last_syn = attempts
        .iter()
        .filter(|a| a.met == Met::Unanswered)
        .map(|a| a.at)
        .max()
        .expect("unanswered attempts");

    stop_record(&agent, &s1.id);
    sync(&agent);
    let stop = current_stop(&agent, &s1.id).expect("s1's stop record");
    println!("drainwatch: {stop:#}");
    assert_eq!(
        stop["loss"]["unreachable"].as_u64(),
        Some(unanswered as u64),
        "unreachable = the clients' unanswered attempts through the virtual IP"
    );
    assert_eq!(
        stop["loss"]["refused"].as_u64().unwrap_or(0),
        refused as u64,
        "refused = the clients' refused attempts"
    );
    // s1's own RSTs are refusals, never kube-proxy's rejects (conntrack forgets an entry
    // whose only answer was a RST, as it forgets a rejected one).
    assert_eq!(stop["loss"]["no_endpoints"].as_u64(), Some(0), "{stop:#}");
    let term = instant(&stop["sigterm_at"]).expect("sigterm_at");
    let lag = stop["routing_lag_seconds"].as_f64().expect("routing lag");
    let truth = secs_since(term, last_syn);
    println!("routing lag {lag:.3} s; the last SYN DNATed to s1 {truth:.3} s after SIGTERM");
    assert!(
        (lag - truth).abs() < 0.05,
        "routing lag {lag:.3} s vs the last SYN to s1 {truth:.3} s after SIGTERM"
    );
    // The metric follows the pipeline's counts once a second.
    let translated =
        || agent.metric_sum("drainwatch_nat_lookups_total", &[("result", "translated")]);
    wait_for("the lookups on the metric", Duration::from_secs(5), || {
        translated() >= unanswered as f64
    });
    drop(service);
}

fn right_way(mode: ProxyMode) {
    let Lab {
        _bridge,
        agent,
        s1,
        s2,
        mut service,
        vip,
    } = Lab::two_endpoints(mode);
    let service_ref = &mut service;
    let attempts = attempts_during(
        vip,
        s2.addr(),
        || {
            thread::sleep(Duration::from_millis(500));
            // The EndpointSlice drops s1, kube-proxy syncs, then the kubelet's SIGTERM.
            service_ref.sync(&[s2.addr()]).expect("sync without s1");
            thread::sleep(Duration::from_millis(500));
            s1.stop(10);
        },
        Duration::from_secs(1),
    );
    let connected = count(&attempts, &Met::Connected);
    println!(
        "{}: {} attempts, {connected} connected",
        mode.name(),
        attempts.len()
    );
    assert_eq!(
        connected,
        attempts.len(),
        "the right way loses nothing: {attempts:?}"
    );
    assert_eq!(service.escaped().expect("safety counter"), 0);
    let stop = stop_record(&agent, &s1.id);
    println!("drainwatch: {stop:#}");
    for kind in ["unreachable", "refused", "inflight_cut", "no_endpoints"] {
        assert_eq!(
            stop["loss"][kind].as_u64().unwrap_or(0),
            0,
            "{kind}: {stop:#}"
        );
    }
    assert_eq!(stop["outcome"], "drained", "{stop:#}");
}

fn no_endpoints(mode: ProxyMode) {
    let _bridge = BridgeHolder::start("svc");
    let agent = Agent::start(&[]);
    let s1 = Backend::start(
        "s1",
        Mode::Drain,
        BackendOpts {
            drain_delay: Some(Duration::from_millis(1500)),
            ..BackendOpts::default()
        },
    );
    let bridge = require_bridge_route((*s1.addr().ip()).into()).expect("s1 on the bridge");
    let vip: SocketAddrV4 = VIP.parse().unwrap();
    let mut service = Service::install(mode, vip, &bridge, &[s1.addr()])
        .unwrap_or_else(|e| panic!("installing the Service ({}): {e}", mode.name()));
    known(&agent, &s1.id);
    // Connections the Service served while it had its pod (conntrack keeps them, closed,
    // for 120 s): what names the pod a later rejection was for.
    for _ in 0..3 {
        assert_eq!(
            attempt(vip, CONNECT_TIMEOUT).met,
            Met::Connected,
            "the Service serves"
        );
    }
    sync(&agent);
    let service_ref = &mut service;
    let synced_at = std::sync::Mutex::new(None);
    let attempts = attempts_during(
        vip,
        s1.addr(),
        || {
            thread::sleep(Duration::from_millis(500));
            // The pod turns terminating: the kubelet's SIGTERM, and its endpoint goes (300 ms
            // later, as kube-proxy's sync follows), nothing replaces it.
            thread::scope(|scope| {
                scope.spawn(|| s1.stop(10));
                thread::sleep(Duration::from_millis(300));
                service_ref.sync(&[]).expect("sync without endpoints");
                *synced_at.lock().unwrap() = Some(Instant::now());
            });
        },
        Duration::from_secs(1),
    );
    let synced_at = synced_at.into_inner().unwrap().expect("synced");
    let refused = count(&attempts, &Met::Refused);
    let refused_after_sync = attempts
        .iter()
        .filter(|a| a.met == Met::Refused && a.at >= synced_at)
        .count();
    println!(
        "{}: {} attempts, {} connected, {refused} refused ({refused_after_sync} after the endpoint went)",
        mode.name(),
        attempts.len(),
        count(&attempts, &Met::Connected)
    );
    // A rejected SYN whose ICMP answer the kernel could not take (the socket busy in
    // connect()) is retried 1 s later: a client with a short timeout may give up first.
    let unanswered = count(&attempts, &Met::Unanswered);
    assert!(unanswered <= 2, "{attempts:?}");
    assert!(refused >= 10, "the Service rejected new connections");
    assert_eq!(service.escaped().expect("safety counter"), 0);
    // s1 kept its listener open through the drain: none of those came from it.
    let stop = stop_record(&agent, &s1.id);
    println!("drainwatch: {stop:#}");
    assert_eq!(
        stop["loss"]["no_endpoints"].as_u64(),
        Some(refused as u64),
        "no_endpoints = the clients' rejected connects"
    );
    assert_eq!(
        stop["loss"]["refused"].as_u64().unwrap_or(0),
        0,
        "not the pod's refusals"
    );
    let verdict = stop["verdict"].as_str().unwrap_or_default();
    assert!(
        verdict.contains("the Service had no ready endpoints"),
        "{verdict}"
    );
    let rejected = || agent.metric_sum("drainwatch_nat_lookups_total", &[("result", "rejected")]);
    wait_for(
        "the rejections on the metric",
        Duration::from_secs(5),
        || rejected() >= refused as f64,
    );
    assert_eq!(rejected(), refused as f64, "each rejection looked up once");
}

#[test]
fn iptables_mode_a_service_with_no_endpoints_is_counted_apart_on_the_stopping_pod() {
    no_endpoints(ProxyMode::Iptables);
}

#[test]
fn nftables_mode_a_service_with_no_endpoints_is_counted_apart_on_the_stopping_pod() {
    no_endpoints(ProxyMode::Nftables);
}

#[test]
fn iptables_mode_a_stale_rule_to_a_gone_pod_is_unreachable_on_its_stop() {
    stale_rule(ProxyMode::Iptables);
}

#[test]
fn nftables_mode_a_stale_rule_to_a_gone_pod_is_unreachable_on_its_stop() {
    stale_rule(ProxyMode::Nftables);
}

#[test]
fn iptables_mode_removing_the_endpoint_before_sigterm_reads_zero() {
    right_way(ProxyMode::Iptables);
}

#[test]
fn nftables_mode_removing_the_endpoint_before_sigterm_reads_zero() {
    right_way(ProxyMode::Nftables);
}
