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
    /// The labs, comma-separated: retry (its wide draw), slow (its first draw), gone (the
    /// wide draw through nginx, clients giving up around the stop), stop, storm, streams,
    /// socketio (socket.io and socket.io-client from npm; seeds 1-6 are issue 41's setups),
    /// keepalive (keep-alive clients, plain or Node's http.Agent pool, against three servers)
    #[arg(
        long,
        default_value = "retry,stop,storm,streams,socketio,keepalive",
        value_delimiter = ','
    )]
    lab: Vec<String>,
    /// Run every seed that ever failed instead (tests/tests/accuracy.rs: REGRESSIONS)
    #[arg(long)]
    regressions: bool,
    /// An argument for every agent the labs start (repeat it), e.g. `--agent-arg=--retry-window-ms=50`
    /// for an A/B run of an option
    #[arg(long = "agent-arg", value_name = "ARG", allow_hyphen_values = true)]
    agent_args: Vec<String>,
    /// Keep this many threads spinning on the CPUs while the labs run: the contention of a
    /// busy node (proxies' workers and backends wait for a CPU)
    #[arg(long, default_value_t = 0)]
    load: usize,
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
    if !args.agent_args.is_empty() {
        run.env("DRAINWATCH_ACCURACY_AGENT_ARGS", args.agent_args.join(" "));
    }
    run.env("DRAINWATCH_ACCURACY_SEEDS", seeds)
        .args(["test", "-p", "drainwatch-tests", "--test", "accuracy"])
        .args(["--", "--test-threads=1", "--nocapture"]);
    if let Phase::Failed(..) = phase("build", &mut build) {
        return ExitCode::FAILURE;
    }
    let _load = Spin::start(args.load);
    if let Phase::Failed(..) = phase("accuracy", &mut run) {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// Threads spinning until dropped: CPU contention for the labs (`--load`).
struct Spin {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Spin {
    fn start(n: usize) -> Spin {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        if n > 0 {
            println!("[accuracy] {n} threads spinning meanwhile (--load)");
        }
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        Spin { stop, threads }
    }
}

impl Drop for Spin {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
