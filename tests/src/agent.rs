//! The agent binary as a test drives it: started on a free port, asked over HTTP.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant, SystemTime},
};

use serde_json::Value;

use crate::{lab::clock, require_root};

pub fn binary() -> PathBuf {
    let path = std::env::var_os("DRAINWATCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/drainwatch")
        });
    assert!(
        path.exists(),
        "{} is missing: `cargo xtask test` builds it first (or set DRAINWATCH_BIN)",
        path.display()
    );
    path
}

/// A loopback port free right now (bound, then released): for a server the test starts.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free loopback port");
    l.local_addr().unwrap().port()
}

/// Status, headers (lower-cased names) and body.
pub type Reply = (u16, Vec<(String, String)>, String);

/// A minimal HTTP/1.1 GET.
pub fn get(port: u16, path: &str, accept: &str) -> std::io::Result<Reply> {
    get_as(port, path, accept, None)
}

/// A minimal HTTP/1.1 GET with a bearer token, for an agent run with `--auth kube`.
pub fn get_as(port: u16, path: &str, accept: &str, token: Option<&str>) -> std::io::Result<Reply> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nAccept: {accept}\r\n{auth}Connection: close\r\n\r\n"
    )?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok((status, headers, body.to_string()))
}

pub struct Agent {
    pub child: Child,
    pub port: u16,
    /// Sent as a bearer token with every request of the helpers below (`--auth kube`).
    pub token: Option<String>,
}

impl Agent {
    pub fn start(extra: &[&str]) -> Self {
        Self::start_wrapped(&[], extra)
    }

    /// As `start`, run through `wrapper` (a command that execs its arguments, e.g. `setpriv`
    /// with its options and `--`), so the child's pid is the agent's.
    /// `DRAINWATCH_TEST_LOG=<file>`: the agent's log goes there (with `DRAINWATCH_LOG`'s filter).
    pub fn start_wrapped(wrapper: &[&str], extra: &[&str]) -> Self {
        let stderr = match std::env::var("DRAINWATCH_TEST_LOG") {
            Ok(path) => std::fs::File::create(path).expect("log file").into(),
            Err(_) => Stdio::piped(),
        };
        Self::start_with(wrapper, free_port(), extra, stderr)
    }

    /// On 127.0.0.1:`port`, its log (stderr) going to `stderr`.
    pub fn start_on(port: u16, extra: &[&str], stderr: Stdio) -> Self {
        Self::start_with(&[], port, extra, stderr)
    }

    fn start_with(wrapper: &[&str], port: u16, extra: &[&str], stderr: Stdio) -> Self {
        require_root();
        let listen = format!("127.0.0.1:{port}");
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(binary());
                c
            }
            None => Command::new(binary()),
        };
        let child = cmd
            .args(["--listen", &listen])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn drainwatch");
        Self::attach(child, port)
    }

    /// An agent `child` started (itself, or e.g. `podman run` in the foreground), serving on
    /// 127.0.0.1:`port`: returns once it is ready.
    pub fn attach(child: Child, port: u16) -> Self {
        let mut agent = Self {
            child,
            port,
            token: None,
        };
        // Bounded wait for readiness: the condition, not a fixed sleep.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok((200, _, _)) = get(port, "/readyz", "*/*") {
                break;
            }
            if let Some(status) = agent.child.try_wait().unwrap() {
                panic!(
                    "drainwatch exited during start-up: {status}: {}",
                    agent.stderr()
                );
            }
            assert!(Instant::now() < deadline, "not ready within 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        agent
    }

    pub fn stderr(&mut self) -> String {
        let mut s = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut s);
        }
        s
    }

    /// Container addresses the kernel keeps host-side traffic for
    /// (`drainwatch_watch_entries{map="addresses"}`): until a container's is in, a host
    /// process's connection to it is not captured, as on a node where a container is stopped
    /// before the agent found it.
    pub fn watched_addresses(&self) -> f64 {
        self.metric("drainwatch_watch_entries{map=\"addresses\"}")
            .unwrap_or(0.0)
    }

    pub fn metric(&self, name_and_labels: &str) -> Option<f64> {
        let (_, _, body) =
            get_as(self.port, "/metrics", "text/plain", self.token.as_deref()).ok()?;
        body.lines()
            .find_map(|l| l.strip_prefix(name_and_labels))
            .and_then(|v| v.trim().parse().ok())
    }

    /// The sum of `family`'s series whose labels include every `(name, value)` given.
    pub fn metric_sum(&self, family: &str, want: &[(&str, &str)]) -> f64 {
        metric_sum(&self.metrics_text(), family, want)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The sum of a counter family's series whose labels include every `(name, value)` given.
pub fn metric_sum(metrics: &str, family: &str, want: &[(&str, &str)]) -> f64 {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix(family)?.strip_prefix('{'))
        .filter_map(|rest| {
            let (labels, value) = rest.rsplit_once("} ")?;
            let has =
                |(k, v): &(&str, &str)| labels.split(',').any(|l| l == format!("{k}=\"{v}\""));
            want.iter()
                .all(has)
                .then(|| value.trim().parse::<f64>().ok())?
        })
        .sum()
}

/// The agent's answer to `path` and how far its event processing had got (kernel monotonic ns).
pub fn api(agent: &Agent, path: &str) -> (u64, Value) {
    let (status, headers, body) =
        get_as(agent.port, path, "application/json", agent.token.as_deref())
            .expect("agent answers");
    assert_eq!(status, 200, "{path}: {body}");
    let processed = headers
        .iter()
        .find(|(k, _)| k == "x-drainwatch-processed-until-ns")
        .and_then(|(_, v)| v.parse().ok())
        .expect("processed-until header");
    let offset = headers
        .iter()
        .find(|(k, _)| k == "x-drainwatch-clock-offset-ns")
        .and_then(|(_, v)| v.parse::<i128>().ok());
    if offset.is_some() {
        *CLOCK_OFFSET.lock().unwrap() = offset;
    }
    (processed, serde_json::from_str(&body).expect("JSON"))
}

/// Returns once the agent has processed every event that happened before this call: causes a
/// marker event (a loopback listener opening and closing, which the kernel side passes on
/// even for the host's own traffic) and waits until processing passes it.
pub fn sync(agent: &Agent) {
    let before = clock::mono_ns();
    drop(std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    while api(agent, "/api/v1/stops").0 < before {
        assert!(
            Instant::now() < deadline,
            "the agent did not process the marker within 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `done` every 50 ms until it holds; fails the test, naming `what`, after `timeout`.
pub fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "{what} within {timeout:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `container_id`'s stop record as the API has it now, if any.
pub fn current_stop(agent: &Agent, container_id: &str) -> Option<Value> {
    let (_, stops) = api(agent, "/api/v1/stops");
    stops
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["container"]["id"] == container_id)
        .cloned()
}

/// s1's stop record, once its cgroup is gone and every event before that is processed.
pub fn stop_record(agent: &Agent, container_id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, stops) = api(agent, "/api/v1/stops");
        let found =
            stops.as_array().into_iter().flatten().find(|s| {
                s["container"]["id"] == container_id && !s["cgroup_removed_at"].is_null()
            });
        if found.is_some() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no settled stop for {container_id}: {stops:#}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    sync(agent);
    let (_, stops) = api(agent, "/api/v1/stops");
    let mine: Vec<Value> = stops
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["container"]["id"] == container_id)
        .cloned()
        .collect();
    assert_eq!(mine.len(), 1, "one stop for s1: {stops:#}");
    mine.into_iter().next().unwrap()
}

/// The agent's wall-minus-monotonic offset, from its latest API answer (see `api`).
static CLOCK_OFFSET: std::sync::Mutex<Option<i128>> = std::sync::Mutex::new(None);

/// An RFC 3339 time from the API as an `Instant`: through the offset the agent rendered it
/// with (exact to the millisecond, whatever NTP did to the wall clock meanwhile), else
/// through this process's wall clock.
pub fn instant(v: &Value) -> Option<Instant> {
    let t = humantime::parse_rfc3339(v.as_str()?).ok()?;
    // One anchor per test process: converting each timestamp against a fresh `now` pair would
    // let two equal times land on instants a few nanoseconds apart, in either order.
    if let Some(offset) = *CLOCK_OFFSET.lock().unwrap() {
        static MONO: std::sync::OnceLock<(Instant, u64)> = std::sync::OnceLock::new();
        let (at, at_ns) = *MONO.get_or_init(|| (Instant::now(), clock::mono_ns()));
        let wall = t.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos() as i128;
        let mono = i64::try_from(wall - offset - i128::from(at_ns)).ok()?;
        let d = Duration::from_nanos(mono.unsigned_abs());
        return Some(if mono >= 0 { at + d } else { at - d });
    }
    static ANCHOR: std::sync::OnceLock<(SystemTime, Instant)> = std::sync::OnceLock::new();
    let (wall, mono) = *ANCHOR.get_or_init(|| (SystemTime::now(), Instant::now()));
    Some(match t.duration_since(wall) {
        Ok(after) => mono + after,
        Err(e) => mono - e.duration(),
    })
}

/// Fails unless `promtool check metrics` accepts this Prometheus text exposition.
pub fn promtool_check(text: &str) {
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (cargo xtask setup installs prometheus)");
    promtool
        .stdin
        .take()
        .expect("promtool stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = promtool.wait_with_output().expect("promtool ran");
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Agent {
    /// The whole /metrics text, Prometheus 0.0.4 format.
    pub fn metrics_text(&self) -> String {
        let (status, _, body) =
            get_as(self.port, "/metrics", "text/plain", self.token.as_deref()).expect("scrape");
        assert_eq!(status, 200);
        body
    }

    /// Waits (15 s at most) until the agent's metrics name `container` (its name): adopted.
    pub fn wait_adopted(&self, container: &str) {
        let named = format!("container=\"{container}\"");
        wait_for(
            "the agent adopts the container",
            Duration::from_secs(15),
            || self.metrics_text().contains(&named),
        );
    }
}
