//! The container steps: the busybox image the tests run, a check that podman runs it the way
//! the tests do, the fallback routes that keep lab traffic on the machine, and Debian's
//! containerd service kept off (the CRI lab starts its own containerd).

use std::{
    env, fs,
    path::Path,
    process::{self, Command},
};

use anyhow::{Context as _, Result};

use super::{lab_net, say};
use crate::run_quiet;

/// A rootfs holding only a static busybox: host binaries run inside through read-only mounts.
const BUSYBOX_IMAGE: &str = "localhost/bb:latest";

pub(super) fn busybox_image() -> Result<String> {
    let exists = Command::new("podman")
        .args(["image", "exists", BUSYBOX_IMAGE])
        .status()
        .context("could not start podman")?;
    if exists.success() {
        return Ok(format!("{BUSYBOX_IMAGE} present"));
    }
    say(
        "busybox image",
        &format!("importing {BUSYBOX_IMAGE} from /bin/busybox"),
    );
    let dir = env::temp_dir().join(format!("xtask-busybox-{}", process::id()));
    let imported = import_busybox(&dir);
    let _ = fs::remove_dir_all(&dir);
    imported.with_context(|| {
        format!("could not import the busybox image {BUSYBOX_IMAGE} into podman")
    })?;
    Ok(format!(
        "imported {BUSYBOX_IMAGE} (a rootfs with only /bin/busybox)"
    ))
}

fn import_busybox(dir: &Path) -> Result<()> {
    let rootfs = dir.join("R");
    fs::create_dir_all(rootfs.join("bin"))
        .with_context(|| format!("creating {}", rootfs.display()))?;
    fs::copy("/bin/busybox", rootfs.join("bin/busybox"))
        .context("copying /bin/busybox (from busybox-static)")?;
    let tar = dir.join("r.tar");
    run_quiet(
        Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .arg("-cf")
            .arg(&tar)
            .arg("."),
    )?;
    run_quiet(
        Command::new("podman")
            .arg("import")
            .arg(&tar)
            .arg(BUSYBOX_IMAGE),
    )
}

/// The way the tests start containers (see ENVIRONMENT.md): crun refuses the hybrid cgroups here,
/// and without the two ulimits runc fails on setrlimit.
pub(super) fn podman_check() -> Result<String> {
    for init in [false, true] {
        let mut cmd = Command::new("podman");
        cmd.args([
            "--runtime",
            "/usr/sbin/runc",
            "run",
            "--rm",
            "--cgroup-manager=cgroupfs",
        ])
        .args([
            "--ulimit",
            "nofile=10000:10000",
            "--ulimit",
            "nproc=1000:1000",
        ]);
        if init {
            cmd.arg("--init");
        }
        cmd.args([BUSYBOX_IMAGE, "/bin/busybox", "true"]);
        run_quiet(&mut cmd).with_context(|| {
            format!(
                "podman could not run a container{}",
                if init { " with --init (catatonit)" } else { "" }
            )
        })?;
    }
    Ok(format!(
        "runs {BUSYBOX_IMAGE} with runc, with and without --init"
    ))
}

/// A blackhole under every lab subnet (`lab_net`): when podman deletes a bridge with its last
/// container, a packet to a stale container address would otherwise leave by the default route.
/// Routes do not survive a reboot: every lab installs them again at its start.
pub(super) fn lab_routes() -> Result<String> {
    lab_net::ensure_fallbacks().map_err(anyhow::Error::msg)?;
    Ok(format!(
        "blackhole {} metric {} in place",
        lab_net::LAB_SUBNETS.join(", "),
        lab_net::FALLBACK_METRIC
    ))
}

/// Debian's containerd package enables its service; the CRI lab starts a containerd of its own
/// with its own config at `/run/containerd`, so a node's containerd must not be running there.
/// Disabled (and stopped, where systemd runs) once; a second run finds it so.
pub(super) fn containerd_service() -> Result<String> {
    let wants = Path::new("/etc/systemd/system/multi-user.target.wants/containerd.service");
    let systemd = Path::new("/run/systemd/system").exists();
    let mut done = Vec::new();
    if wants.exists() {
        // `disable` edits the links only: it works without a running systemd too.
        run_quiet(Command::new("systemctl").args(["disable", "containerd"]))
            .context("systemctl disable containerd")?;
        done.push("disabled");
    }
    let active = systemd
        && Command::new("systemctl")
            .args(["is-active", "--quiet", "containerd"])
            .status()
            .is_ok_and(|s| s.success());
    if active {
        run_quiet(Command::new("systemctl").args(["stop", "containerd"]))
            .context("systemctl stop containerd")?;
        done.push("stopped");
    }
    Ok(if done.is_empty() {
        "Debian's containerd service is off (the CRI lab starts its own)".into()
    } else {
        format!("Debian's containerd service {}", done.join(" and "))
    })
}
