//! The DaemonSet's capabilities, proven on the real agent: run as uid 0 with exactly the
//! capabilities deploy/kubernetes/drainwatch.yaml adds (parsed from the manifest, so the two
//! cannot drift; the rest dropped from the bounding set by `setpriv`, with no_new_privs as
//! `allowPrivilegeEscalation: false` sets), it attaches every probe a full root does and
//! attributes real containers, one running as root and one as a non-root user, down to their
//! listeners. Without each added capability it fails as deploy/README.md says: at start-up with
//! a sentence naming the capability (BPF, PERFMON), or with a warning naming it and the
//! containers' listeners unseen (SYS_PTRACE, DAC_READ_SEARCH).

use std::{
    collections::BTreeSet,
    process::{Command, Stdio},
};

use drainwatch_tests::{
    agent::{Agent, binary, free_port, stop_record, sync},
    lab::container::{Httpd, podman},
    ops::{effective_caps, manifest_capabilities},
    require_root,
};
use serde_json::Value;

/// `setpriv` keeping uid 0 and only `caps` (Kubernetes names: `SYS_PTRACE`).
fn setpriv(caps: &[String]) -> Vec<String> {
    let mut bounding = "-all".to_string();
    for c in caps {
        bounding += &format!(",+{}", c.to_lowercase());
    }
    [
        "setpriv",
        "--bounding-set",
        &bounding,
        "--inh-caps",
        "-all",
        "--no-new-privs",
        "--",
    ]
    .map(String::from)
    .to_vec()
}

/// What one agent run saw.
struct Observed {
    caps: BTreeSet<String>,
    /// `signal hook` of every probe attached.
    attached: BTreeSet<String>,
    /// The stop records of the root and the non-root container.
    root_stop: Value,
    user_stop: Value,
    stderr: String,
}

fn listeners(stop: &Value) -> Vec<String> {
    stop["listeners"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["address"].as_str().map(str::to_string))
        .collect()
}

/// Starts both containers, then the agent (through `wrapper`), then stops the containers and
/// collects their stop records: the agent found them at start-up by reading /proc.
fn observe(wrapper: &[String]) -> Observed {
    let root = Httpd::start("caps-root", None);
    let user = Httpd::start("caps-user", Some("65534:65534"));
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let mut agent = Agent::start_wrapped(&wrapper, &[]);
    // Past the start-up scan: it runs before the first event is processed.
    sync(&agent);
    let caps = effective_caps(agent.child.id());
    let attached = agent
        .metrics_text()
        .lines()
        .filter(|l| l.starts_with("drainwatch_probe_attached{") && l.ends_with("} 1"))
        .map(str::to_string)
        .collect();
    podman(&["stop", "-t", "1", &root.name, &user.name]).expect("podman stop");
    let root_stop = stop_record(&agent, &root.id);
    let user_stop = stop_record(&agent, &user.id);
    for (c, s) in [(&root, &root_stop), (&user, &user_stop)] {
        assert_eq!(s["container"]["name"], c.name.as_str(), "{s:#}");
        assert_eq!(s["container"]["runtime"], "podman", "{s:#}");
        assert_eq!(s["outcome"], "killed_at_deadline", "{s:#}");
    }
    let _ = agent.child.kill();
    let _ = agent.child.wait();
    let stderr = agent.stderr();
    Observed {
        caps,
        attached,
        root_stop,
        user_stop,
        stderr,
    }
}

fn without(caps: &[String], cap: &str) -> Vec<String> {
    caps.iter().filter(|c| *c != cap).cloned().collect()
}

#[test]
fn the_manifest_capabilities_attach_every_probe_and_attribute_containers() {
    require_root();
    let caps = manifest_capabilities();
    println!("manifest capabilities: {caps:?}");
    let full = observe(&[]);
    let granted = observe(&setpriv(&caps));
    let expected: BTreeSet<String> = caps
        .iter()
        .map(|c| format!("cap_{}", c.to_lowercase()))
        .collect();
    assert_eq!(granted.caps, expected, "the agent ran with exactly these");
    assert!(!full.attached.is_empty());
    assert_eq!(
        granted.attached, full.attached,
        "every probe a full root attaches"
    );
    println!(
        "attached with the manifest's capabilities: {:#?}",
        granted.attached
    );
    for o in [&full, &granted] {
        for s in [&o.root_stop, &o.user_stop] {
            assert!(
                listeners(s).iter().any(|a| a.ends_with(":8080")),
                "the container's listener, found through /proc: {s:#}"
            );
        }
    }
    assert!(
        !granted.stderr.contains("no CAP_"),
        "no capability warning: {}",
        granted.stderr
    );
}

#[test]
fn without_each_added_capability_the_agent_says_so() {
    require_root();
    let caps = manifest_capabilities();
    for cap in &caps {
        let fewer = without(&caps, cap);
        match cap.as_str() {
            // Loading or attaching fails: the agent exits at start-up naming the capability.
            "BPF" | "PERFMON" => {
                let out = Command::new(&setpriv(&fewer)[0])
                    .args(&setpriv(&fewer)[1..])
                    .arg(binary())
                    .args(["--listen", &format!("127.0.0.1:{}", free_port())])
                    .stdin(Stdio::null())
                    .output()
                    .expect("run the agent");
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert_eq!(out.status.code(), Some(2), "without {cap}: {stderr}");
                assert!(
                    stderr.contains(&format!("drainwatch lacks CAP_{cap} ")),
                    "without {cap}: {stderr}"
                );
            }
            // The agent runs, warns, and cannot see the affected containers' sockets.
            "SYS_PTRACE" | "DAC_READ_SEARCH" => {
                let o = observe(&setpriv(&fewer));
                assert!(
                    o.stderr.contains(&format!("no CAP_{cap}:")),
                    "without {cap}: {}",
                    o.stderr
                );
                assert!(
                    listeners(&o.user_stop).is_empty(),
                    "without {cap}, the non-root container's listener is unseen: {:#}",
                    o.user_stop
                );
                let root_seen = !listeners(&o.root_stop).is_empty();
                assert_eq!(
                    root_seen,
                    cap == "DAC_READ_SEARCH",
                    "without {cap}, the root container's listener is {}: {:#}",
                    if cap == "DAC_READ_SEARCH" {
                        "seen"
                    } else {
                        "unseen"
                    },
                    o.root_stop
                );
            }
            other => panic!(
                "the manifest adds {other}, which this test has no expectation for: prove it is needed here and in deploy/README.md"
            ),
        }
    }
}
