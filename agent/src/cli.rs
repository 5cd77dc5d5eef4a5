//! Command line. Every flag can also come from a `DRAINWATCH_*` environment variable, which is
//! how the DaemonSet configures it.

use std::{net::SocketAddr, path::PathBuf};

use clap::{Parser, ValueEnum};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
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
    /// Address for /metrics, /healthz and /readyz.
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

    /// Size of the kernel-to-agent ring buffer in bytes: a power of two, at least 4096. Events
    /// that do not fit are counted in drainwatch_events_lost_total{stage="ringbuf"}.
    #[arg(long, env = "DRAINWATCH_RING_BUFFER_BYTES", default_value_t = 1 << 20)]
    pub ring_buffer_bytes: u32,

    /// Capacity of the queue between the ring-buffer reader and the pipeline, in events.
    #[arg(long, env = "DRAINWATCH_QUEUE_EVENTS", default_value_t = 65536)]
    pub queue_events: usize,

    /// Kernel BTF to read struct offsets from.
    #[arg(
        long,
        env = "DRAINWATCH_BTF",
        default_value = "/sys/kernel/btf/vmlinux"
    )]
    pub btf: String,
}
