//! containerd's own account of how tasks ended: `ctr events` in the background, its
//! `/tasks/exit` lines parsed. Ground truth for exit codes that does not come from drainwatch.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde_json::Value;

use super::containerd::K8S_NS;

/// One `/tasks/exit` event: a task's main process ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskExit {
    /// The container's id (for a sandbox, the sandbox id).
    pub container_id: String,
    /// Host pid of the process that exited.
    pub pid: u32,
    /// containerd's exit status: the code, or 128 + the signal that killed it.
    pub exit_status: u32,
    /// When the harness read the line (after the exit, within containerd's event latency).
    pub seen: Instant,
}

/// `ctr events` running from before a stop; the exits it reported so far.
pub struct TaskExits {
    child: Child,
    exits: Arc<Mutex<Vec<TaskExit>>>,
    lines: Arc<Mutex<Vec<String>>>,
}

impl TaskExits {
    /// Starts `ctr -a <socket> events`: its subscription is proven by the first event it
    /// prints ([`TaskExits::wait_started`] for the pod it watches).
    pub(super) fn watch(socket: &Path) -> TaskExits {
        let mut child = Command::new("/usr/bin/ctr")
            .arg("-a")
            .arg(socket)
            .arg("events")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ctr events");
        let stdout = child.stdout.take().expect("ctr events' stdout");
        let exits = Arc::new(Mutex::new(Vec::new()));
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (e, l) = (exits.clone(), lines.clone());
        std::thread::Builder::new()
            .name("cri-events".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if let Some(exit) = parse_exit(&line) {
                        e.lock().expect("exits lock").push(exit);
                    }
                    l.lock().expect("lines lock").push(line);
                }
            })
            .expect("spawn the events reader");
        TaskExits {
            child,
            exits,
            lines,
        }
    }

    /// Every `/tasks/exit` seen so far.
    pub fn exits(&self) -> Vec<TaskExit> {
        self.exits.lock().expect("exits lock").clone()
    }

    /// Waits (up to `timeout`) for `container_id`'s `/tasks/start`: from then on the watcher
    /// has been subscribed and sees the task's exit.
    pub fn wait_started(&self, container_id: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let started = |l: &String| {
            l.split_once(" /tasks/start ")
                .and_then(|(_, json)| serde_json::from_str::<Value>(json.trim()).ok())
                .is_some_and(|v| v["container_id"] == container_id)
        };
        while !self.lines.lock().expect("lines lock").iter().any(started) {
            assert!(
                Instant::now() < deadline,
                "ctr events reported no start of {container_id} within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `container_id`'s task exit, waiting up to `timeout` for it.
    pub fn wait_exit(&self, container_id: &str, timeout: Duration) -> TaskExit {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self
                .exits()
                .into_iter()
                .find(|e| e.container_id == container_id)
            {
                return e;
            }
            assert!(
                Instant::now() < deadline,
                "containerd reported no exit of {container_id} within {timeout:?}; its events:\n{}",
                self.lines.lock().expect("lines lock").join("\n")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for TaskExits {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `<time> <namespace> /tasks/exit {"container_id":…,"id":…,"pid":…,"exit_status":…}` of the
/// CRI's namespace (ctr prints the event's fields as JSON; a zero exit status is omitted).
fn parse_exit(line: &str) -> Option<TaskExit> {
    let (head, json) = line.split_once(" /tasks/exit ")?;
    if head.split_whitespace().last() != Some(K8S_NS) {
        return None;
    }
    let v: Value = serde_json::from_str(json.trim()).ok()?;
    Some(TaskExit {
        container_id: v["container_id"].as_str()?.to_string(),
        pid: v["pid"].as_u64().and_then(|p| u32::try_from(p).ok())?,
        exit_status: v["exit_status"]
            .as_u64()
            .and_then(|s| u32::try_from(s).ok())
            .unwrap_or(0),
        seen: Instant::now(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_task_exit_line() {
        let line = r#"2026-12-07 07:40:01.123456789 +0000 UTC k8s.io /tasks/exit {"container_id":"abc","id":"abc","pid":4242,"exit_status":143,"exited_at":"2026-12-07T07:40:01.1Z"}"#;
        let e = parse_exit(line).expect("an exit");
        assert_eq!(
            (e.container_id.as_str(), e.pid, e.exit_status),
            ("abc", 4242, 143)
        );
        let zero = r#"2026-12-07 07:40:01 +0000 UTC k8s.io /tasks/exit {"container_id":"z","id":"z","pid":7}"#;
        assert_eq!(parse_exit(zero).map(|e| e.exit_status), Some(0));
        let other =
            r#"2026-12-07 07:40:01 +0000 UTC moby /tasks/exit {"container_id":"m","pid":1}"#;
        assert_eq!(parse_exit(other), None);
    }
}
