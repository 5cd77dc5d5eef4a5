//! The soak: the real agent (with `--state-dir`) for `DRAINWATCH_SOAK_MINUTES` (default 30)
//! under container churn (backends of every stop mode started, requested, stopped, removed,
//! one after another) and steady traffic to a long-lived backend. Not in CI: run it with
//! `cargo xtask soak --minutes N`, which puts its summary in BENCHMARKS.md.
//!
//! It holds when: the agent's RSS after warm-up (the first fifth, at least a minute) drifts
//! under 5%; every capped collection stays under its cap; no event is lost at any stage; and
//! every container the churn stopped has a settled stop record, every one it started a start
//! record (ground truth: the churn's own list of containers).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use drainwatch_tests::{
    agent::{Agent, api},
    lab::{Backend, BackendOpts, Mode, container::http_get},
};

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// `name{map="m"} value` lines of a family, by map.
fn by_map(metrics: &str, family: &str) -> Vec<(String, f64)> {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix(family)?.strip_prefix("{map=\""))
        .filter_map(|rest| {
            let (map, value) = rest.split_once("\"} ")?;
            Some((map.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

#[test]
#[ignore = "a soak of many minutes: cargo xtask soak"]
fn the_agent_holds_steady_under_hours_of_churn() {
    let minutes: u64 = std::env::var("DRAINWATCH_SOAK_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(30);
    let total = Duration::from_secs(minutes * 60);
    let warm_up = (total / 5).max(Duration::from_secs(60)).min(total / 2);
    let dir = std::env::temp_dir().join(format!("dw-soak-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let dir_arg = dir.to_string_lossy().into_owned();
    let agent = Agent::start(&["--state-dir", &dir_arg]);
    let pid = agent.child.id();
    let began = Instant::now();

    // Steady traffic to a long-lived backend.
    let steady = Backend::start("soak-steady", Mode::Drain, BackendOpts::default());
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU64::new(0));
    let traffic = {
        let (stop, served, addr) = (Arc::clone(&stop), Arc::clone(&served), steady.addr());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if http_get(addr, "/work?ms=5", Duration::from_secs(5)).is_ok_and(|r| r.0 == 200) {
                    served.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    let modes = [
        Mode::Drain,
        Mode::NoHandler,
        Mode::CloseListener,
        Mode::ExitZero,
    ];
    let mut rng = fastrand::Rng::with_seed(7);
    let mut churned: Vec<String> = Vec::new();
    let mut samples: Vec<(Duration, u64)> = Vec::new();
    let mut over_cap: Vec<String> = Vec::new();
    let mut next_sample = Instant::now();
    let mut i = 0;
    while began.elapsed() < total {
        let mode = modes[rng.usize(..modes.len())];
        let b = Backend::start(&format!("soak-{i}"), mode, BackendOpts::default());
        for _ in 0..rng.usize(1..20) {
            let _ = http_get(b.addr(), "/work?ms=2", Duration::from_secs(5));
        }
        b.stop(rng.u32(1..4));
        churned.push(b.id.clone());
        drop(b);
        i += 1;
        if Instant::now() >= next_sample {
            next_sample += Duration::from_secs(10);
            samples.push((began.elapsed(), rss_kib(pid)));
            let m = agent.metrics_text();
            let caps = by_map(&m, "drainwatch_state_capacity");
            for (map, entries) in by_map(&m, "drainwatch_state_entries") {
                let cap = caps
                    .iter()
                    .find(|(m, _)| *m == map)
                    .map_or(f64::MAX, |c| c.1);
                if entries > cap {
                    over_cap.push(format!("{map}: {entries} > {cap}"));
                }
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    traffic.join().expect("traffic");
    // Every record settles 10 s after its cgroup is gone.
    std::thread::sleep(Duration::from_secs(15));

    let (_, stops) = api(&agent, "/api/v1/stops");
    let (_, starts) = api(&agent, "/api/v1/starts");
    let has = |records: &serde_json::Value, id: &str, settled: bool| {
        records
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| r["container"]["id"] == id && (!settled || r["settled"] == true))
    };
    let no_stop: Vec<&String> = churned.iter().filter(|id| !has(&stops, id, true)).collect();
    let no_start: Vec<&String> = churned
        .iter()
        .filter(|id| !has(&starts, id, false))
        .collect();
    let m = agent.metrics_text();
    let lost: f64 = m
        .lines()
        .filter_map(|l| l.strip_prefix("drainwatch_events_lost_total{stage="))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    let received: f64 = m
        .lines()
        .filter_map(|l| l.strip_prefix("drainwatch_events_total{kind="))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    let after_warm_up: Vec<&(Duration, u64)> =
        samples.iter().filter(|(t, _)| *t >= warm_up).collect();
    let (base, last) = (
        after_warm_up.first().map_or(0, |s| s.1),
        after_warm_up.last().map_or(0, |s| s.1),
    );
    let peak = after_warm_up.iter().map(|s| s.1).max().unwrap_or(0);
    let drift = if base == 0 {
        f64::NAN
    } else {
        (last as f64 - base as f64) / base as f64 * 100.0
    };
    let summary = format!(
        "| duration | containers churned | steady requests | events received | events lost | RSS after warm-up | RSS at end | peak | drift | maps over cap | stopped without a settled record | started without a record |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n\
         | {minutes} min | {} | {} | {received} | {lost} | {base} KiB | {last} KiB | {peak} KiB | {drift:+.2}% | {} | {} | {} |\n",
        churned.len(),
        served.load(Ordering::Relaxed),
        over_cap.len(),
        no_stop.len(),
        no_start.len(),
    );
    println!("{summary}");
    if let Ok(out) = std::env::var("DRAINWATCH_SOAK_SUMMARY") {
        std::fs::write(out, &summary).expect("write the summary");
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(samples.len() >= 3, "sampled: {samples:?}");
    assert!(
        drift.abs() < 5.0,
        "RSS drift {drift:.2}% after warm-up: {samples:?}"
    );
    assert!(over_cap.is_empty(), "{over_cap:?}");
    assert_eq!(lost, 0.0, "events lost");
    assert!(
        no_stop.is_empty(),
        "stopped without a settled record: {no_stop:?}"
    );
    assert!(
        no_start.is_empty(),
        "started without a record: {no_start:?}"
    );
}
