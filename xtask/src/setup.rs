//! `cargo xtask setup`: installs what a fresh Debian 12 machine (root, rustup's stable toolchain,
//! nothing else) lacks to build, run and test drainwatch. Every step checks first, so a second run
//! installs nothing.

use std::{
    env, fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::{self, Command},
    time::Instant,
};

use anyhow::{Context as _, Result, anyhow, bail, ensure};

use crate::{capture, run_cmd, run_quiet, secs};

const TRACEFS: &str = "/sys/kernel/tracing";

/// Debian packages, installed with `--no-install-recommends`.
const APT_PACKAGES: &[&str] = &[
    // bpf-linker is built against LLVM 22 (Debian 12's security archive carries 22.1.x).
    "llvm-22-dev",
    "libpolly-22-dev",
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
    // The real neighbours the tests drive.
    "nginx-light",
    "haproxy",
    "prometheus",
    "chromium",
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

/// A rootfs holding only a static busybox: host binaries run inside through read-only mounts.
const BUSYBOX_IMAGE: &str = "localhost/bb:latest";

/// The nightly aya-build compiles the eBPF crate with (`rustup run nightly ...`). Its LLVM must
/// not be newer than bpf-linker's (22): nightlies from 1.99 on are LLVM 23 and fail to link
/// ("Invalid record"). This dated nightly is rustc 1.97.0-nightly (e50aa6fba 2026-05-19), LLVM
/// 22.1.4: the one the verified machines have.
const PINNED_NIGHTLY: &str = "nightly-2026-05-20";
const EBPF_LLVM_MAJOR: u32 = 22;

const BPF_LINKER_VERSION: &str = "0.13.0";
/// Without it bpf-linker's build finds /usr/bin/llvm-config (LLVM 14) and fails to link -lLLVM.
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

/// Runs every step in order; a failing step has printed why and stops the rest.
pub fn run() -> Result<(), ()> {
    let t = Instant::now();
    step("tracefs", tracefs)?;
    step("apt", apt)?;
    step("busybox image", busybox_image)?;
    step("podman", podman_check)?;
    step("rust nightly", nightly)?;
    step("rust-src", rust_src)?;
    step("bpf-linker", bpf_linker)?;
    step("pip", pip)?;
    step("deploy tools", deploy_tools)?;
    println!("[setup] done ({})", secs(t.elapsed()));
    Ok(())
}

/// Runs one step: prints its outcome and how long it took, or why it failed.
fn step(name: &str, f: impl FnOnce() -> Result<String>) -> Result<(), ()> {
    let t = Instant::now();
    match f() {
        Ok(outcome) => {
            println!("[setup] {name}: {outcome} ({})", secs(t.elapsed()));
            Ok(())
        }
        Err(e) => {
            eprintln!("[setup] {name}: FAILED after {}: {e}", secs(t.elapsed()));
            for cause in e.chain().skip(1) {
                eprintln!("[setup]   caused by: {cause}");
            }
            Err(())
        }
    }
}

fn say(name: &str, what: &str) {
    println!("[setup] {name}: {what}");
}

fn tracefs() -> Result<String> {
    let events = Path::new(TRACEFS).join("events");
    if events.is_dir() {
        return Ok(format!("present ({} exists)", events.display()));
    }
    say("tracefs", &format!("mounting tracefs at {TRACEFS}"));
    run_cmd(Command::new("mount").args(["-t", "tracefs", "nodev", TRACEFS]))
        .with_context(|| format!("could not mount tracefs at {TRACEFS}, which drainwatch needs to read tracepoint formats"))?;
    ensure!(
        events.is_dir(),
        "tracefs is mounted at {TRACEFS} but has no events/ directory, so this kernel offers no tracepoints"
    );
    Ok(format!("mounted tracefs at {TRACEFS}"))
}

fn dpkg_installed(package: &str) -> bool {
    capture(Command::new("dpkg-query").args(["-W", "-f", "${Status}", package]))
        .is_some_and(|status| status.trim() == "install ok installed")
}

fn apt() -> Result<String> {
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| !dpkg_installed(p))
        .collect();
    if missing.is_empty() {
        return Ok(format!("all {} packages present", APT_PACKAGES.len()));
    }
    say(
        "apt",
        &format!(
            "{} of {} packages missing: {}",
            missing.len(),
            APT_PACKAGES.len(),
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

fn busybox_image() -> Result<String> {
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
fn podman_check() -> Result<String> {
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

fn rustup() -> Command {
    let mut cmd = Command::new("rustup");
    // Never let `rustup run` quietly download a toolchain we did not ask for.
    cmd.env("RUSTUP_AUTO_INSTALL", "0");
    cmd
}

/// `rustc -vV` of a toolchain: its release line and its LLVM major version.
fn rustc_llvm(toolchain: &str) -> Result<(String, u32)> {
    let vv = capture(rustup().args(["run", toolchain, "rustc", "-vV"]))
        .ok_or_else(|| anyhow!("`rustup run {toolchain} rustc -vV` failed"))?;
    let field = |name: &str| vv.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
    let release = field("release:").unwrap_or("unknown").to_owned();
    let llvm = field("LLVM version:")
        .and_then(|v| v.split('.').next()?.parse().ok())
        .ok_or_else(|| anyhow!("`rustup run {toolchain} rustc -vV` shows no LLVM version"))?;
    Ok((release, llvm))
}

/// aya-build runs `rustup run nightly cargo build ...`, so the toolchain must be called exactly
/// `nightly`, yet a fresh `rustup toolchain install nightly` brings today's nightly, whose LLVM
/// is newer than bpf-linker's. rustup has no way to install a dated nightly under the name
/// `nightly`, and `rustup toolchain link` refuses channel names like `nightly`. So: install the
/// pinned dated nightly (a normal rustup toolchain), then add the symlink
/// `toolchains/nightly-<host> -> nightly-<date>-<host>` next to it. rustup treats it as the
/// installed `nightly`: `run`, `component add` and `toolchain list` all work (tried; the verified
/// machines already carry the same kind of symlink, `1.95.0 -> stable`). Only `rustup update`
/// would move it to today's nightly: don't run that on these machines.
fn nightly() -> Result<String> {
    let list = capture(rustup().args(["toolchain", "list"]))
        .context("`rustup toolchain list` failed: rustup must be installed and on PATH")?;
    // `nightly-<host>`, not a dated `nightly-2026-05-20-<host>`.
    let has_nightly = list
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .any(|t| {
            t.strip_prefix("nightly-")
                .is_some_and(|rest| !rest.starts_with(|c: char| c.is_ascii_digit()))
        });
    if has_nightly {
        let (release, llvm) = rustc_llvm("nightly")?;
        ensure!(
            llvm == EBPF_LLVM_MAJOR,
            "the installed `nightly` toolchain is {release} on LLVM {llvm}, but the eBPF build needs \
             LLVM {EBPF_LLVM_MAJOR} (bpf-linker's): run `rustup toolchain uninstall nightly` and \
             `cargo xtask setup` again to get the pinned {PINNED_NIGHTLY}"
        );
        return Ok(format!("present: {release}, LLVM {llvm}"));
    }

    say(
        "rust nightly",
        &format!("no `nightly` toolchain: installing {PINNED_NIGHTLY} and naming it `nightly`"),
    );
    run_cmd(rustup().args([
        "toolchain",
        "install",
        PINNED_NIGHTLY,
        "--profile",
        "minimal",
        "--no-self-update",
    ]))
    .with_context(|| format!("rustup could not install {PINNED_NIGHTLY}"))?;
    let sysroot = capture(rustup().args(["run", PINNED_NIGHTLY, "rustc", "--print", "sysroot"]))
        .map(|s| PathBuf::from(s.trim()))
        .with_context(|| format!("{PINNED_NIGHTLY} was installed but its rustc does not run"))?;
    // .../toolchains/nightly-2026-05-20-x86_64-unknown-linux-gnu -> .../toolchains/nightly-x86_64-...
    let dated = sysroot
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_owned();
    let Some(host) = dated.strip_prefix(&format!("{PINNED_NIGHTLY}-")) else {
        bail!(
            "{PINNED_NIGHTLY}'s sysroot {} is not a rustup toolchain directory",
            sysroot.display()
        );
    };
    let link = sysroot.with_file_name(format!("nightly-{host}"));
    if fs::symlink_metadata(&link).is_ok() {
        bail!(
            "{} exists but rustup does not list it as a toolchain; remove it and run setup again",
            link.display()
        );
    }
    symlink(&dated, &link)
        .with_context(|| format!("could not create the symlink {} -> {dated}", link.display()))?;
    let (release, llvm) = rustc_llvm("nightly")?;
    ensure!(
        llvm == EBPF_LLVM_MAJOR,
        "`nightly` now points at {dated} but reports LLVM {llvm}, not {EBPF_LLVM_MAJOR}"
    );
    Ok(format!(
        "installed {PINNED_NIGHTLY} ({release}, LLVM {llvm}) as `nightly` ({} -> {dated})",
        link.display()
    ))
}

fn rust_src() -> Result<String> {
    let installed =
        capture(rustup().args(["component", "list", "--toolchain", "nightly", "--installed"]))
            .context("`rustup component list --toolchain nightly --installed` failed")?;
    if installed.lines().any(|l| l.trim().starts_with("rust-src")) {
        return Ok("present on nightly".into());
    }
    say(
        "rust-src",
        "adding rust-src to nightly (for -Z build-std=core)",
    );
    run_cmd(rustup().args(["component", "add", "rust-src", "--toolchain", "nightly"]))
        .context("rustup could not add rust-src to the nightly toolchain")?;
    Ok("added to nightly".into())
}

fn cargo_home() -> PathBuf {
    env::var_os("CARGO_HOME").map_or_else(
        || PathBuf::from(env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cargo"),
        PathBuf::from,
    )
}

fn bpf_linker_version(bin: &Path) -> Option<String> {
    let out = capture(Command::new(bin).arg("--version"))?;
    // "bpf-linker 0.13.0"
    out.split_whitespace().nth(1).map(str::to_owned)
}

fn bpf_linker() -> Result<String> {
    let bin = cargo_home().join("bin/bpf-linker");
    match bpf_linker_version(&bin) {
        Some(v) if v == BPF_LINKER_VERSION => return Ok(format!("{} is {v}", bin.display())),
        Some(v) => say(
            "bpf-linker",
            &format!(
                "{} is {v}, not {BPF_LINKER_VERSION}: replacing it",
                bin.display()
            ),
        ),
        None => say("bpf-linker", &format!("{} is missing", bin.display())),
    }
    let llvm_config = Path::new(LLVM_PREFIX).join("bin/llvm-config");
    ensure!(
        llvm_config.exists(),
        "{} is missing, so bpf-linker cannot be built (llvm-22-dev not installed?)",
        llvm_config.display()
    );
    say(
        "bpf-linker",
        &format!("building bpf-linker {BPF_LINKER_VERSION} against LLVM 22 (a few minutes)"),
    );
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    run_cmd(
        Command::new(cargo)
            .env("LLVM_PREFIX", LLVM_PREFIX)
            .args([
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--locked",
                "--force",
            ])
            .args(["--no-default-features", "--features", "llvm-22"]),
    )
    .context("cargo install bpf-linker failed; cargo's output above says why")?;
    match bpf_linker_version(&bin) {
        Some(v) if v == BPF_LINKER_VERSION => Ok(format!("installed {} {v}", bin.display())),
        other => bail!(
            "cargo install finished but {} reports version {}",
            bin.display(),
            other.as_deref().unwrap_or("nothing")
        ),
    }
}

fn pip() -> Result<String> {
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

fn deploy_tools() -> Result<String> {
    let venv = Path::new(DEPLOY_TOOLS_VENV);
    let python = venv.join("bin/python");
    let wanted: Vec<String> = DEPLOY_TOOLS
        .iter()
        .map(|(name, version)| format!("{name}=={version}"))
        .collect();
    if python.exists() {
        let installed = deploy_tool_versions(&python);
        if DEPLOY_TOOLS
            .iter()
            .zip(&installed)
            .all(|((_, v), got)| got.as_deref() == Some(*v))
        {
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
        DEPLOY_TOOLS
            .iter()
            .zip(&installed)
            .all(|((_, v), got)| got.as_deref() == Some(*v)),
        "pip finished but {DEPLOY_TOOLS_VENV} has {installed:?}, not {}",
        wanted.join(" ")
    );
    Ok(format!(
        "installed {} in {DEPLOY_TOOLS_VENV}",
        wanted.join(" ")
    ))
}
