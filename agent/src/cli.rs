//! Command line. Every flag can also come from a `DRAINWATCH_*` environment variable, which is
//! how the DaemonSet configures it.

use std::{net::SocketAddr, path::PathBuf};

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Which of the host network namespace's connections are captured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HostTraffic {
    /// Only those that touch a container: to or from a container's address, or to a
    /// host-network container's listener. The rest (node services, loopback chatter) is
    /// dropped in the kernel, before it costs a ring-buffer record, and counted in
    /// drainwatch_events_filtered_total.
    Containers,
    /// Every connection, as for a container (costs more kernel time on busy hosts).
    All,
}

/// Whether pod metadata comes from the Kubernetes API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KubeMode {
    /// Use the in-cluster service-account configuration when running in a pod
    /// (KUBERNETES_SERVICE_HOST set); otherwise names come from the runtime's state.
    Auto,
    /// Use the in-cluster configuration or a kubeconfig; failing to load one is an error.
    On,
    /// Names come from the runtime's state only.
    Off,
}

impl From<KubeMode> for crate::enrich::kube::Mode {
    fn from(m: KubeMode) -> Self {
        match m {
            KubeMode::Auto => Self::Auto,
            KubeMode::On => Self::On,
            KubeMode::Off => Self::Off,
        }
    }
}

/// Who may read the page, the report API (and /metrics with --auth-metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Auth {
    /// Anyone who can connect (the default: outside Kubernetes the agent listens on loopback).
    None,
    /// A bearer token the Kubernetes API authenticates (TokenReview) and allows
    /// (SubjectAccessReview): get on pods/proxy in the agent's namespace for the page and the
    /// API, get on the non-resource URL /metrics for /metrics. Refused with 503 while the API
    /// cannot be asked.
    Kube,
}

/// drainwatch watches what every deploy does to TCP connections, from the kernel: resets sent
/// and received with the kernel's reason, refused connects, listen overflows, the signals and
/// exits of container stops. It serves Prometheus metrics on --listen.
///
/// It needs root (or CAP_BPF, CAP_PERFMON and read access to other processes' /proc), a kernel
/// with BTF (/sys/kernel/btf/vmlinux) and tracefs.
#[derive(Debug, Parser)]
#[command(name = "drainwatch", version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Address for /metrics, the report API (/api/v1/stops, /api/v1/deploys), /healthz and
    /// /readyz.
    #[arg(long, env = "DRAINWATCH_LISTEN", default_value = "127.0.0.1:9464")]
    pub listen: SocketAddr,

    /// Where the host's /proc is mounted (e.g. /host/proc inside a container).
    #[arg(long, env = "DRAINWATCH_PROCFS_ROOT", default_value = "/proc")]
    pub procfs_root: PathBuf,

    /// Where the host's cgroup filesystem is mounted (e.g. /host/sys/fs/cgroup).
    #[arg(
        long,
        env = "DRAINWATCH_CGROUPFS_ROOT",
        default_value = "/sys/fs/cgroup"
    )]
    pub cgroupfs_root: PathBuf,

    /// Log format: text for people, json for log pipelines.
    #[arg(long, env = "DRAINWATCH_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Size of the kernel-to-agent ring buffer for packet-path events in bytes: a power of
    /// two, at least 4096; lifecycle events (signals, exits, cgroup removals) have one of their
    /// own, a quarter of this size. Events that do not fit are counted in
    /// drainwatch_events_lost_total{stage="ringbuf"}.
    #[arg(long, env = "DRAINWATCH_RING_BUFFER_BYTES", default_value_t = 1 << 20)]
    pub ring_buffer_bytes: u32,

    /// Events each packet-path hook may emit per CPU per second; past it they are shed in the
    /// kernel and counted (drainwatch_events_shed_total, and in
    /// drainwatch_events_lost_total{stage="shed"}), so that a scan or a flood cannot swamp the
    /// agent. Lifecycle events (signals, exits, cgroup removals) have a ring buffer of their
    /// own and no limit. 0: no limit.
    #[arg(long, env = "DRAINWATCH_PACKET_EVENTS_PER_CPU", default_value_t = crate::capture::PACKET_EVENTS_PER_CPU)]
    pub packet_events_per_cpu: u32,

    /// How long after a proxy worker closes an upstream connection a backend cut, its next
    /// upstream connect or request counts as the cut request's retry (milliseconds). Any other
    /// socket I/O of that worker thread first (its answer to a client, say) ends the wait
    /// sooner; a worker descheduled between its close and its connect on a busy node needs
    /// the slack.
    #[arg(long, env = "DRAINWATCH_RETRY_WINDOW_MS", default_value_t = crate::capture::RETRY_WINDOW.as_millis() as u64, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub retry_window_ms: u64,

    /// Which connections of the host's own network namespace to capture (containers'
    /// namespaces are always captured whole).
    #[arg(long, env = "DRAINWATCH_HOST_TRAFFIC", value_enum, default_value_t = HostTraffic::Containers)]
    pub host_traffic: HostTraffic,

    /// Hooks not to try, by the label the start-up log and drainwatch_probe_attached show
    /// (e.g. tp_btf:kfree_skb): the next hook for that signal is used instead. For a hook that
    /// misbehaves on some kernel, or to measure what one costs.
    #[arg(
        long = "skip-hook",
        env = "DRAINWATCH_SKIP_HOOKS",
        value_delimiter = ','
    )]
    pub skip_hooks: Vec<String>,

    /// Attach every hook but have the programs return at once: no event is captured. Only
    /// for `cargo xtask bench`, whose floor it is (what the hooks cost the kernel before any
    /// of the programs' work).
    #[arg(long, env = "DRAINWATCH_ATTACH_ONLY", hide = true)]
    pub attach_only: bool,

    /// Hold a pod connection's arrival and accept in the kernel until its close carries them:
    /// one record per clean connection instead of three. Namespaces with a stop, a start or a
    /// possible reconnect storm are sent as they come, and nothing waits more than about 10 s.
    /// Off where the kernel cannot hand a held connection over (before 5.14). `false`: every
    /// arrival and accept is a record of its own.
    #[arg(
        long,
        env = "DRAINWATCH_HOLD",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_name = "BOOL"
    )]
    pub hold: bool,

    /// Connections the kernel may hold at once (`--hold`): about 144 bytes of kernel memory
    /// each. Past it, arrivals are sent as they come, counted as
    /// `drainwatch_ebpf_faults_total{fault="hold_full"}`.
    #[arg(long, env = "DRAINWATCH_HOLD_ENTRIES", default_value_t = crate::capture::HOLD_ENTRIES,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub hold_entries: u32,

    /// Proxies' upstream connections (and connections to containers from the host's network
    /// namespace) whose requests the kernel follows at once, to judge cuts and retries: about
    /// 128 bytes of kernel memory each. Past it a connection is not followed, counted as
    /// `drainwatch_ebpf_faults_total{fault="upstream_full"}`.
    #[arg(long, env = "DRAINWATCH_UPSTREAM_ENTRIES",
          default_value_t = drainwatch_common::sock_length::UPSTREAM_SOCKS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub upstream_entries: u32,

    /// Drop every event of these hooks (by stem, e.g. sched_process_exit) in the reader,
    /// counted as lost in the ring buffer. Only for tests of what a lost event does.
    #[arg(
        long = "test-drop-events",
        env = "DRAINWATCH_TEST_DROP_EVENTS",
        value_delimiter = ',',
        hide = true
    )]
    pub test_drop_events: Vec<String>,

    /// Testing only: start as if the eBPF programs' log could not be set up.
    #[arg(
        long = "test-no-ebpf-log",
        env = "DRAINWATCH_TEST_NO_EBPF_LOG",
        hide = true
    )]
    pub test_no_ebpf_log: bool,

    /// Capacity of the queue between the ring-buffer reader and the pipeline, in events
    /// (memory is taken for the events queued, not for the whole capacity up front).
    #[arg(long, env = "DRAINWATCH_QUEUE_EVENTS", default_value_t = 65536)]
    pub queue_events: usize,

    /// Where the host's root filesystem is mounted, for container runtimes' state
    /// (/run/containerd, /var/lib/containers, /var/lib/docker): /host in a DaemonSet pod.
    #[arg(long, env = "DRAINWATCH_HOST_ROOT", default_value = "/")]
    pub host_root: PathBuf,

    /// How long a stopped container's identity, addresses and listeners are kept so late
    /// events (refused and unreachable connection attempts) still resolve.
    #[arg(long, env = "DRAINWATCH_RETENTION_SECONDS", default_value_t = 300)]
    pub retention_seconds: u64,

    /// Stop, start and storm records kept (each) for the API and the page; past it the oldest
    /// settled one goes, counted in drainwatch_state_dropped_total{map}.
    #[arg(long, env = "DRAINWATCH_RECORDS_KEPT", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub records_kept: u32,

    /// A directory for the agent's checkpoint (open stops with their timelines, recent
    /// records, learned check schedules), written at most once a second: a restarted agent
    /// resumes the stops it had open, marking the gap it was down. Off when unset; the
    /// DaemonSet sets it to a hostPath.
    #[arg(long, env = "DRAINWATCH_STATE_DIR")]
    pub state_dir: Option<PathBuf>,

    /// Seconds after a stopped container's cgroup is removed before its stop record is final
    /// and counted in drainwatch_container_stops_total.
    #[arg(long, env = "DRAINWATCH_STOP_SETTLE_SECONDS", default_value_t = 10)]
    pub stop_settle_seconds: u64,

    /// Stops of one workload within this many seconds of each other form one deploy.
    #[arg(long, env = "DRAINWATCH_DEPLOY_WINDOW_SECONDS", default_value_t = 600)]
    pub deploy_window_seconds: u64,

    /// Pod metadata (pod, owning workload and its revision, grace period, preStop hook) from
    /// the Kubernetes API, watching only this node's pods. Falls back to the runtime's state
    /// when the API is unreachable.
    #[arg(long, env = "DRAINWATCH_KUBE", value_enum, default_value_t = KubeMode::Auto)]
    pub kube: KubeMode,

    /// With the Kubernetes API: at most this many Events a minute (a Warning on the pod,
    /// ConnectionLossOnStop / ConnectionLossOnStart, for each settled stop or start that lost
    /// connections); past it they are dropped and counted (drainwatch_kube_events_total). 0:
    /// no Events.
    #[arg(long, env = "DRAINWATCH_KUBE_EVENTS_PER_MINUTE", default_value_t = 30)]
    pub kube_events_per_minute: u32,

    /// The node this agent runs on, whose pods it watches (spec.nodeName). Also read from
    /// NODE_NAME, as a DaemonSet sets it from the downward API.
    #[arg(long, env = "DRAINWATCH_NODE_NAME")]
    pub node_name: Option<String>,

    /// Who may read the page and the report API; /healthz, /readyz and (without
    /// --auth-metrics) /metrics stay open.
    #[arg(long, env = "DRAINWATCH_AUTH", value_enum, default_value_t = Auth::None)]
    pub auth: Auth,

    /// With --auth kube, /metrics needs a token too (get on the non-resource URL /metrics).
    #[arg(long, env = "DRAINWATCH_AUTH_METRICS")]
    pub auth_metrics: bool,

    /// Host names (without port) requests may carry in their Host header, besides any IP
    /// address, localhost, the node name and this machine's host name; others are refused
    /// with 421 (DNS rebinding). E.g. the Service's DNS name.
    #[arg(
        long = "allowed-host",
        env = "DRAINWATCH_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    pub allowed_hosts: Vec<String>,

    /// Kernel BTF to read struct offsets from.
    #[arg(
        long,
        env = "DRAINWATCH_BTF",
        default_value = "/sys/kernel/btf/vmlinux"
    )]
    pub btf: String,
}

impl Cli {
    /// The hooks `--test-drop-events` names, as event kinds.
    pub fn test_drop_kinds(&self) -> Vec<drainwatch_common::EventKind> {
        drainwatch_common::EventKind::ALL
            .into_iter()
            .filter(|k| self.test_drop_events.iter().any(|n| n == k.name()))
            .collect()
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print a running agent's recent deploys and container stops: each stop's timeline, the
    /// connections it cost and a one-line verdict.
    Report {
        /// The agent to ask (its --listen address).
        #[arg(long, env = "DRAINWATCH_AGENT", default_value = "127.0.0.1:9464")]
        agent: String,
        /// Print the raw JSON of /api/v1/stops instead of the table (with --cluster: the
        /// merged deploys, stops, starts, storms and the agents that did not answer).
        #[arg(long)]
        json: bool,
        /// Ask every agent of the DaemonSet through the Kubernetes API server's pod proxy
        /// (kubeconfig or in-cluster credentials; needs get on pods and pods/proxy) and merge
        /// their records: one deploy of a workload, whatever nodes its pods ran on. Exits 1
        /// when an agent did not answer.
        #[arg(long)]
        cluster: bool,
        #[command(flatten)]
        cluster_opts: ClusterOpts,
        #[command(flatten)]
        gate: GateOpts,
        /// Bearer token for an agent run with --auth kube (e.g. from `kubectl create token`).
        /// Prefer the variable: a flag shows in process listings.
        #[arg(long, env = "DRAINWATCH_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
}

/// Where `report --cluster` finds the agents (defaults: deploy/kubernetes/drainwatch.yaml).
#[derive(Debug, Clone, clap::Args)]
pub struct ClusterOpts {
    /// The DaemonSet's namespace.
    #[arg(
        long,
        env = "DRAINWATCH_CLUSTER_NAMESPACE",
        default_value = "drainwatch"
    )]
    pub namespace: String,
    /// The label selector of the DaemonSet's pods.
    #[arg(
        long,
        env = "DRAINWATCH_CLUSTER_SELECTOR",
        default_value = "app.kubernetes.io/name=drainwatch"
    )]
    pub selector: String,
    /// The agents' --listen port.
    #[arg(long, env = "DRAINWATCH_CLUSTER_PORT", default_value_t = 9464)]
    pub port: u16,
    /// Seconds to wait for each agent before naming it as not answering.
    #[arg(long, env = "DRAINWATCH_CLUSTER_TIMEOUT_SECONDS", default_value_t = 10)]
    pub timeout_seconds: u64,
    /// A file whose token is sent to every agent (x-drainwatch-authorization: Bearer …), for
    /// agents that check tokens: the API server does not pass the user's own on.
    #[arg(long, env = "DRAINWATCH_AGENT_TOKEN_FILE")]
    pub agent_token_file: Option<PathBuf>,
}

/// `report --gate`: a rollout gate for pipelines without Argo Rollouts or Flagger.
#[derive(Debug, Clone, clap::Args)]
pub struct GateOpts {
    /// Print one line, PASS or FAIL, for this workload (`<namespace>/<workload>`; outside
    /// Kubernetes the bare workload) and exit 1 when its stops within --since cut requests,
    /// streams or sessions, were refused or unreachable, made retry duplicates or ran into
    /// SIGKILL (beyond --allow), or (with --cluster) an agent did not answer; 0 when they did
    /// not, 2 when the agents could not be asked.
    #[arg(long, value_name = "NAMESPACE/WORKLOAD")]
    pub gate: Option<String>,
    /// How far back the gate counts stops (e.g. 15m): at least as long as the rollout.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration, requires = "gate")]
    pub since: std::time::Duration,
    /// What a gate allows (`<gate>=<count>`, repeatable; 0 otherwise), a gate of
    /// requests-cut, streams-cut, sessions-cut, refused, unreachable, retry-duplicates, sigkills.
    #[arg(long, value_name = "GATE=COUNT", requires = "gate")]
    pub allow: Vec<String>,
}
