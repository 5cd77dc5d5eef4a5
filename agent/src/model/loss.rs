//! What a stop can cost: the loss kinds as one closed type, declared once each (field name,
//! words, glyph, metric), and the counts a stop (or a deploy) keeps of each. What renders or
//! counts loss iterates over [`LossKind::ALL`] and reads [`LossKind::info`]: a new kind is one
//! entry in `loss_kinds!` plus the rule that finds it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize, Serializer, ser::SerializeMap};

/// The timeline glyph a kind is drawn with (the page owns the shapes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    Cut,
    /// A live stream or session cut.
    Stream,
    Retried,
    Abort,
    Refused,
    Unreachable,
    /// A failed health check: the balancer or kubelet still checking, not a user.
    Probe,
    /// A connection accepted after the stop signal.
    Late,
}

/// Everything shown or counted about one kind.
#[derive(Debug, Clone, Copy)]
pub struct KindInfo {
    /// What the page's chip and the report call it: "live streams cut".
    pub words: &'static str,
    /// The timeline's short count label.
    pub short: &'static str,
    /// The chip's CSS class on the page; None: no chip (shown apart).
    pub chip: Option<&'static str>,
    /// Drawn on a stop's timeline with this glyph; None: not drawn (harmless, or counted by
    /// reason only).
    pub mark: Option<Mark>,
    /// A user's connection was lost: an Event, and a deploy that lost connections.
    pub lost: bool,
    /// Routed to the container after the stop signal (how long routing lagged; a balancer
    /// still checking is not routing).
    pub routed: bool,
    /// A failed health check, not a request.
    pub probe: bool,
    /// The help of its per-container counter `drainwatch_stop_<field>`; None: counted by a
    /// family of its own (by reason, by probe result, by proxy).
    pub help: Option<&'static str>,
}

const INFO: KindInfo = KindInfo {
    words: "",
    short: "",
    chip: None,
    mark: None,
    lost: false,
    routed: false,
    probe: false,
    help: None,
};

/// Declares the kinds, in display order: plain counts (a `u64` field of [`Loss`] each), then
/// the kinds kept in a structure of their own (resets by reason, failed health checks).
macro_rules! loss_kinds {
    (
        counts { $( $(#[$doc:meta])* $kind:ident $field:ident $info:expr; )* }
        apart { $( $(#[$adoc:meta])* $akind:ident $afield:literal $ainfo:expr; )* }
    ) => {
        /// One kind of loss counted against a stop. Serialized as the [`Loss`] field it counts
        /// in.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum LossKind {
            $( $(#[$doc])* $kind, )*
            $( $(#[$adoc])* $akind, )*
        }

        impl LossKind {
            pub const ALL: &[LossKind] = &[ $( LossKind::$kind, )* $( LossKind::$akind, )* ];

            /// The [`Loss`] field name, as the API spells it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( LossKind::$kind => stringify!($field), )*
                    $( LossKind::$akind => $afield, )*
                }
            }

            /// Its per-container counter's name, when it has one (see [`KindInfo::help`]).
            pub fn metric(self) -> &'static str {
                match self {
                    $( LossKind::$kind => concat!("drainwatch_stop_", stringify!($field)), )*
                    $( LossKind::$akind => concat!("drainwatch_stop_", $afield), )*
                }
            }

            pub fn info(self) -> KindInfo {
                match self {
                    $( LossKind::$kind => $info, )*
                    $( LossKind::$akind => $ainfo, )*
                }
            }
        }

        /// The counts of a stop, a start's stop or a deploy. Served with its fields in
        /// alphabetical order, as the API always has (see `Serialize` below).
        #[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
        #[serde(default)]
        pub struct Loss {
            $( $(#[$doc])* pub $field: u64, )*
            /// Failed health checks: apart from the request counts around them.
            pub probes: ProbeLoss,
            /// RSTs sent, by kernel reason.
            pub resets_sent: BTreeMap<String, u64>,
        }

        impl Loss {
            /// The plain count of `kind`; None for the kinds kept apart.
            fn slot(&mut self, kind: LossKind) -> Option<&mut u64> {
                match kind {
                    $( LossKind::$kind => Some(&mut self.$field), )*
                    _ => None,
                }
            }

            fn count_of(&self, kind: LossKind) -> Option<u64> {
                match kind {
                    $( LossKind::$kind => Some(self.$field), )*
                    _ => None,
                }
            }

            fn counts(&self) -> impl Iterator<Item = (&'static str, u64)> {
                [ $( (stringify!($field), self.$field), )* ].into_iter()
            }
        }
    };
}

loss_kinds! {
    counts {
        /// An inbound connection the container closed or reset with a request pending.
        InflightCut inflight_cut KindInfo {
            words: "in-flight cut", short: "cut", chip: Some("cut"), mark: Some(Mark::Cut),
            lost: true,
            help: Some("Inbound connections a stopping container closed or reset with a request pending"),
            ..INFO
        };
        /// A live stream its exit closed, or it reset: data moving within a second of the
        /// close, no request pending; never one its server ended itself while it ran
        /// (`correlate::stops::streams`).
        StreamsCut streams_cut KindInfo {
            words: "live streams cut", short: "streams cut", chip: Some("streams"),
            mark: Some(Mark::Stream), lost: true,
            help: Some("Live streams (data moving within 1 s, no request pending) a stopping container's exit closed or it reset: a stream its server ended itself while it ran is not one"),
            ..INFO
        };
        /// A connection its exit closed (nothing pending) whose client connected to the
        /// workload again within the settle window: a socket client that lost its session
        /// and came back at once (`correlate::stops::sessions`).
        SessionsCut sessions_cut KindInfo {
            words: "sessions cut (clients came back)", short: "sessions cut",
            chip: Some("streams"), mark: Some(Mark::Stream), lost: true,
            help: Some("Connections a stopping container's exit closed with nothing pending whose client connected to the workload again within 10 s: sessions lost"),
            ..INFO
        };
        /// A request that reached a connection the container had already closed in its stop
        /// (a keep-alive client reusing it in the race with the close): its data answered with
        /// RST by the closed socket (time-wait or orphaned), never seen by the server. Only a
        /// RST answering data counts: a late FIN or ACK at the same socket is no request. The
        /// close itself stays `idle_closed`.
        SentAfterClose sent_after_close KindInfo {
            words: "requests sent to closed connections", short: "to closed", chip: Some("cut"),
            mark: Some(Mark::Cut), lost: true,
            help: Some("Requests that reached a connection a stopping container had already closed (a keep-alive client reusing it), their data answered with RST by the closed socket: the server never saw them"),
            ..INFO
        };
        /// A cut request the backend had read, re-sent by a proxy to another backend (done
        /// twice, or maybe twice, invisible to the client).
        RetryDuplicates retry_duplicates KindInfo {
            words: "retried (done twice)", short: "retried", chip: Some("retried"),
            mark: Some(Mark::Retried), ..INFO
        };
        /// A cut request the backend never read (still in its receive queue), re-sent by a
        /// proxy to another backend: it ran once, invisible to the client.
        RetriedUnexecuted retried_unexecuted KindInfo {
            words: "retried (never ran on it)", short: "retried unrun", chip: Some("retried"),
            mark: Some(Mark::Retried), ..INFO
        };
        /// A cut request no proxy re-sent (the client saw an error).
        UpstreamAborts upstream_aborts KindInfo {
            words: "seen as 502", short: "as 502", chip: Some("abort"), mark: Some(Mark::Abort),
            ..INFO
        };
        /// A SYN to a listening address it had closed, answered with RST.
        Refused refused KindInfo {
            words: "refused", short: "refused", chip: Some("refused"), mark: Some(Mark::Refused),
            lost: true, routed: true,
            help: Some("Connection attempts refused by a stopping container's closed listener"),
            ..INFO
        };
        /// A connection attempt to an address it held, after it was gone.
        Unreachable unreachable KindInfo {
            words: "unreachable", short: "unreach.", chip: Some("unreachable"),
            mark: Some(Mark::Unreachable), lost: true, routed: true,
            help: Some("Connection attempts from this node to a stopped container's address after it was gone"),
            ..INFO
        };
        /// A connect to a Service's virtual IP that the node's kube-proxy rejected (ICMP)
        /// while the Service had no endpoints, on the pod that had served it.
        NoEndpoints no_endpoints KindInfo {
            words: "rejected (Service had no endpoints)", short: "no endpoints",
            chip: Some("refused"), mark: Some(Mark::Refused), lost: true,
            help: Some("Connects to a Service's virtual IP that kube-proxy rejected while the Service had no ready endpoints (its pods stopping or not ready yet), counted on the stopping pod that had served it"),
            ..INFO
        };
        /// A connection accepted after the stop signal.
        AcceptedAfterSigterm accepted_after_sigterm KindInfo {
            words: "accepted after SIGTERM", short: "late", chip: Some("late"),
            mark: Some(Mark::Late), routed: true,
            help: Some("Connections a container accepted after its stop signal"),
            ..INFO
        };
        /// An inbound connection it closed with nothing pending and nothing moving (or a live
        /// stream its server ended itself while it ran): harmless.
        IdleClosed idle_closed KindInfo {
            words: "idle closed", short: "idle closed", chip: Some("idle"),
            help: Some("Inbound connections a stopping container closed with nothing pending and nothing moving, or live streams its server ended itself while it ran: harmless"),
            ..INFO
        };
    }
    apart {
        /// A RST its stack sent (counted by kernel reason).
        ResetsSent "resets_sent" KindInfo { words: "resets sent", short: "resets sent", ..INFO };
        /// A health check the container cut (counted in [`ProbeLoss::cut`]).
        ProbeCut "probe_cut" KindInfo {
            words: "health checks cut", short: "checks cut", mark: Some(Mark::Probe),
            probe: true, ..INFO
        };
        /// A health check refused at a listening address it had closed.
        ProbeRefused "probe_refused" KindInfo {
            words: "health checks refused", short: "checks refused", mark: Some(Mark::Probe),
            probe: true, ..INFO
        };
        /// A health check to an address it held, after it was gone.
        ProbeUnreachable "probe_unreachable" KindInfo {
            words: "health checks unreachable", short: "checks unreach.",
            mark: Some(Mark::Probe), probe: true, ..INFO
        };
    }
}

impl LossKind {
    /// A failed health check, not a request.
    pub fn is_probe(self) -> bool {
        self.info().probe
    }

    /// Requests routed to the container after the stop signal (how long routing lagged; a
    /// balancer still checking is not routing).
    pub fn is_routed(self) -> bool {
        self.info().routed
    }

    /// Kinds drawn on a stop's timeline: idle closes are harmless and resets are counted by
    /// reason only.
    pub fn on_timeline(self) -> bool {
        self.info().mark.is_some()
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
        for (r, n) in &other.resets_sent {
            *self.resets_sent.entry(r.clone()).or_default() += n;
        }
        for kind in LossKind::ALL {
            let n = other.get(*kind);
            if let Some(slot) = self.slot(*kind) {
                *slot += n;
            }
        }
    }

    /// Counts one loss of `kind`; `reason` is a reset's kernel reason.
    pub fn count(&mut self, kind: LossKind, reason: Option<&str>) {
        if let Some(slot) = self.slot(kind) {
            *slot += 1;
            return;
        }
        match kind {
            LossKind::ProbeCut => self.probes.cut += 1,
            LossKind::ProbeRefused => self.probes.refused += 1,
            LossKind::ProbeUnreachable => self.probes.unreachable += 1,
            _ => {
                *self
                    .resets_sent
                    .entry(reason.unwrap_or_default().to_string())
                    .or_default() += 1;
            }
        }
    }

    /// The count of one kind (resets summed over reasons).
    pub fn get(&self, kind: LossKind) -> u64 {
        if let Some(n) = self.count_of(kind) {
            return n;
        }
        match kind {
            LossKind::ProbeCut => self.probes.cut,
            LossKind::ProbeRefused => self.probes.refused,
            LossKind::ProbeUnreachable => self.probes.unreachable,
            _ => self.resets_sent.values().sum(),
        }
    }

    /// Whether a user's connection was lost (see [`KindInfo::lost`]).
    pub fn lost_any(&self) -> bool {
        LossKind::ALL
            .iter()
            .any(|k| k.info().lost && self.get(*k) > 0)
    }
}

/// Fields in alphabetical order, whatever the kinds' display order.
impl Serialize for Loss {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(untagged)]
        enum Field<'a> {
            Count(u64),
            Probes(&'a ProbeLoss),
            Resets(&'a BTreeMap<String, u64>),
        }
        let mut fields: BTreeMap<&str, Field> =
            self.counts().map(|(f, n)| (f, Field::Count(n))).collect();
        fields.insert("probes", Field::Probes(&self.probes));
        fields.insert("resets_sent", Field::Resets(&self.resets_sent));
        let mut map = s.serialize_map(Some(fields.len()))?;
        for (k, v) in &fields {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_counts_in_its_own_field_and_serializes_as_its_name() {
        for &kind in LossKind::ALL {
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
