//! The alert rules (dashboards/alerts.yaml): valid for Prometheus, unit-tested with
//! `promtool test rules` (every alert both fires and stays quiet in dashboards/alerts_test.yaml),
//! and written to the conventions of shared/REFERENCE.md.

use std::process::Command;

use drainwatch_tests::ops::{repo, run_ok, yaml_file};
use serde_json::Value;

fn rules() -> Vec<Value> {
    let docs = yaml_file("dashboards/alerts.yaml");
    assert_eq!(docs.len(), 1);
    docs[0]["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").clone())
        .collect()
}

#[test]
fn promtool_checks_the_rules() {
    let out = run_ok(
        Command::new("promtool")
            .args(["check", "rules"])
            .arg(repo().join("dashboards/alerts.yaml")),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("SUCCESS: {} rules found", rules().len())),
        "{text}"
    );
}

#[test]
fn promtool_unit_tests_pass_and_cover_every_alert_both_ways() {
    run_ok(
        Command::new("promtool")
            .args(["test", "rules"])
            .arg(repo().join("dashboards/alerts_test.yaml")),
    );
    let tests = yaml_file("dashboards/alerts_test.yaml");
    let cases: Vec<&Value> = tests[0]["tests"]
        .as_array()
        .expect("tests")
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().expect("alert_rule_test"))
        .collect();
    for rule in rules() {
        let name = rule["alert"].as_str().expect("alert name");
        let mine: Vec<&&Value> = cases.iter().filter(|c| c["alertname"] == name).collect();
        let fires = mine
            .iter()
            .any(|c| c["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()));
        let quiet = mine
            .iter()
            .any(|c| c["exp_alerts"].as_array().is_some_and(Vec::is_empty));
        assert!(fires, "{name}: no unit test where it fires");
        assert!(quiet, "{name}: no unit test where it stays quiet");
    }
}

/// Every metric selector in `expr` selects job="drainwatch".
fn selectors_without_job(expr: &str) -> Vec<String> {
    let mut bad = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let word_start = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        let rest = &expr[i..];
        let metric = ["drainwatch_", "process_", "up{"]
            .iter()
            .find(|p| word_start && rest.starts_with(**p));
        if metric.is_some() {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            if !rest[end..].starts_with("{job=\"drainwatch\"") {
                bad.push(rest[..end.min(rest.len())].to_string());
            }
            i += end.max(1);
        } else {
            i += 1;
        }
    }
    bad
}

#[test]
fn rules_follow_the_conventions() {
    let runbooks = std::fs::read_to_string(repo().join("dashboards/README.md")).unwrap();
    for rule in rules() {
        let name = rule["alert"].as_str().expect("every rule is an alert");
        assert!(
            name.starts_with("Drainwatch")
                && name.chars().all(|c| c.is_ascii_alphanumeric())
                && name.len() > "Drainwatch".len(),
            "{name}: CamelCase with the Drainwatch prefix"
        );
        assert!(
            ["critical", "warning", "info"]
                .contains(&rule["labels"]["severity"].as_str().unwrap_or("")),
            "{name}: severity"
        );
        assert!(rule["for"].is_string(), "{name}: for");
        for a in ["summary", "description", "runbook_url"] {
            assert!(
                rule["annotations"][a]
                    .as_str()
                    .is_some_and(|s| !s.is_empty()),
                "{name}: annotation {a}"
            );
        }
        let url = rule["annotations"]["runbook_url"].as_str().unwrap();
        assert!(
            url.ends_with(&format!("dashboards/README.md#{}", name.to_lowercase())),
            "{name}: runbook_url {url}"
        );
        assert!(
            runbooks.contains(&format!("\n### {name}\n")),
            "{name}: no runbook section in dashboards/README.md"
        );
        let expr = rule["expr"].as_str().expect("expr");
        let bad = selectors_without_job(expr);
        assert!(
            bad.is_empty(),
            "{name}: selectors without job=\"drainwatch\": {bad:?}"
        );
    }
}

#[test]
fn the_job_selector_check_catches_a_missing_job() {
    assert_eq!(
        selectors_without_job(
            "sum(rate(drainwatch_events_total{kind=\"x\"}[5m])) > up{job=\"drainwatch\"}"
        ),
        vec!["drainwatch_events_total"]
    );
    assert!(selectors_without_job("up{job=\"drainwatch\"} == 0").is_empty());
    assert_eq!(
        selectors_without_job("changes(process_start_time_seconds[1h])"),
        vec!["process_start_time_seconds"]
    );
}
