//! Label sets of every family, and the closed label values as types: stop outcomes, reset
//! directions, loss stages, hook kinds, procfs files and watch maps encode as the same strings
//! the exposition has always had (alert rules and dashboards select on them). Open values
//! (container names, kernel reasons, proxies) stay strings.

use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};

use drainwatch_common::{EventKind, faults::FaultKind};

use crate::model::{ContainerIdentity, ResetDirection, stop::Outcome};

/// prometheus-client's derive has no rename: closed values encode as their `as_str()`.
macro_rules! label_value_as_str {
    ($($t:ty),* $(,)?) => {$(
        impl EncodeLabelValue for $t {
            fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
                EncodeLabelValue::encode(&self.as_str(), encoder)
            }
        }
    )*};
}

label_value_as_str!(
    super::checkpoint::Discard,
    Outcome,
    ProbeResult,
    ResetDirection,
    LossStage,
    Hook,
    Fault,
    ProcfsFile,
    WatchMap,
    crate::model::state::StateMap
);

/// Where an event was lost before processing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LossStage {
    /// Past its CPU's budget in the kernel (per-CPU counters in `SHED`).
    Shed,
    /// The kernel could not reserve ring-buffer space (per-CPU counters in `LOST`).
    Ringbuf,
    /// The pipeline fell behind and the queue was full.
    Queue,
    /// A malformed record.
    Decode,
}

impl LossStage {
    pub const ALL: [LossStage; 4] = [
        LossStage::Shed,
        LossStage::Ringbuf,
        LossStage::Queue,
        LossStage::Decode,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            LossStage::Shed => "shed",
            LossStage::Ringbuf => "ringbuf",
            LossStage::Queue => "queue",
            LossStage::Decode => "decode",
        }
    }

    /// Position in [`LossStage::ALL`], for per-stage arrays.
    pub const fn index(self) -> usize {
        match self {
            LossStage::Shed => 0,
            LossStage::Ringbuf => 1,
            LossStage::Queue => 2,
            LossStage::Decode => 3,
        }
    }
}

/// A kernel hook kind, named by its stem (`EventKind::name`, from common's one list of hooks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Hook(pub EventKind);

impl Hook {
    pub fn as_str(self) -> &'static str {
        self.0.name()
    }
}

/// What an eBPF program could not do (`drainwatch_common::faults`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fault(pub FaultKind);

impl Fault {
    pub fn as_str(self) -> &'static str {
        self.0.as_str()
    }
}

/// A procfs file the agent parses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProcfsFile {
    /// A network namespace's `net/netstat` (TcpExt listen counters).
    Netstat,
}

impl ProcfsFile {
    pub const ALL: [ProcfsFile; 1] = [ProcfsFile::Netstat];

    pub fn as_str(self) -> &'static str {
        match self {
            ProcfsFile::Netstat => "netstat",
        }
    }

    pub const fn index(self) -> usize {
        match self {
            ProcfsFile::Netstat => 0,
        }
    }
}

/// A kernel map the host-namespace scope filter reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WatchMap {
    /// `WATCH_ADDRS`: container addresses.
    Addresses,
    /// `WATCH_PORTS`: ports host-network containers listen or listened on.
    Ports,
    /// `UPSTREAM_SOCKS`: proxies' upstream connections whose requests are followed.
    UpstreamSockets,
    /// `STORM_NETNS`: namespaces whose accepted connections' answers are timed (a storm).
    StormNamespaces,
}

impl WatchMap {
    pub const ALL: [WatchMap; 4] = [
        WatchMap::Addresses,
        WatchMap::Ports,
        WatchMap::UpstreamSockets,
        WatchMap::StormNamespaces,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WatchMap::Addresses => "addresses",
            WatchMap::Ports => "ports",
            WatchMap::UpstreamSockets => "upstream_sockets",
            WatchMap::StormNamespaces => "storm_namespaces",
        }
    }

    pub const fn index(self) -> usize {
        match self {
            WatchMap::Addresses => 0,
            WatchMap::Ports => 1,
            WatchMap::UpstreamSockets => 2,
            WatchMap::StormNamespaces => 3,
        }
    }
}

/// The labels of every per-container series, and the key of the cardinality cap. Shared
/// strings: each of a container's 20-odd series (and the cap's closure that removes it) holds
/// a copy of its label set, so clones are reference counts, not three allocations each.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ContainerLabels {
    pub namespace: Arc<str>,
    pub workload: Arc<str>,
    pub container: Arc<str>,
}

impl From<&ContainerIdentity> for ContainerLabels {
    fn from(c: &ContainerIdentity) -> Self {
        Self {
            namespace: c.namespace.as_str().into(),
            workload: c.workload.as_str().into(),
            container: c.name.as_str().into(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct OutcomeLabels {
    #[prometheus(flatten)]
    pub container: ContainerLabels,
    pub outcome: Outcome,
}

/// What a failed health check met.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeResult {
    Cut,
    Refused,
    Unreachable,
}

impl ProbeResult {
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeResult::Cut => "cut",
            ProbeResult::Refused => "refused",
            ProbeResult::Unreachable => "unreachable",
        }
    }
}

/// A failed health check against a stopping container.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ProbeFailureLabels {
    #[prometheus(flatten)]
    pub container: ContainerLabels,
    pub result: ProbeResult,
}

/// A reset's kernel reason (`sk_rst_reason`, read from tracefs: open on purpose).
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ReasonLabels {
    #[prometheus(flatten)]
    pub container: ContainerLabels,
    pub reason: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ResetLabels {
    #[prometheus(flatten)]
    pub container: ContainerLabels,
    pub direction: ResetDirection,
    pub reason: String,
}

/// The proxy's process name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ProxyLabels {
    #[prometheus(flatten)]
    pub container: ContainerLabels,
    pub proxy: String,
}

/// A container's listener.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct PortLabels {
    #[prometheus(flatten)]
    pub container: ContainerLabels,
    pub port: u16,
}

/// The family a capped series would have been created in.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct MetricLabels {
    pub metric: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: Hook,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct FaultLabels {
    pub kind: Hook,
    pub fault: Fault,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct StageLabels {
    pub stage: LossStage,
}

/// A plan signal and one of its hooks (`capture::plan`; set once at start-up).
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ProbeLabels {
    pub signal: String,
    pub hook: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct SignalLabels {
    pub signal: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct MapLabels {
    pub map: WatchMap,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct FileLabels {
    pub file: ProcfsFile,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: String,
    pub kernel: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_are_positions_in_all() {
        for (i, s) in LossStage::ALL.into_iter().enumerate() {
            assert_eq!(s.index(), i);
        }
        for (i, f) in ProcfsFile::ALL.into_iter().enumerate() {
            assert_eq!(f.index(), i);
        }
        for (i, m) in WatchMap::ALL.into_iter().enumerate() {
            assert_eq!(m.index(), i);
        }
        for (i, k) in EventKind::ALL.into_iter().enumerate() {
            assert_eq!(k.index(), i);
        }
    }
}

/// Each label set of a per-container family names its container (see `cap::Cap::series`).
macro_rules! of_container {
    ($($t:ty),*) => {$(
        impl super::cap::OfContainer for $t {
            fn container(&self) -> &ContainerLabels {
                &self.container
            }
        }
    )*};
}

of_container!(
    OutcomeLabels,
    ProbeFailureLabels,
    ReasonLabels,
    ResetLabels,
    ProxyLabels,
    PortLabels
);
