//! Kubernetes Events through kube-runtime's real `Recorder` against a local API-server double:
//! what is posted for a settled stop with loss, that a record is announced once, that the rate
//! limit drops and counts, and that a refused post is counted.

use k8s_openapi::api::events::v1::Event as K8sEvent;
use prometheus_client::registry::Registry;

use super::{
    api::Clock,
    events::{Emitter, EventMetrics, Reason},
    kube_double::{Asked, Double},
};
use crate::model::{
    ContainerIdentity, ExitInfo, Loss, SECOND,
    start::{Start, StartLoss},
    stop::Stop,
};

const CLOCK: Clock = Clock { offset_ns: 0 };

/// A web pod's container that exited at once on SIGTERM, cutting two requests; settled.
fn stop(id: &str, pod: &str) -> Stop {
    Stop {
        sigterm_at: Some(10 * SECOND),
        exit_at: Some(10 * SECOND + 2_000_000),
        exit: Some(ExitInfo {
            code: Some(143),
            signal: Some(15),
        }),
        loss: Loss {
            inflight_cut: 2,
            ..Default::default()
        },
        settled: true,
        ..Stop::new(id.into(), container(pod))
    }
}

fn container(pod: &str) -> ContainerIdentity {
    ContainerIdentity {
        id: format!("{pod}-c0ffee"),
        name: "web".into(),
        namespace: "shop".into(),
        pod: pod.into(),
        workload: "web".into(),
        ..Default::default()
    }
}

/// Echoes a created or patched event, as the API server answers.
fn events_api(a: &Asked) -> (u16, String) {
    if a.path
        .starts_with("/apis/events.k8s.io/v1/namespaces/shop/events")
    {
        let status = if a.method == "POST" { 201 } else { 200 };
        return (status, String::from_utf8_lossy(&a.body).into_owned());
    }
    (404, "{}".into())
}

fn emitter(api: &Double, per_minute: u32) -> (Emitter, EventMetrics) {
    let metrics = EventMetrics::register(&mut Registry::default());
    let client = kube::Client::try_from(api.config()).unwrap();
    let uid_of = Box::new(|c: &ContainerIdentity| Some(format!("uid-of-{}", c.pod)));
    let e = Emitter::new(client, "node-a", per_minute, metrics.clone(), uid_of);
    (e, metrics)
}

fn posted(api: &Double) -> Vec<K8sEvent> {
    api.asked()
        .iter()
        .filter(|a| a.method == "POST")
        .map(|a| serde_json::from_slice(&a.body).unwrap())
        .collect()
}

#[tokio::test]
async fn a_settled_stop_with_loss_is_one_warning_event_on_its_pod() {
    let api = Double::start(events_api).await;
    let (mut e, metrics) = emitter(&api, 10);
    let stops = [stop("c0ffee-1", "web-7d9-abcde")];
    let picked = e.select(&stops, &[], &[], &CLOCK);
    assert_eq!(picked.len(), 1);
    assert_eq!(picked[0].reason, Reason::ConnectionLossOnStop);
    e.publish(20 * SECOND, picked).await;

    let ev = posted(&api);
    assert_eq!(ev.len(), 1, "{:?}", api.asked());
    let ev = &ev[0];
    assert_eq!(ev.reason.as_deref(), Some("ConnectionLossOnStop"));
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    assert_eq!(ev.reporting_controller.as_deref(), Some("drainwatch"));
    assert_eq!(ev.reporting_instance.as_deref(), Some("drainwatch-node-a"));
    let r = ev.regarding.as_ref().unwrap();
    assert_eq!(
        (
            r.kind.as_deref(),
            r.api_version.as_deref(),
            r.namespace.as_deref(),
            r.name.as_deref(),
            r.uid.as_deref()
        ),
        (
            Some("Pod"),
            Some("v1"),
            Some("shop"),
            Some("web-7d9-abcde"),
            Some("uid-of-web-7d9-abcde")
        )
    );
    let note = ev.note.as_deref().unwrap();
    assert!(note.contains("cutting 2 in-flight requests"), "{note}");
    assert_eq!(metrics.get("emitted"), 1);

    // The same record again (the next poll): nothing new.
    let again = e.select(&stops, &[], &[], &CLOCK);
    assert!(again.is_empty());
    e.publish(22 * SECOND, again).await;
    assert_eq!(api.asked().len(), 1);
    assert_eq!(metrics.get("emitted"), 1);
}

#[tokio::test]
async fn only_settled_records_of_pods_with_loss_are_announced_and_a_start_too() {
    let api = Double::start(events_api).await;
    let (mut e, _) = emitter(&api, 10);
    let open = Stop {
        settled: false,
        ..stop("open-1", "web-1")
    };
    let clean = Stop {
        loss: Loss::default(),
        ..stop("clean-1", "web-2")
    };
    let no_pod = Stop {
        container: ContainerIdentity {
            pod: String::new(),
            ..container("")
        },
        ..stop("podman-1", "")
    };
    let start = Start {
        id: "new-start-1".into(),
        container: container("web-3"),
        restart: false,
        netns: None,
        netns_cookie: None,
        fresh_netns: false,
        started_at: SECOND,
        first_listen_at: Some(3 * SECOND),
        first_accept_at: None,
        ports: vec![(8080, 3 * SECOND)],
        loss: StartLoss {
            refused_before_listen: 4,
            ..Default::default()
        },
        refused_at: vec![2 * SECOND],
        probe_refused_at: vec![],
        refusals_lost: 0,
        events_lost: 0,
        ebpf_faults: 0,
        settled: true,
    };
    let picked = e.select(&[open.clone(), clean, no_pod], &[start], &[], &CLOCK);
    let got: Vec<(&str, Reason)> = picked.iter().map(|c| (c.id.as_str(), c.reason)).collect();
    assert_eq!(got, [("new-start-1", Reason::ConnectionLossOnStart)]);
    // The open stop is announced once it settles.
    let settled = Stop {
        settled: true,
        ..open
    };
    let picked = e.select(&[settled], &[], &[], &CLOCK);
    assert_eq!(picked.len(), 1);
    assert_eq!(picked[0].id, "open-1");
}

#[tokio::test]
async fn past_the_rate_limit_events_are_dropped_and_counted() {
    let api = Double::start(events_api).await;
    let (mut e, metrics) = emitter(&api, 2);
    let stops: Vec<Stop> = (0..5)
        .map(|i| stop(&format!("s-{i}"), &format!("web-{i}")))
        .collect();
    let picked = e.select(&stops, &[], &[], &CLOCK);
    assert_eq!(picked.len(), 5);
    e.publish(100 * SECOND, picked).await;
    assert_eq!(posted(&api).len(), 2);
    assert_eq!(metrics.get("emitted"), 2);
    assert_eq!(metrics.get("rate_limited"), 3);
    // Half a minute later one token is back (2 a minute).
    let more = [stop("s-5", "web-5"), stop("s-6", "web-6")];
    let picked = e.select(&more, &[], &[], &CLOCK);
    e.publish(130 * SECOND, picked).await;
    assert_eq!(posted(&api).len(), 3);
    assert_eq!(metrics.get("rate_limited"), 4);
}

#[tokio::test]
async fn a_refused_post_is_counted_as_failed() {
    let api = Double::start(|_| {
        (
            403,
            r#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":403,"reason":"Forbidden","message":"events.events.k8s.io is forbidden"}"#.into(),
        )
    })
    .await;
    let (mut e, metrics) = emitter(&api, 10);
    let picked = e.select(&[stop("s-1", "web-1")], &[], &[], &CLOCK);
    e.publish(SECOND, picked).await;
    assert_eq!(metrics.get("failed"), 1);
    assert_eq!(metrics.get("emitted"), 0);
}

#[test]
fn records_settled_before_the_agent_started_are_not_announced_again() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let api = Double::start(events_api).await;
        let (mut e, _) = emitter(&api, 10);
        let resumed = [stop("s-1", "web-1")];
        e.prime(&resumed, &[]);
        assert!(e.select(&resumed, &[], &[], &CLOCK).is_empty());
    });
}
