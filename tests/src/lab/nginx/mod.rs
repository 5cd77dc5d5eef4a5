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

mod access_log;
mod leftovers;

use std::{
    collections::HashMap,
    fs,
    net::{SocketAddr, SocketAddrV4},
    os::unix::process::CommandExt,
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::Once,
    time::{Duration, Instant},
};

pub use access_log::AccessEntry;
pub use leftovers::cleanup_leftovers;

use super::{
    container::{KEEP_ENV, LAB_DIR, http_get, on_local_link, setup_once, unique_name},
    proxy::{self, ms},
};
use crate::agent::free_port;

const TEMPLATE: &str = include_str!("../../../lab/nginx.conf.in");
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
    /// `keepalive N` in the upstream block, with `proxy_http_version 1.1` and
    /// `proxy_set_header Connection ""`: a pool of idle upstream connections per worker,
    /// reused across requests (and by retries). `None`: one connection per request.
    pub keepalive: Option<u32>,
    /// `proxy_ignore_client_abort on`: a request goes on upstream after its client left.
    pub ignore_client_abort: bool,
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
            keepalive: None,
            ignore_client_abort: false,
        }
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
        let (keepalive, upstream_http) = match opts.keepalive {
            None => (
                "        # no keepalive: one connection per request".to_string(),
                "            # HTTP/1.0 upstream, Connection: close".to_string(),
            ),
            Some(n) => (
                format!("        keepalive {n};"),
                "            proxy_http_version 1.1;\n            proxy_set_header Connection \"\";"
                    .to_string(),
            ),
        };
        let cfg = TEMPLATE
            .replace("{{KEEPALIVE}}", &keepalive)
            .replace("{{UPSTREAM_HTTP}}", &upstream_http)
            .replace("{{DIR}}", &dir.display().to_string())
            .replace("{{LISTEN}}", &frontend.to_string())
            .replace("{{CONNECT_TIMEOUT}}", &ms(opts.connect_timeout))
            .replace("{{READ_TIMEOUT}}", &ms(opts.read_timeout))
            .replace("{{NEXT_UPSTREAM}}", &next_upstream)
            .replace(
                "{{CLIENT_ABORT}}",
                if opts.ignore_client_abort {
                    "            proxy_ignore_client_abort on;"
                } else {
                    "            # proxy_ignore_client_abort off: a client's leaving ends its request"
                },
            )
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
        proxy::wait_logged(ids, timeout, || {
            self.access_log()
                .into_iter()
                .filter_map(|e| Some((e.id.clone()?, e)))
                .collect()
        })
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
