//! The sidecar container: `tests/lab/sidecar.py` as PID 1 (a pilot-agent-like wrapper) and
//! Debian's nginx under it, in an app's pod namespace, configured from the lab's nginx
//! template; its access, error and wrapper logs.

use std::{
    fs,
    net::SocketAddrV4,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::lab::{
    Backend, StopTimes, clock,
    container::{
        IMAGE, LAB_DIR, ULIMITS, http_get, keep, lab_python, podman, setup_once, unique_name,
    },
    nginx::AccessEntry,
    proxy::ms,
};

const TEMPLATE: &str = include_str!("../../../lab/nginx.conf.in");
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
    /// `/lab-ready` itself (no upstream touched). Panics with its logs otherwise. With
    /// `keep_trying`, no upstream is ever taken out of the rotation (`max_fails=0`).
    pub fn start(pod: &Backend, drain: Duration, upstreams: &[u16], keep_trying: bool) -> Sidecar {
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
        let cfg = nginx_conf(&dir, upstreams, keep_trying);
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
        args.extend(ULIMITS);
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
/// robin, passive health and `proxy_next_upstream error timeout`, nginx's defaults; with
/// `keep_trying`, no passive health (`max_fails=0`).
fn nginx_conf(dir: &Path, upstreams: &[u16], keep_trying: bool) -> String {
    assert!(!upstreams.is_empty(), "the sidecar needs an upstream");
    let health = if keep_trying { " max_fails=0" } else { "" };
    let servers: Vec<String> = upstreams
        .iter()
        .map(|p| format!("        server 127.0.0.1:{p}{health};"))
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
