//! Real backend containers under podman (runc, cgroupfs), running `tests/lab/backend.py`
//! through the host's python.
//!
//! Each [`Backend`] is two containers by default: a *holder* (busybox `sleep`) that owns the
//! network namespace and the address, and the server, joined to it with
//! `--network container:<holder>`. That is a Kubernetes pod: the sandbox keeps the address while
//! the app container stops, so connections that arrive after the server is gone are refused with
//! a RST, exactly as on a node. Without the holder (`BackendOpts::netns_holder = false`) podman
//! tears the network down as soon as the server exits, and later connects time out instead
//! (no RST: the address no longer exists).

use std::{
    fs,
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddrV4, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        Once,
        atomic::{AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use super::clock;

/// Every container (and log directory) the lab creates is named `dwlab-<pid>-<n>-...`.
pub const NAME_PREFIX: &str = "dwlab-";
/// The busybox image the containers run (`/bin/busybox` imported as a one-file rootfs).
pub const IMAGE: &str = "localhost/bb:latest";
/// Where the host side of the lab lives: one directory per container or proxy.
pub const LAB_DIR: &str = "/tmp/drainwatch-lab";
/// User-Agent of the lab's own requests to a backend (not counted as health checks).
pub const LAB_AGENT: &str = "drainwatch-lab";
/// Set to keep logs and configuration after a test (they are removed on drop otherwise).
pub const KEEP_ENV: &str = "DRAINWATCH_LAB_KEEP";

const RUNC: &str = "/usr/sbin/runc";
const ULIMITS: [&str; 4] = [
    "--ulimit",
    "nofile=10000:10000",
    "--ulimit",
    "nproc=1000:1000",
];

static SETUP: Once = Once::new();
static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A name no other lab object of this or any other run has: `dwlab-<pid>-<n>-<what>`.
pub fn unique_name(what: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{NAME_PREFIX}{}-{n}-{what}", std::process::id())
}

/// Runs `podman --runtime runc --cgroup-manager=cgroupfs <args>`; stdout, trimmed, or the error.
pub fn podman(args: &[&str]) -> Result<String, String> {
    let out = Command::new("podman")
        .arg("--runtime")
        .arg(RUNC)
        .arg("--cgroup-manager=cgroupfs")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running podman {args:?}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "podman {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Imports `localhost/bb:latest` from the host's `/bin/busybox` if the image is missing.
pub fn ensure_image() {
    if podman(&["image", "exists", IMAGE]).is_ok() {
        return;
    }
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("busybox is needed for the lab image (apt-get install busybox-static)");
    let root = PathBuf::from(LAB_DIR).join(unique_name("image"));
    fs::create_dir_all(root.join("rootfs/bin")).expect("image rootfs dir");
    fs::copy(busybox, root.join("rootfs/bin/busybox")).expect("copy busybox");
    let tar = root.join("rootfs.tar");
    let st = Command::new("tar")
        .arg("-C")
        .arg(root.join("rootfs"))
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .expect("tar");
    assert!(st.success(), "tar of the busybox rootfs failed");
    podman(&["import", tar.to_str().unwrap(), IMAGE]).expect("podman import of the busybox image");
    let _ = fs::remove_dir_all(&root);
}

/// Removes lab containers, HAProxy processes and directories left by runs whose process is gone
/// (an aborted test): names carry the creating pid, so a concurrent run's are left alone.
/// Returns how many containers were removed.
pub fn cleanup_leftovers() -> usize {
    let dead = |name: &str| -> bool {
        let Some(rest) = name.strip_prefix(NAME_PREFIX) else {
            return false;
        };
        let pid: u32 = match rest.split('-').next().and_then(|p| p.parse().ok()) {
            Some(p) => p,
            None => return false,
        };
        pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists()
    };
    let names = podman(&["ps", "-a", "--format", "{{.Names}}"]).unwrap_or_default();
    let mut stale: Vec<&str> = names.lines().filter(|n| dead(n)).collect();
    // Servers before their network holders: a holder with dependents cannot be removed.
    stale.sort_by_key(|n| n.ends_with("-net"));
    for name in &stale {
        let _ = podman(&["rm", "-f", "-t", "0", name]);
    }
    // An HAProxy whose run was SIGKILLed before PR_SET_PDEATHSIG could act: its command line
    // names its configuration in the dead run's directory.
    for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = fs::read(e.path().join("cmdline")).unwrap_or_default();
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let ours = args.first().is_some_and(|a| a.ends_with("haproxy"))
            && args.iter().any(|a| {
                a.strip_prefix(LAB_DIR)
                    .and_then(|r| r.strip_prefix('/'))
                    .is_some_and(dead)
            });
        if ours {
            // SAFETY: plain kill(2) of a process this harness started in an earlier run.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    if let Ok(dir) = fs::read_dir(LAB_DIR) {
        for e in dir.flatten() {
            if dead(&e.file_name().to_string_lossy()) {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
    stale.len()
}

/// Once per process: the image exists and leftovers of dead runs are gone.
pub fn setup_once() {
    SETUP.call_once(|| {
        fs::create_dir_all(LAB_DIR).expect("create the lab directory");
        ensure_image();
        let n = cleanup_leftovers();
        if n > 0 {
            eprintln!("lab: removed {n} leftover containers of earlier runs");
        }
    });
}

fn keep() -> bool {
    std::env::var_os(KEEP_ENV).is_some()
}

/// What the backend does on SIGTERM (see `tests/lab/backend.py`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// No handler: dies from SIGTERM's default action (exit 143) when run with `--init`.
    NoHandler,
    /// Closes the listener at once, finishes in-flight requests, exits 0.
    CloseListener,
    /// /health 503 and `Connection: close`, serves `drain_delay`, closes, finishes, exits 0.
    Drain,
    /// /health 503, serves `drain_delay` (0 by default), closes, waits for in-flight work
    /// without a deadline (work longer than the grace period is SIGKILLed: exit 137).
    Slow,
    /// No handler; exits with code 1 by itself (`crash_after`, or [`Backend::crash_at`]).
    Crash,
    /// Not HTTP: a socket service with a bounded connect path (`gate_workers` concurrent
    /// "authorisations" of `gate_auth` each), greeting every connection with one line and
    /// keeping it open; no handler (see `backend.py`). For reconnect storms.
    Gate,
}

impl Mode {
    /// The `--mode` value of backend.py.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::NoHandler => "no-handler",
            Mode::CloseListener => "close-listener",
            Mode::Drain => "drain",
            Mode::Slow => "slow",
            Mode::Crash => "crash",
            Mode::Gate => "gate",
        }
    }
}

/// How a backend container is run.
#[derive(Clone, Debug)]
pub struct BackendOpts {
    /// Port the server listens on inside the container.
    pub port: u16,
    /// `podman run --init`: catatonit is PID 1 and forwards SIGTERM to the server (without it a
    /// handler-less server is PID 1, ignores SIGTERM and is SIGKILLed at the deadline: 137).
    pub init: bool,
    /// A holder container owns the address, so it outlives the server (pod-like; see module docs).
    /// Without it the address disappears when the server exits; if no other container is on the
    /// bridge, podman removes the bridge too and the address would route off the host: send
    /// nothing to it after the exit.
    pub netns_holder: bool,
    /// `--network host`: the server listens in the host's namespace, on 127.0.0.1 among
    /// others (no holder then).
    pub host_network: bool,
    /// `--drain-delay` for `Drain` (default 5 s in backend.py) and `Slow` (default 0).
    pub drain_delay: Option<Duration>,
    /// `--crash-after` for `Crash`: seconds after start. [`Backend::crash_at`] works regardless.
    pub crash_after: Option<Duration>,
    /// Bound on waiting for the server to listen and answer /health.
    pub ready_timeout: Duration,
    /// Container labels (`--label k=v`), e.g. `com.docker.compose.service`, the workload name
    /// drainwatch gives containers outside Kubernetes.
    pub labels: Vec<(String, String)>,
    /// `listen()` backlog (backend.py's default: 256).
    pub backlog: Option<u32>,
    /// `Gate`: concurrent authorisations (default 10) and the work of each (default 20 ms).
    pub gate_workers: Option<u32>,
    pub gate_auth: Option<Duration>,
    /// A second listener on this port with this backlog that never accepts.
    pub hold: Option<(u16, u32)>,
    /// Put in the container's name before the logical name (`dwlab-<pid>-<n>-<prefix>-s1`),
    /// so a demo's workloads say what they are.
    pub name_prefix: Option<String>,
}

impl Default for BackendOpts {
    fn default() -> Self {
        Self {
            port: 8080,
            init: true,
            netns_holder: true,
            host_network: false,
            drain_delay: None,
            crash_after: None,
            ready_timeout: Duration::from_secs(10),
            labels: Vec::new(),
            backlog: None,
            gate_workers: None,
            gate_auth: None,
            hold: None,
            name_prefix: None,
        }
    }
}

/// When `podman stop` was issued and when it returned (the container had exited by then).
#[derive(Clone, Copy, Debug)]
pub struct StopTimes {
    pub issued: Instant,
    pub returned: Instant,
}

/// One line of the backend's `events.log`: `listening`, `sigterm`, `not-ready`,
/// `listener-closed`, `idle-closed`, `drained`, `crash`, `exit`.
#[derive(Clone, Debug)]
pub struct ServerEvent {
    pub kind: String,
    pub mono_ns: u64,
    pub at: Instant,
    /// The rest of the line (`listening`: in-container pid and mode; `exit`: code).
    pub detail: String,
}

/// One line of the backend's `requests.log`: a `/work` request started or ended.
#[derive(Clone, Debug)]
pub struct WorkEntry {
    pub started: bool,
    pub id: String,
    pub at: Instant,
}

/// A running backend container (and its network holder). Dropping it removes both.
#[derive(Debug)]
pub struct Backend {
    /// Logical name (the HAProxy server name, e.g. `s1`), also the server's `X-Backend`.
    pub name: String,
    /// The podman container name (`dwlab-<pid>-<n>-<name>`).
    pub container: String,
    /// The container id (64 hex).
    pub id: String,
    /// Host pid of the server (the python process, not catatonit).
    pub pid: u32,
    /// Host pid of the container's PID 1 (catatonit with `init`, else the server itself).
    pub init_pid: u32,
    /// Address on podman's bridge.
    pub ip: Ipv4Addr,
    pub port: u16,
    pub mode: Mode,
    /// Host directory with requests.log, health.log, events.log.
    pub log_dir: PathBuf,
    /// The network holder container, when `netns_holder`.
    pub holder: Option<String>,
    /// Run with `--init` (the server is catatonit's child).
    pub init: bool,
}

/// The backend server script, bind-mounted into every container.
pub fn backend_script() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/lab/backend.py"))
}

/// The host python run inside the containers, and the bind mounts it needs.
fn python() -> (String, Vec<String>) {
    let mut mounts: Vec<String> = ["/usr", "/lib", "/lib64"]
        .into_iter()
        .filter(|p| Path::new(p).exists())
        .map(|p| format!("{p}:{p}:ro"))
        .collect();
    if Path::new("/usr/bin/python3").exists() {
        return ("/usr/bin/python3".into(), mounts);
    }
    let pyenv = fs::read_dir("/root/.pyenv/versions")
        .ok()
        .and_then(|d| {
            d.flatten()
                .map(|e| e.path().join("bin/python3"))
                .filter(|p| p.exists())
                .max()
        })
        .expect("no python3 on the host: neither /usr/bin/python3 nor /root/.pyenv");
    mounts.push("/root/.pyenv:/root/.pyenv:ro".into());
    (pyenv.to_string_lossy().into_owned(), mounts)
}

fn inspect(container: &str, format: &str) -> Result<String, String> {
    podman(&["inspect", "--format", format, container])
}

impl Backend {
    /// Starts a backend container running `mode` and waits (bounded by `opts.ready_timeout`)
    /// until the server listens and answers `GET /health` with 200. Panics with podman's and the
    /// server's output if it does not come up.
    pub fn start(name: &str, mode: Mode, opts: BackendOpts) -> Backend {
        setup_once();
        let container = match &opts.name_prefix {
            Some(p) => unique_name(&format!("{p}-{name}")),
            None => unique_name(name),
        };
        let log_dir = PathBuf::from(LAB_DIR).join(&container);
        fs::create_dir_all(&log_dir).expect("backend log dir");
        let mut b = Backend {
            name: name.to_string(),
            container: container.clone(),
            id: String::new(),
            pid: 0,
            init_pid: 0,
            ip: Ipv4Addr::UNSPECIFIED,
            port: opts.port,
            mode,
            log_dir: log_dir.clone(),
            holder: None,
            init: opts.init,
        };
        // From here on, `b`'s Drop removes whatever was created if a step panics.
        let label = format!("drainwatch.lab={}", std::process::id());
        if opts.netns_holder && !opts.host_network {
            let holder = format!("{container}-net");
            let mut args = vec!["run", "-d", "--name", &holder, "--label", &label];
            args.extend(ULIMITS);
            // Bounded: a holder outlives no run by more than a day even if never removed.
            args.extend([IMAGE, "/bin/busybox", "sleep", "86400"]);
            podman(&args).unwrap_or_else(|e| panic!("starting the network holder: {e}"));
            b.holder = Some(holder);
        }
        let (py, mounts) = python();
        let script = format!("{}:/lab/backend.py:ro", backend_script().display());
        let logs = format!("{}:/lab/log", log_dir.display());
        let network = match &b.holder {
            Some(h) => Some(format!("container:{h}")),
            None => opts.host_network.then(|| "host".to_string()),
        };
        let port = opts.port.to_string();
        let drain = opts.drain_delay.map(|d| d.as_secs_f64().to_string());
        let crash_after = opts.crash_after.map(|d| d.as_secs_f64().to_string());
        let labels: Vec<String> = opts
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let backlog = opts.backlog.map(|b| b.to_string());
        let workers = opts.gate_workers.map(|w| w.to_string());
        let auth = opts.gate_auth.map(|d| (d.as_secs_f64() * 1e3).to_string());
        let hold = opts.hold.map(|(p, b)| (p.to_string(), b.to_string()));
        let mut args: Vec<&str> = vec!["run", "-d", "--name", &container, "--label", &label];
        for l in &labels {
            args.extend(["--label", l]);
        }
        args.extend(ULIMITS);
        if opts.init {
            args.push("--init");
        }
        if let Some(n) = &network {
            args.extend(["--network", n]);
        }
        for m in &mounts {
            args.extend(["-v", m]);
        }
        args.extend(["-v", &script, "-v", &logs, IMAGE, &py, "/lab/backend.py"]);
        args.extend(["--mode", mode.as_str(), "--port", &port, "--name", name]);
        args.extend(["--log-dir", "/lab/log"]);
        if let Some(d) = &drain {
            args.extend(["--drain-delay", d]);
        }
        if let Some(b) = &backlog {
            args.extend(["--backlog", b]);
        }
        if let Some(w) = &workers {
            args.extend(["--workers", w]);
        }
        if let Some(a) = &auth {
            args.extend(["--auth-ms", a]);
        }
        if let Some((port, backlog)) = &hold {
            args.extend(["--hold-port", port, "--hold-backlog", backlog]);
        }
        if mode == Mode::Crash {
            args.extend(["--crash-at-file", "/lab/log/crash-at"]);
            if let Some(c) = &crash_after {
                args.extend(["--crash-after", c]);
            }
        }
        let id = podman(&args).unwrap_or_else(|e| panic!("starting backend {name}: {e}"));
        b.id = id.lines().last().unwrap_or_default().to_string();
        assert!(
            b.id.len() == 64 && b.id.chars().all(|c| c.is_ascii_hexdigit()),
            "podman run printed {id:?}, not a container id"
        );

        // Listening (from its own log: polling /health earlier would cause refused connects
        // that a test counting resets would see), then one /health that must answer 200.
        let deadline = Instant::now() + opts.ready_timeout;
        b.await_listening(0, deadline);
        b.ip = if opts.host_network {
            Ipv4Addr::LOCALHOST
        } else {
            let ip_of = b.holder.clone().unwrap_or_else(|| container.clone());
            let ip =
                inspect(&ip_of, "{{.NetworkSettings.IPAddress}}").expect("inspect the address");
            ip.parse()
                .unwrap_or_else(|_| panic!("container address {ip:?} is not IPv4"))
        };
        if mode == Mode::Gate {
            // Not HTTP: one connection that must be greeted.
            loop {
                match greeting(b.addr(), Duration::from_secs(2)) {
                    Ok(_) => return b,
                    r if Instant::now() > deadline => {
                        panic!("backend {name} sent no greeting in time: {r:?}")
                    }
                    _ => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        }
        loop {
            match http_get(b.addr(), "/health", Duration::from_secs(2)) {
                Ok((200, _)) => break,
                r if Instant::now() > deadline => {
                    panic!("backend {name} /health did not answer 200 in time: {r:?}")
                }
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        b
    }

    /// Waits (until `deadline`) for the server's `skip + 1`-th `listening` line, then takes the
    /// pids of the container's PID 1 and of the server and checks the server is the process
    /// that logged it.
    fn await_listening(&mut self, skip: usize, deadline: Instant) {
        let listening = loop {
            let mut found = self.events().into_iter().filter(|e| e.kind == "listening");
            if let Some(ev) = found.nth(skip) {
                break ev;
            }
            if Instant::now() > deadline || self.status() == "exited" {
                panic!(
                    "backend {} did not start listening in time: status {}, output:\n{}",
                    self.name,
                    self.status(),
                    podman(&["logs", &self.container]).unwrap_or_else(|e| e)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.init_pid = inspect(&self.container, "{{.State.Pid}}")
            .expect("inspect the pid")
            .parse()
            .expect("State.Pid");
        self.pid = if self.init {
            server_child(self.init_pid, deadline)
        } else {
            self.init_pid
        };
        // The pid python logged is its pid inside the container: the last NSpid entry.
        let ns_pid = listening.detail.split_whitespace().next().unwrap_or("");
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap_or_default();
        let nspid = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|l| l.split_whitespace().last())
            .unwrap_or("");
        assert_eq!(
            nspid, ns_pid,
            "host pid {} of {} is not the server that logged pid {ns_pid}",
            self.pid, self.name
        );
    }

    /// `podman restart -t grace_secs`: the same container (same id, name and, with a network
    /// holder, address) stopped and started again. Returns once the new server process listens
    /// (from its own log: nothing connects to it, so a test can count every connection after
    /// the restart), with the times the restart was issued and returned; `pid` and `init_pid`
    /// are the new processes'.
    pub fn restart(&mut self, grace_secs: u32, timeout: Duration) -> StopTimes {
        let before = self
            .events()
            .iter()
            .filter(|e| e.kind == "listening")
            .count();
        let grace = grace_secs.to_string();
        let issued = Instant::now();
        podman(&["restart", "-t", &grace, &self.container])
            .unwrap_or_else(|e| panic!("restarting {}: {e}", self.name));
        let returned = Instant::now();
        self.await_listening(before, issued + timeout);
        StopTimes { issued, returned }
    }

    /// Host pid of a process in the server's network namespace that outlives the server (the
    /// network holder's, else the server's own): where the namespace's `/proc/<pid>/net` files
    /// are read across a restart.
    pub fn netns_pid(&self) -> u32 {
        match &self.holder {
            Some(h) => inspect(h, "{{.State.Pid}}")
                .ok()
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("no pid for the network holder {h}")),
            None => self.pid,
        }
    }

    /// `ip:port` of the server.
    pub fn addr(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.ip, self.port)
    }

    /// podman's `State.Status` (`running`, `exited`, ...).
    pub fn status(&self) -> String {
        inspect(&self.container, "{{.State.Status}}").unwrap_or_else(|e| e)
    }

    /// `podman stop -t grace_secs`: SIGTERM, SIGKILL after the grace period. Returns when podman
    /// returned (the container has exited), with the times it was issued and returned.
    pub fn stop(&self, grace_secs: u32) -> StopTimes {
        let grace = grace_secs.to_string();
        let issued = Instant::now();
        podman(&["stop", "-t", &grace, &self.container])
            .unwrap_or_else(|e| panic!("stopping {}: {e}", self.name));
        StopTimes {
            issued,
            returned: Instant::now(),
        }
    }

    /// Arms a `Crash` backend to exit with code 1 at `at` (written to its crash-at file, which
    /// the server polls every 10 ms: arm it at least 50 ms ahead).
    pub fn crash_at(&self, at: Instant) {
        assert_eq!(self.mode, Mode::Crash, "crash_at needs a Crash backend");
        let tmp = self.log_dir.join("crash-at.tmp");
        fs::write(&tmp, clock::mono_ns_of(at).to_string()).expect("write crash-at");
        fs::rename(&tmp, self.log_dir.join("crash-at")).expect("rename crash-at");
    }

    /// Waits (bounded) until the container has exited; false on timeout.
    pub fn wait_exited(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if matches!(self.status().as_str(), "exited" | "stopped") {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The container's exit code (`State.ExitCode`), after waiting up to 30 s for it to exit.
    pub fn exit_code(&self) -> i32 {
        assert!(
            self.wait_exited(Duration::from_secs(30)),
            "{} did not exit within 30 s (status {})",
            self.name,
            self.status()
        );
        inspect(&self.container, "{{.State.ExitCode}}")
            .expect("inspect the exit code")
            .parse()
            .expect("State.ExitCode")
    }

    fn read_log(&self, file: &str) -> Vec<String> {
        let text = fs::read_to_string(self.log_dir.join(file)).unwrap_or_default();
        // Only complete lines: one being written has no newline yet.
        let complete = text.rfind('\n').map_or("", |i| &text[..i]);
        complete.lines().map(str::to_string).collect()
    }

    /// The request log, raw: `start <id> <ns>` and `end <id> <ns>` lines.
    pub fn log_lines(&self) -> Vec<String> {
        self.read_log("requests.log")
    }

    /// The request log, parsed.
    pub fn work_log(&self) -> Vec<WorkEntry> {
        self.log_lines()
            .iter()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let started = match f.next()? {
                    "start" => true,
                    "end" => false,
                    _ => return None,
                };
                let id = f.next()?.to_string();
                let ns: u64 = f.next()?.parse().ok()?;
                Some(WorkEntry {
                    started,
                    id,
                    at: clock::instant_of_mono_ns(ns),
                })
            })
            .collect()
    }

    /// The server's lifecycle events (events.log), parsed.
    pub fn events(&self) -> Vec<ServerEvent> {
        self.read_log("events.log")
            .iter()
            .filter_map(|l| {
                let mut f = l.splitn(3, ' ');
                let kind = f.next()?.to_string();
                let mono_ns: u64 = f.next()?.trim().parse().ok()?;
                Some(ServerEvent {
                    kind,
                    mono_ns,
                    at: clock::instant_of_mono_ns(mono_ns),
                    detail: f.next().unwrap_or("").trim().to_string(),
                })
            })
            .collect()
    }

    /// When the first event of `kind` happened, if it did.
    pub fn event_at(&self, kind: &str) -> Option<Instant> {
        self.events()
            .into_iter()
            .find(|e| e.kind == kind)
            .map(|e| e.at)
    }

    /// Every `GET /health` the server answered except the lab's own probes (HAProxy's checks,
    /// in practice): when, and the status it gave.
    pub fn health_checks(&self) -> Vec<(Instant, u16)> {
        self.read_log("health.log")
            .iter()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                (f.next()? == "health").then_some(())?;
                let ns: u64 = f.next()?.parse().ok()?;
                let status: u16 = f.next()?.parse().ok()?;
                (f.next() != Some(LAB_AGENT)).then_some(())?;
                Some((clock::instant_of_mono_ns(ns), status))
            })
            .collect()
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        // -t 0: the holder's busybox sleep is PID 1 and would ignore SIGTERM for 10 s.
        let _ = podman(&["rm", "-f", "-t", "0", &self.container]);
        if let Some(h) = &self.holder {
            let _ = podman(&["rm", "-f", "-t", "0", h]);
        }
        if !keep() {
            let _ = fs::remove_dir_all(&self.log_dir);
        }
    }
}

/// The single child of catatonit: the server. Bounded by `deadline`.
fn server_child(init_pid: u32, deadline: Instant) -> u32 {
    loop {
        let children = fs::read_to_string(format!("/proc/{init_pid}/task/{init_pid}/children"))
            .unwrap_or_default();
        let kids: Vec<u32> = children
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if let [pid] = kids[..] {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "catatonit (pid {init_pid}) has children {kids:?}, expected exactly the server"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `Gate` server's greeting line on a fresh connection (closed afterwards).
pub fn greeting(addr: SocketAddrV4, timeout: Duration) -> Result<String, String> {
    if !on_local_link(*addr.ip()) {
        return Err(format!(
            "{} is on no local bridge: its container is gone",
            addr.ip()
        ));
    }
    let s =
        TcpStream::connect_timeout(&addr.into(), timeout).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(timeout)).ok();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(s), &mut line)
        .map_err(|e| format!("read: {e}"))?;
    if line.starts_with("hello ") && line.ends_with('\n') {
        Ok(line)
    } else {
        Err(format!("not a greeting: {line:?}"))
    }
}

/// A one-shot `GET path` over a fresh connection (`Connection: close`): status and body.
pub fn http_get(
    addr: impl Into<std::net::SocketAddr>,
    path: &str,
    timeout: Duration,
) -> Result<(u16, String), String> {
    let addr = addr.into();
    if let std::net::IpAddr::V4(ip) = addr.ip()
        && !ip.is_loopback()
        && !on_local_link(ip)
    {
        return Err(format!("{ip} is on no local bridge: its container is gone"));
    }
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(timeout)).ok();
    s.set_write_timeout(Some(timeout)).ok();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: lab\r\nUser-Agent: {LAB_AGENT}\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&buf);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status line in {text:?}"))?;
    let body = text.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
    Ok((status, body.to_string()))
}

/// Whether `ip` is on a directly connected network (a route with no gateway), such as podman's
/// bridge. When the last container leaves it, netavark deletes the bridge and its route, and a
/// stale container address would then go out through the default route, off the host: the lab
/// never sends anything to such an address.
pub fn on_local_link(ip: Ipv4Addr) -> bool {
    let routes = fs::read_to_string("/proc/net/route").unwrap_or_default();
    let ip = u32::from_le_bytes(ip.octets());
    routes.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let hex = |i: usize| f.get(i).and_then(|x| u32::from_str_radix(x, 16).ok());
        match (hex(1), hex(2), hex(7)) {
            (Some(dest), Some(0), Some(mask)) => mask != 0 && ip & mask == dest,
            _ => false,
        }
    })
}
