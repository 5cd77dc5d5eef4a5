//! `cargo xtask test`: every test phase in order, one summary line each.

use std::{
    ffi::OsString,
    path::Path,
    process::{Command, ExitCode},
    time::{Duration, Instant},
};

use clap::Args;

use crate::{cargo, exit_code, repo_root, secs, setup, show, target_dir, without_run_env};

#[derive(Args)]
pub struct TestArgs {
    /// Skip `cargo xtask setup` (when the machine is known to be set up)
    #[arg(long)]
    no_setup: bool,
    /// Arguments for the test binaries of both test phases, after `--` (e.g. a name filter)
    #[arg(last = true, value_name = "TEST_ARGS")]
    test_args: Vec<OsString>,
}

/// How one phase of `cargo xtask test` ended.
pub enum Phase {
    Passed(Duration),
    Failed(Duration, Option<i32>),
    Skipped(&'static str),
}

pub fn run(args: &TestArgs) -> ExitCode {
    if !args.no_setup && setup::run().is_err() {
        return ExitCode::FAILURE;
    }
    let root = repo_root();

    // Lints are policy: formatting and clippy (warnings are errors) before anything runs.
    let mut fmt = cargo(&root);
    fmt.args(["fmt", "--all", "--check"]);
    let mut clippy = cargo(&root);
    clippy
        .args(["clippy", "--workspace", "--all-targets"])
        .args(["--exclude", "drainwatch-ebpf", "--", "-D", "warnings"]);
    let mut clippy_ebpf = clippy_ebpf(&root);
    let mut build = cargo(&root);
    build.args(["build", "--release", "-p", "drainwatch"]);
    let mut unit = cargo(&root);
    // The eBPF crate builds only for the BPF target. The privileged crate runs, lib tests included,
    // in the serialized integration phase: it must not also run here, in parallel.
    unit.args(["test", "--workspace", "--lib", "--bins"]).args([
        "--exclude",
        "drainwatch-ebpf",
        "--exclude",
        "drainwatch-tests",
    ]);
    if !args.test_args.is_empty() {
        unit.arg("--").args(&args.test_args);
    }
    let mut integration = cargo(&root);
    integration
        .args(["test", "-p", "drainwatch-tests", "--", "--test-threads=1"])
        .args(&args.test_args);
    // The kernel matrix: the kernel-facing checks inside 5.10, 6.1 and 6.12 (QEMU) and on this
    // kernel; the README's table is written only by `cargo xtask kernels` itself.
    let mut kernels = cargo(&root);
    kernels.args(["xtask", "kernels", "--no-setup", "--no-readme"]);
    if let Some(filter) = args.test_args.first() {
        kernels.arg("--filter").arg(filter);
    }
    // The benchmark is not a test, but a short run of every step keeps it from rotting.
    let mut bench = cargo(&root);
    bench.args(["xtask", "bench", "--no-setup", "--smoke"]);
    // Every parser of outside input under libFuzzer for a few seconds: a crash fails the run.
    let mut fuzz = cargo(&root);
    fuzz.args(["xtask", "fuzz", "--smoke"]);

    let mut results: Vec<(&str, Phase)> = vec![
        ("fmt", phase("fmt", &mut fmt)),
        ("clippy", phase("clippy", &mut clippy)),
        ("clippy-ebpf", phase("clippy-ebpf", &mut clippy_ebpf)),
        ("build", phase("build", &mut build)),
    ];
    let build_ok = results.iter().all(|(_, r)| matches!(r, Phase::Passed(_)));
    for (name, cmd) in [
        ("unit", &mut unit),
        ("integration", &mut integration),
        ("kernels", &mut kernels),
        ("bench-smoke", &mut bench),
        ("fuzz-smoke", &mut fuzz),
    ] {
        let result = if build_ok {
            phase(name, cmd)
        } else {
            Phase::Skipped("lints or the build failed")
        };
        results.push((name, result));
    }

    let mut code = None;
    for (name, result) in &results {
        match result {
            Phase::Passed(d) => println!("[test] {name:<12} passed ({})", secs(*d)),
            Phase::Failed(d, c) => {
                let how = c.map_or("killed by a signal".to_owned(), |c| format!("exit {c}"));
                println!("[test] {name:<12} FAILED: {how} ({})", secs(*d));
                code = code.or(Some(exit_code(*c)));
            }
            Phase::Skipped(why) => println!("[test] {name:<12} skipped: {why}"),
        }
    }
    code.unwrap_or(ExitCode::SUCCESS)
}

/// Clippy on the eBPF crate as agent/build.rs builds it: the nightly, the BPF target, core built
/// from source, the same flags and target dir (`target/bpf/<arch>`: its dependencies are
/// checked once, and the build's are left alone).
fn clippy_ebpf(root: &Path) -> Command {
    let arch = std::env::consts::ARCH;
    let arch = if arch.starts_with("riscv64") {
        "riscv64"
    } else {
        arch
    };
    let mut cmd = Command::new("rustup");
    without_run_env(&mut cmd);
    cmd.current_dir(root)
        .args(["run", "nightly", "cargo", "clippy", "--release"])
        .args(["-p", "drainwatch-ebpf", "--target", "bpfel-unknown-none"])
        .args(["-Z", "build-std=core", "--target-dir"])
        .arg(target_dir(root).join("bpf").join(arch))
        .args(["--", "-D", "warnings"])
        // As agent/build.rs's nested build (HOST would rerun aya-ebpf's build scripts).
        .env_remove("HOST")
        .env_remove("TARGET")
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env(
            "RUSTFLAGS",
            format!("--cfg=bpf_target_arch=\"{arch}\" -Cdebuginfo=2 -Clink-arg=--btf"),
        );
    cmd
}

pub fn phase(name: &str, cmd: &mut Command) -> Phase {
    println!("[test] {name}: {}", show(cmd));
    let t = Instant::now();
    match cmd.status() {
        Ok(s) if s.success() => Phase::Passed(t.elapsed()),
        Ok(s) => Phase::Failed(t.elapsed(), s.code()),
        Err(e) => {
            eprintln!("[test] {name}: could not start: {e}");
            Phase::Failed(t.elapsed(), None)
        }
    }
}
