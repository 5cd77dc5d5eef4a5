//! The release agent as the benchmark runs it: on a free port, its readiness, metrics, CPU
//! time and RSS read from outside, killed on drop.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};

/// The release agent on a free port, killed on drop.
pub(super) struct Agent {
    child: Child,
    port: u16,
}

impl Agent {
    pub(super) fn start(bin: &Path, extra: &[&str]) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new(bin.join("drainwatch"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the agent")?;
        let agent = Self { child, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ready(port) {
            ensure!(Instant::now() < deadline, "the agent was not ready in 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(agent)
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The sum of a metric's series on /metrics.
    pub(super) fn metric_sum(&self, name: &str) -> Result<f64> {
        let text = get(self.port, "/metrics").context("scraping the agent")?;
        Ok(text
            .lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }

    /// The sum of a metric's series whose line holds `label` (e.g. `scope="all"`).
    pub(super) fn metric_where(&self, name: &str, label: &str) -> Result<f64> {
        let text = get(self.port, "/metrics").context("scraping the agent")?;
        Ok(text
            .lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
            .filter(|l| l.contains(label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }

    pub(super) fn cpu_seconds(&self) -> Result<f64> {
        cpu_seconds(self.pid())
    }

    pub(super) fn rss_kib(&self) -> Result<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .context("no VmRSS")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // SAFETY: kill(2) of our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

fn ready(port: u16) -> bool {
    get(port, "/readyz").is_some_and(|r| r.starts_with("HTTP/1.1 200"))
}

fn get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).ok()?;
    Some(reply)
}

/// User + system CPU seconds of a process.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command (which may contain spaces) start at state (field 3).
    let rest = stat.rsplit_once(')').map(|x| x.1).context("no comm")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f
        .get(11)
        .zip(f.get(12))
        .and_then(|(u, s)| Some(u.parse::<f64>().ok()? + s.parse::<f64>().ok()?))
        .context("no utime/stime")?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks / hz)
}
