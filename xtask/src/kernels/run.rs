//! Running the `kernel-matrix` runner: on this machine's kernel directly, or inside a kernel
//! booted under QEMU (TCG: this machine has no nested virtualization) from the matrix's
//! initramfs, its serial console on stdout. Either way the output is the runner's `DWK-` lines,
//! parsed into one [`Row`].

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use serde::Deserialize;

/// What one kernel's run showed.
#[derive(Debug, Default)]
pub struct Row {
    pub release: String,
    /// Where it ran: this machine, or the Debian package booted.
    pub source: String,
    /// Which nodes run this kernel series.
    pub nodes: String,
    /// The natural plan: (signal, chosen hook or `None`, degraded reasons, or what the signal
    /// needs when nothing attached).
    pub plan: Vec<(String, Option<String>, Vec<String>)>,
    pub passed: usize,
    pub total: usize,
    pub failed: Vec<String>,
    /// Why the run itself failed (no result line, timeout), if it did.
    pub broken: Option<String>,
    pub seconds: f64,
    /// Whether the kernel charges eBPF map memory to RLIMIT_MEMLOCK (the `memlock` check).
    pub memlock_charged: Option<bool>,
    /// The agent's own load time of the natural plan, as the runner printed it.
    pub load_seconds: Option<f64>,
    /// How the kernel's cgroups were mounted (`v2 only`, `hybrid (v1 and v2)`).
    pub cgroups: Option<String>,
    /// Each program loaded, by name, as the first plan that loaded it holds it: (translated
    /// instructions, instructions the verifier processed (5.16+)).
    pub programs: std::collections::BTreeMap<String, (Option<u32>, Option<u32>)>,
}

impl Row {
    pub fn ok(&self) -> bool {
        self.broken.is_none() && self.total > 0 && self.passed == self.total
    }
}

/// Reads `child`'s stdout until it exits or `timeout` passes (then kills it); every line is
/// echoed with `tag` and kept.
fn collect(mut child: Child, tag: &str, timeout: Duration, echo: bool) -> (Vec<String>, bool) {
    let (tx, rx) = mpsc::channel();
    if let Some(out) = child.stdout.take() {
        std::thread::spawn(move || {
            for line in BufReader::new(out).split(b'\n').map_while(Result::ok) {
                let line = printable(&String::from_utf8_lossy(&line));
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
    }
    let deadline = Instant::now() + timeout;
    let mut lines = Vec::new();
    let mut timed_out = false;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.min(Duration::from_secs(1))) {
            Ok(line) => {
                let progress = ["DWK-BOOT", "DWK-LOAD", "DWK-AGENT", "DWK-TEST", "DWK-EXIT"];
                if echo && progress.iter().any(|p| line.contains(p)) {
                    println!("[kernels] {tag}: {}", short(&line));
                }
                lines.push(line);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) if left.is_zero() => {
                timed_out = true;
                let _ = child.kill();
                break;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
    let _ = child.wait();
    (lines, timed_out)
}

/// A console line without its terminal escapes (the BIOS clears the screen) and control
/// characters.
fn printable(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters… final byte in @..~; other escapes: ESC and one char.
            if chars.peek() == Some(&'[') {
                chars.next();
                for f in chars.by_ref() {
                    if ('@'..='~').contains(&f) {
                        break;
                    }
                }
            } else {
                chars.next();
            }
        } else if !c.is_control() || c == '\t' {
            out.push(c);
        }
    }
    out
}

/// A progress line: the head of a long line.
fn short(line: &str) -> String {
    let line = line.trim();
    match line.char_indices().nth(160) {
        Some((i, _)) => format!("{}…", &line[..i]),
        None => line.to_string(),
    }
}

/// The runner on this machine's own kernel.
pub fn host(runner: &Path, agent: &Path, filter: Option<&str>, timeout: Duration) -> Result<Row> {
    let t = Instant::now();
    let child = Command::new("nice")
        .args(["-n", "15"])
        .arg(runner)
        .args(filter)
        .env("DRAINWATCH_BIN", agent)
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", runner.display()))?;
    let (lines, timed_out) = collect(child, "host", timeout, true);
    let mut row = parse(&lines, timed_out, timeout);
    row.source = "this machine, run directly (its vmlinuz is not on the machine to boot)".into();
    row.nodes = "the build machine (CI)".into();
    row.seconds = t.elapsed().as_secs_f64();
    Ok(row)
}

/// The runner inside `vmlinuz` booted under QEMU with `initramfs`; its console kept in `log`.
pub fn qemu(
    vmlinuz: &Path,
    initramfs: &Path,
    filter: Option<&str>,
    timeout: Duration,
    log: &Path,
    tag: &str,
) -> Result<Row> {
    let t = Instant::now();
    // no_timer_check: under TCG on a loaded machine the kernel's test of the IO-APIC timer
    // can miss its ticks and panic at boot ("IO-APIC + timer doesn't work!", 5.10 once here
    // at a load average of 11); the VM's timer is QEMU's, known good.
    let mut append = String::from("console=ttyS0 panic=-1 quiet loglevel=1 no_timer_check");
    if let Some(f) = filter {
        append.push_str(&format!(" dwk.filter={f}"));
    }
    let child = Command::new("nice")
        .args(["-n", "15", "qemu-system-x86_64"])
        .args(["-accel", "tcg", "-cpu", "max", "-smp", "1", "-m", "1024"])
        .args(["-nographic", "-no-reboot", "-kernel"])
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initramfs)
        .args(["-append", &append])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting qemu-system-x86_64 (cargo xtask setup installs qemu-system-x86)")?;
    let (lines, timed_out) = collect(child, tag, timeout, true);
    let _ = std::fs::write(log, lines.join("\n"));
    let mut row = parse(&lines, timed_out, timeout);
    row.seconds = t.elapsed().as_secs_f64();
    if let Some(b) = &mut row.broken {
        b.push_str(&format!(" (console: {})", log.display()));
    }
    Ok(row)
}

/// A `DWK-PLAN` line: the plan's outcome for one signal under one way of loading.
#[derive(Deserialize)]
struct PlanLine {
    variant: String,
    signal: String,
    chosen: Option<String>,
    #[serde(default)]
    degraded: Vec<String>,
    unavailable: Option<String>,
}

/// A `DWK-INSNS` line: the programs one plan loaded, and their sizes.
#[derive(Deserialize)]
struct InsnsLine {
    programs: Vec<ProgramLine>,
}

#[derive(Deserialize)]
struct ProgramLine {
    name: String,
    xlated: Option<u32>,
    verified: Option<u32>,
}

/// The `DWK-DONE` line: the runner's tally.
#[derive(Deserialize)]
struct DoneLine {
    kernel: String,
    passed: usize,
    total: usize,
    #[serde(default)]
    failed: Vec<String>,
}

/// The JSON after `prefix` on `line`, wherever the prefix starts (a console may put noise
/// before it).
fn json_after<T: serde::de::DeserializeOwned>(line: &str, prefix: &str) -> Option<T> {
    let at = line.find(prefix)?;
    serde_json::from_str(line[at + prefix.len()..].trim()).ok()
}

/// Reads a run's `DWK-` lines into a row.
pub fn parse(lines: &[String], timed_out: bool, timeout: Duration) -> Row {
    let mut row = Row::default();
    let mut done = false;
    for line in lines {
        if let Some(p) = json_after::<PlanLine>(line, "DWK-PLAN ") {
            if p.variant == "natural" {
                let mut degraded = p.degraded;
                if p.chosen.is_none()
                    && let Some(needs) = p.unavailable
                {
                    degraded.push(needs);
                }
                row.plan.push((p.signal, p.chosen, degraded));
            }
        } else if let Some(i) = json_after::<InsnsLine>(line, "DWK-INSNS ") {
            for p in i.programs {
                row.programs.entry(p.name).or_insert((p.xlated, p.verified));
            }
        } else if let Some(d) = json_after::<DoneLine>(line, "DWK-DONE ") {
            done = true;
            row.release = d.kernel;
            row.passed = d.passed;
            row.total = d.total;
            row.failed = d.failed;
        } else if line.contains("DWK-TEST ok memlock ") {
            row.memlock_charged = Some(line.contains("charges maps to RLIMIT_MEMLOCK"));
        } else if let Some(at) = line.find("DWK-LOAD natural ") {
            row.load_seconds = line[at + 17..].trim().trim_end_matches('s').parse().ok();
        } else if let Some(at) = line.find("DWK-CGROUPS ") {
            row.cgroups = Some(line[at + 12..].trim().to_string());
        } else if let Some(at) = line.find("DWK-KERNEL ") {
            row.release = line[at + 11..]
                .split_whitespace()
                .next()
                .unwrap_or("?")
                .to_string();
        }
    }
    if !done {
        let last: Vec<&str> = lines
            .iter()
            .rev()
            .filter(|l| !l.trim().is_empty())
            .take(3)
            .map(|l| l.trim())
            .collect();
        row.broken = Some(if timed_out {
            format!(
                "no result within {} s; last lines: {last:?}",
                timeout.as_secs()
            )
        } else {
            format!("no result line; last lines: {last:?}")
        });
    }
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_escapes_are_dropped() {
        assert_eq!(
            printable("\u{1b}c\u{1b}[?7l\u{1b}[2JDWK-BOOT 6.1.0 2.21\r"),
            "DWK-BOOT 6.1.0 2.21"
        );
    }

    #[test]
    fn a_console_run_becomes_a_row() {
        let lines: Vec<String> = [
            "noise DWK-KERNEL 6.1.0-57-cloud-amd64 {}",
            "DWK-LOAD natural 12.3s",
            r#"DWK-INSNS {"variant":"natural","programs":[{"name":"signal_generate","xlated":180,"verified":null}]}"#,
            r#"DWK-INSNS {"variant":"classic","programs":[{"name":"signal_generate","xlated":1,"verified":2}]}"#,
            r#"DWK-PLAN {"variant":"natural","signal":"resets_sent","chosen":"kprobe:a+b","degraded":[]}"#,
            r#"DWK-PLAN {"variant":"classic","signal":"resets_sent","chosen":"tracepoint:tcp:tcp_send_reset","degraded":["x"]}"#,
            r#"[   1.2] DWK-PLAN {"variant":"natural","signal":"socket_errors","chosen":null,"degraded":[]}"#,
            "DWK-TEST ok plan[natural] (0.0s) …",
            "DWK-TEST ok memlock (0.9s) kernel charges maps to RLIMIT_MEMLOCK: …",
            r#"DWK-DONE {"kernel":"6.1.0-57-cloud-amd64","passed":18,"total":19,"failed":["abort[kprobes]"]}"#,
        ]
        .map(String::from)
        .to_vec();
        let row = parse(&lines, false, Duration::from_secs(1));
        assert_eq!(row.release, "6.1.0-57-cloud-amd64");
        assert_eq!(row.load_seconds, Some(12.3));
        assert_eq!(row.programs["signal_generate"], (Some(180), None));
        assert_eq!(
            row.plan,
            [
                ("resets_sent".into(), Some("kprobe:a+b".into()), vec![]),
                ("socket_errors".into(), None, vec![]),
            ]
        );
        assert_eq!((row.passed, row.total), (18, 19));
        assert_eq!(row.failed, ["abort[kprobes]"]);
        assert_eq!(row.memlock_charged, Some(true));
        assert!(!row.ok());
        let cut = parse(&lines[..5], true, Duration::from_secs(300));
        assert!(
            cut.broken
                .as_deref()
                .is_some_and(|b| b.contains("within 300 s"))
        );
    }
}
