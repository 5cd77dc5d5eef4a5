//! deploy/: the plain manifests and the Helm chart. Every object validates against the
//! Kubernetes schemas (kubernetes-validate, strict, oldest and newest Kubernetes it ships); the
//! chart's defaults render the plain manifest's objects; the Prometheus Operator objects select
//! what they should and carry dashboards/alerts.yaml; the DaemonSet is least-privilege.
//!
//! PodMonitor and PrometheusRule are custom resources: kubernetes-validate has no schema for
//! them and says so (a warning, printed by the test). They are checked here instead: the
//! PodMonitor against the DaemonSet it scrapes, the PrometheusRule's groups for equality with
//! dashboards/alerts.yaml, which `promtool` checks and unit-tests (tests/tests/alerts.rs).

use std::{path::Path, process::Command};

use drainwatch_tests::ops::{
    helm_render, helm_template, manifest_capabilities, object, repo, run_ok, tools_venv, yaml_docs,
    yaml_file,
};
use serde_json::{Value, json};

/// Kubernetes versions to validate against: the oldest and newest kubernetes-validate ships
/// schemas for, and the chart's kubeVersion floor.
const KUBE_VERSIONS: [&str; 2] = ["1.25", "1.37"];

/// The custom resources kubernetes-validate has no schema for (the rollout gates' are validated
/// against their CRDs in tests/tests/rollout_gates.rs).
const CUSTOM_KINDS: [&str; 4] = [
    "PodMonitor",
    "PrometheusRule",
    "AnalysisTemplate",
    "MetricTemplate",
];

/// Runs kubernetes-validate --strict on `file`; fails on any error, and on a warning about
/// anything but the custom resources (printed as the documented exception). Returns how many
/// objects passed.
fn validate(file: &Path, version: &str) -> usize {
    let out = Command::new(tools_venv().join("bin/kubernetes-validate"))
        .args(["--strict", "-k", version])
        .arg(file)
        .output()
        .expect("kubernetes-validate (cargo xtask setup installs it)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && !text.contains("ERROR"),
        "kubernetes-validate -k {version} {}:\n{text}",
        file.display()
    );
    for line in text.lines().filter(|l| l.starts_with("WARN")) {
        assert!(
            CUSTOM_KINDS
                .iter()
                .any(|k| line.contains(&format!("schema for kind {k} "))),
            "unexpected warning: {line}"
        );
        println!("not validated by kubernetes-validate (a custom resource, checked below): {line}");
    }
    text.lines()
        .filter(|l| l.starts_with("INFO") && l.contains(" passed for resource "))
        .count()
}

fn count_kinds(docs: &[Value], custom: bool) -> usize {
    docs.iter()
        .filter(|d| CUSTOM_KINDS.contains(&d["kind"].as_str().unwrap_or("")) == custom)
        .count()
}

#[test]
fn plain_manifests_validate_against_the_kubernetes_schemas() {
    for file in [
        "deploy/kubernetes/drainwatch.yaml",
        "deploy/kubernetes/monitoring.yaml",
        "deploy/kubernetes/dashboards.yaml",
    ] {
        let docs = yaml_file(file);
        for version in KUBE_VERSIONS {
            assert_eq!(
                validate(&repo().join(file), version),
                count_kinds(&docs, false),
                "{file}: every built-in object passed against {version}"
            );
        }
    }
}

fn rendered(values: &Value) -> (tempfile_path::TempFile, Vec<Value>) {
    let text = helm_template("drainwatch", "drainwatch", values);
    let file = tempfile_path::TempFile::with(&text);
    (file, yaml_docs(&text))
}

/// A file in the system temp dir, removed on drop (std only).
mod tempfile_path {
    pub struct TempFile(pub std::path::PathBuf);
    impl TempFile {
        pub fn with(text: &str) -> Self {
            static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let path = std::env::temp_dir()
                .join(format!("drainwatch-chart-{}-{n}.yaml", std::process::id()));
            std::fs::write(&path, text).expect("write the rendered chart");
            Self(path)
        }
    }
    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

fn all_on() -> Value {
    json!({"podMonitor": {"enabled": true}, "prometheusRule": {"enabled": true}})
}

#[test]
fn the_rendered_chart_validates_with_defaults_and_with_every_option() {
    let every_option = json!({
        "podMonitor": {"enabled": true, "labels": {"release": "kube-prometheus-stack"},
            "namespace": "monitoring", "interval": "30s", "scrapeTimeout": "20s",
            "relabelings": [{"targetLabel": "cluster", "replacement": "prod"}],
            "metricRelabelings": [{"action": "drop", "sourceLabels": ["__name__"],
                "regex": "drainwatch_ebpf_faults_total"}]},
        "prometheusRule": {"enabled": true, "labels": {"release": "kube-prometheus-stack"},
            "namespace": "monitoring"},
        "dashboards": {"enabled": true, "label": "grafana_dashboard", "labelValue": "1",
            "namespace": "monitoring", "labels": {"team": "sre"},
            "annotations": {"grafana_folder": "drainwatch"}},
        "updateStrategy": {"type": "RollingUpdate",
            "rollingUpdate": {"maxUnavailable": "10%", "maxSurge": 0}},
        "serviceAccount": {"create": true, "name": "dw", "annotations": {"a": "b"}},
        "image": {"tag": "9.9.9"},
        "imagePullSecrets": [{"name": "pull"}],
        "extraEnv": [{"name": "DRAINWATCH_LOG", "value": "debug"}],
        "hostNetwork": true,
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}},
        "priorityClassName": "node-agents",
        "podAnnotations": {"x": "y"},
        "podLabels": {"team": "sre"},
        "seccompProfile": {"type": "RuntimeDefault"},
        "runtimeStateDirs": [{"name": "docker-containers", "path": "/var/lib/docker/containers"}],
        "rbac": {"create": true, "viewer": true},
        "auth": {"metricsReaders": [{"kind": "ServiceAccount", "name": "prometheus-k8s",
            "namespace": "monitoring"}], "allowedHosts": ["drainwatch.drainwatch.svc"]},
        "networkPolicy": {"namespaceSelector": {"matchLabels": {"team": "sre"}},
            "apiServerCIDRs": ["10.0.0.0/24", "fd00::/64"]},
        "rolloutGates": {"prometheusAddress": "http://prometheus.monitoring:9090",
            "window": "15m", "argoRollouts": {"enabled": true, "namespace": "shop"},
            "flagger": {"enabled": true, "namespace": "shop"}},
    });
    let all_off = json!({"rbac": {"create": false}, "serviceAccount": {"create": false},
        "service": {"enabled": false}, "auth": {"enabled": false},
        "networkPolicy": {"enabled": false}});
    let auth_without_metrics = json!({"auth": {"metrics": false}, "podMonitor": {"enabled": true}});
    for (what, values, kinds) in [
        ("defaults", json!({}), 9),
        ("Prometheus Operator objects on", all_on(), 14),
        // The gates: an AnalysisTemplate and 9 MetricTemplates.
        ("every option", every_option, 27),
        ("auth without /metrics", auth_without_metrics, 9),
        ("everything optional off", all_off, 1),
    ] {
        let (file, docs) = rendered(&values);
        let names: Vec<String> = docs
            .iter()
            .map(|d| format!("{}/{}", d["kind"], d["metadata"]["name"]))
            .collect();
        assert_eq!(docs.len(), kinds, "{what}: objects rendered: {names:?}");
        for version in KUBE_VERSIONS {
            assert_eq!(
                validate(&file.0, version),
                count_kinds(&docs, false),
                "{what}: every built-in object passed against {version}"
            );
        }
    }
}

#[test]
fn the_chart_defaults_render_the_plain_manifest() {
    let mut plain = yaml_file("deploy/kubernetes/drainwatch.yaml");
    plain.extend(yaml_file("deploy/kubernetes/monitoring.yaml"));
    let (_, chart) = rendered(&all_on());
    // The chart leaves the namespace to `helm install --create-namespace`.
    assert_eq!(plain.len(), chart.len() + 1);
    for c in &chart {
        let (kind, name) = (
            c["kind"].as_str().unwrap(),
            c["metadata"]["name"].as_str().unwrap(),
        );
        let p = object(&plain, kind, Some(name));
        assert_eq!(p["apiVersion"], c["apiVersion"], "{kind} {name}");
        assert_eq!(
            p["metadata"]["namespace"], c["metadata"]["namespace"],
            "{kind} {name} namespace"
        );
        for field in ["spec", "rules", "roleRef", "subjects", "type"] {
            assert_eq!(
                p[field], c[field],
                "{kind} {name}.{field}: plain manifest vs chart defaults"
            );
        }
        assert_eq!(
            p["metadata"]["annotations"], c["metadata"]["annotations"],
            "{kind} {name} annotations"
        );
    }
    let ns = object(&plain, "Namespace", Some("drainwatch"));
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "privileged"
    );
}

#[test]
fn every_copy_of_the_alert_rules_is_dashboards_alerts() {
    let alerts = yaml_file("dashboards/alerts.yaml");
    let groups = &alerts[0]["groups"];
    let copy = std::fs::read(repo().join("deploy/helm/drainwatch/files/alerts.yaml")).unwrap();
    let original = std::fs::read(repo().join("dashboards/alerts.yaml")).unwrap();
    assert!(
        copy == original,
        "deploy/helm/drainwatch/files/alerts.yaml differs from dashboards/alerts.yaml: copy it"
    );
    let plain = yaml_file("deploy/kubernetes/monitoring.yaml");
    let (_, chart) = rendered(&all_on());
    for (what, docs) in [("plain", &plain), ("chart", &chart)] {
        let rule = object(docs, "PrometheusRule", Some("drainwatch"));
        assert_eq!(&rule["spec"]["groups"], groups, "{what} PrometheusRule");
        // The spec as Prometheus would load it.
        let file = tempfile_path::TempFile::with(&rule["spec"].to_string());
        run_ok(
            Command::new("promtool")
                .args(["check", "rules"])
                .arg(&file.0),
        );
    }
}

#[test]
fn the_pod_monitor_scrapes_the_daemonset_as_the_job_the_rules_select() {
    let mut docs = yaml_file("deploy/kubernetes/drainwatch.yaml");
    docs.extend(yaml_file("deploy/kubernetes/monitoring.yaml"));
    let pm = &object(&docs, "PodMonitor", None)["spec"];
    let pod = &object(&docs, "DaemonSet", None)["spec"]["template"];
    let labels = pod["metadata"]["labels"].as_object().unwrap();
    for (k, v) in pm["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(labels.get(k), Some(v), "selector {k}");
    }
    let job_label = pm["jobLabel"].as_str().expect("jobLabel");
    assert_eq!(labels[job_label], "drainwatch", "job=\"drainwatch\"");
    let ports: Vec<&Value> = pod["spec"]["containers"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| &p["name"])
        .collect();
    let endpoint = &pm["podMetricsEndpoints"][0];
    assert!(
        ports.contains(&&endpoint["port"]),
        "port {}",
        endpoint["port"]
    );
    assert_eq!(endpoint["path"], "/metrics");
    // The agent's namespace/container labels name the watched workloads: the pod's own target
    // labels must not replace them.
    assert_eq!(endpoint["honorLabels"], true);
    let svc = &object(&docs, "Service", None)["spec"];
    assert_eq!(svc["selector"], pm["selector"]["matchLabels"]);
}

#[test]
fn the_daemonset_is_least_privilege_and_complete() {
    let docs = yaml_file("deploy/kubernetes/drainwatch.yaml");
    let role = object(&docs, "ClusterRole", Some("drainwatch"));
    assert_eq!(
        role["rules"],
        json!([
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}
        ])
    );
    let spec = &object(&docs, "DaemonSet", None)["spec"]["template"]["spec"];
    assert_eq!(spec["hostPID"], true);
    assert!(spec["hostNetwork"].is_null(), "no hostNetwork");
    assert_eq!(
        spec["tolerations"],
        json!([{"operator": "Exists"}]),
        "every taint"
    );
    assert!(spec["terminationGracePeriodSeconds"].as_u64().is_some());
    // Evicted last under node pressure, like the node's other agents.
    assert_eq!(spec["priorityClassName"], "system-node-critical");
    let c = &spec["containers"][0];
    let sc = &c["securityContext"];
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(
        manifest_capabilities(),
        ["BPF", "PERFMON", "SYS_PTRACE", "DAC_READ_SEARCH"]
    );
    // Confined: the Localhost profile shipped in deploy/seccomp/, flat (no conditions on
    // capabilities or architectures: containerd reads a profile as the OCI runtime spec's
    // seccomp object and would ignore them), denying by default.
    assert_eq!(sc["seccompProfile"]["type"], "Localhost");
    let profile = repo()
        .join("deploy/seccomp")
        .join(sc["seccompProfile"]["localhostProfile"].as_str().unwrap());
    let profile: Value = serde_json::from_str(&std::fs::read_to_string(&profile).unwrap()).unwrap();
    assert_eq!(profile["defaultAction"], "SCMP_ACT_ERRNO");
    let rules = profile["syscalls"].as_array().unwrap();
    for rule in rules {
        for key in rule.as_object().unwrap().keys() {
            assert!(
                ["names", "action", "errnoRet", "args"].contains(&key.as_str()),
                "{key} in {rule}"
            );
        }
    }
    assert!(rules.iter().any(
        |r| r["action"] == "SCMP_ACT_ALLOW" && r["names"] == json!(["bpf", "perf_event_open"])
    ));
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(c[probe]["httpGet"]["path"], path);
        assert_eq!(c[probe]["httpGet"]["port"], "metrics");
    }
    for kind in ["requests", "limits"] {
        for r in ["cpu", "memory"] {
            assert!(c["resources"][kind][r].is_string(), "resources.{kind}.{r}");
        }
    }
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        c["image"],
        format!("ghcr.io/drainwatch/drainwatch:{version}")
    );
    let chart = yaml_file("deploy/helm/drainwatch/Chart.yaml");
    assert_eq!(chart[0]["appVersion"], version);

    // Every host path mounted read-only, at the place the agent's flags point to.
    let volumes = spec["volumes"].as_array().unwrap();
    let mounts = c["volumeMounts"].as_array().unwrap();
    let host_path_at = |mount_path: &str| -> String {
        let m = mounts
            .iter()
            .find(|m| m["mountPath"] == mount_path)
            .unwrap_or_else(|| panic!("nothing mounted at {mount_path}"));
        let v = volumes.iter().find(|v| v["name"] == m["name"]).unwrap();
        v["hostPath"]["path"].as_str().unwrap().to_string()
    };
    // Read-only, but for the agent's own state directory (its checkpoint, --state-dir).
    for m in mounts.iter().filter(|m| m["name"] != "state") {
        assert_eq!(m["readOnly"], true, "{} read-only", m["name"]);
    }
    let env: Vec<(String, Value)> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap().to_string(), e.clone()))
        .collect();
    let var = |name: &str| -> String {
        env.iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("env {name}"))
            .1["value"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(host_path_at(&var("DRAINWATCH_PROCFS_ROOT")), "/proc");
    assert_eq!(
        host_path_at(&var("DRAINWATCH_CGROUPFS_ROOT")),
        "/sys/fs/cgroup"
    );
    let btf = var("DRAINWATCH_BTF");
    assert_eq!(
        host_path_at(btf.strip_suffix("/vmlinux").unwrap()),
        "/sys/kernel/btf"
    );
    assert_eq!(
        host_path_at(&var("DRAINWATCH_STATE_DIR")),
        "/var/lib/drainwatch",
        "the checkpoint outlives the pod"
    );
    let strategy = &object(&docs, "DaemonSet", None)["spec"]["updateStrategy"];
    assert_eq!(strategy["type"], "RollingUpdate");
    assert_eq!(
        strategy["rollingUpdate"]["maxSurge"], 0,
        "never two agents on a node"
    );
    // The agent (and aya) look for tracefs at /sys/kernel/tracing only.
    assert_eq!(host_path_at("/sys/kernel/tracing"), "/sys/kernel/tracing");
    let host_root = var("DRAINWATCH_HOST_ROOT");
    for m in mounts.iter().filter(|m| {
        m["mountPath"]
            .as_str()
            .is_some_and(|p| p.starts_with(&format!("{host_root}/")))
    }) {
        let at = m["mountPath"].as_str().unwrap();
        assert_eq!(
            format!("{host_root}{}", host_path_at(at)),
            at,
            "{at}: host paths under --host-root keep their place"
        );
    }
    assert_eq!(
        var("DRAINWATCH_LISTEN"),
        format!("0.0.0.0:{}", c["ports"][0]["containerPort"])
    );
    let node = env
        .iter()
        .find(|(n, _)| n == "NODE_NAME")
        .expect("NODE_NAME");
    assert_eq!(
        node.1["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );
    // Every DRAINWATCH_* variable is one the agent reads.
    let cli = std::fs::read_to_string(repo().join("agent/src/cli.rs")).unwrap();
    for (name, _) in env.iter().filter(|(n, _)| n.starts_with("DRAINWATCH_")) {
        assert!(
            cli.contains(&format!("env = \"{name}\"")),
            "{name} is no flag of the agent"
        );
    }
}

/// The dashboards of dashboards/, in the order of their file names.
fn dashboard_files() -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = std::fs::read_dir(repo().join("dashboards"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .collect();
    files.sort();
    assert!(files.len() >= 2, "{files:?}");
    files
}

/// deploy/kubernetes/dashboards.yaml as it must read: one ConfigMap per dashboard, as the
/// chart renders them with `dashboards.enabled=true` (without Helm's labels).
fn dashboards_manifest() -> String {
    let mut out = String::from(
        "# The Grafana dashboards of dashboards/ as ConfigMaps for Grafana's dashboard sidecar\n\
         # (kube-prometheus-stack loads every ConfigMap labelled grafana_dashboard: \"1\" in its\n\
         # namespace, or everywhere with sidecar.dashboards.searchNamespace: ALL). Written by\n\
         # tests/tests/deploy.rs from dashboards/*.json: do not edit; after changing a dashboard run\n\
         # DRAINWATCH_WRITE_MANIFESTS=1 cargo test -p drainwatch-tests --test deploy dashboards\n",
    );
    for (name, text) in dashboard_files() {
        let short = name
            .trim_end_matches(".json")
            .trim_start_matches("drainwatch-");
        out += &format!(
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: drainwatch-{short}\n  \
             namespace: drainwatch\n  labels:\n    app.kubernetes.io/name: drainwatch\n    \
             grafana_dashboard: \"1\"\ndata:\n  {name}: |-\n"
        );
        for line in text.trim().lines() {
            if line.is_empty() {
                out.push('\n');
            } else {
                out += &format!("    {line}\n");
            }
        }
    }
    out
}

#[test]
fn the_dashboards_ship_as_configmaps_in_the_chart_and_the_plain_manifest() {
    // The chart's copies (Helm reads only files inside the chart).
    for (name, text) in dashboard_files() {
        let copy = std::fs::read_to_string(
            repo()
                .join("deploy/helm/drainwatch/files/dashboards")
                .join(&name),
        )
        .unwrap_or_default();
        assert!(
            copy == text,
            "deploy/helm/drainwatch/files/dashboards/{name} differs from dashboards/{name}: copy it"
        );
    }
    let plain_path = repo().join("deploy/kubernetes/dashboards.yaml");
    let expected = dashboards_manifest();
    if std::env::var_os("DRAINWATCH_WRITE_MANIFESTS").is_some() {
        std::fs::write(&plain_path, &expected).unwrap();
    }
    assert!(
        std::fs::read_to_string(&plain_path).unwrap_or_default() == expected,
        "deploy/kubernetes/dashboards.yaml is not dashboards/*.json: run \
         DRAINWATCH_WRITE_MANIFESTS=1 cargo test -p drainwatch-tests --test deploy dashboards"
    );
    let plain = yaml_file("deploy/kubernetes/dashboards.yaml");
    // Off by default in the chart (it needs Grafana's sidecar), like the Prometheus Operator
    // objects; the plain manifests keep each in a file of its own.
    let (_, defaults) = rendered(&json!({}));
    assert!(!defaults.iter().any(|d| d["kind"] == "ConfigMap"));
    let (_, chart) = rendered(&json!({"dashboards": {"enabled": true}}));
    let maps: Vec<&Value> = chart.iter().filter(|d| d["kind"] == "ConfigMap").collect();
    assert_eq!(maps.len(), dashboard_files().len());
    assert_eq!(plain.len(), maps.len());
    for (name, text) in dashboard_files() {
        let from_chart = maps
            .iter()
            .find(|m| m["data"].get(&name).is_some())
            .unwrap_or_else(|| panic!("no ConfigMap holds {name}"));
        let p = object(&plain, "ConfigMap", from_chart["metadata"]["name"].as_str());
        for (what, m) in [("chart", *from_chart), ("plain", p)] {
            assert_eq!(m["metadata"]["namespace"], "drainwatch", "{what} {name}");
            assert_eq!(
                m["metadata"]["labels"]["grafana_dashboard"], "1",
                "{what} {name}"
            );
            assert_eq!(m["data"].as_object().unwrap().len(), 1);
            // The dashboard itself, as Grafana's sidecar hands it to Grafana.
            let served: Value = serde_json::from_str(m["data"][&name].as_str().unwrap()).unwrap();
            let original: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(served, original, "{what} {name}");
        }
    }
}

#[test]
fn the_chart_fits_kube_prometheus_stack() {
    let values = json!({
        "podMonitor": {"enabled": true, "namespace": "monitoring",
            "labels": {"release": "kube-prometheus-stack"},
            "interval": "30s", "scrapeTimeout": "20s",
            "relabelings": [{"targetLabel": "cluster", "replacement": "prod"}],
            "metricRelabelings": [{"action": "drop", "sourceLabels": ["__name__"],
                "regex": "drainwatch_ebpf_faults_total"}]},
        "prometheusRule": {"enabled": true, "namespace": "monitoring",
            "labels": {"release": "kube-prometheus-stack"}},
        "dashboards": {"enabled": true, "namespace": "monitoring", "label": "dashboards",
            "labelValue": "drainwatch", "annotations": {"grafana_folder": "Drainwatch"}},
        "updateStrategy": {"type": "RollingUpdate",
            "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": 0}},
    });
    let (_, docs) = rendered(&values);
    let pm = object(&docs, "PodMonitor", Some("drainwatch"));
    assert_eq!(pm["metadata"]["namespace"], "monitoring");
    assert_eq!(pm["metadata"]["labels"]["release"], "kube-prometheus-stack");
    // From another namespace it must name the agents' own.
    assert_eq!(
        pm["spec"]["namespaceSelector"],
        json!({"matchNames": ["drainwatch"]})
    );
    let ep = &pm["spec"]["podMetricsEndpoints"][0];
    assert_eq!(ep["interval"], "30s");
    assert_eq!(ep["scrapeTimeout"], "20s");
    let relabelings = ep["relabelings"].as_array().unwrap();
    // The chart's own first (node label, the agent pod's labels dropped), then the user's.
    assert_eq!(relabelings.len(), 3);
    assert_eq!(relabelings[1]["regex"], "namespace|pod|container");
    assert_eq!(relabelings[2]["targetLabel"], "cluster");
    assert_eq!(ep["metricRelabelings"][0]["action"], "drop");
    let rule = object(&docs, "PrometheusRule", Some("drainwatch"));
    assert_eq!(rule["metadata"]["namespace"], "monitoring");
    assert_eq!(
        rule["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    for m in docs.iter().filter(|d| d["kind"] == "ConfigMap") {
        assert_eq!(m["metadata"]["namespace"], "monitoring");
        assert_eq!(m["metadata"]["labels"]["dashboards"], "drainwatch");
        assert!(m["metadata"]["labels"].get("grafana_dashboard").is_none());
        assert_eq!(m["metadata"]["annotations"]["grafana_folder"], "Drainwatch");
    }
    let ds = &object(&docs, "DaemonSet", Some("drainwatch"))["spec"];
    assert_eq!(
        ds["updateStrategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": 0}})
    );
    assert_eq!(
        ds["template"]["spec"]["priorityClassName"],
        "system-node-critical"
    );
    // In the release's namespace by default, where no namespaceSelector is needed.
    let (_, docs) = rendered(&all_on());
    let pm = object(&docs, "PodMonitor", Some("drainwatch"));
    assert_eq!(pm["metadata"]["namespace"], "drainwatch");
    assert!(pm["spec"].get("namespaceSelector").is_none());
    let ep = &pm["spec"]["podMetricsEndpoints"][0];
    assert!(ep.get("scrapeTimeout").is_none() && ep.get("metricRelabelings").is_none());
    // No priority class when asked for none.
    let (_, docs) = rendered(&json!({"priorityClassName": ""}));
    let pod = &object(&docs, "DaemonSet", Some("drainwatch"))["spec"]["template"]["spec"];
    assert!(pod.get("priorityClassName").is_none(), "{pod}");
}

#[test]
fn the_values_schema_takes_every_option_and_refuses_wrong_types() {
    // The defaults and every option validate (also through `helm lint --strict` in
    // `rendered`, above).
    for values in [json!({}), all_on()] {
        helm_render("drainwatch", "drainwatch", &values).unwrap();
    }
    for (what, values) in [
        ("port as a string", json!({"port": "9464"})),
        (
            "interval as a number",
            json!({"podMonitor": {"interval": 15}}),
        ),
        (
            "interval not a duration",
            json!({"podMonitor": {"interval": "15 s"}}),
        ),
        (
            "scrapeTimeout as a number",
            json!({"podMonitor": {"scrapeTimeout": 10}}),
        ),
        (
            "relabelings as an object",
            json!({"podMonitor": {"relabelings": {"a": 1}}}),
        ),
        (
            "enabled as a string",
            json!({"dashboards": {"enabled": "yes"}}),
        ),
        (
            "label value as a number",
            json!({"dashboards": {"labelValue": 1}}),
        ),
        (
            "a surge",
            json!({"updateStrategy": {"type": "RollingUpdate",
            "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 1}}}),
        ),
        ("OnDelete", json!({"updateStrategy": {"type": "OnDelete"}})),
        (
            "maxUnavailable as a word",
            json!({"updateStrategy": {"type": "RollingUpdate",
            "rollingUpdate": {"maxUnavailable": "one"}}}),
        ),
        (
            "priorityClassName as a number",
            json!({"priorityClassName": 1000}),
        ),
        ("a log format the agent lacks", json!({"logFormat": "xml"})),
        ("a misspelt key", json!({"podMonitr": {"enabled": true}})),
        (
            "a misspelt nested key",
            json!({"podMonitor": {"enable": true}}),
        ),
    ] {
        let err = helm_render("drainwatch", "drainwatch", &values)
            .err()
            .unwrap_or_else(|| panic!("{what}: {values} passed the schema"));
        // Helm names the offending key.
        assert!(err.contains("- at '"), "{what}: {err}");
    }
}

#[test]
fn the_notes_say_how_to_read_the_report() {
    let files = helm_render("dw", "observability", &all_on()).unwrap();
    let notes = files
        .iter()
        .find(|(p, _)| p.ends_with("NOTES.txt"))
        .expect("NOTES.txt")
        .1;
    for line in [
        "kubectl exec -n observability ds/dw-drainwatch -- drainwatch report --token \"$TOKEN\"\n",
        "drainwatch report --cluster --namespace observability --agent-token-file <file>\n",
        "kubectl -n observability port-forward ds/dw-drainwatch 9464\n",
        "PodMonitor dw-drainwatch in observability",
    ] {
        assert!(notes.contains(line), "{line:?} in\n{notes}");
    }
    // Another port: the report is asked there.
    let files = helm_render("drainwatch", "drainwatch", &json!({"port": 9000})).unwrap();
    let notes = &files["drainwatch/templates/NOTES.txt"];
    assert!(notes.contains(" --agent 127.0.0.1:9000\n"), "{notes}");
    // Without --auth kube: no token.
    let files = helm_render(
        "drainwatch",
        "drainwatch",
        &json!({"auth": {"enabled": false}}),
    )
    .unwrap();
    let notes = &files["drainwatch/templates/NOTES.txt"];
    for line in [
        "kubectl exec -n drainwatch ds/drainwatch -- drainwatch report\n",
        "drainwatch report --cluster --namespace drainwatch\n",
    ] {
        assert!(notes.contains(line), "{line:?} in\n{notes}");
    }
}

/// The rules of the ClusterRole a ClusterRoleBinding gives `subject` (`namespace/name` of a
/// ServiceAccount), from `docs`.
fn rules_bound_to<'a>(docs: &'a [Value], subject: &str) -> Vec<&'a Value> {
    let (ns, name) = subject.split_once('/').unwrap();
    docs.iter()
        .filter(|d| d["kind"] == "ClusterRoleBinding")
        .filter(|b| {
            b["subjects"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["kind"] == "ServiceAccount" && s["namespace"] == ns && s["name"] == name)
        })
        .flat_map(|b| {
            let role = object(docs, "ClusterRole", b["roleRef"]["name"].as_str());
            role["rules"].as_array().unwrap().iter()
        })
        .collect()
}

#[test]
fn the_api_needs_a_token_and_only_the_monitoring_namespace_connects() {
    let mut docs = yaml_file("deploy/kubernetes/drainwatch.yaml");
    docs.extend(yaml_file("deploy/kubernetes/monitoring.yaml"));
    let ds = object(&docs, "DaemonSet", None);
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    let var = |name: &str| {
        c["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .map(|e| e["value"].clone())
    };
    assert_eq!(var("DRAINWATCH_AUTH"), Some(json!("kube")));
    assert_eq!(var("DRAINWATCH_AUTH_METRICS"), Some(json!("true")));

    // The agent's ServiceAccount may create both reviews, and nothing more than its pods.
    let sa = ds["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .unwrap();
    let agent_rules = rules_bound_to(&docs, &format!("drainwatch/{sa}"));
    for (group, resource) in [
        ("authentication.k8s.io", "tokenreviews"),
        ("authorization.k8s.io", "subjectaccessreviews"),
    ] {
        assert!(
            agent_rules.contains(&&json!({"apiGroups": [group], "resources": [resource],
                "verbs": ["create"]})),
            "create {resource}"
        );
    }
    assert_eq!(
        agent_rules.len(),
        4,
        "pods, events, tokenreviews, subjectaccessreviews"
    );

    // The PodMonitor sends the token of a ServiceAccount allowed get /metrics.
    let endpoint = &object(&docs, "PodMonitor", None)["spec"]["podMetricsEndpoints"][0];
    let auth = &endpoint["authorization"];
    assert_eq!(auth["type"], "Bearer");
    assert_eq!(auth["credentials"]["key"], "token");
    let secret = object(&docs, "Secret", auth["credentials"]["name"].as_str());
    assert_eq!(secret["type"], "kubernetes.io/service-account-token");
    assert_eq!(secret["metadata"]["namespace"], "drainwatch");
    let scraper = secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]
        .as_str()
        .unwrap();
    object(&docs, "ServiceAccount", Some(scraper));
    assert_eq!(
        rules_bound_to(&docs, &format!("drainwatch/{scraper}")),
        [&json!({"nonResourceURLs": ["/metrics"], "verbs": ["get"]})]
    );

    // Ingress to the agent's pods: from the monitoring namespace, to its port, nothing else.
    let np = object(&docs, "NetworkPolicy", Some("drainwatch"));
    assert_eq!(np["metadata"]["namespace"], "drainwatch");
    assert_eq!(
        np["spec"]["podSelector"]["matchLabels"],
        ds["spec"]["template"]["metadata"]["labels"]
    );
    assert_eq!(np["spec"]["policyTypes"], json!(["Ingress"]));
    assert_eq!(
        np["spec"]["ingress"],
        json!([{
            "from": [{"namespaceSelector": {"matchLabels":
                {"kubernetes.io/metadata.name": "monitoring"}}}],
            "ports": [{"port": c["ports"][0]["containerPort"], "protocol": "TCP"}],
        }])
    );

    // The API server's CIDRs, when given, join the monitoring namespace.
    let (_, chart) = rendered(&json!({"networkPolicy": {"apiServerCIDRs": ["10.0.0.0/24"]}}));
    let from = &object(&chart, "NetworkPolicy", None)["spec"]["ingress"][0]["from"];
    assert_eq!(from[1], json!({"ipBlock": {"cidr": "10.0.0.0/24"}}));
}
