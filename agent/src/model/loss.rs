//! What a stop can cost: the loss kinds as one closed type, and the counts a stop (or a
//! deploy) keeps of each.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One kind of loss counted against a stop. Serialized as the [`Loss`] field it counts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossKind {
    /// An inbound connection the container closed or reset with a request pending.
    InflightCut,
    /// An inbound connection it closed with nothing pending and nothing moving (or a stream
    /// at the end of its own rotation).
    IdleClosed,
    /// A live stream it closed (or its exit closed): data moving within a second of the
    /// close, no request pending, not the server's own rotation (`model::activity`).
    StreamsCut,
    /// A RST its stack sent (counted by kernel reason).
    ResetsSent,
    /// A SYN to a listening address it had closed, answered with RST.
    Refused,
    /// A connection attempt to an address it held, after it was gone.
    Unreachable,
    /// A connection accepted after the stop signal.
    AcceptedAfterSigterm,
    /// A cut request the backend had read, re-sent by a proxy to another backend.
    RetryDuplicates,
    /// A cut request the backend never read (still in its receive queue), re-sent by a proxy
    /// to another backend: it ran once.
    RetriedUnexecuted,
    /// A cut request no proxy re-sent.
    UpstreamAborts,
    /// A health check the container cut (counted in [`ProbeLoss::cut`]).
    ProbeCut,
    /// A health check refused at a listening address it had closed.
    ProbeRefused,
    /// A health check to an address it held, after it was gone.
    ProbeUnreachable,
}

impl LossKind {
    pub const ALL: [LossKind; 13] = [
        LossKind::InflightCut,
        LossKind::IdleClosed,
        LossKind::StreamsCut,
        LossKind::ResetsSent,
        LossKind::Refused,
        LossKind::Unreachable,
        LossKind::AcceptedAfterSigterm,
        LossKind::RetryDuplicates,
        LossKind::RetriedUnexecuted,
        LossKind::UpstreamAborts,
        LossKind::ProbeCut,
        LossKind::ProbeRefused,
        LossKind::ProbeUnreachable,
    ];

    /// The [`Loss`] field name, as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            LossKind::InflightCut => "inflight_cut",
            LossKind::IdleClosed => "idle_closed",
            LossKind::StreamsCut => "streams_cut",
            LossKind::ResetsSent => "resets_sent",
            LossKind::Refused => "refused",
            LossKind::Unreachable => "unreachable",
            LossKind::AcceptedAfterSigterm => "accepted_after_sigterm",
            LossKind::RetryDuplicates => "retry_duplicates",
            LossKind::RetriedUnexecuted => "retried_unexecuted",
            LossKind::UpstreamAborts => "upstream_aborts",
            LossKind::ProbeCut => "probe_cut",
            LossKind::ProbeRefused => "probe_refused",
            LossKind::ProbeUnreachable => "probe_unreachable",
        }
    }

    /// A failed health check, not a request.
    pub fn is_probe(self) -> bool {
        matches!(
            self,
            LossKind::ProbeCut | LossKind::ProbeRefused | LossKind::ProbeUnreachable
        )
    }

    /// Requests routed to the container after the stop signal (how long routing lagged; a
    /// balancer still checking is not routing).
    pub fn is_routed(self) -> bool {
        matches!(
            self,
            LossKind::AcceptedAfterSigterm | LossKind::Refused | LossKind::Unreachable
        )
    }

    /// Kinds drawn on a stop's timeline: idle closes are harmless and resets are counted by
    /// reason only.
    pub fn on_timeline(self) -> bool {
        !matches!(self, LossKind::IdleClosed | LossKind::ResetsSent)
    }
}

/// Which way a RST went, from the container's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResetDirection {
    Sent,
    Received,
}

impl ResetDirection {
    pub fn as_str(self) -> &'static str {
        match self {
            ResetDirection::Sent => "sent",
            ResetDirection::Received => "received",
        }
    }
}

/// Fields in alphabetical order: the order the API has always served them in (it is also the
/// API's type, `export::view::LossView`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Loss {
    pub accepted_after_sigterm: u64,
    pub idle_closed: u64,
    pub inflight_cut: u64,
    /// Failed health checks: apart from the request counts around them.
    pub probes: ProbeLoss,
    pub refused: u64,
    /// RSTs sent, by kernel reason.
    pub resets_sent: BTreeMap<String, u64>,
    /// Cut requests the container never read, re-sent by a proxy to another backend (done
    /// once, invisible to the client).
    pub retried_unexecuted: u64,
    /// Cut requests the container had read, re-sent by a proxy to another backend (done
    /// twice, or maybe twice, invisible to the client).
    pub retry_duplicates: u64,
    /// Live streams (server-sent events, websockets, gRPC streams) it cut: clients that lost
    /// their stream and reconnect.
    pub streams_cut: u64,
    pub unreachable: u64,
    /// Cut requests no proxy re-sent (the client saw an error).
    pub upstream_aborts: u64,
}

/// Failed health checks (the kubelet's probes, a balancer's active checks): what they found is
/// evidence of how routing behaved, not a user's loss. Every failed attempt is counted either
/// here or in the request counts of [`Loss`], never in both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProbeLoss {
    /// How many of these were told apart by a balancer's learned check schedule (the others
    /// came from the kubelet).
    pub by_schedule: u64,
    /// Checks the container closed or reset with the check pending.
    pub cut: u64,
    pub refused: u64,
    pub unreachable: u64,
}

impl ProbeLoss {
    fn add(&mut self, other: &ProbeLoss) {
        self.cut += other.cut;
        self.refused += other.refused;
        self.unreachable += other.unreachable;
        self.by_schedule += other.by_schedule;
    }
}

impl Loss {
    pub fn add(&mut self, other: &Loss) {
        self.probes.add(&other.probes);
        self.inflight_cut += other.inflight_cut;
        self.idle_closed += other.idle_closed;
        self.streams_cut += other.streams_cut;
        for (r, n) in &other.resets_sent {
            *self.resets_sent.entry(r.clone()).or_default() += n;
        }
        self.refused += other.refused;
        self.unreachable += other.unreachable;
        self.accepted_after_sigterm += other.accepted_after_sigterm;
        self.retry_duplicates += other.retry_duplicates;
        self.retried_unexecuted += other.retried_unexecuted;
        self.upstream_aborts += other.upstream_aborts;
    }

    /// Counts one loss of `kind`; `reason` is a reset's kernel reason.
    pub fn count(&mut self, kind: LossKind, reason: Option<&str>) {
        match kind {
            LossKind::InflightCut => self.inflight_cut += 1,
            LossKind::IdleClosed => self.idle_closed += 1,
            LossKind::StreamsCut => self.streams_cut += 1,
            LossKind::Refused => self.refused += 1,
            LossKind::Unreachable => self.unreachable += 1,
            LossKind::AcceptedAfterSigterm => self.accepted_after_sigterm += 1,
            LossKind::RetryDuplicates => self.retry_duplicates += 1,
            LossKind::RetriedUnexecuted => self.retried_unexecuted += 1,
            LossKind::UpstreamAborts => self.upstream_aborts += 1,
            LossKind::ProbeCut => self.probes.cut += 1,
            LossKind::ProbeRefused => self.probes.refused += 1,
            LossKind::ProbeUnreachable => self.probes.unreachable += 1,
            LossKind::ResetsSent => {
                *self
                    .resets_sent
                    .entry(reason.unwrap_or_default().to_string())
                    .or_default() += 1;
            }
        }
    }

    /// The count of one kind (resets summed over reasons).
    pub fn get(&self, kind: LossKind) -> u64 {
        match kind {
            LossKind::InflightCut => self.inflight_cut,
            LossKind::IdleClosed => self.idle_closed,
            LossKind::StreamsCut => self.streams_cut,
            LossKind::Refused => self.refused,
            LossKind::Unreachable => self.unreachable,
            LossKind::AcceptedAfterSigterm => self.accepted_after_sigterm,
            LossKind::RetryDuplicates => self.retry_duplicates,
            LossKind::RetriedUnexecuted => self.retried_unexecuted,
            LossKind::UpstreamAborts => self.upstream_aborts,
            LossKind::ProbeCut => self.probes.cut,
            LossKind::ProbeRefused => self.probes.refused,
            LossKind::ProbeUnreachable => self.probes.unreachable,
            LossKind::ResetsSent => self.resets_sent.values().sum(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_counts_in_its_own_field_and_serializes_as_its_name() {
        for kind in LossKind::ALL {
            let mut l = Loss::default();
            l.count(kind, Some("NOT_SPECIFIED"));
            assert_eq!(l.get(kind), 1, "{kind:?}");
            let others: u64 = LossKind::ALL
                .iter()
                .filter(|k| **k != kind)
                .map(|k| l.get(*k))
                .sum();
            assert_eq!(others, 0, "{kind:?}");
            let json = serde_json::to_value(&l).unwrap();
            let field = match kind.as_str().strip_prefix("probe_") {
                Some(f) => &json["probes"][f],
                None if kind == LossKind::ResetsSent => &json[kind.as_str()]["NOT_SPECIFIED"],
                None => &json[kind.as_str()],
            };
            assert_eq!(field, 1, "{kind:?}");
            assert_eq!(
                serde_json::to_value(kind).unwrap(),
                serde_json::Value::String(kind.as_str().into())
            );
        }
    }
}
