//! Resets and refused connects, each counted once for the network namespace that sent or
//! received it, so that a pod's series sum to its own `TcpOutRsts`. A RST on a connection the
//! agent follows is that container's (and its stop's loss). Any other RST of a container's
//! namespace (a SYN to a closed port answered by no socket, data after close, an abort of a
//! socket nobody follows, a time-wait RST) goes to the container that holds the local port
//! (its listener, open or closed), else to the namespace's only container, else, in a pod of
//! several, to the pod as a whole: an identity with the pod's names and container "". The
//! host's namespace is no pod's: there only followed connections and listeners count.
//!
//! A RST in a namespace no known container has yet (a container that started since the last
//! scan, which runs every second) waits in `Unowned` for the next scan, up to `UNOWNED_WAIT` of
//! event time; what is still unowned then, or past the cap, is counted as dropped.
//!
//! Namespaces are told apart by cookie where the kernel has one (`model::netns`): a RST from a
//! replacement's namespace that reused a stopped container's inode is the replacement's (its
//! start's refusals, its own resets), never the stopped container's.
//!
//! A RST answering a SYN (no ACK) is a refused connect: at a listening address the container
//! had closed it is its stop's loss (`Observation::Refused`, held in `refusals` for the
//! attempt's own side); elsewhere a counted refusal (`Observation::RefusedAt`). Where the
//! kernel side could not read the answered segment, only the first kind is told.

use std::{collections::VecDeque, sync::Arc};

use super::{Enricher, MAX_REFUSED_ATTEMPTS, refusals::Target};
use crate::model::state::make_room_in_set;
use crate::{
    capture::event::{Endpoints, ResetReceived, ResetSent},
    enrich::host::HostView,
    model::{
        ContainerIdentity, Mono, Netns, Observation, ResetDirection, TcpState, netns::cookies_agree,
    },
};

/// How long a RST of an unknown namespace waits for a scan to find its container.
const UNOWNED_WAIT: Mono = 3_000_000_000;
/// RSTs waiting at most; past it the oldest is dropped (counted).
const UNOWNED_MAX: usize = 4096;

#[derive(Debug, Clone)]
enum Rst {
    Sent(ResetSent),
    Received(ResetReceived),
}

impl Rst {
    fn at(&self) -> Mono {
        match self {
            Rst::Sent(r) => r.meta.ts_ns,
            Rst::Received(r) => r.meta.ts_ns,
        }
    }
}

/// Who answers for a RST (see the module's rule).
enum Owner {
    /// A followed connection's container: its stop counts the RST.
    Connection(Arc<ContainerIdentity>),
    /// The port's holder, the namespace's only container, or the pod as a whole.
    Namespace(Arc<ContainerIdentity>),
    /// A pod's namespace no container is known in yet: wait for a scan.
    NotYet,
    /// The host's namespace, off any container's connection or port: nobody's.
    Nobody,
}

/// RSTs of namespaces no container was known in yet.
#[derive(Debug, Default)]
pub(super) struct Unowned {
    waiting: VecDeque<Rst>,
    /// Given up on: their namespace's container was never found in time.
    pub(super) dropped: u64,
    /// Attributed by namespace with no cookie in their records (by inode alone).
    pub(super) by_inode: u64,
}

impl<H: HostView> Enricher<H> {
    pub(super) fn reset_sent(&mut self, r: &ResetSent, out: &mut Vec<Observation>) {
        let ns = r.meta.ns();
        let owner = self.owner(r.skaddr, ns, r.conn.as_ref());
        if matches!(owner, Owner::NotYet) {
            self.wait_for_owner(Rst::Sent(r.clone()));
            return;
        }
        let reason = r
            .reason
            .as_ref()
            .map_or_else(|| "unknown".into(), ToString::to_string);
        // Data to one of its listening ports (open or closed): a client's request, not an
        // upstream's answer to a connection it had opened itself.
        let request = r.answers_data == Some(true)
            && r.conn.is_some_and(|c| {
                let p = c.local.port();
                self.listeners.open_at(ns, p).is_some() || self.listeners.closed_at(ns, p).is_some()
            });
        self.reset(&owner, ns, ResetDirection::Sent, reason, request, out);
        let Some(conn) = r.conn.filter(|_| r.skaddr == 0) else {
            return;
        };
        let port = conn.local.port();
        // A refusal at an ended container's former address: restarted since?
        if let Some((key, ..)) = self.listeners.closed_at(ns, port).cloned() {
            self.recheck_ended(&key, r.meta.ts_ns, out);
        }
        let open = self.listeners.open_at(ns, port).is_some();
        let at = r.meta.ts_ns;
        let restarted = |key: &String| {
            self.containers
                .get(key)
                .and_then(|c| c.next_run_at)
                .is_some_and(|t| t <= at)
        };
        let former = self
            .listeners
            .closed_at(ns, port)
            .map(|(k, ..)| k)
            .filter(|k| !open && !restarted(k))
            .cloned()
            .or_else(|| {
                // Before its new run started, though seen after: the old run's stop's.
                let (key, since, _) = self.listeners.reserved_at(ns, port)?;
                (at < *since).then(|| key.clone())
            });
        let target = match (former, r.answers_syn) {
            (_, Some(false)) => return,
            (Some(key), _) => Target::Former(key, ns, port),
            (None, Some(true)) => match owner {
                Owner::Namespace(c) => Target::Port(c, ns, port),
                _ => return,
            },
            // The answered segment is unknown: only a former listening address tells.
            (None, None) => return,
        };
        self.refusals
            .refused(r.meta.ts_ns, conn.remote, target, out);
    }

    pub(super) fn reset_received(&mut self, r: &ResetReceived, out: &mut Vec<Observation>) {
        if r.state == Some(TcpState::SynSent) {
            make_room_in_set(
                &mut self.sockets.refused_attempts,
                MAX_REFUSED_ATTEMPTS,
                &r.skaddr,
                &mut self.dropped.refused_attempts,
            );
            self.sockets.refused_attempts.insert(r.skaddr);
        } else if let Some(conn) = r.conn {
            self.peer_done(r.skaddr, r.meta.netns, conn);
        }
        self.count_received(r, out);
    }

    fn count_received(&mut self, r: &ResetReceived, out: &mut Vec<Observation>) {
        let owner = self.owner(r.skaddr, r.meta.ns(), r.conn.as_ref());
        if matches!(owner, Owner::NotYet) {
            self.wait_for_owner(Rst::Received(r.clone()));
            return;
        }
        self.reset(
            &owner,
            r.meta.ns(),
            ResetDirection::Received,
            "none".into(),
            false,
            out,
        );
    }

    fn owner(&self, skaddr: u64, ns: Netns, conn: Option<&Endpoints>) -> Owner {
        if let Some(c) = self.connection_owner(skaddr, conn) {
            return Owner::Connection(c);
        }
        if let Some(c) = self.port_owner(ns, conn.map(|c| c.local.port())) {
            return Owner::Namespace(c);
        }
        if ns.inum != 0 && self.host_netns != Some(ns.inum) {
            Owner::NotYet
        } else {
            Owner::Nobody
        }
    }

    fn owned(&self, skaddr: u64, ns: Netns, conn: &Option<Endpoints>) -> bool {
        !matches!(self.owner(skaddr, ns, conn.as_ref()), Owner::NotYet)
    }

    fn wait_for_owner(&mut self, r: Rst) {
        if self.unowned_rsts.waiting.len() >= UNOWNED_MAX {
            self.unowned_rsts.waiting.pop_front();
            self.unowned_rsts.dropped += 1;
        }
        self.unowned_rsts.waiting.push_back(r);
    }

    /// After a scan: the waiting RSTs whose container is known now, as if they came now;
    /// those that waited too long (in event time, `now`) are dropped.
    pub(super) fn replay_unowned(&mut self, now: Mono, out: &mut Vec<Observation>) {
        if self.unowned_rsts.waiting.is_empty() {
            return;
        }
        let waiting = std::mem::take(&mut self.unowned_rsts.waiting);
        for r in waiting {
            match &r {
                Rst::Sent(s) if self.owned(s.skaddr, s.meta.ns(), &s.conn) => {
                    self.reset_sent(s, out)
                }
                Rst::Received(s) if self.owned(s.skaddr, s.meta.ns(), &s.conn) => {
                    self.count_received(s, out)
                }
                _ if now > r.at().saturating_add(UNOWNED_WAIT) => self.unowned_rsts.dropped += 1,
                _ => self.unowned_rsts.waiting.push_back(r),
            }
        }
    }

    /// RSTs given up on since the agent started: no container was found for their namespace.
    pub fn unowned_dropped(&self) -> u64 {
        self.unowned_rsts.dropped
    }

    /// RSTs attributed by their namespace's inode alone since the agent started (no cookie in
    /// their records: see `model::netns`).
    pub fn resets_by_inode(&self) -> u64 {
        self.unowned_rsts.by_inode
    }

    fn reset(
        &mut self,
        owner: &Owner,
        ns: Netns,
        direction: ResetDirection,
        reason: String,
        answers_request: bool,
        out: &mut Vec<Observation>,
    ) {
        if matches!(owner, Owner::Namespace(_)) && ns.cookie == 0 {
            self.unowned_rsts.by_inode += 1;
        }
        let (container, on_connection) = match owner {
            Owner::Connection(c) => (Arc::clone(c), true),
            Owner::Namespace(c) => (Arc::clone(c), false),
            Owner::NotYet | Owner::Nobody => return,
        };
        out.push(Observation::Reset {
            container,
            direction,
            reason,
            on_connection,
            answers_request,
        });
    }

    /// Who answers for a packet of namespace `ns` at local `port` that no followed
    /// connection claims (see the module's rule).
    pub(super) fn port_owner(
        &self,
        ns: Netns,
        port: Option<u16>,
    ) -> Option<Arc<ContainerIdentity>> {
        let identity = |key: &str| self.containers.get(key).map(|c| Arc::clone(&c.identity));
        if let Some(port) = port {
            if let Some((key, ..)) = self.listeners.open_at(ns, port) {
                return identity(key.as_str());
            }
            if let Some((key, ..)) = self.listeners.closed_at(ns, port) {
                return identity(key);
            }
            if let Some((key, ..)) = self.listeners.reserved_at(ns, port) {
                return identity(key);
            }
        }
        if self.host_netns == Some(ns.inum) {
            return None;
        }
        // The containers whose namespace this may be: by cookie where theirs is known, those
        // not known yet only where none is known to have it.
        let exact = ns.cookie != 0
            && self
                .containers
                .values()
                .any(|c| c.netns == Some(ns.inum) && c.netns_cookie == ns.cookie);
        let of_ns = |c: &super::Container| {
            c.netns == Some(ns.inum)
                && if exact {
                    c.netns_cookie == ns.cookie
                } else {
                    cookies_agree(c.netns_cookie, ns.cookie)
                }
        };
        // Running members first: a gone container's namespace may be reused. A pod's sandbox
        // answers for nothing while an app of its pod is known: alone, it is the pod's whole.
        let members = |running: bool, sandbox: bool| -> Vec<&super::Container> {
            self.containers
                .values()
                .map(|c| &**c)
                .filter(|c| of_ns(c))
                .filter(|c| !running || c.gone_at.is_none())
                .filter(|c| sandbox || !c.identity.is_sandbox())
                .collect()
        };
        let members = [(true, false), (false, false), (true, true), (false, true)]
            .into_iter()
            .map(|(running, sandbox)| members(running, sandbox))
            .find(|m| !m.is_empty())
            .unwrap_or_default();
        match members.as_slice() {
            [] => None,
            [only] if !only.identity.is_sandbox() => Some(Arc::clone(&only.identity)),
            many => many
                .iter()
                .min_by(|a, b| a.identity.id.cmp(&b.identity.id))
                .map(|c| Arc::new(pod_as_a_whole(&c.identity))),
        }
    }
}

/// The identity a pod's own RSTs are counted under: its names, no container.
fn pod_as_a_whole(member: &ContainerIdentity) -> ContainerIdentity {
    ContainerIdentity {
        id: String::new(),
        name: String::new(),
        runtime: member.runtime.clone(),
        namespace: member.namespace.clone(),
        pod: member.pod.clone(),
        workload: member.workload.clone(),
        workload_kind: member.workload_kind.clone(),
        revision: member.revision.clone(),
        node: member.node.clone(),
        stop_policy: Default::default(),
        pod_ready_at: member.pod_ready_at,
    }
}
