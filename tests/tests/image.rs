//! The image `cargo xtask image` builds, run under podman the way the DaemonSet runs it: the
//! security context (capabilities, the seccomp profile from deploy/seccomp/, read-only root, uid,
//! no privilege escalation), hostPID, the network, every hostPath mount with its readOnly, the
//! environment (the downward API's node name replaced by a test value), args and resource
//! limits, all parsed from deploy/kubernetes/drainwatch.yaml; a field this test cannot map fails
//! it, so the two cannot drift. The API server is a double reached by a kubeconfig (a node's pod
//! gets the real one from the kubelet), so the manifest's `--auth kube` is on: the API refuses
//! a request without a token. The containerized agent attaches every probe the host's root
//! agent attaches, records a real container's stop with its listener, and exits 0 on SIGTERM
//! (`podman stop`) within the grace period, leaving its checkpoint.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use drainwatch_tests::{
    agent::{Agent, free_port, get, stop_record, sync},
    kube_api::ApiDouble,
    lab::container::{BridgeHolder, Httpd, LAB_DIR, podman, setup_once, unique_name},
    ops::{effective_caps, manifest_agent, manifest_capabilities, repo},
    require_root,
};
use serde_json::Value;

/// What the downward API would put in `spec.nodeName`.
const NODE_NAME: &str = "image-test-node";

/// Builds the amd64 image (incremental when nothing changed) and returns its tag.
fn build_image() -> String {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let t = Instant::now();
    let status = Command::new(cargo)
        .current_dir(repo())
        .args(["xtask", "image", "--no-setup", "--arch", "amd64"])
        .status()
        .expect("run cargo xtask image");
    assert!(status.success(), "cargo xtask image failed ({status})");
    println!("cargo xtask image: {:.1}s", t.elapsed().as_secs_f64());
    format!("localhost/drainwatch:{}", env!("CARGO_PKG_VERSION"))
}

/// The `probe_attached` series at 1 (`{signal=..,hook=..}`).
fn attached(agent: &Agent) -> BTreeSet<String> {
    agent
        .metrics_text()
        .lines()
        .filter(|l| l.starts_with("drainwatch_probe_attached{") && l.ends_with("} 1"))
        .map(str::to_string)
        .collect()
}

fn str_of<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what}: a string, not {v}"))
}

/// Kubernetes quantities as podman takes them: memory `256Mi` -> `256m` (podman's m is MiB),
/// CPU `500m` -> `0.5`.
fn memory(q: &str) -> String {
    let n = q
        .strip_suffix("Mi")
        .unwrap_or_else(|| panic!("memory {q}: only Mi is mapped"));
    format!("{n}m")
}

fn cpus(q: &str) -> String {
    match q.strip_suffix('m') {
        Some(milli) => format!("{}", milli.parse::<f64>().expect("millicores") / 1000.0),
        None => q.to_string(),
    }
}

/// The podman flags of the container's securityContext.
fn security_flags(sc: &Value, args: &mut Vec<String>) {
    for (key, v) in sc.as_object().expect("securityContext") {
        match key.as_str() {
            "privileged" => {
                if v == true {
                    args.push("--privileged".into());
                }
            }
            "allowPrivilegeEscalation" => {
                if v == false {
                    args.extend(["--security-opt".into(), "no-new-privileges".into()]);
                }
            }
            "readOnlyRootFilesystem" => {
                if v == true {
                    // Kubernetes adds no tmpfs on /tmp, /run, /var/tmp: neither may podman.
                    args.extend(["--read-only".into(), "--read-only-tmpfs=false".into()]);
                }
            }
            "runAsUser" => args.extend(["--user".into(), v.to_string()]),
            "runAsNonRoot" => {
                if v == true {
                    assert_ne!(sc["runAsUser"], 0, "runAsNonRoot with runAsUser 0");
                }
            }
            "seccompProfile" => match str_of(&v["type"], "seccompProfile.type") {
                "Localhost" => {
                    let file = str_of(&v["localhostProfile"], "localhostProfile");
                    let path = repo().join("deploy/seccomp").join(file);
                    assert!(path.exists(), "{}: the Localhost profile", path.display());
                    args.extend([
                        "--security-opt".into(),
                        format!("seccomp={}", path.display()),
                    ]);
                }
                // podman's own default, as a runtime's default.
                "RuntimeDefault" => {}
                other => panic!("seccompProfile {other}: the agent must run confined"),
            },
            "capabilities" => {
                for (list, flag) in [("drop", "--cap-drop"), ("add", "--cap-add")] {
                    for cap in v[list].as_array().into_iter().flatten() {
                        args.extend([flag.into(), str_of(cap, list).to_lowercase()]);
                    }
                }
            }
            other => panic!("securityContext.{other}: this test does not map it to podman yet"),
        }
    }
}

/// Host directories the test made (empty stand-ins, the state directory); removed on drop.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The hostPath mounts as `-v host:container[:ro]`. Two places differ from a node, both so the
/// test touches nothing of this machine's: the writable state directory is a fresh directory
/// (the node's real checkpoint place may hold another agent's), and a DirectoryOrCreate path
/// missing here is an empty directory, as the kubelet would create.
fn volume_flags(pod: &Value, c: &Value, scratch: &Path, args: &mut Vec<String>) -> PathBuf {
    let volumes = pod["volumes"].as_array().expect("volumes");
    let mut state = None;
    for m in c["volumeMounts"].as_array().expect("volumeMounts") {
        let name = str_of(&m["name"], "volumeMounts.name");
        let v = volumes
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no volume {name}"));
        let host_path = &v["hostPath"];
        assert!(
            host_path.is_object(),
            "volume {name}: only hostPath is mapped"
        );
        let path = PathBuf::from(str_of(&host_path["path"], "hostPath.path"));
        let read_only = m["readOnly"] == true;
        let host = match str_of(&host_path["type"], "hostPath.type") {
            "Directory" => {
                assert!(path.is_dir(), "{}: type Directory", path.display());
                path
            }
            "DirectoryOrCreate" if !read_only || !path.exists() => {
                let dir = scratch.join(name);
                std::fs::create_dir_all(&dir).expect("scratch directory");
                if !read_only {
                    state = Some(dir.clone());
                }
                dir
            }
            "DirectoryOrCreate" => path,
            other => panic!("hostPath type {other} is not mapped"),
        };
        let mount = str_of(&m["mountPath"], "mountPath");
        let ro = if read_only { ":ro" } else { "" };
        args.extend(["-v".into(), format!("{}:{mount}{ro}", host.display())]);
    }
    state.expect("a writable state directory")
}

/// `podman run` arguments for the DaemonSet's pod, serving its port on 127.0.0.1:`port`, and the
/// agent's state directory on the host.
fn pod_flags(
    pod: &Value,
    c: &Value,
    name: &str,
    port: u16,
    scratch: &Path,
) -> (Vec<String>, PathBuf) {
    let mut args: Vec<String> = ["run", "--name", name].map(String::from).to_vec();
    // The ulimits runc needs on this machine (ENVIRONMENT.md); a node's runtime sets its own.
    args.extend(
        [
            "--ulimit",
            "nofile=10000:10000",
            "--ulimit",
            "nproc=1000:1000",
        ]
        .map(String::from),
    );
    for (key, v) in pod.as_object().expect("pod spec") {
        match key.as_str() {
            "hostPID" if v == true => args.extend(["--pid".into(), "host".into()]),
            "hostNetwork" if v == true => args.extend(["--network".into(), "host".into()]),
            "hostPID" | "hostNetwork" | "containers" | "volumes" => {}
            // Scheduling and API identity: nothing to map on one machine without an API
            // server; the grace period is `podman stop -t` below.
            "serviceAccountName"
            | "tolerations"
            | "priorityClassName"
            | "terminationGracePeriodSeconds" => {}
            other => panic!("pod spec {other}: this test does not map it to podman yet"),
        }
    }
    let mut entrypoint_args = Vec::new();
    let mut state = None;
    for (key, v) in c.as_object().expect("container") {
        match key.as_str() {
            "securityContext" => security_flags(v, &mut args),
            "volumeMounts" => state = Some(volume_flags(pod, c, scratch, &mut args)),
            "env" => {
                for e in v.as_array().expect("env") {
                    let var = str_of(&e["name"], "env.name");
                    let value = match (&e["value"], &e["valueFrom"]["fieldRef"]["fieldPath"]) {
                        (Value::String(s), _) => s.clone(),
                        (_, f) if f == "spec.nodeName" => NODE_NAME.to_string(),
                        _ => panic!("env {var}: {e} is not mapped"),
                    };
                    args.extend(["-e".into(), format!("{var}={value}")]);
                }
            }
            "ports" if pod["hostNetwork"] != true => {
                for p in v.as_array().expect("ports") {
                    args.extend([
                        "-p".into(),
                        format!("127.0.0.1:{port}:{}", p["containerPort"]),
                    ]);
                }
            }
            "resources" => {
                if let Some(m) = v["limits"]["memory"].as_str() {
                    args.extend(["--memory".into(), memory(m)]);
                }
                if let Some(cpu) = v["limits"]["cpu"].as_str() {
                    args.extend(["--cpus".into(), cpus(cpu)]);
                }
            }
            "command" => args.extend(["--entrypoint".into(), v.to_string()]),
            "args" => {
                entrypoint_args = v
                    .as_array()
                    .expect("args")
                    .iter()
                    .map(|a| str_of(a, "args").to_string())
                    .collect()
            }
            // The image is the one just built; the kubelet's probes are what attach() waits on.
            "name" | "image" | "imagePullPolicy" | "ports" | "livenessProbe" | "readinessProbe" => {
            }
            other => panic!("container {other}: this test does not map it to podman yet"),
        }
    }
    assert_eq!(
        c["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == "DRAINWATCH_LISTEN")
            .map(|e| &e["value"]),
        Some(&Value::String(format!(
            "0.0.0.0:{}",
            c["ports"][0]["containerPort"]
        ))),
        "the agent listens on the container port the test maps"
    );
    args.push("IMAGE".into());
    args.extend(entrypoint_args);
    (args, state.expect("volumeMounts"))
}

/// Removes the agent's container, whatever the test did.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", "-t", "0", &self.0]);
    }
}

fn status_line(pid: u32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
        .trim()
        .to_string()
}

#[test]
fn the_image_runs_as_the_daemonset_attaches_records_and_stops_cleanly() {
    require_root();
    setup_once();
    // The API double listens on the bridge's gateway address and the agent calls it until the
    // end: the bridge must outlive the httpd this test stops (podman deletes it, and the
    // address, with the last container on the network). Up before the agents start.
    let _bridge = BridgeHolder::start("image");
    let tag = build_image();
    let (pod, c) = manifest_agent();
    let grace = pod["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("terminationGracePeriodSeconds");

    // What the host's full root attaches: the probes the containerized agent must attach too.
    let baseline = {
        let host = Agent::start(&[]);
        sync(&host);
        attached(&host)
    };
    assert!(!baseline.is_empty());

    let httpd = Httpd::start("image-httpd", None);
    let name = unique_name("image-agent");
    let scratch = Scratch(PathBuf::from(LAB_DIR).join(&name));
    let port = free_port();
    let (mut args, state) = pod_flags(&pod, &c, &name, port, &scratch.0);
    // The kubelet gives a pod the API server (KUBERNETES_SERVICE_HOST and a token); here a
    // double on the host's side of the containers' bridge stands in, reached by a kubeconfig,
    // so that the manifest's `--auth kube` checks tokens as on a node.
    let gateway = podman(&[
        "inspect",
        "--format",
        "{{.NetworkSettings.Gateway}}",
        &httpd.name,
    ])
    .expect("the bridge's gateway");
    let api = ApiDouble::start(gateway.trim());
    let kube_dir = scratch.0.join("kube");
    std::fs::create_dir_all(&kube_dir).expect("scratch");
    // As a pod's ca.crt: the image has no system roots.
    std::fs::copy(
        "/etc/ssl/certs/ca-certificates.crt",
        kube_dir.join("ca.crt"),
    )
    .expect("the host's CA bundle (ca-certificates)");
    api.kubeconfig(
        &kube_dir.join("kubeconfig"),
        Some("/etc/drainwatch-test/ca.crt"),
    );
    let slot = args.iter().position(|a| a == "IMAGE").expect("image slot");
    args.splice(
        slot..slot,
        [
            "-v".to_string(),
            format!("{}:/etc/drainwatch-test:ro", kube_dir.display()),
            "-e".into(),
            "KUBECONFIG=/etc/drainwatch-test/kubeconfig".into(),
            "-e".into(),
            "DRAINWATCH_KUBE=on".into(),
        ],
    );
    args[slot + 6] = tag.clone();
    println!("podman {}", args.join(" "));
    let _container = Container(name.clone());
    let child = Command::new("podman")
        .args(["--runtime", "/usr/sbin/runc", "--cgroup-manager=cgroupfs"])
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("podman run");
    let mut agent = Agent::attach(child, port);
    // The manifest's --auth kube: the API refused without a token, allowed with one.
    assert_eq!(
        get(port, "/api/v1/stops", "application/json")
            .expect("get")
            .0,
        401
    );
    agent.token = Some("alice".into());
    sync(&agent);
    assert!(
        api.reviews.load(Ordering::SeqCst) >= 2,
        "the token went through a TokenReview and a SubjectAccessReview"
    );

    // The container really has the DaemonSet's confinement.
    let pid: u32 = podman(&["inspect", "--format", "{{.State.Pid}}", &name])
        .expect("inspect")
        .parse()
        .expect("pid");
    let expected: BTreeSet<String> = manifest_capabilities()
        .iter()
        .map(|c| format!("cap_{}", c.to_lowercase()))
        .collect();
    assert_eq!(
        effective_caps(pid),
        expected,
        "exactly the manifest's capabilities"
    );
    assert_eq!(
        status_line(pid, "Seccomp:"),
        "2",
        "a seccomp filter is applied"
    );
    assert_eq!(status_line(pid, "NoNewPrivs:"), "1");
    assert_eq!(
        podman(&[
            "inspect",
            "--format",
            "{{.HostConfig.ReadonlyRootfs}}",
            &name
        ])
        .as_deref(),
        Ok("true")
    );

    let got = attached(&agent);
    assert_eq!(got, baseline, "every probe the host's root agent attaches");
    println!("attached in the container: {got:#?}");

    podman(&["stop", "-t", "1", &httpd.name]).expect("podman stop");
    let stop = stop_record(&agent, &httpd.id);
    assert_eq!(stop["container"]["name"], httpd.name.as_str(), "{stop:#}");
    assert_eq!(stop["container"]["runtime"], "podman", "{stop:#}");
    assert_eq!(stop["outcome"], "killed_at_deadline", "{stop:#}");
    assert!(
        stop["listeners"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|l| l["address"].as_str().is_some_and(|a| a.ends_with(":8080"))),
        "the container's listener, found through the host's /proc: {stop:#}"
    );

    // SIGTERM, as the kubelet sends it, with the pod's grace period before SIGKILL.
    let t = Instant::now();
    podman(&["stop", "-t", &grace.to_string(), &name]).expect("podman stop the agent");
    let status = agent.child.wait().expect("podman run exits");
    let took = t.elapsed();
    let log = agent.stderr();
    assert_eq!(status.code(), Some(0), "exit on SIGTERM: {log}");
    assert!(
        took < Duration::from_secs(grace),
        "stopped in {took:?}, within the {grace} s grace period"
    );
    let written = std::fs::read_dir(&state).expect("state dir").count();
    assert!(written > 0, "a checkpoint in {}: {log}", state.display());
    println!("SIGTERM to exit 0 in {took:?}; {written} file(s) in the state directory");

    // The control: the same pod with the profile less its bpf/perf_event_open rule (the runtime
    // default alone) cannot start, so the profile is what lets it load its programs.
    let profile_arg = args
        .iter()
        .position(|a| a.starts_with("seccomp="))
        .expect("a Localhost profile");
    let path = args[profile_arg].trim_start_matches("seccomp=").to_string();
    let mut profile: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("profile")).expect("JSON");
    let rules = profile["syscalls"].as_array_mut().expect("syscalls");
    let before = rules.len();
    rules.retain(|r| !r["names"].to_string().contains("\"bpf\""));
    assert_eq!(rules.len(), before - 1, "bpf is allowed by one rule");
    let default_only = scratch.0.join("default-only.json");
    std::fs::write(&default_only, profile.to_string()).expect("write the profile");
    args[profile_arg] = format!("seccomp={}", default_only.display());
    let control = unique_name("image-control");
    *args.iter_mut().find(|a| **a == name).expect("name") = control.clone();
    let _control = Container(control);
    let mut child = Command::new("podman")
        .args(["--runtime", "/usr/sbin/runc", "--cgroup-manager=cgroupfs"])
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("podman run");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the control still runs after 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut log = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut log)
        .expect("log");
    assert_eq!(
        status.code(),
        Some(2),
        "the control fails at start-up: {log}"
    );
    assert!(log.contains("failed to create map"), "{log}");
}
