//! `drainwatch report`: reads a running agent's report API into its views and prints deploys
//! and their stops as a timeline with the loss and a one-line verdict per stop.

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::Duration,
};

use serde::de::DeserializeOwned;

use super::{
    format::{hms, or_null},
    terminal, verdict,
    view::{DeployView, LossView, StartView, StopView, StormView},
};
use crate::model::{LossKind, stop::Outcome};

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("cannot reach the agent at {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("the agent at {addr} answered {path} with: {status}")]
    Status {
        addr: String,
        path: String,
        status: String,
    },
    #[error("the agent's {path} is not valid JSON: {source}")]
    Json {
        path: String,
        source: serde_json::Error,
    },
}

/// What `drainwatch report` prints: the deploys, their stops and the storms, or with `json`
/// the stop records as the agent serves them.
pub fn run(agent: &str, json: bool, token: Option<&str>) -> Result<String, ReportError> {
    if json {
        let stops: serde_json::Value = fetch(agent, "/api/v1/stops", token)?;
        return Ok(format!("{stops:#}\n"));
    }
    let stops: Vec<StopView> = fetch(agent, "/api/v1/stops", token)?;
    let deploys: Vec<DeployView> = fetch(agent, "/api/v1/deploys", token)?;
    let storms: Vec<StormView> = fetch(agent, "/api/v1/storms", token)?;
    // An agent that predates start records answers 404: none then.
    let starts: Vec<StartView> = match fetch(agent, "/api/v1/starts", token) {
        Err(ReportError::Status { status, .. }) if status.contains(" 404 ") => Vec::new(),
        other => other?,
    };
    Ok(render(&deploys, &stops) + &render_starts(&starts) + &render_storms(&storms))
}

/// Renders container starts (newest first).
pub fn render_starts(starts: &[StartView]) -> String {
    let mut out = String::new();
    for s in starts {
        let c = &s.container;
        out.push_str(&format!(
            "{} {} ({} {}) at {}: listened after {} s, {} refused before listen, {} health checks refused\n  verdict: {}\n\n",
            if s.restart { "RESTART" } else { "START" },
            c.name,
            c.runtime,
            c.id.chars().take(12).collect::<String>(),
            s.started_at,
            f3(s.listen_after_seconds),
            s.loss.refused_before_listen,
            s.loss.probes.refused,
            verdict::start(s).text,
        ));
    }
    out
}

/// GET over plain HTTP/1.1 from an agent address (`127.0.0.1:9464` or `http://host:port`),
/// the body read as `T`. Hand-written: a one-shot local request does not need an HTTP client
/// stack.
pub fn fetch<T: DeserializeOwned>(
    agent: &str,
    path: &str,
    token: Option<&str>,
) -> Result<T, ReportError> {
    let addr = agent
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let connect = |source| ReportError::Connect {
        addr: addr.clone(),
        source,
    };
    let mut s = TcpStream::connect(&addr).map_err(connect)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(connect)?;
    let auth = token.map_or(String::new(), |t| {
        format!("Authorization: Bearer {}\r\n", t.trim())
    });
    // One write: `write!` on a bare socket sends each piece of the format as its own segment.
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: application/json\r\n{auth}Connection: close\r\n\r\n"
    );
    s.write_all(request.as_bytes()).map_err(connect)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(connect)?;
    let raw = String::from_utf8_lossy(&raw);
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.lines().next().unwrap_or_default();
    if !status.contains(" 200 ") {
        return Err(ReportError::Status {
            addr,
            path: path.into(),
            status: status.into(),
        });
    }
    let json = |source| ReportError::Json {
        path: path.into(),
        source,
    };
    // Names go to a terminal: no control characters in any of them.
    let mut v = serde_json::from_str(body).map_err(json)?;
    terminal::clean(&mut v);
    serde_json::from_value(v).map_err(json)
}

/// The non-zero counts, in the kinds' display order ("nothing lost" without any), then failed
/// health checks apart.
fn loss_line(loss: &LossView) -> String {
    let parts: Vec<String> = LossKind::ALL
        .iter()
        .filter(|k| !k.is_probe() && loss.get(**k) > 0)
        .map(|k| format!("{} {}", loss.get(*k), k.info().words))
        .collect();
    let mut line = if parts.is_empty() {
        "nothing lost".to_string()
    } else {
        parts.join(", ")
    };
    // Health checks apart from the requests above, when any failed.
    let p = &loss.probes;
    if p.cut + p.refused + p.unreachable > 0 {
        line += &format!(
            "; health checks failed (not users): {} cut, {} refused, {} unreachable",
            p.cut, p.refused, p.unreachable
        );
    }
    line
}

fn timeline(stop: &StopView) -> Vec<(String, String)> {
    let mut rows = Vec::new();
    let mut at = |t: &Option<String>, what: String| {
        if let Some(t) = t {
            rows.push((t.clone(), what));
        }
    };
    let (comm, pid) = stop
        .sigterm_sender
        .as_ref()
        .map_or(("", 0), |s| (s.comm.as_str(), s.pid));
    let ignored = stop.stop_signal_ignored.map_or(String::new(), |why| {
        format!(" (ignored by the kernel: {})", why.words())
    });
    at(
        &stop.sigterm_at,
        format!(
            "stop signal from {comm} (pid {pid}){ignored}; {} connections open",
            stop.connections_at_sigterm.unwrap_or(0)
        ),
    );
    at(&stop.last_accept_at, "last connection accepted".into());
    at(&stop.sigkill_at, "SIGKILL".into());
    let code = or_null(stop.exit_code);
    let exit = match stop.exit_signal {
        Some(sig) => format!("exit: killed by signal {sig} (code {code})"),
        None => format!("exit: code {code}"),
    };
    at(
        &stop.exit_at,
        format!(
            "{exit}; {} connections still open",
            stop.connections_at_exit.unwrap_or(0)
        ),
    );
    at(&stop.cgroup_removed_at, "cgroup removed".into());
    at(&stop.sandbox_stopped_at, "pod sandbox stopped".into());
    for l in &stop.listeners {
        if let Some(t) = &l.closed_at {
            rows.push((t.clone(), format!("listener {} closed", l.address)));
        }
    }
    // By time; equal times keep the order above (signal, accept, kill, exit, cgroup).
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    rows
}

/// Where the stopped container ran and what its pod spec allowed (Kubernetes API), when known.
fn pod_line(stop: &StopView) -> Option<String> {
    let c = &stop.container;
    let mut parts = Vec::new();
    if !c.pod.is_empty() {
        let mut p = format!("pod {}/{}", c.namespace, c.pod);
        if !c.node.is_empty() {
            p.push_str(&format!(" on {}", c.node));
        }
        if !c.workload_kind.is_empty() {
            p.push_str(&format!(", {} {}", c.workload_kind, c.workload));
        }
        if !c.revision.is_empty() {
            p.push_str(&format!(" revision {}", c.revision));
        }
        parts.push(p);
    }
    if let Some(g) = stop.grace_configured_seconds {
        parts.push(format!("grace period {g} s"));
    }
    if let Some(p) = stop.prestop {
        parts.push(format!("preStop hook: {}", if p { "yes" } else { "no" }));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// Seconds to the millisecond, `-` when unknown.
fn f3(x: Option<f64>) -> String {
    x.map_or("-".to_string(), |v| format!("{v:.3}"))
}

/// Renders reconnect storms (newest first).
pub fn render_storms(storms: &[StormView]) -> String {
    let mut out = String::new();
    for s in storms {
        let verdict = verdict::storm(s).text;
        let clients = if s.connections > s.clients {
            format!("{} ({} connections)", s.clients, s.connections)
        } else {
            s.clients.to_string()
        };
        out.push_str(&format!(
            "STORM {} port {} after stop {}: {clients} clients back in {} s (95%), peak {} arrivals/s, max queue {}, {} overflows\n  accept wait p50 {} s, p95 {} s, max {} s; capacity {} connections/s while busy\n  verdict: {verdict}\n\n",
            s.container,
            s.port,
            s.stop_id,
            f3(Some(s.seconds_to_95_percent)),
            f3(Some(s.peak_arrivals_per_second)),
            s.max_queue_depth,
            s.overflows,
            f3(s.accept_wait_p50_seconds),
            f3(s.accept_wait_p95_seconds),
            f3(s.accept_wait_max_seconds),
            f3(s.sustained_accept_rate),
        ));
    }
    out
}

/// `Deployment replacing revision 7649c79dc5`, or just the kind, or nothing.
fn rollout(d: &DeployView) -> String {
    let kind = d.workload_kind.as_str();
    match (kind.is_empty(), d.revisions.is_empty()) {
        (true, true) => String::new(),
        (false, true) => format!(" {kind}"),
        (_, false) => format!(
            " {kind}{}replacing revision {}",
            if kind.is_empty() { "" } else { " " },
            d.revisions.join(", ")
        ),
    }
}

fn render_stop(stop: &StopView, out: &mut String) {
    let c = &stop.container;
    out.push_str(&format!(
        "\n  STOP {} ({} {}) outcome: {}\n",
        c.name,
        c.runtime,
        c.id.chars().take(12).collect::<String>(),
        stop.outcome.map_or("in progress", Outcome::as_str),
    ));
    if let Some(line) = pod_line(stop) {
        out.push_str(&format!("    {line}\n"));
    }
    for (t, what) in timeline(stop) {
        out.push_str(&format!("    {}  {what}\n", hms(&t)));
    }
    if let Some(d) = stop.drain_seconds {
        out.push_str(&format!("    drain {d:.3} s"));
        if let Some(g) = stop.grace_seconds {
            out.push_str(&format!(", grace used {g:.3} s"));
        }
        out.push('\n');
    }
    if let Some(line) = streams_line(stop) {
        out.push_str(&format!("    {line}\n"));
    }
    out.push_str(&format!(
        "    loss: {}\n    verdict: {}\n",
        loss_line(&stop.loss),
        verdict::stop(stop).text
    ));
}

/// Its streams: their lifetimes, and those its server ended itself in the stop (never cuts).
fn streams_line(stop: &StopView) -> Option<String> {
    let ended = stop.streams_ended_by_server;
    let lifetimes = stop.stream_lifetimes.as_ref().map(|l| {
        format!(
            "stream lifetimes {}: median {:.3} s, p95 {:.3} s, longest {:.3} s ({} streams)",
            l.shape.as_str(),
            l.p50_seconds,
            l.p95_seconds,
            l.max_seconds,
            l.streams
        )
    });
    let ends = (ended.on_their_timers + ended.at_sigterm > 0).then(|| {
        format!(
            "streams ended by its server: {} on their own timers, {} at once after the stop signal",
            ended.on_their_timers, ended.at_sigterm
        )
    });
    match (lifetimes, ends) {
        (Some(l), Some(e)) => Some(format!("{l}; {e}")),
        (l, e) => l.or(e),
    }
}

/// Renders deploys (newest first) and their stops.
pub fn render(deploys: &[DeployView], stops: &[StopView]) -> String {
    let mut out = String::new();
    if deploys.is_empty() {
        return "no container stops seen yet\n".into();
    }
    for d in deploys {
        let outcomes: Vec<String> = d
            .outcomes
            .iter()
            .map(|(k, v)| format!("{v} {}", k.as_str()))
            .collect();
        out.push_str(&format!(
            "DEPLOY {}{}{} started {}: {} stop(s){}{}{}\n  loss: {}\n",
            d.workload,
            if d.namespace.is_empty() {
                String::new()
            } else {
                format!(" ({})", d.namespace)
            },
            rollout(d),
            d.started_at,
            d.stops.len(),
            match d.pods.len() {
                0 => String::new(),
                1 => " of 1 pod".into(),
                n => format!(" of {n} pods"),
            },
            if outcomes.is_empty() {
                String::new()
            } else {
                format!(": {}", outcomes.join(", "))
            },
            if d.in_progress > 0 {
                format!(", {} in progress", d.in_progress)
            } else {
                String::new()
            },
            loss_line(&d.loss),
        ));
        for id in &d.stops {
            if let Some(stop) = stops.iter().find(|x| x.id == *id) {
                render_stop(stop, &mut out);
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// The API's answer as `drainwatch report` reads it.
    fn views<T: DeserializeOwned>(v: Value) -> Vec<T> {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn failed_health_checks_follow_the_request_counts_only_when_there_are_any() {
        let mut loss: LossView = serde_json::from_value(json!({"refused": 4})).unwrap();
        assert!(!loss_line(&loss).contains("health checks"));
        loss.probes.refused = 2;
        assert_eq!(
            loss_line(&loss),
            "4 refused; health checks failed (not users): 0 cut, 2 refused, 0 unreachable"
        );
    }

    #[test]
    fn a_stop_of_streams_says_their_lifetimes_and_how_its_server_ended_them() {
        let stops: Vec<StopView> = views(json!([{
            "id": "sse-1", "container": {"name": "sse-1"}, "outcome": "drained",
            "drain_seconds": 5.9, "loss": {"idle_closed": 40},
            "stream_lifetimes": {"p50_seconds": 3.58, "p95_seconds": 5.74, "max_seconds": 5.98,
                                 "shape": "spread", "streams": 128},
            "streams_ended_by_server": {"on_their_timers": 40, "at_sigterm": 0}
        }]));
        let mut out = String::new();
        render_stop(&stops[0], &mut out);
        assert!(
            out.contains("    stream lifetimes spread: median 3.580 s, p95 5.740 s, longest 5.980 s (128 streams); streams ended by its server: 40 on their own timers, 0 at once after the stop signal\n"),
            "{out}"
        );
        let mut plain = String::new();
        render_stop(&StopView::default(), &mut plain);
        assert!(!plain.contains("stream"), "{plain}");
    }

    #[test]
    fn renders_a_deploy_with_its_stop_timeline_and_verdict() {
        let stops = json!([{
            "id": "abc-1",
            "container": {"id": "abcdef0123456789", "runtime": "podman", "name": "web-1", "namespace": "", "pod": "", "workload": "web"},
            "sigterm_at": "2026-11-29T22:40:01.123Z",
            "sigterm_sender": {"pid": 4242, "comm": "runc"},
            "sigkill_at": null,
            "exit_at": "2026-11-29T22:40:01.126Z",
            "exit_code": 143, "exit_signal": 15,
            "cgroup_removed_at": "2026-11-29T22:40:01.700Z",
            "listeners": [{"address": "10.88.0.5:8080", "closed_at": "2026-11-29T22:40:01.127Z"}],
            "last_accept_at": null,
            "connections_at_sigterm": 3, "connections_at_exit": 3,
            "grace_seconds": null, "drain_seconds": 0.003,
            "loss": {"inflight_cut": 2, "idle_closed": 1, "resets_sent": {"TCP_ABORT_ON_CLOSE": 1}, "refused": 0, "unreachable": 0, "accepted_after_sigterm": 0},
            "outcome": "exit_at_once"
        }]);
        let deploys = json!([{
            "id": "web-abc-1", "namespace": "", "workload": "web",
            "started_at": "2026-11-29T22:40:01.123Z", "last_stop_at": "2026-11-29T22:40:01.123Z",
            "stops": ["abc-1"], "outcomes": {"exit_at_once": 1}, "in_progress": 0,
            "loss": {"inflight_cut": 2, "idle_closed": 1, "resets_sent": {"TCP_ABORT_ON_CLOSE": 1}, "refused": 0, "unreachable": 0, "accepted_after_sigterm": 0}
        }]);
        let text = render(&views(deploys), &views(stops));
        assert!(
            text.contains("DEPLOY web started 2026-11-29T22:40:01.123Z: 1 stop(s): 1 exit_at_once"),
            "{text}"
        );
        assert!(
            text.contains("STOP web-1 (podman abcdef012345) outcome: exit_at_once"),
            "{text}"
        );
        let order: Vec<_> = [
            "stop signal from runc",
            "exit: killed by signal 15 (code 143)",
            "listener 10.88.0.5:8080 closed",
            "cgroup removed",
        ]
        .iter()
        .map(|w| {
            text.find(w)
                .unwrap_or_else(|| panic!("{w} missing in {text}"))
        })
        .collect();
        assert!(
            order.windows(2).all(|w| w[0] < w[1]),
            "timeline out of order:\n{text}"
        );
        assert!(
            text.contains("2 in-flight cut, 1 idle closed, 1 resets sent\n"),
            "{text}"
        );
        assert!(text.contains("verdict: exited at once on the stop signal (exit signal 15, code 143), cutting 2 in-flight requests: handle SIGTERM"), "{text}");
    }

    #[test]
    fn renders_the_pod_its_rollout_and_its_stop_policy_from_the_api() {
        let stops = json!([{
            "id": "757c70c48a43-1",
            "container": {"id": "757c70c48a431c72", "runtime": "containerd", "name": "web", "namespace": "shop", "pod": "web-7649c79dc5-q4zjz", "workload": "web", "workload_kind": "Deployment", "revision": "7649c79dc5", "node": "node2"},
            "sigterm_at": "2026-11-29T22:40:01.123Z",
            "sigterm_sender": {"pid": 4242, "comm": "containerd-shim"},
            "sigkill_at": "2026-11-29T22:40:31.123Z",
            "exit_at": "2026-11-29T22:40:31.124Z",
            "exit_code": 137, "exit_signal": 9,
            "cgroup_removed_at": null, "listeners": [], "last_accept_at": null,
            "connections_at_sigterm": 1, "connections_at_exit": 1,
            "grace_seconds": 30.0, "drain_seconds": 30.001,
            "grace_configured_seconds": 30, "prestop": false,
            "loss": {"inflight_cut": 1, "idle_closed": 0, "resets_sent": {}, "refused": 0, "unreachable": 0, "accepted_after_sigterm": 0},
            "outcome": "killed_at_deadline"
        }]);
        let deploys = json!([{
            "id": "web-757c70c48a43-1", "namespace": "shop", "workload": "web",
            "workload_kind": "Deployment", "revisions": ["7649c79dc5"],
            "started_at": "2026-11-29T22:40:01.123Z", "last_stop_at": "2026-11-29T22:40:01.123Z",
            "stops": ["757c70c48a43-1"], "outcomes": {"killed_at_deadline": 1}, "in_progress": 0,
            "loss": {"inflight_cut": 1, "idle_closed": 0, "resets_sent": {}, "refused": 0, "unreachable": 0, "accepted_after_sigterm": 0}
        }]);
        let text = render(&views(deploys), &views(stops));
        assert!(
            text.contains("DEPLOY web (shop) Deployment replacing revision 7649c79dc5 started 2026-11-29T22:40:01.123Z: 1 stop(s): 1 killed_at_deadline"),
            "{text}"
        );
        assert!(
            text.contains("    pod shop/web-7649c79dc5-q4zjz on node2, Deployment web revision 7649c79dc5; grace period 30 s; preStop hook: no\n"),
            "{text}"
        );
        // Without the API nothing of it is printed.
        let plain = render(
            &views(
                json!([{"id": "d", "namespace": "", "workload": "web", "started_at": "t", "stops": ["s"], "outcomes": {}, "in_progress": 1, "loss": {}}]),
            ),
            &views(
                json!([{"id": "s", "container": {"name": "web-1", "pod": ""}, "grace_configured_seconds": null, "prestop": null, "loss": {}}]),
            ),
        );
        assert!(
            !plain.contains("pod ") && !plain.contains("grace period"),
            "{plain}"
        );
        assert!(plain.contains("DEPLOY web started t"), "{plain}");
    }

    #[test]
    fn renders_a_storm_with_its_window_advice() {
        let storms = json!([{
            "namespace": "", "workload": "ws", "container": "ws-2", "port": 8080, "stop_id": "abc-1",
            "clients": 2000, "seconds_to_95_percent": 1.1, "peak_arrivals_per_second": 2600.0,
            "max_queue_depth": 128, "overflows": 3,
            "accept_wait_p50_seconds": 1.2, "accept_wait_p95_seconds": 3.6, "accept_wait_max_seconds": 3.9,
            "sustained_accept_rate": 480.0, "recommended_window_seconds": 4.167
        }]);
        let text = render_storms(&views(storms));
        assert!(
            text.contains(
                "STORM ws-2 port 8080 after stop abc-1: 2000 clients back in 1.100 s (95%)"
            ),
            "{text}"
        );
        assert!(
            text.contains("verdict: 2,000 clients reconnected within 1.1 s against 480 connections/s: spread reconnects over ≥ 4.2 s"),
            "{text}"
        );
        let calm = json!([{"clients": 2000, "recommended_window_seconds": null}]);
        assert!(
            render_storms(&views(calm))
                .contains("the accept queue never backed up: no change needed")
        );
        assert!(render_storms(&[]).is_empty());
    }

    #[test]
    fn nothing_seen_says_so() {
        assert_eq!(render(&[], &[]), "no container stops seen yet\n");
    }
}
