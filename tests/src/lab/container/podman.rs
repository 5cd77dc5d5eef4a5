//! The podman command line as the lab runs it (runc, cgroupfs, the ulimits runc needs here),
//! and the busybox image the containers start from.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use super::{IMAGE, LAB_DIR, unique_name};

const RUNC: &str = "/usr/sbin/runc";
pub(crate) const ULIMITS: [&str; 4] = [
    "--ulimit",
    "nofile=10000:10000",
    "--ulimit",
    "nproc=1000:1000",
];

/// A container on podman's network gets the host's resolver and a default route through the
/// host: lab containers resolve nothing, and a lookup must stay in the container.
pub(crate) const NO_RESOLVER: [&str; 2] = ["--dns", "127.0.0.1"];

/// Runs `podman --runtime runc --cgroup-manager=cgroupfs <args>`; stdout, trimmed, or the error.
pub fn podman(args: &[&str]) -> Result<String, String> {
    let out = Command::new("podman")
        .arg("--runtime")
        .arg(RUNC)
        .arg("--cgroup-manager=cgroupfs")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running podman {args:?}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "podman {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

pub(crate) fn inspect(container: &str, format: &str) -> Result<String, String> {
    podman(&["inspect", "--format", format, container])
}

/// Imports `localhost/bb:latest` from the host's `/bin/busybox` if the image is missing.
pub fn ensure_image() {
    if podman(&["image", "exists", IMAGE]).is_ok() {
        return;
    }
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("busybox is needed for the lab image (apt-get install busybox-static)");
    let root = PathBuf::from(LAB_DIR).join(unique_name("image"));
    fs::create_dir_all(root.join("rootfs/bin")).expect("image rootfs dir");
    fs::copy(busybox, root.join("rootfs/bin/busybox")).expect("copy busybox");
    let tar = root.join("rootfs.tar");
    let st = Command::new("tar")
        .arg("-C")
        .arg(root.join("rootfs"))
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .expect("tar");
    assert!(st.success(), "tar of the busybox rootfs failed");
    podman(&["import", tar.to_str().unwrap(), IMAGE]).expect("podman import of the busybox image");
    let _ = fs::remove_dir_all(&root);
}
