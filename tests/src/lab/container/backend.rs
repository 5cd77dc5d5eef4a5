//! Starting and stopping a backend container: its network holder, the server with the host's
//! python, readiness, restart, stop, crash, exit code; removed on drop.

use std::{
    fs,
    net::{Ipv4Addr, SocketAddrV4},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use super::{
    Backend, BackendOpts, IMAGE, LAB_DIR, Mode, StopTimes, greeting, http_get,
    names::{keep, setup_once, unique_name},
    podman::{NO_RESOLVER, ULIMITS, inspect, podman},
};
use crate::lab::{clock, net::require_bridge_route};

/// The backend server script, bind-mounted into every container.
pub fn backend_script() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/lab/backend.py"))
}

/// The host python as the containers see it (at the same path): for `podman exec`.
pub fn lab_python() -> String {
    python().0
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

impl Backend {
    /// Starts a backend container running `mode` and waits (bounded by `opts.ready_timeout`)
    /// until the server listens and answers `GET /health` with 200. Panics with podman's and the
    /// server's output if it does not come up.
    pub fn start(name: &str, mode: Mode, opts: BackendOpts) -> Backend {
        let timeout = opts.ready_timeout;
        let mut b = Self::launch(name, mode, opts);
        b.await_ready(Instant::now() + timeout);
        b
    }

    /// Starts it without waiting: once `podman run` returned, with its address known (from
    /// the network holder, or the container itself) and `pid` not yet (see `await_ready`).
    pub fn launch(name: &str, mode: Mode, opts: BackendOpts) -> Backend {
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
        let fixed_ip = opts.ip.map(|ip| ip.to_string());
        if opts.netns_holder && !opts.host_network && opts.netns.is_none() {
            let holder = format!("{container}-net");
            let mut args = vec!["run", "-d", "--name", &holder, "--label", &label];
            args.extend(ULIMITS);
            args.extend(NO_RESOLVER);
            if let Some(ip) = &fixed_ip {
                args.extend(["--ip", ip]);
            }
            // Bounded: a holder outlives no run by more than a day even if never removed.
            args.extend([IMAGE, "/bin/busybox", "sleep", "86400"]);
            podman(&args).unwrap_or_else(|e| panic!("starting the network holder: {e}"));
            b.holder = Some(holder);
        }
        let (py, mounts) = python();
        let script = format!("{}:/lab/backend.py:ro", backend_script().display());
        let logs = format!("{}:/lab/log", log_dir.display());
        let network = match (&b.holder, &opts.netns) {
            (Some(h), _) => Some(format!("container:{h}")),
            (None, Some(path)) => Some(format!("ns:{path}")),
            (None, None) => opts.host_network.then(|| "host".to_string()),
        };
        let port = opts.port.to_string();
        let drain = opts.drain_delay.map(|d| d.as_secs_f64().to_string());
        let crash_after = opts.crash_after.map(|d| d.as_secs_f64().to_string());
        let crash_code = opts.crash_code.map(|c| c.to_string());
        let labels: Vec<String> = opts
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let backlog = opts.backlog.map(|b| b.to_string());
        let workers = opts.gate_workers.map(|w| w.to_string());
        let auth = opts.gate_auth.map(|d| (d.as_secs_f64() * 1e3).to_string());
        let hold = opts.hold.map(|(p, b)| (p.to_string(), b.to_string()));
        let listen_delay = opts.listen_delay.map(|d| d.as_secs_f64().to_string());
        let stream = opts.stream.map(|s| {
            let ms = s.event.as_secs_f64() * 1e3;
            [
                s.rotation.as_secs_f64().to_string(),
                ms.to_string(),
                s.lifetime_min.to_string(),
                s.seed.to_string(),
            ]
        });
        let mut args: Vec<&str> = vec!["run", "-d", "--name", &container, "--label", &label];
        for l in &labels {
            args.extend(["--label", l]);
        }
        args.extend(ULIMITS);
        if opts.init {
            args.push("--init");
        }
        match &network {
            Some(n) => args.extend(["--network", n]),
            None => args.extend(NO_RESOLVER),
        }
        if let (None, Some(ip)) = (&network, &fixed_ip) {
            args.extend(["--ip", ip]);
        }
        for s in &opts.sysctls {
            args.extend(["--sysctl", s]);
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
        if let Some(d) = &listen_delay {
            args.extend(["--listen-delay", d]);
        }
        if let (Some([rotation, event, min, seed]), Some(o)) = (&stream, &opts.stream) {
            args.extend(["--rotation", rotation, "--event-ms", event]);
            args.extend(["--lifetime-min", min, "--seed", seed]);
            args.extend(["--stream-drain", o.drain.as_str()]);
        }
        if mode == Mode::Crash {
            args.extend(["--crash-at-file", "/lab/log/crash-at"]);
            if let Some(c) = &crash_after {
                args.extend(["--crash-after", c]);
            }
            if let Some(c) = &crash_code {
                args.extend(["--crash-code", c]);
            }
        }
        let id = podman(&args).unwrap_or_else(|e| panic!("starting backend {name}: {e}"));
        b.id = id.lines().last().unwrap_or_default().to_string();
        assert!(
            b.id.len() == 64 && b.id.chars().all(|c| c.is_ascii_hexdigit()),
            "podman run printed {id:?}, not a container id"
        );

        b.ip = if opts.host_network {
            Ipv4Addr::LOCALHOST
        } else if let (Some(_), Some(ip)) = (&opts.netns, opts.ip) {
            ip
        } else {
            let ip_of = b.holder.clone().unwrap_or_else(|| container.clone());
            let ip =
                inspect(&ip_of, "{{.NetworkSettings.IPAddress}}").expect("inspect the address");
            ip.parse()
                .unwrap_or_else(|_| panic!("container address {ip:?} is not IPv4"))
        };
        // Every test sends to it next: its address must be on a bridge (see `lab::net`).
        b.require_route();
        b
    }

    /// Waits (until `deadline`) for a launched server to listen (from its own log: polling
    /// /health earlier would cause refused connects that a test counting resets would see),
    /// then for one /health that must answer 200 (a greeting for `Gate`).
    pub fn await_ready(&mut self, deadline: Instant) {
        self.await_listening(0, deadline);
        let name = &self.name;
        if self.mode == Mode::Gate {
            // Not HTTP: one connection that must be greeted.
            loop {
                match greeting(self.addr(), Duration::from_secs(2)) {
                    Ok(_) => return,
                    r if Instant::now() > deadline => {
                        panic!("backend {name} sent no greeting in time: {r:?}")
                    }
                    _ => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        }
        loop {
            match http_get(self.addr(), "/health", Duration::from_secs(2)) {
                Ok((200, _)) => break,
                r if Instant::now() > deadline => {
                    panic!("backend {name} /health did not answer 200 in time: {r:?}")
                }
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Waits (until `deadline`) for a launched server to listen, and no more: for a gate that
    /// accepts nothing (`gate_workers: Some(0)`), whose connections wait in its accept queue.
    pub fn await_listening_only(&mut self, deadline: Instant) {
        self.await_listening(0, deadline);
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

    /// Panics unless the server's address is routed through a local bridge: a lab calls it
    /// before each phase that sends to the address, and fails rather than send off the host.
    pub fn require_route(&self) {
        if self.ip.is_loopback() {
            return;
        }
        if let Err(e) = require_bridge_route(self.ip.into()) {
            panic!(
                "lab: refusing to send to {} ({}): {e}",
                self.name, self.container
            );
        }
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

    /// Arms a `Crash` backend to exit (code 1, or its `crash_code`) at `at` (written to its crash-at file, which
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
pub(crate) fn server_child(init_pid: u32, deadline: Instant) -> u32 {
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
