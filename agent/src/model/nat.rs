//! Lookups of where a failed connect was really sent (`enrich::nat`).

/// What one lookup found, as `drainwatch_nat_lookups_total` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NatOutcome {
    /// Translated to another address (a Service's DNAT).
    Translated,
    /// Tracked, not translated: the address is really what the socket named.
    Untranslated,
    /// No entry: never tracked, or dropped before it was confirmed.
    NotFound,
    /// No entry, and refused by an ICMP reject, not a RST: the node's own filter rejected it
    /// before any translation (kube-proxy's answer for a Service with no endpoints).
    Rejected,
    /// The lookup failed (permissions, namespace, a malformed answer).
    Failed,
    /// Not looked up: over the per-second budget (`MAX_PER_SECOND`).
    Capped,
}

impl NatOutcome {
    pub const ALL: [Self; 6] = [
        Self::Translated,
        Self::Untranslated,
        Self::NotFound,
        Self::Rejected,
        Self::Failed,
        Self::Capped,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::Translated => "translated",
            Self::Untranslated => "untranslated",
            Self::NotFound => "not_found",
            Self::Rejected => "rejected",
            Self::Failed => "failed",
            Self::Capped => "capped",
        }
    }
}
