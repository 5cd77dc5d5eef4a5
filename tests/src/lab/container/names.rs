//! The lab's names (`dwlab-<pid>-<n>-...`, unique across runs), the leftovers of runs whose
//! process is gone, and the once-per-process setup.

use std::{
    fs,
    path::Path,
    sync::{
        Once,
        atomic::{AtomicU32, Ordering},
    },
};

use super::{KEEP_ENV, LAB_DIR, NAME_PREFIX, ensure_image, podman};
use crate::lab::net;

static SETUP: Once = Once::new();
static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A name no other lab object of this or any other run has: `dwlab-<pid>-<n>-<what>`.
pub fn unique_name(what: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{NAME_PREFIX}{}-{n}-{what}", std::process::id())
}

/// Whether a lab object's name (a container, a lab directory) belongs to a run whose process is
/// gone: names carry the creating pid.
pub fn dead_run(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(NAME_PREFIX) else {
        return false;
    };
    let pid: u32 = match rest.split('-').next().and_then(|p| p.parse().ok()) {
        Some(p) => p,
        None => return false,
    };
    pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists()
}

/// Removes lab containers, HAProxy processes and directories left by runs whose process is gone
/// (an aborted test): names carry the creating pid, so a concurrent run's are left alone.
/// Returns how many containers were removed.
pub fn cleanup_leftovers() -> usize {
    let names = podman(&["ps", "-a", "--format", "{{.Names}}"]).unwrap_or_default();
    let mut stale: Vec<&str> = names.lines().filter(|n| dead_run(n)).collect();
    // Servers before their network holders: a holder with dependents cannot be removed.
    stale.sort_by_key(|n| n.ends_with("-net"));
    for name in &stale {
        let _ = podman(&["rm", "-f", "-t", "0", name]);
    }
    // An HAProxy whose run was SIGKILLed before PR_SET_PDEATHSIG could act: its command line
    // names its configuration in the dead run's directory.
    for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = fs::read(e.path().join("cmdline")).unwrap_or_default();
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let ours = args.first().is_some_and(|a| a.ends_with("haproxy"))
            && args.iter().any(|a| {
                a.strip_prefix(LAB_DIR)
                    .and_then(|r| r.strip_prefix('/'))
                    .is_some_and(dead_run)
            });
        if ours {
            // SAFETY: plain kill(2) of a process this harness started in an earlier run.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    if let Ok(dir) = fs::read_dir(LAB_DIR) {
        for e in dir.flatten() {
            if dead_run(&e.file_name().to_string_lossy()) {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
    stale.len()
}

/// Once per process: the lab subnets' fallback routes are in place (routes do not survive a
/// reboot, and `xtask setup` may not have run since), the image exists and leftovers of dead
/// runs are gone.
pub fn setup_once() {
    SETUP.call_once(|| {
        if let Err(e) = net::ensure_fallbacks() {
            panic!("lab: no fallback route for the lab subnets, refusing to run: {e}");
        }
        fs::create_dir_all(LAB_DIR).expect("create the lab directory");
        ensure_image();
        let n = cleanup_leftovers();
        if n > 0 {
            eprintln!("lab: removed {n} leftover containers of earlier runs");
        }
    });
}

pub(crate) fn keep() -> bool {
    std::env::var_os(KEEP_ENV).is_some()
}
