//! A Node program of `tests/lab/socketio/` in a podman container (runc, cgroupfs), run by the
//! host's Node through the read-only `/usr`, `/lib` and `/lib64` mounts, with the lab's npm
//! packages (`node_modules`, installed by `cargo xtask setup`) mounted read-only beside it and
//! a host directory for its logs.

use std::{
    fs,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::lab::{
    container::{
        IMAGE, LAB_DIR, NO_RESOLVER, StopTimes, ULIMITS, inspect, keep, podman, setup_once,
        unique_name,
    },
    net::require_bridge_route,
};

/// The lab's Node programs and their `package.json` / `package-lock.json`.
pub fn lab_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/lab/socketio"))
}

/// Where `npm ci` (run by `cargo xtask setup`) installs the pinned packages; ignored by git.
pub fn node_modules() -> PathBuf {
    lab_dir().join("node_modules")
}

/// The host's Node, as the containers see it (same path).
pub const NODE: &str = "/usr/bin/node";

/// Panics with what to do unless Node and the lab's packages are installed.
pub fn require_packages() {
    assert!(
        Path::new(NODE).exists(),
        "{NODE} is missing: the Socket.IO lab runs the host's Node 20 in its containers"
    );
    for pkg in ["socket.io", "socket.io-client"] {
        let manifest = node_modules().join(pkg).join("package.json");
        assert!(
            manifest.exists(),
            "{} is missing: `cargo xtask setup` installs the Socket.IO lab's packages \
             (npm ci in {})",
            manifest.display(),
            lab_dir().display()
        );
    }
}

/// The version of an installed package (from its package.json), for the report.
pub fn package_version(pkg: &str) -> String {
    let text =
        fs::read_to_string(node_modules().join(pkg).join("package.json")).unwrap_or_default();
    serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v["version"].as_str().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// How a Node container is run.
#[derive(Clone, Debug, Default)]
pub struct NodeOpts {
    /// `podman run --init`: catatonit is PID 1 and forwards SIGTERM (without it Node is PID 1
    /// and, with no handler, ignores SIGTERM: SIGKILLed at the deadline).
    pub init: bool,
    pub labels: Vec<(String, String)>,
    /// Address and MAC on podman's bridge (a replacement at the same address); podman picks
    /// them otherwise.
    pub addr: Option<(Ipv4Addr, String)>,
    /// `--cpuset-cpus`: the CPUs it may run on.
    pub cpus: Option<String>,
}

/// A Node program running in its own container. Dropping it removes the container.
#[derive(Debug)]
pub struct NodeContainer {
    /// The podman container name (`dwlab-<pid>-<n>-<name>`).
    pub container: String,
    pub id: String,
    pub ip: Ipv4Addr,
    pub mac: String,
    /// Host directory mounted at `/lab/log`.
    pub log_dir: PathBuf,
    /// `podman run` issued and returned.
    pub launched: (Instant, Instant),
}

impl NodeContainer {
    /// `podman run -d` of `node /lab/sio/<script> <args>`; returns once podman has, with the
    /// container's address known and checked to be on a local bridge. Retries for up to
    /// `bound` while the address is still held (a replacement started as its predecessor's
    /// network is torn down).
    pub fn launch(
        name: &str,
        script: &str,
        args: &[String],
        opts: &NodeOpts,
        bound: Duration,
    ) -> NodeContainer {
        setup_once();
        require_packages();
        let container = unique_name(name);
        let log_dir = PathBuf::from(LAB_DIR).join(&container);
        fs::create_dir_all(&log_dir).expect("node container log dir");
        let lab = format!("{}:/lab/sio:ro", lab_dir().display());
        let logs = format!("{}:/lab/log", log_dir.display());
        let label = format!("drainwatch.lab={}", std::process::id());
        let labels: Vec<String> = opts
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let addr = opts.addr.as_ref().map(|(ip, mac)| (ip.to_string(), mac));
        let script = format!("/lab/sio/{script}");
        let mounts: Vec<String> = ["/usr", "/lib", "/lib64"]
            .into_iter()
            .filter(|m| Path::new(m).exists())
            .map(|m| format!("{m}:{m}:ro"))
            .collect();
        let mut cmd: Vec<&str> = vec!["run", "-d", "--name", &container, "--label", &label];
        for l in &labels {
            cmd.extend(["--label", l]);
        }
        cmd.extend(ULIMITS);
        cmd.extend(NO_RESOLVER);
        if opts.init {
            cmd.push("--init");
        }
        if let Some((ip, mac)) = &addr {
            cmd.extend(["--ip", ip, "--mac-address", mac]);
        }
        if let Some(c) = &opts.cpus {
            cmd.extend(["--cpuset-cpus", c]);
        }
        for m in &mounts {
            cmd.extend(["-v", m]);
        }
        cmd.extend(["-v", &lab, "-v", &logs, IMAGE, NODE]);
        cmd.push(&script);
        cmd.extend(args.iter().map(String::as_str));
        let deadline = Instant::now() + bound;
        let (issued, id) = loop {
            let issued = Instant::now();
            match podman(&cmd) {
                Ok(id) => break (issued, id),
                // The predecessor's address is released as podman tears its network down.
                Err(e) if e.contains("already") && Instant::now() < deadline => {
                    let _ = podman(&["rm", "-f", "-t", "0", &container]);
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("starting {name}: {e}"),
            }
        };
        let returned = Instant::now();
        let mut c = NodeContainer {
            container,
            id: id.lines().last().unwrap_or_default().to_string(),
            ip: Ipv4Addr::UNSPECIFIED,
            mac: String::new(),
            log_dir,
            launched: (issued, returned),
        };
        assert!(
            c.id.len() == 64 && c.id.chars().all(|ch| ch.is_ascii_hexdigit()),
            "podman run printed {id:?}, not a container id"
        );
        let net = inspect(
            &c.container,
            "{{.NetworkSettings.IPAddress}} {{.NetworkSettings.MacAddress}}",
        )
        .expect("inspect the address");
        let (ip, mac) = net.split_once(' ').unwrap_or((&net, ""));
        c.ip = ip
            .parse()
            .unwrap_or_else(|_| panic!("container address {ip:?} is not IPv4"));
        c.mac = mac.trim().to_string();
        if let Err(e) = require_bridge_route(c.ip.into()) {
            panic!("lab: refusing to send to {}: {e}", c.container);
        }
        c
    }

    /// Host pid of the container's PID 1 (catatonit with `--init`, else Node): a process in
    /// its network namespace. None once it has exited.
    pub fn init_pid(&self) -> Option<u32> {
        inspect(&self.container, "{{.State.Pid}}")
            .ok()?
            .parse()
            .ok()
            .filter(|p| *p > 0)
    }

    /// The complete lines of a log file in its directory so far.
    pub fn read_log(&self, file: &str) -> Vec<String> {
        let text = fs::read_to_string(self.log_dir.join(file)).unwrap_or_default();
        let complete = text.rfind('\n').map_or("", |i| &text[..i]);
        complete.lines().map(str::to_string).collect()
    }

    /// `podman stop -t grace_secs`: SIGTERM, SIGKILL after the grace period.
    pub fn stop(&self, grace_secs: u32) -> StopTimes {
        let grace = grace_secs.to_string();
        let issued = Instant::now();
        podman(&["stop", "-t", &grace, &self.container])
            .unwrap_or_else(|e| panic!("stopping {}: {e}", self.container));
        StopTimes {
            issued,
            returned: Instant::now(),
        }
    }

    pub fn status(&self) -> String {
        inspect(&self.container, "{{.State.Status}}").unwrap_or_else(|e| e)
    }

    /// The container's exit code, once it has exited (bounded: 30 s).
    pub fn exit_code(&self) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !matches!(self.status().as_str(), "exited" | "stopped") {
            assert!(
                Instant::now() < deadline,
                "{} did not exit within 30 s",
                self.container
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        inspect(&self.container, "{{.State.ExitCode}}")
            .expect("inspect the exit code")
            .parse()
            .expect("State.ExitCode")
    }

    /// podman's own output of the container (Node's errors), for a failure's message.
    pub fn output(&self) -> String {
        podman(&["logs", &self.container]).unwrap_or_else(|e| e)
    }
}

impl Drop for NodeContainer {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", "-t", "0", &self.container]);
        if !keep() {
            let _ = fs::remove_dir_all(&self.log_dir);
        }
    }
}
