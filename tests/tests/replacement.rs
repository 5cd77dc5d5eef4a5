//! A replacement at the same address whose network namespace reused the stopped container's
//! inode, end to end: the real agent, real podman containers of one workload (a socket service,
//! `backend.py --mode gate`, each in a namespace of its own), a fleet of persistent clients in
//! this process. The old container is stopped and removed and the new one started at its
//! address, listening 2 s after it started, in a namespace that got the old one's inode (the
//! kernel gives a freed namespace's inode to the next one made: checked on `/proc/<pid>/ns/net`
//! of both; the lab makes the namespace as netavark does, once the old one is freed, which
//! podman's own would race). Meanwhile the clients close their old connections late (their
//! FINs reach the new namespace, which answers with RST), 60 of them reconnect at once and are
//! refused until the new server listens, the other 40 come back 5 s after it listened: one
//! return with a pause in it, into a small backlog that overflows.
//!
//! Ground truth, none of it drainwatch's: the clients' own ECONNREFUSED count, whether each
//! late FIN was answered with RST (`SO_ERROR` ECONNRESET once the socket closed), when each
//! was greeted again, and the new namespace's own counters (`Tcp: OutRsts`, `TcpExt:
//! ListenOverflows`, both from 0: the namespace is new). The old namespace sent no RST: every
//! client saw its old connection end with EOF, a late FIN reaching it while it lived would
//! have been acknowledged, and its orphaned sockets gave up their FINs silently.

use std::{
    io::{BufRead, BufReader, ErrorKind},
    net::{Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpStream},
    os::unix::fs::MetadataExt,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use drainwatch_tests::{
    agent::{Agent, api, metric_sum, sync, wait_for},
    lab::{
        container::{Backend, BackendOpts, BridgeHolder, Mode, podman, unique_name},
        net::{ip as ip_cmd, require_bridge_route},
        storm::{COMPOSE_SERVICE, tcp_ext},
    },
    require_root, snmp_tcp,
};
use serde_json::Value;

/// Clients that reconnect at once (every 100 ms while refused), and those back 5 s after the
/// new server listened.
const AT_ONCE: usize = 60;
const LATER: usize = 40;
const BOUND: Duration = Duration::from_secs(30);

/// What one client saw.
#[derive(Debug, Default)]
struct Seen {
    /// Its old connection ended with EOF (not a reset).
    old_eof: bool,
    /// Its late FIN was answered with RST (the socket closed with ECONNRESET).
    late_fin_reset: bool,
    refused: u64,
    other: Vec<String>,
    /// When its reconnect's handshake completed (`connect()` returned), greeted after.
    back_at: Option<Instant>,
}

/// A one-way latch the clients poll.
#[derive(Default)]
struct Latch(AtomicBool);

impl Latch {
    fn open(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
    fn wait(&self, deadline: Instant) -> bool {
        while !self.0.load(Ordering::Relaxed) {
            if Instant::now() > deadline {
                return false;
            }
            thread::sleep(Duration::from_millis(2));
        }
        true
    }
}

struct Phases {
    up: AtomicUsize,
    back: AtomicUsize,
    fin: Latch,
    later: Latch,
    done: Latch,
}

/// The server's greeting line, or what came instead.
fn greeting(s: &TcpStream) -> Result<(), String> {
    let t = Instant::now();
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .map_err(|e| e.to_string())?;
    match BufReader::new(s).lines().next() {
        Some(Ok(l)) if l.starts_with("hello ") => Ok(()),
        other => Err(format!("{other:?} after {:?}", t.elapsed())),
    }
}

/// The kernel's TCP state of a socket (`TCP_INFO`): 7 is CLOSE.
fn tcp_state(s: &TcpStream) -> u8 {
    drainwatch_tests::tcp_info(s).map_or(0, |i| i.tcpi_state)
}

fn client(i: usize, addr: SocketAddrV4, p: Arc<Phases>) -> thread::JoinHandle<Seen> {
    thread::spawn(move || {
        let mut seen = Seen::default();
        let deadline = Instant::now() + 3 * BOUND;
        let target = SocketAddr::V4(addr);
        let Ok(old) = TcpStream::connect_timeout(&target, Duration::from_secs(5)) else {
            seen.other.push("first connect".into());
            return seen;
        };
        if let Err(e) = greeting(&old) {
            seen.other.push(format!("first greeting: {e}"));
            return seen;
        }
        p.up.fetch_add(1, Ordering::Relaxed);
        // Held until the server goes: EOF, or a reset.
        let _ = old.set_read_timeout(Some(BOUND));
        let mut buf = [0u8; 64];
        seen.old_eof = loop {
            match std::io::Read::read(&mut &old, &mut buf) {
                Ok(0) => break true,
                Ok(_) => {}
                Err(_) => break false,
            }
        };
        // Its FIN, late: once the replacement's namespace holds the address.
        if !p.fin.wait(deadline) {
            return seen;
        }
        thread::sleep(Duration::from_millis((i % 20) as u64 * 5));
        let _ = old.shutdown(Shutdown::Write);
        while tcp_state(&old) != 7 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
        seen.late_fin_reset =
            matches!(old.take_error(), Ok(Some(e)) if e.kind() == ErrorKind::ConnectionReset);
        drop(old);
        // The later ones 5 ms apart: SYNs a full queue drops at once are sent again a second
        // later, but a burst within one round trip has its handshakes' last ACKs dropped
        // instead, and the kernel prunes such requests without a word past half the backlog.
        if i >= AT_ONCE {
            if !p.later.wait(deadline) {
                return seen;
            }
            thread::sleep(Duration::from_millis((i - AT_ONCE) as u64 * 5));
        }
        while Instant::now() < deadline {
            // Long enough for SYNs a full queue dropped to be sent again (1 s, 3 s).
            match TcpStream::connect_timeout(&target, Duration::from_secs(10)) {
                Ok(s) => {
                    let at = Instant::now();
                    match greeting(&s) {
                        Ok(()) => {
                            seen.back_at = Some(at);
                            p.back.fetch_add(1, Ordering::Relaxed);
                            // Held until the test is done with it.
                            p.done.wait(deadline);
                        }
                        Err(e) => seen.other.push(format!("no greeting: {e}")),
                    }
                    return seen;
                }
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                    seen.refused += 1;
                    thread::sleep(Duration::from_millis(100 + (i % 10) as u64 * 5));
                }
                Err(e) => {
                    seen.other.push(e.to_string());
                    thread::sleep(Duration::from_millis(200));
                }
            }
        }
        seen
    })
}

fn netns_of(pid: u32) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/net"))
        .expect("ns/net")
        .to_string_lossy()
        .into_owned()
}

/// The replacement's network namespace, made as netavark makes a container's (a named
/// namespace, a veth pair onto podman's bridge, the address) but only once the old one's
/// inode is free again: the kernel frees a namespace asynchronously after its last reference
/// goes (the old container's sockets are purged then) and gives the lowest free inode to the
/// next one, so podman's own would race the old one's end. Made until one gets `inode`:
/// those that get a lower one (freed by others meanwhile) are held until then, so that the
/// lowest free inode is the old one's once it is freed.
struct ReusedNetns {
    name: String,
    veth: String,
}

impl ReusedNetns {
    fn make(inode: u64, ip: Ipv4Addr) -> ReusedNetns {
        let bridge = require_bridge_route(ip.into()).expect("the address is on a bridge");
        let shown = ip_cmd(&["-o", "-4", "addr", "show", "dev", &bridge]).expect("bridge");
        let prefix = shown
            .split_whitespace()
            .find_map(|w| w.split_once('/').map(|(_, p)| p.to_string()))
            .expect("the bridge's prefix");
        let deadline = Instant::now() + BOUND;
        // Removed however this ends.
        let mut held = Held(Vec::new());
        let name = loop {
            let name = unique_name("netns");
            ip_cmd(&["netns", "add", &name]).expect("ip netns add");
            let got = std::fs::metadata(format!("/run/netns/{name}"))
                .expect("the namespace's mount")
                .ino();
            if got == inode {
                break name;
            }
            if got < inode {
                held.0.push(name);
                continue;
            }
            ip_cmd(&["netns", "del", &name]).expect("ip netns del");
            assert!(Instant::now() < deadline, "inode {inode} was not freed");
            thread::sleep(Duration::from_millis(20));
        };
        drop(held);
        let veth = format!("dwv{}", std::process::id() % 100_000);
        let n = ReusedNetns { name, veth };
        let addr = format!("{ip}/{prefix}");
        let steps: [&[&str]; 6] = [
            &[
                "link", "add", &n.veth, "type", "veth", "peer", "name", "eth0", "netns", &n.name,
            ],
            &["link", "set", &n.veth, "master", &bridge, "up"],
            &["-n", &n.name, "link", "set", "lo", "up"],
            &["-n", &n.name, "addr", "add", &addr, "dev", "eth0"],
            &["-n", &n.name, "link", "set", "eth0", "up"],
            // The old container's link-layer address, still in the host's cache.
            &["neigh", "flush", "to", &ip.to_string(), "dev", &bridge],
        ];
        for args in steps {
            ip_cmd(args).unwrap_or_else(|e| panic!("{e}"));
        }
        n
    }

    fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }
}

/// Namespaces made on the way, each removed on drop.
struct Held(Vec<String>);

impl Drop for Held {
    fn drop(&mut self) {
        for name in &self.0 {
            let _ = ip_cmd(&["netns", "del", name]);
        }
    }
}

impl Drop for ReusedNetns {
    fn drop(&mut self) {
        let _ = ip_cmd(&["link", "del", &self.veth]);
        let _ = ip_cmd(&["netns", "del", &self.name]);
    }
}

/// The old server: 500 connects/s, a queue that takes the fleet at once. podman tears its link
/// down as soon as it exits: the FINs of its connections reach the clients, but their ACKs
/// (delayed for a FIN) find the link gone, and the orphaned sockets retransmit their FINs
/// into nothing, keeping the namespace and its inode for some 100 s (8 orphan retries). One
/// retry: gone in under a second, without a RST (the kernel gives up silently).
fn old_server(workload: &str) -> BackendOpts {
    BackendOpts {
        netns_holder: false,
        labels: vec![(COMPOSE_SERVICE.into(), workload.into())],
        sysctls: vec!["net.ipv4.tcp_orphan_retries=1".into()],
        ..Default::default()
    }
}

/// The replacement at `ip`, listening 2 s after it started: 50 connects/s into a queue of 25,
/// which a burst of 60 overflows (their SYNs dropped, sent again a second later).
fn replacement(workload: &str, ip: Ipv4Addr, netns: String) -> BackendOpts {
    BackendOpts {
        backlog: Some(24),
        gate_workers: Some(2),
        gate_auth: Some(Duration::from_millis(40)),
        ip: Some(ip),
        netns: Some(netns),
        listen_delay: Some(Duration::from_secs(2)),
        ready_timeout: Duration::from_secs(20),
        sysctls: Vec::new(),
        ..old_server(workload)
    }
}

/// The records at `path` whose `key` (a JSON pointer) is `value`.
fn records(agent: &Agent, path: &str, key: &str, value: &str) -> Vec<Value> {
    let (_, all) = api(agent, path);
    let mine = all.as_array().into_iter().flatten();
    mine.filter(|r| r.pointer(key).is_some_and(|v| v == value))
        .cloned()
        .collect()
}

#[test]
fn a_replacements_refusals_resets_and_overflows_are_its_own_though_it_reused_the_inode() {
    require_root();
    // The old container has no network holder: the bridge must outlive it.
    let _bridge = BridgeHolder::start("reuse");
    let agent = Agent::start(&[]);
    let workload = unique_name("reuse");
    let old = Backend::start("old", Mode::Gate, old_server(&workload));
    let (addr, old_ns) = (old.addr(), netns_of(old.pid));
    let old_inode = std::fs::metadata(format!("/proc/{}/ns/net", old.pid))
        .expect("ns/net")
        .ino();
    let phases = Arc::new(Phases {
        up: AtomicUsize::new(0),
        back: AtomicUsize::new(0),
        fin: Latch::default(),
        later: Latch::default(),
        done: Latch::default(),
    });
    let clients: Vec<_> = (0..AT_ONCE + LATER)
        .map(|i| client(i, addr, phases.clone()))
        .collect();
    let n = clients.len();
    wait_for("every client greeted by the old server", BOUND, || {
        phases.up.load(Ordering::Relaxed) == n
    });
    sync(&agent);
    let sent_by = |c: &str| {
        let m = agent.metrics_text();
        let labels = [("container", c), ("direction", "sent")];
        metric_sum(&m, "drainwatch_connection_resets_total", &labels)
    };
    let old_sent_before = sent_by(&old.container);
    old.stop(1);
    assert_eq!(old.exit_code(), 143, "the old server died on SIGTERM");
    podman(&["rm", &old.container]).expect("remove the old container");
    let netns = ReusedNetns::make(old_inode, *addr.ip());
    let mut new = Backend::launch(
        "new",
        Mode::Gate,
        replacement(&workload, *addr.ip(), netns.path()),
    );
    assert_eq!(new.addr(), addr, "the replacement at the old address");
    phases.fin.open();
    new.await_listening_only(Instant::now() + BOUND);
    // From its own log: just after listen() returned.
    let listened = new
        .event_at("listening")
        .expect("the server logged its listen");
    assert_eq!(
        netns_of(new.pid),
        old_ns,
        "the new namespace reused the old one's inode"
    );
    thread::sleep(Duration::from_secs(5));
    phases.later.open();
    let deadline = Instant::now() + BOUND;
    while phases.back.load(Ordering::Relaxed) < n && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    let all_back = phases.back.load(Ordering::Relaxed) == n;
    // The new namespace's own counters, from its creation.
    let out_rsts = snmp_tcp(new.pid, "OutRsts");
    let overflows = tcp_ext(new.pid, "ListenOverflows").expect("ListenOverflows");
    phases.done.open();
    let seen: Vec<Seen> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let missing: Vec<(usize, &Seen)> = seen
        .iter()
        .enumerate()
        .filter(|(_, s)| s.back_at.is_none())
        .collect();
    assert!(
        all_back,
        "{} clients not back within {BOUND:?}: {missing:?}",
        missing.len()
    );
    let refused: u64 = seen.iter().map(|s| s.refused).sum();
    let late_resets = seen.iter().filter(|s| s.late_fin_reset).count() as u64;
    let other: Vec<&String> = seen.iter().flat_map(|s| &s.other).collect();
    let mut back: Vec<Instant> = seen.iter().filter_map(|s| s.back_at).collect();
    back.sort();
    let pause = back
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    println!(
        "clients: {refused} refused, {late_resets} late FINs reset, back over {:.2} s with a \
         pause of {:.2} s, other errors {other:?}; new namespace: OutRsts {out_rsts}, \
         ListenOverflows {overflows}",
        (back[n - 1] - back[0]).as_secs_f64(),
        pause.as_secs_f64()
    );
    assert!(
        seen.iter().all(|s| s.old_eof),
        "old connections ended by FIN"
    );
    assert!(other.is_empty(), "{other:?}");
    assert!(refused >= AT_ONCE as u64, "refused before it listened");
    assert!(late_resets > 0, "late FINs met the new namespace");
    assert_eq!(
        out_rsts,
        refused + late_resets,
        "every RST of the new namespace is a refusal or a late FIN's answer"
    );
    assert!(overflows > 0, "the burst overflowed the queue");
    assert!(pause > Duration::from_millis(1500), "a return with a pause");
    assert!(
        back[0] + Duration::from_millis(50) >= listened,
        "nobody connected before the listen"
    );

    // Once the new start has settled (10 s after its listen, the storm long over) and the
    // old stop's record is complete, drainwatch's figures beside the truth, then the checks.
    let start_of = || records(&agent, "/api/v1/starts", "/container/id", &new.id);
    wait_for("the new start settles", BOUND, || {
        start_of().first().is_some_and(|s| s["settled"] == true)
    });
    let stop = drainwatch_tests::agent::stop_record(&agent, &old.id);
    let start = start_of().swap_remove(0);
    let stop_id = stop["id"].as_str().expect("stop id");
    let storms = records(&agent, "/api/v1/storms", "/stop_id", stop_id);
    let refused_at_new = agent.metric_sum(
        "drainwatch_refused_connections_total",
        &[("container", &new.container)],
    );
    let (old_sent, new_sent) = (
        sent_by(&old.container) - old_sent_before,
        sent_by(&new.container),
    );
    let storm_figures: Vec<String> = storms
        .iter()
        .map(|s| {
            format!(
                "{} clients, netns_listen_overflows {}",
                s["clients"], s["netns_listen_overflows"]
            )
        })
        .collect();
    println!(
        "truth vs drainwatch: refused {refused} / start refused_before_listen {}, old stop \
         refused {}, refused_connections_total of the new {refused_at_new}; new namespace \
         OutRsts {out_rsts} / its container's resets sent {new_sent}, the old one's {old_sent}, \
         old stop resets_sent {}; {n} clients back, ListenOverflows {overflows} / storms \
         {storm_figures:?}",
        start["loss"]["refused_before_listen"],
        stop["loss"]["refused"],
        stop["loss"]["resets_sent"]
    );
    // The new container's start: every refusal, all from its own namespace.
    assert_eq!(start["loss"]["refused_before_listen"], refused);
    assert_eq!(start["netns_by_inode"], false);
    assert_eq!(refused_at_new, refused as f64);
    // The old container's stop: nothing refused, no RST of the new namespace.
    assert_eq!(stop["loss"]["refused"], 0, "no refusal is the old stop's");
    assert_eq!(stop["loss"]["resets_sent"], serde_json::json!({}));
    assert_eq!(old_sent, 0.0);
    // Every RST the new namespace sent is the new container's, as its own counter says.
    assert_eq!(new_sent, out_rsts as f64);
    // One return, one storm record, with the new namespace's overflows.
    assert_eq!(storms.len(), 1, "one return, one record: {storms:#?}");
    let s = &storms[0];
    assert_eq!(s["clients"], n as u64);
    assert_eq!(s["container"], new.container.as_str());
    assert_eq!(s["netns_listen_overflows"], overflows);
}
