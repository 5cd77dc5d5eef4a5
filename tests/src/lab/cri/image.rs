//! The lab's two images from one busybox layer, written as a `docker save` archive (names in
//! `RepoTags`, so no digests to compute but the layer's diff id) and imported with `ctr`.

use std::{fs, path::Path, process::Command};

use super::{APP_IMAGE, PAUSE_IMAGE, containerd::Containerd};

/// Directories the containers' bind mounts and runc's need in the rootfs (runc would create
/// them in the writable layer; present, they are plain mount points).
const DIRS: &[&str] = &[
    "bin", "dev", "etc", "lab", "lib", "lib64", "proc", "root", "sys", "tmp", "usr",
];

/// Builds the archive in the lab's directory and imports it into containerd's `k8s.io`
/// namespace, where the CRI looks for images. Panics with ctr's output if it fails.
pub(super) fn import(c: &Containerd) {
    let dir = c.dir.join("image");
    let rootfs = dir.join("rootfs");
    for d in DIRS {
        fs::create_dir_all(rootfs.join(d)).expect("image rootfs directory");
    }
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("busybox is needed for the CRI lab's images (apt-get install busybox-static)");
    fs::copy(busybox, rootfs.join("bin/busybox")).expect("copy busybox");
    let layer = dir.join("layer.tar");
    run(Command::new("tar")
        .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
        .arg(&rootfs)
        .arg("-cf")
        .arg(&layer)
        .arg("."));
    let diff_id = sha256(&layer);
    // The pause process: busybox sleep as PID 1, which ignores SIGTERM and is SIGKILLed by
    // StopPodSandbox, as the real pause is.
    let pause = image_config(
        r#""Entrypoint":["/bin/busybox","sleep","2147483647"]"#,
        &diff_id,
    );
    let app = image_config(r#""Cmd":["/bin/busybox","sh"]"#, &diff_id);
    fs::write(dir.join("pause.json"), pause).expect("write the pause image's config");
    fs::write(dir.join("app.json"), app).expect("write the app image's config");
    let manifest = format!(
        r#"[{{"Config":"pause.json","RepoTags":["{PAUSE_IMAGE}"],"Layers":["layer.tar"]}},{{"Config":"app.json","RepoTags":["{APP_IMAGE}"],"Layers":["layer.tar"]}}]"#
    );
    fs::write(dir.join("manifest.json"), manifest).expect("write the archive's manifest");
    let archive = dir.join("images.tar");
    run(Command::new("tar")
        .arg("-C")
        .arg(&dir)
        .arg("-cf")
        .arg(&archive)
        .args(["manifest.json", "pause.json", "app.json", "layer.tar"]));
    let archive = archive.to_string_lossy().into_owned();
    if let Err(e) = c.ctr(&["images", "import", &archive]) {
        panic!(
            "importing the lab's images: {e}\ncontainerd's log:\n{}",
            c.log()
        );
    }
    let listed = c.ctr(&["images", "ls", "-q"]).unwrap_or_default();
    for name in [PAUSE_IMAGE, APP_IMAGE] {
        assert!(
            listed.lines().any(|l| l.trim() == name),
            "{name} not in containerd after the import: {listed}"
        );
    }
}

fn image_config(config: &str, diff_id: &str) -> String {
    // The image's platform must be the host's, or containerd does not unpack it.
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    format!(
        r#"{{"architecture":"{arch}","os":"linux","config":{{{config}}},"rootfs":{{"type":"layers","diff_ids":["sha256:{diff_id}"]}}}}"#
    )
}

/// The SHA-256 of a file, hex (coreutils' `sha256sum`: the lab needs no hashing crate for one
/// digest).
fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("run sha256sum");
    assert!(out.status.success(), "sha256sum {}", path.display());
    let text = String::from_utf8_lossy(&out.stdout);
    let hex = text
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    assert_eq!(hex.len(), 64, "sha256sum printed {text:?}");
    hex
}

fn run(cmd: &mut Command) {
    let status = cmd.status().expect("run tar");
    assert!(status.success(), "{cmd:?} failed: {status}");
}
