//! Every Grafana dashboard under dashboards/ follows the project's conventions (see
//! shared/REFERENCE.md): fixed short uid, null id, a datasource variable every target uses,
//! $__rate_interval for rates, a unit and a description on every panel, tags, UTC.

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
                assert!(expr.contains("drainwatch_"), "{name}/{title}: {expr}");
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
