//! A busybox httpd container: the smallest real listener a stop can be recorded on.

use std::time::{Duration, Instant};

use super::{IMAGE, podman, podman::NO_RESOLVER, setup_once, unique_name};

/// A podman container running busybox httpd on port 8080 as `user` (PID 1, no init: it ignores
/// SIGTERM and is killed at the stop's deadline). Removed on drop.
pub struct Httpd {
    pub name: String,
    pub id: String,
}

impl Httpd {
    pub fn start(what: &str, user: Option<&str>) -> Httpd {
        setup_once();
        let name = unique_name(what);
        let label = format!("drainwatch.lab={}", std::process::id());
        let mut args = vec!["run", "-d", "--name", &name, "--label", &label];
        args.extend([
            "--ulimit",
            "nofile=10000:10000",
            "--ulimit",
            "nproc=1000:1000",
        ]);
        args.extend(NO_RESOLVER);
        if let Some(u) = user {
            args.extend(["--user", u]);
        }
        args.extend([IMAGE, "/bin/busybox", "httpd", "-f", "-p", "8080"]);
        let out = podman(&args).unwrap_or_else(|e| panic!("starting {name}: {e}"));
        let c = Httpd {
            name: name.clone(),
            id: out.lines().last().unwrap_or_default().to_string(),
        };
        // Listening: a LISTEN socket (state 0A) on 8080 (0x1F90) in its network namespace;
        // busybox binds [::].
        let pid = podman(&["inspect", "--format", "{{.State.Pid}}", &name]).expect("pid");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let listening = ["tcp", "tcp6"].iter().any(|f| {
                std::fs::read_to_string(format!("/proc/{pid}/net/{f}"))
                    .unwrap_or_default()
                    .lines()
                    .any(|l| {
                        let cols: Vec<&str> = l.split_whitespace().collect();
                        cols.len() > 3 && cols[1].ends_with(":1F90") && cols[3] == "0A"
                    })
            });
            if listening {
                break;
            }
            assert!(Instant::now() < deadline, "{name} does not listen on 8080");
            std::thread::sleep(Duration::from_millis(20));
        }
        c
    }
}

impl Drop for Httpd {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", "-t", "0", &self.name]);
    }
}
