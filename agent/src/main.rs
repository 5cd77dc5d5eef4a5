use std::process::ExitCode;

use clap::Parser;
use drainwatch::{
    cli::{Cli, Command, LogFormat},
    export::report,
};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Report { agent, json, token }) = &cli.command {
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
