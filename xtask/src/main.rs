//! `cargo xtask`: the one entry point for setting up a machine, running the agent and testing it.
//!
//! Everything here shells out with `std::process::Command`; nothing is clever on purpose.

mod bench;
mod fuzz;
mod image;
mod kernels;
mod lab;
mod setup;
mod soak;
mod sudo;
mod test;

use std::{
    env,
    ffi::{OsStr, OsString},
    fmt::Write as _,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, ExitCode, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "Set up a machine for drainwatch, run the agent, run its tests",
    long_about = "Set up a machine for drainwatch, run the agent, run its tests.\n\n\
        All commands need root (they install packages, mount tracefs, load eBPF programs); \
        when not root they re-run themselves through `sudo -E` if sudo exists."
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what this machine lacks to build, run and test drainwatch (idempotent)
    #[command(
        long_about = "Install what this machine lacks to build, run and test drainwatch.\n\n\
        Made for a fresh Debian 12 machine with rustup's stable toolchain, run as root. \
        Each step checks first and only installs what is missing, so a second run installs \
        nothing and takes a few seconds. Steps: mount tracefs if needed; apt packages (LLVM 22 \
        for bpf-linker, podman + runc for test containers, nginx, haproxy, prometheus, \
        bpftool, bpftrace, chromium, ...); the busybox image localhost/bb:latest and a podman \
        smoke test; an LLVM 22 `nightly` Rust toolchain with rust-src (for the eBPF build); \
        bpf-linker 0.13.0 built against LLVM 22; Python test packages (none yet); the deploy tests' tools (kubernetes-validate, helm-python-sdk) in /opt/drainwatch-tools/venv.\n\n\
        `--for run` installs only what building and running the agent needs (tracefs, \
        LLVM 22, the nightly toolchain, bpf-linker): what `cargo xtask run` does.\n\n\
        Progress lines start with `[setup]`. On failure it prints one sentence saying what \
        failed and exits non-zero."
    )]
    Setup(SetupArgs),
    /// Build the agent in release mode and run it as root
    #[command(long_about = "Build the agent in release mode and run it as root.\n\n\
        Runs `cargo xtask setup --for run` first (unless --no-setup: only what building and \
        running needs, no test lab), then \
        `cargo build --release -p drainwatch`, then replaces itself with \
        `target/release/drainwatch AGENT_ARGS...`. Without arguments the agent uses its own \
        defaults (metrics on 127.0.0.1:9464).\n\n\
        Example: cargo xtask run --no-setup -- --help")]
    Run(RunArgs),
    /// Build, then run the unit tests and the privileged integration tests
    #[command(
        long_about = "Build, then run the unit tests and the privileged integration tests.\n\n\
        Phases: (1) `cargo build --release -p drainwatch`, so the integration tests can spawn \
        target/release/drainwatch; (2) unit tests: \
        `cargo test --workspace --lib --bins --exclude drainwatch-ebpf --exclude drainwatch-tests`; \
        (3) integration tests \
        (real eBPF, real containers): `cargo test -p drainwatch-tests -- --test-threads=1`; \
        (4) `cargo xtask kernels --no-readme`, the kernel matrix (5.10, 6.1, 6.12 under QEMU, \
        and this kernel: about a minute with the kernels cached and the runner built, about \
        three on a fresh machine); \
        (5) `cargo xtask bench --smoke`, a seconds-long run of every benchmark step; \
        (6) `cargo xtask fuzz --smoke`, every fuzz target for 8 seconds. \
        Runs `cargo xtask setup` first unless --no-setup. If the build fails the tests are \
        skipped; otherwise both test phases run. Prints one summary line per phase and exits \
        with the first failing phase's exit code.\n\n\
        Example: cargo xtask test --no-setup -- reset"
    )]
    Test(test::TestArgs),
    /// See drainwatch work: every deploy failure mode end to end, then the deploy page
    #[command(long_about = "See drainwatch work before installing it anywhere.\n\n\
        Runs `cargo xtask setup` first (unless --no-setup), builds the agent and the demo \
        (`cargo build --release -p drainwatch` and `-p drainwatch-tests --bin demo`), then runs \
        every deploy-time failure mode end to end on this machine: real podman containers behind \
        HAProxy (health checks) and nginx (retries), the real agent watching. After each step it \
        prints what the clients got, what drainwatch recorded and its verdict; at the end the \
        `drainwatch report`, then it keeps the agent up with its deploy page \
        (http://127.0.0.1:9464/ unless that port is taken) until Ctrl-C.\n\n\
        Demo flags after `--`: --port N, --screenshot PATH (PNG of the page, headless \
        Chromium), --no-wait (exit after the report).\n\n\
        Example: cargo xtask demo -- --screenshot docs/deploy-page.png")]
    Demo(lab::DemoArgs),
    /// Measure the agent's overhead against baselines of the same run; write BENCHMARKS.md
    #[command(
        long_about = "Measure the agent's overhead against baselines of the same run.\n\n\
        Builds the agent and the workloads of bench/ in release mode, then measures: loopback \
        connection churn with nothing attached, with the agent, and with a minimal bpftrace \
        tracer on the same tracepoints (interleaved rounds, medians); each program's kernel \
        run time per event (kernel.bpf_stats_enabled, restored after); the userspace \
        pipeline's events/s on one core against decoding alone, and its loss through the \
        queue at 200,000 events/s and at twice its capacity; the agent's CPU and RSS at rest \
        and under churn, and the pipeline's memory for 1,000 containers and 100,000 \
        connections. Prints a markdown table with the budget of each figure and writes it to \
        BENCHMARKS.md. Takes about two minutes; --smoke runs every step briefly (seconds) \
        and writes nothing, which `cargo xtask test` does so the benchmark cannot rot.\n\n\
        Example: cargo xtask bench --no-setup"
    )]
    Bench(BenchArgs),
    /// Run the retry, stop, storm, stream, Socket.IO and keep-alive labs over randomized shapes; compare every record field
    /// with ground truth
    #[command(
        long_about = "Run the retry, stop, storm, stream, Socket.IO and keep-alive labs over randomized shapes against ground truth.\n\n\
        Builds the agent (`cargo build --release -p drainwatch`), then runs the privileged test \
        `tests/tests/accuracy.rs` for seeds FIRST..FIRST+N-1 of each lab chosen \
        (DRAINWATCH_ACCURACY_SEEDS). A retry seed draws a proxy setup (nginx with or without \
        retries, pooled or not, GET or POST; HAProxy with retries 0, or L7 retries with \
        redispatch), a request interval, duration and size, the stop's moment, HAProxy's check \
        interval and fall. A stop seed draws the backend's behaviour on the stop (every mode, \
        grace, drain delay, a request outliving the grace), the load's waves and the stop's \
        place among them and among HAProxy's checks. A storm seed draws the fleet, the \
        service's capacity, the reconnect jitter and rolling or in-place. A streams seed draws \
        the clients holding server-sent-event streams, the longest stream lifetime and how \
        lifetimes vary below it (fixed, 0.8-1.0 or 0.2-1.0 of it), the event period, a stop \
        after a warm-up or 2 s after the fleet started, a drain that lets streams run to their \
        own deadlines or ends them all at once, and a grace period below or above the longest \
        lifetime. A socketio seed runs a real \
        Socket.IO server (socket.io 4.8, no SIGTERM handler, an authorising middleware: a pool \
        or a synchronous hash) and a fleet of socket.io-client 4.8 clients (500-1,500, \
        websocket-only or default transports), the server replaced at the same address; seeds \
        1-6 are issue 41's setups. A keepalive seed draws keep-alive clients (5-30, plain \
        or Node's http.Agent pool, their pause and work) and a server that closes its idle \
        connections at SIGTERM, answers `Connection: close` for 1 s first, or never closes \
        them (SIGKILL at a 2-4 s grace). A gone seed (lab `gone`, not in \
        the default list) draws a retry shape through nginx where some clients give up around \
        the stop, nginx's `proxy_ignore_client_abort` on or off: a cut whose client is gone \
        gets no answer, and must still never match a later request as its retry. --load N \
        keeps N threads spinning meanwhile (a busy node: proxies' workers wait for a CPU); \
        --agent-arg passes an option to every agent, for an A/B run. Each runs with the \
        real agent; every record field is compared with the proxies', backends' and clients' \
        own logs and counts and the kernel's counters. Prints each seed's shape and \
        mismatches, then per-field exactness; exits non-zero on any mismatch. About 15 s a \
        retry seed, 25 s a stop seed, 30 s a storm seed, 15 s a streams seed, 25 s a socketio seed, 7 s a keepalive seed. `cargo xtask test` runs a short \
        slice of it.\n\n\
        Example: cargo xtask accuracy --no-setup --lab stop --seeds 50"
    )]
    Accuracy(lab::AccuracyArgs),
    /// Fuzz every parser of outside input (cargo-fuzz targets of fuzz/), one target at a time
    #[command(
        long_about = "Fuzz every parser of outside input, one target at a time.\n\n\
        Installs cargo-fuzz if missing, builds the targets of fuzz/ with the nightly toolchain \
        (`cargo fuzz build --sanitizer none`, into fuzz/target), then runs each in turn under \
        `nice -n 19` (libFuzzer -jobs=1 -workers=1) for --minutes or until --runs executions, \
        seeded from fuzz/seeds/<target>, growing fuzz/corpus/<target>. Prints per target its \
        executions, exec/s, corpus size and any crash (input in fuzz/artifacts/<target>/), \
        then a markdown table; exits non-zero on a crash. --smoke runs each target 15 s \
        (what `cargo xtask test` does).\n\n\
        Example: cargo xtask fuzz --runs 10000000 --minutes 25 --target bolt"
    )]
    Fuzz(fuzz::FuzzArgs),
    /// The agent under container churn and traffic for --minutes; its figures in BENCHMARKS.md
    #[command(
        long_about = "The agent (with --state-dir) under container churn and steady traffic for \
        --minutes (tests/tests/soak.rs): it holds when RSS drifts under 5% after warm-up, every \
        capped collection stays under its cap, no event is lost, and every container churned has \
        its stop and start records. Writes its figures to BENCHMARKS.md (kept by bench).\n\n\
        Example: cargo xtask soak --minutes 30"
    )]
    Soak(soak::SoakArgs),
    /// The kernel matrix: the kernel-facing checks inside each kernel nodes run (5.10, 6.1,
    /// 6.12 in QEMU) and on this machine's; the README's kernel table
    #[command(
        long_about = "The kernel matrix: the agent and its kernel-facing checks on every kernel of the matrix.\n\n\
        Builds the agent and the runner (`cargo build --release -p drainwatch`, then \
        `-p drainwatch-tests --bin kernel-matrix`), downloads (once, into target/kernels/, with a \
        private apt state) Debian's cloud kernels 5.10 (bullseye), 6.1 (bookworm) and 6.12 \
        (trixie), writes an initramfs (busybox, the agent, the runner, their libraries), boots \
        each under QEMU (TCG, one CPU, nice 15) and runs the runner on this machine's own kernel \
        directly. The runner loads the programs as four plans (as the kernel decides, as the agent \
        loads the accept path (holding clean connections), classic tracepoints only, kprobe \
        resets only) and checks each against what the kernel says it \
        offers, then exact events of a refused connect, an abort, accept wait, a listen \
        overflow, SIGTERM and SIGKILL exits and a cgroup removal, the real agent's start-up and \
        probe metrics, one synthetic container's whole stop, and the agent under a 64 KiB \
        memlock limit. Prints one markdown row per kernel (release, hook per signal, checks \
        passed, pass or FAIL), writes the README's kernel table (unless --no-readme, --only or \
        --filter), exits non-zero if any kernel fails. Consoles in target/kernels/logs/.\n\n\
        Example: cargo xtask kernels --no-setup --only 5.10 --filter abort"
    )]
    Kernels(kernels::KernelsArgs),
    /// Build the agent's OCI image (FROM scratch, no pulls) and save it under target/image/
    #[command(
        long_about = "Build the agent's OCI image with podman, from nothing that must be pulled.\n\n\
        Installs what it needs first (podman, binutils; for arm64 Debian's cross toolchain \
        gcc-aarch64-linux-gnu + libc6-dev-arm64-cross, qemu-user and the Rust target \
        aarch64-unknown-linux-gnu), builds `cargo build --release -p drainwatch` (cross for \
        arm64), puts the stripped binary and exactly the shared libraries its ELF headers name \
        (the loader, libc, libm, libgcc_s) into an empty root, runs `drainwatch --version` from \
        that root (chroot; arm64 under qemu-aarch64), builds deploy/Containerfile (FROM scratch) \
        as localhost/drainwatch:<version> (arm64: <version>-arm64), runs the amd64 image once, \
        and saves it with `podman save --format oci-archive` as \
        target/image/drainwatch-<version>-<arch>.oci.tar. First sets up what `cargo xtask run` \
        needs (the eBPF toolchain) unless --no-setup.\n\n\
        Example: cargo xtask image --no-setup --arch arm64"
    )]
    Image(image::ImageArgs),
}

#[derive(Args)]
struct BenchArgs {
    /// Skip `cargo xtask setup` (when the machine is known to be set up)
    #[arg(long)]
    no_setup: bool,
    /// Run every step briefly and write nothing (a check that the benchmark still works)
    #[arg(long)]
    smoke: bool,
    /// Run one phase alone and print its rows (BENCHMARKS.md is not written)
    #[arg(long, value_enum)]
    only: Option<bench::Phase>,
}

#[derive(Args)]
struct SetupArgs {
    /// What to set up for: `run` (build and run the agent) or `test` (everything)
    #[arg(long = "for", value_enum, default_value = "test")]
    purpose: setup::Purpose,
}

#[derive(Args)]
struct RunArgs {
    /// Skip `cargo xtask setup` (when the machine is known to be set up)
    #[arg(long)]
    no_setup: bool,
    /// Arguments for the agent, after `--` (see `cargo xtask run -- --help`)
    #[arg(last = true, value_name = "AGENT_ARGS")]
    agent_args: Vec<OsString>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(code) = sudo::ensure_root() {
        return code;
    }
    let code = match cli.command {
        Cmd::Setup(args) => match setup::run_for(args.purpose) {
            Ok(()) => ExitCode::SUCCESS,
            Err(()) => ExitCode::FAILURE,
        },
        Cmd::Run(args) => run_agent(&args),
        Cmd::Test(args) => test::run(&args),
        Cmd::Demo(args) => lab::demo(&args),
        Cmd::Accuracy(args) => lab::accuracy(&args),
        Cmd::Fuzz(args) => fuzz::run(&args),
        Cmd::Soak(args) => soak::run(&args),
        Cmd::Kernels(args) => kernels::run(&args),
        Cmd::Image(args) => image::run(&args),
        Cmd::Bench(args) => {
            if !args.no_setup && setup::run().is_err() {
                return ExitCode::FAILURE;
            }
            match bench::run(&bench::Settings {
                smoke: args.smoke,
                only: args.only,
            }) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("[bench] failed: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    };
    let root = repo_root();
    sudo::give_back_to_invoking_user(&root, &target_dir(&root));
    code
}

fn run_agent(args: &RunArgs) -> ExitCode {
    if !args.no_setup && setup::run_for(setup::Purpose::Run).is_err() {
        return ExitCode::FAILURE;
    }
    let root = repo_root();
    let t = Instant::now();
    let status = match cargo(&root)
        .args(["build", "--release", "-p", "drainwatch"])
        .status()
    {
        Ok(status) => status,
        Err(e) => {
            eprintln!("[run] could not start cargo: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !status.success() {
        eprintln!("[run] building drainwatch failed ({status}); see cargo's output above.");
        return exit_code(status.code());
    }
    let bin = target_dir(&root).join("release/drainwatch");
    // The agent replaces this process: give the build back to the user first.
    sudo::give_back_to_invoking_user(&root, &target_dir(&root));
    println!(
        "[run] built in {}; exec {}",
        secs(t.elapsed()),
        bin.display()
    );
    let err = Command::new(&bin).args(&args.agent_args).exec();
    eprintln!("[run] could not start {}: {err}", bin.display());
    ExitCode::FAILURE
}

/// A non-zero exit code for a failed child: its own code when it has one in 1..=255, else 1.
fn exit_code(code: Option<i32>) -> ExitCode {
    match code.and_then(|c| u8::try_from(c).ok()).filter(|&c| c != 0) {
        Some(c) => ExitCode::from(c),
        None => ExitCode::FAILURE,
    }
}

/// The workspace root: xtask lives in `<root>/xtask`.
fn repo_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

fn target_dir(root: &Path) -> PathBuf {
    env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from)
}

/// The cargo that runs us (cargo sets `CARGO`), in the workspace root.
fn cargo(root: &Path) -> Command {
    let mut cmd = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root);
    without_run_env(&mut cmd);
    cmd
}

/// Takes out what `cargo run` set for xtask itself (`CARGO_PKG_NAME=xtask`, ...). ring's build
/// script reruns when CARGO_PKG_* or OUT_DIR differ from its last build, and ring's rebuild
/// takes rustls, kube-client and the agent with it: a `cargo build` typed in a shell and one
/// run by xtask (`cargo xtask run`, `test`, the image test's) rebuilt them for each other.
fn without_run_env(cmd: &mut Command) {
    for (key, _) in env::vars_os() {
        let key = key.to_string_lossy();
        if matches!(
            &*key,
            "OUT_DIR" | "CARGO_CRATE_NAME" | "CARGO_BIN_NAME" | "CARGO_PRIMARY_PACKAGE"
        ) || key.starts_with("CARGO_PKG_")
            || key.starts_with("CARGO_MANIFEST_")
        {
            cmd.env_remove(&*key);
        }
    }
}

/// `cmd` as it would be typed in a shell (for progress and error lines).
fn show(cmd: &Command) -> String {
    let mut s = String::new();
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            let _ = write!(s, "{}={} ", k.to_string_lossy(), v.to_string_lossy());
        }
    }
    let program = Path::new(cmd.get_program());
    // The full path of cargo (from $CARGO) is noise: show `cargo`.
    let program = if program.file_name() == Some(OsStr::new("cargo")) {
        OsStr::new("cargo")
    } else {
        program.as_os_str()
    };
    s += &program.to_string_lossy();
    for a in cmd.get_args() {
        s.push(' ');
        s += &a.to_string_lossy();
    }
    s
}

/// Runs `cmd` with the terminal as its stdio; an error unless it exits 0.
fn run_cmd(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("could not start `{}`", show(cmd)))?;
    ensure!(status.success(), "`{}` failed ({status})", show(cmd));
    Ok(())
}

/// Runs `cmd` silently; an error carrying its stderr unless it exits 0.
fn run_quiet(cmd: &mut Command) -> Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("could not start `{}`", show(cmd)))?;
    ensure!(
        out.status.success(),
        "`{}` failed ({}): {}",
        show(cmd),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// Runs `cmd` silently: its stdout when it exits 0, `None` when it fails or cannot start.
fn capture(cmd: &mut Command) -> Option<String> {
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}
