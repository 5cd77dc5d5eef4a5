//! nginx processes left by runs whose process is gone (an aborted test): found by the lab
//! directory their command line or open files name, and killed.

use std::{fs, path::Path};

use super::NGINX;
use crate::lab::container::{LAB_DIR, dead_run};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::container::NAME_PREFIX;

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
