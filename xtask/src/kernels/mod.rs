//! `cargo xtask kernels`: the kernel matrix. Downloads (once) each kernel of the matrix from
//! Debian's archive, boots it under QEMU with an initramfs holding the agent and the
//! `kernel-matrix` runner (`tests/src/matrix/`), and runs the runner on this machine's own
//! kernel too; prints one markdown row per kernel and writes the README's kernel table.
//!
//! Why an initramfs and not a disk or 9p: the runner and the agent need nothing but their
//! libraries, busybox and the kernel's own filesystems, every driver involved is built into
//! the cloud kernels (no module to match each kernel), and one archive serves all of them.

mod cpio;
mod fetch;
mod initramfs;
mod run;
mod table;

use std::{
    path::Path,
    process::ExitCode,
    time::{Duration, Instant},
};

use clap::Args;

use crate::{
    cargo, repo_root, secs, setup, target_dir,
    test::{Phase, phase},
};

/// One kernel of the matrix: the Debian package pinned, and which nodes run its series.
pub struct Kernel {
    pub series: &'static str,
    pub package: &'static str,
    /// Packages of the same series (a newer one is used if the pinned one left the archive).
    pub matches: fn(&str) -> bool,
    pub nodes: &'static str,
}

fn cloud(p: &str, prefix: &str) -> bool {
    p.starts_with(prefix) && p.ends_with("-cloud-amd64") && !p.contains("-dbg")
}

pub const MATRIX: &[Kernel] = &[
    Kernel {
        series: "5.10",
        package: "linux-image-5.10.0-46-cloud-amd64",
        matches: |p| cloud(p, "linux-image-5.10.0-"),
        nodes: "Amazon Linux 2, Debian 11",
    },
    Kernel {
        series: "6.1",
        package: "linux-image-6.1.0-57-cloud-amd64",
        // Not the bullseye backports (`6.1.0-0.deb11.N`): bookworm's own.
        matches: |p| cloud(p, "linux-image-6.1.0-") && !p.contains("deb11"),
        nodes: "Amazon Linux 2023, GKE COS, Debian 12",
    },
    Kernel {
        series: "6.12",
        package: "linux-image-6.12.118+deb13-cloud-amd64",
        matches: |p| cloud(p, "linux-image-6.12.") && p.contains("+deb13-"),
        nodes: "Debian 13",
    },
];

/// A whole run of a kernel stays under this (TCG; the slowest kernel takes about a minute).
const TIMEOUT: Duration = Duration::from_secs(420);

#[derive(Args)]
pub struct KernelsArgs {
    /// Skip `cargo xtask setup` (when the machine is known to be set up)
    #[arg(long)]
    no_setup: bool,
    /// Only these kernel series (5.10, 6.1, 6.12, host); all when not given
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Do not write the README's kernel table
    #[arg(long)]
    no_readme: bool,
    /// Only the runner's checks whose names contain this (e.g. `abort`)
    #[arg(long)]
    filter: Option<String>,
}

pub fn run(args: &KernelsArgs) -> ExitCode {
    if !args.no_setup && setup::run().is_err() {
        return ExitCode::FAILURE;
    }
    let t = Instant::now();
    let root = repo_root();
    // Two builds, not one: built together with drainwatch-tests, the agent's dependencies
    // (hyper, tower) take the tests' features and the agent is rebuilt, then rebuilt again by the
    // next `cargo xtask run` (70 s). Alone, it is the one every other command builds.
    for what in [
        &["drainwatch"][..],
        &["drainwatch-tests", "--bin", "kernel-matrix"],
    ] {
        let mut build = cargo(&root);
        build.args(["build", "--release", "-p"]).args(what);
        if !matches!(phase("build", &mut build), Phase::Passed(_)) {
            return ExitCode::FAILURE;
        }
    }
    match matrix(args, &root) {
        Ok(rows) => {
            let failed = rows.iter().filter(|r| !r.ok()).count();
            println!(
                "[kernels] {} kernels, {failed} failed, in {}",
                rows.len(),
                secs(t.elapsed())
            );
            if failed == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("[kernels] failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn wanted(args: &KernelsArgs, series: &str) -> bool {
    args.only.is_empty() || args.only.iter().any(|o| o == series)
}

fn matrix(args: &KernelsArgs, root: &Path) -> anyhow::Result<Vec<run::Row>> {
    let target = target_dir(root);
    let (agent, runner) = (
        target.join("release/drainwatch"),
        target.join("release/kernel-matrix"),
    );
    let dir = target.join("kernels");
    std::fs::create_dir_all(dir.join("logs"))?;
    let mut kernels = Vec::new();
    for k in MATRIX.iter().filter(|k| wanted(args, k.series)) {
        kernels.push((k, fetch::kernel(&dir, k)?));
    }
    let image = dir.join("initramfs.cpio");
    let bytes = initramfs::build(&agent, &runner, Path::new("/bin/busybox"), &image)?;
    println!(
        "[kernels] initramfs {} ({:.1} MiB)",
        image.display(),
        bytes as f64 / (1 << 20) as f64
    );
    println!("{}", table::HEADER);
    let filter = args.filter.as_deref();
    let mut rows = Vec::new();
    if wanted(args, "host") {
        let row = run::host(&runner, &agent, filter, TIMEOUT)?;
        println!("{}", table::row(&row));
        rows.push(row);
    }
    for (k, unpacked) in kernels {
        let log = dir.join("logs").join(format!("{}.log", unpacked.package));
        let mut row = run::qemu(&unpacked.vmlinuz, &image, filter, TIMEOUT, &log, k.series)?;
        row.source = format!("`{}` under QEMU", unpacked.package);
        row.nodes = k.nodes.to_string();
        println!("{}", table::row(&row));
        rows.push(row);
    }
    for r in rows.iter().filter(|r| !r.ok()) {
        println!(
            "[kernels] {} FAILED: {}{}",
            r.release,
            r.failed.join(", "),
            r.broken.as_deref().unwrap_or("")
        );
    }
    for r in &rows {
        println!(
            "[kernels] {}: {:.0} s (programs of the natural plan loaded in {})",
            r.release,
            r.seconds,
            r.load_seconds
                .map_or("?".to_string(), |s| format!("{s:.1} s"))
        );
    }
    for r in &rows {
        let n = |v: Option<u32>| v.map_or("-".to_string(), |v| v.to_string());
        let sizes: Vec<String> = r
            .programs
            .iter()
            .map(|(name, (x, v))| format!("{name} {}/{}", n(*x), n(*v)))
            .collect();
        println!(
            "[kernels] {}: instructions (translated/verified, - where the kernel does not say): {}",
            r.release,
            sizes.join(", ")
        );
    }
    let complete = filter.is_none() && args.only.is_empty();
    if !args.no_readme && complete {
        table::write_readme(&root.join("README.md"), &rows)?;
        println!("[kernels] wrote the kernel table in README.md");
    }
    Ok(rows)
}
