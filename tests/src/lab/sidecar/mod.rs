//! A pod with a mesh-like sidecar (issue 43): the Istio / Linkerd shape, measured.
//!
//! The pod is the lab's usual one: a network holder (its sandbox) keeps the address, the app
//! (`tests/lab/backend.py`) listens on 8080 in it. The sidecar is a third container joined to
//! the same namespace (`--network container:<holder>`): Debian's nginx, run through the host's
//! read-only `/usr`, listening on [`SIDECAR_PORT`] and proxying every request to
//! `127.0.0.1:8080` (one upstream server, so no retry and no passive health: each request is
//! one loopback connect). Its PID 1 is `tests/lab/sidecar.py`, a pilot-agent-like wrapper that
//! keeps nginx serving a few seconds after SIGTERM and then quits it gracefully.
//!
//! Clients on the node send slow requests to the pod's address and the sidecar's port on a
//! beat; the pod is stopped in the kubelet's order for regular containers ([`Order::Classic`]:
//! both get SIGTERM together) or for native sidecars ([`Order::Native`]: the app first, the
//! sidecar once the app has exited). A retrying sidecar balances over the app and a replica
//! (a second app container of the pod, on 8081) and the app is restarted alone
//! ([`Order::AppOnly`]): nginx runs its cut requests again on the replica. Ground truth, none of it drainwatch's: each client's own
//! outcome, the app's own work log (a request started and never finished was cut), the
//! sidecar's access and error logs (502s, refused loopback connects), the pod namespace's TCP
//! counters.

mod container;

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    net::SocketAddr,
    time::{Duration, Instant},
};

pub use container::{APP_PORT, REPLICA_PORT, SIDECAR_PORT, Sidecar};

use super::{
    Backend, BackendOpts, Mode, StopTimes,
    client::{RequestRecord, request},
    clock,
    container::BridgeHolder,
};
use crate::snmp_tcp;

/// The order the pod's containers are stopped in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Both SIGTERMed together: the kubelet with a sidecar as a regular container.
    Classic,
    /// The app first, the sidecar once the app has exited: Kubernetes native sidecars
    /// (an init container with `restartPolicy: Always`).
    Native,
    /// The app alone (the kubelet restarting it after a failed liveness probe): the sidecar
    /// and any replica serve on.
    AppOnly,
}

/// One run's shape.
#[derive(Clone, Debug)]
pub struct SidecarSpec {
    pub order: Order,
    /// The app's SIGTERM behaviour (`NoHandler`: cut; `Drain`: graceful).
    pub mode: Mode,
    /// The app's `Drain` delay.
    pub drain_delay: Option<Duration>,
    /// How long the wrapper keeps the sidecar serving after SIGTERM.
    pub sidecar_drain: Duration,
    /// One request every `beat`, from the load's start...
    pub beat: Duration,
    /// ...for `lead` before the stop...
    pub lead: Duration,
    /// ...and `after` after it (the endpoint's removal lag: clients stop sending then). Less
    /// than `sidecar_drain`, so no client ever meets the sidecar's own closed port.
    pub after: Duration,
    /// The work each request asks the app for (`/work?ms=`).
    pub work: Duration,
    /// A second app container in the pod (`REPLICA_PORT`, never stopped), the sidecar
    /// balancing over both and retrying a cut request on the other.
    pub replica: bool,
    /// The sidecar never takes an upstream out of its rotation (`max_fails=0`): each request
    /// whose turn the stopped app has is refused and retried on the replica (Envoy retrying
    /// connect failures with no outlier detection). Otherwise nginx's passive health marks the
    /// app down at its first failure and nothing is refused after.
    pub keep_trying: bool,
}

impl SidecarSpec {
    /// An app without a SIGTERM handler (dies at once, cutting what it holds), the sidecar
    /// serving 3 s after SIGTERM, clients every 200 ms for 2 s before and 2 s after the stop.
    pub fn cut(order: Order) -> Self {
        Self {
            order,
            mode: Mode::NoHandler,
            drain_delay: None,
            sidecar_drain: Duration::from_secs(3),
            beat: Duration::from_millis(200),
            lead: Duration::from_secs(2),
            after: Duration::from_secs(2),
            work: Duration::from_millis(1500),
            replica: false,
            keep_trying: false,
        }
    }

    /// The app drains (serves 2.5 s after SIGTERM, then finishes what it holds), the clients
    /// stop 1 s after the stop (the endpoint gone): nothing may be lost.
    pub fn graceful(order: Order) -> Self {
        Self {
            mode: Mode::Drain,
            drain_delay: Some(Duration::from_millis(2500)),
            after: Duration::from_secs(1),
            ..Self::cut(order)
        }
    }
}

/// The pod: a bridge holder, the app (with its network holder), a replica and the sidecar.
/// Fields drop in order: the sidecar, the replica, then the app and its holder, then the bridge
/// holder.
pub struct SidecarLab {
    pub spec: SidecarSpec,
    pub sidecar: Sidecar,
    pub replica: Option<Backend>,
    pub app: Backend,
    pub bridge: BridgeHolder,
}

/// What one run did, from the clients, the app's and the sidecar's logs and the kernel.
#[derive(Debug)]
pub struct SidecarRun {
    pub requests: Vec<RequestRecord>,
    pub app_stop: StopTimes,
    /// None: the sidecar was not stopped (`Order::AppOnly`).
    pub sidecar_stop: Option<StopTimes>,
    pub app_exit: i32,
    pub sidecar_exit: Option<i32>,
    /// Ids the app started and never finished (its own work log).
    pub cut: BTreeSet<String>,
    /// Cut ids the replica started too: the sidecar's retries, run twice.
    pub duplicates: BTreeSet<String>,
    /// Ids the sidecar answered 502 (its access log).
    pub sidecar_502: BTreeSet<String>,
    /// 502s of requests the app never started: their loopback connect was refused.
    pub refused_502: BTreeSet<String>,
    /// The sidecar's error log: `connect() failed (111: Connection refused)` lines.
    pub refused_lines: usize,
    /// The sidecar's error log: `upstream prematurely closed` lines.
    pub premature_lines: usize,
    /// Requests the sidecar saw reset by the app (its error log) that the app never started
    /// and the replica did: re-sent unexecuted.
    pub reset_unread: BTreeSet<String>,
    /// The pod namespace's `Tcp:` counters over the load: failed connects, RSTs sent,
    /// established connections reset.
    pub attempt_fails: u64,
    pub out_rsts: u64,
    pub estab_resets: u64,
    /// When the app logged its SIGTERM (none: it has no handler) and the wrapper its own.
    pub app_sigterm: Option<Instant>,
    pub sidecar_sigterm: Option<Instant>,
}

impl SidecarLab {
    /// Starts a bridge holder, the app in its pod, the sidecar; checks the route to the pod.
    pub fn setup(spec: SidecarSpec) -> SidecarLab {
        let bridge = BridgeHolder::start("sidecar");
        let app = Backend::start(
            "app",
            spec.mode,
            BackendOpts {
                port: APP_PORT,
                drain_delay: spec.drain_delay,
                ..BackendOpts::default()
            },
        );
        // The replica joins the pod's namespace through its holder's process, at its address.
        let replica = spec.replica.then(|| {
            Backend::start(
                "replica",
                Mode::NoHandler,
                BackendOpts {
                    port: REPLICA_PORT,
                    netns_holder: false,
                    netns: Some(format!("/proc/{}/ns/net", app.netns_pid())),
                    ip: Some(app.ip),
                    ..BackendOpts::default()
                },
            )
        });
        let upstreams: &[u16] = if spec.replica {
            &[APP_PORT, REPLICA_PORT]
        } else {
            &[APP_PORT]
        };
        let sidecar = Sidecar::start(&app, spec.sidecar_drain, upstreams, spec.keep_trying);
        SidecarLab {
            spec,
            sidecar,
            replica,
            app,
            bridge,
        }
    }

    /// Sends the beat, stops the pod in the spec's order `lead` into it, waits for every
    /// request and both containers, and reads the ground truth.
    pub fn run(&self) -> SidecarRun {
        let s = &self.spec;
        self.app.require_route();
        let ns_pid = self.app.netns_pid();
        let counters = || {
            [
                snmp_tcp(ns_pid, "AttemptFails"),
                snmp_tcp(ns_pid, "OutRsts"),
                snmp_tcp(ns_pid, "EstabResets"),
            ]
        };
        let before = counters();
        let start = Instant::now() + Duration::from_millis(100);
        let n = ((s.lead + s.after).as_nanos() / s.beat.as_nanos()) as usize;
        let target = SocketAddr::V4(self.sidecar.addr);
        let work_ms = s.work.as_millis() as u64;
        let timeout = s.work + Duration::from_secs(5);
        let beat = s.beat;
        let clients = std::thread::spawn(move || {
            let handles: Vec<_> = (0..n)
                .map(|i| {
                    clock::sleep_until(start + beat * i as u32);
                    let id = format!("sc-{i}");
                    std::thread::spawn(move || request(target, &id, work_ms, timeout))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("request thread"))
                .collect::<Vec<_>>()
        });
        clock::sleep_until(start + s.lead);
        let (app_stop, sidecar_stop) = match s.order {
            Order::Classic => std::thread::scope(|sc| {
                let side = sc.spawn(|| self.sidecar.stop(10));
                let app = self.app.stop(10);
                (app, Some(side.join().expect("sidecar stop")))
            }),
            Order::Native => {
                let app = self.app.stop(10);
                (app, Some(self.sidecar.stop(10)))
            }
            Order::AppOnly => (self.app.stop(10), None),
        };
        let requests = clients.join().expect("clients");
        let after = counters();
        let work = self.app.work_log();
        let started: BTreeSet<String> = work
            .iter()
            .filter(|w| w.started)
            .map(|w| w.id.clone())
            .collect();
        let ended: BTreeSet<String> = work
            .iter()
            .filter(|w| !w.started)
            .map(|w| w.id.clone())
            .collect();
        let cut: BTreeSet<String> = started.difference(&ended).cloned().collect();
        let replica_started: BTreeSet<String> = self
            .replica
            .iter()
            .flat_map(|r| r.work_log())
            .filter(|w| w.started)
            .map(|w| w.id)
            .collect();
        let duplicates = cut.intersection(&replica_started).cloned().collect();
        let reset_unread = self
            .sidecar
            .error_lines("(104: Connection reset by peer)")
            .iter()
            .filter_map(|l| request_id(l))
            .filter(|id| !started.contains(id) && replica_started.contains(id))
            .collect();
        let sidecar_502: BTreeSet<String> = self
            .sidecar
            .access_log()
            .into_iter()
            .filter(|e| e.status == 502)
            .filter_map(|e| e.id)
            .collect();
        let refused_502 = sidecar_502
            .iter()
            .filter(|id| !started.contains(*id))
            .cloned()
            .collect();
        SidecarRun {
            requests,
            app_stop,
            sidecar_stop,
            app_exit: self.app.exit_code(),
            sidecar_exit: sidecar_stop.and_then(|_| self.sidecar.exit_code()),
            cut,
            duplicates,
            sidecar_502,
            refused_502,
            refused_lines: self
                .sidecar
                .error_lines("connect() failed (111: Connection refused)")
                .len(),
            premature_lines: self
                .sidecar
                .error_lines("upstream prematurely closed")
                .len(),
            reset_unread,
            attempt_fails: after[0] - before[0],
            out_rsts: after[1] - before[1],
            estab_resets: after[2] - before[2],
            app_sigterm: self.app.event_at("sigterm"),
            sidecar_sigterm: self.sidecar.event_at("sigterm"),
        }
    }
}

/// The lab's request id in one of nginx's error log lines (`request: "GET /work?...&id=ID ..."`).
fn request_id(line: &str) -> Option<String> {
    let rest = &line[line.find("&id=")? + 4..];
    let end = rest.find([' ', '&', '"']).unwrap_or(rest.len());
    Some(rest[..end].to_string())
}

impl SidecarRun {
    /// Clients by outcome label.
    pub fn outcomes(&self) -> std::collections::BTreeMap<String, usize> {
        let mut m = std::collections::BTreeMap::new();
        for r in &self.requests {
            *m.entry(r.outcome.label()).or_insert(0) += 1;
        }
        m
    }

    /// Requests whose client started connecting at or after `t` (none if `t` is unknown).
    pub fn sent_after(&self, t: Option<Instant>) -> usize {
        t.map_or(0, |t| self.requests.iter().filter(|r| r.start >= t).count())
    }

    /// The ground truth, for the test's output.
    pub fn report(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "clients: {} requests, {:?}",
            self.requests.len(),
            self.outcomes()
        );
        let _ = writeln!(
            o,
            "app: exit {}, cut (started, never finished) {:?}, run again on the replica {:?}",
            self.app_exit, self.cut, self.duplicates
        );
        let _ = writeln!(
            o,
            "sidecar: exit {:?}, 502s {} ({} of requests the app never started), error log: \
             {} refused connects, {} premature closes, reset before the app read them and run \
             on the replica {:?}",
            self.sidecar_exit,
            self.sidecar_502.len(),
            self.refused_502.len(),
            self.refused_lines,
            self.premature_lines,
            self.reset_unread
        );
        let _ = writeln!(
            o,
            "pod namespace: AttemptFails +{}, OutRsts +{}, EstabResets +{}",
            self.attempt_fails, self.out_rsts, self.estab_resets
        );
        let _ = writeln!(
            o,
            "stops: app {:?}, sidecar {:?} after the app's was issued",
            self.app_stop.returned - self.app_stop.issued,
            self.sidecar_stop
                .map(|s| s.returned.saturating_duration_since(self.app_stop.issued))
        );
        o
    }
}
