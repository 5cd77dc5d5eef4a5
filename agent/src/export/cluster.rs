//! `drainwatch report --cluster`, the pure part: each node's agent sees only its own pods, so
//! one rollout across ten nodes is ten partial deploys. [`merge`] joins the per-node API
//! documents into one view: the deploys of one workload (namespace, workload, as
//! `correlate::deploys` keys them) that overlap within the deploy window and replace or bring
//! the same revisions are one deploy, whatever nodes its pods ran on. Every agent that did not
//! answer is listed, never skipped. The I/O (listing the DaemonSet's pods, the API server's pod
//! proxy) is in `cluster_kube.rs`.

use std::{
    collections::HashMap,
    time::{Duration, SystemTime},
};

use serde::{Deserialize, Serialize};

use super::{
    report,
    view::{DeployView, StartView, StopView, StormView},
};

/// What one agent's report API served.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeDocs {
    pub stops: Vec<StopView>,
    pub starts: Vec<StartView>,
    pub deploys: Vec<DeployView>,
    pub storms: Vec<StormView>,
}

/// One agent pod of the DaemonSet and what asking it gave.
#[derive(Debug, Clone)]
pub struct NodeAnswer {
    pub pod: String,
    pub node: String,
    pub docs: Result<NodeDocs, String>,
}

/// A deploy across nodes: the merged deploy and the nodes its records came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterDeploy {
    #[serde(flatten)]
    pub deploy: DeployView,
    pub nodes: Vec<String>,
}

/// An agent that did not answer, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeFailure {
    pub error: String,
    pub node: String,
    pub pod: String,
}

/// What `report --cluster --json` prints (fields in alphabetical order, as the API's).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterReport {
    /// Agents asked.
    pub agents: usize,
    /// Newest first.
    pub deploys: Vec<ClusterDeploy>,
    /// Newest first; `container.node` is the agent's node when its API did not say.
    pub starts: Vec<StartView>,
    pub stops: Vec<StopView>,
    /// `deploy_id` names the merged deploy.
    pub storms: Vec<StormView>,
    /// Agents that did not answer: their nodes' records are missing.
    pub unanswered: Vec<NodeFailure>,
}

fn wall(t: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339_weak(t.trim_end_matches('Z')).ok()
}

/// `a` ends at most `window` before `b` starts (times the API's RFC 3339).
fn within(a_last: &str, b_start: &str, window: Duration) -> bool {
    match (wall(a_last), wall(b_start)) {
        (Some(a), Some(b)) => b.duration_since(a).map_or(true, |gap| gap <= window),
        // Unparsable times: only the same instant is close.
        _ => a_last >= b_start,
    }
}

/// Either side unknown, or a value in common.
fn compatible(a: &[String], b: &[String]) -> bool {
    a.is_empty() || b.is_empty() || a.iter().any(|x| b.contains(x))
}

/// A deploy being merged: its revisions brought (from its starts) besides those replaced.
struct Acc {
    deploy: ClusterDeploy,
    brought: Vec<String>,
    /// (node, node-local deploy id) merged into it, for the storms' links.
    members: Vec<(String, String)>,
}

fn union(into: &mut Vec<String>, from: &[String]) {
    for x in from {
        if !into.contains(x) {
            into.push(x.clone());
        }
    }
}

/// The node-level deploys of every answer merged across nodes; pure.
pub fn merge(answers: &[NodeAnswer], window: Duration) -> ClusterReport {
    let mut report = ClusterReport {
        agents: answers.len(),
        ..Default::default()
    };
    let mut local: Vec<(&str, &DeployView, Vec<String>)> = Vec::new();
    for a in answers {
        let docs = match &a.docs {
            Ok(d) => d,
            Err(e) => {
                report.unanswered.push(NodeFailure {
                    error: e.clone(),
                    node: a.node.clone(),
                    pod: a.pod.clone(),
                });
                continue;
            }
        };
        let on_node = |c: &mut super::view::ContainerView| {
            if c.node.is_empty() {
                c.node = a.node.clone();
            }
        };
        for s in &docs.stops {
            let mut s = s.clone();
            on_node(&mut s.container);
            report.stops.push(s);
        }
        for s in &docs.starts {
            let mut s = s.clone();
            on_node(&mut s.container);
            report.starts.push(s);
        }
        for d in &docs.deploys {
            let mut brought = Vec::new();
            for id in &d.starts {
                if let Some(s) = docs.starts.iter().find(|s| s.id == *id) {
                    union(&mut brought, std::slice::from_ref(&s.container.revision));
                }
            }
            brought.retain(|r| !r.is_empty());
            local.push((&a.node, d, brought));
        }
    }
    local.sort_by(|a, b| a.1.started_at.cmp(&b.1.started_at));
    let mut merged: Vec<Acc> = Vec::new();
    for (node, d, brought) in local {
        let same = merged.iter_mut().find(|m| {
            let md = &m.deploy.deploy;
            md.namespace == d.namespace
                && md.workload == d.workload
                && compatible(&md.revisions, &d.revisions)
                && compatible(&m.brought, &brought)
                && within(&md.last_stop_at, &d.started_at, window)
        });
        match same {
            Some(m) => {
                let md = &mut m.deploy.deploy;
                md.in_progress += d.in_progress;
                md.loss.add(&d.loss);
                for (o, n) in &d.outcomes {
                    *md.outcomes.entry(*o).or_default() += n;
                }
                md.refused_before_listen += d.refused_before_listen;
                union(&mut md.revisions, &d.revisions);
                union(&mut md.pods, &d.pods);
                md.last_stop_at = md.last_stop_at.clone().max(d.last_stop_at.clone());
                md.starts.extend(d.starts.iter().cloned());
                md.stops.extend(d.stops.iter().cloned());
                if md.workload_kind.is_empty() {
                    md.workload_kind = d.workload_kind.clone();
                }
                union(&mut m.deploy.nodes, &[node.to_string()]);
                union(&mut m.brought, &brought);
                m.members.push((node.to_string(), d.id.clone()));
            }
            None => merged.push(Acc {
                deploy: ClusterDeploy {
                    deploy: d.clone(),
                    nodes: vec![node.to_string()],
                },
                brought,
                members: vec![(node.to_string(), d.id.clone())],
            }),
        }
    }
    // Storms link to the merged deploy their node's deploy went into.
    for a in answers {
        let Ok(docs) = &a.docs else { continue };
        for s in &docs.storms {
            let mut s = s.clone();
            s.deploy_id = s.deploy_id.as_ref().and_then(|local_id| {
                merged
                    .iter()
                    .find(|m| {
                        m.members
                            .iter()
                            .any(|(n, id)| *n == a.node && id == local_id)
                    })
                    .map(|m| m.deploy.deploy.id.clone())
            });
            report.storms.push(s);
        }
    }
    // Record ids oldest first, as one agent lists them (times looked up once: thousands of
    // records across nodes).
    let stop_at = |s: &StopView| {
        s.sigterm_at
            .clone()
            .or(s.exit_at.clone())
            .unwrap_or_default()
    };
    let at: HashMap<&str, String> = report
        .stops
        .iter()
        .map(|s| (s.id.as_str(), stop_at(s)))
        .chain(
            report
                .starts
                .iter()
                .map(|s| (s.id.as_str(), s.started_at.clone())),
        )
        .collect();
    let when = |id: &String| at.get(id.as_str()).cloned().unwrap_or_default();
    for m in &mut merged {
        let d = &mut m.deploy.deploy;
        d.stops.sort_by_key(when);
        d.starts.sort_by_key(when);
    }
    report.deploys = merged.into_iter().rev().map(|m| m.deploy).collect();
    report.stops.sort_by_key(|s| std::cmp::Reverse(stop_at(s)));
    report
        .starts
        .sort_by(|a, b| b.started_at.cmp(&a.started_at));
    report
        .storms
        .sort_by(|a, b| b.first_arrival_at.cmp(&a.first_arrival_at));
    report
}

/// The text report: who did not answer first, then each deploy with its nodes, its stops and
/// starts, then the storms (the single-agent report's rendering).
pub fn render(r: &ClusterReport) -> String {
    let mut out = format!(
        "CLUSTER: {} of {} agents answered\n",
        r.agents - r.unanswered.len(),
        r.agents
    );
    for f in &r.unanswered {
        out.push_str(&format!(
            "NO ANSWER from {} on node {}: {} (its records are missing below)\n",
            f.pod,
            if f.node.is_empty() { "?" } else { &f.node },
            f.error
        ));
    }
    out.push('\n');
    if r.deploys.is_empty() {
        out.push_str("no container stops seen yet\n");
    }
    for d in &r.deploys {
        let text = report::render(std::slice::from_ref(&d.deploy), &r.stops);
        let (first, rest) = text.split_once('\n').unwrap_or((&text, ""));
        out.push_str(&format!("{first}\n  nodes: {}\n{rest}", d.nodes.join(", ")));
    }
    out + &report::render_starts(&r.starts) + &report::render_storms(&r.storms)
}

/// The line for stderr when agents did not answer (the command then exits 1), None when all did.
pub fn missing(r: &ClusterReport) -> Option<String> {
    (!r.unanswered.is_empty()).then(|| {
        let who: Vec<String> = r
            .unanswered
            .iter()
            .map(|f| format!("{} on {} ({})", f.pod, f.node, f.error))
            .collect();
        format!(
            "{} of {} agents did not answer: {}",
            r.unanswered.len(),
            r.agents,
            who.join("; ")
        )
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const WINDOW: Duration = Duration::from_secs(600);

    fn deploy(id: &str, at: &str, revisions: &[&str], stops: &[&str], cut: u64) -> DeployView {
        serde_json::from_value(json!({
            "id": id, "namespace": "shop", "workload": "web", "workload_kind": "Deployment",
            "started_at": at, "last_stop_at": at, "revisions": revisions, "stops": stops,
            "outcomes": {"drained": stops.len()}, "loss": {"inflight_cut": cut},
        }))
        .unwrap()
    }

    fn stop(id: &str, at: &str, node: &str) -> StopView {
        serde_json::from_value(json!({
            "id": id, "sigterm_at": at, "settled": true, "outcome": "drained",
            "container": {"name": "web", "namespace": "shop", "pod": format!("web-{id}"), "workload": "web", "node": node},
        }))
        .unwrap()
    }

    fn answer(node: &str, deploys: Vec<DeployView>, stops: Vec<StopView>) -> NodeAnswer {
        NodeAnswer {
            pod: format!("drainwatch-{node}"),
            node: node.into(),
            docs: Ok(NodeDocs {
                stops,
                deploys,
                ..Default::default()
            }),
        }
    }

    #[test]
    fn two_nodes_with_halves_of_one_rollout_make_one_deploy() {
        let a = answer(
            "node-a",
            vec![deploy(
                "web-a1",
                "2026-12-04T10:00:01.000Z",
                &["abc"],
                &["a1"],
                2,
            )],
            vec![stop("a1", "2026-12-04T10:00:01.000Z", "node-a")],
        );
        // The other half, 40 s later on another node; its agent knew no node name.
        let b = answer(
            "node-b",
            vec![deploy(
                "web-b1",
                "2026-12-04T10:00:41.000Z",
                &["abc"],
                &["b1"],
                3,
            )],
            vec![stop("b1", "2026-12-04T10:00:41.000Z", "")],
        );
        let r = merge(&[b, a], WINDOW);
        assert_eq!(r.deploys.len(), 1, "{r:#?}");
        let d = &r.deploys[0];
        assert_eq!(d.nodes, ["node-a", "node-b"]);
        assert_eq!(d.deploy.id, "web-a1");
        assert_eq!(d.deploy.stops, ["a1", "b1"]);
        assert_eq!(d.deploy.loss.inflight_cut, 5);
        assert_eq!(d.deploy.outcomes.values().sum::<u64>(), 2);
        assert_eq!(d.deploy.started_at, "2026-12-04T10:00:01.000Z");
        assert_eq!(d.deploy.last_stop_at, "2026-12-04T10:00:41.000Z");
        assert_eq!(
            r.stops[0].container.node, "node-b",
            "newest first, node filled in"
        );
        assert!(r.unanswered.is_empty());
        assert_eq!(missing(&r), None);
        let text = render(&r);
        assert!(
            text.starts_with("CLUSTER: 2 of 2 agents answered\n"),
            "{text}"
        );
        assert!(text.contains("2 stop(s)"), "{text}");
        assert!(text.contains("  nodes: node-a, node-b\n"), "{text}");
    }

    #[test]
    fn the_same_workload_replacing_other_revisions_or_later_is_another_deploy() {
        let a = answer(
            "node-a",
            vec![deploy(
                "web-a1",
                "2026-12-04T10:00:01.000Z",
                &["abc"],
                &["a1"],
                0,
            )],
            vec![stop("a1", "2026-12-04T10:00:01.000Z", "node-a")],
        );
        let b = answer(
            "node-b",
            vec![
                deploy("web-b1", "2026-12-04T10:00:05.000Z", &["def"], &["b1"], 0),
                // Same revision, but an hour later: another rollout.
                deploy("web-b2", "2026-12-04T11:00:05.000Z", &["abc"], &["b2"], 0),
            ],
            vec![
                stop("b1", "2026-12-04T10:00:05.000Z", "node-b"),
                stop("b2", "2026-12-04T11:00:05.000Z", "node-b"),
            ],
        );
        let r = merge(&[a, b], WINDOW);
        let ids: Vec<&str> = r.deploys.iter().map(|d| d.deploy.id.as_str()).collect();
        assert_eq!(ids, ["web-b2", "web-b1", "web-a1"], "newest first");
    }

    #[test]
    fn an_agent_that_did_not_answer_is_named_and_the_others_still_merge() {
        let a = answer(
            "node-a",
            vec![deploy(
                "web-a1",
                "2026-12-04T10:00:01.000Z",
                &["abc"],
                &["a1"],
                1,
            )],
            vec![stop("a1", "2026-12-04T10:00:01.000Z", "node-a")],
        );
        let b = NodeAnswer {
            pod: "drainwatch-x9".into(),
            node: "node-b".into(),
            docs: Err("pod not ready".into()),
        };
        let r = merge(&[a, b], WINDOW);
        assert_eq!(r.deploys.len(), 1);
        assert_eq!(
            r.unanswered,
            [NodeFailure {
                error: "pod not ready".into(),
                node: "node-b".into(),
                pod: "drainwatch-x9".into()
            }]
        );
        assert_eq!(
            missing(&r).as_deref(),
            Some("1 of 2 agents did not answer: drainwatch-x9 on node-b (pod not ready)")
        );
        let text = render(&r);
        assert!(text.starts_with("CLUSTER: 1 of 2 agents answered\nNO ANSWER from drainwatch-x9 on node node-b: pod not ready"), "{text}");
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["unanswered"][0]["node"], "node-b");
        assert_eq!(v["deploys"][0]["nodes"], json!(["node-a"]));
        assert_eq!(
            v["deploys"][0]["workload"], "web",
            "the deploy's fields, flattened"
        );
    }

    #[test]
    fn storms_link_to_the_merged_deploy() {
        let mut a = answer(
            "node-a",
            vec![deploy(
                "web-a1",
                "2026-12-04T10:00:01.000Z",
                &["abc"],
                &["a1"],
                0,
            )],
            vec![stop("a1", "2026-12-04T10:00:01.000Z", "node-a")],
        );
        let mut b = answer(
            "node-b",
            vec![deploy(
                "web-b1",
                "2026-12-04T10:00:02.000Z",
                &["abc"],
                &["b1"],
                0,
            )],
            vec![stop("b1", "2026-12-04T10:00:02.000Z", "node-b")],
        );
        for (x, local) in [(&mut a, "web-a1"), (&mut b, "web-b1")] {
            if let Ok(d) = &mut x.docs {
                d.storms.push(StormView {
                    deploy_id: Some(local.into()),
                    ..Default::default()
                });
            }
        }
        let r = merge(&[a, b], WINDOW);
        assert!(
            r.storms
                .iter()
                .all(|s| s.deploy_id.as_deref() == Some("web-a1")),
            "{:?}",
            r.storms
        );
    }
}
