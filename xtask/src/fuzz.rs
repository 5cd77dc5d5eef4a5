//! `cargo xtask fuzz`: builds the cargo-fuzz targets of `fuzz/` (one per parser of outside
//! input) and runs each in turn, one libFuzzer process at a time under `nice -n 19`, for a
//! time or a number of executions; prints per target its executions, exec/s, corpus size and
//! any crash, and exits non-zero on a crash. `--smoke` is the short run `cargo xtask test` does.
//!
//! Layout: targets in `fuzz/fuzz_targets/<name>.rs`, seeds (real samples, committed) in
//! `fuzz/seeds/<name>/`, inputs that once failed (committed, replayed by every run) in
//! `fuzz/regressions/<name>/`, the growing corpus in `fuzz/corpus/<name>/`, crash inputs and
//! libFuzzer's logs in `fuzz/artifacts/<name>/` (both ignored by git). The fuzz crate is a
//! workspace of its own, built by the nightly toolchain into `fuzz/target` (or
//! `$DRAINWATCH_FUZZ_TARGET_DIR`: a directory outside the checkout keeps the instrumented
//! dependencies built across fresh clones, as CI's are).

use std::{
    fs,
    io::ErrorKind,
    path::Path,
    process::{Command, ExitCode, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Args;

use crate::{capture, repo_root, run_cmd, secs, show};

/// The cargo-fuzz release installed when none is on PATH.
const CARGO_FUZZ_VERSION: &str = "0.13.2";
/// Each target's share of `--smoke`.
const SMOKE_SECS: u64 = 8;
/// How often a long run prints where it is.
const PROGRESS_EVERY: Duration = Duration::from_secs(60);
/// The triple cargo-fuzz builds for (its default), which names its output directory.
const TRIPLE: &str = "x86_64-unknown-linux-gnu";

#[derive(Args)]
pub struct FuzzArgs {
    /// Minutes per target (fractions allowed, e.g. 0.5)
    #[arg(long)]
    minutes: Option<f64>,
    /// Stop each target after this many executions (with --minutes: whichever comes first)
    #[arg(long)]
    runs: Option<u64>,
    /// Only these targets (repeat the flag or separate with commas); default: all
    #[arg(long = "target", value_name = "NAME", value_delimiter = ',')]
    targets: Vec<String>,
    /// The CI smoke: every target for 8 seconds, built unoptimized (quick to rebuild)
    #[arg(long, conflicts_with_all = ["minutes", "runs"])]
    smoke: bool,
}

/// What one target's run came to.
struct Outcome {
    target: String,
    executions: Option<u64>,
    exec_per_sec: Option<u64>,
    /// libFuzzer's corpus at the end (units kept in memory: seeds and new ones, reduced).
    corpus: Option<u64>,
    /// Files added to `fuzz/corpus/<target>` by this run.
    new_units: usize,
    wall: Duration,
    /// Why it failed (a crash, a timeout, out of memory), with the input that did it.
    failure: Option<String>,
}

pub fn run(args: &FuzzArgs) -> ExitCode {
    match fuzz(args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("[fuzz] failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Ok(false) when a target failed (its findings are printed).
fn fuzz(args: &FuzzArgs) -> Result<bool> {
    let root = repo_root();
    let dir = root.join("fuzz");
    let target_dir = std::env::var_os("DRAINWATCH_FUZZ_TARGET_DIR")
        .map_or_else(|| dir.join("target"), std::path::PathBuf::from);
    let (secs_each, runs) = if args.smoke {
        (Some(SMOKE_SECS), None)
    } else {
        let secs = args.minutes.map(|m| (m * 60.0).round().max(1.0) as u64);
        // Neither given: a minute each.
        (secs.or(args.runs.is_none().then_some(60)), args.runs)
    };
    let all = targets(&dir)?;
    for t in &args.targets {
        if !all.contains(t) {
            bail!("no fuzz target {t:?}; the targets are: {}", all.join(", "));
        }
    }
    let chosen: Vec<String> = if args.targets.is_empty() {
        all
    } else {
        args.targets.clone()
    };

    ensure_cargo_fuzz(&root)?;
    let t = Instant::now();
    let mut build = nightly_cargo_fuzz(&root);
    build
        .args(["build", "--sanitizer", "none", "--target-dir"])
        .arg(&target_dir);
    // The smoke builds unoptimized: after a change to the agent that rebuilds in well under a
    // minute, against minutes for the optimized build long runs want (a profile of its own,
    // so each stays built).
    if args.smoke {
        build.arg("--dev");
    }
    if chosen.len() == 1 {
        build.arg(&chosen[0]);
    }
    println!("[fuzz] {}", show(&build));
    run_cmd(&mut build).context("building the fuzz targets")?;
    println!("[fuzz] built in {}", secs(t.elapsed()));

    let profile = if args.smoke { "debug" } else { "release" };
    let bin = target_dir.join(TRIPLE).join(profile);
    let limit = [
        secs_each.map(|s| format!("{s} s")),
        runs.map(|r| format!("{r} executions")),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join(" or ");
    let mut outcomes = Vec::new();
    for target in &chosen {
        println!("[fuzz] {target}: running for {limit}");
        let o = run_target(&dir, &bin, target, secs_each, runs, args.smoke)?;
        println!("[fuzz] {}", line(&o));
        outcomes.push(o);
    }

    println!("\n| target | executions | exec/s | wall time | corpus | crashes |");
    println!("| --- | ---: | ---: | ---: | ---: | --- |");
    for o in &outcomes {
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            o.target,
            opt(o.executions),
            opt(o.exec_per_sec),
            secs(o.wall),
            opt(o.corpus),
            o.failure.as_deref().map_or("none", |_| "**1**"),
        );
    }
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| o.failure.is_some()).collect();
    for o in &failed {
        eprintln!(
            "[fuzz] {} FAILED: {}",
            o.target,
            o.failure.as_deref().unwrap_or_default()
        );
    }
    Ok(failed.is_empty())
}

/// The target names: the files of `fuzz/fuzz_targets/`.
fn targets(dir: &Path) -> Result<Vec<String>> {
    let src = dir.join("fuzz_targets");
    let mut names: Vec<String> = fs::read_dir(&src)
        .with_context(|| format!("reading {}", src.display()))?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_suffix(".rs").map(str::to_owned)
        })
        .collect();
    names.sort();
    Ok(names)
}

/// Installs cargo-fuzz unless `cargo fuzz` already works (idempotent, like `cargo xtask setup`).
fn ensure_cargo_fuzz(root: &Path) -> Result<()> {
    if let Some(v) = capture(nightly_cargo_fuzz(root).arg("--version")) {
        println!("[fuzz] cargo-fuzz: present ({})", v.trim());
        return Ok(());
    }
    if capture(rustup().args(["run", "nightly", "rustc", "--version"])).is_none() {
        bail!("no `nightly` toolchain: run `cargo xtask setup` first");
    }
    println!("[fuzz] cargo-fuzz: not found, installing {CARGO_FUZZ_VERSION} from crates.io");
    let mut install = Command::new("cargo");
    install
        .current_dir(root)
        .args(["install", "--locked", "cargo-fuzz", "--version"])
        .arg(CARGO_FUZZ_VERSION);
    clean_env(&mut install);
    run_cmd(&mut install).context("installing cargo-fuzz")?;
    Ok(())
}

fn rustup() -> Command {
    let mut cmd = Command::new("rustup");
    // Never let `rustup run` quietly download a toolchain we did not ask for.
    cmd.env("RUSTUP_AUTO_INSTALL", "0");
    cmd
}

/// `nice -n 19 rustup run nightly cargo fuzz` in the repository root: cargo-fuzz needs nightly
/// (sanitizer coverage flags), and the agent's build script already does (the eBPF build).
fn nightly_cargo_fuzz(root: &Path) -> Command {
    let mut cmd = Command::new("nice");
    cmd.current_dir(root)
        .args(["-n", "19", "rustup", "run", "nightly", "cargo", "fuzz"])
        .env("RUSTUP_AUTO_INSTALL", "0");
    clean_env(&mut cmd);
    cmd
}

/// The outer cargo's settings (this runs under `cargo xtask`, with the stable toolchain) must
/// not leak into the nightly build, nor a target dir meant for the main workspace.
fn clean_env(cmd: &mut Command) {
    for key in [
        "CARGO",
        "RUSTUP_TOOLCHAIN",
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET_DIR",
    ] {
        cmd.env_remove(key);
    }
}

/// Runs one target: one libFuzzer job (`-jobs=1 -workers=1`) under `nice -n 19`, its log in
/// `fuzz/artifacts/<target>/fuzz-0.log`, new inputs into `fuzz/corpus/<target>` (the smoke's
/// into `fuzz/artifacts/<target>/smoke-corpus`), the seeds read from `fuzz/seeds/<target>` and
/// the inputs that once failed from `fuzz/regressions/<target>`.
fn run_target(
    dir: &Path,
    bin: &Path,
    target: &str,
    secs_each: Option<u64>,
    runs: Option<u64>,
    smoke: bool,
) -> Result<Outcome> {
    let seeds = dir.join("seeds").join(target);
    let artifacts = dir.join("artifacts").join(target);
    // The smoke starts from the seeds alone, as in a fresh clone: the same run everywhere,
    // whatever corpus long runs left here (replaying it unoptimized would take the smoke's
    // whole time).
    let corpus = if smoke {
        let c = artifacts.join("smoke-corpus");
        match fs::remove_dir_all(&c) {
            Err(e) if e.kind() != ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("removing {}", c.display()));
            }
            _ => c,
        }
    } else {
        dir.join("corpus").join(target)
    };
    for d in [&corpus, &artifacts] {
        fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let before = count_files(&corpus);
    let log = artifacts.join("fuzz-0.log");
    match fs::remove_file(&log) {
        Err(e) if e.kind() != ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("removing {}", log.display()));
        }
        _ => {}
    }
    let mut cmd = Command::new("nice");
    cmd.current_dir(&artifacts)
        .args(["-n", "19"])
        .arg(bin.join(target))
        .arg(&corpus);
    // Inputs that once failed (fuzz/regressions/<target>) replay first on every run.
    for inputs in [seeds, dir.join("regressions").join(target)] {
        if inputs.is_dir() {
            cmd.arg(inputs);
        }
    }
    cmd.args(["-jobs=1", "-workers=1", "-print_final_stats=1"])
        .args(["-timeout=30", "-rss_limit_mb=2048"])
        .arg(format!("-artifact_prefix={}/", artifacts.display()));
    if let Some(s) = secs_each {
        cmd.arg(format!("-max_total_time={s}"));
    }
    if let Some(r) = runs {
        cmd.arg(format!("-runs={r}"));
    }
    // libFuzzer's own output (the job's log, copied once the job ends) goes to a file too.
    let outer = fs::File::create(artifacts.join("libfuzzer.log")).context("creating the log")?;
    cmd.stdin(Stdio::null())
        .stdout(outer.try_clone().context("log handle")?)
        .stderr(outer);
    let t = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("could not start `{}`", show(&cmd)))?;
    let mut reported = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().context("waiting for libFuzzer")? {
            break status;
        }
        if reported.elapsed() >= PROGRESS_EVERY {
            reported = Instant::now();
            let text = fs::read_to_string(&log).unwrap_or_default();
            if let Some(last) = text.lines().rev().find(|l| l.starts_with('#')) {
                println!("[fuzz] {target}: {} ({})", last.trim(), secs(t.elapsed()));
            }
        }
        thread::sleep(Duration::from_millis(200));
    };
    let wall = t.elapsed();
    let text = fs::read_to_string(&log)
        .or_else(|_| fs::read_to_string(artifacts.join("libfuzzer.log")))
        .unwrap_or_default();
    let stat = |name: &str| -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("stat::{name}:")))
            .and_then(|v| v.trim().parse().ok())
    };
    let failure = (!status.success()).then(|| failure(&text, status.code(), &log));
    Ok(Outcome {
        target: target.to_owned(),
        executions: stat("number_of_executed_units"),
        exec_per_sec: stat("average_exec_per_sec"),
        corpus: last_corpus(&text),
        new_units: count_files(&corpus).saturating_sub(before),
        wall,
        failure,
    })
}

/// What a failed run's log says: libFuzzer's summary, the panic, the input written, and the
/// end of the log (printed here so a CI log shows the backtrace).
fn failure(text: &str, code: Option<i32>, log: &Path) -> String {
    let tail: Vec<&str> = text.lines().rev().take(60).collect();
    eprintln!("[fuzz] ---- end of {} ----", log.display());
    for l in tail.iter().rev() {
        eprintln!("{l}");
    }
    eprintln!("[fuzz] ----");
    let find = |needle: &str| text.lines().find(|l| l.contains(needle)).map(str::trim);
    let what = find("panicked at")
        .or_else(|| find("SUMMARY: libFuzzer"))
        .or_else(|| find("ERROR: libFuzzer"))
        .map_or_else(|| format!("libFuzzer exited with {code:?}"), str::to_owned);
    let input = find("Test unit written to")
        .and_then(|l| l.split("Test unit written to").nth(1))
        .map(|p| format!("; input: {}", p.trim()))
        .unwrap_or_default();
    format!("{what}{input}")
}

/// The corpus size of libFuzzer's last status line (`#N DONE cov: .. corp: 123/45Kb ..`).
fn last_corpus(text: &str) -> Option<u64> {
    text.lines()
        .rev()
        .filter(|l| l.starts_with('#'))
        .find_map(|l| l.split("corp: ").nth(1)?.split('/').next()?.parse().ok())
}

fn count_files(dir: &Path) -> usize {
    fs::read_dir(dir).map_or(0, |d| {
        d.filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .count()
    })
}

fn line(o: &Outcome) -> String {
    format!(
        "{}: {} executions, {} exec/s, corpus {} units ({} new files), {}, {}",
        o.target,
        opt(o.executions),
        opt(o.exec_per_sec),
        opt(o.corpus),
        o.new_units,
        secs(o.wall),
        o.failure
            .as_deref()
            .map_or_else(|| "no crash".to_owned(), |f| format!("FAILED: {f}")),
    )
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "?".to_owned(), |v| v.to_string())
}
