//! Debian's cloud kernels, downloaded once into `target/kernels/<package>/` with a private apt
//! state (its own sources list, package lists and cache: the machine's apt sources are not
//! touched) and unpacked with `dpkg-deb -x`. A kernel already unpacked is used as it is.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use super::Kernel;
use crate::{capture, run_quiet};

/// The suites the matrix takes kernels from: bullseye (5.10), bookworm (6.1), trixie (6.12).
const SOURCES: &str = "\
deb http://deb.debian.org/debian bullseye main
deb http://deb.debian.org/debian-security bullseye-security main
deb http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian-security bookworm-security main
deb http://deb.debian.org/debian trixie main
deb http://deb.debian.org/debian-security trixie-security main
";

/// An unpacked kernel: its image (its build configuration lies beside it, as `config`).
pub struct Unpacked {
    pub package: String,
    pub vmlinuz: PathBuf,
}

/// apt with the matrix's own state under `dir`.
fn apt(dir: &Path, tool: &str) -> Command {
    let mut c = Command::new(tool);
    for (k, v) in [
        ("Dir::Etc::sourcelist", dir.join("sources.list")),
        ("Dir::Etc::sourceparts", PathBuf::from("-")),
        ("Dir::State::Lists", dir.join("lists")),
        ("Dir::Cache", dir.join("cache")),
    ] {
        c.arg("-o").arg(format!("{k}={}", v.display()));
    }
    // Downloads land in a root-owned directory: no privilege drop to _apt.
    c.args(["-o", "APT::Sandbox::User=root", "-q"]);
    c
}

/// The package for `k`: its pinned name when the archive still has it, else the newest of
/// the same series (archives drop superseded ABIs in time).
fn resolve(dir: &Path, k: &Kernel) -> Result<String> {
    let listed = capture(apt(dir, "apt-cache").args(["pkgnames", "linux-image-"]))
        .context("apt-cache pkgnames failed")?;
    let mut candidates: Vec<&str> = listed
        .lines()
        .map(str::trim)
        .filter(|p| (k.matches)(p))
        .collect();
    if candidates.contains(&k.package) {
        return Ok(k.package.to_string());
    }
    candidates.sort_by_key(|p| version_key(p));
    match candidates.last() {
        Some(newest) => {
            eprintln!(
                "[kernels] {} is no longer in the archive: using {newest} (update the pin in xtask/src/kernels/mod.rs)",
                k.package
            );
            Ok((*newest).to_string())
        }
        None => bail!("the archive has no {} kernel package", k.series),
    }
}

/// Numbers in a package name, in order, for "newest" (`6.12.118+deb13` after `6.12.96+deb13`).
fn version_key(p: &str) -> Vec<u64> {
    p.split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// The unpacked kernel of `k`, downloading it first if no kernel of its series is cached.
pub fn kernel(root: &Path, k: &Kernel) -> Result<Unpacked> {
    if let Some(u) = cached(root, k)? {
        return Ok(u);
    }
    let dir = root.join("apt");
    for sub in ["lists/partial", "cache/archives/partial", "debs"] {
        fs::create_dir_all(dir.join(sub)).with_context(|| format!("creating {}", dir.display()))?;
    }
    fs::write(dir.join("sources.list"), SOURCES)?;
    // Once per run, for the first kernel not cached.
    static UPDATED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !UPDATED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        eprintln!(
            "[kernels] apt-get update (private lists in {})",
            dir.display()
        );
        run_quiet(apt(&dir, "apt-get").arg("update"))?;
    }
    let package = resolve(&dir, k)?;
    eprintln!("[kernels] downloading {package}");
    run_quiet(
        apt(&dir, "apt-get")
            .args(["download", &package])
            .current_dir(dir.join("debs")),
    )?;
    let deb = fs::read_dir(dir.join("debs"))?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&format!("{package}_")))
        })
        .with_context(|| format!("apt-get download left no {package}_*.deb"))?;
    let out = root.join(&package);
    let partial = root.join(format!("{package}.partial"));
    let _ = fs::remove_dir_all(&partial);
    run_quiet(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&partial))?;
    // Only the image and its configuration are kept: the modules are not needed (every
    // driver the matrix uses is built in: serial console, initramfs, loopback).
    let release = package.trim_start_matches("linux-image-");
    fs::create_dir_all(&out)?;
    for name in ["vmlinuz", "config"] {
        fs::rename(
            partial.join(format!("boot/{name}-{release}")),
            out.join(name),
        )
        .with_context(|| format!("{package} has no /boot/{name}-{release}"))?;
    }
    fs::remove_dir_all(&partial)?;
    fs::remove_file(&deb)?;
    cached(root, k)?.with_context(|| format!("{package} unpacked but not found"))
}

/// A kernel of `k`'s series already unpacked under `root`.
fn cached(root: &Path, k: &Kernel) -> Result<Option<Unpacked>> {
    if !root.is_dir() {
        return Ok(None);
    }
    let mut found: Vec<String> = fs::read_dir(root)?
        .flatten()
        .filter(|e| e.path().join("vmlinuz").is_file() && e.path().join("config").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| (k.matches)(n))
        .collect();
    // The pinned one if present, else the newest.
    found.sort_by_key(|p| (p == k.package, version_key(p)));
    Ok(found.pop().map(|package| Unpacked {
        vmlinuz: root.join(&package).join("vmlinuz"),
        package,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newest_compares_numbers_not_text() {
        let mut v = [
            "linux-image-6.12.96+deb13-cloud-amd64",
            "linux-image-6.12.118+deb13-cloud-amd64",
            "linux-image-6.12.100+deb13-cloud-amd64",
        ];
        v.sort_by_key(|p| version_key(p));
        assert_eq!(v.last(), Some(&"linux-image-6.12.118+deb13-cloud-amd64"));
    }
}
