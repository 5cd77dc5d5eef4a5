//! Builds the eBPF programs (agent-ebpf) with the nightly toolchain, so the object can be embedded
//! in the binary. `cargo xtask setup` installs what this needs.
//!
//! This is what aya-build 0.2 does, with two differences. aya-build forwards the nested cargo's
//! whole output as `cargo:warning=` lines (some forty `Compiling ...` warnings on a fresh
//! build); here it runs with `--quiet` and only what rustc said (warnings, errors) is shown. And
//! aya-build builds into this script's OUT_DIR, whose name changes with the profile and with
//! this script's own build (its dependencies' features, the toolchain), and each new one rebuilt
//! core and the programs from scratch (about a minute); here the eBPF
//! crate has one target dir per architecture, `<target>/bpf/<arch>` (`bpf_target_arch` differs),
//! shared by every agent build and by the eBPF clippy run of `cargo xtask test`, which passes
//! the same flags.

use std::{
    env,
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, anyhow, bail};

fn main() {
    // Not `main() -> Result`: that would print a backtrace under RUST_BACKTRACE.
    if let Err(e) = build() {
        eprintln!("{e:#}");
        std::process::exit(1);
    }
}

fn build() -> anyhow::Result<()> {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?);
    let root = manifest
        .parent()
        .ok_or_else(|| anyhow!("agent/ has no parent"))?;
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").context("OUT_DIR")?);
    println!(
        "cargo:rerun-if-changed={}",
        root.join("agent-ebpf").display()
    );
    println!(
        "cargo:rerun-if-changed={}",
        root.join("common/src").display()
    );

    let endian = env::var("CARGO_CFG_TARGET_ENDIAN").context("CARGO_CFG_TARGET_ENDIAN")?;
    let target = if endian == "big" {
        "bpfeb-unknown-none"
    } else {
        "bpfel-unknown-none"
    };
    let arch = env::var("CARGO_CFG_TARGET_ARCH").context("CARGO_CFG_TARGET_ARCH")?;
    let target_dir = bpf_target_dir(&out_dir).join(&arch);

    let mut cargo = Command::new("rustup");
    cargo
        .args(["run", "nightly", "cargo", "build", "--quiet", "--release"])
        .args(["--package", "drainwatch-ebpf", "--bins", "--target", target])
        .args(["-Z", "build-std=core", "--target-dir"])
        .arg(&target_dir)
        .current_dir(root)
        .env("CARGO_ENCODED_RUSTFLAGS", rustflags(&arch));
    // What cargo sets for this script is not for the nested build: aya-ebpf's build scripts rerun
    // when HOST changes (then aya-ebpf, the programs and this agent are rebuilt), and the outer
    // compiler (clippy-driver under `cargo clippy`) is not the nightly's. The nested build sees
    // the environment `cargo xtask test`'s eBPF clippy run sees.
    for (key, _) in env::vars_os() {
        let key = key.to_string_lossy();
        if matches!(
            &*key,
            "HOST"
                | "TARGET"
                | "OUT_DIR"
                | "PROFILE"
                | "OPT_LEVEL"
                | "DEBUG"
                | "NUM_JOBS"
                | "RUSTC"
                | "RUSTDOC"
                | "RUSTC_LINKER"
                | "RUSTC_WORKSPACE_WRAPPER"
        ) || [
            "CARGO_CFG_",
            "CARGO_FEATURE_",
            "CARGO_PKG_",
            "CARGO_MANIFEST_",
        ]
        .iter()
        .any(|p| key.starts_with(p))
        {
            cargo.env_remove(&*key);
        }
    }
    let out = cargo.output().with_context(|| {
        format!(
            "could not start `{}` (`cargo xtask setup --for run` installs the nightly)",
            shown(&cargo)
        )
    })?;
    // With --quiet, cargo's stderr is only what rustc and build scripts said.
    let said = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        // cargo shows a failed build script's stderr in full.
        eprintln!("{said}");
        bail!(
            "building the eBPF programs failed ({}): {}",
            out.status,
            shown(&cargo)
        );
    }
    for line in said.trim_end().lines() {
        println!("cargo:warning={line}");
    }
    let object = target_dir.join(target).join("release/drainwatch");
    fs::copy(&object, out_dir.join("drainwatch"))
        .with_context(|| format!("copying {}", object.display()))?;
    Ok(())
}

/// `--cfg bpf_target_arch` for aya-ebpf, BTF from bpf-linker; `\x1f` separates them. The eBPF
/// clippy run of xtask/src/test.rs passes the same.
fn rustflags(arch: &str) -> OsString {
    let arch = if arch.starts_with("riscv64") {
        "riscv64"
    } else {
        arch
    };
    format!("--cfg=bpf_target_arch=\"{arch}\"\x1f-Cdebuginfo=2\x1f-Clink-arg=--btf").into()
}

/// `<target>/bpf`: OUT_DIR is `<target>[/<triple>]/<profile>/build/drainwatch-<hash>/out`. Under
/// a layout this does not know, OUT_DIR itself.
fn bpf_target_dir(out_dir: &Path) -> PathBuf {
    let mut up = out_dir.ancestors();
    let (Some(build), Some(profile_dir)) = (up.nth(2), up.next()) else {
        return out_dir.join("bpf");
    };
    let Some(mut target_dir) = profile_dir.parent().filter(|_| build.ends_with("build")) else {
        return out_dir.join("bpf");
    };
    if env::var_os("TARGET").is_some_and(|t| target_dir.file_name() == Some(&t)) {
        target_dir = target_dir.parent().unwrap_or(target_dir);
    }
    target_dir.join("bpf")
}

/// The command as typed, without its environment.
fn shown(cmd: &Command) -> String {
    let args = cmd.get_args().map(|a| a.to_string_lossy());
    std::iter::once(cmd.get_program().to_string_lossy())
        .chain(args)
        .collect::<Vec<_>>()
        .join(" ")
}
