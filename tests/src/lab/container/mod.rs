//! Real backend containers under podman (runc, cgroupfs), running `tests/lab/backend.py`
//! through the host's python.
//!
//! Each [`Backend`] is two containers by default: a *holder* (busybox `sleep`) that owns the
//! network namespace and the address, and the server, joined to it with
//! `--network container:<holder>`. That is a Kubernetes pod: the sandbox keeps the address while
//! the app container stops, so connections that arrive after the server is gone are refused with
//! a RST, exactly as on a node. Without the holder (`BackendOpts::netns_holder = false`) podman
//! tears the network down as soon as the server exits, and later connects fail instead (no
//! RST: the address no longer exists). If no other container is on the network, podman deletes
//! the bridge too: such a lab keeps a [`BridgeHolder`] while it sends (see `lab::net`).

mod backend;
mod bridge;
mod httpd;
mod logs;
mod names;
mod podman;
mod probe;

use std::{
    net::Ipv4Addr,
    path::PathBuf,
    time::{Duration, Instant},
};

pub(crate) use backend::server_child;
pub use backend::{backend_script, lab_python};
pub use bridge::BridgeHolder;
pub use httpd::Httpd;
pub(crate) use names::keep;
pub use names::{cleanup_leftovers, dead_run, setup_once, unique_name};
pub(crate) use podman::{NO_RESOLVER, ULIMITS, inspect};
pub use podman::{ensure_image, podman};
pub use probe::{greeting, http_get, on_local_link};

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

/// What the backend does on SIGTERM (see `tests/lab/backend.py`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// No handler: dies from SIGTERM's default action (exit 143) when run with `--init`.
    NoHandler,
    /// Closes the listener at once, finishes in-flight requests, exits 0.
    CloseListener,
    /// Exits 0 at once: the listener still open, in-flight requests cut.
    ExitZero,
    /// /health 503 and `Connection: close`, serves `drain_delay`, closes, finishes, exits 0.
    Drain,
    /// /health 503, serves `drain_delay` (0 by default), closes, waits for in-flight work
    /// without a deadline (work longer than the grace period is SIGKILLed: exit 137).
    Slow,
    /// /health 503, closes the listener, serves its open keep-alive connections and exits only
    /// once every one has ended, idle ones too: with clients reusing them, SIGKILLed at the
    /// deadline (exit 137).
    KeepAlive,
    /// No handler; exits with code 1 by itself (`crash_after`, or [`Backend::crash_at`]).
    Crash,
    /// Not HTTP: a socket service with a bounded connect path (`gate_workers` concurrent
    /// "authorisations" of `gate_auth` each), greeting every connection with one line and
    /// keeping it open; no handler (see `backend.py`). For reconnect storms.
    Gate,
    /// Server-sent events: streams end at their own deadline (`stream_rotation`) with a final
    /// event; SIGTERM closes the listener and lets open streams run to it (see `backend.py`).
    Stream,
}

impl Mode {
    /// The `--mode` value of backend.py.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::NoHandler => "no-handler",
            Mode::CloseListener => "close-listener",
            Mode::ExitZero => "exit-zero",
            Mode::Drain => "drain",
            Mode::Slow => "slow",
            Mode::KeepAlive => "keep-alive",
            Mode::Crash => "crash",
            Mode::Gate => "gate",
            Mode::Stream => "stream",
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
    /// bridge, podman removes the bridge too and the address would route off the host (onto the
    /// fallback blackhole, `lab::net`): send nothing to it after the exit unless a
    /// [`BridgeHolder`] keeps the bridge up.
    pub netns_holder: bool,
    /// `--network host`: the server listens in the host's namespace, on 127.0.0.1 among
    /// others (no holder then).
    pub host_network: bool,
    /// `--drain-delay` for `Drain` (default 5 s in backend.py) and `Slow` (default 0).
    pub drain_delay: Option<Duration>,
    /// `--crash-after` for `Crash`: seconds after start. [`Backend::crash_at`] works regardless.
    pub crash_after: Option<Duration>,
    /// `--crash-code` for `Crash`: the code it exits with (1 by default; 0 is a normal exit,
    /// its work done).
    pub crash_code: Option<i32>,
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
    /// `--listen-delay`: a slow start, every run sleeps this long before `listen()`.
    pub listen_delay: Option<Duration>,
    /// `Stream`: the streams' lifetimes, events and drain.
    pub stream: Option<StreamOpts>,
    /// `--ip`: the address on podman's bridge (a replacement at a stopped container's
    /// address); that of the network holder when there is one. With `netns`, the address the
    /// lab gave that namespace.
    pub ip: Option<Ipv4Addr>,
    /// A network namespace the lab made (a path, `--network ns:<path>`), as a CNI plugin makes
    /// a pod's: no holder then.
    pub netns: Option<String>,
    /// `--sysctl k=v` of its own network namespace (none with a holder's).
    pub sysctls: Vec<String>,
}

/// How a `Stream` backend ends its streams (see `backend.py`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StreamOpts {
    /// The longest lifetime (`--rotation`); each stream's is drawn uniformly in
    /// `[lifetime_min × rotation, rotation]` (`--lifetime-min`, 1.0: all the same), from
    /// `seed`.
    pub rotation: Duration,
    pub lifetime_min: f64,
    pub seed: u64,
    /// The period of its events.
    pub event: Duration,
    /// On SIGTERM: let streams run to their deadlines, or end them all at once.
    pub drain: StreamDrain,
}

/// What a `Stream` backend does with its open streams on SIGTERM (after closing its listener).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamDrain {
    /// Let each run to its own deadline (the Mercure-style drain).
    Timers,
    /// End every one at once with its final event.
    AtOnce,
}

impl StreamDrain {
    pub fn as_str(self) -> &'static str {
        match self {
            StreamDrain::Timers => "timers",
            StreamDrain::AtOnce => "at-once",
        }
    }
}

impl BackendOpts {
    /// `Drain` for 0.8 s with no network holder: its address goes with it, so connects after
    /// its exit meet a vanished address (keep a [`BridgeHolder`] while anything sends).
    pub fn gone_after_drain() -> Self {
        Self {
            netns_holder: false,
            drain_delay: Some(Duration::from_millis(800)),
            ..Self::default()
        }
    }
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
            crash_code: None,
            ready_timeout: Duration::from_secs(10),
            labels: Vec::new(),
            backlog: None,
            gate_workers: None,
            gate_auth: None,
            hold: None,
            name_prefix: None,
            listen_delay: None,
            stream: None,
            ip: None,
            netns: None,
            sysctls: Vec::new(),
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
/// `listener-closed`, `idle-closed`, `drained`, `crash`, `exit`, and per connection
/// `conn-open` and `conn-close` (detail: the peer's port).
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

/// One connection the server accepted, from its own events and health log.
#[derive(Clone, Debug)]
pub struct ConnEntry {
    pub opened: Instant,
    /// `None`: still open when the log was read (or the server died holding it).
    pub closed: Option<Instant>,
    /// It carried a health check (`GET /health`).
    pub check: bool,
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
