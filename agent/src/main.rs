use std::process::ExitCode;

use clap::Parser;
use drainwatch::{
    cli::{Cli, ClusterOpts, Command, LogFormat},
    export::{cluster, cluster_kube, report},
};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Report {
        agent,
        json,
        cluster,
        cluster_opts,
    }) = &cli.command
    {
        if *cluster {
            return cluster_report(cluster_opts, cli.deploy_window_seconds, *json);
        }
        return match report::run(agent, *json) {
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

/// `drainwatch report --cluster`: 0 when every agent answered, 1 when some did not (named in
/// the output and on stderr), 2 when none could be asked.
fn cluster_report(o: &ClusterOpts, window_seconds: u64, json: bool) -> ExitCode {
    let token = match &o.agent_token_file {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(t) => Some(t.trim().to_string()),
            Err(e) => {
                eprintln!("drainwatch report: cannot read {}: {e}", path.display());
                return ExitCode::from(2);
            }
        },
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
    let report = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
        .and_then(|rt| {
            rt.block_on(cluster_kube::run(&target))
                .map_err(|e| e.to_string())
        });
    let report = match report {
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
