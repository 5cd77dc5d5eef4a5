//! `cargo xtask soak --minutes N`: the agent under container churn and traffic for N minutes
//! (tests/tests/soak.rs, an ignored test run on purpose), its summary put in BENCHMARKS.md
//! between the soak markers, which `cargo xtask bench` keeps.

use std::{path::Path, process::ExitCode};

use clap::Args;

use crate::{
    cargo, repo_root, setup, target_dir,
    test::{Phase, phase},
};

pub const BEGIN: &str = "<!-- soak: written by cargo xtask soak -->";
pub const END: &str = "<!-- /soak -->";

#[derive(Args)]
pub struct SoakArgs {
    /// Skip `cargo xtask setup` (when the machine is known to be set up)
    #[arg(long)]
    no_setup: bool,
    /// How long the churn runs
    #[arg(long, default_value_t = 30)]
    minutes: u64,
}

/// The soak section of `doc` (markers included), if any.
pub fn section(doc: &str) -> Option<&str> {
    let begin = doc.find(BEGIN)?;
    let end = doc[begin..].find(END)? + begin + END.len();
    Some(&doc[begin..end])
}

/// `doc` with its soak section replaced by `new` (appended when it had none).
fn replace_section(doc: &str, new: &str) -> String {
    match section(doc) {
        Some(old) => doc.replacen(old, new, 1),
        None => format!("{}\n\n{new}\n", doc.trim_end()),
    }
}

pub fn run(args: &SoakArgs) -> ExitCode {
    if !args.no_setup && setup::run().is_err() {
        return ExitCode::FAILURE;
    }
    let root = repo_root();
    let summary = target_dir(&root).join("soak.md");
    let _ = std::fs::remove_file(&summary);
    let mut build = cargo(&root);
    build.args(["build", "--release", "-p", "drainwatch"]);
    let mut soak = cargo(&root);
    soak.env("DRAINWATCH_SOAK_MINUTES", args.minutes.to_string())
        .env("DRAINWATCH_SOAK_SUMMARY", &summary)
        .args(["test", "-p", "drainwatch-tests", "--test", "soak"])
        .args(["--", "--ignored", "--test-threads=1", "--nocapture"]);
    let built = matches!(phase("build", &mut build), Phase::Passed(_));
    let passed = built && matches!(phase("soak", &mut soak), Phase::Passed(_));
    // The figures go in whether it passed or not: a failed soak is a finding too.
    if let Err(e) = record(&root, &summary, passed) {
        eprintln!("[soak] {e}");
        return ExitCode::FAILURE;
    }
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn record(root: &Path, summary: &Path, passed: bool) -> Result<(), String> {
    let table = std::fs::read_to_string(summary).map_err(|e| {
        format!(
            "no summary at {} ({e}): the soak did not finish",
            summary.display()
        )
    })?;
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let new = format!(
        "{BEGIN}\n## Soak\n\n`cargo xtask soak` on kernel {}: the agent (with `--state-dir`) and `--records-kept 200` (reached in the first minutes, as the default 1,000 is on a busy node within a day) under container churn (backends of four stop modes, each with its network holder container, started, requested, stopped, removed, one after another) and steady traffic to a long-lived backend. RSS is the agent's `VmRSS`, sampled every 10 s; drift is from the first sample after warm-up (two retention windows and a minute, 11 minutes, or the first fifth of a longer run: see `warm_up` in `tests/tests/soak.rs`) to the last. Ground truth is the churn's own list of container ids: each has its records, or (the oldest only) had them evicted at the cap, counted. Verdict: {}.\n\n{table}{END}",
        kernel.trim(),
        if passed {
            "held"
        } else {
            "FAILED (see the test's output)"
        },
    );
    let path = root.join("BENCHMARKS.md");
    let doc = std::fs::read_to_string(&path).unwrap_or_default();
    std::fs::write(&path, replace_section(&doc, &new))
        .map_err(|e| format!("BENCHMARKS.md: {e}"))?;
    eprintln!("[soak] wrote its figures to BENCHMARKS.md");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soak_section_is_replaced_in_place_or_appended() {
        let new = format!("{BEGIN}\nnew\n{END}");
        let doc = format!("# B\n\nbench\n\n{BEGIN}\nold\n{END}\n\ntail\n");
        assert_eq!(
            replace_section(&doc, &new),
            format!("# B\n\nbench\n\n{new}\n\ntail\n")
        );
        assert_eq!(replace_section("# B\n", &new), format!("# B\n\n{new}\n"));
        assert_eq!(section(&doc), Some(format!("{BEGIN}\nold\n{END}").as_str()));
    }
}
