//! nginx (Debian's 1.22, `/usr/sbin/nginx`) as a child process in front of the backends,
//! configured from `tests/lab/nginx.conf.in`: a master and one worker, round robin, passive
//! health only (`max_fails`/`fail_timeout`), retries by `proxy_next_upstream`, no upstream
//! keepalive. Everything it writes (pid file, error and access logs, temp paths) is in its own
//! directory under the lab directory, which is its prefix (`-p`).
//!
//! Facts the lab relies on (verified with nginx 1.22.1 here):
//! - Upstream requests are HTTP/1.0 with `Connection: close`, one connection per request (no
//!   `keepalive` in the upstream block): a cut is one request's connection, and a retry is
//!   always a new connect, never a resend on a reused idle connection (which nginx would also
//!   retry, muddling the ground truth).
//! - With the default `proxy_next_upstream error timeout`, an upstream that closes (or resets)
//!   the connection before sending response headers makes nginx send the request to the next
//!   server at once, on a new connection from the same worker; the client sees only the second
//!   answer. Non-idempotent requests (POST, LOCK, PATCH) are not retried once sent (since
//!   1.9.13, unless `non_idempotent`): the client gets 502.
//! - Passive health: such a failure also counts against the server (`error` and `timeout`
//!   always do, even with `proxy_next_upstream off`). With the defaults `max_fails=1
//!   fail_timeout=10s`, one failure takes the server out of the rotation for 10 s (nginx
//!   counts in whole seconds: 10 to 11 s), during which every request goes to the other
//!   server. After that nginx tries it again with the next request the rotation gives it: if
//!   its address still refuses (a pod's sandbox outlives the app container) that request is
//!   retried on the other server too (no duplicate: the dead server never started it), and the
//!   server is out for another `fail_timeout`.

use std::{
    collections::HashMap,
    fs,
    net::{SocketAddr, SocketAddrV4, TcpListener},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Once,
    time::{Duration, Instant},
};

use super::container::{
    KEEP_ENV, LAB_DIR, NAME_PREFIX, http_get, on_local_link, setup_once, unique_name,
};

const TEMPLATE: &str = include_str!("../../lab/nginx.conf.in");
const NGINX: &str = "/usr/sbin/nginx";

static CLEANUP: Once = Once::new();

/// nginx's settings (defaults: nginx's own, with the lab's timeouts).
#[derive(Clone, Debug)]
pub struct NginxOpts {
    /// `proxy_next_upstream`: `None` leaves nginx's default (`error timeout`: retry on the next
    /// server when a connect fails or the upstream closes before the response headers);
    /// `Some("off")` never retries. Any other value is written as is.
    pub next_upstream: Option<String>,
    /// `max_fails` of each server (nginx's default 1; 0 disables passive health).
    pub max_fails: u32,
    /// `fail_timeout` of each server, whole seconds (nginx's default 10 s): how long a server
    /// that failed `max_fails` times is left out (see the module docs).
    pub fail_timeout: Duration,
    /// `proxy_connect_timeout`.
    pub connect_timeout: Duration,
    /// `proxy_read_timeout` (and `proxy_send_timeout`).
    pub read_timeout: Duration,
    /// Bound on [`Nginx::wait_ready`].
    pub ready_timeout: Duration,
}

impl Default for NginxOpts {
    fn default() -> Self {
        Self {
            next_upstream: None,
            max_fails: 1,
            fail_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(2),
            read_timeout: Duration::from_secs(30),
            ready_timeout: Duration::from_secs(10),
        }
    }
}

/// One line of the lab's access log (`log_format lab` in the template): one per request,
/// written by the worker when the request ends.
#[derive(Clone, Debug, PartialEq)]
pub struct AccessEntry {
    /// `$msec`: Unix time in seconds (ms resolution) when the line was written.
    pub msec: f64,
    /// `$pid`: the worker that served the request (and opened its upstream connections).
    pub pid: u32,
    /// `$connection`: the worker's serial number of the client connection.
    pub connection: u64,
    /// `$remote_addr:$remote_port`: the client's side of its connection to nginx.
    pub client: Option<SocketAddr>,
    /// `$request_method`.
    pub method: String,
    /// `$arg_id`: the `id` query argument (the lab's request id), if any.
    pub id: Option<String>,
    /// `$status`: what the client got.
    pub status: u16,
    /// `$upstream_addr`: every upstream tried, in order (`ip:port`; the upstream group's name
    /// `be` when no server was available). Empty when nginx answered by itself.
    pub upstream_addrs: Vec<String>,
    /// `$upstream_status`, one per try (`None` where nginx wrote `-`). A try cut before the
    /// response headers shows as 502, a connect timeout as 504.
    pub upstream_statuses: Vec<Option<u16>>,
    /// `$request_time`: from the first byte read from the client to the log line.
    pub request_time: Duration,
    /// `$upstream_connect_time`, one per try.
    pub upstream_connect_times: Vec<Option<Duration>>,
    /// `$upstream_header_time`, one per try (`None` for a try that got no headers).
    pub upstream_header_times: Vec<Option<Duration>>,
    /// `$upstream_response_time`, one per try (for a cut try: until the cut was seen).
    pub upstream_response_times: Vec<Option<Duration>>,
    /// `$request_id`: nginx's own 32-hex id of the request.
    pub request_id: String,
    /// `$request`: the request line.
    pub request: String,
}

fn dash(v: &str) -> Option<&str> {
    (!v.is_empty() && v != "-").then_some(v)
}

/// An `$upstream_*` list: ", " between tries, " : " between internal redirects.
fn list(v: &str) -> Vec<&str> {
    if dash(v).is_none() {
        return Vec::new();
    }
    v.split(" : ").flat_map(|g| g.split(", ")).collect()
}

fn secs(v: &str) -> Option<Duration> {
    dash(v)?.parse::<f64>().ok().map(Duration::from_secs_f64)
}

impl AccessEntry {
    /// Parses one line of the lab's log format; `None` for anything else.
    pub fn parse(line: &str) -> Option<AccessEntry> {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() != 15 {
            return None;
        }
        Some(AccessEntry {
            msec: f[0].parse().ok()?,
            pid: f[1].parse().ok()?,
            connection: f[2].parse().ok()?,
            client: f[3].parse().ok(),
            method: f[4].to_string(),
            id: dash(f[5]).map(str::to_string),
            status: f[6].parse().ok()?,
            upstream_addrs: list(f[7]).into_iter().map(str::to_string).collect(),
            upstream_statuses: list(f[8]).into_iter().map(|s| s.parse().ok()).collect(),
            request_time: secs(f[9])?,
            upstream_connect_times: list(f[10]).into_iter().map(secs).collect(),
            upstream_header_times: list(f[11]).into_iter().map(secs).collect(),
            upstream_response_times: list(f[12]).into_iter().map(secs).collect(),
            request_id: f[13].to_string(),
            request: f[14].to_string(),
        })
    }

    /// Whether nginx tried more than one upstream for this request.
    pub fn retried(&self) -> bool {
        self.upstream_addrs.len() > 1
    }
}

/// A running nginx (master and one worker). Dropping it stops both (SIGTERM to the master, its
/// fast shutdown); so does the end of the thread that started it (the master gets SIGTERM by
/// `PR_SET_PDEATHSIG`; SIGKILL would orphan the worker, still listening): create and drop it on
/// one thread.
pub struct Nginx {
    /// The listener, on 127.0.0.1.
    pub frontend: SocketAddr,
    /// Server name and address, in configuration order (round robin starts with the first).
    pub servers: Vec<(String, SocketAddrV4)>,
    pub opts: NginxOpts,
    /// The prefix directory: nginx.conf, nginx.pid, error.log, access.log, tmp/.
    pub dir: PathBuf,
    /// The master process (this harness's child): reads the configuration, holds the
    /// listening socket, starts the worker. It never talks to the upstreams.
    pub master_pid: u32,
    /// The one worker: accepts the clients and opens every upstream connection.
    pub worker_pid: u32,
    child: Child,
}

fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free loopback port");
    l.local_addr().unwrap().port()
}

/// Children of `pid` (its main thread's, which is where nginx forks).
fn children(pid: u32) -> Vec<u32> {
    fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Whether `pid` exists and is not a zombie.
fn alive(pid: u32) -> bool {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // "pid (comm) S ...": the state follows the last ')'.
    stat.rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next())
        .is_some_and(|s| s != "Z" && s != "X")
}

/// Whether a lab directory name belongs to a run whose process is gone.
fn dead_run(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(NAME_PREFIX) else {
        return false;
    };
    match rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) {
        Some(pid) => pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists(),
        None => false,
    }
}

/// Whether `path` is inside the directory of a dead run's lab object.
fn in_dead_dir(path: &str) -> bool {
    path.split(LAB_DIR)
        .skip(1)
        .filter_map(|r| r.strip_prefix('/'))
        .any(|r| dead_run(r.split('/').next().unwrap_or("")))
}

/// Kills nginx processes (masters and orphaned workers) left by runs whose process is gone:
/// the master's title names its prefix, and both hold its logs open. Returns how many.
pub fn cleanup_leftovers() -> usize {
    let mut n = 0;
    for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let exe = fs::read_link(e.path().join("exe")).unwrap_or_default();
        if exe != Path::new(NGINX) {
            continue;
        }
        let cmdline =
            String::from_utf8_lossy(&fs::read(e.path().join("cmdline")).unwrap_or_default())
                .replace('\0', " ");
        let fds = fs::read_dir(e.path().join("fd"))
            .into_iter()
            .flatten()
            .flatten();
        let ours = in_dead_dir(&cmdline)
            || fds
                .filter_map(|fd| fs::read_link(fd.path()).ok())
                .any(|t| in_dead_dir(&t.to_string_lossy()));
        if ours {
            // SAFETY: plain kill(2) of an nginx this harness started in an earlier run.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            n += 1;
        }
    }
    n
}

impl Nginx {
    /// Writes the configuration for `servers` (name, address), starts
    /// `nginx -p <dir>/ -c <dir>/nginx.conf -e <dir>/error.log -g 'daemon off;'` listening on a
    /// free 127.0.0.1 port, and waits until it is ready ([`Nginx::wait_ready`]).
    pub fn start(servers: &[(&str, SocketAddrV4)], opts: NginxOpts) -> Nginx {
        setup_once();
        CLEANUP.call_once(|| {
            let n = cleanup_leftovers();
            if n > 0 {
                eprintln!("lab: killed {n} leftover nginx processes of earlier runs");
            }
        });
        assert!(!servers.is_empty(), "nginx needs at least one server");
        assert!(
            opts.fail_timeout.subsec_nanos() == 0,
            "fail_timeout is in whole seconds for nginx"
        );
        for (name, addr) in servers {
            assert!(
                addr.ip().is_loopback() || on_local_link(*addr.ip()),
                "server {name} {addr} is on no local bridge (its container is gone?)"
            );
        }
        let dir = PathBuf::from(LAB_DIR).join(unique_name("nginx"));
        fs::create_dir_all(dir.join("tmp")).expect("nginx dir");
        let frontend = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let server_lines: Vec<String> = servers
            .iter()
            .map(|(_, a)| {
                format!(
                    "        server {a} max_fails={} fail_timeout={}s;",
                    opts.max_fails,
                    opts.fail_timeout.as_secs()
                )
            })
            .collect();
        let next_upstream = match &opts.next_upstream {
            None => "            # proxy_next_upstream: nginx's default, error timeout".to_string(),
            Some(v) => format!("            proxy_next_upstream {v};"),
        };
        let cfg = TEMPLATE
            .replace("{{DIR}}", &dir.display().to_string())
            .replace("{{LISTEN}}", &frontend.to_string())
            .replace("{{CONNECT_TIMEOUT}}", &ms(opts.connect_timeout))
            .replace("{{READ_TIMEOUT}}", &ms(opts.read_timeout))
            .replace("{{NEXT_UPSTREAM}}", &next_upstream)
            .replace("{{SERVERS}}", &server_lines.join("\n"));
        assert!(!cfg.contains("{{"), "unfilled template field in:\n{cfg}");
        let cfg_path = dir.join("nginx.conf");
        fs::write(&cfg_path, &cfg).expect("write nginx.conf");
        let out = fs::File::create(dir.join("output.log")).expect("nginx output file");
        let mut cmd = Command::new(NGINX);
        cmd.arg("-p")
            .arg(format!("{}/", dir.display()))
            .arg("-c")
            .arg(&cfg_path)
            .arg("-e")
            .arg(dir.join("error.log"))
            .arg("-g")
            .arg("daemon off;")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("dup output file"))
            .stderr(out);
        // SAFETY: prctl is async-signal-safe. SIGTERM, not SIGKILL: the master's fast shutdown
        // stops the worker too, where a killed master would leave it running.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn nginx");
        let mut n = Nginx {
            frontend,
            servers: servers.iter().map(|(s, a)| (s.to_string(), *a)).collect(),
            master_pid: child.id(),
            worker_pid: 0,
            opts,
            dir,
            child,
        };
        n.wait_ready();
        let workers = n.worker_pids();
        assert_eq!(
            workers.len(),
            1,
            "nginx should have one worker: {workers:?}"
        );
        n.worker_pid = workers[0];
        n
    }

    /// Waits (bounded by `opts.ready_timeout`) until the master wrote its pid file (it has
    /// opened the listening socket by then, so no connect is ever refused), its worker runs,
    /// and `GET /lab-ready` (answered by nginx itself, no upstream) returns 200. Panics with
    /// nginx's output and error log otherwise.
    pub fn wait_ready(&self) {
        let deadline = Instant::now() + self.opts.ready_timeout;
        let fail = |what: &str| -> ! {
            panic!(
                "nginx not ready within {:?}: {what}\noutput:\n{}\nerror log:\n{}",
                self.opts.ready_timeout,
                fs::read_to_string(self.dir.join("output.log")).unwrap_or_default(),
                self.error_log()
            )
        };
        let pid_file = self.dir.join("nginx.pid");
        loop {
            if !alive(self.master_pid) {
                fail("the master exited");
            }
            let pid = fs::read_to_string(&pid_file).unwrap_or_default();
            if pid.trim() == self.master_pid.to_string() && !self.worker_pids().is_empty() {
                break;
            }
            if Instant::now() > deadline {
                fail("no pid file or no worker");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match http_get(
            self.frontend,
            "/lab-ready",
            left.max(Duration::from_secs(1)),
        ) {
            Ok((200, _)) => {}
            r => fail(&format!("GET /lab-ready answered {r:?}")),
        }
    }

    /// The master's live children: its workers (one).
    pub fn worker_pids(&self) -> Vec<u32> {
        children(self.master_pid)
            .into_iter()
            .filter(|p| alive(*p))
            .collect()
    }

    /// The server name of an upstream address as nginx logs it (`ip:port`).
    pub fn server_name(&self, addr: &str) -> Option<&str> {
        self.servers
            .iter()
            .find(|(_, a)| a.to_string() == addr)
            .map(|(n, _)| n.as_str())
    }

    /// The access log so far, parsed, in the order nginx wrote it (request ends).
    pub fn access_log(&self) -> Vec<AccessEntry> {
        let text = fs::read_to_string(self.dir.join("access.log")).unwrap_or_default();
        // Only complete lines: one being written has no newline yet.
        let complete = text.rfind('\n').map_or("", |i| &text[..i]);
        complete.lines().filter_map(AccessEntry::parse).collect()
    }

    /// Waits (bounded) until nginx has logged every id in `ids`; returns the entries by id.
    pub fn wait_logged(&self, ids: &[&str], timeout: Duration) -> HashMap<String, AccessEntry> {
        let deadline = Instant::now() + timeout;
        loop {
            let by_id: HashMap<String, AccessEntry> = self
                .access_log()
                .into_iter()
                .filter_map(|e| Some((e.id.clone()?, e)))
                .collect();
            if ids.iter().all(|id| by_id.contains_key(*id)) || Instant::now() > deadline {
                return by_id;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The error log so far (level `info` and up: upstream failures, servers disabled).
    pub fn error_log(&self) -> String {
        fs::read_to_string(self.dir.join("error.log")).unwrap_or_default()
    }

    /// Error log lines containing `needle` (e.g. `upstream prematurely closed`,
    /// `upstream server temporarily disabled`).
    pub fn error_lines(&self, needle: &str) -> Vec<String> {
        self.error_log()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM is nginx's fast shutdown: the master stops its worker, reaps it and exits.
        // (Killing the master first would orphan the worker for init to reap; killing the
        // worker first would make the master start another.) Bounded; SIGKILL if it hangs.
        let workers = children(self.master_pid);
        // SAFETY: plain kill(2) of this value's own child, not yet reaped.
        unsafe { libc::kill(self.master_pid as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    for w in &workers {
                        // SAFETY: plain kill(2) of the worker of the nginx this value started.
                        unsafe { libc::kill(*w as i32, libc::SIGKILL) };
                    }
                    break;
                }
            }
        }
        if std::env::var_os(KEEP_ENV).is_none() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_retried_request() {
        // A real line of nginx 1.22.1: tried 18081 (cut before the headers), then 18082.
        let line = "1795993740.756\t27122\t6\t127.0.0.1:33762\tGET\tx3\t200\t\
                    127.0.0.1:18081, 127.0.0.1:18082\t502, 200\t1.414\t0.000, 0.000\t\
                    -, 1.004\t0.410, 1.004\tfcd13bd51cc60b9dca19210d4813bc2d\t\
                    GET /work?id=x3 HTTP/1.1";
        let e = AccessEntry::parse(line).unwrap();
        assert_eq!(e.pid, 27122);
        assert_eq!(e.connection, 6);
        assert_eq!(e.client, Some("127.0.0.1:33762".parse().unwrap()));
        assert_eq!(e.id.as_deref(), Some("x3"));
        assert_eq!(e.status, 200);
        assert_eq!(e.upstream_addrs, ["127.0.0.1:18081", "127.0.0.1:18082"]);
        assert_eq!(e.upstream_statuses, [Some(502), Some(200)]);
        assert_eq!(e.request_time, Duration::from_millis(1414));
        assert_eq!(
            e.upstream_header_times,
            [None, Some(Duration::from_millis(1004))]
        );
        assert_eq!(
            e.upstream_response_times[0],
            Some(Duration::from_millis(410))
        );
        assert!(e.retried());
        assert_eq!(e.request, "GET /work?id=x3 HTTP/1.1");
    }

    #[test]
    fn parses_a_local_answer_and_rejects_other_lines() {
        let line =
            "1.000\t1\t2\t127.0.0.1:1\tGET\t-\t200\t-\t-\t0.000\t-\t-\t-\tab\tGET / HTTP/1.1";
        let e = AccessEntry::parse(line).unwrap();
        assert_eq!(e.id, None);
        assert!(e.upstream_addrs.is_empty() && e.upstream_statuses.is_empty());
        assert!(!e.retried());
        assert_eq!(
            AccessEntry::parse("2026/11/29 23:08:58 [notice] start"),
            None
        );
    }

    #[test]
    fn leftover_detection_needs_a_dead_run() {
        let mine = format!(
            "{LAB_DIR}/{NAME_PREFIX}{}-3-nginx/access.log",
            std::process::id()
        );
        assert!(!in_dead_dir(&mine));
        assert!(!in_dead_dir("/var/log/nginx/access.log"));
        // A pid above the kernel's maximum (2^22) is never a live process.
        let dead = format!(
            "nginx: master process /usr/sbin/nginx -p {LAB_DIR}/{NAME_PREFIX}4194305-0-nginx/ -c x"
        );
        assert!(in_dead_dir(&dead));
    }
}
