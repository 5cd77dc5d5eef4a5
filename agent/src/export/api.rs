//! The report API: stop records, deploys and storms from `crate::model` as the typed views
//! `/api/v1/*` serve (`view.rs`), times as RFC 3339 with milliseconds (null when the moment did
//! not happen) and seconds rounded to the millisecond.

use crate::model::{
    ContainerIdentity, Mono,
    deploy::Deploy,
    monotonic_now,
    start::{MAX_REFUSALS_DRAWN, Start},
    stop::Stop,
    storm::Storm,
};

use super::{
    verdict,
    view::{
        ContainerView, DeployView, GapView, ListenerView, LossEventView, SenderView, StartView,
        StopView, StormView, StreamLifetimesView,
    },
};

/// Converts kernel monotonic time to wall-clock time.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    /// Wall-clock nanoseconds since the epoch minus monotonic nanoseconds.
    pub offset_ns: i128,
}

/// How far a fresh reading of the offset may stray from the one in use before it replaces it:
/// two reads of two clocks differ by the time between them (microseconds, more when the
/// thread is preempted), which must not move every time by a millisecond from one answer to
/// the next; a step of the wall clock (NTP, an operator) is larger.
pub const CLOCK_STEP_NS: i128 = 50_000_000;

impl Clock {
    /// Reads both clocks now.
    pub fn now() -> Self {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        Self::from_readings(wall, monotonic_now())
    }

    /// The offset of a wall-clock and a monotonic reading taken together.
    pub fn from_readings(wall_ns: i128, mono: Mono) -> Self {
        Self {
            offset_ns: wall_ns - mono as i128,
        }
    }

    /// The clock to use after a fresh reading: `fresh` when the wall clock was stepped (or
    /// slewed by `CLOCK_STEP_NS` in all) since `self` was taken, else `self`, so times stay
    /// identical between answers while the wall clock does not move.
    pub fn follow(self, fresh: Self) -> Self {
        if (fresh.offset_ns - self.offset_ns).abs() >= CLOCK_STEP_NS {
            fresh
        } else {
            self
        }
    }

    pub fn rfc3339(&self, t: Mono) -> String {
        let ns = (t as i128 + self.offset_ns).max(0) as u128;
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns as u64);
        humantime::format_rfc3339_millis(at).to_string()
    }

    fn opt(&self, t: Option<Mono>) -> Option<String> {
        t.map(|t| self.rfc3339(t))
    }
}

/// Seconds to the millisecond.
fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn container_view(c: &ContainerIdentity) -> ContainerView {
    ContainerView {
        id: c.id.clone(),
        name: c.name.clone(),
        namespace: c.namespace.clone(),
        node: c.node.clone(),
        pod: c.pod.clone(),
        revision: c.revision.clone(),
        runtime: c.runtime.clone(),
        workload: c.workload.clone(),
        workload_kind: c.workload_kind.clone(),
    }
}

pub fn start_view(s: &Start, clock: &Clock) -> StartView {
    let mut v = StartView {
        container: container_view(&s.container),
        ebpf_faults: s.ebpf_faults,
        events_lost: s.events_lost,
        first_accept_at: clock.opt(s.first_accept_at),
        first_listen_at: clock.opt(s.first_listen_at),
        id: s.id.clone(),
        listen_after_seconds: s.listen_after_seconds().map(round3),
        loss: s.loss.clone(),
        netns_by_inode: s.first_listen_at.is_some() && s.netns_cookie.is_none(),
        ports: s.ports.iter().map(|(p, _)| *p).collect(),
        ready_at: ready_at(s, clock),
        refusals_lost: s.refusals_lost,
        refused_at: s
            .refused_at
            .iter()
            .take(MAX_REFUSALS_DRAWN)
            .map(|t| clock.rfc3339(*t))
            .collect(),
        restart: s.restart,
        settled: s.settled,
        started_at: clock.rfc3339(s.started_at),
        verdict: String::new(),
    };
    v.verdict = verdict::start(&v).text;
    v
}

/// The pod's Ready time (whole seconds, from the API) when it is this start's: not before
/// the second the start began in (a Ready of an earlier run).
fn ready_at(s: &Start, clock: &Clock) -> Option<String> {
    let ready = i128::from(s.container.pod_ready_at?) * 1_000_000_000;
    let started_wall = s.started_at as i128 + clock.offset_ns;
    if ready < started_wall - started_wall.rem_euclid(1_000_000_000) {
        return None;
    }
    let mono = u64::try_from(ready - clock.offset_ns).ok()?;
    Some(clock.rfc3339(mono))
}

/// Newest first.
pub fn start_views(starts: &[Start], clock: &Clock) -> Vec<StartView> {
    starts.iter().rev().map(|s| start_view(s, clock)).collect()
}

pub fn stop_view(s: &Stop, clock: &Clock) -> StopView {
    StopView {
        agent_gap: s.agent_gap.map(|g| GapView {
            from: clock.rfc3339(g.from),
            to: clock.rfc3339(g.to),
            seconds: round3(g.seconds()),
        }),
        attempts_in_flight: s.attempts_in_flight,
        attempts_unresolved: s.attempts_unresolved,
        cgroup_removed_at: clock.opt(s.cgroup_removed_at),
        complete: s.complete,
        connections_at_exit: s.connections_at_exit,
        connections_at_sigterm: s.connections_at_sigterm,
        container: container_view(&s.container),
        drain_seconds: s.drain_seconds().map(round3),
        ebpf_faults: s.ebpf_faults,
        events_lost: s.events_lost,
        exit_at: clock.opt(s.exit_at),
        exit_code: s.exit.and_then(|e| e.code),
        exit_signal: s.exit.and_then(|e| e.signal),
        grace_configured_seconds: s.grace_configured_seconds,
        grace_seconds: s.grace_seconds().map(round3),
        id: s.id.clone(),
        last_accept_at: clock.opt(s.last_accept_at),
        listeners: s
            .listeners
            .iter()
            .map(|l| ListenerView {
                address: l.address.to_string(),
                closed_at: clock.opt(l.closed_at),
            })
            .collect(),
        loss: s.loss.clone(),
        loss_events: s
            .events
            .iter()
            .map(|e| LossEventView {
                at: clock.rfc3339(e.at),
                kind: e.kind,
                open_seconds: e.open_for.map(|d| round3(d as f64 / 1e9)),
                request_seconds: e.request_for.map(|d| round3(d as f64 / 1e9)),
            })
            .collect(),
        loss_events_dropped: s.events_dropped,
        outcome: s.outcome(),
        prestop: s.prestop,
        routing_lag_seconds: s.routing_lag_seconds().map(round3),
        sandbox_stopped_at: clock.opt(s.sandbox_stopped_at),
        sigkill_at: clock.opt(s.sigkill_at),
        sigterm_at: clock.opt(s.sigterm_at),
        sigterm_sender: s.sigterm_sender.as_ref().map(|x| SenderView {
            comm: x.comm.clone(),
            pid: x.pid,
        }),
        settled: s.settled,
        stop_signal_ignored: s.stop_signal_ignored,
        storm_clients: None,
        stream_lifetimes: s.stream_lifetimes.map(|l| StreamLifetimesView {
            max_seconds: round3(l.max as f64 / 1e9),
            p50_seconds: round3(l.p50 as f64 / 1e9),
            p95_seconds: round3(l.p95 as f64 / 1e9),
            shape: l.shape,
            streams: l.streams,
        }),
        stream_rotation_seconds: s.stream_rotation_seconds().map(round3),
        streams_ended_by_server: s.streams_ended_by_server(),
        verdict: String::new(),
    }
}

pub fn deploy_view(d: &Deploy, clock: &Clock) -> DeployView {
    DeployView {
        id: d.id.clone(),
        in_progress: d.in_progress,
        last_stop_at: clock.rfc3339(d.last_stop_at),
        loss: d.loss.clone(),
        namespace: d.namespace.clone(),
        outcomes: d.outcomes.clone(),
        pods: d.pods.clone(),
        refused_before_listen: d.refused_before_listen,
        revisions: d.revisions.clone(),
        started_at: clock.rfc3339(d.started_at),
        starts: d.starts.clone(),
        stops: d.stops.clone(),
        workload: d.workload.clone(),
        workload_kind: d.workload_kind.clone(),
    }
}

/// A storm; `deploy_id` is the deploy its stop belongs to.
pub fn storm_view(s: &Storm, deploy_id: Option<&str>, clock: &Clock) -> StormView {
    StormView {
        accept_wait_max_seconds: s.accept_waits.last().copied().map(round3),
        accept_wait_p50_seconds: s.accept_wait_quantile(0.5).map(round3),
        accept_wait_p95_seconds: s.accept_wait_quantile(0.95).map(round3),
        arrivals_per_100ms: s.arrivals_per_bucket.clone(),
        clients: s.clients,
        connections: s.connections,
        container: s.container.clone(),
        deploy_id: deploy_id.map(str::to_string),
        first_arrival_at: clock.rfc3339(s.first_arrival),
        first_attempts_seconds: s.first_attempts_seconds.map(round3),
        last_arrival_at: clock.rfc3339(s.last_arrival),
        max_queue_depth: s.max_queue_depth,
        namespace: s.namespace.clone(),
        netns_listen_drops: s.netns_listen_drops,
        netns_listen_overflows: s.netns_listen_overflows,
        overflows: s.overflows,
        peak_arrivals_per_second: s.peak_arrivals_per_second,
        port: s.port,
        recommended_window_seconds: s.recommended_window_seconds.map(round3),
        seconds_to_95_percent: round3(s.seconds_to_95_percent),
        stop_id: s.stop_id.clone(),
        sustained_accept_rate: s.sustained_accept_rate.map(round3),
        workload: s.workload.clone(),
    }
}

/// Newest first, each linked to the deploy of its stop.
pub fn storm_views(storms: &[Storm], deploys: &[Deploy], clock: &Clock) -> Vec<StormView> {
    let deploy_of = |stop: &str| {
        deploys
            .iter()
            .find(|d| d.stops.iter().any(|s| s == stop))
            .map(|d| d.id.as_str())
    };
    storms
        .iter()
        .rev()
        .map(|s| storm_view(s, deploy_of(&s.stop_id), clock))
        .collect()
}

/// Newest first, each with the clients of the storms it caused.
pub fn stop_views(stops: &[Stop], storms: &[Storm], clock: &Clock) -> Vec<StopView> {
    let mut v: Vec<&Stop> = stops.iter().collect();
    v.sort_by_key(|s| std::cmp::Reverse(s.started_at()));
    v.into_iter()
        .map(|s| {
            let mut view = stop_view(s, clock);
            let mine = storms.iter().filter(|st| st.stop_id == s.id);
            view.storm_clients = mine.map(|st| st.clients).reduce(|a, b| a + b);
            view.verdict = verdict::stop(&view).text;
            view
        })
        .collect()
}

pub fn deploy_views(deploys: &[Deploy], clock: &Clock) -> Vec<DeployView> {
    deploys.iter().map(|d| deploy_view(d, clock)).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    #[test]
    fn times_follow_a_stepped_wall_clock() {
        let mono = 5 * SECOND;
        let start = Clock::from_readings(1_700_000_000 * SECOND as i128, mono);
        assert_eq!(start.rfc3339(mono), "2023-11-14T22:13:20.000Z");
        // A second reading 2 s later, 30 µs apart: the same offset give or take the gap
        // between the reads, so every time stays what it was.
        let later =
            Clock::from_readings(1_700_000_002 * SECOND as i128 + 30_000, mono + 2 * SECOND);
        assert_eq!(start.follow(later).offset_ns, start.offset_ns);
        // NTP steps the wall clock back 90 s: a moment already recorded is now shown on the
        // new clock, and a moment after the step too.
        let stepped = Clock::from_readings(1_699_999_912 * SECOND as i128, mono + 2 * SECOND);
        let now = start.follow(later).follow(stepped);
        assert_eq!(now.offset_ns, start.offset_ns - 90 * SECOND as i128);
        assert_eq!(now.rfc3339(mono), "2023-11-14T22:11:50.000Z");
        assert_eq!(now.rfc3339(mono + 2 * SECOND), "2023-11-14T22:11:52.000Z");
        // Forwards too, and a step just under the threshold is jitter.
        let ahead = Clock::from_readings(now.offset_ns + 3600 * SECOND as i128, 0);
        assert_eq!(now.follow(ahead).rfc3339(mono), "2023-11-14T23:11:50.000Z");
        let small = Clock {
            offset_ns: now.offset_ns + CLOCK_STEP_NS - 1,
        };
        assert_eq!(now.follow(small).offset_ns, now.offset_ns);
    }
    use crate::model::{
        ContainerIdentity, ExitInfo, Loss, LossKind, SECOND, Sender,
        stop::{ListenerTimeline, LossEvent},
    };

    fn clock() -> Clock {
        Clock {
            offset_ns: 1_700_000_000 * 1_000_000_000,
        }
    }

    fn sample_stop() -> Stop {
        Stop {
            sigterm_at: Some(10 * SECOND),
            stop_signal: Some(15),
            sigterm_sender: Some(Sender {
                pid: 7,
                comm: "runc".into(),
            }),
            exit_at: Some(10 * SECOND + 2_500_000),
            exit: Some(ExitInfo {
                code: Some(143),
                signal: Some(15),
            }),
            listeners: vec![ListenerTimeline {
                address: "10.88.0.2:8080".parse().unwrap(),
                closed_at: Some(10 * SECOND + 2_600_000),
            }],
            connections_at_sigterm: Some(2),
            connections_at_exit: Some(2),
            grace_configured_seconds: Some(30),
            loss: Loss {
                inflight_cut: 2,
                ..Default::default()
            },
            events: vec![LossEvent {
                at: 10 * SECOND + 2_500_000,
                kind: LossKind::InflightCut,
                open_for: Some(1_250_000_000),
                request_for: Some(40_000_000),
            }],
            last_routed_at: Some(13 * SECOND + 800_000_000),
            ..Stop::new(
                "abc-1".into(),
                ContainerIdentity {
                    id: "abc".into(),
                    runtime: "podman".into(),
                    name: "web-1".into(),
                    workload: "web".into(),
                    ..Default::default()
                },
            )
        }
    }

    #[test]
    fn a_stop_renders_with_the_promised_field_names() {
        let v = serde_json::to_value(stop_view(&sample_stop(), &clock())).unwrap();
        let keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        for k in [
            "container",
            "sigterm_at",
            "sigterm_sender",
            "sigkill_at",
            "exit_at",
            "exit_code",
            "exit_signal",
            "cgroup_removed_at",
            "listeners",
            "last_accept_at",
            "connections_at_sigterm",
            "connections_at_exit",
            "grace_seconds",
            "drain_seconds",
            "routing_lag_seconds",
            "grace_configured_seconds",
            "prestop",
            "loss",
            "loss_events",
            "loss_events_dropped",
            "outcome",
            "verdict",
        ] {
            assert!(keys.iter().any(|x| x == k), "missing {k}");
        }
        assert_eq!(v["sigterm_at"], "2023-11-14T22:13:30.000Z");
        assert_eq!(v["exit_at"], "2023-11-14T22:13:30.002Z");
        assert_eq!(v["sigkill_at"], Value::Null);
        assert_eq!(v["drain_seconds"], 0.003);
        assert_eq!(v["outcome"], "exit_at_once");
        assert_eq!(v["container"]["workload"], "web");
        assert_eq!(v["listeners"][0]["address"], "10.88.0.2:8080");
        assert_eq!(v["loss"]["inflight_cut"], 2);
        assert_eq!(v["routing_lag_seconds"], 3.8);
        assert_eq!(
            v["loss_events"],
            json!([{"at": "2023-11-14T22:13:30.002Z", "kind": "inflight_cut", "open_seconds": 1.25, "request_seconds": 0.04}])
        );
        assert_eq!(v["grace_configured_seconds"], 30);
        assert_eq!(v["prestop"], Value::Null);
        for k in [
            "id",
            "runtime",
            "name",
            "namespace",
            "pod",
            "workload",
            "workload_kind",
            "revision",
            "node",
        ] {
            assert!(v["container"].get(k).is_some(), "container.{k}");
        }
    }

    #[test]
    fn a_storm_names_the_deploy_of_its_stop() {
        let clock = Clock { offset_ns: 0 };
        let deploy = |id: &str, stop: &str| Deploy {
            id: id.into(),
            namespace: String::new(),
            workload: "ws".into(),
            workload_kind: String::new(),
            revisions: Vec::new(),
            started_at: 0,
            last_stop_at: 0,
            stops: vec![stop.into()],
            pods: Vec::new(),
            starts: Vec::new(),
            refused_before_listen: 0,
            outcomes: Default::default(),
            in_progress: 0,
            loss: Loss::default(),
        };
        let storm = |stop: &str| Storm {
            stop_id: stop.into(),
            clients: 20,
            netns_listen_overflows: Some(3),
            ..Default::default()
        };
        let v = serde_json::to_value(storm_views(
            &[storm("a-1"), storm("b-1"), storm("gone-1")],
            &[deploy("ws-1", "a-1"), deploy("ws-2", "b-1")],
            &clock,
        ))
        .unwrap();
        let ids: Vec<&Value> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|s| &s["deploy_id"])
            .collect();
        assert_eq!(
            ids,
            [&Value::Null, &json!("ws-2"), &json!("ws-1")],
            "newest first"
        );
        assert_eq!(v[0]["netns_listen_overflows"], 3);
        assert_eq!(v[0]["recommended_window_seconds"], Value::Null);
    }

    #[test]
    fn a_start_shows_its_pods_ready_time_only_when_it_is_its_own() {
        // Wall clock = monotonic + 1,700,000,000 s.
        let clock = Clock {
            offset_ns: 1_700_000_000 * SECOND as i128,
        };
        let start = |ready: Option<i64>| Start {
            id: "abc-start-2".into(),
            container: ContainerIdentity {
                pod_ready_at: ready,
                ..Default::default()
            },
            restart: true,
            netns: None,
            netns_cookie: None,
            fresh_netns: false,
            started_at: 100 * SECOND + SECOND / 2,
            first_listen_at: Some(103 * SECOND),
            first_accept_at: None,
            ports: vec![(8080, 103 * SECOND)],
            loss: Default::default(),
            refused_at: vec![],
            probe_refused_at: vec![],
            refusals_lost: 0,
            events_lost: 0,
            ebpf_faults: 0,
            settled: true,
        };
        let v = |ready| start_view(&start(ready), &clock).ready_at;
        assert_eq!(
            v(Some(1_700_000_104)).as_deref(),
            Some("2023-11-14T22:15:04.000Z")
        );
        // Ready in the second it started (the API keeps whole seconds): its own.
        assert!(v(Some(1_700_000_100)).is_some());
        // Ready before this run started: the run before's.
        assert_eq!(v(Some(1_700_000_099)), None);
        assert_eq!(v(None), None);
    }

    /// Serialized as declared, the views must come out as the API always served them: every
    /// object's keys sorted, as serde_json's maps sort them.
    #[test]
    fn views_serialize_with_sorted_keys_as_the_api_always_served() {
        fn sorted<T: serde::Serialize>(v: &T) {
            let direct = serde_json::to_string_pretty(v).unwrap();
            let through_map =
                serde_json::to_string_pretty(&serde_json::to_value(v).unwrap()).unwrap();
            assert_eq!(direct, through_map);
        }
        let mut stop = sample_stop();
        stop.loss.count(LossKind::ResetsSent, Some("NOT_SPECIFIED"));
        let mut lifetimes = [6 * SECOND, 5 * SECOND];
        stop.stream_lifetimes = crate::model::streams::StreamLifetimes::of(&mut lifetimes);
        let deploys = crate::correlate::deploys::group(std::slice::from_ref(&stop), &[], SECOND);
        let storm = Storm {
            stop_id: stop.id.clone(),
            accept_waits: vec![0.1, 0.2],
            sustained_accept_rate: Some(12.5),
            recommended_window_seconds: Some(1.6),
            ..Default::default()
        };
        sorted(&stop_views(std::slice::from_ref(&stop), &[], &clock()));
        sorted(&deploy_views(&deploys, &clock()));
        let start = Start {
            id: "abc-start-1".into(),
            container: stop.container.clone(),
            restart: true,
            netns: Some(1),
            netns_cookie: None,
            fresh_netns: false,
            started_at: 0,
            first_listen_at: Some(SECOND),
            first_accept_at: None,
            ports: vec![(8080, SECOND)],
            loss: Default::default(),
            refused_at: vec![SECOND / 2],
            probe_refused_at: vec![],
            refusals_lost: 0,
            events_lost: 0,
            ebpf_faults: 0,
            settled: false,
        };
        sorted(&start_views(&[start], &clock()));
        sorted(&storm_views(&[storm], &deploys, &clock()));
        // Read back, they are what was served.
        let view = stop_view(&stop, &clock());
        let text = serde_json::to_string(&view).unwrap();
        assert_eq!(serde_json::from_str::<StopView>(&text).unwrap(), view);
        let deploy = deploy_view(&deploys[0], &clock());
        let text = serde_json::to_string(&deploy).unwrap();
        assert_eq!(serde_json::from_str::<DeployView>(&text).unwrap(), deploy);
    }
}
