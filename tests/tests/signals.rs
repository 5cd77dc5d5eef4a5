//! Which signals open a stop, end to end: the real agent and a real podman container. A signal
//! from the host to another process of the container (what a runtime does to an exec'd probe
//! at its timeout) opens no stop; the container's real stop afterwards is one record, with
//! nothing of the earlier signal in it.

use std::{process::Command, time::Duration};

use drainwatch_tests::{
    agent::{Agent, api, stop_record, sync},
    lab::{Backend, BackendOpts, Mode, clock, container::podman},
};

/// Host pid of the process in `container` whose command line contains `needle`.
fn host_pid_of(container_pid: u32, needle: &str) -> u32 {
    let cgroup = std::fs::read_to_string(format!("/proc/{container_pid}/cgroup")).unwrap();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let same =
            std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c == cgroup);
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if same && String::from_utf8_lossy(&cmd).contains(needle) {
            return pid;
        }
    }
    panic!("no process {needle:?} in the container of {container_pid}");
}

#[test]
fn a_signal_to_another_process_of_a_container_is_no_stop() {
    let agent = Agent::start(&[]);
    let b = Backend::start("sig", Mode::NoHandler, BackendOpts::default());
    podman(&["exec", "-d", &b.container, "/bin/busybox", "sleep", "4711"]).expect("exec");
    let mut probe = 0;
    for _ in 0..50 {
        probe = std::panic::catch_unwind(|| host_pid_of(b.pid, "4711")).unwrap_or(0);
        if probe != 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(probe != 0, "the exec'd process never showed");
    let killed = Command::new("kill")
        .args(["-TERM", &probe.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    std::thread::sleep(Duration::from_millis(300));
    sync(&agent);
    let (_, stops) = api(&agent, "/api/v1/stops");
    let mine = stops
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["container"]["id"] == b.id.as_str())
        .count();
    assert_eq!(
        mine, 0,
        "a signal to an exec'd process opened a stop: {stops:#}"
    );
    // The real stop: SIGTERM to its init, which forwards it; no SIGKILL.
    let issued = clock::mono_ns();
    b.stop(10);
    let stop = stop_record(&agent, &b.id);
    assert_eq!(stop["outcome"], "exit_at_once", "{stop:#}");
    assert!(stop["sigkill_at"].is_null(), "{stop:#}");
    assert_eq!(stop["complete"], true);
    let term = drainwatch_tests::agent::instant(&stop["sigterm_at"]).expect("sigterm_at");
    assert!(
        clock::mono_ns_of(term) + 50_000_000 >= issued,
        "its SIGTERM is the stop's, not the probe's"
    );
}
