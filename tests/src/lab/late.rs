//! Late failures: a client whose connects to a stopped container's vanished address fail
//! tens of seconds later (issue 42), run by `tests/lab/late_client.py` in a podman container of
//! its own, on podman's bridge beside the server. Its neighbour cache keeps the server's
//! link-layer address from its warm-up connects, so after the stop its SYNs go out on the
//! bridge to a port that is gone, nothing answers, and its kernel gives up after its SYN
//! retries (ETIMEDOUT), or when ARP has given up on the old neighbour (EHOSTUNREACH). The
//! container's own `net.ipv4.tcp_syn_retries` is lowered (`--sysctl`, its namespace only) to
//! keep the lab short: 4 retries give up after about 31 s instead of the default 127 s.
//!
//! The SYNs stay on the machine: they are sent on the bridge, whose ports are the lab's
//! containers (a [`BridgeHolder`](super::container::BridgeHolder) keeps it up), and the
//! fallback blackhole route catches the rest (see `lab::net`).

use std::{
    fs,
    net::SocketAddrV4,
    path::PathBuf,
    time::{Duration, Instant},
};

use super::{
    clock::instant_of_mono_ns,
    container::{
        IMAGE, LAB_DIR, NO_RESOLVER, ULIMITS, keep, lab_python, podman, setup_once, unique_name,
    },
};

/// The client script, bind-mounted into its container.
fn script() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/lab/late_client.py"))
}

/// One attempt as the client saw it: its `connect()`'s start and end, and what it met.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LateAttempt {
    pub at: Instant,
    pub ended: Instant,
    /// `connected`, or the errno's name (`ETIMEDOUT`, `EHOSTUNREACH`, `ECONNREFUSED`, ...).
    pub result: String,
}

impl LateAttempt {
    /// The kernel gave up on it: no answer to its SYNs, or no neighbour.
    pub fn failed_late(&self) -> bool {
        matches!(self.result.as_str(), "ETIMEDOUT" | "EHOSTUNREACH")
    }
}

/// The client's container, removed on drop.
#[derive(Debug)]
pub struct LateClient {
    pub container: String,
    pub log_dir: PathBuf,
}

impl LateClient {
    /// Starts it against `server` with `syn_retries` in its namespace; it warms up (connects
    /// every 100 ms) until [`hold`](Self::hold), then makes `count` attempts `beat` apart from
    /// [`go`](Self::go). Panics unless its first warm-up connect succeeded within 20 s.
    pub fn start(server: SocketAddrV4, syn_retries: u32, beat: Duration, count: u32) -> Self {
        setup_once();
        let container = unique_name("late-client");
        let log_dir = PathBuf::from(LAB_DIR).join(&container);
        fs::create_dir_all(&log_dir).expect("client log dir");
        let c = LateClient { container, log_dir };
        let label = format!("drainwatch.lab={}", std::process::id());
        let sysctl = format!("net.ipv4.tcp_syn_retries={syn_retries}");
        let script = format!("{}:/lab/late_client.py:ro", script().display());
        let logs = format!("{}:/lab/log", c.log_dir.display());
        let py = lab_python();
        let (ip, port) = (server.ip().to_string(), server.port().to_string());
        let (beat_ms, count) = (beat.as_millis().to_string(), count.to_string());
        // The host's python, through the mounts the backends use.
        let mounts: Vec<String> = ["/usr", "/lib", "/lib64", "/root/.pyenv"]
            .into_iter()
            .filter(|m| std::path::Path::new(m).exists())
            .map(|m| format!("{m}:{m}:ro"))
            .collect();
        let mut args = vec!["run", "-d", "--name", &c.container, "--label", &label];
        args.extend(ULIMITS);
        args.extend(NO_RESOLVER);
        args.extend(["--sysctl", &sysctl, "-v", &script, "-v", &logs]);
        for m in &mounts {
            args.extend(["-v", m.as_str()]);
        }
        args.extend([IMAGE, py.as_str(), "/lab/late_client.py", &ip, &port]);
        args.extend([beat_ms.as_str(), count.as_str()]);
        podman(&args).unwrap_or_else(|e| panic!("starting the late client: {e}"));
        let deadline = Instant::now() + Duration::from_secs(20);
        while !c.lines().iter().any(|l| l == "warm ok") {
            assert!(
                Instant::now() < deadline,
                "the late client never reached the server: {:?}",
                c.lines()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        c
    }

    /// Its log lines so far.
    pub fn lines(&self) -> Vec<String> {
        fs::read_to_string(self.log_dir.join("client.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn touch(&self, name: &str) {
        fs::write(self.log_dir.join(name), b"").expect("write a client control file");
    }

    /// Stops warming up; returns once the client says it has (bounded: 10 s).
    pub fn hold(&self) {
        self.touch("hold");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.lines().iter().any(|l| l == "held") {
            assert!(Instant::now() < deadline, "the late client did not hold");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts the attempts.
    pub fn go(&self) {
        self.touch("go");
    }

    /// Waits until every attempt has ended (bounded by `timeout`), and returns them.
    pub fn attempts(&self, timeout: Duration) -> Vec<LateAttempt> {
        let deadline = Instant::now() + timeout;
        while !self.lines().iter().any(|l| l == "done") {
            assert!(
                Instant::now() < deadline,
                "the late client's attempts did not all end within {timeout:?}: {:?}",
                self.lines()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        self.lines()
            .iter()
            .filter_map(|l| {
                let mut w = l.strip_prefix("attempt ")?.split_whitespace();
                let at = w.next()?.parse().ok()?;
                let ended = w.next()?.parse().ok()?;
                Some(LateAttempt {
                    at: instant_of_mono_ns(at),
                    ended: instant_of_mono_ns(ended),
                    result: w.next()?.to_string(),
                })
            })
            .collect()
    }
}

impl Drop for LateClient {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", "-t", "0", &self.container]);
        if !keep() {
            let _ = fs::remove_dir_all(&self.log_dir);
        }
    }
}
