//! The Socket.IO lab's npm packages (`tests/lab/socketio/`): socket.io and socket.io-client,
//! pinned by the committed package-lock.json and installed with `npm ci` into its
//! `node_modules` (ignored by git). The lab's containers run the host's Node (`/usr/bin/node`)
//! through a read-only `/usr` mount, so Node must be installed on the host.

use std::{fs, path::Path, process::Command};

use anyhow::{Context as _, Result, ensure};

use super::{packages::apt, say};
use crate::{capture, repo_root, run_cmd};

/// The lab's directory, from the repository root.
const LAB: &str = "tests/lab/socketio";
/// A copy of the lock file the last `npm ci` installed from: while it equals the committed
/// one (and the packages are there), there is nothing to do.
const STAMP: &str = "node_modules/.drainwatch-package-lock.json";
/// socket.io 4.8 runs on Node 10+; the lab is verified on 20 (Debian 12 packages 18).
const MIN_NODE_MAJOR: u32 = 18;
const PACKAGES: [&str; 2] = ["socket.io", "socket.io-client"];

/// `node --version`'s major number.
fn node_major() -> Option<u32> {
    let v = capture(Command::new("node").arg("--version"))?;
    v.trim()
        .trim_start_matches('v')
        .split('.')
        .next()?
        .parse()
        .ok()
}

fn installed_version(dir: &Path, package: &str) -> Option<String> {
    let text =
        fs::read_to_string(dir.join("node_modules").join(package).join("package.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["version"].as_str().map(str::to_owned)
}

pub(super) fn socketio_lab() -> Result<String> {
    if node_major().is_none() || capture(Command::new("npm").arg("--version")).is_none() {
        // Debian's own; a Node from NodeSource brings its own npm and is left alone.
        say(
            "socket.io lab",
            "no node or npm: installing Debian's nodejs and npm",
        );
        apt(&["nodejs", "npm"])?;
    }
    let major = node_major().context("node is still missing after installing nodejs")?;
    ensure!(
        major >= MIN_NODE_MAJOR,
        "node v{major} is too old for the Socket.IO lab (v{MIN_NODE_MAJOR}+ needed)"
    );
    ensure!(
        Path::new("/usr/bin/node").exists(),
        "the Socket.IO lab's containers run /usr/bin/node (through the /usr mount), which is missing"
    );
    let dir = repo_root().join(LAB);
    let lock = fs::read(dir.join("package-lock.json"))
        .with_context(|| format!("reading {LAB}/package-lock.json"))?;
    let versions = || {
        PACKAGES
            .iter()
            .map(|p| {
                format!(
                    "{p} {}",
                    installed_version(&dir, p).unwrap_or("missing".into())
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let present = PACKAGES
        .iter()
        .all(|p| installed_version(&dir, p).is_some());
    if present && fs::read(dir.join(STAMP)).ok().as_deref() == Some(&lock[..]) {
        return Ok(format!("{} (node v{major})", versions()));
    }
    say(
        "socket.io lab",
        &format!("npm ci in {LAB} (pinned by its package-lock.json)"),
    );
    run_cmd(
        Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(&dir),
    )
    .context("npm ci failed; its output above says why (the npm registry must be reachable)")?;
    ensure!(
        PACKAGES
            .iter()
            .all(|p| installed_version(&dir, p).is_some()),
        "npm ci finished but {LAB}/node_modules lacks {}",
        versions()
    );
    fs::write(dir.join(STAMP), &lock).with_context(|| format!("writing {LAB}/{STAMP}"))?;
    Ok(format!("installed {} (node v{major})", versions()))
}
