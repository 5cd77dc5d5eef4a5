//! The rollout gates as the tests run them: the chart's AnalysisTemplate and MetricTemplates
//! rendered with the gates on, their queries with the arguments filled in as Argo Rollouts and
//! Flagger fill them, and `drainwatch report --gate` against an agent.

use std::process::Command;

use serde_json::{Value, json};

use crate::{
    agent::{Agent, binary},
    ops::{helm_template, yaml_docs},
    prometheus::{Prometheus, unix_now},
};

/// Values that switch both on.
pub fn gates_on() -> Value {
    json!({"rolloutGates": {"argoRollouts": {"enabled": true}, "flagger": {"enabled": true}}})
}

/// The chart rendered (release and namespace `drainwatch`), as objects.
pub fn rendered(values: &Value) -> Vec<Value> {
    yaml_docs(&helm_template("drainwatch", "drainwatch", values))
}

pub fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

/// A gate's query and how it passes.
pub struct GateQuery {
    /// `argo` or `flagger`.
    pub tool: &'static str,
    /// The gate (`requests-cut`, ...).
    pub name: String,
    pub query: String,
    /// Argo's successCondition (`result[0] <= N`), its N; Flagger: the thresholdRange max the
    /// templates document, 0.
    pub max: f64,
}

/// Every gate of both tools for `workload` (namespace "" outside Kubernetes) over `window`,
/// with the AnalysisTemplate's defaults for the other args.
pub fn gate_queries(namespace: &str, workload: &str, window: &str) -> Vec<GateQuery> {
    let docs = rendered(&gates_on());
    let at = of_kind(&docs, "AnalysisTemplate")[0];
    let arg = |name: &str| -> String {
        at["spec"]["args"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == name)
            .and_then(|a| a["value"].as_str())
            .unwrap_or_else(|| panic!("arg {name} has a default"))
            .to_string()
    };
    let mut out = Vec::new();
    for m in at["spec"]["metrics"].as_array().unwrap() {
        let name = m["name"].as_str().unwrap().to_string();
        let cond = m["successCondition"].as_str().unwrap();
        assert_eq!(cond, format!("result[0] <= {{{{args.max-{name}}}}}"));
        let max: f64 = arg(&format!("max-{name}")).parse().unwrap();
        assert_eq!(max, 0.0, "zero by default");
        assert_eq!(m["failureLimit"], 0);
        let query = m["provider"]["prometheus"]["query"]
            .as_str()
            .unwrap()
            .replace("{{args.namespace}}", namespace)
            .replace("{{args.workload}}", workload)
            .replace("{{args.window}}", window);
        out.push(GateQuery {
            tool: "argo",
            name,
            query,
            max,
        });
    }
    for mt in of_kind(&docs, "MetricTemplate") {
        let name = mt["metadata"]["name"]
            .as_str()
            .unwrap()
            .trim_start_matches("drainwatch-")
            .to_string();
        let query = mt["spec"]["query"]
            .as_str()
            .unwrap()
            .replace("{{ namespace }}", namespace)
            .replace("{{ target }}", workload)
            .replace("{{ interval }}", window);
        out.push(GateQuery {
            tool: "flagger",
            name,
            query,
            max: 0.0,
        });
    }
    out
}

/// A gate query's one value now (a gate always answers exactly one sample).
pub fn one_value(prom: &Prometheus, q: &GateQuery) -> f64 {
    let result = prom.query(&q.query, unix_now());
    assert_eq!(
        result.len(),
        1,
        "{} {}: one sample, got {result:?} for\n{}",
        q.tool,
        q.name,
        q.query
    );
    result[0]["value"][1].as_str().unwrap().parse().unwrap()
}

/// `drainwatch report --gate <workload> --since 10m` against `agent`: its exit code and its
/// one line.
pub fn gate_command(agent: &Agent, workload: &str, extra: &[&str]) -> (i32, String) {
    let out = Command::new(binary())
        .args(["report", "--agent", &format!("127.0.0.1:{}", agent.port)])
        .args(["--gate", workload, "--since", "10m"])
        .args(extra)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        text.lines().count(),
        1,
        "one line: {text:?} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text.trim_end().to_string())
}

/// What a stop record counts toward each gate (the agent's own record: to check a query
/// reads the same).
pub fn record_count(stop: &Value, gate: &str) -> u64 {
    let loss = |k: &str| stop["loss"][k].as_u64().unwrap_or(0);
    match gate {
        "requests-cut" => loss("inflight_cut"),
        "streams-cut" => loss("streams_cut"),
        "sessions-cut" => loss("sessions_cut"),
        "refused" => loss("refused"),
        "unreachable" => loss("unreachable"),
        "no-endpoints" => loss("no_endpoints"),
        "sent-after-close" => loss("sent_after_close"),
        "retry-duplicates" => loss("retry_duplicates"),
        "sigkills" => u64::from(stop["outcome"] == "killed_at_deadline"),
        other => panic!("no gate {other}"),
    }
}
