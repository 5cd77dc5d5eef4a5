//! The rollout gates: the chart's Argo Rollouts AnalysisTemplate and Flagger MetricTemplates.
//!
//! The templates are validated against the projects' own CRD schemas, vendored in
//! tests/schemas/ (their source and commit in each file's `$comment`), strictly: an unknown
//! field is an error, as the API server's strict field validation makes it. Their queries run
//! on a real Prometheus: with no data each reads 0 (never "no value", which Argo counts as an
//! error and Flagger as a halt), and on made-up series (`promtool test rules`) each counts
//! exactly what the workload's series counted within the window. Against real deploys scraped
//! from the real agent, with `drainwatch report --gate`: tests/tests/prometheus_e2e.rs.

use std::process::Command;

use drainwatch::{export::gate::GateKind, model::LossKind};
use drainwatch_tests::{
    gates::{gate_queries, gates_on, of_kind, one_value, rendered},
    ops::{helm_render, repo, tools_venv},
    prometheus::Prometheus,
};
use serde_json::{Value, json};

/// The errors of `doc` against a vendored CRD schema (tests/schemas/<file>), made strict:
/// `additionalProperties: false` wherever the schema lists properties and does not preserve
/// unknown fields. Also checks apiVersion and kind against the CRD's.
fn crd_errors(file: &str, doc: &Value) -> Vec<String> {
    let path = repo().join("tests/schemas").join(file);
    let vendored: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let crd = &vendored["crd"];
    let mut errors = Vec::new();
    let api_version = format!(
        "{}/{}",
        crd["group"].as_str().unwrap(),
        crd["version"].as_str().unwrap()
    );
    if doc["apiVersion"] != api_version.as_str() {
        errors.push(format!(
            "apiVersion {} is not {api_version}",
            doc["apiVersion"]
        ));
    }
    let script = r#"
import json, sys, jsonschema
def strict(s):
    if isinstance(s, list):
        return [strict(x) for x in s]
    if not isinstance(s, dict):
        return s
    s = {k: strict(v) for k, v in s.items()}
    if "properties" in s and "additionalProperties" not in s and not s.get("x-kubernetes-preserve-unknown-fields"):
        s["additionalProperties"] = False
    return s
schema = strict(json.load(open(sys.argv[1]))["openAPIV3Schema"])
doc = json.loads(sys.argv[2])
v = jsonschema.Draft7Validator(schema)
print(json.dumps(["/".join(map(str, e.absolute_path)) + ": " + e.message for e in v.iter_errors(doc)]))
"#;
    let out = Command::new(tools_venv().join("bin/python"))
        .arg("-c")
        .arg(script)
        .arg(&path)
        .arg(doc.to_string())
        .output()
        .expect("python of the deploy tools (jsonschema)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let found: Vec<String> = serde_json::from_slice(&out.stdout).unwrap();
    errors.extend(found);
    errors
}

const ARGO: &str = "argo-rollouts-analysistemplate.json";
const FLAGGER: &str = "flagger-metrictemplate.json";

/// The `{{...}}` placeholders of a text.
fn placeholders(text: &str) -> Vec<String> {
    text.split("{{")
        .skip(1)
        .filter_map(|s| s.split_once("}}").map(|(p, _)| p.trim().to_string()))
        .collect()
}

#[test]
fn the_templates_validate_against_the_argo_rollouts_and_flagger_crds() {
    // Off by default.
    let defaults = rendered(&json!({}));
    for kind in [
        "AnalysisTemplate",
        "ClusterAnalysisTemplate",
        "MetricTemplate",
    ] {
        assert!(
            of_kind(&defaults, kind).is_empty(),
            "{kind} rendered by default"
        );
    }
    let docs = rendered(&gates_on());
    let argo = of_kind(&docs, "AnalysisTemplate");
    assert_eq!(argo.len(), 1);
    let at = argo[0];
    assert_eq!(at["metadata"]["name"], "drainwatch-connection-loss");
    assert_eq!(at["metadata"]["namespace"], "drainwatch");
    let errors = crd_errors(ARGO, at);
    assert!(
        errors.is_empty(),
        "AnalysisTemplate against Argo Rollouts' CRD: {errors:#?}"
    );
    let flagger = of_kind(&docs, "MetricTemplate");
    assert_eq!(flagger.len(), GateKind::ALL.len());
    for mt in &flagger {
        let errors = crd_errors(FLAGGER, mt);
        assert!(
            errors.is_empty(),
            "{} against Flagger's CRD: {errors:#?}",
            mt["metadata"]["name"]
        );
    }
    // The validation is strict and reads the types: each of these is refused.
    let mut typo = at.clone();
    let m = typo["spec"]["metrics"][0].as_object_mut().unwrap();
    let c = m.remove("successCondition").unwrap();
    m.insert("successCondtion".into(), c);
    let mut list_count = at.clone();
    list_count["spec"]["metrics"][0]["count"] = json!([1]);
    let mut no_provider = at.clone();
    no_provider["spec"]["metrics"][0]
        .as_object_mut()
        .unwrap()
        .remove("provider");
    let mut wrong_group = at.clone();
    wrong_group["apiVersion"] = json!("argoproj.io/v1");
    for (what, doc) in [
        ("a misspelt field", typo),
        ("count as a list", list_count),
        ("a metric without provider", no_provider),
        ("another API version", wrong_group),
    ] {
        assert!(!crd_errors(ARGO, &doc).is_empty(), "{what} passed");
    }
    let mut bad_type = flagger[0].clone();
    bad_type["spec"]["provider"]["type"] = json!("prometheus2");
    let mut no_query = flagger[0].clone();
    no_query["spec"].as_object_mut().unwrap().remove("query");
    for (what, doc) in [("an unknown provider", bad_type), ("no query", no_query)] {
        assert!(!crd_errors(FLAGGER, &doc).is_empty(), "{what} passed");
    }

    // Argo: every placeholder is an arg it declares; only namespace and workload must be given.
    let args: Vec<&str> = at["spec"]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    let required: Vec<&str> = at["spec"]["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a.get("value").is_none())
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(required, ["namespace", "workload"]);
    for p in placeholders(&at["spec"]["metrics"].to_string()) {
        let name = p
            .strip_prefix("args.")
            .unwrap_or_else(|| panic!("{{{{{p}}}}} is no arg"));
        assert!(
            args.contains(&name),
            "{{{{args.{name}}}}} is not declared: {args:?}"
        );
    }
    // Flagger: only what its MetricTemplateModel offers.
    for mt in &flagger {
        for p in placeholders(mt["spec"]["query"].as_str().unwrap()) {
            assert!(
                ["namespace", "target", "interval"].contains(&p.as_str()),
                "{{{{{p}}}}}"
            );
        }
    }

    // The gates are the command's, each a metric in both, and every kind of loss that costs a
    // user's connection has one.
    let names: Vec<&str> = at["spec"]["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, GateKind::ALL.map(GateKind::name));
    for (name, mt) in names.iter().zip(&flagger) {
        assert_eq!(mt["metadata"]["name"], format!("drainwatch-{name}"));
        assert!(args.contains(&format!("max-{name}").as_str()));
    }
    let queries = at["spec"]["metrics"].to_string();
    for k in LossKind::ALL.iter().filter(|k| k.info().lost) {
        assert!(
            queries.contains(&format!("{}_total{{", k.metric())),
            "no gate on {k:?}"
        );
    }
    for m in [
        "drainwatch_retry_duplicates_total{",
        "outcome=\\\"killed_at_deadline\\\"",
    ] {
        assert!(queries.contains(m), "{m}");
    }

    // A ClusterAnalysisTemplate for every namespace, and other places and settings.
    let docs = rendered(&json!({"rolloutGates": {
        "prometheusAddress": "http://prometheus.obs:9090", "window": "30m",
        "argoRollouts": {"enabled": true, "clusterScope": true, "interval": "", "count": 0},
        "flagger": {"enabled": true, "namespace": "flagger-system"}}}));
    let cat = of_kind(&docs, "ClusterAnalysisTemplate");
    assert_eq!(cat.len(), 1);
    assert!(cat[0]["metadata"].get("namespace").is_none());
    let m = &cat[0]["spec"]["metrics"][0];
    assert!(
        m.get("interval").is_none() && m.get("count").is_none(),
        "one measurement: {m}"
    );
    assert_eq!(
        m["provider"]["prometheus"]["address"],
        "http://prometheus.obs:9090"
    );
    assert!(crd_errors(ARGO, cat[0]).is_empty());
    for mt in of_kind(&docs, "MetricTemplate") {
        assert_eq!(mt["metadata"]["namespace"], "flagger-system");
    }
    let window = cat[0]["spec"]["args"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "window")
        .unwrap();
    assert_eq!(window["value"], "30m");
    let docs = rendered(&json!({"rolloutGates": {"argoRollouts": {"enabled": true, "count": 10}}}));
    assert_eq!(
        of_kind(&docs, "AnalysisTemplate")[0]["spec"]["metrics"][0]["count"],
        10
    );
    // The values schema refuses misspelt keys and wrong types.
    for values in [
        json!({"rolloutGates": {"argo": {"enabled": true}}}),
        json!({"rolloutGates": {"window": "ten minutes"}}),
        json!({"rolloutGates": {"flagger": {"enabled": "yes"}}}),
        json!({"rolloutGates": {"argoRollouts": {"count": -1}}}),
    ] {
        let err = helm_render("drainwatch", "drainwatch", &values)
            .err()
            .unwrap_or_else(|| panic!("{values} passed the schema"));
        assert!(err.contains("- at '"), "{err}");
    }
}

#[test]
fn every_gate_query_reads_zero_without_data() {
    let prom = Prometheus::start(&[], &[]);
    let queries = gate_queries("shop", "web", "10m");
    assert_eq!(queries.len(), 2 * GateKind::ALL.len());
    for q in &queries {
        assert_eq!(one_value(&prom, q), 0.0, "{} {}", q.tool, q.name);
    }
}

/// `promtool test rules` on made-up series: each gate counts exactly what the workload's series
/// counted within the window, whatever their shape.
#[test]
fn the_gate_queries_count_exactly_what_each_series_counted_in_the_window() {
    let series = |metric: &str, labels: &str, values: &str| {
        json!({"series": format!("{metric}{{job=\"drainwatch\",namespace=\"shop\",{labels}}}"),
               "values": values})
    };
    let cut = "drainwatch_stop_inflight_cut_total";
    let dup = "drainwatch_retry_duplicates_total";
    let stops = "drainwatch_container_stops_total";
    let input = [
        // Created at 0 when its container was found, 4 at its stop, forgotten at 9m: 4.
        series(
            cut,
            "workload=\"web\",container=\"web\",instance=\"n1\"",
            "0x5 4x2 stale",
        ),
        // 2 before the window (its start: 2m), 5 in it: 3.
        series(
            cut,
            "workload=\"web\",container=\"web\",instance=\"n2\"",
            "2x4 5x10",
        ),
        // Its agent restarted at 7m (a reset): 1 → 7, then 0 → 2: 8.
        series(
            cut,
            "workload=\"web\",container=\"web\",instance=\"n3\"",
            "1x3 7x2 0 2x5",
        ),
        // Another workload; Flagger's target's primary (2, for Flagger only).
        series(
            cut,
            "workload=\"cart\",container=\"cart\",instance=\"n1\"",
            "0 9x10",
        ),
        series(
            cut,
            "workload=\"web-primary\",container=\"web\",instance=\"n4\"",
            "0x5 2x6",
        ),
        // A proxy's series appears already counted at its first duplicate: 3; another: 6 - 2.
        series(
            dup,
            "workload=\"web\",container=\"web\",proxy=\"nginx\",instance=\"n1\"",
            "_x5 1 1 3 3 stale",
        ),
        series(
            dup,
            "workload=\"web\",container=\"web\",proxy=\"haproxy\",instance=\"n2\"",
            "2x4 6x10",
        ),
        // One stop killed at its deadline; three drained.
        series(
            stops,
            "workload=\"web\",container=\"web\",outcome=\"killed_at_deadline\",instance=\"n1\"",
            "0x6 1x2 stale",
        ),
        series(
            stops,
            "workload=\"web\",container=\"web\",outcome=\"drained\",instance=\"n1\"",
            "0x6 3x2 stale",
        ),
    ];
    let expected = |tool: &str, gate: &str| -> u64 {
        match (tool, gate) {
            ("argo", "requests-cut") => 4 + 3 + 8,
            ("flagger", "requests-cut") => 4 + 3 + 8 + 2,
            (_, "retry-duplicates") => 3 + 4,
            (_, "sigkills") => 1,
            _ => 0,
        }
    };
    let mut tests = Vec::new();
    for q in gate_queries("shop", "web", "10m") {
        // At 12m the window is 2m–12m; at 30m nothing is left in it.
        for (at, value) in [("12m", expected(q.tool, &q.name)), ("30m", 0)] {
            tests.push(json!({"expr": q.query, "eval_time": at,
                "exp_samples": [{"labels": "{}", "value": value}]}));
        }
    }
    let file = std::env::temp_dir().join(format!("drainwatch-gates-{}.yaml", std::process::id()));
    let doc = json!({"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": input, "promql_expr_test": tests}]});
    std::fs::write(&file, doc.to_string()).unwrap();
    let out = Command::new("promtool")
        .args(["test", "rules"])
        .arg(&file)
        .output()
        .expect("promtool");
    let _ = std::fs::remove_file(&file);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
