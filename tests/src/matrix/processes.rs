//! The matrix's process checks: SIGTERM and SIGKILL exits with their codes, and a cgroup's
//! removal.

use std::{os::unix::process::ExitStatusExt, process::Command};

use drainwatch::capture::event::{Event, ExitStatus};

use super::Loaded;
use crate::cgroup_v2_root;

pub(super) struct Child {
    pid: u32,
    status: std::process::ExitStatus,
}

pub(super) fn child(sig: i32) -> Child {
    let mut c = Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("spawn sleep");
    let pid = c.id();
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
    let status = c.wait().expect("wait");
    Child { pid, status }
}

/// The signal from this process to the child, and the child's exit by it, as a shell's code.
pub(super) fn check_killed(_: &Loaded, c: &Child, events: &[Event], sig: i32, code: i32) -> String {
    assert_eq!(c.status.signal(), Some(sig));
    let signals: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::Signal(s) if s.target_pid == c.pid as i32 => Some((s.sig, s.meta.tgid)),
            _ => None,
        })
        .collect();
    assert_eq!(signals, [(sig, std::process::id())], "{events:#?}");
    let exits: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::Exit(x) if x.meta.tgid == c.pid => Some(x.status),
            _ => None,
        })
        .collect();
    assert_eq!(
        exits,
        [ExitStatus::Killed {
            signal: sig,
            core: false
        }],
        "{events:#?}"
    );
    assert_eq!(exits[0].shell_code(), Some(code));
    format!(
        "pid {} got signal {sig} from pid {}, exit code {code}",
        c.pid,
        std::process::id()
    )
}

pub(super) struct Removed {
    name: String,
    id: u64,
}

pub(super) fn cgroup() -> Removed {
    use std::os::unix::fs::MetadataExt;
    let name = format!("dw-matrix-{}", std::process::id());
    let dir = cgroup_v2_root().join(&name);
    std::fs::create_dir(&dir).expect("mkdir cgroup");
    let id = std::fs::metadata(&dir).expect("stat").ino();
    std::fs::remove_dir(&dir).expect("rmdir cgroup");
    Removed { name, id }
}

pub(super) fn check_cgroup(_: &Loaded, c: &Removed, events: &[Event]) -> String {
    let got: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::CgroupRemoved(x) if x.path.ends_with(&c.name) => Some(x),
            _ => None,
        })
        .collect();
    assert_eq!(got.len(), 1, "{events:#?}");
    assert_eq!(got[0].id, c.id, "v2 cgroup id = its directory's inode");
    assert_eq!(got[0].path, format!("/{}", c.name));
    assert_eq!((got[0].hierarchy, got[0].level), (0, 1));
    assert_eq!(got[0].meta.tgid, std::process::id(), "rmdir ran here");
    format!(
        "cgroup /{} id {} removed by pid {}",
        c.name, c.id, got[0].meta.tgid
    )
}
