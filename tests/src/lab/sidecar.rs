//! A pod with a mesh-like sidecar (issue 43): the Istio / Linkerd shape, measured.
//!
//! The pod is the lab's usual one: a network holder (its sandbox) keeps the address, the app
//! (`tests/lab/backend.py`) listens on 8080 in it. The sidecar is a third container joined to
//! the same namespace (`--network container:<holder>`): Debian's nginx, run through the host's
//! read-only `/usr`, listening on [`SIDECAR_PORT`] and proxying every request to
//! `127.0.0.1:8080` (one upstream server, so no retry and no passive health: each request is
//! one loopback connect). Its PID 1 is `tests/lab/sidecar.py`, a pilot-agent-like wrapper that
//! keeps nginx serving a few seconds after SIGTERM and then quits it gracefully.
//!
//! Clients on the node send slow requests to the pod's address and the sidecar's port on a
//! beat; the pod is stopped in the kubelet's order for regular containers ([`Order::Classic`]:
//! both get SIGTERM together) or for native sidecars ([`Order::Native`]: the app first, the
//! sidecar once the app has exited). Ground truth, none of it drainwatch's: each client's own
//! outcome, the app's own work log (a request started and never finished was cut), the
//! sidecar's access and error logs (502s, refused loopback connects), the pod namespace's TCP
//! counters.

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    fs,
    net::{SocketAddr, SocketAddrV4},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use super::{
    Backend, BackendOpts, Mode, StopTimes,
    client::{RequestRecord, request},
    clock,
    container::{
        BridgeHolder, IMAGE, LAB_DIR, http_get, keep, lab_python, podman, setup_once, unique_name,
    },
    nginx::AccessEntry,
    proxy::ms,
};
use crate::snmp_tcp;

const TEMPLATE: &str = include_str!("../../lab/nginx.conf.in");
const NGINX: &str = "/usr/sbin/nginx";
/// Where the sidecar listens in the pod (Envoy's outbound port, as a mesh's iptables
/// redirect would use; here clients address it directly).
pub const SIDECAR_PORT: u16 = 15001;
/// The app's port in the pod, `127.0.0.1:APP_PORT` for the sidecar.
pub const APP_PORT: u16 = 8080;
/// A second app container's port in the same pod, for a retrying sidecar.
pub const REPLICA_PORT: u16 = 8081;

/// The wrapper, bind-mounted into the sidecar container.
fn wrapper_script() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/lab/sidecar.py"))
}

/// The sidecar container: the wrapper as PID 1, nginx's master and worker its descendants.
/// Dropping it removes the container (before the pod's holder: drop it first).
#[derive(Debug)]
pub struct Sidecar {
    pub container: String,
    pub id: String,
    /// nginx's prefix (same path inside the container): nginx.conf, access.log, error.log,
    /// wrapper.log.
    pub dir: PathBuf,
    /// The pod's address and the sidecar's port.
    pub addr: SocketAddrV4,
}

impl Sidecar {
    /// Starts the sidecar in `pod`'s network namespace, the wrapper keeping nginx serving
    /// `drain` after SIGTERM, proxying to `127.0.0.1` at `upstreams` (round robin, nginx's
    /// default retries: a request cut before its response headers goes to the next one);
    /// returns once nginx listens (its pid file) and answers
    /// `/lab-ready` itself (no upstream touched). Panics with its logs otherwise.
    pub fn start(pod: &Backend, drain: Duration, upstreams: &[u16]) -> Sidecar {
        setup_once();
        let holder = pod
            .holder
            .as_ref()
            .expect("the app's pod has a network holder");
        let container = format!("{}-sidecar", pod.container);
        let dir = PathBuf::from(LAB_DIR).join(unique_name("sidecar"));
        fs::create_dir_all(dir.join("tmp")).expect("sidecar dir");
        // nginx as root looks up its `user` (root): the busybox image has no /etc.
        fs::write(dir.join("passwd"), "root:x:0:0:root:/root:/bin/sh\n").expect("passwd");
        fs::write(dir.join("group"), "root:x:0:\n").expect("group");
        let cfg = nginx_conf(&dir, upstreams);
        fs::write(dir.join("nginx.conf"), cfg).expect("write nginx.conf");
        let mut s = Sidecar {
            container: container.clone(),
            id: String::new(),
            dir: dir.clone(),
            addr: SocketAddrV4::new(pod.ip, SIDECAR_PORT),
        };
        let py = lab_python();
        let mut mounts: Vec<String> = ["/usr", "/lib", "/lib64"]
            .into_iter()
            .filter(|p| Path::new(p).exists())
            .map(|p| format!("{p}:{p}:ro"))
            .collect();
        if py.starts_with("/root/.pyenv") {
            mounts.push("/root/.pyenv:/root/.pyenv:ro".into());
        }
        let d = dir.display().to_string();
        mounts.push(format!("{d}:{d}"));
        mounts.push(format!("{d}/passwd:/etc/passwd:ro"));
        mounts.push(format!("{d}/group:/etc/group:ro"));
        let script = format!("{}:/lab/sidecar.py:ro", wrapper_script().display());
        mounts.push(script);
        let label = format!("drainwatch.lab={}", std::process::id());
        let network = format!("container:{holder}");
        let drain_s = drain.as_secs_f64().to_string();
        let mut args = vec!["run", "-d", "--name", &container, "--label", &label];
        args.extend(super::container::ULIMITS);
        args.extend(["--network", &network]);
        for m in &mounts {
            args.extend(["-v", m]);
        }
        args.extend([
            IMAGE,
            &py,
            "/lab/sidecar.py",
            "--dir",
            &d,
            "--drain",
            &drain_s,
        ]);
        args.extend(["--nginx", NGINX]);
        let id = podman(&args).unwrap_or_else(|e| panic!("starting the sidecar: {e}"));
        s.id = id.lines().last().unwrap_or_default().to_string();
        s.wait_ready(Instant::now() + Duration::from_secs(10));
        s
    }

    fn wait_ready(&self, deadline: Instant) {
        let fail = |what: &str| -> ! {
            panic!(
                "sidecar not ready: {what}\nwrapper:\n{}\noutput:\n{}\nerror log:\n{}",
                self.read("wrapper.log"),
                self.read("output.log"),
                self.read("error.log")
            )
        };
        // The pid file is written once the listener is open: no connect is ever refused.
        while self.read("nginx.pid").trim().is_empty() {
            if self.wrapper_events().iter().any(|(k, _, _)| k == "exit") {
                fail("the wrapper exited");
            }
            if Instant::now() > deadline {
                fail("no pid file");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        match http_get(self.addr, "/lab-ready", Duration::from_secs(5)) {
            Ok((200, _)) => {}
            r => fail(&format!("GET /lab-ready answered {r:?}")),
        }
    }

    fn read(&self, file: &str) -> String {
        fs::read_to_string(self.dir.join(file)).unwrap_or_default()
    }

    /// `podman stop -t grace_secs`: SIGTERM to the wrapper. Returns once it has exited.
    pub fn stop(&self, grace_secs: u32) -> StopTimes {
        let grace = grace_secs.to_string();
        let issued = Instant::now();
        podman(&["stop", "-t", &grace, &self.container])
            .unwrap_or_else(|e| panic!("stopping the sidecar: {e}"));
        StopTimes {
            issued,
            returned: Instant::now(),
        }
    }

    /// The container's exit code.
    pub fn exit_code(&self) -> Option<i32> {
        podman(&[
            "inspect",
            "--format",
            "{{.State.ExitCode}}",
            &self.container,
        ])
        .ok()?
        .parse()
        .ok()
    }

    /// The access log, parsed (the lab's format, one line per request as it ends).
    pub fn access_log(&self) -> Vec<AccessEntry> {
        let text = self.read("access.log");
        let complete = text.rfind('\n').map_or("", |i| &text[..i]);
        complete.lines().filter_map(AccessEntry::parse).collect()
    }

    /// Error log lines containing `needle`.
    pub fn error_lines(&self, needle: &str) -> Vec<String> {
        self.read("error.log")
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect()
    }

    /// The wrapper's events: (event, when, detail).
    pub fn wrapper_events(&self) -> Vec<(String, Instant, String)> {
        let text = self.read("wrapper.log");
        let complete = text.rfind('\n').map_or("", |i| &text[..i]);
        complete
            .lines()
            .filter_map(|l| {
                let mut f = l.splitn(3, ' ');
                let ns: u64 = f.next()?.parse().ok()?;
                let kind = f.next()?.to_string();
                let detail = f.next().unwrap_or("").to_string();
                Some((kind, clock::instant_of_mono_ns(ns), detail))
            })
            .collect()
    }

    /// When the wrapper logged `kind` first.
    pub fn event_at(&self, kind: &str) -> Option<Instant> {
        self.wrapper_events()
            .into_iter()
            .find(|(k, _, _)| k == kind)
            .map(|(_, at, _)| at)
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", "-t", "0", &self.container]);
        if !keep() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// The lab's nginx template with upstream servers `127.0.0.1:<port>` and a listener on every
/// address of the pod. One server: nginx neither retries nor takes it out of the rotation
/// (`max_fails` is ignored for a single peer), so every request is one connect. Several: round
/// robin, passive health and `proxy_next_upstream error timeout`, nginx's defaults.
fn nginx_conf(dir: &Path, upstreams: &[u16]) -> String {
    assert!(!upstreams.is_empty(), "the sidecar needs an upstream");
    let servers: Vec<String> = upstreams
        .iter()
        .map(|p| format!("        server 127.0.0.1:{p};"))
        .collect();
    let cfg = TEMPLATE
        .replace(
            "{{KEEPALIVE}}",
            "        # no keepalive: one connection per request",
        )
        .replace(
            "{{UPSTREAM_HTTP}}",
            "            # HTTP/1.0 upstream, Connection: close",
        )
        .replace("{{DIR}}", &dir.display().to_string())
        .replace("{{LISTEN}}", &format!("0.0.0.0:{SIDECAR_PORT}"))
        .replace("{{CONNECT_TIMEOUT}}", &ms(Duration::from_secs(2)))
        .replace("{{READ_TIMEOUT}}", &ms(Duration::from_secs(30)))
        .replace(
            "{{NEXT_UPSTREAM}}",
            "            # proxy_next_upstream: nginx's default, error timeout",
        )
        .replace(
            "{{CLIENT_ABORT}}",
            "            # proxy_ignore_client_abort off",
        )
        .replace("{{SERVERS}}", &servers.join("\n"));
    assert!(!cfg.contains("{{"), "unfilled template field in:\n{cfg}");
    cfg
}

/// The order the pod's containers are stopped in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Both SIGTERMed together: the kubelet with a sidecar as a regular container.
    Classic,
    /// The app first, the sidecar once the app has exited: Kubernetes native sidecars
    /// (an init container with `restartPolicy: Always`).
    Native,
    /// The app alone (the kubelet restarting it after a failed liveness probe): the sidecar
    /// and any replica serve on.
    AppOnly,
}

/// One run's shape.
#[derive(Clone, Debug)]
pub struct SidecarSpec {
    pub order: Order,
    /// The app's SIGTERM behaviour (`NoHandler`: cut; `Drain`: graceful).
    pub mode: Mode,
    /// The app's `Drain` delay.
    pub drain_delay: Option<Duration>,
    /// How long the wrapper keeps the sidecar serving after SIGTERM.
    pub sidecar_drain: Duration,
    /// One request every `beat`, from the load's start...
    pub beat: Duration,
    /// ...for `lead` before the stop...
    pub lead: Duration,
    /// ...and `after` after it (the endpoint's removal lag: clients stop sending then). Less
    /// than `sidecar_drain`, so no client ever meets the sidecar's own closed port.
    pub after: Duration,
    /// The work each request asks the app for (`/work?ms=`).
    pub work: Duration,
    /// A second app container in the pod (`REPLICA_PORT`, never stopped), the sidecar
    /// balancing over both and retrying a cut request on the other.
    pub replica: bool,
}

impl SidecarSpec {
    /// An app without a SIGTERM handler (dies at once, cutting what it holds), the sidecar
    /// serving 3 s after SIGTERM, clients every 200 ms for 2 s before and 2 s after the stop.
    pub fn cut(order: Order) -> Self {
        Self {
            order,
            mode: Mode::NoHandler,
            drain_delay: None,
            sidecar_drain: Duration::from_secs(3),
            beat: Duration::from_millis(200),
            lead: Duration::from_secs(2),
            after: Duration::from_secs(2),
            work: Duration::from_millis(1500),
            replica: false,
        }
    }

    /// The app drains (serves 2.5 s after SIGTERM, then finishes what it holds), the clients
    /// stop 1 s after the stop (the endpoint gone): nothing may be lost.
    pub fn graceful(order: Order) -> Self {
        Self {
            mode: Mode::Drain,
            drain_delay: Some(Duration::from_millis(2500)),
            after: Duration::from_secs(1),
            ..Self::cut(order)
        }
    }
}

/// The pod: a bridge holder, the app (with its network holder), a replica and the sidecar.
/// Fields drop in order: the sidecar, the replica, then the app and its holder, then the bridge
/// holder.
pub struct SidecarLab {
    pub spec: SidecarSpec,
    pub sidecar: Sidecar,
    pub replica: Option<Backend>,
    pub app: Backend,
    pub bridge: BridgeHolder,
}

/// What one run did, from the clients, the app's and the sidecar's logs and the kernel.
#[derive(Debug)]
pub struct SidecarRun {
    pub requests: Vec<RequestRecord>,
    pub app_stop: StopTimes,
    /// None: the sidecar was not stopped (`Order::AppOnly`).
    pub sidecar_stop: Option<StopTimes>,
    pub app_exit: i32,
    pub sidecar_exit: Option<i32>,
    /// Ids the app started and never finished (its own work log).
    pub cut: BTreeSet<String>,
    /// Cut ids the replica started too: the sidecar's retries, run twice.
    pub duplicates: BTreeSet<String>,
    /// Ids the sidecar answered 502 (its access log).
    pub sidecar_502: BTreeSet<String>,
    /// 502s of requests the app never started: their loopback connect was refused.
    pub refused_502: BTreeSet<String>,
    /// The sidecar's error log: `connect() failed (111: Connection refused)` lines.
    pub refused_lines: usize,
    /// The sidecar's error log: `upstream prematurely closed` lines.
    pub premature_lines: usize,
    /// The pod namespace's `Tcp:` counters over the load: failed connects, RSTs sent,
    /// established connections reset.
    pub attempt_fails: u64,
    pub out_rsts: u64,
    pub estab_resets: u64,
    /// When the app logged its SIGTERM (none: it has no handler) and the wrapper its own.
    pub app_sigterm: Option<Instant>,
    pub sidecar_sigterm: Option<Instant>,
}

impl SidecarLab {
    /// Starts a bridge holder, the app in its pod, the sidecar; checks the route to the pod.
    pub fn setup(spec: SidecarSpec) -> SidecarLab {
        let bridge = BridgeHolder::start("sidecar");
        let app = Backend::start(
            "app",
            spec.mode,
            BackendOpts {
                port: APP_PORT,
                drain_delay: spec.drain_delay,
                ..BackendOpts::default()
            },
        );
        // The replica joins the pod's namespace through its holder's process, at its address.
        let replica = spec.replica.then(|| {
            Backend::start(
                "replica",
                Mode::NoHandler,
                BackendOpts {
                    port: REPLICA_PORT,
                    netns_holder: false,
                    netns: Some(format!("/proc/{}/ns/net", app.netns_pid())),
                    ip: Some(app.ip),
                    ..BackendOpts::default()
                },
            )
        });
        let upstreams: &[u16] = if spec.replica {
            &[APP_PORT, REPLICA_PORT]
        } else {
            &[APP_PORT]
        };
        let sidecar = Sidecar::start(&app, spec.sidecar_drain, upstreams);
        SidecarLab {
            spec,
            sidecar,
            replica,
            app,
            bridge,
        }
    }

    /// Sends the beat, stops the pod in the spec's order `lead` into it, waits for every
    /// request and both containers, and reads the ground truth.
    pub fn run(&self) -> SidecarRun {
        let s = &self.spec;
        self.app.require_route();
        let ns_pid = self.app.netns_pid();
        let counters = || {
            [
                snmp_tcp(ns_pid, "AttemptFails"),
                snmp_tcp(ns_pid, "OutRsts"),
                snmp_tcp(ns_pid, "EstabResets"),
            ]
        };
        let before = counters();
        let start = Instant::now() + Duration::from_millis(100);
        let n = ((s.lead + s.after).as_nanos() / s.beat.as_nanos()) as usize;
        let target = SocketAddr::V4(self.sidecar.addr);
        let work_ms = s.work.as_millis() as u64;
        let timeout = s.work + Duration::from_secs(5);
        let beat = s.beat;
        let clients = std::thread::spawn(move || {
            let handles: Vec<_> = (0..n)
                .map(|i| {
                    clock::sleep_until(start + beat * i as u32);
                    let id = format!("sc-{i}");
                    std::thread::spawn(move || request(target, &id, work_ms, timeout))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("request thread"))
                .collect::<Vec<_>>()
        });
        clock::sleep_until(start + s.lead);
        let (app_stop, sidecar_stop) = match s.order {
            Order::Classic => std::thread::scope(|sc| {
                let side = sc.spawn(|| self.sidecar.stop(10));
                let app = self.app.stop(10);
                (app, Some(side.join().expect("sidecar stop")))
            }),
            Order::Native => {
                let app = self.app.stop(10);
                (app, Some(self.sidecar.stop(10)))
            }
            Order::AppOnly => (self.app.stop(10), None),
        };
        let requests = clients.join().expect("clients");
        let after = counters();
        let work = self.app.work_log();
        let started: BTreeSet<String> = work
            .iter()
            .filter(|w| w.started)
            .map(|w| w.id.clone())
            .collect();
        let ended: BTreeSet<String> = work
            .iter()
            .filter(|w| !w.started)
            .map(|w| w.id.clone())
            .collect();
        let cut: BTreeSet<String> = started.difference(&ended).cloned().collect();
        let replica_started: BTreeSet<String> = self
            .replica
            .iter()
            .flat_map(|r| r.work_log())
            .filter(|w| w.started)
            .map(|w| w.id)
            .collect();
        let duplicates = cut.intersection(&replica_started).cloned().collect();
        let sidecar_502: BTreeSet<String> = self
            .sidecar
            .access_log()
            .into_iter()
            .filter(|e| e.status == 502)
            .filter_map(|e| e.id)
            .collect();
        let refused_502 = sidecar_502
            .iter()
            .filter(|id| !started.contains(*id))
            .cloned()
            .collect();
        SidecarRun {
            requests,
            app_stop,
            sidecar_stop,
            app_exit: self.app.exit_code(),
            sidecar_exit: sidecar_stop.and_then(|_| self.sidecar.exit_code()),
            cut,
            duplicates,
            sidecar_502,
            refused_502,
            refused_lines: self
                .sidecar
                .error_lines("connect() failed (111: Connection refused)")
                .len(),
            premature_lines: self
                .sidecar
                .error_lines("upstream prematurely closed")
                .len(),
            attempt_fails: after[0] - before[0],
            out_rsts: after[1] - before[1],
            estab_resets: after[2] - before[2],
            app_sigterm: self.app.event_at("sigterm"),
            sidecar_sigterm: self.sidecar.event_at("sigterm"),
        }
    }
}

impl SidecarRun {
    /// Clients by outcome label.
    pub fn outcomes(&self) -> std::collections::BTreeMap<String, usize> {
        let mut m = std::collections::BTreeMap::new();
        for r in &self.requests {
            *m.entry(r.outcome.label()).or_insert(0) += 1;
        }
        m
    }

    /// Requests whose client started connecting at or after `t` (none if `t` is unknown).
    pub fn sent_after(&self, t: Option<Instant>) -> usize {
        t.map_or(0, |t| self.requests.iter().filter(|r| r.start >= t).count())
    }

    /// The ground truth, for the test's output.
    pub fn report(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "clients: {} requests, {:?}",
            self.requests.len(),
            self.outcomes()
        );
        let _ = writeln!(
            o,
            "app: exit {}, cut (started, never finished) {:?}, run again on the replica {:?}",
            self.app_exit, self.cut, self.duplicates
        );
        let _ = writeln!(
            o,
            "sidecar: exit {:?}, 502s {} ({} of requests the app never started), error log: \
             {} refused connects, {} premature closes",
            self.sidecar_exit,
            self.sidecar_502.len(),
            self.refused_502.len(),
            self.refused_lines,
            self.premature_lines
        );
        let _ = writeln!(
            o,
            "pod namespace: AttemptFails +{}, OutRsts +{}, EstabResets +{}",
            self.attempt_fails, self.out_rsts, self.estab_resets
        );
        let _ = writeln!(
            o,
            "stops: app {:?}, sidecar {:?} after the app's was issued",
            self.app_stop.returned - self.app_stop.issued,
            self.sidecar_stop
                .map(|s| s.returned.saturating_duration_since(self.app_stop.issued))
        );
        o
    }
}
