//! What a Service lookup costs (`bench/src/bin/nat.rs`): the agent's ctnetlink code against the
//! kernel's connection tracking, per lookup and per dump, and what the agent's budget of 200
//! lookups a second and one dump per rejected address every 5 s can cost at most. Lookups run
//! only for failed connects to addresses no container has: the pod rows count them (0).

use std::{path::Path, process::Command};

use anyhow::Result;

use super::{
    Plan,
    phases::json_of,
    report::{Row, Verdict},
};

/// The agent's budget (`enrich::nat::MAX_PER_SECOND`) and how long a dump is reused.
const LOOKUPS_PER_SECOND: f64 = 200.0;
const DUMP_REUSE_SECS: f64 = 5.0;

pub(super) fn nat_phase(bin: &Path, plan: &Plan, rows: &mut Vec<Row>) -> Result<()> {
    eprintln!("[bench] Service lookups (ctnetlink)");
    let lookups = if plan.rounds > 1 { 20_000 } else { 2_000 };
    let v = json_of(Command::new(bin.join("nat")).args([lookups.to_string(), "100".into()]))?;
    let num = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let buckets = std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_buckets")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "not measured".into());
    let entries = std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_count")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "not measured".into());
    let info = |figure: String, value: String, baseline: String| Row {
        figure,
        value,
        baseline,
        ratio: "-".into(),
        budget: "-".into(),
        verdict: Verdict::Info,
    };
    rows.push(info(
        "Service lookup of a failed connect to an address no container has (ctnetlink GET by \
         its tuple, entry found; wall, CPU)"
            .into(),
        if v["tracked"].as_bool() == Some(true) {
            format!(
                "{:.1} µs, {:.1} µs CPU",
                num("found_ns") / 1e3,
                num("found_cpu_ns") / 1e3
            )
        } else {
            "not measured (conntrack does not track loopback here)".into()
        },
        format!(
            "{:.1} µs, {:.1} µs CPU with no entry; {lookups} lookups each",
            num("not_found_ns") / 1e3,
            num("not_found_cpu_ns") / 1e3
        ),
    ));
    rows.push(info(
        "Service dump by destination (a no-endpoint reject: at most one per address every 5 s; \
         wall, CPU)"
            .into(),
        format!(
            "{:.2} ms, {:.2} ms CPU",
            num("dump_ns") / 1e6,
            num("dump_cpu_ns") / 1e6
        ),
        format!("the kernel walks every bucket: nf_conntrack_buckets {buckets}, {entries} entries"),
    ));
    let ceiling =
        LOOKUPS_PER_SECOND * num("found_cpu_ns") / 1e9 + num("dump_cpu_ns") / 1e9 / DUMP_REUSE_SECS;
    rows.push(info(
        "agent CPU for Service lookups at most (200 lookups a second, one rejected address's \
         dump every 5 s)"
            .into(),
        format!("{:.3}% of one core", ceiling * 100.0),
        "0 with no failed connect to a virtual IP (the pod rows' lookups)".into(),
    ));
    Ok(())
}
