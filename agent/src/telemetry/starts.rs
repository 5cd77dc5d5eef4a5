//! Per-container start families: connects refused before a starting container listened, and
//! RSTs of namespaces whose container was never found.

use std::sync::Arc;

use prometheus_client::{metrics::counter::Counter, metrics::family::Family, registry::Registry};

use super::{cap::Cap, labels::ContainerLabels};
use crate::model::{ContainerIdentity, start::Start};

pub struct StartMetrics {
    cap: Arc<Cap>,
    refused_before_listen: Family<ContainerLabels, Counter>,
    probes_refused: Family<ContainerLabels, Counter>,
    unowned_resets: Counter,
    resets_by_inode: Counter,
    unseen_containers: Counter,
}

impl StartMetrics {
    pub fn register(registry: &mut Registry, cap: Arc<Cap>) -> Self {
        let m = Self {
            cap,
            refused_before_listen: Family::default(),
            probes_refused: Family::default(),
            unowned_resets: Counter::default(),
            resets_by_inode: Counter::default(),
            unseen_containers: Counter::default(),
        };
        registry.register(
            "drainwatch_start_refused_before_listen",
            "Connects refused at a starting container's port before it first listened there: it was routed to before it was ready (counted when its start settles)",
            m.refused_before_listen.clone(),
        );
        registry.register(
            "drainwatch_start_probe_refusals",
            "Health checks refused before a starting container listened: normal during start-up, apart from the request count",
            m.probes_refused.clone(),
        );
        registry.register(
            "drainwatch_resets_unattributed",
            "RSTs and refused connects of network namespaces in which no container was found within 3 s: missing from every container's series",
            m.unowned_resets.clone(),
        );
        registry.register(
            "drainwatch_resets_by_netns_inode",
            "RSTs and refused connects attributed to a container by its network namespace's inode alone, their records carrying no namespace cookie (kernels before 5.12): a replacement whose namespace reused a stopped container's inode cannot be told from it",
            m.resets_by_inode.clone(),
        );
        registry.register(
            "drainwatch_containers_unseen",
            "Containers whose cgroup was removed before the agent saw any of their processes (their whole life between two of its scans, a second apart): they have no start or stop record",
            m.unseen_containers.clone(),
        );
        m
    }

    /// Zeroed series for a container found, as for its stop families.
    pub fn container_seen(&self, c: &ContainerIdentity) {
        let l = ContainerLabels::from(c);
        if self.cap.admit(&l, "drainwatch_start_refused_before_listen") {
            let _ = self.cap.series(&self.refused_before_listen, &l);
            let _ = self.cap.series(&self.probes_refused, &l);
        }
    }

    pub fn start_settled(&self, s: &Start) {
        let l = ContainerLabels::from(&s.container);
        if !self.cap.admit(&l, "drainwatch_start_refused_before_listen") {
            return;
        }
        self.cap
            .series(&self.refused_before_listen, &l)
            .inc_by(s.loss.refused_before_listen);
        self.cap
            .series(&self.probes_refused, &l)
            .inc_by(s.loss.probes.refused);
    }

    /// The enricher's running count of RSTs it gave up on.
    pub fn set_unowned_resets(&self, total: u64) {
        raise_to(&self.unowned_resets, total);
    }

    pub fn set_resets_by_inode(&self, total: u64) {
        raise_to(&self.resets_by_inode, total);
    }

    pub fn set_unseen_containers(&self, total: u64) {
        raise_to(&self.unseen_containers, total);
    }
}

/// A counter that mirrors a running total kept elsewhere.
fn raise_to(counter: &Counter, total: u64) {
    let now = counter.get();
    if total > now {
        counter.inc_by(total - now);
    }
}
