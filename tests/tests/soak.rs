//! The soak: the real agent (with `--state-dir`) for `DRAINWATCH_SOAK_MINUTES` (default 30)
//! under container churn (backends of every stop mode started, requested, stopped, removed,
//! one after another) and steady traffic to a long-lived backend. Not in CI: run it with
//! `cargo xtask soak --minutes N`, which puts its summary in BENCHMARKS.md.
//!
//! It holds when: the agent's RSS after warm-up ([`warm_up`]) drifts under 5%; every capped collection stays under its cap; no event is lost at any stage; and
//! every container the churn stopped (each backend and its network holder: ground truth is the
//! churn's own list of container ids) has a settled stop record and a start record, or, the
//! oldest ones only, had one the record cap evicted; a container whose life fit between two
//! of the agent's scans before any event of it got there has none, and is counted: kept plus
//! evicted plus unseen equals what the churn made. The agent keeps [`RECORDS_KEPT`] records (`--records-kept`) so that the cap is reached
//! within the warm-up, as the default 1,000 would be on a node after a day: after it, memory
//! that still grows is a leak.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use drainwatch_tests::{
    agent::{Agent, api, metric_sum},
    lab::{
        Backend, BackendOpts, Mode,
        container::{http_get, podman, setup_once},
    },
};

/// `--records-kept`: reached within the first few minutes of churn.
const RECORDS_KEPT: usize = 200;

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// `name{map="m"} value` lines of a family, by map.
/// The agent's default retention: a gone container's state and series are kept this long.
const RETENTION: Duration = Duration::from_secs(300);

/// Until the agent's memory reaches its working size: two retention windows and a minute
/// (the first fifth of a longer run). Measured (BENCHMARKS.md): series on /metrics rise for
/// the first window (to ~21,600 at 300 s, then flat), and RSS goes on rising through the
/// second, as the heap left by forgotten containers is reused (21.6 MiB at 6 min, 23.1 at
/// 11 min, then within 23.0-23.1 to 14 min; a 30-minute run: 22.8 at 12 min, 23.1 at 30).
/// Growth after that is a leak.
fn warm_up(total: Duration) -> Duration {
    (total / 5).max(2 * RETENTION + Duration::from_secs(60))
}

/// Adds the agent's stop and start records (record id → container id) to `listed`.
fn list_records(agent: &Agent, listed: &mut [std::collections::HashMap<String, String>; 2]) {
    for (path, seen) in ["/api/v1/stops", "/api/v1/starts"]
        .iter()
        .zip(listed.iter_mut())
    {
        let (_, records) = api(agent, path);
        for r in records.as_array().into_iter().flatten() {
            if let (Some(id), Some(c)) = (r["id"].as_str(), r["container"]["id"].as_str()) {
                seen.insert(id.to_string(), c.to_string());
            }
        }
    }
}

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
    let warm_up = warm_up(total);
    let dir = std::env::temp_dir().join(format!("dw-soak-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let dir_arg = dir.to_string_lossy().into_owned();
    // Leftovers of earlier runs go before the agent starts: their stops would be records
    // the churn did not make.
    setup_once();
    // DRAINWATCH_SOAK_RECORDS_KEPT: more, to see every record of a short run (diagnosis).
    let kept = std::env::var("DRAINWATCH_SOAK_RECORDS_KEPT").unwrap_or(RECORDS_KEPT.to_string());
    let agent = Agent::start(&["--state-dir", &dir_arg, "--records-kept", &kept]);
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
    // State entries per map and series on /metrics, at the first sample after warm-up and at
    // the last: where memory that still grows after warm-up goes.
    let mut state_at_warm_up: Option<(Vec<(String, f64)>, usize)> = None;
    let mut state_last: (Vec<(String, f64)>, usize) = Default::default();
    // Every stop and start record the agent ever listed (record id → container id), read
    // every 10 s, well within a record's life before eviction: records of containers another
    // test made meanwhile can then be told apart even once evicted.
    let mut listed: [std::collections::HashMap<String, String>; 2] = Default::default();
    let mut i = 0;
    while began.elapsed() < total {
        let mode = modes[rng.usize(..modes.len())];
        let b = Backend::start(&format!("soak-{i}"), mode, BackendOpts::default());
        for _ in 0..rng.usize(1..20) {
            let _ = http_get(b.addr(), "/work?ms=2", Duration::from_secs(5));
        }
        let holder = b.holder.as_deref().map(|h| {
            podman(&["inspect", "--format", "{{.Id}}", h])
                .expect("the network holder's id")
                .trim()
                .to_string()
        });
        b.stop(rng.u32(1..4));
        churned.push(b.id.clone());
        churned.extend(holder);
        drop(b);
        i += 1;
        if Instant::now() >= next_sample {
            next_sample += Duration::from_secs(10);
            samples.push((began.elapsed(), rss_kib(pid)));
            list_records(&agent, &mut listed);
            let m = agent.metrics_text();
            let caps = by_map(&m, "drainwatch_state_capacity");
            let series = m.lines().filter(|l| !l.starts_with('#')).count();
            state_last = (by_map(&m, "drainwatch_state_entries"), series);
            if samples.len() % 6 == 1 {
                println!(
                    "[soak] {:?}: RSS {} KiB, series {series}, state {:?}",
                    began.elapsed(),
                    rss_kib(pid),
                    state_last.0
                );
            }
            if state_at_warm_up.is_none() && began.elapsed() >= warm_up {
                state_at_warm_up = Some(state_last.clone());
            }
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
    list_records(&agent, &mut listed);
    let has = |records: &serde_json::Value, id: &str, settled: bool| {
        records
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| r["container"]["id"] == id && (!settled || r["settled"] == true))
    };
    // Records of containers the churn did not make (none expected).
    let steady_ids = [
        Some(steady.id.clone()),
        steady.holder.as_deref().map(|h| {
            podman(&["inspect", "--format", "{{.Id}}", h])
                .expect("the holder's id")
                .trim()
                .to_string()
        }),
    ];
    let foreign = |records: &serde_json::Value| -> Vec<String> {
        records
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| {
                let id = r["container"]["id"].as_str().unwrap_or_default();
                !churned.iter().any(|c| c == id) && !steady_ids.iter().flatten().any(|s| s == id)
            })
            .map(|r| format!("{} {}", r["container"]["name"], r["container"]["id"]))
            .collect()
    };
    // Containers with more than one record of a kind (none expected: each ran once).
    let twice = |records: &serde_json::Value| -> Vec<String> {
        let ids: Vec<&str> = records
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["container"]["id"].as_str())
            .collect();
        let mut twice: Vec<String> = ids
            .iter()
            .filter(|id| ids.iter().filter(|i| i == id).count() > 1)
            .map(|id| id.to_string())
            .collect();
        twice.sort();
        twice.dedup();
        twice
    };
    println!(
        "records of containers the churn did not make: stops {:?}, starts {:?}; containers with two records: stops {:?}, starts {:?}",
        foreign(&stops),
        foreign(&starts),
        twice(&stops),
        twice(&starts)
    );
    let no_stop: Vec<&String> = churned.iter().filter(|id| !has(&stops, id, true)).collect();
    let no_start: Vec<&String> = churned
        .iter()
        .filter(|id| !has(&starts, id, false))
        .collect();
    let m = agent.metrics_text();
    let evicted = |map: &str| metric_sum(&m, "drainwatch_state_dropped_total", &[("map", map)]);
    let len = |v: &serde_json::Value| v.as_array().map_or(0, Vec::len);
    // The steady backend and its holder started and have not stopped.
    let (stops_made, starts_made) = (churned.len(), churned.len() + 2);
    // Containers that lived and ended between two of the agent's scans before any event of
    // theirs got to it have no records, and are counted.
    let unseen = agent
        .metric("drainwatch_containers_unseen_total")
        .expect("drainwatch_containers_unseen_total") as usize;
    let is_foreign =
        |id: &String| !churned.contains(id) && !steady_ids.iter().flatten().any(|s| s == id);
    let [listed_stops, listed_starts] = &listed;
    let foreign_records = |l: &std::collections::HashMap<String, String>| {
        l.values().filter(|c| is_foreign(c)).count()
    };
    let (foreign_stops, foreign_starts) = (
        foreign_records(listed_stops),
        foreign_records(listed_starts),
    );
    let (stops_accounted, starts_accounted) = (
        len(&stops) + evicted("stops") as usize + unseen - foreign_stops,
        len(&starts) + evicted("starts") as usize + unseen - foreign_starts,
    );
    // Only the oldest may be missing: none newer than one that has its record.
    let newest_missing = |missing: &[&String], records: &serde_json::Value| {
        let last_missing = missing
            .iter()
            .filter_map(|id| churned.iter().position(|c| c == *id))
            .max();
        let first_kept = churned.iter().position(|id| has(records, id, false));
        matches!((last_missing, first_kept), (Some(m), Some(k)) if m > k)
    };
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
        "| duration | containers churned | steady requests | events received | events lost | RSS after warm-up | RSS at end | peak | drift | maps over cap | stopped without a settled record (evicted) | started without a record (evicted) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n\
         | {minutes} min | {} | {} | {received} | {lost} | {base} KiB | {last} KiB | {peak} KiB | {drift:+.2}% | {} | {} ({}) | {} ({}) |\n",
        churned.len(),
        served.load(Ordering::Relaxed),
        over_cap.len(),
        no_stop.len(),
        evicted("stops"),
        no_start.len(),
        evicted("starts"),
    );
    let summary = format!(
        "{summary}\nStop records: {} kept + {} evicted of {stops_made} the churn made; start records: {} kept + {} evicted of {starts_made} (with the steady backend's two); containers unseen (no records, counted): {unseen}; records of containers other tests made meanwhile (listed, not counted): {foreign_stops} stops, {foreign_starts} starts.\n",
        len(&stops),
        evicted("stops"),
        len(&starts),
        evicted("starts"),
    );
    let (state_base, series_base) = state_at_warm_up.unwrap_or_default();
    let grew: Vec<String> = state_last
        .0
        .iter()
        .filter_map(|(map, n)| {
            let was = state_base
                .iter()
                .find(|(m, _)| m == map)
                .map_or(0.0, |b| b.1);
            (*n > was).then(|| format!("{map} {was} → {n}"))
        })
        .collect();
    let summary = format!(
        "{summary}After warm-up to the end: series on /metrics {series_base} → {}; state maps that grew: {}.\n",
        state_last.1,
        if grew.is_empty() {
            "none".to_string()
        } else {
            grew.join(", ")
        },
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
    // Every record was listed before it was evicted, so the foreign ones are all known.
    assert_eq!(
        listed_stops.len(),
        len(&stops) + evicted("stops") as usize,
        "stop records listed = kept + evicted"
    );
    assert_eq!(
        listed_starts.len(),
        len(&starts) + evicted("starts") as usize,
        "start records listed = kept + evicted"
    );
    assert_eq!(stops_accounted, stops_made, "stop records kept + evicted");
    assert_eq!(
        starts_accounted, starts_made,
        "start records kept + evicted"
    );
    assert!(
        !newest_missing(&no_stop, &stops),
        "a newer container than one with a record has no settled stop: {no_stop:?}"
    );
    assert!(
        !newest_missing(&no_start, &starts),
        "a newer container than one with a record has no start: {no_start:?}"
    );
}
