//! Start records end to end: real podman containers, the real agent. Ground truth is what the
//! clients saw (their own ECONNREFUSED), HAProxy's own log (503 with termination state `SC`:
//! the server refused the connection) and the kernel's start time of the container's PID 1
//! (`/proc/<pid>/stat`); never drainwatch's own arithmetic.
//!
//! - a slow start (the server listens 3 s after it started) hit directly: every connect
//!   refused before the listen is the start's, and refusals at a port it never listens on
//!   count as refused connects but no start's loss;
//! - a slow start in a pod-like namespace (a holder owns it, as a pod's sandbox does) probed
//!   by a process named `kubelet` (a copy of curl, as the kubelet's httpGet probes are its own
//!   connections) while a client connects: the kubelet's refused probes are `probes.refused`,
//!   the client's refused connects `refused_before_listen`, each exactly;
//! - a server that listens at once, reached only once ready: a start with nothing refused;
//! - a restart in place behind HAProxy (its checks off, so every refused connect is a
//!   request): the refusals of the gap are split between the old run's stop and the new
//!   run's start at the new PID 1's start, and together equal HAProxy's count;
//! - a new slow-starting container put behind HAProxy the way a deploy does (a server slot
//!   set to its address under steady traffic), in drain until its checks pass: HAProxy's
//!   refused checks are probes, not loss; nothing was refused to a user (HAProxy's log), and
//!   the probes equal the RSTs the container's namespace sent (its own `Tcp: OutRsts`,
//!   nothing else connected to it). Not drained: the requests HAProxy's log says it refused
//!   are the start's loss, and the namespace's other RSTs its refused checks.

use std::{
    io::ErrorKind,
    net::{SocketAddr, SocketAddrV4, TcpStream},
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use drainwatch_tests::{
    agent::{Agent, api, sync, wait_for},
    lab::{
        client::{Outcome, RequestRecord, request},
        clock,
        container::{Backend, BackendOpts, BridgeHolder, Mode},
        haproxy::{Haproxy, HaproxyOpts},
    },
    require_root,
};
use serde_json::Value;

/// What a client that connects every 20 ms saw, until `stop` (and past a first success).
#[derive(Debug, Default)]
struct Attempts {
    refused: Vec<Instant>,
    connected: u64,
    other: Vec<String>,
}

fn hammer(addr: SocketAddrV4, stop: Arc<AtomicBool>) -> thread::JoinHandle<Attempts> {
    thread::spawn(move || {
        let mut a = Attempts::default();
        while !stop.load(Ordering::Relaxed) {
            let at = Instant::now();
            match TcpStream::connect_timeout(&SocketAddr::V4(addr), Duration::from_secs(1)) {
                Ok(_) => a.connected += 1,
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => a.refused.push(at),
                Err(e) => a.other.push(e.to_string()),
            }
            thread::sleep(Duration::from_millis(20));
        }
        a
    })
}

/// Requests through `frontend`, one every `gap`, until `stop`: what each one got.
fn steady_requests(
    frontend: SocketAddr,
    gap: Duration,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<Vec<RequestRecord>> {
    thread::spawn(move || {
        let mut records = Vec::new();
        let mut i = 0;
        while !stop.load(Ordering::Relaxed) {
            records.push(request(
                frontend,
                &format!("r{i}"),
                1,
                Duration::from_secs(5),
            ));
            i += 1;
            thread::sleep(gap);
        }
        records
    })
}

/// The container's start record(s), oldest first.
fn starts_of(agent: &Agent, id: &str) -> Vec<Value> {
    let (_, all) = api(agent, "/api/v1/starts");
    let mut mine: Vec<Value> = all
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["container"]["id"] == id)
        .cloned()
        .collect();
    mine.reverse();
    mine
}

/// Waits until the record has settled (10 s after its first listen) and the agent has
/// processed everything before; returns it.
fn settled_start(agent: &Agent, id: &str, n: usize) -> Value {
    wait_for("the start record settles", Duration::from_secs(30), || {
        starts_of(agent, id)
            .get(n)
            .is_some_and(|s| s["settled"] == true)
    });
    sync(agent);
    let s = starts_of(agent, id).swap_remove(n);
    println!("drainwatch: {s:#}");
    s
}

/// The kernel's start time of a process, as kernel monotonic ns (to the clock tick).
fn started_ns(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after_comm = &stat[stat.rfind(')').expect("comm") + 2..];
    let ticks: u64 = after_comm
        .split_whitespace()
        .nth(19)
        .expect("starttime")
        .parse()
        .expect("a number");
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    ticks * (1_000_000_000 / hz)
}

#[test]
fn a_slow_start_is_charged_every_connect_refused_before_it_listened() {
    require_root();
    // The client sends to a container with no network holder: if it exits early, this keeps
    // podman's bridge (and the client's packets) on the machine. Up before the agent: no
    // start of the lab's to tell apart.
    let _bridge = BridgeHolder::start("slow");
    let agent = Agent::start(&[]);
    sync(&agent);
    // Its own network namespace: its first refusals come before any scan knows it.
    let opts = BackendOpts {
        netns_holder: false,
        listen_delay: Some(Duration::from_secs(3)),
        ready_timeout: Duration::from_secs(20),
        ..Default::default()
    };
    let mut b = Backend::launch("slow", Mode::CloseListener, opts);
    b.require_route();
    let stop = Arc::new(AtomicBool::new(false));
    let served = hammer(b.addr(), stop.clone());
    // A port nothing ever listens on: refused, counted, no start's loss.
    let elsewhere = hammer(SocketAddrV4::new(*b.addr().ip(), 9999), stop.clone());
    b.await_ready(Instant::now() + Duration::from_secs(20));
    thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let (served, elsewhere) = (served.join().unwrap(), elsewhere.join().unwrap());
    println!(
        "client: {} refused then {} connected ({:?}); port 9999: {} refused",
        served.refused.len(),
        served.connected,
        served.other,
        elsewhere.refused.len()
    );
    assert!(
        served.refused.len() >= 20,
        "the 3 s before the listen were hit"
    );
    assert!(served.connected > 0 && elsewhere.connected == 0);

    let s = settled_start(&agent, &b.id, 0);
    assert_eq!(
        s["loss"]["refused_before_listen"],
        served.refused.len() as u64,
        "every connect the client saw refused before the listen"
    );
    assert_eq!(s["loss"]["probes"]["refused"], 0);
    assert_eq!(s["restart"], false);
    assert_eq!(s["ports"], serde_json::json!([8080]));
    let after = s["listen_after_seconds"].as_f64().expect("listened");
    assert!(
        (2.9..4.0).contains(&after),
        "listened {after} s after the start"
    );
    let verdict = s["verdict"].as_str().unwrap_or_default();
    assert!(
        verdict.contains("refused in the") && verdict.contains("make readiness check the listener"),
        "{verdict}"
    );
    assert_eq!(
        agent.metric_sum(
            "drainwatch_start_refused_before_listen_total",
            &[("container", &b.container)]
        ),
        served.refused.len() as f64
    );
    assert_eq!(
        agent.metric_sum(
            "drainwatch_refused_connections_total",
            &[("container", &b.container)]
        ),
        (served.refused.len() + elsewhere.refused.len()) as f64,
        "every refused connect, at any port"
    );
    let (_, deploys) = api(&agent, "/api/v1/deploys");
    assert!(
        deploys
            .as_array()
            .into_iter()
            .flatten()
            .any(|d| d["starts"].as_array().is_some_and(|x| x.contains(&s["id"]))),
        "the start is in a deploy: {deploys:#}"
    );
}

/// A process named `kubelet` probing `url` every 150 ms until `stop`: how many of its probes
/// were refused (curl's exit 7 at once: the SYN was answered with RST), and how many answered.
fn kubelet(url: String, stop: Arc<AtomicBool>) -> thread::JoinHandle<(u64, u64, Vec<String>)> {
    let dir = std::env::temp_dir().join(format!("dw-kubelet-starts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let bin = dir.join("kubelet");
    std::fs::copy("/usr/bin/curl", &bin).expect("curl, copied as the kubelet");
    thread::spawn(move || {
        let (mut refused, mut ok, mut other) = (0, 0, Vec::new());
        while !stop.load(Ordering::Relaxed) {
            let out = Command::new(&bin)
                .args(["-sS", "-o", "/dev/null", "-m", "1", &url])
                .output()
                .expect("run the kubelet");
            match out.status.code() {
                Some(0) => ok += 1,
                Some(7) => refused += 1,
                _ => other.push(String::from_utf8_lossy(&out.stderr).to_string()),
            }
            thread::sleep(Duration::from_millis(150));
        }
        (refused, ok, other)
    })
}

#[test]
fn the_kubelets_probes_refused_while_starting_are_apart_from_the_requests() {
    require_root();
    let agent = Agent::start(&[]);
    sync(&agent);
    let opts = BackendOpts {
        listen_delay: Some(Duration::from_secs(3)),
        ready_timeout: Duration::from_secs(20),
        ..Default::default()
    };
    let mut b = Backend::launch("probed", Mode::CloseListener, opts);
    // The pod's address known to the agent first (its sandbox's), as on a node, so that the
    // kubelet's connects are seen as connects to a container.
    let holder = format!("container=\"{}\"", b.holder.clone().expect("a holder"));
    wait_for(
        "the agent follows the sandbox",
        Duration::from_secs(5),
        || agent.metrics_text().contains(&holder),
    );
    b.require_route();
    let stop = Arc::new(AtomicBool::new(false));
    let probes = kubelet(format!("http://{}/health", b.addr()), stop.clone());
    let served = hammer(b.addr(), stop.clone());
    b.await_ready(Instant::now() + Duration::from_secs(20));
    thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let ((probe_refused, probe_ok, probe_other), served) =
        (probes.join().unwrap(), served.join().unwrap());
    println!(
        "kubelet: {probe_refused} refused, {probe_ok} answered, {probe_other:?}; client: {} refused",
        served.refused.len()
    );
    assert!(
        probe_refused >= 10 && probe_ok > 0,
        "probed before and after the listen"
    );
    let s = settled_start(&agent, &b.id, 0);
    assert_eq!(
        (
            s["loss"]["refused_before_listen"].as_u64(),
            s["loss"]["probes"]["refused"].as_u64()
        ),
        (Some(served.refused.len() as u64), Some(probe_refused)),
        "requests and health checks, each by its own side's count"
    );
}

#[test]
fn a_server_that_listens_at_once_has_a_start_with_nothing_refused() {
    require_root();
    let agent = Agent::start(&[]);
    sync(&agent);
    let b = Backend::start("quick", Mode::CloseListener, BackendOpts::default());
    let started = started_ns(b.init_pid);
    let s = settled_start(&agent, &b.id, 0);
    assert_eq!(s["loss"]["refused_before_listen"], 0);
    assert!(
        !s["first_accept_at"].is_null(),
        "the readiness GET was accepted"
    );
    let after = s["listen_after_seconds"].as_f64().expect("listened");
    assert!(after < 2.0, "listened {after} s after the start");
    let verdict = s["verdict"].as_str().unwrap_or_default();
    assert!(verdict.ends_with("no change needed"), "{verdict}");
    // Its start is the kernel's start of PID 1, to the clock tick.
    let at = drainwatch_tests::agent::instant(&s["started_at"]).expect("started_at");
    let kernel = clock::instant_of_mono_ns(started);
    assert!(clock::secs_since(kernel, at).abs() < 0.02, "started_at");
}

#[test]
fn a_restart_in_place_behind_haproxy_charges_its_gap_to_the_stop_and_the_start() {
    require_root();
    let agent = Agent::start(&[]);
    let opts = BackendOpts {
        listen_delay: Some(Duration::from_secs(2)),
        ready_timeout: Duration::from_secs(20),
        ..Default::default()
    };
    let mut b = Backend::start("s1", Mode::CloseListener, opts);
    let lb = Haproxy::start(&[("s1", b.addr())], HaproxyOpts::default());
    // No health checks from here on: every connect HAProxy makes is a request.
    lb.admin("disable health be/s1").expect("disable health");
    sync(&agent);

    let stop = Arc::new(AtomicBool::new(false));
    let load = steady_requests(lb.frontend, Duration::from_millis(20), stop.clone());
    thread::sleep(Duration::from_millis(500));
    b.restart(2, Duration::from_secs(20));
    let new_start = started_ns(b.init_pid);
    thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let records = load.join().unwrap();
    let refused: Vec<_> = records.iter().filter(|r| r.status == Some(503)).collect();
    let logged_sc = lb
        .http_logs()
        .iter()
        .filter(|l| l.status == 503 && l.flags.starts_with("SC"))
        .count();
    println!(
        "client: {} requests, {} 503; HAProxy: {logged_sc} refused by the server",
        records.len(),
        refused.len()
    );
    assert_eq!(refused.len(), logged_sc, "every 503 was a refused connect");
    assert!(
        records
            .iter()
            .all(|r| r.status == Some(503) || r.outcome == Outcome::from_status(200)),
        "nothing else failed"
    );
    // The kernel's start of the new PID 1 splits them, to its clock tick (10 ms).
    let boundary = clock::instant_of_mono_ns(new_start);
    let tick = Duration::from_millis(10);
    let after_start = refused
        .iter()
        .filter(|r| r.start >= boundary + tick)
        .count();
    let around = refused
        .iter()
        .filter(|r| r.start + tick > boundary && r.start < boundary + tick)
        .count();
    assert!(after_start >= 20, "the 2 s before the new listen were hit");

    // Its first start (nothing was sent to it before it was ready), then the restart's.
    let first = settled_start(&agent, &b.id, 0);
    assert_eq!(
        (&first["restart"], &first["loss"]["refused_before_listen"]),
        (&Value::Bool(false), &Value::from(0))
    );
    let s = settled_start(&agent, &b.id, 1);
    assert_eq!(s["restart"], true);
    let stop_record = drainwatch_tests::agent::stop_record(&agent, &b.id);
    let (start_n, stop_n) = (
        s["loss"]["refused_before_listen"].as_u64().unwrap(),
        stop_record["loss"]["refused"].as_u64().unwrap(),
    );
    println!(
        "drainwatch: stop refused {stop_n}, start refused before listen {start_n}; truth: \
         {after_start} after the new PID 1 started, {around} within a tick of it"
    );
    assert_eq!(
        start_n + stop_n,
        logged_sc as u64,
        "each refused connect counted once"
    );
    assert!(
        (after_start..=after_start + around).contains(&(start_n as usize)),
        "the start's are those after its PID 1 started ({after_start}, {around} within a tick)"
    );
}

/// One field of the `Tcp:` line of a process's namespace (`/proc/<pid>/net/snmp`).
fn snmp_tcp(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/snmp")).expect("read net/snmp");
    let mut tcp = text.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next().expect("names"), tcp.next().expect("values"));
    let i = names
        .split_whitespace()
        .position(|n| n == field)
        .expect("field");
    values
        .split_whitespace()
        .nth(i)
        .and_then(|v| v.parse().ok())
        .expect("a count")
}

/// What a deploy of a new slow-starting server behind HAProxy showed: a server slot set to the
/// new container's address (in drain first, when `drained`), under steady traffic.
struct NewServer {
    agent: Agent,
    /// Still checking s2: its checks once it listens teach their schedule.
    _lb: Haproxy,
    s2: Backend,
    records: Vec<RequestRecord>,
    /// Requests HAProxy's log says s2 refused (`503`, `SC`).
    refused_requests: usize,
    /// RSTs s2's namespace sent before it was ready: its refused connects, all of them.
    rsts: u64,
    /// Keeps podman's bridge up after s1 goes: s2 has no network holder, and HAProxy still
    /// checks both slots. Last: field order is drop order.
    _bridge: BridgeHolder,
}

fn new_server_behind_haproxy(drained: bool) -> NewServer {
    let bridge = BridgeHolder::start("new-server");
    let agent = Agent::start(&[]);
    let s1 = Backend::start("s1", Mode::CloseListener, BackendOpts::default());
    // The new server's slot, on s1 until the deploy sets it.
    let lb = Haproxy::start(
        &[("s1", s1.addr()), ("s2", s1.addr())],
        HaproxyOpts {
            inter: Duration::from_secs(1),
            ..Default::default()
        },
    );
    sync(&agent);
    let stop = Arc::new(AtomicBool::new(false));
    let load = steady_requests(lb.frontend, Duration::from_millis(30), stop.clone());
    // The deploy: (no new traffic to the slot,) its new container's address, traffic once
    // its checks pass.
    if drained {
        lb.admin("set server be/s2 state drain").expect("drain");
    }
    thread::sleep(Duration::from_millis(300));
    let opts = BackendOpts {
        netns_holder: false,
        listen_delay: Some(Duration::from_secs(4)),
        ready_timeout: Duration::from_secs(20),
        ..Default::default()
    };
    let mut s2 = Backend::launch("s2", Mode::CloseListener, opts);
    s2.require_route();
    let set = format!("set server be/s2 addr {} port {}", s2.ip, s2.port);
    lb.admin(&set).expect("set addr");
    s2.await_ready(Instant::now() + Duration::from_secs(20));
    let deadline = Instant::now() + Duration::from_secs(20);
    let full = lb.opts.rise + lb.opts.fall - 1;
    let ip = s2.ip.to_string();
    while !lb
        .servers_state()
        .iter()
        .any(|s| s.name == "s2" && s.addr == ip && s.op_state == 2 && s.check_health == full)
    {
        assert!(Instant::now() < deadline, "s2's checks never passed");
        thread::sleep(Duration::from_millis(100));
    }
    let rsts = snmp_tcp(s2.pid, "OutRsts");
    lb.admin("set server be/s2 state ready").expect("ready");
    thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    let records = load.join().unwrap();
    let logs = lb.http_logs();
    let refused_requests = logs
        .iter()
        .filter(|l| l.server == "s2" && l.status == 503 && l.flags.starts_with("SC"))
        .count();
    let failed = records.iter().filter(|r| r.status != Some(200)).count();
    println!(
        "client: {} requests, {failed} failed; HAProxy: {} to s2, {refused_requests} refused \
         by it; s2's namespace sent {rsts} RSTs before it was ready",
        records.len(),
        logs.iter().filter(|l| l.server == "s2").count(),
    );
    assert_eq!(
        failed, refused_requests,
        "every error was a refused request"
    );
    assert!(rsts >= 3, "HAProxy checked s2 before it listened");
    NewServer {
        agent,
        _lb: lb,
        s2,
        records,
        refused_requests,
        rsts,
        _bridge: bridge,
    }
}

#[test]
fn a_new_container_haproxy_checks_before_it_listens_has_probes_refused_and_no_loss() {
    require_root();
    let n = new_server_behind_haproxy(true);
    assert_eq!(n.refused_requests, 0, "drained: nothing was routed to it");
    let s = settled_start(&n.agent, &n.s2.id, 0);
    assert_eq!(
        (
            s["loss"]["refused_before_listen"].as_u64(),
            s["loss"]["probes"]["refused"].as_u64()
        ),
        (Some(0), Some(n.rsts)),
        "every refused connect was a check: the namespace's own RST count"
    );
    let verdict = s["verdict"].as_str().unwrap_or_default();
    assert!(
        verdict.contains("nothing refused: no change needed")
            && verdict.contains(&format!("{} health checks refused", n.rsts)),
        "{verdict}"
    );
}

#[test]
fn a_new_container_haproxy_routes_to_before_it_listens_is_charged_the_refused_requests() {
    require_root();
    let n = new_server_behind_haproxy(false);
    assert!(
        n.refused_requests >= 5,
        "routed to before it listened: {} of {} requests refused",
        n.refused_requests,
        n.records.len()
    );
    let s = settled_start(&n.agent, &n.s2.id, 0);
    let requests = s["loss"]["refused_before_listen"].as_u64().unwrap();
    let probes = s["loss"]["probes"]["refused"].as_u64().unwrap();
    assert_eq!(
        (requests, probes),
        (
            n.refused_requests as u64,
            n.rsts - n.refused_requests as u64
        ),
        "requests by HAProxy's log, checks the rest of the namespace's own RSTs"
    );
    let verdict = s["verdict"].as_str().unwrap_or_default();
    assert!(
        verdict.starts_with(&format!("{requests} connections refused in the")),
        "{verdict}"
    );
}
