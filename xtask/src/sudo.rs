//! Root through sudo, without leaving root's files behind. Every command needs root (packages,
//! tracefs, eBPF); a user who is not re-runs it through `sudo -E` (`ensure_root`), which keeps
//! their HOME, so cargo and rustup write as root into the user's `~/.cargo`, `~/.rustup` and the
//! checkout's `target/`. After the command (and before `run` replaces itself with the agent),
//! `give_back` hands every root-owned file there back to the user sudo names (SUDO_UID,
//! SUDO_GID), then lists any still owned by root.

use std::{
    env,
    ffi::{OsStr, OsString},
    os::unix::{
        fs::{MetadataExt as _, lchown},
        process::CommandExt as _,
    },
    path::{Path, PathBuf},
    process::{Command, ExitCode},
};

use crate::capture;

/// Set when xtask re-runs itself through sudo, so it never loops.
const REEXEC_ENV: &str = "DRAINWATCH_XTASK_SUDO";

/// Returns when running as root; otherwise re-runs this very command through `sudo -E` (this
/// process is replaced), or says root is needed and hands back exit code 2.
pub fn ensure_root() -> Result<(), ExitCode> {
    let uid = capture(Command::new("id").arg("-u"));
    if uid.as_deref().map(str::trim) == Some("0") {
        return Ok(());
    }
    if env::var_os(REEXEC_ENV).is_none() && capture(Command::new("sudo").arg("--version")).is_some()
    {
        eprintln!("[xtask] not root: re-running through sudo -E");
        let exe = env::current_exe()
            .unwrap_or_else(|_| PathBuf::from(env::args_os().next().unwrap_or_default()));
        // sudo resets PATH (secure_path) even with -E: pass ours on, cargo and rustup live in it.
        let mut path = OsString::from("PATH=");
        path.push(env::var_os("PATH").unwrap_or_default());
        let err = Command::new("sudo")
            .args([OsStr::new("-E"), OsStr::new("env"), &path])
            .arg(format!("{REEXEC_ENV}=1"))
            .arg(exe)
            .args(env::args_os().skip(1))
            .exec();
        eprintln!("[xtask] could not re-run through sudo: {err}");
        return Err(ExitCode::from(2));
    }
    eprintln!(
        "[xtask] cargo xtask must run as root (it installs packages, mounts tracefs and loads eBPF programs): run it again as root."
    );
    Err(ExitCode::from(2))
}

/// The user sudo ran us for: (uid, gid, home), from SUDO_UID, SUDO_GID and SUDO_USER's passwd
/// entry. None when not under sudo, or under sudo from root.
fn invoking_user() -> Option<(u32, u32, Option<PathBuf>)> {
    let id = |name: &str| env::var(name).ok()?.parse::<u32>().ok();
    let (uid, gid) = (id("SUDO_UID")?, id("SUDO_GID")?);
    if uid == 0 {
        return None;
    }
    let home = env::var("SUDO_USER").ok().and_then(|user| {
        let entry = capture(Command::new("getent").args(["passwd", &user]))?;
        let dir = entry.trim().split(':').nth(5)?;
        Some(PathBuf::from(dir))
    });
    Some((uid, gid, home))
}

/// What `give_back` did under one tree.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct GivenBack {
    pub changed: usize,
    /// Root-owned entries left (lchown failed): listed for the user.
    pub left: Vec<PathBuf>,
}

/// Gives every root-owned entry under `dir` (itself included, symlinks not followed) to
/// `uid:gid`; entries of other owners stay as they are.
pub fn give_back(dir: &Path, uid: u32, gid: u32) -> GivenBack {
    let mut out = GivenBack::default();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(meta) = path.symlink_metadata() else {
            continue;
        };
        if meta.uid() == 0 {
            match lchown(&path, Some(uid), Some(gid)) {
                Ok(()) => out.changed += 1,
                Err(_) => out.left.push(path.clone()),
            }
        }
        if meta.is_dir()
            && let Ok(entries) = std::fs::read_dir(&path)
        {
            stack.extend(entries.flatten().map(|e| e.path()));
        }
    }
    out
}

/// After a command run through sudo: the checkout (with `target/`) and the user's cargo and
/// rustup homes back to the user, when they are the user's (a checkout root owns stays root's).
pub fn give_back_to_invoking_user(repo: &Path, target: &Path) {
    let Some((uid, gid, home)) = invoking_user() else {
        return;
    };
    let mut trees = vec![repo.to_path_buf(), target.to_path_buf()];
    if let Some(home) = home {
        trees.push(home.join(".cargo"));
        trees.push(home.join(".rustup"));
    }
    trees.dedup();
    for tree in trees {
        // Only trees the user owns: never take a root-owned tree from root.
        if tree.metadata().map(|m| m.uid()).ok() != Some(uid) {
            continue;
        }
        let done = give_back(&tree, uid, gid);
        if done.changed > 0 {
            println!(
                "[xtask] {} root-owned files under {} given back to {uid}:{gid}",
                done.changed,
                tree.display()
            );
        }
        if !done.left.is_empty() {
            eprintln!(
                "[xtask] still owned by root under {} (remove them, or chown {uid}:{gid}):",
                tree.display()
            );
            for p in done.left.iter().take(20) {
                eprintln!("  {}", p.display());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Needs root, as every xtask command does.
    #[test]
    fn root_owned_files_go_back_to_the_user_and_no_others() {
        let dir = env::temp_dir().join(format!("xtask-sudo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("release/deps")).unwrap();
        std::fs::write(dir.join("release/deps/a.rlib"), b"a").unwrap();
        std::fs::write(dir.join("release/b"), b"b").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", dir.join("release/link")).unwrap();
        // Someone else's file stays theirs.
        std::fs::write(dir.join("other"), b"o").unwrap();
        lchown(dir.join("other"), Some(4321), Some(4321)).unwrap();
        let before_target = std::fs::metadata("/etc/hostname").unwrap().uid();

        let done = give_back(&dir, 1234, 1235);
        assert_eq!(done.changed, 6, "{done:?}"); // dir, release, deps, a.rlib, b, link
        assert!(done.left.is_empty());
        for p in [
            "",
            "release",
            "release/deps",
            "release/deps/a.rlib",
            "release/b",
        ] {
            let m = dir.join(p).metadata().unwrap();
            assert_eq!((m.uid(), m.gid()), (1234, 1235), "{p}");
        }
        let link = dir.join("release/link").symlink_metadata().unwrap();
        assert_eq!(link.uid(), 1234);
        // The link's target was not followed.
        assert_eq!(
            std::fs::metadata("/etc/hostname").unwrap().uid(),
            before_target
        );
        assert_eq!(dir.join("other").metadata().unwrap().uid(), 4321);
        // A second pass finds nothing of root's.
        assert_eq!(give_back(&dir, 1234, 1235), GivenBack::default());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
