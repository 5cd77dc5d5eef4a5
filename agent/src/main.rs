use std::process::ExitCode;

use clap::Parser;
use drainwatch::{
    cli::{Cli, ClusterOpts, Command, GateOpts, LogFormat},
    export::{cluster, cluster_kube, gate, report},
};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Report {
        agent,
        json,
        cluster,
        cluster_opts,
        gate,
        token,
    }) = &cli.command
    {
        if gate.gate.is_some() {
            let from = cluster.then_some(cluster_opts);
            return gate_report(
                gate,
                from,
                agent,
                token.as_deref(),
                cli.deploy_window_seconds,
            );
        }
        if *cluster {
            return cluster_report(cluster_opts, cli.deploy_window_seconds, *json);
        }
        return match report::run(agent, *json, token.as_deref()) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("drainwatch report: {e}");
                ExitCode::from(2)
            }
        };
    }
    drainwatch::consumer::fix_mmap_threshold();
    let filter =
        EnvFilter::try_from_env("DRAINWATCH_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    // One thread for the reader, the HTTP server and the Kubernetes watch: the pipeline, the
    // only heavy work, has its own (see agent.rs). Fewer idle threads, fewer wakeups at rest.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("drainwatch: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(drainwatch::agent::run(cli)) {
        Ok(()) => {
            runtime.shutdown_timeout(std::time::Duration::from_millis(100));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("drainwatch: {e}");
            ExitCode::from(2)
        }
    }
}

/// Every agent's records through the API server, merged.
fn ask_cluster(o: &ClusterOpts, window_seconds: u64) -> Result<cluster::ClusterReport, String> {
    let token = match &o.agent_token_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?
                .trim()
                .to_string(),
        ),
        None => None,
    };
    let target = cluster_kube::Target {
        namespace: o.namespace.clone(),
        selector: o.selector.clone(),
        port: o.port,
        timeout: std::time::Duration::from_secs(o.timeout_seconds),
        agent_token: token,
        window: std::time::Duration::from_secs(window_seconds),
    };
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
        .and_then(|rt| {
            rt.block_on(cluster_kube::run(&target))
                .map_err(|e| e.to_string())
        })
}

/// `drainwatch report --gate`: one line on stdout; 0 passed, 1 failed, 2 the agents could not
/// be asked.
fn gate_report(
    o: &GateOpts,
    cluster: Option<&ClusterOpts>,
    agent: &str,
    token: Option<&str>,
    window_seconds: u64,
) -> ExitCode {
    let fail = |e: String| {
        eprintln!("drainwatch report --gate: {e}");
        ExitCode::from(2)
    };
    let g = match gate::Gate::parse(o.gate.as_deref().unwrap_or_default(), o.since, &o.allow) {
        Ok(g) => g,
        Err(e) => return fail(e.to_string()),
    };
    let (stops, unanswered) = match cluster {
        Some(c) => match ask_cluster(c, window_seconds) {
            Ok(r) => {
                if let Some(line) = cluster::missing(&r) {
                    eprintln!("drainwatch report --gate: {line}");
                }
                (r.stops, r.unanswered.len())
            }
            Err(e) => return fail(e),
        },
        None => match report::fetch(agent, "/api/v1/stops", token) {
            Ok(stops) => (stops, 0),
            Err(e) => return fail(e.to_string()),
        },
    };
    let result = gate::evaluate(&g, &stops, unanswered, std::time::SystemTime::now());
    println!("{}", result.line());
    if result.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// `drainwatch report --cluster`: 0 when every agent answered, 1 when some did not (named in
/// the output and on stderr), 2 when none could be asked.
fn cluster_report(o: &ClusterOpts, window_seconds: u64, json: bool) -> ExitCode {
    let report = match ask_cluster(o, window_seconds) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("drainwatch report --cluster: {e}");
            return ExitCode::from(2);
        }
    };
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("drainwatch report --cluster: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        print!("{}", cluster::render(&report));
    }
    match cluster::missing(&report) {
        None => ExitCode::SUCCESS,
        Some(line) => {
            eprintln!("drainwatch report --cluster: {line}");
            ExitCode::from(1)
        }
    }
}
