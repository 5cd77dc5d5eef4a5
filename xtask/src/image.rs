//! `cargo xtask image`: the agent's OCI image, built on this machine from nothing that must be
//! pulled. The release binary (stripped) and exactly the shared libraries it loads, found by
//! walking its ELF `NEEDED` entries, go into an otherwise empty root; deploy/Containerfile copies
//! that root `FROM scratch`. The image is saved as an OCI archive under target/image/.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::{Command, ExitCode},
    time::Instant,
};

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use clap::{Args, ValueEnum};

use crate::{capture, cargo, repo_root, run_cmd, run_quiet, secs, setup, target_dir};

/// The repository of the local image; `<version>` tags the amd64 image, `<version>-arm64` the
/// arm64 one.
pub const REPOSITORY: &str = "localhost/drainwatch";
const RUNC: &str = "/usr/sbin/runc";

#[derive(Args)]
pub struct ImageArgs {
    /// Skip `cargo xtask setup` (when the machine is known to be set up)
    #[arg(long)]
    no_setup: bool,
    /// The architecture to build for (arm64 is cross-compiled and checked under qemu-user)
    #[arg(long, value_enum, default_value_t = Arch::Amd64)]
    arch: Arch,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Arch {
    Amd64,
    Arm64,
}

impl Arch {
    /// The OCI name (`podman build --platform linux/<name>`).
    fn name(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// The cross target; `None` builds for this (x86_64) machine.
    fn rust_target(self) -> Option<&'static str> {
        match self {
            Arch::Amd64 => None,
            Arch::Arm64 => Some("aarch64-unknown-linux-gnu"),
        }
    }

    /// Where the target's shared libraries live here: the host's own for amd64, Debian's
    /// cross libc (libc6-arm64-cross) for arm64.
    fn lib_dirs(self) -> &'static [&'static str] {
        match self {
            Arch::Amd64 => &["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"],
            Arch::Arm64 => &["/usr/aarch64-linux-gnu/lib"],
        }
    }

    fn strip(self) -> &'static str {
        match self {
            Arch::Amd64 => "strip",
            Arch::Arm64 => "aarch64-linux-gnu-strip",
        }
    }

    /// What this command installs (not `cargo xtask setup`: only image builds need them).
    fn packages(self) -> &'static [&'static str] {
        match self {
            // podman builds and saves the image; binutils' readelf and strip.
            Arch::Amd64 => &["podman", "runc", "binutils"],
            // Debian's cross toolchain (linker, libc to link against and to ship) and
            // qemu-user to run the result once.
            Arch::Arm64 => &[
                "podman",
                "runc",
                "binutils",
                "gcc-aarch64-linux-gnu",
                "libc6-dev-arm64-cross",
                "qemu-user",
            ],
        }
    }

    fn tag(self, version: &str) -> String {
        match self {
            Arch::Amd64 => format!("{REPOSITORY}:{version}"),
            Arch::Arm64 => format!("{REPOSITORY}:{version}-arm64"),
        }
    }
}

/// What one build produced.
pub struct Built {
    pub tag: String,
    pub archive: PathBuf,
    pub image_bytes: u64,
    pub archive_bytes: u64,
    pub libraries: Vec<String>,
}

pub fn run(args: &ImageArgs) -> ExitCode {
    // Building needs what `run` needs; the image's own packages come in `build`.
    if !args.no_setup && setup::run_for(setup::Purpose::Run).is_err() {
        return ExitCode::FAILURE;
    }
    let t = Instant::now();
    match build(args.arch) {
        Ok(b) => {
            println!(
                "[image] {} ({:.1} MB in podman, libraries: {}) saved as {} ({:.1} MB) in {}",
                b.tag,
                mb(b.image_bytes),
                b.libraries.join(" "),
                b.archive.display(),
                mb(b.archive_bytes),
                secs(t.elapsed())
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("[image] failed after {}: {e:#}", secs(t.elapsed()));
            ExitCode::FAILURE
        }
    }
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

fn say(what: &str) {
    println!("[image] {what}");
}

/// Podman as the tests run it here (ENVIRONMENT.md: crun refuses the hybrid cgroups).
fn podman() -> Command {
    let mut cmd = Command::new("podman");
    cmd.args(["--runtime", RUNC, "--cgroup-manager=cgroupfs"]);
    cmd
}

pub fn build(arch: Arch) -> Result<Built> {
    ensure!(
        std::env::consts::ARCH == "x86_64",
        "cargo xtask image builds on x86_64 machines only (amd64 natively, arm64 cross)"
    );
    let outcome = setup::apt(arch.packages())?;
    say(&format!("packages: {outcome}"));
    let root = repo_root();
    if let Some(target) = arch.rust_target() {
        add_rust_target(target)?;
    }
    let version = agent_version(&root)?;
    let binary = build_agent(&root, arch)?;

    let dir = target_dir(&root).join("image").join(arch.name());
    let rootfs = dir.join("rootfs");
    if rootfs.exists() {
        fs::remove_dir_all(&rootfs).with_context(|| format!("removing {}", rootfs.display()))?;
    }
    let bin = rootfs.join("usr/bin/drainwatch");
    fs::create_dir_all(rootfs.join("lib"))?;
    fs::create_dir_all(bin.parent().unwrap_or(&rootfs))?;
    fs::copy(&binary, &bin).with_context(|| format!("copying {}", binary.display()))?;
    // The symbols are for debuggers, not for the agent (its eBPF object is embedded as data).
    run_quiet(Command::new(arch.strip()).arg(&bin))?;
    let libraries = copy_libraries(arch, &bin, &rootfs)?;
    say(&format!(
        "root: /usr/bin/drainwatch and {}",
        libraries.join(" ")
    ));
    if arch == Arch::Amd64 {
        check_against_ldd(&binary, &libraries)?;
    }
    check_version(arch, &rootfs, &version)?;

    let tag = arch.tag(&version);
    let old_id = capture(podman().args(["image", "inspect", "--format", "{{.Id}}", &tag]));
    let containerfile = root.join("deploy/Containerfile");
    run_quiet(
        podman()
            .args(["build", "--platform"])
            .arg(format!("linux/{}", arch.name()))
            .arg("--file")
            .arg(&containerfile)
            .args(["--tag", &tag])
            .arg("--label")
            .arg(format!("org.opencontainers.image.version={version}"))
            .args(["--label", "org.opencontainers.image.title=drainwatch"])
            .arg(&dir),
    )
    .context("podman build failed")?;
    let inspect = |format: &str| {
        capture(podman().args(["image", "inspect", "--format", format, &tag]))
            .map(|s| s.trim().to_owned())
            .ok_or_else(|| anyhow!("podman image inspect {tag} failed"))
    };
    let image_arch = inspect("{{.Architecture}}")?;
    ensure!(
        image_arch == arch.name(),
        "{tag} says it is for {image_arch}, not {}",
        arch.name()
    );
    let image_bytes: u64 = inspect("{{.Size}}")?.parse().context("image size")?;
    // A rebuild leaves the previous image untagged: remove it (unless a container uses it).
    if let Some(old) = old_id.map(|s| s.trim().to_owned())
        && old != inspect("{{.Id}}")?
    {
        let _ = run_quiet(podman().args(["rmi", &old]));
    }
    if arch == Arch::Amd64 {
        // The image itself, run as the tests and a node run it.
        let out = capture(podman().args([
            "run",
            "--rm",
            "--ulimit",
            "nofile=10000:10000",
            "--ulimit",
            "nproc=1000:1000",
            &tag,
            "--version",
        ]))
        .ok_or_else(|| anyhow!("`podman run {tag} --version` failed"))?;
        ensure!(
            out.trim() == format!("drainwatch {version}"),
            "`podman run {tag} --version` printed {out:?}"
        );
        say(&format!("podman run {tag} --version: {}", out.trim()));
    }

    let archive = target_dir(&root)
        .join("image")
        .join(format!("drainwatch-{version}-{}.oci.tar", arch.name()));
    let _ = fs::remove_file(&archive);
    run_quiet(
        podman()
            .args(["save", "--format", "oci-archive", "--output"])
            .arg(&archive)
            .arg(&tag),
    )?;
    let archive_bytes = fs::metadata(&archive)?.len();
    Ok(Built {
        tag,
        archive,
        image_bytes,
        archive_bytes,
        libraries,
    })
}

/// The agent crate's version, as cargo sees it (`…/agent#drainwatch@0.1.0`).
fn agent_version(root: &Path) -> Result<String> {
    let id = capture(cargo(root).args(["pkgid", "-p", "drainwatch"]))
        .ok_or_else(|| anyhow!("`cargo pkgid -p drainwatch` failed"))?;
    let version = id
        .trim()
        .rsplit(['@', '#'])
        .next()
        .filter(|v| v.starts_with(|c: char| c.is_ascii_digit()))
        .ok_or_else(|| anyhow!("no version in `cargo pkgid -p drainwatch`: {id}"))?;
    Ok(version.to_owned())
}

fn add_rust_target(target: &str) -> Result<()> {
    let installed = capture(Command::new("rustup").args(["target", "list", "--installed"]))
        .ok_or_else(|| anyhow!("`rustup target list --installed` failed"))?;
    if installed.lines().any(|l| l.trim() == target) {
        return Ok(());
    }
    say(&format!("rustup target add {target}"));
    run_cmd(Command::new("rustup").args(["target", "add", target]))
}

/// `cargo build --release -p drainwatch`, cross-linked for arm64; the binary's path.
fn build_agent(root: &Path, arch: Arch) -> Result<PathBuf> {
    let mut cmd = cargo(root);
    cmd.args(["build", "--release", "-p", "drainwatch"]);
    let out = match arch.rust_target() {
        None => target_dir(root).join("release/drainwatch"),
        Some(target) => {
            // Debian's cross gcc links, and compiles the C parts of dependencies (ring).
            cmd.args(["--target", target])
                .env(
                    "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER",
                    "aarch64-linux-gnu-gcc",
                )
                .env("CC_aarch64_unknown_linux_gnu", "aarch64-linux-gnu-gcc")
                .env("AR_aarch64_unknown_linux_gnu", "aarch64-linux-gnu-ar");
            target_dir(root).join(target).join("release/drainwatch")
        }
    };
    let t = Instant::now();
    run_cmd(&mut cmd).context("building the agent failed; cargo's output above says why")?;
    say(&format!("built {} in {}", out.display(), secs(t.elapsed())));
    Ok(out)
}

/// `readelf` lines of `file` (`-d` dynamic section, `-l` program headers).
fn readelf(flag: &str, file: &Path) -> Result<String> {
    capture(Command::new("readelf").args([flag, "--wide"]).arg(file))
        .ok_or_else(|| anyhow!("readelf {flag} {} failed", file.display()))
}

/// What follows `marker` up to `]` (after a `[`, if any) on each line that has it:
/// `(NEEDED)  Shared library: [libc.so.6]`, `[Requesting program interpreter: /lib64/ld.so]`.
fn bracketed(text: &str, marker: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.split_once(marker))
        .filter_map(|(_, rest)| {
            Some(
                rest.split_once(']')?
                    .0
                    .rsplit('[')
                    .next()?
                    .trim()
                    .to_owned(),
            )
        })
        .collect()
}

fn find_library(arch: Arch, soname: &str) -> Result<PathBuf> {
    arch.lib_dirs()
        .iter()
        .map(|d| Path::new(d).join(soname))
        .find(|p| p.exists())
        .ok_or_else(|| anyhow!("{soname} is in none of {:?}", arch.lib_dirs()))
}

/// Copies the dynamic loader (at the path the binary names) and every library it needs, and
/// those they need, into `rootfs/lib` (a directory the loader searches by default). Returns the
/// sonames, sorted.
fn copy_libraries(arch: Arch, bin: &Path, rootfs: &Path) -> Result<Vec<String>> {
    let interp = bracketed(&readelf("-l", bin)?, "Requesting program interpreter:");
    let [interp] = interp.as_slice() else {
        bail!("{} names no single program interpreter", bin.display());
    };
    let interp_name = Path::new(interp)
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| anyhow!("odd interpreter path {interp}"))?;
    let to = rootfs.join(interp.trim_start_matches('/'));
    fs::create_dir_all(to.parent().unwrap_or(rootfs))?;
    fs::copy(find_library(arch, interp_name)?, &to)
        .with_context(|| format!("copying the loader {interp}"))?;

    let mut done = BTreeSet::from([interp_name.to_owned()]);
    let mut todo = bracketed(&readelf("-d", bin)?, "(NEEDED)");
    while let Some(soname) = todo.pop() {
        if !done.insert(soname.clone()) {
            continue;
        }
        // Copy the file a symlink points to, under the soname.
        let from = fs::canonicalize(find_library(arch, &soname)?)?;
        let to = rootfs.join("lib").join(&soname);
        fs::copy(&from, &to).with_context(|| format!("copying {}", from.display()))?;
        todo.extend(bracketed(&readelf("-d", &to)?, "(NEEDED)"));
    }
    Ok(done.into_iter().collect())
}

/// On amd64 the host's `ldd` can load the binary: its list must be ours.
fn check_against_ldd(binary: &Path, libraries: &[String]) -> Result<()> {
    let out = capture(Command::new("ldd").arg(binary)).ok_or_else(|| anyhow!("ldd failed"))?;
    let from_ldd: BTreeSet<String> = out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| !n.starts_with("linux-vdso"))
        .filter_map(|n| Path::new(n).file_name()?.to_str().map(str::to_owned))
        .collect();
    let ours: BTreeSet<String> = libraries.iter().cloned().collect();
    ensure!(
        from_ldd == ours,
        "ldd lists {from_ldd:?}, the ELF walk found {ours:?}"
    );
    Ok(())
}

/// Runs the root's binary with only the root's libraries: natively through its own loader
/// (chroot), for arm64 under qemu-user with the root as its library prefix.
fn check_version(arch: Arch, rootfs: &Path, version: &str) -> Result<()> {
    let (mut cmd, how) = match arch {
        Arch::Amd64 => {
            let mut c = Command::new("chroot");
            c.arg(rootfs).arg("/usr/bin/drainwatch");
            (c, "chroot")
        }
        Arch::Arm64 => {
            let mut c = Command::new("qemu-aarch64");
            c.arg("-L")
                .arg(rootfs)
                .arg(rootfs.join("usr/bin/drainwatch"));
            (c, "qemu-aarch64 -L <root>")
        }
    };
    let out = capture(cmd.arg("--version"))
        .ok_or_else(|| anyhow!("`{how} drainwatch --version` failed"))?;
    ensure!(
        out.trim() == format!("drainwatch {version}"),
        "`{how} drainwatch --version` printed {out:?}"
    );
    say(&format!("{how} drainwatch --version: {}", out.trim()));
    Ok(())
}
