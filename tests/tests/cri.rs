//! Pod deletions through containerd's CRI, end to end: the real agent, containerd started by
//! the lab with its task state where a node keeps it, a Deployment-shaped pod
//! (`shop/web-7d9f8b6c5d-x2x7q`, container `app`) run and deleted in the kubelet's order by
//! the lab's CRI client (`drainwatch_tests::lab::cri`).
//!
//! Ground truth never comes from drainwatch: exit codes from containerd's own task-exit
//! events, cuts, refusals and unreachable attempts from the clients' own counts.
//!
//! One deleted pod is one judged stop: the sandbox's end (its pause process SIGKILLed by
//! StopPodSandbox) is a line on the app's record, not a stop of its own.
//!
//! Privileged: run as root, serially (`cargo test -p drainwatch-tests --test cri --
//! --test-threads=1`); fails loudly without root or containerd.

use std::time::{Duration, Instant};

use drainwatch_tests::{
    agent::{Agent, api, current_stop, instant, stop_record, sync, wait_for},
    lab::{
        Mode,
        client::RequestRecord,
        cri::{
            self, AppSpec, CriLab, Deletion, Init, Pod, PodSpec, STATE_CONTAINERD, STATE_K3S,
            STATE_MICROK8S, Step, TaskExit,
            traffic::{Attempt, InFlight, ProbeCounts, Prober, was_cut},
        },
    },
};
use serde_json::Value;

const NAMESPACE: &str = "shop";
const WORKLOAD: &str = "web";
const POD: &str = "web-7d9f8b6c5d-x2x7q";
const STOPS: &str = "drainwatch_container_stops_total";
/// The agent's `--stop-settle-seconds` default: a stop is counted this long after its cgroup
/// went.
const SETTLE: Duration = Duration::from_secs(10);

fn web_pod(init: Init) -> PodSpec {
    let app = AppSpec {
        mode: Mode::NoHandler,
        port: 8080,
        init,
    };
    PodSpec::deployment(NAMESPACE, WORKLOAD, "7d9f8b6c5d", "x2x7q", app)
}

/// A pod running, the agent watching it: the agent is started first, as on a node.
fn start(state: &str, init: Init) -> (Agent, CriLab, Pod, f64) {
    // A killed run's pod first: the agent would adopt it, and its address is the one the new
    // pod gets.
    cri::cleanup_leftovers();
    let agent = Agent::start(&[]);
    let mut lab = CriLab::start(state);
    println!(
        "runtime: {} {}, state {}",
        lab.kubelet.runtime_name,
        lab.kubelet.runtime_version,
        lab.containerd.state.display()
    );
    let watched = agent.watched_addresses();
    let pod = lab.run_pod(web_pod(init));
    println!(
        "pod {}/{}: sandbox {} app {} at {}",
        pod.spec.namespace, pod.spec.name, pod.sandbox_id, pod.app_id, pod.ip
    );
    let task_dir = |id: &str| {
        lab.containerd
            .state
            .join("io.containerd.runtime.v2.task/k8s.io")
            .join(id)
    };
    assert!(
        task_dir(&pod.app_id).join("config.json").exists(),
        "the app's task state is under {}",
        lab.containerd.state.display()
    );
    if state != STATE_CONTAINERD {
        let node = std::path::Path::new(STATE_CONTAINERD).join("io.containerd.runtime.v2.task");
        assert!(
            !node.exists(),
            "{} exists: the layout under test must be the only one",
            node.display()
        );
    }
    wait_for(
        "the agent watches the pod's address",
        Duration::from_secs(15),
        || agent.watched_addresses() > watched,
    );
    let stops_before = agent.metric_sum(STOPS, &[]);
    (agent, lab, pod, stops_before)
}

/// What a deletion with requests in flight and a prober around it measured.
struct Measured {
    deletion: Deletion,
    app_exit: TaskExit,
    sandbox_exit: TaskExit,
    requests: Vec<RequestRecord>,
    probes: ProbeCounts,
}

impl Measured {
    fn cut(&self) -> usize {
        self.requests.iter().filter(|r| was_cut(r)).count() + self.probes.cut
    }
}

/// Deletes `pod` with `grace_secs`, `inflight` slow requests in flight and, with `probe`, a
/// prober that connects through the deletion: some attempts refused (the app gone, the
/// sandbox still holding the address), some unreachable (the address gone with the sandbox).
fn delete(lab: &mut CriLab, pod: &Pod, grace_secs: i64, inflight: usize, probe: bool) -> Measured {
    let load = InFlight::start(pod.addr(), inflight, 20_000, "cut", &pod.log_dir);
    // Bounded: 200 attempts at most, and stopped right after the deletion.
    let prober = probe.then(|| Prober::start(pod.addr(), Duration::from_millis(150), 200));
    let deletion = pod.delete_with(lab, grace_secs, |step| {
        let Some(p) = &prober else { return };
        let (kind, n) = match step {
            Step::ContainerStopped => (Attempt::Refused, 3),
            Step::SandboxStopped => (Attempt::Unreachable, 2),
        };
        wait_for(
            &format!("{n} attempts {kind:?} after {step:?}"),
            Duration::from_secs(10),
            || p.count(&kind) >= n,
        );
    });
    let probes = prober.map(Prober::finish).unwrap_or_default();
    let requests = load.finish();
    let m = Measured {
        deletion,
        app_exit: lab.exits.wait_exit(&pod.app_id, Duration::from_secs(10)),
        sandbox_exit: lab
            .exits
            .wait_exit(&pod.sandbox_id, Duration::from_secs(10)),
        requests,
        probes: ProbeCounts::of(&probes),
    };
    println!(
        "containerd: app exit status {}, sandbox exit status {}",
        m.app_exit.exit_status, m.sandbox_exit.exit_status
    );
    println!(
        "clients: {} requests in flight, {} cut; prober {:?}",
        m.requests.len(),
        m.requests.iter().filter(|r| was_cut(r)).count(),
        m.probes
    );
    assert_eq!(m.probes.other, 0, "prober attempts the lab cannot classify");
    m
}

/// The app's stop record once the pod's every stop would have settled (the sandbox's too, had
/// it been one), with every event before that processed.
fn settled_app_record(agent: &Agent, pod: &Pod, m: &Measured) -> Value {
    stop_record(agent, &pod.app_id);
    wait_for("the app's stop settles", SETTLE * 3, || {
        current_stop(agent, &pod.app_id).is_some_and(|s| s["settled"] == true)
    });
    // The sandbox's cgroup went by RemovePodSandbox at the latest.
    drainwatch_tests::lab::clock::sleep_until(
        m.deletion.sandbox_removed + SETTLE + Duration::from_secs(1),
    );
    sync(agent);
    let s = current_stop(agent, &pod.app_id).expect("the app's stop record");
    println!("drainwatch: {s:#}");
    s
}

/// Every check of drainwatch's answer against the truth, all made before the test fails, so
/// one run says everything that is wrong.
#[derive(Default)]
struct Checks(Vec<String>);

impl Checks {
    fn eq<T: PartialEq + std::fmt::Debug>(&mut self, what: &str, drainwatch: T, truth: T) {
        if drainwatch != truth {
            self.0.push(format!(
                "{what}: drainwatch {drainwatch:?}, truth {truth:?}"
            ));
        }
    }

    fn that(&mut self, what: &str, holds: bool, detail: impl std::fmt::Display) {
        if !holds {
            self.0.push(format!("{what}: {detail}"));
        }
    }

    fn done(self) {
        assert!(
            self.0.is_empty(),
            "{} checks failed:\n- {}",
            self.0.len(),
            self.0.join("\n- ")
        );
    }
}

/// One deleted pod, one judged stop: no record, counter or deploy outcome for the sandbox.
fn one_judged_stop(c: &mut Checks, agent: &Agent, pod: &Pod, stops_before: f64) {
    let (_, stops) = api(agent, "/api/v1/stops");
    let all = || stops.as_array().into_iter().flatten();
    let ids: Vec<&Value> = all()
        .filter(|s| s["container"]["pod"] == POD && s["container"]["namespace"] == NAMESPACE)
        .map(|s| &s["container"]["id"])
        .collect();
    c.eq(
        "stop records of the pod",
        ids,
        vec![&Value::from(pod.app_id.as_str())],
    );
    c.that(
        "no stop record for the sandbox",
        !all().any(|s| s["container"]["id"] == pod.sandbox_id),
        &pod.sandbox_id,
    );
    let metrics = agent.metrics_text();
    let pod_series: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with(STOPS) && l.contains("container=\"POD\""))
        .collect();
    c.that(
        "no stop counter series for the sandbox (container=\"POD\")",
        pod_series.is_empty(),
        format!("{pod_series:?}"),
    );
    let after = agent.metric_sum(STOPS, &[]);
    c.eq(&format!("{STOPS} increase"), after - stops_before, 1.0);
    let (_, deploys) = api(agent, "/api/v1/deploys");
    let outcomes: Vec<(String, u64)> = deploys
        .as_array()
        .into_iter()
        .flatten()
        .filter(|d| d["workload"] == WORKLOAD && d["namespace"] == NAMESPACE)
        .flat_map(|d| d["outcomes"].as_object().cloned().unwrap_or_default())
        .map(|(k, n)| (k, n.as_u64().unwrap_or(0)))
        .collect();
    c.that(
        "the deploy of shop/web: outcomes summing to 1",
        outcomes.iter().map(|(_, n)| n).sum::<u64>() == 1,
        format!("{outcomes:?}"),
    );
}

/// Names as the kubelet gave them; the runtime as containerd.
fn names_exact(c: &mut Checks, s: &Value) {
    let k = &s["container"];
    let got = ["name", "namespace", "pod", "workload", "runtime"].map(|f| k[f].clone());
    let want = ["app", NAMESPACE, POD, WORKLOAD, "containerd"].map(Value::from);
    c.eq(
        "names (container, namespace, pod, workload, runtime)",
        got,
        want,
    );
}

fn loss(s: &Value, kind: &str) -> Option<u64> {
    s["loss"][kind].as_u64()
}

/// What holds for every deletion: one judged stop, the names, the exit code as containerd
/// saw it, the cuts as the clients saw them, and the sandbox's end as a line on the app's
/// record. The app's settled record and the checks so far.
fn every_deletion(agent: &Agent, pod: &Pod, m: &Measured, stops_before: f64) -> (Value, Checks) {
    let s = settled_app_record(agent, pod, m);
    let mut c = Checks::default();
    one_judged_stop(&mut c, agent, pod, stops_before);
    names_exact(&mut c, &s);
    c.eq(
        "exit code",
        s["exit_code"].as_i64(),
        Some(i64::from(m.app_exit.exit_status)),
    );
    c.eq(
        "in-flight cut",
        loss(&s, "inflight_cut"),
        Some(m.cut() as u64),
    );
    let exit = instant(&s["exit_at"]);
    match (exit, instant(&s["sandbox_stopped_at"])) {
        (Some(exit), Some(sandbox)) => {
            c.that("sandbox_stopped_at after exit_at", sandbox > exit, "");
            // Within the StopPodSandbox call (the API's times are to the millisecond).
            let slack = Duration::from_millis(50);
            c.that(
                "sandbox_stopped_at within the StopPodSandbox call",
                sandbox + slack >= m.deletion.sandbox_stop_issued
                    && sandbox <= m.deletion.sandbox_stopped + slack,
                "",
            );
        }
        (e, sb) => c.that(
            "exit_at and sandbox_stopped_at on the app's record",
            false,
            format!("{e:?} {sb:?}: {} {}", s["exit_at"], s["sandbox_stopped_at"]),
        ),
    }
    (s, c)
}

/// The scenario (a) and (c) share: a handler-less server behind catatonit (SIGTERM's default
/// action: exit 143) deleted with requests in flight and a prober around the deletion.
fn deletion_with_requests_in_flight(state: &str) {
    let (agent, mut lab, pod, stops_before) = start(state, Init::Catatonit);
    let m = delete(&mut lab, &pod, 10, 3, true);
    assert_eq!(m.app_exit.exit_status, 143, "lab: SIGTERM's default action");
    assert!(
        m.probes.refused > 0 && m.probes.unreachable > 0,
        "lab: {:?}",
        m.probes
    );
    let (s, mut c) = every_deletion(&agent, &pod, &m, stops_before);
    c.eq(
        "refused",
        loss(&s, "refused"),
        Some(m.probes.refused as u64),
    );
    c.eq(
        "unreachable, on the app's record",
        loss(&s, "unreachable"),
        Some(m.probes.unreachable as u64),
    );
    c.done();
}

#[test]
fn a_deleted_pod_with_requests_in_flight_is_one_stop_with_its_losses_on_the_app() {
    deletion_with_requests_in_flight(STATE_CONTAINERD);
}

#[test]
fn a_server_as_pid_1_without_a_handler_ignores_sigterm_and_is_killed_at_the_deadline() {
    let (agent, mut lab, pod, stops_before) = start(STATE_CONTAINERD, Init::None);
    let t = Instant::now();
    let m = delete(&mut lab, &pod, 3, 2, false);
    assert_eq!(
        m.app_exit.exit_status, 137,
        "lab: SIGKILLed at the deadline"
    );
    let took = m.deletion.container_stopped - m.deletion.stop_issued;
    assert!(
        took >= Duration::from_secs(3),
        "StopContainer took {took:?}"
    );
    let (s, mut c) = every_deletion(&agent, &pod, &m, stops_before);
    // Why the kernel dropped it: the record names the reason (`IgnoredSignal`), not a flag.
    c.eq(
        "stop_signal_ignored",
        &s["stop_signal_ignored"],
        &Value::from("pid1_without_handler"),
    );
    let verdict = s["verdict"].as_str().unwrap_or_default();
    println!("verdict: {verdict} ({:.1} s)", t.elapsed().as_secs_f64());
    c.that(
        "the verdict names the ignored signal",
        verdict.contains("ignored"),
        verdict,
    );
    c.that(
        "the verdict does not say to raise the grace period",
        !verdict.contains("raise"),
        verdict,
    );
    c.done();
}

#[test]
fn a_k3s_node_keeps_containerd_state_under_run_k3s() {
    deletion_with_requests_in_flight(STATE_K3S);
}

#[test]
fn a_microk8s_node_keeps_containerd_state_in_its_snap() {
    deletion_with_requests_in_flight(STATE_MICROK8S);
}
