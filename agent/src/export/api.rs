//! The report API's JSON: stop records and deploys with the field names the API promises,
//! times as RFC 3339 with milliseconds (null when the moment did not happen).

use serde_json::{Value, json};

use crate::model::{Loss, Mono, deploy::Deploy, monotonic_now, stop::Stop, storm::Storm};

/// Converts kernel monotonic time to wall-clock time.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    /// Wall-clock nanoseconds since the epoch minus monotonic nanoseconds, taken at start-up.
    pub offset_ns: i128,
}

impl Clock {
    pub fn now() -> Self {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        Self {
            offset_ns: wall - monotonic_now() as i128,
        }
    }

    pub fn rfc3339(&self, t: Mono) -> String {
        let ns = (t as i128 + self.offset_ns).max(0) as u128;
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns as u64);
        humantime::format_rfc3339_millis(at).to_string()
    }

    fn opt(&self, t: Option<Mono>) -> Value {
        t.map_or(Value::Null, |t| Value::String(self.rfc3339(t)))
    }
}

fn round3(x: Option<f64>) -> Value {
    x.map_or(Value::Null, |v| json!((v * 1000.0).round() / 1000.0))
}

pub fn loss_json(l: &Loss) -> Value {
    json!({
        "inflight_cut": l.inflight_cut,
        "idle_closed": l.idle_closed,
        "resets_sent": l.resets_sent,
        "refused": l.refused,
        "unreachable": l.unreachable,
        "accepted_after_sigterm": l.accepted_after_sigterm,
        "retry_duplicates": l.retry_duplicates,
        "upstream_aborts": l.upstream_aborts,
    })
}

pub fn stop_json(s: &Stop, clock: &Clock) -> Value {
    json!({
        "id": s.id,
        "container": s.container,
        "sigterm_at": clock.opt(s.sigterm_at),
        "sigterm_sender": s.sigterm_sender,
        "sigkill_at": clock.opt(s.sigkill_at),
        "exit_at": clock.opt(s.exit_at),
        "exit_code": s.exit.and_then(|e| e.code),
        "exit_signal": s.exit.and_then(|e| e.signal),
        "cgroup_removed_at": clock.opt(s.cgroup_removed_at),
        "listeners": s.listeners.iter().map(|l| json!({
            "address": l.address.to_string(),
            "closed_at": clock.opt(l.closed_at),
        })).collect::<Vec<_>>(),
        "last_accept_at": clock.opt(s.last_accept_at),
        "connections_at_sigterm": s.connections_at_sigterm,
        "connections_at_exit": s.connections_at_exit,
        "grace_seconds": round3(s.grace_seconds()),
        "drain_seconds": round3(s.drain_seconds()),
        "routing_lag_seconds": round3(s.routing_lag_seconds()),
        "grace_configured_seconds": s.grace_configured_seconds,
        "prestop": s.prestop,
        "loss": loss_json(&s.loss),
        "loss_events": s.events.iter().map(|e| json!({
            "at": clock.rfc3339(e.at),
            "kind": e.kind,
            "open_seconds": round3(e.open_for.map(|d| d as f64 / 1e9)),
        })).collect::<Vec<_>>(),
        "loss_events_dropped": s.events_dropped,
        "outcome": s.outcome(),
    })
}

pub fn deploy_json(d: &Deploy, clock: &Clock) -> Value {
    json!({
        "id": d.id,
        "namespace": d.namespace,
        "workload": d.workload,
        "workload_kind": d.workload_kind,
        "revisions": d.revisions,
        "started_at": clock.rfc3339(d.started_at),
        "last_stop_at": clock.rfc3339(d.last_stop_at),
        "stops": d.stops,
        "outcomes": d.outcomes,
        "in_progress": d.in_progress,
        "loss": loss_json(&d.loss),
    })
}

/// A storm; `deploy_id` is the deploy its stop belongs to.
pub fn storm_json(s: &Storm, deploy_id: Option<&str>, clock: &Clock) -> Value {
    json!({
        "deploy_id": deploy_id,
        "namespace": s.namespace,
        "workload": s.workload,
        "container": s.container,
        "port": s.port,
        "stop_id": s.stop_id,
        "first_arrival_at": clock.rfc3339(s.first_arrival),
        "last_arrival_at": clock.rfc3339(s.last_arrival),
        "clients": s.clients,
        "seconds_to_95_percent": (s.seconds_to_95_percent * 1000.0).round() / 1000.0,
        "peak_arrivals_per_second": s.peak_arrivals_per_second,
        "arrivals_per_100ms": s.arrivals_per_bucket,
        "max_queue_depth": s.max_queue_depth,
        "overflows": s.overflows,
        "netns_listen_overflows": s.netns_listen_overflows,
        "netns_listen_drops": s.netns_listen_drops,
        "accept_wait_p50_seconds": round3(s.accept_wait_quantile(0.5)),
        "accept_wait_p95_seconds": round3(s.accept_wait_quantile(0.95)),
        "accept_wait_max_seconds": round3(s.accept_waits.last().copied()),
        "sustained_accept_rate": round3(s.sustained_accept_rate),
        "recommended_window_seconds": round3(s.recommended_window_seconds),
    })
}

/// Newest first, each linked to the deploy of its stop.
pub fn storms_json(storms: &[Storm], deploys: &[Deploy], clock: &Clock) -> Value {
    let deploy_of = |stop: &str| {
        deploys
            .iter()
            .find(|d| d.stops.iter().any(|s| s == stop))
            .map(|d| d.id.as_str())
    };
    Value::Array(
        storms
            .iter()
            .rev()
            .map(|s| storm_json(s, deploy_of(&s.stop_id), clock))
            .collect(),
    )
}

/// Newest first.
pub fn stops_json(stops: &[Stop], clock: &Clock) -> Value {
    let mut v: Vec<&Stop> = stops.iter().collect();
    v.sort_by_key(|s| std::cmp::Reverse(s.started_at()));
    Value::Array(v.into_iter().map(|s| stop_json(s, clock)).collect())
}

pub fn deploys_json(deploys: &[Deploy], clock: &Clock) -> Value {
    Value::Array(deploys.iter().map(|d| deploy_json(d, clock)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        ContainerIdentity, ExitInfo, LossKind, SECOND, Sender,
        stop::{ListenerTimeline, LossEvent},
    };

    #[test]
    fn a_stop_renders_with_the_promised_field_names() {
        let clock = Clock {
            offset_ns: 1_700_000_000 * 1_000_000_000,
        };
        let s = Stop {
            id: "abc-1".into(),
            container: ContainerIdentity {
                id: "abc".into(),
                runtime: "podman".into(),
                name: "web-1".into(),
                workload: "web".into(),
                ..Default::default()
            },
            sigterm_at: Some(10 * SECOND),
            stop_signal: Some(15),
            sigterm_sender: Some(Sender {
                pid: 7,
                comm: "runc".into(),
            }),
            sigkill_at: None,
            exit_at: Some(10 * SECOND + 2_500_000),
            exit: Some(ExitInfo {
                code: Some(143),
                signal: Some(15),
            }),
            cgroup_removed_at: None,
            listeners: vec![ListenerTimeline {
                address: "10.88.0.2:8080".parse().unwrap(),
                closed_at: Some(10 * SECOND + 2_600_000),
            }],
            last_accept_at: None,
            connections_at_sigterm: Some(2),
            connections_at_exit: Some(2),
            grace_configured_seconds: Some(30),
            prestop: None,
            loss: Loss {
                inflight_cut: 2,
                ..Default::default()
            },
            events: vec![LossEvent {
                at: 10 * SECOND + 2_500_000,
                kind: LossKind::InflightCut,
                open_for: Some(1_250_000_000),
            }],
            events_dropped: 0,
            last_routed_at: Some(13 * SECOND + 800_000_000),
            settled: false,
        };
        let v = stop_json(&s, &clock);
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
            json!([{"at": "2023-11-14T22:13:30.002Z", "kind": "inflight_cut", "open_seconds": 1.25}])
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
        let v = storms_json(
            &[storm("a-1"), storm("b-1"), storm("gone-1")],
            &[deploy("ws-1", "a-1"), deploy("ws-2", "b-1")],
            &clock,
        );
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
}
