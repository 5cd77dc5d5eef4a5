//! A podman pod, stopped as `podman pod stop` stops it: the real agent, a real pod (its infra
//! container, one app container), podman's cgroupfs layout on this machine. Each conmon of a
//! pod sits in the pod's own cgroup (`/libpod_parent/<pod id>/conmon`): it must never be read
//! as a container (it was: a false `crashed` record named after the pod at every pod stop),
//! and the infra container is the pod's sandbox, a line on the app's record, never a stop.
//!
//! Ground truth: podman's own ids for the pod and its members, the conmons' cgroups as
//! /proc shows them, and podman's own exit codes. No traffic is sent.

use std::{fs, path::PathBuf, process::Command, time::Duration};

use drainwatch_tests::{
    agent::{Agent, api, current_stop, stop_record, wait_for},
    lab::container::{IMAGE, LAB_DIR, ensure_image, podman, unique_name},
};
use serde_json::Value;

/// podman with a containers.conf of the test's own: `podman pod create` has no `--ulimit`,
/// and the infra container fails here without the limits runc can set.
fn pod_podman(conf: &PathBuf, args: &[&str]) -> String {
    let out = Command::new("podman")
        .env("CONTAINERS_CONF", conf)
        .args(["--runtime", "/usr/sbin/runc", "--cgroup-manager=cgroupfs"])
        .args(args)
        .output()
        .expect("podman runs");
    assert!(
        out.status.success(),
        "podman {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The pids whose comm is `conmon` and whose cgroup (any hierarchy) is under `cgroup`.
fn conmons_in(cgroup: &str) -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "conmon")
                && fs::read_to_string(format!("/proc/{pid}/cgroup"))
                    .is_ok_and(|c| c.lines().any(|l| l.ends_with(cgroup)))
        })
        .collect()
}

struct Pod {
    name: String,
    conf: PathBuf,
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .env("CONTAINERS_CONF", &self.conf)
            .args(["--cgroup-manager=cgroupfs", "pod", "rm", "-f", &self.name])
            .output();
        let _ = fs::remove_file(&self.conf);
    }
}

#[test]
fn a_podman_pod_stop_makes_one_record_for_its_app_and_none_for_its_conmon_or_infra() {
    drainwatch_tests::require_root();
    ensure_image();
    fs::create_dir_all(LAB_DIR).expect("lab dir");
    let name = unique_name("pod");
    let conf = PathBuf::from(LAB_DIR).join(format!("{name}.containers.conf"));
    fs::write(
        &conf,
        "[containers]\ndefault_ulimits = [\"nofile=10000:10000\", \"nproc=1000:1000\"]\n",
    )
    .expect("containers.conf");
    let pod = Pod {
        name: name.clone(),
        conf: conf.clone(),
    };
    let agent = Agent::start(&[]);

    let pod_id = pod_podman(&conf, &["pod", "create", "--name", &name]);
    // The app: busybox `sleep` behind podman's init (SIGTERM's default action ends it).
    let app_name = format!("{name}-app");
    let app_id = pod_podman(
        &conf,
        &[
            "run",
            "-d",
            "--pod",
            &name,
            "--name",
            &app_name,
            "--init",
            "--dns",
            "127.0.0.1",
            IMAGE,
            "/bin/busybox",
            "sleep",
            "600",
        ],
    );
    let infra_id = pod_podman(
        &conf,
        &["pod", "inspect", &name, "--format", "{{.InfraContainerID}}"],
    );
    // The path this test is about: the pod's conmons in the pod's own cgroup.
    let pod_cgroup = format!("/libpod_parent/{pod_id}/conmon");
    let conmons = conmons_in(&pod_cgroup);
    assert_eq!(
        conmons.len(),
        2,
        "one conmon each for the infra and the app container in {pod_cgroup}"
    );
    // The agent has seen both containers (their start records would say: wait on its API).
    wait_for("the agent to know the app", Duration::from_secs(10), || {
        let (_, starts) = api(&agent, "/api/v1/starts");
        starts
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["container"]["id"] == app_id.as_str())
    });

    pod_podman(&conf, &["pod", "stop", "-t", "5", &name]);
    let app_exit = podman(&["inspect", "--format", "{{.State.ExitCode}}", &app_id])
        .expect("podman inspect of the app");
    let app = stop_record(&agent, &app_id);
    println!("drainwatch: {app:#}");
    drop(pod);

    assert_eq!(
        app["exit_code"].as_i64().map(|c| c.to_string()),
        Some(app_exit)
    );
    assert_eq!(app["container"]["pod"], name.as_str());
    assert!(
        !app["sandbox_stopped_at"].is_null(),
        "the infra container's end is a line on the app's record: {app:#}"
    );
    let (_, stops) = api(&agent, "/api/v1/stops");
    let ids: Vec<&str> = stops
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s: &Value| s["container"]["id"].as_str())
        .collect();
    for (what, id) in [
        ("the pod (its conmons)", &pod_id),
        ("the infra container", &infra_id),
    ] {
        assert!(
            current_stop(&agent, id).is_none(),
            "{what} made a stop record: {ids:?}"
        );
    }
    let (_, starts) = api(&agent, "/api/v1/starts");
    assert!(
        !starts
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["container"]["id"] == pod_id.as_str()
                || s["container"]["id"] == infra_id.as_str()),
        "neither the pod's conmons nor its infra container is a start: {starts:#}"
    );
    let judged = |container: &str| {
        agent.metric_sum(
            "drainwatch_container_stops_total",
            &[("container", container)],
        )
    };
    // Counted when the stop settles, 10 s after its cgroup's removal.
    wait_for("the app's stop to settle", Duration::from_secs(30), || {
        judged(&app_name) == 1.0
    });
    assert_eq!(judged("POD"), 0.0, "the infra container is no judged stop");
}
