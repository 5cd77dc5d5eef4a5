//! The deploy page's unit tests: what `render` writes for stops, deploys and storms given as
//! the report API serves them.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::*;
use crate::{
    export::{
        verdict::{self, Level},
        view::{DeployView, StopView, StormView},
    },
    model::stop::Outcome,
};

fn info() -> PageInfo {
    PageInfo {
        host: "node-1".into(),
        version: "0.1.0".into(),
        rendered_at: "2026-11-29T22:48:00.000Z".into(),
    }
}

fn view<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

fn no_handler_stop(name: &str) -> StopView {
    view(json!({
        "id": "c67f6ba70c4b-1",
        "container": {"id": "c67f6ba70c4b0123", "runtime": "podman", "name": name, "namespace": "", "pod": "", "workload": "web"},
        "sigterm_at": "2026-11-29T22:47:28.358Z",
        "sigterm_sender": {"pid": 16354, "comm": "runc"},
        "sigkill_at": null,
        "exit_at": "2026-11-29T22:47:28.361Z",
        "exit_code": 143, "exit_signal": 15,
        "cgroup_removed_at": "2026-11-29T22:47:28.551Z",
        "listeners": [{"address": "10.88.0.5:8080", "closed_at": "2026-11-29T22:47:28.362Z"}],
        "last_accept_at": "2026-11-29T22:47:27.335Z",
        "connections_at_sigterm": 2, "connections_at_exit": 2,
        "grace_seconds": null, "drain_seconds": 0.003, "routing_lag_seconds": 3.512,
        "loss": {"inflight_cut": 2, "idle_closed": 0, "resets_sent": {"NOT_SPECIFIED": 2}, "refused": 3, "unreachable": 0, "accepted_after_sigterm": 0, "retry_duplicates": 1, "upstream_aborts": 0},
        "loss_events": [
            {"at": "2026-11-29T22:47:28.362Z", "kind": "inflight_cut", "open_seconds": 0.3},
            {"at": "2026-11-29T22:47:28.362Z", "kind": "inflight_cut", "open_seconds": 0.31},
            {"at": "2026-11-29T22:47:28.362Z", "kind": "retry_duplicates", "open_seconds": null},
            {"at": "2026-11-29T22:47:29.858Z", "kind": "refused", "open_seconds": null},
            {"at": "2026-11-29T22:47:30.858Z", "kind": "refused", "open_seconds": null},
            {"at": "2026-11-29T22:47:31.870Z", "kind": "refused", "open_seconds": null},
        ],
        "loss_events_dropped": 0,
        "outcome": "exit_at_once"
    }))
}

fn deploy_of(stop: &StopView, in_progress: u64) -> Vec<DeployView> {
    let started = stop.sigterm_at.clone().unwrap_or_default();
    vec![DeployView {
        id: "web-c67f6ba70c4b-1".into(),
        namespace: String::new(),
        workload: stop.container.workload.clone(),
        started_at: started.clone(),
        last_stop_at: started,
        stops: vec![stop.id.clone()],
        outcomes: if in_progress > 0 {
            BTreeMap::new()
        } else {
            BTreeMap::from([(Outcome::ExitAtOnce, 1)])
        },
        in_progress,
        loss: stop.loss.clone(),
        ..Default::default()
    }]
}

#[test]
fn a_stop_shows_its_timeline_loss_and_the_shared_verdict() {
    let stop = no_handler_stop("web-1");
    let html = render(
        &deploy_of(&stop, 0),
        std::slice::from_ref(&stop),
        &[],
        &[],
        &info(),
    );
    assert!(html.starts_with("<!doctype html>"));
    // The same sentence `drainwatch report` prints.
    let v = verdict::stop(&stop);
    assert_eq!(v.level, Level::Bad);
    assert!(html.contains(&esc(&v.text)), "verdict missing:\n{html}");
    assert!(v.text.contains("wait ≥ 4 s before closing the listener"));
    // Machine-readable data that matches the API's.
    for needle in [
        r#"data-stop-id="c67f6ba70c4b-1""#,
        r#"data-outcome="exit_at_once""#,
        r#"data-sigterm-at="2026-11-29T22:47:28.358Z""#,
        r#"data-exit-at="2026-11-29T22:47:28.361Z""#,
        r#"data-listener-closed-at="2026-11-29T22:47:28.362Z""#,
        r#"data-routing-lag-seconds="3.512""#,
        r#"data-loss-events="6""#,
        r#"data-loss="inflight_cut"><b>2</b> in-flight cut"#,
        r#"data-loss="refused"><b>3</b> refused"#,
        r#"data-loss="retry_duplicates"><b>1</b> retried"#,
    ] {
        assert!(html.contains(needle), "{needle} missing");
    }
    // The timeline: markers, bands, one glyph per loss event, in the right lanes.
    for needle in [
        ">SIGTERM</tspan>",
        ">listener closed</tspan>",
        ">exit (SIGTERM)</tspan>",
        ">cgroup removed</tspan>",
        ">routing continued 3.5 s</text>",
        "2 cut, 1 retried",
        "3 refused",
    ] {
        assert!(html.contains(needle), "{needle} missing");
    }
    assert_eq!(
        html.matches(r#"class="g-cut""#).count(),
        2 + 1,
        "2 cuts + legend"
    );
    assert_eq!(html.matches(r#"class="g-refused""#).count(), 3 + 1);
    // Relative URLs only: works through a port-forward or a path prefix.
    assert!(html.contains(r#"<script src="page.js" defer>"#));
    assert!(!html.contains("src=\"/") && !html.contains("href=\"/") && !html.contains("http"));
    // Nothing is stopping: slow refresh.
    assert!(html.contains(r#"data-refresh="10000""#));
}

#[test]
fn kubernetes_facts_show_when_known() {
    let mut stop = no_handler_stop("web-7d9f8c-abcde");
    stop.container.namespace = "shop".into();
    stop.container.pod = "web-7d9f8c-abcde".into();
    stop.container.node = "node-3".into();
    stop.grace_configured_seconds = Some(30);
    stop.prestop = Some(false);
    let mut deploys = deploy_of(&stop, 0);
    deploys[0].workload_kind = "Deployment".into();
    deploys[0].revisions = vec!["7d9f8c".into()];
    let html = render(&deploys, &[stop], &[], &[], &info());
    for needle in [
        r#"<span class="ns">Deployment</span>"#,
        "replaced revision 7d9f8c",
        "pod shop/web-7d9f8c-abcde on node-3",
        "<dt>grace period</dt><dd>30 s configured</dd>",
        "<dt>preStop hook</dt><dd>none</dd>",
        // A 30 s grace period is drawn as a band running off the right edge.
        "grace 30 s →",
        "(or add a preStop hook that sleeps ≥ 4 s)",
    ] {
        assert!(html.contains(needle), "{needle} missing");
    }
}

#[test]
fn container_names_cannot_inject_markup() {
    let evil = r#"<script>alert(1)</script>"'&"#;
    let mut stop = no_handler_stop(evil);
    stop.container.workload = evil.into();
    stop.listeners[0].address = "<img src=x onerror=alert(1)>".into();
    stop.sigterm_sender.as_mut().unwrap().comm = "<b>runc</b>".into();
    stop.loss.resets_sent = BTreeMap::from([("<i>reason</i>".to_string(), 1)]);
    let storm: StormView = view(
        json!({"container": evil, "stop_id": evil, "port": 8080, "clients": 20, "arrivals_per_100ms": [20], "seconds_to_95_percent": 0.1}),
    );
    let html = render(
        &deploy_of(&stop, 0),
        std::slice::from_ref(&stop),
        &[],
        &[storm],
        &PageInfo {
            host: evil.into(),
            ..info()
        },
    );
    for bad in ["<script>alert", "<img", "<b>runc", "<i>reason", "\"'&\""] {
        assert!(!html.contains(bad), "{bad} not escaped");
    }
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#39;&amp;"));
    // The only script is the same-origin one.
    assert_eq!(html.matches("<script").count(), 1);
}

#[test]
fn a_deploy_under_way_refreshes_fast_and_says_so() {
    let mut stop = no_handler_stop("web-1");
    stop.exit_at = None;
    stop.cgroup_removed_at = None;
    stop.outcome = None;
    stop.exit_code = None;
    stop.exit_signal = None;
    let html = render(
        &deploy_of(&stop, 1),
        std::slice::from_ref(&stop),
        &[],
        &[],
        &info(),
    );
    assert!(html.contains(r#"data-refresh="2000""#));
    assert!(html.contains(r#"<span class="badge pending">1 stopping</span>"#));
    assert!(html.contains("stopping: no verdict until the process exits"));
}

#[test]
fn a_storm_is_drawn_under_the_deploy_that_caused_it() {
    let stop = no_handler_stop("web-1");
    let storm: StormView = view(json!({
        "namespace": "", "workload": "web", "container": "web-2", "port": 8080,
        "stop_id": "c67f6ba70c4b-1", "clients": 2000, "seconds_to_95_percent": 1.1,
        "peak_arrivals_per_second": 2600.0, "arrivals_per_100ms": [100, 260, 250, 240, 230, 220, 210, 200, 190, 150, 150],
        "max_queue_depth": 128, "overflows": 0,
        "accept_wait_p50_seconds": 1.2, "accept_wait_p95_seconds": 3.6, "accept_wait_max_seconds": 3.9,
        "sustained_accept_rate": 480.0, "recommended_window_seconds": 4.167
    }));
    let html = render(
        &deploy_of(&stop, 0),
        std::slice::from_ref(&stop),
        &[],
        std::slice::from_ref(&storm),
        &info(),
    );
    let deploy_at = html.find("<details class=\"deploy").unwrap();
    let storm_at = html.find(r#"data-storm-stop-id="c67f6ba70c4b-1""#).unwrap();
    let end = html[deploy_at..].find("</details>").unwrap() + deploy_at;
    assert!(
        deploy_at < storm_at && storm_at < end,
        "storm inside its deploy"
    );
    assert!(html.contains(&esc(&verdict::storm(&storm).text)));
    assert!(html.contains("capacity 480 connections/s"));
    assert!(html.contains("recommended window ≥ 4.2 s"));
    assert!(html.contains("95% back in 1.1 s"));
    assert_eq!(html.matches(r#"class="bar"#).count(), 11);
    assert!(html.contains("1 reconnect storm"));
}

#[test]
fn nothing_seen_says_how_to_see_something() {
    let html = render(&[], &[], &[], &[], &info());
    assert!(html.contains("No container stops seen yet"));
    assert!(html.contains("cargo xtask demo"));
}

#[test]
fn the_state_changes_with_the_data_only() {
    let stop = no_handler_stop("web-1");
    let a = render(
        &deploy_of(&stop, 0),
        std::slice::from_ref(&stop),
        &[],
        &[],
        &info(),
    );
    let later = PageInfo {
        rendered_at: "2026-11-29T22:49:00.000Z".into(),
        ..info()
    };
    let b = render(
        &deploy_of(&stop, 0),
        std::slice::from_ref(&stop),
        &[],
        &[],
        &later,
    );
    let state = |h: &str| h.split("data-state=\"").nth(1).unwrap()[..16].to_string();
    assert_eq!(state(&a), state(&b));
    let mut more = stop.clone();
    more.loss.refused = 4;
    let c = render(&deploy_of(&more, 0), &[more], &[], &[], &info());
    assert_ne!(state(&a), state(&c));
}

#[test]
fn failed_health_checks_are_drawn_apart_from_the_loss() {
    let mut stop = no_handler_stop("web-1");
    stop.loss.probes.refused = 2;
    stop.loss.probes.by_schedule = 2;
    for at in ["2026-11-29T22:47:30.358Z", "2026-11-29T22:47:32.359Z"] {
        stop.loss_events.push(view(
            json!({"at": at, "kind": "probe_refused", "open_seconds": null}),
        ));
    }
    let html = render(
        &deploy_of(&stop, 0),
        std::slice::from_ref(&stop),
        &[],
        &[],
        &info(),
    );
    assert!(
        html.contains(r#"data-loss="probes""#)
            && html.contains(
                "<b>2</b> health checks failed (2 told apart by the balancer's check schedule)"
            ),
        "{html}"
    );
    assert!(html.contains("3 refused, 2 checks refused"), "{html}");
    assert_eq!(
        html.matches(r#"class="g-probe""#).count(),
        2 + 1,
        "2 probes + legend"
    );
    // Requests' counts are unchanged by them.
    assert!(html.contains(r#"data-loss="refused"><b>3</b> refused"#));
}

#[test]
fn a_start_that_refused_requests_is_drawn_in_its_deploy_with_the_fix() {
    let start: crate::export::view::StartView = view(json!({
        "id": "c67f6ba70c4b-start-1",
        "container": {"id": "c67f6ba70c4b".repeat(5), "name": "web-2", "runtime": "podman", "workload": "web"},
        "started_at": "2026-11-29T22:47:30.000Z",
        "first_listen_at": "2026-11-29T22:47:33.000Z",
        "first_accept_at": "2026-11-29T22:47:33.200Z",
        "listen_after_seconds": 3.0,
        "loss": {"refused_before_listen": 2, "probes": {"refused": 1}},
        "ports": [8080],
        "refused_at": ["2026-11-29T22:47:31.000Z", "2026-11-29T22:47:32.000Z"],
        "settled": true
    }));
    let deploys = vec![DeployView {
        id: "web-c67f6ba70c4b-start-1".into(),
        workload: "web".into(),
        started_at: start.started_at.clone(),
        last_stop_at: start.started_at.clone(),
        starts: vec![start.id.clone()],
        refused_before_listen: 2,
        ..Default::default()
    }];
    let html = render(&deploys, &[], std::slice::from_ref(&start), &[], &info());
    let v = verdict::start(&start);
    assert_eq!(v.level, Level::Bad);
    assert!(
        v.text
            .starts_with("2 connections refused in the 3 s before the server listened")
            && v.text.contains("make readiness check the listener"),
        "{}",
        v.text
    );
    assert!(html.contains(&esc(&v.text)), "verdict missing:\n{html}");
    assert!(html.contains(r#"data-start-id="c67f6ba70c4b-start-1""#));
    let article = &html[html.find(r#"<article class="start""#).unwrap()..];
    assert_eq!(
        article.matches(r#"class="g-refused""#).count(),
        2,
        "{article}"
    );
    assert!(html.contains("<b>1</b> health check refused (normal while starting)"));
    assert!(
        html.contains("refused while starting"),
        "the deploy's badge"
    );
}

#[test]
fn a_deploys_stops_and_starts_share_one_time_axis() {
    let stop = no_handler_stop("web-1");
    let start: crate::export::view::StartView = view(json!({
        "id": "d00d6ba70c4b-start-1",
        "container": {"id": "d00d6ba70c4b".repeat(5), "name": "web-<2>", "runtime": "podman", "workload": "web"},
        "started_at": "2026-11-29T22:47:30.358Z",
        "first_listen_at": "2026-11-29T22:47:33.358Z",
        "loss": {"refused_before_listen": 1},
        "ports": [8080],
        "refused_at": ["2026-11-29T22:47:31.000Z"],
        "settled": true
    }));
    let mut deploys = deploy_of(&stop, 0);
    deploys[0].starts = vec![start.id.clone()];
    let html = render(
        &deploys,
        std::slice::from_ref(&stop),
        std::slice::from_ref(&start),
        &[],
        &info(),
    );
    let chart = &html[html
        .find(r#"class="timeline overview""#)
        .expect("the deploy's axis")..];
    let chart = &chart[..chart.find("</svg>").unwrap()];
    // The stop (SIGTERM at 0 s) first, the start 2 s later; the stop's six losses and the
    // start's refusal drawn on them.
    let stop_row = chart
        .find(r#"data-kind="stop" data-from="0.0""#)
        .expect(chart);
    let start_row = chart
        .find(r#"data-kind="start" data-from="2.0""#)
        .expect(chart);
    assert!(stop_row < start_row);
    assert_eq!(chart.matches(r#"class="g-loss""#).count(), 6);
    assert_eq!(chart.matches(r#"class="g-refused""#).count(), 1);
    assert!(chart.contains("web-&lt;2&gt; start"), "{chart}");
    // A deploy of one record has no shared axis to draw.
    let alone = render(
        &deploy_of(&stop, 0),
        std::slice::from_ref(&stop),
        &[],
        &[],
        &info(),
    );
    assert!(!alone.contains("timeline overview"));
}

#[test]
fn cut_streams_have_their_chip_glyph_count_rotation_and_verdict() {
    let stop: StopView = view(json!({
        "id": "5e5e5e5e5e5e-1",
        "container": {"id": "5e5e5e5e5e5e0123", "runtime": "podman", "name": "events-1", "workload": "events"},
        "sigterm_at": "2026-11-29T22:47:28.000Z",
        "sigkill_at": "2026-11-29T22:47:30.000Z",
        "exit_at": "2026-11-29T22:47:30.002Z",
        "exit_code": 137, "exit_signal": 9,
        "grace_seconds": 2.0, "drain_seconds": 2.002,
        "loss": {"streams_cut": 2, "idle_closed": 5},
        "loss_events": [
            {"at": "2026-11-29T22:47:30.003Z", "kind": "streams_cut", "open_seconds": 3.1},
            {"at": "2026-11-29T22:47:30.003Z", "kind": "streams_cut", "open_seconds": 0.4},
        ],
        "outcome": "killed_at_deadline",
        "storm_clients": 7,
        "stream_lifetimes": {"p50_seconds": 6.0, "p95_seconds": 6.002, "max_seconds": 6.004,
                             "shape": "fixed", "streams": 40},
        "stream_rotation_seconds": 6.002,
        "streams_ended_by_server": {"on_their_timers": 5, "at_sigterm": 0}
    }));
    let html = render(
        &deploy_of(&stop, 0),
        std::slice::from_ref(&stop),
        &[],
        &[],
        &info(),
    );
    for needle in [
        r#"data-loss="streams_cut"><b>2</b> live streams cut"#,
        "2 streams cut",
        "6 s, fixed (learned from 40 streams its server ended itself)",
        "5 on their own timers · 0 at once after the stop signal (by its server, none cut)",
        "2 live streams cut at SIGKILL (7 clients back at once): the 2 s grace period is shorter than the 6 s its server lets streams live: raise it to at least 8 s (that + 2 s)",
    ] {
        assert!(html.contains(needle), "{needle} missing");
    }
    assert_eq!(
        html.matches(r#"class="g-stream""#).count(),
        2 + 1,
        "2 + legend"
    );
    assert_eq!(verdict::stop(&stop).level, Level::Bad);
}
