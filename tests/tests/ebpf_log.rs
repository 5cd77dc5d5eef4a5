//! The lifecycle programs' log (agent-ebpf/src/fault.rs), end to end through the real agent: a
//! cgroup whose path is longer than a record holds, removed by this process, is a real fault of
//! the cgroup-removal program (`path_truncated`). The kernel counts it, as before, and the
//! program logs it through aya-log; the agent's log shows the line (target `drainwatch::ebpf`,
//! this process as the remover) and counts it. Without the log (`--test-no-ebpf-log`, as when
//! it cannot be set up) the agent starts all the same, warns, counts the failure, and the fault
//! is still counted.

use std::{fs::File, path::PathBuf, time::Duration};

use drainwatch_tests::agent::{Agent, free_port, wait_for};

const FAULT: &str = "drainwatch_ebpf_faults_total{kind=\"cgroup_rmdir\",fault=\"path_truncated\"}";
const RECORDS: &str = "drainwatch_ebpf_log_records_total";
const FAILURES: &str = "drainwatch_ebpf_log_failures_total";

/// An agent whose log goes to a file of its own (read while it runs).
fn agent(name: &str, extra: &[&str]) -> (Agent, PathBuf) {
    let path = std::env::temp_dir().join(format!(
        "drainwatch-ebpf-log-{name}-{}.log",
        std::process::id()
    ));
    let file = File::create(&path).expect("log file");
    (Agent::start_on(free_port(), extra, file.into()), path)
}

fn log_text(path: &PathBuf) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[test]
fn a_cut_cgroup_path_reaches_the_agents_log_from_the_kernel_and_is_counted_once() {
    let (agent, path) = agent("on", &[]);
    let metric = |m: &str| agent.metric(m).unwrap_or_else(|| panic!("no {m}"));
    assert_eq!(metric(FAILURES), 0.0, "{}", log_text(&path));
    let (faults, records) = (metric(FAULT), metric(RECORDS));
    drainwatch_tests::remove_cgroups_one_too_long();
    let want = format!("pid {}", std::process::id());
    let mut line = None;
    wait_for("the program's log line", Duration::from_secs(10), || {
        line = log_text(&path)
            .lines()
            .find(|l| l.contains("cgroup_rmdir path_truncated") && l.contains(&want))
            .map(String::from);
        line.is_some()
    });
    let line = line.unwrap_or_default();
    println!("{line}");
    assert!(line.contains("drainwatch::ebpf"), "{line}");
    assert!(line.contains("WARN"), "{line}");
    wait_for("the log record counted", Duration::from_secs(5), || {
        metric(RECORDS) > records
    });
    assert_eq!(metric(FAULT) - faults, 1.0, "counted once, as before");
    assert_eq!(metric(RECORDS) - records, 1.0, "its first: logged");
    assert_eq!(metric(FAILURES), 0.0);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn without_the_log_the_agent_starts_warns_and_still_counts_the_fault() {
    let (agent, path) = agent("off", &["--test-no-ebpf-log"]);
    let metric = |m: &str| agent.metric(m).unwrap_or_else(|| panic!("no {m}"));
    assert_eq!(metric(FAILURES), 1.0);
    let text = log_text(&path);
    assert!(
        text.contains("the eBPF programs' log cannot be set up"),
        "{text}"
    );
    let faults = metric(FAULT);
    drainwatch_tests::remove_cgroups_one_too_long();
    wait_for("the fault counted", Duration::from_secs(10), || {
        metric(FAULT) > faults
    });
    assert_eq!(metric(FAULT) - faults, 1.0);
    assert_eq!(metric(RECORDS), 0.0, "nothing drained");
    let _ = std::fs::remove_file(&path);
}
