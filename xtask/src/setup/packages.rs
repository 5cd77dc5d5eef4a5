//! The package steps: Debian packages (apt), Python packages for the tests (pip) and the deploy
//! tests' tools in their own virtual environment.

use std::{fs, path::Path, process::Command, time::Instant};

use anyhow::{Context as _, Result, ensure};

use super::say;
use crate::{capture, run_cmd, secs};

/// Debian packages building and running the agent needs, installed with
/// `--no-install-recommends`: bpf-linker is built against LLVM 22 (Debian 12's security archive
/// carries 22.1.x).
pub(super) const APT_BUILD: &[&str] = &["llvm-22-dev", "libpolly-22-dev"];

/// What the tests, the demo and the labs need besides (`cargo xtask test`, `demo`, `bench`,
/// `accuracy`, `soak`, `kernels`).
pub(super) const APT_LAB: &[&str] = &[
    // Real containers for the tests: podman driving runc, a busybox image.
    "podman",
    "runc",
    "busybox-static",
    // podman's Recommends that the tests need, since --no-install-recommends drops them:
    // catatonit is what `podman run --init` puts in as PID 1; netavark + aardvark-dns are the
    // network backend podman uses on the verified machines (without them it falls back to CNI).
    // conmon and iptables are Depends already; listed so the list says what podman runs on.
    // slirp4netns, uidmap and fuse-overlayfs are left out: only rootless podman uses them.
    "conmon",
    "catatonit",
    "netavark",
    "aardvark-dns",
    "iptables",
    // The Service lab: kube-proxy's nftables mode, and its own safety table.
    "nftables",
    // The real neighbours the tests drive.
    "nginx-light",
    "haproxy",
    "prometheus",
    "chromium",
    // The CRI lab: containerd (its CRI plugin, ctr) and the CNI plugins in /usr/lib/cni
    // (bridge, host-local, loopback). The lab starts its own containerd: Debian's service is
    // disabled after the install (`containerd_service` in the containers step).
    "containerd",
    "containernetworking-plugins",
    // protoc: the lab's CRI client (k8s-cri) compiles the CRI protos in its build script, so
    // building the test crate needs it (before clippy, which `cargo xtask test` runs after setup).
    "protobuf-compiler",
    // Independent cross-checks and network namespaces.
    "bpftool",
    "bpftrace",
    "iproute2",
    "curl",
    "ca-certificates",
    // The capabilities test: setpriv drops capabilities, capsh decodes them.
    "util-linux",
    "libcap2-bin",
    // The deploy tools' Python environment (DEPLOY_TOOLS_VENV) is made with Debian's python3.
    "python3-venv",
    // The kernel matrix (`cargo xtask kernels`): other kernels booted under TCG. Depends pull
    // in seabios; the initramfs is written by xtask itself (no cpio needed).
    "qemu-system-x86",
];

/// Python packages the tests need, installed with `python3 -m pip` (the python3 first on PATH;
/// Debian's own /usr/bin/python3 refuses pip installs, PEP 668). None yet.
const PIP_PACKAGES: &[&str] = &[];

/// The deploy tests' tools, in their own virtual environment (shared by every checkout on the
/// machine; the tests look for it here): kubernetes-validate (manifests against the Kubernetes
/// schemas, which it ships) and helm-python-sdk (Helm's own Go SDK behind a C ABI: renders and
/// lints the chart; no `helm` binary is packaged for Debian or PyPI).
const DEPLOY_TOOLS_VENV: &str = "/opt/drainwatch-tools/venv";
const DEPLOY_TOOLS: &[(&str, &str)] = &[
    ("kubernetes-validate", "1.37.0"),
    ("helm-python-sdk", "0.2.2"),
];

fn dpkg_installed(package: &str) -> bool {
    capture(Command::new("dpkg-query").args(["-W", "-f", "${Status}", package]))
        .is_some_and(|status| status.trim() == "install ok installed")
}

/// Installs those of `packages` dpkg does not list as installed (also `cargo xtask image`'s own).
pub(crate) fn apt(packages: &[&str]) -> Result<String> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| !dpkg_installed(p))
        .collect();
    if missing.is_empty() {
        return Ok(format!("all {} packages present", packages.len()));
    }
    say(
        "apt",
        &format!(
            "{} of {} packages missing: {}",
            missing.len(),
            packages.len(),
            missing.join(" ")
        ),
    );
    let t = Instant::now();
    run_cmd(Command::new("apt-get").args(["-q", "update"]))
        .context("apt-get update failed; check the network and the apt sources")?;
    say("apt", &format!("apt-get update took {}", secs(t.elapsed())));
    if missing.contains(&"llvm-22-dev") {
        let policy =
            capture(Command::new("apt-cache").args(["policy", "llvm-22-dev"])).unwrap_or_default();
        let candidate = policy
            .lines()
            .find_map(|l| l.trim().strip_prefix("Candidate:"))
            .map(str::trim);
        ensure!(
            candidate.is_some_and(|c| c != "(none)"),
            "apt offers no llvm-22-dev: add Debian 12's security archive \
             (deb http://security.debian.org/debian-security bookworm-security main) to the apt sources"
        );
    }
    say("apt", &format!("installing {}", missing.join(" ")));
    run_cmd(
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing),
    )
    .context("apt-get install failed; apt's output above says why")?;
    let still: Vec<&str> = missing
        .iter()
        .copied()
        .filter(|p| !dpkg_installed(p))
        .collect();
    ensure!(
        still.is_empty(),
        "apt-get install succeeded but left these packages uninstalled: {}",
        still.join(" ")
    );
    Ok(format!("installed {}", missing.join(" ")))
}

pub(super) fn pip() -> Result<String> {
    if PIP_PACKAGES.is_empty() {
        return Ok("no Python packages needed yet".into());
    }
    let missing: Vec<&str> = PIP_PACKAGES
        .iter()
        .copied()
        .filter(|p| capture(Command::new("python3").args(["-m", "pip", "show", "-q", p])).is_none())
        .collect();
    if missing.is_empty() {
        return Ok(format!(
            "all {} Python packages present",
            PIP_PACKAGES.len()
        ));
    }
    say("pip", &format!("installing {}", missing.join(" ")));
    run_cmd(
        Command::new("python3")
            .args(["-m", "pip", "install", "-q"])
            .args(&missing),
    )
    .context("pip could not install the Python test packages; its output above says why")?;
    Ok(format!("installed {}", missing.join(" ")))
}

/// Installed versions of `DEPLOY_TOOLS` in the venv, in order (`None` for a missing one).
fn deploy_tool_versions(python: &Path) -> Vec<Option<String>> {
    DEPLOY_TOOLS
        .iter()
        .map(|(name, _)| {
            capture(Command::new(python).args([
                "-c",
                &format!("import importlib.metadata as m; print(m.version({name:?}))"),
            ]))
            .map(|v| v.trim().to_owned())
        })
        .collect()
}

/// Whether `installed` (from [`deploy_tool_versions`]) has every tool at its pinned version.
fn all_wanted(installed: &[Option<String>]) -> bool {
    DEPLOY_TOOLS
        .iter()
        .zip(installed)
        .all(|((_, v), got)| got.as_deref() == Some(*v))
}

pub(super) fn deploy_tools() -> Result<String> {
    let venv = Path::new(DEPLOY_TOOLS_VENV);
    let python = venv.join("bin/python");
    let wanted: Vec<String> = DEPLOY_TOOLS
        .iter()
        .map(|(name, version)| format!("{name}=={version}"))
        .collect();
    if python.exists() {
        let installed = deploy_tool_versions(&python);
        if all_wanted(&installed) {
            return Ok(format!("{} in {DEPLOY_TOOLS_VENV}", wanted.join(" ")));
        }
    } else {
        say(
            "deploy tools",
            &format!("creating the virtual environment {DEPLOY_TOOLS_VENV}"),
        );
        fs::create_dir_all(venv.parent().unwrap_or(venv))
            .with_context(|| format!("creating {}", venv.display()))?;
        run_cmd(Command::new("/usr/bin/python3").args(["-m", "venv", DEPLOY_TOOLS_VENV]))
            .context("python3 -m venv failed (is python3-venv installed?)")?;
    }
    say("deploy tools", &format!("installing {}", wanted.join(" ")));
    run_cmd(
        Command::new(&python)
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
            .args(&wanted),
    )
    .context("pip could not install the deploy tools; its output above says why")?;
    let installed = deploy_tool_versions(&python);
    ensure!(
        all_wanted(&installed),
        "pip finished but {DEPLOY_TOOLS_VENV} has {installed:?}, not {}",
        wanted.join(" ")
    );
    Ok(format!(
        "installed {} in {DEPLOY_TOOLS_VENV}",
        wanted.join(" ")
    ))
}
