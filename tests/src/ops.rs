//! What the tests of `deploy/` and `dashboards/` share: the repository's files, YAML read as
//! JSON values, and the tools `cargo xtask setup` installs for them.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use serde::Deserialize as _;
use serde_json::Value;

/// The workspace root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The Python environment `cargo xtask setup` creates for the deploy tools
/// (kubernetes-validate, helm-python-sdk). `DRAINWATCH_TOOLS_VENV` overrides it.
pub fn tools_venv() -> PathBuf {
    let venv = std::env::var_os("DRAINWATCH_TOOLS_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/drainwatch-tools/venv"));
    assert!(
        venv.join("bin/python").exists(),
        "{} is missing: `cargo xtask setup` creates it (kubernetes-validate, helm-python-sdk)",
        venv.display()
    );
    venv
}

/// Every document of a YAML stream (empty documents dropped), as JSON values.
pub fn yaml_docs(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("YAML: {e}\n{text}")))
        .filter(|v| !v.is_null())
        .collect()
}

pub fn yaml_file(rel: &str) -> Vec<Value> {
    let path = repo().join(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    yaml_docs(&text)
}

/// The one object of `kind` (and `name`, if given) among `docs`.
pub fn object<'a>(docs: &'a [Value], kind: &str, name: Option<&str>) -> &'a Value {
    let found: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == kind && name.is_none_or(|n| d["metadata"]["name"] == n))
        .collect();
    assert_eq!(found.len(), 1, "exactly one {kind} {name:?}");
    found[0]
}

/// Runs `cmd`, failing the test with its output unless it exits 0.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("could not start {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The Helm chart rendered offline by Helm's own engine (helm-python-sdk binds Helm's Go SDK:
/// no `helm` binary can be installed here), as `helm template` would: one YAML stream with
/// `# Source:` lines. `values` is a JSON object of overrides.
pub fn helm_template(release: &str, namespace: &str, values: &Value) -> String {
    let script = r#"
import json, sys
import helm_python as helm
chart_dir, release, namespace, values = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
report = helm.lint(chart_dir, values, strict=True, namespace=namespace)
problems = [m for m in report["messages"] if m["severity"] >= 2] + [{"error": e} for e in report["errors"]]
if problems:
    sys.exit("helm lint: " + json.dumps(problems, indent=1))
chart = helm.Chart.load(chart_dir)
out = chart.render(values, name=release, namespace=namespace, is_install=True)
for path in sorted(out):
    text = out[path].strip()
    if text and not path.endswith("NOTES.txt"):
        print("---\n# Source: " + path + "\n" + text)
"#;
    let chart = repo().join("deploy/helm/drainwatch");
    let out = run_ok(
        Command::new(tools_venv().join("bin/python"))
            .arg("-c")
            .arg(script)
            .arg(&chart)
            .args([release, namespace, &values.to_string()]),
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// Every file the chart renders (NOTES.txt included) by path, or why Helm refused: the values
/// checked against the chart's values.schema.json first, as `helm install` does.
pub fn helm_render(
    release: &str,
    namespace: &str,
    values: &Value,
) -> Result<std::collections::BTreeMap<String, String>, String> {
    let script = r#"
import json, sys
import helm_python as helm
chart_dir, release, namespace, values = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
chart = helm.Chart.load(chart_dir)
try:
    chart.validate_schema(values)
    out = chart.render(values, name=release, namespace=namespace, is_install=True)
except Exception as e:
    sys.exit(str(e))
print(json.dumps(out))
"#;
    let chart = repo().join("deploy/helm/drainwatch");
    let out = Command::new(tools_venv().join("bin/python"))
        .arg("-c")
        .arg(script)
        .arg(&chart)
        .args([release, namespace, &values.to_string()])
        .output()
        .expect("python of the deploy tools");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).expect("rendered files as JSON"))
}

/// The DaemonSet's pod spec and its agent container (`drainwatch`), from
/// deploy/kubernetes/drainwatch.yaml.
pub fn manifest_agent() -> (Value, Value) {
    let docs = yaml_file("deploy/kubernetes/drainwatch.yaml");
    let pod = object(&docs, "DaemonSet", Some("drainwatch"))["spec"]["template"]["spec"].clone();
    let agent = pod["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .find(|c| c["name"] == "drainwatch")
        .expect("container drainwatch")
        .clone();
    (pod, agent)
}

/// The capabilities the DaemonSet's agent container adds (names as Kubernetes writes them:
/// `BPF`, `SYS_PTRACE`), after checking it drops all others.
pub fn manifest_capabilities() -> Vec<String> {
    let (_, agent) = manifest_agent();
    let caps = &agent["securityContext"]["capabilities"];
    assert_eq!(caps["drop"], serde_json::json!(["ALL"]), "drop: [ALL]");
    caps["add"]
        .as_array()
        .expect("capabilities.add")
        .iter()
        .map(|c| c.as_str().expect("capability name").to_string())
        .collect()
}

/// A process's effective capabilities, decoded by `capsh` (e.g. `cap_bpf`).
pub fn effective_caps(pid: u32) -> BTreeSet<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .expect("CapEff")
        .trim()
        .to_string();
    let out = Command::new("capsh")
        .arg(format!("--decode={hex}"))
        .output()
        .expect("capsh");
    let text = String::from_utf8_lossy(&out.stdout);
    // "0x000000c000080004=cap_dac_read_search,cap_sys_ptrace,cap_perfmon,cap_bpf"
    text.trim()
        .split_once('=')
        .map(|(_, names)| names.split(',').map(str::to_string).collect())
        .unwrap_or_default()
}
