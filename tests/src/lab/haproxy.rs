//! HAProxy (Debian's 2.6) as a child process in front of the backends, configured from
//! `tests/lab/haproxy.cfg.in`: active health checks (`option httpchk GET /health`,
//! `inter 2s fall 2 rise 2`), roundrobin, `retries 0`, no redispatch, one server connection per
//! request. Its log goes to stdout, which is kept in memory with the instant each line arrived.

use std::{
    fs,
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, SocketAddrV4},
    os::unix::{net::UnixStream, process::CommandExt},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use super::{
    container::{KEEP_ENV, LAB_DIR, on_local_link, setup_once, unique_name},
    proxy::{self, ms},
};
use crate::agent::free_port;

const TEMPLATE: &str = include_str!("../../lab/haproxy.cfg.in");

/// HAProxy's settings (defaults are those of the lab: see the template's comments).
#[derive(Clone, Debug)]
pub struct HaproxyOpts {
    /// Health check interval.
    pub inter: Duration,
    /// Check interval once a server is DOWN (`None`: `inter`). A long one stops the checks
    /// at DOWN, so `chkfail` (failed checks while UP) counts every failed check.
    pub downinter: Option<Duration>,
    /// Consecutive failed checks before a server is marked DOWN.
    pub fall: u32,
    /// Consecutive successful checks before a DOWN server is UP again.
    pub rise: u32,
    pub retries: u32,
    /// `retry-on` conditions (L7 retries: the request is re-sent after, e.g.,
    /// `empty-response`), or none (HAProxy then retries only failed connects).
    pub retry_on: Option<&'static str>,
    /// `option redispatch`: a retry may go to another server (on the last retry).
    pub redispatch: bool,
    pub timeout_connect: Duration,
    pub timeout_client: Duration,
    pub timeout_server: Duration,
    /// How server connections are used.
    pub conn_mode: ConnMode,
    /// Bound on waiting for every server to be UP at full health.
    pub up_timeout: Duration,
}

/// HAProxy's server-side connection mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ConnMode {
    /// `option http-server-close`: one server connection per request, closed after it.
    #[default]
    ServerClose,
    /// `option http-keep-alive` and `http-reuse always`: idle server connections are pooled
    /// and any request may reuse one, as in most production setups.
    KeepAlive,
}

impl ConnMode {
    fn config(self) -> &'static str {
        match self {
            ConnMode::ServerClose => "option http-server-close",
            ConnMode::KeepAlive => "option http-keep-alive\n    http-reuse always",
        }
    }
}

impl Default for HaproxyOpts {
    fn default() -> Self {
        Self {
            inter: Duration::from_secs(2),
            downinter: None,
            fall: 2,
            rise: 2,
            retries: 0,
            retry_on: None,
            redispatch: false,
            timeout_connect: Duration::from_secs(2),
            timeout_client: Duration::from_secs(30),
            timeout_server: Duration::from_secs(30),
            conn_mode: ConnMode::ServerClose,
            up_timeout: Duration::from_secs(15),
        }
    }
}

/// A line HAProxy wrote, with the instant the harness read it.
#[derive(Clone, Debug)]
pub struct LogLine {
    pub at: Instant,
    pub text: String,
}

/// One request's log line (`option httplog`'s fields plus the server-side source address).
#[derive(Clone, Debug)]
pub struct HttpLog {
    /// When the harness read the line (HAProxy logs when the stream ends).
    pub at: Instant,
    /// Client `ip:port` (the client's connection to the frontend).
    pub client: String,
    pub backend: String,
    /// Server name, or `<NOSRV>` when none was chosen.
    pub server: String,
    /// TR/Tw/Tc/Tr/Ta in ms (-1: that phase never completed).
    pub timers: [i64; 5],
    pub status: u16,
    pub bytes: u64,
    /// Termination state, 4 characters: `----` clean, `SH--` server aborted before the
    /// response headers, `SC--` server refused the connection, `sC--` connect timeout, ...
    pub flags: String,
    /// Retries of this request (`%rc`), and whether the last one went to another server
    /// (redispatch: `%rc` has a `+`).
    pub retries: u32,
    pub redispatched: bool,
    /// Source address of HAProxy's connection to the server, if one was attempted.
    pub server_conn: Option<SocketAddrV4>,
    /// The request line, e.g. `GET /work?ms=1300&id=x HTTP/1.1`.
    pub request: String,
    /// The request's `id` query parameter, if any.
    pub id: Option<String>,
}

impl HttpLog {
    /// Parses one request line of the lab's log format; `None` for any other line.
    pub fn parse(at: Instant, line: &str) -> Option<HttpLog> {
        let q = line.find('"')?;
        let request = line[q + 1..].strip_suffix('"')?.to_string();
        let f: Vec<&str> = line[..q].split_whitespace().collect();
        if f.len() != 13 {
            return None;
        }
        let (backend, server) = f[3].split_once('/')?;
        let t: Vec<i64> = f[4].split('/').filter_map(|x| x.parse().ok()).collect();
        let timers: [i64; 5] = t.try_into().ok()?;
        let id = request
            .split_whitespace()
            .nth(1)
            .and_then(|target| target.split_once('?'))
            .and_then(|(_, q)| {
                q.split('&')
                    .find_map(|kv| kv.strip_prefix("id=").map(str::to_string))
            });
        let rc = f[10].rsplit('/').next()?;
        let redispatched = rc.starts_with('+');
        Some(HttpLog {
            at,
            retries: rc.trim_start_matches('+').parse().ok()?,
            redispatched,
            client: f[0].to_string(),
            backend: backend.to_string(),
            server: server.to_string(),
            timers,
            status: f[5].parse().ok()?,
            bytes: f[6].parse().ok()?,
            flags: f[9].to_string(),
            server_conn: f[12].parse().ok(),
            request,
            id,
        })
    }
}

/// A server changing state, from HAProxy's `Server be/<name> is DOWN|UP, reason: ...` line.
#[derive(Clone, Debug)]
pub struct StateChange {
    pub at: Instant,
    pub server: String,
    pub up: bool,
    pub text: String,
}

/// One row of `show servers state`.
#[derive(Clone, Debug)]
pub struct ServerState {
    pub name: String,
    pub addr: String,
    /// 0 stopped (DOWN), 1 starting, 2 running (UP), 3 stopping.
    pub op_state: u32,
    pub admin_state: u32,
    /// Check health: UP while ≥ rise; rise + fall - 1 at full health.
    pub check_health: u32,
}

/// A running HAProxy. Dropping it kills it; so does the end of the thread that started it
/// (`PR_SET_PDEATHSIG`): create and drop it on the same thread, as a test does.
pub struct Haproxy {
    /// The frontend, on 127.0.0.1.
    pub frontend: SocketAddr,
    /// Server name and address, in configuration order.
    pub servers: Vec<(String, SocketAddrV4)>,
    pub opts: HaproxyOpts,
    /// Directory holding haproxy.cfg and the stats socket.
    pub dir: PathBuf,
    child: Child,
    stdout: Arc<Mutex<Vec<LogLine>>>,
    stderr: Arc<Mutex<Vec<LogLine>>>,
    readers: Vec<JoinHandle<()>>,
}

fn haproxy_bin() -> &'static str {
    if Path::new("/usr/sbin/haproxy").exists() {
        "/usr/sbin/haproxy"
    } else {
        "haproxy"
    }
}

fn reader(src: impl Read + Send + 'static, sink: Arc<Mutex<Vec<LogLine>>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(src).lines() {
            let Ok(text) = line else { break };
            sink.lock().unwrap().push(LogLine {
                at: Instant::now(),
                text,
            });
        }
    })
}

/// The `retry-on` and `option redispatch` lines of `opts` (empty when neither is set).
fn retry_lines(opts: &HaproxyOpts) -> String {
    let mut lines = Vec::new();
    if let Some(on) = opts.retry_on {
        lines.push(format!("    retry-on {on}"));
    }
    if opts.redispatch {
        lines.push("    option redispatch".to_string());
    }
    lines.join("\n")
}

impl Haproxy {
    /// Writes the configuration for `servers` (name, address), starts `haproxy -db -f cfg` on a
    /// free loopback port, and waits (bounded by `opts.up_timeout`) until every server is UP at
    /// full check health: HAProxy starts servers UP with health = rise, where a single failed
    /// check would already mark them DOWN.
    pub fn start(servers: &[(&str, SocketAddrV4)], opts: HaproxyOpts) -> Haproxy {
        setup_once();
        for (name, addr) in servers {
            assert!(
                addr.ip().is_loopback() || on_local_link(*addr.ip()),
                "server {name} {addr} is on no local bridge (its container is gone?)"
            );
        }
        let dir = PathBuf::from(LAB_DIR).join(unique_name("haproxy"));
        fs::create_dir_all(&dir).expect("haproxy dir");
        let frontend = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let sock = dir.join("admin.sock");
        let server_lines: Vec<String> = servers
            .iter()
            .map(|(n, a)| format!("    server {n} {a} check"))
            .collect();
        let cfg = TEMPLATE
            .replace("{{STATS_SOCKET}}", &sock.display().to_string())
            .replace("{{CONN_MODE}}", opts.conn_mode.config())
            .replace("{{RETRIES}}", &opts.retries.to_string())
            .replace("{{RETRY_ON}}", &retry_lines(&opts))
            .replace("{{TIMEOUT_CONNECT}}", &ms(opts.timeout_connect))
            .replace("{{TIMEOUT_CLIENT}}", &ms(opts.timeout_client))
            .replace("{{TIMEOUT_SERVER}}", &ms(opts.timeout_server))
            .replace("{{INTER}}", &ms(opts.inter))
            .replace("{{FALL}}", &opts.fall.to_string())
            .replace("{{RISE}}", &opts.rise.to_string())
            .replace(
                "{{DOWNINTER}}",
                &opts
                    .downinter
                    .map_or(String::new(), |d| format!(" downinter {}", ms(d))),
            )
            .replace("{{FRONTEND}}", &frontend.to_string())
            .replace("{{SERVERS}}", &server_lines.join("\n"));
        assert!(!cfg.contains("{{"), "unfilled template field in:\n{cfg}");
        let cfg_path = dir.join("haproxy.cfg");
        fs::write(&cfg_path, &cfg).expect("write haproxy.cfg");
        let mut cmd = Command::new(haproxy_bin());
        cmd.arg("-db")
            .arg("-f")
            .arg(&cfg_path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: prctl is async-signal-safe. HAProxy dies with the thread that started it, so an
        // aborted test leaves no proxy behind.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("spawn haproxy");
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let readers = vec![
            reader(child.stdout.take().unwrap(), stdout.clone()),
            reader(child.stderr.take().unwrap(), stderr.clone()),
        ];
        let h = Haproxy {
            frontend,
            servers: servers.iter().map(|(n, a)| (n.to_string(), *a)).collect(),
            opts,
            dir,
            child,
            stdout,
            stderr,
            readers,
        };
        h.wait_full_health();
        h
    }

    fn wait_full_health(&self) {
        let full = self.opts.rise + self.opts.fall - 1;
        let deadline = Instant::now() + self.opts.up_timeout;
        loop {
            let states = self.servers_state();
            let ready = states.len() == self.servers.len()
                && states
                    .iter()
                    .all(|s| s.op_state == 2 && s.check_health == full);
            if ready {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "HAProxy servers not all UP at full health within {:?}: {states:?}\nstderr:\n{}",
                    self.opts.up_timeout,
                    self.stderr_text()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends one command to the stats socket and returns the answer.
    pub fn admin(&self, command: &str) -> Result<String, String> {
        let mut s = UnixStream::connect(self.dir.join("admin.sock")).map_err(|e| format!("{e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok();
        s.write_all(format!("{command}\n").as_bytes())
            .map_err(|e| format!("{e}"))?;
        let mut out = String::new();
        s.read_to_string(&mut out).map_err(|e| format!("{e}"))?;
        Ok(out)
    }

    /// Failed health checks of `server` so far (`show stat`'s `chkfail`): HAProxy's own count
    /// of the connection attempts its checker made that failed.
    pub fn failed_checks(&self, server: &str) -> Option<u64> {
        let text = self.admin("show stat").ok()?;
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next()?.trim_start_matches("# ").split(',').collect();
        let col = header.iter().position(|h| *h == "chkfail")?;
        lines
            .map(|l| l.split(',').collect::<Vec<_>>())
            .find(|f| f.first() == Some(&"be") && f.get(1) == Some(&server))
            .and_then(|f| f.get(col)?.parse().ok())
    }

    /// `show servers state be`, parsed (empty while the socket is not up yet).
    pub fn servers_state(&self) -> Vec<ServerState> {
        let Ok(text) = self.admin("show servers state be") else {
            return Vec::new();
        };
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() > 12).then(|| ServerState {
                    name: f[3].to_string(),
                    addr: f[4].to_string(),
                    op_state: f[5].parse().unwrap_or(99),
                    admin_state: f[6].parse().unwrap_or(99),
                    check_health: f[12].parse().unwrap_or(99),
                })
            })
            .collect()
    }

    /// Everything HAProxy wrote to stdout so far (its log), in order.
    pub fn log_lines(&self) -> Vec<LogLine> {
        self.stdout.lock().unwrap().clone()
    }

    /// Everything HAProxy wrote to stderr so far (notices, warnings, alerts).
    pub fn stderr_text(&self) -> String {
        let lines = self.stderr.lock().unwrap();
        lines
            .iter()
            .map(|l| l.text.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The per-request log lines so far.
    pub fn http_logs(&self) -> Vec<HttpLog> {
        self.log_lines()
            .iter()
            .filter_map(|l| HttpLog::parse(l.at, &l.text))
            .collect()
    }

    /// Servers going DOWN or UP so far.
    pub fn state_changes(&self) -> Vec<StateChange> {
        self.log_lines()
            .iter()
            .filter_map(|l| {
                let rest = l.text.strip_prefix("Server be/")?;
                let (server, rest) = rest.split_once(' ')?;
                let up = if rest.starts_with("is DOWN") {
                    false
                } else if rest.starts_with("is UP") {
                    true
                } else {
                    return None;
                };
                Some(StateChange {
                    at: l.at,
                    server: server.to_string(),
                    up,
                    text: l.text.clone(),
                })
            })
            .collect()
    }

    /// When HAProxy marked `server` DOWN (the first time), waiting up to `timeout` for it.
    pub fn wait_down(&self, server: &str, timeout: Duration) -> Option<Instant> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(c) = self
                .state_changes()
                .into_iter()
                .find(|c| c.server == server && !c.up)
            {
                return Some(c.at);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (bounded) until HAProxy has logged every id in `ids`; returns the logs by id.
    pub fn wait_logged(
        &self,
        ids: &[&str],
        timeout: Duration,
    ) -> std::collections::HashMap<String, HttpLog> {
        proxy::wait_logged(ids, timeout, || {
            self.http_logs()
                .into_iter()
                .filter_map(|l| Some((l.id.clone()?, l)))
                .collect()
        })
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        if std::env::var_os(KEEP_ENV).is_none() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}
