//! Reconnect storms with real containers: a socket service whose connect path is bounded
//! (`backend.py --mode gate`: `workers` concurrent "authorisations" of `auth` each, 10 × 20 ms =
//! 500 connects/s), a fleet of N persistent clients connected to it, the container stopped (a
//! rolling update: the clients come back to a replacement of the same workload) or restarted in
//! place (they come back to it), and each client's own measurements of every connection.
//!
//! What the clients measure, per connection (all on `CLOCK_MONOTONIC`, the clock of eBPF):
//! - `start`: just before `connect()`; `connected`: `connect()` returned (the SYN-ACK arrived:
//!   the server's side of the handshake completes with the ACK sent right then, microseconds
//!   later on the bridge); `greeted`: the greeting line arrived;
//! - the SYN retransmissions the handshake needed (`TCP_INFO`): a SYN the listener dropped
//!   puts seconds into the client's wait that no accept queue holds.
//!
//! The kernel's accept wait runs from handshake completion to `accept()` returning. The server
//! then authorises for `auth` and greets, so the client's measure of the same interval is
//! `greeted - connected - auth` ([`StormRun::client_waits`]): the handshake, which can include
//! SYN retransmissions, is left out on purpose. What remains besides the queue wait is the
//! server's own overhead after `accept()` (the GIL, the sleep's overshoot, the send) and the
//! client's delay noticing two events instead of one: milliseconds, against waits of seconds
//! while the machine is not starved. A starved server can hold greetings up for seconds after
//! `accept()`, so the checks take the wait from the server's own log instead
//! ([`StormRun::server_waits`]: its `accept()` return, carried in the greeting, minus the
//! client's `connect()` return); the clients' measure is printed beside it.
//!
//! Everything is bounded (`StormSpec::bound`); traffic goes only to the lab's own containers.

mod analysis;
mod clients;
mod listener;
mod report;

use std::time::{Duration, Instant};

use super::container::{Backend, BackendOpts, Mode, StopTimes, unique_name};

pub use analysis::quantile;
pub use clients::{Attempt, Fleet, raise_nofile};
use listener::QueueSampler;
pub use listener::{accept_queue_depth, tcp_ext};

/// The label drainwatch names a workload by outside Kubernetes.
pub const COMPOSE_SERVICE: &str = "com.docker.compose.service";

/// What happens to the server the clients are connected to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replace {
    /// A second container of the same workload is up; the first is `podman stop`ped and the
    /// clients reconnect to the second.
    Rolling,
    /// The container is `podman restart`ed; the clients reconnect to it (same address).
    InPlace,
}

#[derive(Clone, Debug)]
pub struct StormSpec {
    pub clients: usize,
    /// Each client waits a delay uniform in `[jitter.0, jitter.1)` after losing its connection
    /// (and again after each failed attempt) before reconnecting.
    pub jitter: (Duration, Duration),
    pub replace: Replace,
    /// `com.docker.compose.service` of the containers.
    pub workload: String,
    /// `listen()` backlog: large enough that nothing overflows unless a test wants it to.
    pub backlog: u32,
    pub workers: u32,
    pub auth: Duration,
    pub grace_secs: u32,
    /// Seed of the clients' jitter: every run draws the same delays.
    pub seed: u64,
    /// Bound on each phase (fleet up, fleet back).
    pub bound: Duration,
}

impl StormSpec {
    /// `clients` clients, 10 authorisations of 20 ms (500 connects/s), backlog 4096.
    pub fn new(clients: usize, jitter: (Duration, Duration), replace: Replace) -> StormSpec {
        StormSpec {
            clients,
            jitter,
            replace,
            workload: unique_name("ws"),
            backlog: 4096,
            workers: 10,
            auth: Duration::from_millis(20),
            grace_secs: 10,
            seed: 0x5eed_0005,
            bound: Duration::from_secs(40),
        }
    }

    /// The connect rate the server is built for: workers ÷ auth.
    pub fn capacity(&self) -> f64 {
        self.workers as f64 / self.auth.as_secs_f64()
    }
}

/// The old container and, for a rolling update, its replacement. Dropping it removes both.
pub struct StormLab {
    pub spec: StormSpec,
    pub old: Backend,
    pub new: Option<Backend>,
}

/// The ground truth of one storm.
pub struct StormRun {
    pub spec: StormSpec,
    /// `podman stop` (rolling) or `podman restart` (in place): issued and returned.
    pub stop: StopTimes,
    /// Every attempt of every client, by client then sequence.
    pub attempts: Vec<Attempt>,
    /// The old container's exit code (rolling; a restarted one is running again).
    pub old_exit_code: Option<i32>,
    /// Accept-queue depth of the listener the clients came back to, sampled every 10 ms.
    pub queue: Vec<(Instant, u32)>,
    /// `ListenOverflows` of the namespace the clients came back to, during the storm.
    pub listen_overflows: u64,
    /// The container the clients came back to (name, id).
    pub target_container: String,
    pub target_id: String,
}

fn gate_opts(spec: &StormSpec) -> BackendOpts {
    BackendOpts {
        labels: vec![(COMPOSE_SERVICE.into(), spec.workload.clone())],
        backlog: Some(spec.backlog),
        gate_workers: Some(spec.workers),
        gate_auth: Some(spec.auth),
        ..BackendOpts::default()
    }
}

impl StormLab {
    pub fn setup(spec: StormSpec) -> StormLab {
        let old = Backend::start("old", Mode::Gate, gate_opts(&spec));
        let new = (spec.replace == Replace::Rolling)
            .then(|| Backend::start("new", Mode::Gate, gate_opts(&spec)));
        StormLab { spec, old, new }
    }

    /// Connects the fleet to the old server, stops (or restarts) it, waits until every client
    /// is back and greeted, and collects the ground truth. Once per lab.
    pub fn run(&mut self) -> StormRun {
        let spec = self.spec.clone();
        let target = self.new.as_ref().unwrap_or(&self.old);
        self.old.require_route();
        target.require_route();
        let (then, port) = (target.addr(), target.port);
        let (target_container, target_id) = (target.container.clone(), target.id.clone());
        let ns_pid = target.netns_pid();
        let fleet = Fleet::start(&spec, self.old.addr(), then);
        let n = spec.clients;
        assert!(
            fleet.wait_for(n, Fleet::up, spec.bound),
            "only {} of {n} clients connected to the old server within {:?}",
            fleet.up(),
            spec.bound
        );
        let overflows_before = tcp_ext(ns_pid, "ListenOverflows").expect("ListenOverflows");
        let sampler = QueueSampler::start(ns_pid, port, Duration::from_millis(10));
        let (stop, old_exit_code) = match spec.replace {
            Replace::Rolling => {
                let st = self.old.stop(spec.grace_secs);
                (st, Some(self.old.exit_code()))
            }
            Replace::InPlace => (self.old.restart(spec.grace_secs, spec.bound), None),
        };
        let all_back = fleet.wait_for(n, Fleet::back, spec.bound);
        let back = fleet.back();
        let queue = sampler.finish();
        let overflows_after = tcp_ext(ns_pid, "ListenOverflows").expect("ListenOverflows");
        let attempts = fleet.finish();
        let run = StormRun {
            spec,
            stop,
            attempts,
            old_exit_code,
            queue,
            listen_overflows: overflows_after - overflows_before,
            target_container,
            target_id,
        };
        assert!(
            all_back,
            "only {back} of {n} clients came back within {:?}\n{}",
            run.spec.bound,
            run.report()
        );
        run
    }
}
