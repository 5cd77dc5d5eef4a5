//! Every Grafana dashboard under dashboards/ follows the project's conventions (see
//! shared/REFERENCE.md): fixed short uid, null id, a datasource variable every target uses,
//! $__rate_interval for rates, a unit and a description on every panel, tags, UTC; and every
//! metric a dashboard, an annotation or an alert rule names is one the agent registers.

use serde_json::Value;

fn dashboards() -> Vec<(String, Value)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../dashboards");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("dashboards/") {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let text = std::fs::read_to_string(&path).unwrap();
            let v: Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            out.push((path.display().to_string(), v));
        }
    }
    assert!(!out.is_empty(), "no dashboards found in {}", dir.display());
    out
}

#[test]
fn dashboards_follow_the_conventions() {
    for (name, d) in dashboards() {
        let uid = d["uid"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: no uid"));
        assert!(!uid.is_empty() && uid.len() <= 40, "{name}: uid {uid:?}");
        assert!(d["id"].is_null(), "{name}: id must be null");
        assert_eq!(d["timezone"], "utc", "{name}");
        assert!(
            d["tags"].as_array().is_some_and(|t| !t.is_empty()),
            "{name}: tags"
        );
        let vars = d["templating"]["list"].as_array().expect("templating");
        assert!(
            vars.iter()
                .any(|v| v["type"] == "datasource" && v["name"] == "datasource"),
            "{name}: datasource variable"
        );
        let panels = d["panels"].as_array().expect("panels");
        assert!(!panels.is_empty(), "{name}");
        for p in panels {
            let title = p["title"].as_str().unwrap_or("?");
            assert!(
                p["description"].as_str().is_some_and(|s| !s.is_empty()),
                "{name}/{title}: description"
            );
            assert!(
                p["fieldConfig"]["defaults"]["unit"].as_str().is_some(),
                "{name}/{title}: unit"
            );
            for t in p["targets"].as_array().expect("targets") {
                assert_eq!(
                    t["datasource"]["uid"], "${datasource}",
                    "{name}/{title}: target datasource"
                );
                let expr = t["expr"].as_str().unwrap_or_default();
                assert!(
                    expr.contains("drainwatch_") || expr.contains("process_"),
                    "{name}/{title}: {expr}"
                );
                assert!(
                    expr.contains("job=\"$job\""),
                    "{name}/{title}: job selector in {expr}"
                );
                if expr.contains("rate(") {
                    assert!(
                        expr.contains("[$__rate_interval]"),
                        "{name}/{title}: {expr}"
                    );
                }
            }
        }
    }
}

/// Every query of a dashboard: panel targets, annotations and variables.
fn queries(d: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().into_iter().flatten() {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.extend(t["expr"].as_str().map(str::to_string));
        }
    }
    for a in d["annotations"]["list"].as_array().into_iter().flatten() {
        out.extend(a["expr"].as_str().map(str::to_string));
    }
    for v in d["templating"]["list"].as_array().into_iter().flatten() {
        out.extend(v["definition"].as_str().map(str::to_string));
    }
    out
}

/// `drainwatch_*` and `process_*` names in a text.
fn metric_names(text: &str) -> Vec<String> {
    let mut out = metric_names_of(text, "drainwatch_");
    out.extend(metric_names_of(text, "process_"));
    out
}

fn metric_names_of(text: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(prefix) {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let before = rest[..i].chars().last();
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            out.push(tail[..end].to_string());
        }
        rest = &tail[end.max(1)..];
    }
    out
}

/// The agent's metrics with one container seen: its per-container series exist (at zero).
fn exposition_with_a_container() -> String {
    let t = drainwatch::telemetry::Telemetry::new("test");
    t.record(&drainwatch::model::Emitted::ContainerSeen {
        container: drainwatch::model::ContainerIdentity {
            id: "c1".into(),
            name: "web".into(),
            workload: "web".into(),
            ..Default::default()
        },
    });
    t.encode_openmetrics().unwrap()
}

#[test]
fn every_metric_named_is_one_the_agent_registers() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files: Vec<_> = std::fs::read_dir(root.join("agent/src/telemetry"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    // The Kubernetes watch's metrics, registered only when the API is used.
    files.push(root.join("agent/src/enrich/kube/watch.rs"));
    let source: String = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect();
    // Registered names are the string literals "drainwatch_..." (and the process collector's
    // "process_...") in telemetry/; the exposition adds _total (counters), _info, and
    // _bucket/_sum/_count (histograms).
    let registered: std::collections::BTreeSet<String> = source
        .split('"')
        .filter(|s| {
            (s.starts_with("drainwatch_") || s.starts_with("process_"))
                && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
        .map(str::to_string)
        // Names made from a declaration (the loss kinds'), as the registry itself lists them.
        .chain(
            exposition_with_a_container()
                .lines()
                .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next())
                .map(str::to_string),
        )
        .collect();
    assert!(
        registered.contains("drainwatch_container_stops"),
        "{registered:?}"
    );
    let known = |name: &str| {
        registered.contains(name)
            || ["_total", "_info", "_bucket", "_sum", "_count"]
                .iter()
                .any(|s| name.strip_suffix(s).is_some_and(|b| registered.contains(b)))
    };
    let mut texts: Vec<(String, String)> = dashboards()
        .into_iter()
        .map(|(name, d)| (name, queries(&d).join("\n")))
        .collect();
    texts.push((
        "dashboards/alerts.yaml".into(),
        std::fs::read_to_string(root.join("dashboards/alerts.yaml")).unwrap(),
    ));
    for (name, text) in texts {
        let names = metric_names(&text);
        assert!(!names.is_empty(), "{name}");
        for m in names {
            assert!(known(&m), "{name}: {m} is not a metric the agent registers");
        }
    }
    assert_eq!(
        metric_names("x{drainwatch_a_total} mydrainwatch_b drainwatch_c process_d_bytes"),
        ["drainwatch_a_total", "drainwatch_c", "process_d_bytes"]
    );
}

#[test]
fn dashboards_have_unique_uids_and_panel_ids_and_annotations_select_the_job() {
    let mut uids = std::collections::BTreeSet::new();
    for (name, d) in dashboards() {
        assert!(uids.insert(d["uid"].to_string()), "{name}: uid used twice");
        let mut ids = std::collections::BTreeSet::new();
        for p in d["panels"].as_array().unwrap() {
            assert!(
                ids.insert(p["id"].as_u64().expect("panel id")),
                "{name}: panel id twice"
            );
            assert!(p["gridPos"]["w"].as_u64().is_some(), "{name}: gridPos");
        }
        for a in d["annotations"]["list"].as_array().into_iter().flatten() {
            assert_eq!(
                a["datasource"]["uid"], "${datasource}",
                "{name}: annotation datasource"
            );
            let expr = a["expr"].as_str().unwrap_or_default();
            assert!(expr.contains("job=\"$job\""), "{name}: annotation {expr}");
        }
    }
}
