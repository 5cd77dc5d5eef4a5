//! The matrix's output: one markdown row per kernel on the terminal, and the README's kernel
//! table (kernel → hooks used → what is degraded), written between markers from a run.

use std::path::Path;

use anyhow::{Context as _, Result};

use super::run::Row;

pub const HEADER: &str =
    "| kernel | hook chosen per signal | checks passed | result |\n|---|---|---|---|";

pub const BEGIN: &str = "<!-- kernels: written by cargo xtask kernels -->";
pub const END: &str = "<!-- /kernels -->";

/// `signal=hook` for every signal, `-` for none.
fn hooks(r: &Row) -> String {
    r.plan
        .iter()
        .map(|(s, h, _)| format!("{s}={}", h.as_deref().unwrap_or("-")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The terminal row: `| release | hooks | passed/total | pass or FAIL |`.
pub fn row(r: &Row) -> String {
    let release = if r.release.is_empty() {
        "?"
    } else {
        &r.release
    };
    format!(
        "| {release} | {} | {}/{} | {} |",
        hooks(r),
        r.passed,
        r.total,
        if r.ok() { "pass" } else { "FAIL" }
    )
}

/// What is degraded on a kernel, one item per signal (its reasons joined).
fn degraded(r: &Row) -> String {
    let mut items: Vec<String> = r
        .plan
        .iter()
        .filter(|(_, _, d)| !d.is_empty())
        .map(|(s, h, d)| match h {
            Some(_) => format!("{s}: {}", d.join("; ")),
            None => format!("**{s} not captured** ({})", d.join("; ")),
        })
        .collect();
    if r.memlock_charged == Some(true) {
        items.push(
            "eBPF maps charged to RLIMIT_MEMLOCK: needs CAP_SYS_RESOURCE or an unlimited memlock limit"
                .into(),
        );
    }
    if items.is_empty() {
        "nothing".into()
    } else {
        items.join("<br>")
    }
}

/// The README section for `rows` (markers included).
pub fn section(rows: &[Row]) -> String {
    let mut s = format!(
        "{BEGIN}\n| kernel | nodes | run as | hooks used | degraded or not captured | checks |\n|---|---|---|---|---|---|\n"
    );
    for r in rows {
        let hooks: Vec<String> = r
            .plan
            .iter()
            .filter_map(|(sig, h, _)| h.as_ref().map(|h| format!("{sig}: `{h}`")))
            .collect();
        let cgroups = r
            .cgroups
            .as_ref()
            .map_or(String::new(), |c| format!("; cgroups {c}"));
        s.push_str(&format!(
            "| {} | {} | {}{cgroups} | {} | {} | {}/{} {} |\n",
            r.release,
            r.nodes,
            r.source,
            hooks.join("<br>"),
            degraded(r),
            r.passed,
            r.total,
            if r.ok() { "pass" } else { "**FAIL**" }
        ));
    }
    s.push_str(END);
    s
}

/// `doc` with its kernels section replaced by `new`, or `None` when it has no markers.
fn replace(doc: &str, new: &str) -> Option<String> {
    let begin = doc.find(BEGIN)?;
    let end = doc[begin..].find(END)? + begin + END.len();
    Some(format!("{}{new}{}", &doc[..begin], &doc[end..]))
}

pub fn write_readme(path: &Path, rows: &[Row]) -> Result<()> {
    let doc = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let new = replace(&doc, &section(rows)).with_context(|| {
        format!(
            "{} has no kernels section: add the markers {BEGIN} and {END}",
            path.display()
        )
    })?;
    std::fs::write(path, new)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> Row {
        Row {
            release: "5.10.0-46-cloud-amd64".into(),
            source: "Debian".into(),
            plan: vec![
                ("resets_sent".into(), Some("kprobe:a+b".into()), vec![]),
                (
                    "socket_errors".into(),
                    None,
                    vec!["needs tracepoint sock:inet_sk_error_report".into()],
                ),
                (
                    "process_exits".into(),
                    Some("tracepoint:sched:sched_process_exit".into()),
                    vec!["no field group_dead".into()],
                ),
            ],
            passed: 19,
            total: 19,
            ..Row::default()
        }
    }

    #[test]
    fn a_row_names_every_signal_and_the_tally() {
        assert_eq!(
            super::row(&row()),
            "| 5.10.0-46-cloud-amd64 | resets_sent=kprobe:a+b; socket_errors=-; process_exits=tracepoint:sched:sched_process_exit | 19/19 | pass |"
        );
    }

    #[test]
    fn the_readme_section_says_what_is_lost_and_replaces_the_old_one() {
        let s = section(&[row()]);
        assert!(
            s.contains(
                "**socket_errors not captured** (needs tracepoint sock:inet_sk_error_report)"
            ),
            "{s}"
        );
        assert!(s.contains("process_exits: no field group_dead"), "{s}");
        assert!(s.contains("resets_sent: `kprobe:a+b`"), "{s}");
        let doc = format!("# x\n\n{BEGIN}\nold\n{END}\n\ntail\n");
        assert_eq!(replace(&doc, &s), Some(format!("# x\n\n{s}\n\ntail\n")));
        assert_eq!(replace("# x\n", &s), None);
    }
}
