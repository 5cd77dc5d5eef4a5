//! A real Prometheus (Debian's package) for the tests: its own temporary data directory, a free
//! loopback port, a 1 s scrape of the given targets, the given rule files; killed and removed on
//! drop (and killed with the thread that started it: `PR_SET_PDEATHSIG`).

use std::{
    io::{Read, Write},
    net::TcpStream,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::agent::free_port;

pub struct Prometheus {
    child: Child,
    pub port: u16,
    dir: PathBuf,
}

/// Percent-encoding of a query-string value (RFC 3986 unreserved characters kept).
/// Hand-written: a dozen lines, where a crate would be the only dependency for it.
pub fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out += &format!("%{b:02X}");
        }
    }
    out
}

impl Prometheus {
    /// Starts Prometheus scraping `targets` (`job`, `host:port`) every second and evaluating
    /// `rule_files` every second; waits (bounded) until it is ready.
    pub fn start(targets: &[(&str, String)], rule_files: &[PathBuf]) -> Prometheus {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("drainwatch-prom-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("data")).expect("prometheus temp dir");
        let mut config = String::from(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n",
        );
        config += "rule_files:\n";
        for f in rule_files {
            config += &format!("  - {}\n", f.display());
        }
        config += "scrape_configs:\n";
        for (job, addr) in targets {
            config +=
                &format!("  - job_name: {job}\n    static_configs:\n      - targets: ['{addr}']\n");
        }
        let config_file = dir.join("prometheus.yml");
        std::fs::write(&config_file, config).expect("write prometheus.yml");
        let port = free_port();
        let mut cmd = Command::new("/usr/bin/prometheus");
        cmd.arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(dir.join("prometheus.log")).expect("log file"),
            ));
        // SAFETY: prctl(2) is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .expect("start /usr/bin/prometheus (cargo xtask setup installs it)");
        let mut p = Prometheus { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok((200, _)) = p.http("/-/ready") {
                break;
            }
            if let Some(status) = p.child.try_wait().expect("try_wait") {
                panic!("prometheus exited: {status}: {}", p.log());
            }
            assert!(
                Instant::now() < deadline,
                "prometheus not ready in 30 s: {}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        p
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// HTTP/1.0 GET (so the answer is never chunked): status and body.
    pub fn http(&self, path: &str) -> std::io::Result<(u16, String)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
        let mut raw = String::new();
        s.read_to_string(&mut raw)?;
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        Ok((status, body.to_string()))
    }

    /// `/api/v1/<endpoint>?<query>`'s `data`, failing the test on an error answer.
    pub fn api(&self, endpoint: &str, query: &[(&str, String)]) -> Value {
        let qs: Vec<String> = query
            .iter()
            .map(|(k, v)| format!("{k}={}", encode(v)))
            .collect();
        let path = format!("/api/v1/{endpoint}?{}", qs.join("&"));
        let (status, body) = self.http(&path).expect("prometheus answers");
        let v: Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {status} {e}: {body}"));
        assert_eq!(v["status"], "success", "{path}: {body}");
        v["data"].clone()
    }

    /// A range query's result (matrix), `start`/`end` in Unix seconds.
    pub fn query_range(&self, q: &str, start: f64, end: f64, step: f64) -> Vec<Value> {
        let data = self.api(
            "query_range",
            &[
                ("query", q.to_string()),
                ("start", format!("{start:.3}")),
                ("end", format!("{end:.3}")),
                ("step", format!("{step}")),
            ],
        );
        data["result"].as_array().cloned().unwrap_or_default()
    }

    /// An instant query's result at `at` (Unix seconds).
    pub fn query(&self, q: &str, at: f64) -> Vec<Value> {
        let data = self.api(
            "query",
            &[("query", q.to_string()), ("time", format!("{at:.3}"))],
        );
        data["result"].as_array().cloned().unwrap_or_default()
    }

    pub fn data_dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Unix time now, in seconds.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs_f64()
}

#[cfg(test)]
mod tests {
    #[test]
    fn encodes_promql() {
        assert_eq!(
            super::encode("sum(x{a=~\".*\"}[1m]) > 0"),
            "sum%28x%7Ba%3D~%22.%2A%22%7D%5B1m%5D%29%20%3E%200"
        );
    }
}
