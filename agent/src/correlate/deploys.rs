//! Deploys: the stops of one workload within a window of each other (default 10 minutes) are
//! one deploy. Derived from the stop records on demand, so it needs no state of its own.

use std::collections::BTreeMap;

use crate::model::{Loss, Mono, deploy::Deploy, stop::Stop};

/// Groups stops into deploys, newest first.
pub fn group(stops: &[Stop], window: Mono) -> Vec<Deploy> {
    let mut ordered: Vec<&Stop> = stops.iter().collect();
    ordered.sort_by_key(|s| s.started_at());
    let mut open: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut deploys: Vec<Deploy> = Vec::new();
    for s in ordered {
        let key = (s.container.namespace.clone(), s.container.workload.clone());
        let start = s.started_at();
        let idx = match open.get(&key) {
            Some(&i) if start.saturating_sub(deploys[i].last_stop_at) <= window => i,
            _ => {
                deploys.push(Deploy {
                    id: format!("{}-{}", s.container.workload, s.id),
                    namespace: key.0.clone(),
                    workload: key.1.clone(),
                    workload_kind: String::new(),
                    revisions: Vec::new(),
                    started_at: start,
                    last_stop_at: start,
                    stops: Vec::new(),
                    outcomes: BTreeMap::new(),
                    in_progress: 0,
                    loss: Loss::default(),
                });
                open.insert(key, deploys.len() - 1);
                deploys.len() - 1
            }
        };
        let d = &mut deploys[idx];
        d.last_stop_at = start;
        d.stops.push(s.id.clone());
        if d.workload_kind.is_empty() {
            d.workload_kind = s.container.workload_kind.clone();
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
    deploys.reverse();
    deploys
}
