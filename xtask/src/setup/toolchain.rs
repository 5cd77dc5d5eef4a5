//! The Rust toolchain steps: the nightly the eBPF crate builds with (pinned, named `nightly`),
//! its rust-src, and bpf-linker built against the matching LLVM.

use std::{
    env, fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, anyhow, bail, ensure};

use super::say;
use crate::{capture, run_cmd};

/// The nightly aya-build compiles the eBPF crate with (`rustup run nightly ...`). Its LLVM must
/// not be newer than bpf-linker's (22): nightlies from 1.99 on are LLVM 23 and fail to link
/// ("Invalid record"). This dated nightly is rustc 1.97.0-nightly (e50aa6fba 2026-05-19), LLVM
/// 22.1.4: the one the verified machines have.
const PINNED_NIGHTLY: &str = "nightly-2026-05-20";
const EBPF_LLVM_MAJOR: u32 = 22;

const BPF_LINKER_VERSION: &str = "0.13.0";
/// Without it bpf-linker's build finds /usr/bin/llvm-config (LLVM 14) and fails to link -lLLVM.
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

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
pub(super) fn nightly() -> Result<String> {
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

/// A component of the nightly: rust-src (for `-Z build-std=core`) or clippy (the eBPF crate's
/// lint run in `cargo xtask test`; the pinned nightly is installed with the minimal profile).
pub(super) fn nightly_component(component: &str, what_for: &str) -> Result<String> {
    let installed =
        capture(rustup().args(["component", "list", "--toolchain", "nightly", "--installed"]))
            .context("`rustup component list --toolchain nightly --installed` failed")?;
    if installed.lines().any(|l| l.trim().starts_with(component)) {
        return Ok("present on nightly".into());
    }
    say(
        component,
        &format!("adding {component} to nightly ({what_for})"),
    );
    run_cmd(rustup().args(["component", "add", component, "--toolchain", "nightly"]))
        .with_context(|| format!("rustup could not add {component} to the nightly toolchain"))?;
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

pub(super) fn bpf_linker() -> Result<String> {
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
