//! `cargo xtask demo` and `cargo xtask accuracy`: the lab (tests/) as a guided tour and as a
//! campaign over many seeds.

use std::{
    ffi::OsString,
    os::unix::process::CommandExt as _,
    process::{Command, ExitCode},
    time::Instant,
};

use clap::Args;

use crate::{
    cargo, repo_root, run_cmd, secs, setup, show, target_dir,
    test::{Phase, phase},
};

#[derive(Args)]
pub struct AccuracyArgs {
    /// Skip `cargo xtask setup` (when the machine is known to be set up)
    #[arg(long)]
    no_setup: bool,
    /// How many seeds
    #[arg(long, default_value_t = 50)]
    seeds: u64,
    /// The first seed
    #[arg(long, default_value_t = 1)]
    first: u64,
    /// The labs, comma-separated: retry (its wide draw), slow (its first draw), stop, storm,
    /// streams
    #[arg(
        long,
        default_value = "retry,stop,storm,streams",
        value_delimiter = ','
    )]
    lab: Vec<String>,
    /// Run every seed that ever failed instead (tests/tests/accuracy.rs: REGRESSIONS)
    #[arg(long)]
    regressions: bool,
}

#[derive(Args)]
pub struct DemoArgs {
    /// Skip `cargo xtask setup` (when the machine is known to be set up)
    #[arg(long)]
    no_setup: bool,
    /// Arguments for the demo, after `--` (--port N, --screenshot PATH, --no-wait)
    #[arg(last = true, value_name = "DEMO_ARGS")]
    demo_args: Vec<OsString>,
}

pub fn demo(args: &DemoArgs) -> ExitCode {
    if !args.no_setup && setup::run().is_err() {
        return ExitCode::FAILURE;
    }
    let root = repo_root();
    let t = Instant::now();
    for what in [
        &["-p", "drainwatch"][..],
        &["-p", "drainwatch-tests", "--bin", "demo"][..],
    ] {
        let mut build = cargo(&root);
        build.args(["build", "--release"]).args(what);
        println!("[demo] {}", show(&build));
        if let Err(e) = run_cmd(&mut build) {
            eprintln!("[demo] {e:#}; see cargo's output above.");
            return ExitCode::FAILURE;
        }
    }
    let target = target_dir(&root).join("release");
    let bin = target.join("demo");
    println!(
        "[demo] built in {}; exec {}",
        secs(t.elapsed()),
        bin.display()
    );
    let err = Command::new(&bin)
        .env("DRAINWATCH_BIN", target.join("drainwatch"))
        .args(&args.demo_args)
        .exec();
    eprintln!("[demo] could not start {}: {err}", bin.display());
    ExitCode::FAILURE
}

pub fn accuracy(args: &AccuracyArgs) -> ExitCode {
    if !args.no_setup && setup::run().is_err() {
        return ExitCode::FAILURE;
    }
    if args.seeds == 0 {
        eprintln!("[accuracy] --seeds must be at least 1");
        return ExitCode::from(2);
    }
    let root = repo_root();
    let mut build = cargo(&root);
    build.args(["build", "--release", "-p", "drainwatch"]);
    let mut run = cargo(&root);
    let last = args.first.saturating_add(args.seeds - 1);
    let seeds = if args.regressions {
        "regressions".to_string()
    } else {
        let items: Vec<String> = args
            .lab
            .iter()
            .map(|lab| format!("{lab}:{}-{last}", args.first))
            .collect();
        items.join(" ")
    };
    run.env("DRAINWATCH_ACCURACY_SEEDS", seeds)
        .args(["test", "-p", "drainwatch-tests", "--test", "accuracy"])
        .args(["--", "--test-threads=1", "--nocapture"]);
    for (name, cmd) in [("build", &mut build), ("accuracy", &mut run)] {
        if let Phase::Failed(..) = phase(name, cmd) {
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
