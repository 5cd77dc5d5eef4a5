//! Connections through a Kubernetes Service's virtual IP, with kube-proxy's own rule structures
//! in both modes (iptables and nftables; `lab::service`): the client's socket names the
//! virtual IP, which no container has, and conntrack's DNAT decides which pod it reaches.
//!
//! The real agent, real podman containers as the Service's two endpoints, clients on the node
//! (kube-proxy's OUTPUT hooks) or in a client pod (`lab::pod_client`: DNATed in PREROUTING,
//! rejected in FORWARD) on a fixed beat. Ground truth: each attempt's or request's own outcome
//! and time, the server's own log, the endpoints' DNAT rule counters, and the safety table's
//! drop counter (nothing may escape NAT).
//!
//! - **A stale rule**: s1 drains and exits (its address goes with it) while kube-proxy still
//!   sends new connections to it (endpoint propagation lag): every attempt DNATed there after
//!   its exit goes unanswered, counted on s1's stop as unreachable and dated at its SYN.
//! - **The listener closed at SIGTERM, the endpoint removed 3 s later**: every attempt DNATed
//!   to s1 meanwhile is refused by s1's own namespace (its sandbox keeps the address): refused
//!   on its stop, never a no-endpoint reject.
//! - **No handler, requests in flight**: s1 dies at SIGTERM mid-request; the requests the
//!   server started and never finished are its in-flight cuts, the connects routed to it until
//!   the endpoint goes its refusals.
//! - **The right way**: the endpoint removed first, then SIGTERM: no loss, no bad verdict.
//! - **No endpoints** (a one-replica Recreate rollout): the pod's endpoint goes at SIGTERM and
//!   nothing replaces it; kube-proxy rejects every new connection (ICMP port unreachable, the
//!   client's ECONNREFUSED, no RST): counted on the stopping pod as `no_endpoints`, apart
//!   from its refusals, and the verdict says the Service had no endpoints.

use std::{
    net::{SocketAddr, SocketAddrV4},
    thread,
    time::{Duration, Instant},
};

use drainwatch_tests::{
    agent::{Agent, api, current_stop, instant, stop_record, sync, wait_for},
    lab::{
        client::{Outcome, RequestRecord, request},
        clock::{secs_since, sleep_until},
        connect::{Attempt, Met, attempt, count, unclassified},
        container::{Backend, BackendOpts, BridgeHolder, Mode},
        net::require_bridge_route,
        pod_client::PodClient,
        service::{ProxyMode, Service, VIP_RANGE},
    },
    snmp_icmp,
};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const BEAT: Duration = Duration::from_millis(100);
/// kubeadm's default Service CIDR holds it; the lab routes it onto its bridge only.
const VIP: &str = "10.96.0.10:80";

/// Where the clients run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Clients {
    /// On the node, in its namespace: kube-proxy's OUTPUT hooks.
    Node,
    /// In a pod routed through the host: its PREROUTING and FORWARD hooks.
    Pod,
}

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

/// `each(i)` on a fixed beat, each on a thread of its own (in `pod`'s namespace when given),
/// while `stop` runs, until `after` past its end.
fn during<T: Send>(
    pod: Option<&PodClient>,
    bridge_ip: SocketAddrV4,
    stop: impl FnOnce() + Send,
    after: Duration,
    each: impl Fn(usize) -> T + Sync,
) -> Vec<T> {
    let each = &each;
    thread::scope(|scope| {
        let stopping = scope.spawn(stop);
        let mut running = Vec::new();
        let mut next = Instant::now();
        let mut done_at: Option<Instant> = None;
        for i in 0..400 {
            if done_at.is_some_and(|d| next > d + after) {
                break;
            }
            sleep_until(next);
            // The endpoints' bridge must still route, or nothing is sent.
            if let Err(e) = require_bridge_route((*bridge_ip.ip()).into()) {
                panic!("lab: refusing to send: {e}");
            }
            running.push(scope.spawn(move || {
                if let Some(p) = pod {
                    p.enter();
                }
                each(i)
            }));
            next += BEAT;
            if done_at.is_none() && stopping.is_finished() {
                done_at = Some(Instant::now());
            }
        }
        assert!(done_at.is_some(), "the stop did not end within 400 beats");
        stopping.join().expect("stop thread");
        running
            .into_iter()
            .map(|h| h.join().expect("client thread"))
            .collect()
    })
}

/// The agent, s1 and s2 behind the Service, which the agent knows; a client pod for
/// [`Clients::Pod`].
struct Lab {
    agent: Agent,
    s1: Backend,
    s2: Backend,
    service: Service,
    vip: SocketAddrV4,
    pod: Option<PodClient>,
    /// Keeps the bridge up while anything may still send (bound first, never `..`: dropped
    /// last).
    _bridge: BridgeHolder,
}

impl Lab {
    fn two_endpoints(mode: ProxyMode, clients: Clients, s1_mode: Mode, s1: BackendOpts) -> Lab {
        let bridge_holder = BridgeHolder::start("svc");
        let agent = Agent::start(&[]);
        let s1 = Backend::start("s1", s1_mode, s1);
        let s2 = Backend::start("s2", Mode::Drain, BackendOpts::default());
        let bridge = require_bridge_route((*s1.addr().ip()).into()).expect("s1 on the bridge");
        let vip: SocketAddrV4 = VIP.parse().unwrap();
        let service = Service::install(mode, vip, &bridge, &[s1.addr(), s2.addr()])
            .unwrap_or_else(|e| panic!("installing the Service ({}): {e}", mode.name()));
        let pod = client_pod(clients);
        known(&agent, &s1.id);
        sync(&agent);
        Lab {
            agent,
            s1,
            s2,
            service,
            vip,
            pod,
            _bridge: bridge_holder,
        }
    }

    /// Attempts to the virtual IP while `stop` runs, until `after` past its end.
    fn attempts_during(&self, stop: impl FnOnce() + Send, after: Duration) -> Vec<Attempt> {
        let vip = self.vip;
        during(self.pod.as_ref(), self.s2.addr(), stop, after, |_| {
            attempt(vip, CONNECT_TIMEOUT)
        })
    }
}

fn client_pod(clients: Clients) -> Option<PodClient> {
    (clients == Clients::Pod)
        .then(|| PodClient::create(VIP_RANGE).unwrap_or_else(|e| panic!("the client pod: {e}")))
}

fn stale_rule(mode: ProxyMode, clients: Clients) {
    let lab = Lab::two_endpoints(mode, clients, Mode::Drain, BackendOpts::gone_after_drain());
    let attempts = lab.attempts_during(
        || {
            thread::sleep(Duration::from_millis(500));
            lab.s1.stop(10);
        },
        Duration::from_secs(2),
    );
    let Lab {
        agent,
        s1,
        s2,
        service,
        ..
    } = &lab;
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
        "{} ({clients:?} clients): {} attempts: {} connected, {refused} refused, {unanswered} unanswered; DNAT: {to_s1} to s1, {to_s2} to s2",
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

    stop_record(agent, &s1.id);
    sync(agent);
    let stop = current_stop(agent, &s1.id).expect("s1's stop record");
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
    routing_lag_is_the_last_syn(&stop, last_syn);
    // The metric follows the pipeline's counts once a second.
    let translated =
        || agent.metric_sum("drainwatch_nat_lookups_total", &[("result", "translated")]);
    wait_for("the lookups on the metric", Duration::from_secs(5), || {
        translated() >= unanswered as f64
    });
}

/// The record's routing lag is SIGTERM to `last_syn`, the last attempt routed to the pod.
fn routing_lag_is_the_last_syn(stop: &serde_json::Value, last_syn: Instant) {
    let term = instant(&stop["sigterm_at"]).expect("sigterm_at");
    let lag = stop["routing_lag_seconds"].as_f64().expect("routing lag");
    let truth = secs_since(term, last_syn);
    println!("routing lag {lag:.3} s; the last SYN routed to s1 {truth:.3} s after SIGTERM");
    assert!(
        (lag - truth).abs() < 0.05,
        "routing lag {lag:.3} s vs the last SYN to s1 {truth:.3} s after SIGTERM"
    );
}

/// The kubelet's SIGTERM to s1, and kube-proxy's sync without it `lag` later (endpoint
/// propagation), `before_sync` just before; returns once s1 has exited and the sync is done.
fn sigterm_then_sync(
    s1: &Backend,
    service: &mut Service,
    keep: SocketAddrV4,
    lag: Duration,
    before_sync: impl FnOnce(&Service),
) {
    thread::scope(|scope| {
        scope.spawn(|| s1.stop(10));
        thread::sleep(lag);
        before_sync(service);
        service.sync(&[keep]).expect("sync without s1");
    });
}

/// s1 closes its listener at SIGTERM and exits (its sandbox keeps the address); its endpoint
/// goes 3 s later: every attempt DNATed to it meanwhile meets its namespace's RST.
fn listener_closed(mode: ProxyMode, clients: Clients) {
    let mut lab = Lab::two_endpoints(mode, clients, Mode::CloseListener, BackendOpts::default());
    let s2_addr = lab.s2.addr();
    let (s1, service) = (&lab.s1, &mut lab.service);
    let to_s1 = std::sync::Mutex::new(0);
    let stop = || {
        thread::sleep(Duration::from_millis(500));
        sigterm_then_sync(s1, service, s2_addr, Duration::from_secs(3), |service| {
            // s1's DNAT rule goes with its endpoint.
            *to_s1.lock().unwrap() = service.dnat_count(s1.addr()).expect("s1's DNAT counter");
        });
    };
    let vip = lab.vip;
    let attempts = during(
        lab.pod.as_ref(),
        s2_addr,
        stop,
        Duration::from_secs(1),
        |_| attempt(vip, CONNECT_TIMEOUT),
    );
    let Lab {
        agent, s1, service, ..
    } = &lab;
    assert_eq!(s1.exit_code(), 0, "s1 closed its listener and exited 0");
    let others = unclassified(&attempts);
    assert!(
        others.is_empty(),
        "attempts the lab cannot classify: {others:?}"
    );
    let refused = count(&attempts, &Met::Refused);
    let unanswered = count(&attempts, &Met::Unanswered);
    let to_s1 = to_s1.into_inner().unwrap();
    println!(
        "{} ({clients:?} clients): {} attempts: {} connected, {refused} refused, {unanswered} unanswered; {to_s1} DNATed to s1",
        mode.name(),
        attempts.len(),
        count(&attempts, &Met::Connected)
    );
    assert_eq!(service.escaped().expect("safety counter"), 0);
    assert_eq!(unanswered, 0, "s1's address stayed: {attempts:?}");
    assert!(
        refused >= 5,
        "attempts DNATed to s1 after its listener closed"
    );
    assert!(to_s1 >= refused as u64, "every refused attempt went to s1");
    let last_syn = attempts
        .iter()
        .filter(|a| a.met == Met::Refused)
        .map(|a| a.at)
        .max()
        .expect("refused attempts");

    let stop = stop_record(agent, &s1.id);
    println!("drainwatch: {stop:#}");
    assert_eq!(
        stop["loss"]["refused"].as_u64(),
        Some(refused as u64),
        "refused = the clients' refused connects through the virtual IP"
    );
    for kind in ["no_endpoints", "unreachable", "inflight_cut"] {
        assert_eq!(
            stop["loss"][kind].as_u64().unwrap_or(0),
            0,
            "{kind}: {stop:#}"
        );
    }
    routing_lag_is_the_last_syn(&stop, last_syn);
    let verdict = stop["verdict"].as_str().unwrap_or_default();
    assert!(!verdict.contains("no ready endpoints"), "{verdict}");
}

/// What a request through the virtual IP met, by the client's own record.
fn cut(r: &RequestRecord) -> bool {
    matches!(&r.outcome, Outcome::Error(e) if !e.starts_with("connect:"))
}

fn refused_request(r: &RequestRecord) -> bool {
    matches!(&r.outcome, Outcome::Error(e) if e.starts_with("connect:") && e.contains("refused"))
}

/// s1 has no SIGTERM handler and dies mid-request; its endpoint goes 1 s later. The server's
/// own log says which requests it started and never finished.
fn no_handler(mode: ProxyMode, clients: Clients) {
    let mut lab = Lab::two_endpoints(mode, clients, Mode::NoHandler, BackendOpts::default());
    let s2_addr = lab.s2.addr();
    let (s1, service) = (&lab.s1, &mut lab.service);
    let stop = || {
        thread::sleep(Duration::from_millis(2000));
        sigterm_then_sync(s1, service, s2_addr, Duration::from_secs(1), |_| {});
    };
    let vip = SocketAddr::V4(lab.vip);
    let tag = format!("vip{}", std::process::id());
    let records = during(
        lab.pod.as_ref(),
        s2_addr,
        stop,
        Duration::from_secs(1),
        |i| request(vip, &format!("{tag}-{i}"), 1500, Duration::from_secs(8)),
    );
    let Lab {
        agent, s1, service, ..
    } = &lab;
    assert_eq!(s1.exit_code(), 143, "s1 died of SIGTERM");
    let (ok, cuts, refused) = (
        records.iter().filter(|r| r.outcome == Outcome::Ok).count(),
        records.iter().filter(|r| cut(r)).count(),
        records.iter().filter(|r| refused_request(r)).count(),
    );
    println!(
        "{} ({clients:?} clients): {} requests: {ok} ok, {cuts} cut, {refused} refused",
        mode.name(),
        records.len()
    );
    let odd: Vec<_> = records
        .iter()
        .filter(|r| r.outcome != Outcome::Ok && !cut(r) && !refused_request(r))
        .collect();
    assert!(odd.is_empty(), "requests the lab cannot classify: {odd:?}");
    assert_eq!(service.escaped().expect("safety counter"), 0);
    // The server's own log: the requests it started and never finished are the cuts.
    let log = s1.work_log();
    let unfinished: Vec<&str> = log
        .iter()
        .filter(|w| w.started && !log.iter().any(|e| !e.started && e.id == w.id))
        .map(|w| w.id.as_str())
        .collect();
    let mut cut_ids: Vec<&str> = records
        .iter()
        .filter(|r| cut(r))
        .map(|r| r.id.as_str())
        .collect();
    cut_ids.sort_unstable();
    let mut unfinished = unfinished;
    unfinished.sort_unstable();
    assert_eq!(
        cut_ids, unfinished,
        "the clients' cuts are the server's unfinished requests"
    );
    assert!(cuts >= 3, "requests in flight on s1 at SIGTERM");

    let stop = stop_record(agent, &s1.id);
    println!("drainwatch: {stop:#}");
    assert_eq!(
        stop["loss"]["inflight_cut"].as_u64(),
        Some(cuts as u64),
        "inflight_cut = the requests s1 started and never finished"
    );
    assert_eq!(
        stop["loss"]["refused"].as_u64().unwrap_or(0),
        refused as u64,
        "refused = the clients' refused connects"
    );
    for kind in ["no_endpoints", "unreachable"] {
        assert_eq!(
            stop["loss"][kind].as_u64().unwrap_or(0),
            0,
            "{kind}: {stop:#}"
        );
    }
}

fn right_way(mode: ProxyMode) {
    let mut lab = Lab::two_endpoints(
        mode,
        Clients::Node,
        Mode::Drain,
        BackendOpts::gone_after_drain(),
    );
    let s2_addr = lab.s2.addr();
    let (s1, service) = (&lab.s1, &mut lab.service);
    let stop = || {
        thread::sleep(Duration::from_millis(500));
        // The EndpointSlice drops s1, kube-proxy syncs, then the kubelet's SIGTERM.
        service.sync(&[s2_addr]).expect("sync without s1");
        thread::sleep(Duration::from_millis(500));
        s1.stop(10);
    };
    let vip = lab.vip;
    let attempts = during(None, s2_addr, stop, Duration::from_secs(1), |_| {
        attempt(vip, CONNECT_TIMEOUT)
    });
    let Lab {
        agent, s1, service, ..
    } = &lab;
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
    let stop = stop_record(agent, &s1.id);
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

fn no_endpoints(mode: ProxyMode, clients: Clients) {
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
    let pod = client_pod(clients);
    known(&agent, &s1.id);
    // Connections the Service served while it had its pod (conntrack keeps them, closed,
    // for 120 s): what names the pod a later rejection was for.
    let served = during(
        pod.as_ref(),
        s1.addr(),
        || {},
        Duration::ZERO,
        |_| {
            (0..3)
                .map(|_| attempt(vip, CONNECT_TIMEOUT).met)
                .collect::<Vec<_>>()
        },
    );
    assert!(
        served.iter().flatten().all(|m| *m == Met::Connected),
        "the Service serves: {served:?}"
    );
    sync(&agent);
    let service_ref = &mut service;
    let synced_at = std::sync::Mutex::new(None);
    // The node's ICMP errors it did not send, over its rate limit per peer.
    let limited = || snmp_icmp(1, "OutRateLimitHost");
    let limited_before = limited();
    let attempts = during(
        pod.as_ref(),
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
        |_| attempt(vip, CONNECT_TIMEOUT),
    );
    let synced_at = synced_at.into_inner().unwrap().expect("synced");
    let refused = count(&attempts, &Met::Refused);
    let refused_after_sync = attempts
        .iter()
        .filter(|a| a.met == Met::Refused && a.at >= synced_at)
        .count();
    println!(
        "{} ({clients:?} clients): {} attempts, {} connected, {refused} refused ({refused_after_sync} after the endpoint went)",
        mode.name(),
        attempts.len(),
        count(&attempts, &Met::Connected)
    );
    // Every attempt that failed was rejected: s1 kept its listener open through its drain.
    // A node-local client's rejected SYN whose ICMP answer its socket could not take (busy in
    // connect()) is retried 1 s later, and one with a short timeout may give up first; a
    // pod's meet the node's ICMP rate limit (a burst of 6, then one a second per peer), and
    // most go unanswered.
    let unanswered = count(&attempts, &Met::Unanswered);
    let rejects = service.rejected_syns().expect("the reject's counter");
    println!("{unanswered} unanswered; the reject rule answered {rejects} SYNs");
    if clients == Clients::Node {
        assert!(unanswered <= 2, "{attempts:?}");
    }
    let failed = refused + unanswered;
    let limited = limited() - limited_before;
    println!("the node rate-limited {limited} ICMP errors (all peers)");
    assert!(
        limited >= rejects - refused as u64,
        "every rejected SYN but the refused attempts' had its ICMP answer rate-limited"
    );
    assert!(failed >= 10, "the Service rejected new connections");
    assert!(
        rejects >= failed as u64,
        "every failed attempt met the reject"
    );
    assert!(unclassified(&attempts).is_empty(), "{attempts:?}");
    assert_eq!(service.escaped().expect("safety counter"), 0);
    let stop = stop_record(&agent, &s1.id);
    println!("drainwatch: {stop:#}");
    assert_eq!(
        stop["loss"]["no_endpoints"].as_u64(),
        Some(failed as u64),
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
        || rejected() >= failed as f64,
    );
    assert_eq!(rejected(), failed as f64, "each rejection looked up once");
}

#[test]
fn iptables_mode_a_service_with_no_endpoints_is_counted_apart_on_the_stopping_pod() {
    no_endpoints(ProxyMode::Iptables, Clients::Node);
}

#[test]
fn nftables_mode_a_service_with_no_endpoints_is_counted_apart_on_the_stopping_pod() {
    no_endpoints(ProxyMode::Nftables, Clients::Node);
}

#[test]
fn iptables_mode_a_pods_connects_rejected_in_forward_are_no_endpoints() {
    no_endpoints(ProxyMode::Iptables, Clients::Pod);
}

#[test]
fn nftables_mode_a_pods_connects_rejected_in_forward_are_no_endpoints() {
    no_endpoints(ProxyMode::Nftables, Clients::Pod);
}

#[test]
fn iptables_mode_a_stale_rule_to_a_gone_pod_is_unreachable_on_its_stop() {
    stale_rule(ProxyMode::Iptables, Clients::Node);
}

#[test]
fn nftables_mode_a_stale_rule_to_a_gone_pod_is_unreachable_on_its_stop() {
    stale_rule(ProxyMode::Nftables, Clients::Node);
}

#[test]
fn iptables_mode_a_pods_attempts_forwarded_to_a_gone_pod_are_unreachable() {
    stale_rule(ProxyMode::Iptables, Clients::Pod);
}

#[test]
fn nftables_mode_a_pods_attempts_forwarded_to_a_gone_pod_are_unreachable() {
    stale_rule(ProxyMode::Nftables, Clients::Pod);
}

#[test]
fn iptables_mode_a_listener_closed_3_s_before_its_endpoint_went_is_refused() {
    listener_closed(ProxyMode::Iptables, Clients::Node);
}

#[test]
fn nftables_mode_a_pods_connects_to_a_closed_listener_are_refused() {
    listener_closed(ProxyMode::Nftables, Clients::Pod);
}

#[test]
fn iptables_mode_no_handler_cuts_the_requests_in_flight_through_the_virtual_ip() {
    no_handler(ProxyMode::Iptables, Clients::Node);
}

#[test]
fn nftables_mode_no_handler_cuts_a_pods_requests_in_flight() {
    no_handler(ProxyMode::Nftables, Clients::Pod);
}

#[test]
fn iptables_mode_removing_the_endpoint_before_sigterm_reads_zero() {
    right_way(ProxyMode::Iptables);
}

#[test]
fn nftables_mode_removing_the_endpoint_before_sigterm_reads_zero() {
    right_way(ProxyMode::Nftables);
}
