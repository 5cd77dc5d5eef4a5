//! A Socket.IO fleet with the real libraries: socket.io 4.8 (server) and socket.io-client 4.8
//! from the npm registry (`tests/lab/socketio/`, pinned by its package-lock.json, installed by
//! `cargo xtask setup`), run by the host's Node in podman containers.
//!
//! - The server (`server.js`) as a new user writes it: no SIGTERM handler, an `io.use`
//!   middleware authorising each connection, I/O-bound (a pool of 10 in front of a 20 ms
//!   query) or CPU-bound (a synchronous PBKDF2 of a chosen cost). It logs every accept,
//!   authorisation start/run/end, connect and disconnect, and its event loop's load.
//! - The fleet (`fleet.js`): N clients in one Node process (its own container), the library's
//!   default reconnection (1 s ± 50%, doubling), websocket-only or default transports
//!   (polling, then the upgrade). It logs per client: connected, disconnect (reason), each
//!   reconnect attempt and its error (ECONNREFUSED, ...), reconnected; and every TCP
//!   connection it opens (Node's `net.client.socket` channel), with its own CPU load.
//! - The scenario: the fleet connected to the old server's container; the old one stopped
//!   (`podman stop`, grace configurable; with `--init` it dies on SIGTERM, without it Node is
//!   PID 1, ignores SIGTERM and is SIGKILLed at the deadline); a replacement started at the
//!   same address (its IP and MAC) in a new network namespace; the fleet reconnects to it.
//!   The namespaces' own counters (`nstat`'s `OutRsts`, `PassiveOpens`, `ListenOverflows`)
//!   are sampled while each lives.
//!
//! The truth ([`SioRun`]'s methods) comes from those logs and counters only. Traffic goes
//! only between the lab's containers on podman's bridge, kept up by the fleet's container.

mod counters;
mod logs;
mod node;
mod report;
mod truth;

use std::{
    fs,
    time::{Duration, Instant},
};

pub use counters::{Counters, Sampler, cpu_ticks, idle_share};
pub use logs::{Auth, ClientEvent, FleetLoad, FleetLog, ServerLog, Tcp, Tick};
pub use node::{NodeContainer, NodeOpts, lab_dir, node_modules, package_version, require_packages};
pub use truth::ClientTruth;

use super::{
    container::{StopTimes, unique_name},
    storm::COMPOSE_SERVICE,
};

/// The transports the clients use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transports {
    /// `transports: ["websocket"]`: one connection per session.
    Websocket,
    /// The library's default: HTTP long-polling first, then the upgrade to a websocket (each
    /// polling request its own connection: several per session).
    Default,
}

/// The work of the server's authorisation middleware.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AuthWork {
    /// A pool of `pool` connections in front of a query of `query`: at most `pool`
    /// concurrent waits, the event loop free meanwhile.
    Io { pool: u32, query: Duration },
    /// PBKDF2-SHA256 of `iterations`, synchronous: the event loop is busy meanwhile.
    Cpu { iterations: u32 },
}

#[derive(Clone, Debug)]
pub struct SioSpec {
    pub clients: usize,
    pub transports: Transports,
    pub auth: AuthWork,
    /// `podman run --init` (the server dies on SIGTERM: 143), or Node as PID 1 (SIGTERM
    /// ignored, SIGKILLed at the deadline: 137).
    pub init: bool,
    pub grace_secs: u32,
    /// What the server does before it listens (connecting to its database): a replacement
    /// routed to meanwhile refuses from its own namespace.
    pub listen_delay: Duration,
    /// `com.docker.compose.service` of both servers.
    pub workload: String,
    /// First connections in flight at once while the fleet connects to the old server.
    pub in_flight: usize,
    /// Bound on each phase (fleet up, replacement listening, fleet back).
    pub bound: Duration,
    /// The fleet pinned to this CPU and the servers to the others (`--cpuset-cpus`), to see
    /// what the fleet's own CPU does to the truth; `DRAINWATCH_SIO_FLEET_CPU` sets it.
    pub fleet_cpu: Option<u32>,
    /// The engine's ping period (`pingInterval`; the library's 25 s when `None`): shorter, the
    /// sessions have had pings (and sent their pongs) before the stop.
    pub ping_interval: Option<Duration>,
    /// How long the fleet stays connected (upgraded, with default transports) before the stop.
    pub connected_for: Duration,
}

impl SioSpec {
    /// `clients` clients, the server dying on SIGTERM (grace 10 s).
    pub fn new(clients: usize, transports: Transports, auth: AuthWork) -> SioSpec {
        SioSpec {
            clients,
            transports,
            auth,
            init: true,
            grace_secs: 10,
            listen_delay: Duration::ZERO,
            workload: unique_name("sio"),
            in_flight: 100,
            bound: Duration::from_secs(60),
            fleet_cpu: std::env::var("DRAINWATCH_SIO_FLEET_CPU")
                .ok()
                .and_then(|c| c.parse().ok()),
            ping_interval: None,
            connected_for: Duration::ZERO,
        }
    }

    /// The published setup: at most 10 concurrent 20 ms waits.
    pub fn io_pool() -> AuthWork {
        AuthWork::Io {
            pool: 10,
            query: Duration::from_millis(20),
        }
    }

    fn server_args(&self) -> Vec<String> {
        let delay_ms = self.listen_delay.as_millis().to_string();
        let mut a: Vec<String> = [
            "--port",
            "8080",
            "--log",
            "/lab/log/server.log",
            "--listen-delay-ms",
            &delay_ms,
        ]
        .map(String::from)
        .to_vec();
        if let Some(p) = self.ping_interval {
            a.extend(["--ping-interval-ms".into(), p.as_millis().to_string()]);
        }
        match self.auth {
            AuthWork::Io { pool, query } => a.extend([
                "--auth".into(),
                "io".into(),
                "--pool".into(),
                pool.to_string(),
                "--io-ms".into(),
                (query.as_secs_f64() * 1e3).to_string(),
            ]),
            AuthWork::Cpu { iterations } => a.extend([
                "--auth".into(),
                "cpu".into(),
                "--cpu-iterations".into(),
                iterations.to_string(),
            ]),
        }
        a
    }

    fn server_opts(&self, addr: Option<(std::net::Ipv4Addr, String)>) -> NodeOpts {
        let cpus = self.fleet_cpu.map(|f| {
            let n = std::thread::available_parallelism().map_or(2, |n| n.get() as u32);
            let others: Vec<String> = (0..n).filter(|c| *c != f).map(|c| c.to_string()).collect();
            others.join(",")
        });
        NodeOpts {
            init: self.init,
            labels: vec![(COMPOSE_SERVICE.into(), self.workload.clone())],
            addr,
            cpus,
        }
    }
}

/// The containers. Dropping it removes them, the fleet first.
pub struct SioLab {
    pub spec: SioSpec,
    pub fleet: Option<NodeContainer>,
    pub old: NodeContainer,
    pub new: Option<NodeContainer>,
}

/// The ground truth of one run.
pub struct SioRun {
    pub spec: SioSpec,
    /// `podman stop` of the old server: issued, returned.
    pub stop: StopTimes,
    pub old_exit_code: i32,
    /// `podman run` of the replacement: issued, returned.
    pub new_launched: (Instant, Instant),
    pub old: ServerLog,
    pub new: ServerLog,
    pub fleet: FleetLog,
    /// The namespaces' counters, sampled every 5 ms while a process of each lived: the old
    /// one's from just before the stop, the new one's from its `podman run` returning to the
    /// fleet being back.
    pub old_counters: Vec<(u64, Counters)>,
    pub new_counters: Vec<(u64, Counters)>,
    /// The machine's idle CPU share from the stop to the fleet being back (2 CPUs shared by
    /// the fleet, the servers, the agent and whatever else runs).
    pub machine_idle: Option<f64>,
    pub versions: (String, String),
}

/// Reads the fleet's `status` (clients up, lost, back).
fn fleet_status(fleet: &NodeContainer) -> (usize, usize, usize) {
    let n = fleet_count(fleet);
    (n("up"), n("lost"), n("back"))
}

/// One count of the fleet's `status` (`up`, `lost`, `back`, `upgraded`).
fn fleet_count(fleet: &NodeContainer) -> impl Fn(&str) -> usize {
    let text = fs::read_to_string(fleet.log_dir.join("status")).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    move |k: &str| v[k].as_u64().unwrap_or(0) as usize
}

/// Waits (polling every `every`, until `deadline`) for `done`; false on timeout.
fn poll(deadline: Instant, every: Duration, mut done: impl FnMut() -> bool) -> bool {
    loop {
        if done() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(every);
    }
}

fn await_listening(server: &NodeContainer, bound: Duration) {
    let ok = poll(Instant::now() + bound, Duration::from_millis(5), || {
        server
            .read_log("server.log")
            .iter()
            .any(|l| l.starts_with("listening "))
    });
    assert!(
        ok,
        "{} did not listen within {bound:?}: status {}, output:\n{}",
        server.container,
        server.status(),
        server.output()
    );
}

impl SioLab {
    /// Starts the old server and waits until it listens.
    pub fn setup(spec: SioSpec) -> SioLab {
        let old = NodeContainer::launch(
            "sio-old",
            "server.js",
            &spec.server_args(),
            &spec.server_opts(None),
            spec.bound,
        );
        await_listening(&old, spec.bound);
        SioLab {
            spec,
            fleet: None,
            old,
            new: None,
        }
    }

    /// Connects the fleet to the old server, stops it, starts its replacement at the same
    /// address, waits until every client is back, and collects the truth. Once per lab.
    pub fn run(&mut self) -> SioRun {
        let spec = self.spec.clone();
        let n = spec.clients;
        let url = format!("http://{}:8080", self.old.ip);
        let transports = match spec.transports {
            Transports::Websocket => "websocket",
            Transports::Default => "default",
        };
        let fleet_args: Vec<String> = [
            "--url",
            &url,
            "--clients",
            &n.to_string(),
            "--transports",
            transports,
            "--in-flight",
            &spec.in_flight.to_string(),
            "--dir",
            "/lab/log",
            // Outlives the run and the checks; exits by itself whatever happens.
            "--bound",
            "600",
        ]
        .map(String::from)
        .to_vec();
        let fleet_opts = NodeOpts {
            init: true,
            cpus: spec.fleet_cpu.map(|c| c.to_string()),
            ..NodeOpts::default()
        };
        let fleet = self.fleet.insert(NodeContainer::launch(
            "sio-fleet",
            "fleet.js",
            &fleet_args,
            &fleet_opts,
            spec.bound,
        ));
        let up = poll(
            Instant::now() + spec.bound,
            Duration::from_millis(50),
            || fleet_status(fleet).0 == n,
        );
        assert!(
            up,
            "only {:?} (up, lost, back) of {n} clients connected to the old server within {:?}: {}",
            fleet_status(fleet),
            spec.bound,
            fleet.output()
        );
        // Default transports: every session on its websocket before the stop (none has a
        // polling request in flight, which would be a request cut).
        if spec.transports == Transports::Default {
            let upgraded = poll(
                Instant::now() + spec.bound,
                Duration::from_millis(50),
                || fleet_count(fleet)("upgraded") == n,
            );
            assert!(
                upgraded,
                "only {} of {n} clients upgraded to websocket within {:?}",
                fleet_count(fleet)("upgraded"),
                spec.bound
            );
        }
        std::thread::sleep(spec.connected_for);
        let old_pid = self.old.init_pid().expect("the old server's pid");
        let old_sampler = Sampler::start(old_pid, Duration::from_millis(5));
        let cpu_before = cpu_ticks();
        let stop = self.old.stop(spec.grace_secs);
        let old_exit_code = self.old.exit_code();
        let new = self.new.insert(NodeContainer::launch(
            "sio-new",
            "server.js",
            &spec.server_args(),
            &spec.server_opts(Some((self.old.ip, self.old.mac.clone()))),
            spec.bound,
        ));
        assert_eq!(new.ip, self.old.ip, "the replacement has the old address");
        let new_pid = new.init_pid().expect("the replacement's pid");
        let new_sampler = Sampler::start(new_pid, Duration::from_millis(5));
        await_listening(new, spec.bound);
        let fleet = self.fleet.as_ref().expect("fleet");
        let back = poll(
            Instant::now() + spec.bound,
            Duration::from_millis(50),
            || fleet_status(fleet).2 == n,
        );
        let machine_idle = cpu_before.zip(cpu_ticks()).map(|(a, b)| idle_share(a, b));
        let new_counters = new_sampler.finish();
        let old_counters = old_sampler.finish();
        let status = fleet_status(fleet);
        fs::write(fleet.log_dir.join("dump"), "").expect("ask the fleet for its log");
        let dumped = poll(
            Instant::now() + Duration::from_secs(20),
            Duration::from_millis(50),
            || fleet.log_dir.join("dumped").exists(),
        );
        assert!(dumped, "the fleet wrote no log: {}", fleet.output());
        let run = SioRun {
            fleet: FleetLog::parse(&fleet.read_log("clients.log"), n),
            old: ServerLog::parse(&self.old.read_log("server.log")),
            new: ServerLog::parse(&new.read_log("server.log")),
            spec,
            stop,
            old_exit_code,
            new_launched: new.launched,
            old_counters,
            new_counters,
            machine_idle,
            versions: (
                package_version("socket.io"),
                package_version("socket.io-client"),
            ),
        };
        assert!(
            back,
            "only {status:?} (up, lost, back) of {n} clients came back within {:?}\n{}",
            run.spec.bound,
            run.report()
        );
        run
    }
}
