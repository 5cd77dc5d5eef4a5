//! Wires the pipeline together and owns the process lifecycle: preflight checks, capture,
//! HTTP, and the one place that waits for SIGTERM or SIGINT and shuts everything down.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use tokio::{
    net::TcpListener,
    signal::unix::{SignalKind, signal},
    sync::watch,
};

use crate::{
    capture::{self, Capture, plan::SignalStatus, reader::Reader},
    checkpoint::{CheckpointError, StateDir},
    cli::{self, Cli, HostTraffic},
    consumer::consume,
    correlate::{Correlator, stops, storms},
    enrich::{
        Enricher,
        host::{Procfs, netns_inode},
        kube::{self, KubeMetrics, Store},
        nat::Nat,
    },
    export::{
        events::{self, Emitter, EventMetrics},
        guard::{Guard, GuardMetrics, Hosts, KubeAuth},
        http,
    },
    model::{ContainerIdentity, SECOND, monotonic_now, stop::AgentGap},
    pipeline::Pipeline,
    queue,
    telemetry::{Attach, Telemetry},
};

/// Start-up failures: each renders as one sentence, and the binary exits 2.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("drainwatch needs root, or the capabilities CAP_BPF and CAP_PERFMON: run it with sudo")]
    NotPrivileged,
    #[error(
        "drainwatch lacks {0} (or CAP_SYS_ADMIN) to load and attach its eBPF programs: add it to the container's capabilities"
    )]
    MissingCapabilities(String),
    #[error("{flag} {path} does not exist or is not a directory")]
    MissingDir { flag: &'static str, path: PathBuf },
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot set up signal handling: {0}")]
    Signals(std::io::Error),
    #[error("cannot start the pipeline thread: {0}")]
    Thread(std::io::Error),
    #[error(transparent)]
    Capture(#[from] capture::CaptureError),
    #[error("cannot tell the host's network namespace from {path}: {detail}")]
    HostNetns { path: PathBuf, detail: String },
    #[error("no probe could attach on this kernel; see the lines above for why")]
    NothingAttached,
    #[error("--state-dir: {0}")]
    StateDir(#[from] CheckpointError),
    #[error(transparent)]
    Kube(#[from] kube::KubeError),
    #[error(
        "--auth kube needs the Kubernetes API: run in a pod (with NODE_NAME set) or with --kube on"
    )]
    AuthWithoutKube,
}

/// CAP_PERFMON (38) and CAP_BPF (39) from a `/proc/<pid>/status` text.
pub fn has_bpf_caps(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 38) != 0 && caps & (1 << 39) != 0)
}

/// Effective capabilities from a `/proc/<pid>/status` text.
fn effective_caps(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

const CAP_DAC_READ_SEARCH: u32 = 2;
const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// What a process with these effective capabilities (e.g. root in a container that dropped
/// some) cannot do: the capabilities missing to load and attach programs (none when it has
/// CAP_SYS_ADMIN, as on kernels before 5.8), and warnings for those it needs to read other
/// processes' /proc.
pub fn capability_problems(caps: u64) -> (Vec<&'static str>, Vec<&'static str>) {
    let has = |c: u32| caps & (1 << c) != 0;
    let mut missing = Vec::new();
    if !has(CAP_SYS_ADMIN) {
        for (c, name) in [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")] {
            if !has(c) {
                missing.push(name);
            }
        }
    }
    let mut warnings = Vec::new();
    if !has(CAP_SYS_PTRACE) {
        warnings.push(
            "no CAP_SYS_PTRACE: /proc/<pid>/ns and /proc/<pid>/fd of processes holding capabilities this agent lacks are unreadable, so their containers' listeners and connections go unseen",
        );
    }
    if !has(CAP_DAC_READ_SEARCH) {
        warnings.push(
            "no CAP_DAC_READ_SEARCH: /proc/<pid>/fd of processes of other users is unreadable, so the listeners and connections of containers running as non-root users go unseen",
        );
    }
    (missing, warnings)
}

/// The soft descriptor limit raised to the hard one: the HTTP server, the watch and procfs
/// reads must not run out first when a client floods the port.
fn raise_nofile() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid pointers to an rlimit; RLIMIT_NOFILE is a valid resource.
    let raised = unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && {
            let old = lim.rlim_cur;
            lim.rlim_cur = lim.rlim_max;
            old == lim.rlim_max || libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0
        }
    };
    if raised {
        tracing::debug!(nofile = lim.rlim_cur, "descriptor limit");
    } else {
        tracing::warn!("could not raise the descriptor limit");
    }
}

fn preflight(cli: &Cli) -> Result<(), StartupError> {
    raise_nofile();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    if !root && !has_bpf_caps(&status) {
        return Err(StartupError::NotPrivileged);
    }
    if let Some(caps) = effective_caps(&status) {
        let (missing, warnings) = capability_problems(caps);
        if !missing.is_empty() {
            return Err(StartupError::MissingCapabilities(missing.join(" and ")));
        }
        for w in warnings {
            tracing::warn!("{w}");
        }
    }
    for (flag, path) in [
        ("--procfs-root", &cli.procfs_root),
        ("--cgroupfs-root", &cli.cgroupfs_root),
    ] {
        if !path.is_dir() {
            return Err(StartupError::MissingDir {
                flag,
                path: path.clone(),
            });
        }
    }
    Ok(())
}

/// The host's network namespace inode: PID 1's in the host's /proc (the DaemonSet has hostPID
/// and CAP_SYS_PTRACE, but its own network namespace), else the agent's own (run on the host
/// itself, where PID 1 may be out of reach). At worst that is a pod's, which only narrows the
/// filter to the pod's own connections: nothing is lost.
fn host_netns(procfs_root: &Path) -> Result<u32, StartupError> {
    netns_of(procfs_root, "1").or_else(|_| netns_of(procfs_root, "self"))
}

fn netns_of(procfs_root: &Path, pid: &str) -> Result<u32, StartupError> {
    let path = procfs_root.join(pid).join("ns/net");
    let detail = match std::fs::read_link(&path) {
        Ok(link) => match netns_inode(&link.to_string_lossy()) {
            Some(inode) => {
                tracing::info!(netns = inode, from = %path.display(), "host network namespace");
                return Ok(inode);
            }
            None => format!("unexpected link {}", link.display()),
        },
        Err(e) => e.to_string(),
    };
    Err(StartupError::HostNetns { path, detail })
}

fn kernel_release(procfs_root: &Path) -> String {
    std::fs::read_to_string(procfs_root.join("sys/kernel/osrelease"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Hands the allocator's free pages back to the kernel, once start-up is over (the capture
/// is loaded before the pipeline thread starts, and this runs after its first scan).
/// A signal's attach result as telemetry records it.
fn attach(st: &SignalStatus) -> Attach<'_> {
    Attach {
        signal: st.signal,
        tried: st
            .tried
            .iter()
            .map(|(hook, r)| (hook.as_str(), r.is_ok()))
            .collect(),
        degraded: !st.degraded.is_empty(),
    }
}

/// The HTTP server's checks: the Host names it answers to, and with `--auth kube` the API
/// server that checks tokens (the pod watch's client).
fn guard(
    cli: &Cli,
    node: Option<&str>,
    client: Option<&::kube::Client>,
    metrics: GuardMetrics,
) -> Result<Guard, StartupError> {
    let host = http::hostname();
    let names = cli.allowed_hosts.iter().map(String::as_str);
    let hosts = Hosts::new(names.chain(node).chain([host.as_str()]));
    let auth = match (cli.auth, client) {
        (cli::Auth::None, _) => None,
        (cli::Auth::Kube, None) => return Err(StartupError::AuthWithoutKube),
        (cli::Auth::Kube, Some(c)) => {
            let ns = c.default_namespace().to_string();
            tracing::info!(namespace = %ns, metrics = cli.auth_metrics, "--auth kube: the page and the API need a token allowed get on pods/proxy here");
            Some(KubeAuth::new(c.clone(), ns, cli.auth_metrics))
        }
    };
    Ok(Guard {
        hosts,
        auth,
        metrics,
    })
}

/// The API's listener. Its accept queue is 4,096 deep (the kernel caps it at somaxconn), not
/// tokio's 1,024: under a connection flood a full queue drops SYNs, and a probe whose SYN is
/// dropped waits a second for its retransmission, half a kubelet probe's timeout.
fn listen(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(4096)
}

pub async fn run(cli: Cli) -> Result<(), StartupError> {
    preflight(&cli)?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(StartupError::Signals)?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(StartupError::Signals)?;
    let listener = listen(cli.listen).map_err(|source| StartupError::Listen {
        addr: cli.listen,
        source,
    })?;

    let mut telemetry = Telemetry::new(&kernel_release(&cli.procfs_root));
    // Pod metadata from the Kubernetes API: only this node's pods, only when asked or in a pod.
    let node = cli
        .node_name
        .clone()
        .or_else(|| std::env::var("NODE_NAME").ok());
    let in_pod = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    let page_host = node.clone();
    let kube_client = kube::client_for(cli.kube.into(), node.clone(), in_pod).await?;
    let kube_metrics = kube_client
        .as_ref()
        .map(|_| KubeMetrics::register(telemetry.registry_mut()));
    // Events on pods for stops and starts with loss: with the API, unless turned off.
    let events_to = kube_client
        .as_ref()
        .filter(|_| cli.kube_events_per_minute > 0)
        .map(|(c, n)| {
            (
                c.clone(),
                n.clone(),
                EventMetrics::register(telemetry.registry_mut()),
            )
        });
    let guard = guard(
        &cli,
        node.as_deref(),
        kube_client.as_ref().map(|(c, _)| c),
        GuardMetrics::register(telemetry.registry_mut(), cli.auth == cli::Auth::Kube),
    )?;
    let telemetry = Arc::new(telemetry);
    let state_dir = cli
        .state_dir
        .as_deref()
        .map(|d| StateDir::open(d, &cli.procfs_root, telemetry.checkpoint.clone()))
        .transpose()?;
    let previous = state_dir.as_ref().and_then(StateDir::load);
    let correlator = Arc::new(std::sync::Mutex::new(Correlator::new(
        stops::Config {
            retention: cli.retention_seconds * SECOND,
            settle: cli.stop_settle_seconds * SECOND,
            max_stops: cli.records_kept as usize,
            ..stops::Config::reading_syn_retries(&cli.procfs_root)
        },
        storms::Config {
            kept: cli.records_kept as usize,
            ..Default::default()
        },
    )));
    let mut state = http::State::new(
        telemetry.clone(),
        correlator.clone(),
        cli.deploy_window_seconds * SECOND,
        page_host,
    );
    state.guard = guard;
    let state = Arc::new(state);
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let kube_store = kube_client.zip(kube_metrics).map(|((client, node), km)| {
        let store = Arc::new(std::sync::Mutex::new(Store::new(
            cli.retention_seconds * SECOND,
        )));
        tokio::spawn(kube::watch_pods(
            client,
            node,
            store.clone(),
            km,
            monotonic_now,
            shutdown_rx.clone(),
        ));
        store
    });
    let server = tokio::spawn(http::serve(listener, state.clone(), shutdown_rx.clone()));
    tracing::info!(listen = %cli.listen, "serving /metrics, /api/v1/stops, /api/v1/deploys, /healthz, /readyz");

    let host_netns = match cli.host_traffic {
        HostTraffic::All => None,
        HostTraffic::Containers => Some(host_netns(&cli.procfs_root)?),
    };
    let mut capture = Capture::load(&capture::Options {
        ring_buffer_bytes: cli.ring_buffer_bytes,
        btf_path: cli.btf.clone(),
        only: None,
        host_netns,
        skip_hooks: cli.skip_hooks.clone(),
        attach_only: cli.attach_only,
        retry_window: std::time::Duration::from_millis(cli.retry_window_ms),
        packet_events_per_cpu: cli.packet_events_per_cpu,
        lean: true,
        hold: cli.hold,
        hold_entries: cli.hold_entries,
        upstream_entries: cli.upstream_entries,
        ebpf_log: !cli.test_no_ebpf_log,
    })?;
    if cli.attach_only {
        tracing::warn!("--attach-only: the programs return at once, nothing is captured");
    }
    if cli.hold && !capture.holds() {
        tracing::warn!(
            "--hold: this kernel cannot hand a held connection over to the agent \
             (BPF_MAP_LOOKUP_AND_DELETE_ELEM on a hash map, 5.14+): every arrival and accept \
             is sent as it comes"
        );
    }
    for st in &capture.statuses {
        if st.chosen().is_some() {
            // Why a preferred hook was passed over, for whoever wonders.
            for (hook, err) in st
                .tried
                .iter()
                .filter_map(|(h, r)| Some((h, r.as_ref().err()?)))
            {
                tracing::debug!(signal = st.signal, hook, error = err, "hook not used");
            }
            tracing::info!("{}", st.summary());
        } else {
            tracing::warn!("{}", st.summary());
        }
    }
    telemetry
        .agent
        .record_plan(&capture.statuses.iter().map(attach).collect::<Vec<_>>());
    if !capture.all_attached() {
        return Err(StartupError::NothingAttached);
    }

    let (tx, rx) = queue::bounded(cli.queue_events);
    let reader = Reader::new(
        capture.take_reader_maps()?,
        capture.names.clone(),
        telemetry.clone(),
        tx,
    )?
    .with_faults(capture.take_faults()?)
    .with_log(capture.take_log())
    .dropping(cli.test_drop_kinds());
    let watch = capture.take_watch()?;
    let storming = capture.take_storming()?;
    let hold = if capture.holds() {
        Some(capture.take_hold()?)
    } else {
        None
    };
    let reader = tokio::spawn(reader.run(shutdown_rx.clone()));
    // Watching again from here: a previous run's open stops go on, with the gap marked.
    if let Some(p) = previous
        && let Ok(mut c) = correlator.lock()
    {
        let gap = AgentGap {
            from: p.written_at.min(monotonic_now()),
            to: monotonic_now(),
        };
        let stops = p.checkpoint.tracker.stops.len();
        c.resume(p.checkpoint, gap);
        tracing::info!(
            stops,
            gap_seconds = gap.seconds(),
            "resumed from the checkpoint"
        );
    }
    let mut enricher = Enricher::new(Procfs {
        proc_root: cli.procfs_root.clone(),
        cgroup_root: cli.cgroupfs_root.clone(),
        host_root: cli.host_root.clone(),
    });
    if let Some(ns) = host_netns {
        enricher = enricher.with_host_netns(ns);
    }
    enricher = enricher.with_nat(Nat::open(&cli.procfs_root));
    if let Some(store) = kube_store {
        let store_for_events = store.clone();
        // Give the first list a moment, so containers found at start-up get their pods'
        // names at once rather than a second later.
        for _ in 0..40 {
            if store.lock().is_ok_and(|s| s.synced()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if let Some((client, node, metrics)) = events_to {
            let uid_of = Box::new(move |c: &ContainerIdentity| {
                Some(store_for_events.lock().ok()?.lookup(&c.id, None)?.pod_uid)
            });
            let emitter = Emitter::new(client, &node, cli.kube_events_per_minute, metrics, uid_of);
            tokio::spawn(events::run(
                emitter,
                state.clone(),
                Duration::from_secs(2),
                shutdown_rx.clone(),
            ));
        }
        enricher = enricher.with_kube(store);
    }
    let pipeline = Pipeline::new(
        enricher,
        correlator,
        telemetry.clone(),
        cli.retention_seconds * SECOND,
    );
    let consumer = std::thread::Builder::new()
        .name("pipeline".into())
        .spawn({
            let telemetry = telemetry.clone();
            move || consume(rx, pipeline, (watch, hold, storming), telemetry, state_dir)
        })
        .map_err(StartupError::Thread)?;
    state.ready.store(true, Ordering::Relaxed);
    tracing::info!("ready");

    tokio::select! {
        _ = sigterm.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = sigint.recv() => tracing::info!("SIGINT: shutting down"),
    }
    state.ready.store(false, Ordering::Relaxed);
    let _ = shutdown_tx.send(true);
    // The reader drains what the kernel already handed over; bounded so exit stays under 1 s.
    let _ = tokio::time::timeout(Duration::from_millis(500), reader).await;
    drop(capture); // detaches every program
    // The pipeline ends when the reader's side of the queue is gone.
    let deadline = Instant::now() + Duration::from_millis(200);
    while !consumer.is_finished() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = tokio::time::timeout(Duration::from_millis(100), server).await;
    tracing::info!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_bpf_capabilities_from_proc_status() {
        let root = "Name:\tx\nCapEff:\t000001ffffffffff\n";
        assert!(has_bpf_caps(root));
        let none = "CapEff:\t0000000000000000\n";
        assert!(!has_bpf_caps(none));
        let perfmon_only = format!("CapEff:\t{:016x}\n", 1u64 << 38);
        assert!(!has_bpf_caps(&perfmon_only));
        assert!(!has_bpf_caps("garbage"));
    }

    #[test]
    fn names_the_capabilities_a_restricted_root_lacks() {
        let bit = |c: u32| 1u64 << c;
        let manifest =
            bit(CAP_BPF) | bit(CAP_PERFMON) | bit(CAP_SYS_PTRACE) | bit(CAP_DAC_READ_SEARCH);
        assert_eq!(capability_problems(manifest), (vec![], vec![]));
        assert_eq!(capability_problems(0x1ff_ffff_ffff), (vec![], vec![]));
        // A kernel before 5.8: no CAP_BPF/CAP_PERFMON bits, CAP_SYS_ADMIN loads programs.
        assert_eq!(capability_problems(0x3f_ffff_ffff), (vec![], vec![]));
        assert_eq!(
            capability_problems(manifest & !bit(CAP_PERFMON)).0,
            vec!["CAP_PERFMON"]
        );
        assert_eq!(capability_problems(0).0, vec!["CAP_BPF", "CAP_PERFMON"]);
        let (missing, warnings) = capability_problems(manifest & !bit(CAP_SYS_PTRACE));
        assert!(missing.is_empty());
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].starts_with("no CAP_SYS_PTRACE"));
        let (_, warnings) = capability_problems(manifest & !bit(CAP_DAC_READ_SEARCH));
        assert!(warnings[0].starts_with("no CAP_DAC_READ_SEARCH"));
    }
}
