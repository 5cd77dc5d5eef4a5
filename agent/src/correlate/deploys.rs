//! Deploys: the stops and starts of one workload within a window of each other (default 10
//! minutes) are one deploy: a rollout stops old containers and starts new ones. Derived from
//! the records on demand, so it needs no state of its own. A start with no stop near it (a
//! scale-up, a first rollout) is a deploy of its own.

use std::collections::BTreeMap;

use crate::model::{Loss, Mono, deploy::Deploy, start::Start, stop::Stop};

/// A stop or a start, in time order.
enum Record<'a> {
    Stop(&'a Stop),
    Start(&'a Start),
}

impl Record<'_> {
    fn at(&self) -> Mono {
        match self {
            Record::Stop(s) => s.started_at(),
            Record::Start(s) => s.started_at,
        }
    }

    fn container(&self) -> &crate::model::ContainerIdentity {
        match self {
            Record::Stop(s) => &s.container,
            Record::Start(s) => &s.container,
        }
    }

    fn id(&self) -> &str {
        match self {
            Record::Stop(s) => &s.id,
            Record::Start(s) => &s.id,
        }
    }
}

/// Groups stops and starts into deploys, newest first.
pub fn group(stops: &[Stop], starts: &[Start], window: Mono) -> Vec<Deploy> {
    let mut ordered: Vec<Record> = stops
        .iter()
        .map(Record::Stop)
        .chain(starts.iter().map(Record::Start))
        .collect();
    ordered.sort_by_key(Record::at);
    // Per workload: its open deploy and the time of its latest record.
    let mut open: BTreeMap<(String, String), (usize, Mono)> = BTreeMap::new();
    let mut deploys: Vec<Deploy> = Vec::new();
    for r in ordered {
        let c = r.container();
        let key = (c.namespace.clone(), c.workload.clone());
        let at = r.at();
        let idx = match open.get(&key) {
            Some(&(i, last)) if at.saturating_sub(last) <= window => i,
            _ => {
                deploys.push(Deploy {
                    id: format!("{}-{}", c.workload, r.id()),
                    namespace: key.0.clone(),
                    workload: key.1.clone(),
                    workload_kind: String::new(),
                    revisions: Vec::new(),
                    started_at: at,
                    last_stop_at: at,
                    stops: Vec::new(),
                    pods: Vec::new(),
                    starts: Vec::new(),
                    refused_before_listen: 0,
                    outcomes: BTreeMap::new(),
                    in_progress: 0,
                    loss: Loss::default(),
                });
                deploys.len() - 1
            }
        };
        open.insert(key, (idx, at));
        let d = &mut deploys[idx];
        if d.workload_kind.is_empty() {
            d.workload_kind = c.workload_kind.clone();
        }
        match r {
            Record::Start(s) => {
                d.starts.push(s.id.clone());
                d.refused_before_listen += s.loss.refused_before_listen;
                if d.stops.is_empty() {
                    d.last_stop_at = at;
                }
            }
            Record::Stop(s) => {
                d.last_stop_at = at;
                d.stops.push(s.id.clone());
                let pod = &s.container.pod;
                if !pod.is_empty() && !d.pods.contains(pod) {
                    d.pods.push(pod.clone());
                }
                let rev = &s.container.revision;
                if !rev.is_empty() && !d.revisions.contains(rev) {
                    d.revisions.push(rev.clone());
                }
                match s.outcome() {
                    Some(o) => *d.outcomes.entry(o).or_default() += 1,
                    None => d.in_progress += 1,
                }
                d.loss.add(&s.loss);
            }
        }
    }
    deploys.reverse();
    deploys
}
