//! `drainwatch report --gate <namespace>/<workload>`: a rollout gate for pipelines without Argo
//! Rollouts or Flagger. The pure part: which of the stop records count (the workload's stops
//! within the window), what they cost by gate (the same nine gates as the chart's
//! AnalysisTemplate and MetricTemplates), whether that passes the allowances (0 each by
//! default), and the one line a CI log shows. The I/O (one agent, or every agent through the
//! API server) is the report's.

use std::{
    collections::BTreeMap,
    time::{Duration, SystemTime},
};

use thiserror::Error;

use super::view::StopView;
use crate::model::stop::Outcome;

/// What a gate counts; the names are the chart's (`max-<name>` args, MetricTemplate names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum GateKind {
    RequestsCut,
    StreamsCut,
    SessionsCut,
    Refused,
    Unreachable,
    NoEndpoints,
    SentAfterClose,
    RetryDuplicates,
    Sigkills,
}

impl GateKind {
    pub const ALL: [GateKind; 9] = [
        GateKind::RequestsCut,
        GateKind::StreamsCut,
        GateKind::SessionsCut,
        GateKind::Refused,
        GateKind::Unreachable,
        GateKind::NoEndpoints,
        GateKind::SentAfterClose,
        GateKind::RetryDuplicates,
        GateKind::Sigkills,
    ];

    pub fn name(self) -> &'static str {
        match self {
            GateKind::RequestsCut => "requests-cut",
            GateKind::StreamsCut => "streams-cut",
            GateKind::SessionsCut => "sessions-cut",
            GateKind::Refused => "refused",
            GateKind::Unreachable => "unreachable",
            GateKind::NoEndpoints => "no-endpoints",
            GateKind::SentAfterClose => "sent-after-close",
            GateKind::RetryDuplicates => "retry-duplicates",
            GateKind::Sigkills => "sigkills",
        }
    }

    /// What one stop counts toward this gate.
    fn count(self, s: &StopView) -> u64 {
        let l = &s.loss;
        match self {
            GateKind::RequestsCut => l.inflight_cut,
            GateKind::StreamsCut => l.streams_cut,
            GateKind::SessionsCut => l.sessions_cut,
            GateKind::Refused => l.refused,
            GateKind::Unreachable => l.unreachable,
            GateKind::NoEndpoints => l.no_endpoints,
            GateKind::SentAfterClose => l.sent_after_close,
            GateKind::RetryDuplicates => l.retry_duplicates,
            GateKind::Sigkills => u64::from(s.outcome == Some(Outcome::KilledAtDeadline)),
        }
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum GateError {
    #[error("--gate takes <namespace>/<workload> (or a workload outside Kubernetes), got {0:?}")]
    Workload(String),
    #[error("--allow takes <gate>=<count> with a gate of {names}, got {0:?}", names = names())]
    Allow(String),
}

fn names() -> String {
    GateKind::ALL.map(GateKind::name).join(", ")
}

/// What is asked: the workload, how far back, and how much of each gate is allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gate {
    pub namespace: String,
    pub workload: String,
    pub since: Duration,
    /// Gates not named allow 0.
    pub allow: BTreeMap<GateKind, u64>,
}

impl Gate {
    /// From `--gate NS/WORKLOAD`, `--since` and each `--allow GATE=N`.
    pub fn parse(workload: &str, since: Duration, allow: &[String]) -> Result<Gate, GateError> {
        // Outside Kubernetes (podman, Docker) workloads have no namespace: a bare name.
        let (namespace, name) = workload.split_once('/').unwrap_or(("", workload));
        if name.is_empty() || name.contains('/') || (namespace.is_empty() && workload.contains('/'))
        {
            return Err(GateError::Workload(workload.into()));
        }
        let mut gate = Gate {
            namespace: namespace.into(),
            workload: name.into(),
            since,
            allow: BTreeMap::new(),
        };
        for a in allow {
            let bad = || GateError::Allow(a.clone());
            let (kind, n) = a.split_once('=').ok_or_else(bad)?;
            let kind = GateKind::ALL
                .into_iter()
                .find(|k| k.name() == kind.trim())
                .ok_or_else(bad)?;
            gate.allow
                .insert(kind, n.trim().parse::<u64>().map_err(|_| bad())?);
        }
        Ok(gate)
    }

    /// `namespace/workload`, or the bare workload outside Kubernetes.
    pub fn target(&self) -> String {
        if self.namespace.is_empty() {
            self.workload.clone()
        } else {
            format!("{}/{}", self.namespace, self.workload)
        }
    }

    fn allowed(&self, kind: GateKind) -> u64 {
        self.allow.get(&kind).copied().unwrap_or(0)
    }
}

/// When a stop began: its stop signal, or its exit when it had none (a crash).
fn began(s: &StopView) -> Option<SystemTime> {
    let at = s.sigterm_at.as_deref().or(s.exit_at.as_deref())?;
    humantime::parse_rfc3339_weak(at.trim_end_matches('Z')).ok()
}

/// What the gate found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateResult {
    pub gate: Gate,
    /// The workload's stops within the window.
    pub stops: usize,
    /// Of those, still open (their counts may still grow).
    pub open: usize,
    /// Per gate, the count, in [`GateKind::ALL`] order.
    pub counts: Vec<(GateKind, u64)>,
    /// Agents that did not answer (`--cluster`): their nodes' stops are missing.
    pub unanswered: usize,
}

impl GateResult {
    /// The gates over their allowance.
    pub fn failed(&self) -> Vec<(GateKind, u64)> {
        self.counts
            .iter()
            .filter(|(k, n)| *n > self.gate.allowed(*k))
            .copied()
            .collect()
    }

    /// Passed: nothing over its allowance, and every agent answered (a node not heard from
    /// cannot vouch for its stops).
    pub fn passed(&self) -> bool {
        self.failed().is_empty() && self.unanswered == 0
    }

    /// The one line for the CI log.
    pub fn line(&self) -> String {
        let g = &self.gate;
        let verdict = if self.passed() { "PASS" } else { "FAIL" };
        let counts: Vec<String> = self
            .counts
            .iter()
            .map(|(k, n)| {
                let allowed = g.allowed(*k);
                match (*n > allowed, allowed) {
                    (true, _) => format!("{} {n} > {allowed}", k.name()),
                    (false, 0) => format!("{} {n}", k.name()),
                    (false, _) => format!("{} {n} <= {allowed}", k.name()),
                }
            })
            .collect();
        let mut line = format!(
            "drainwatch gate {verdict} {}: {} stop(s) in the last {}",
            g.target(),
            self.stops,
            humantime::format_duration(g.since)
        );
        if self.open > 0 {
            line += &format!(" ({} still open)", self.open);
        }
        line += &format!(": {}", counts.join(", "));
        if self.unanswered > 0 {
            line += &format!(
                "; {} agent(s) did not answer: their nodes' stops are missing",
                self.unanswered
            );
        }
        line
    }
}

/// The gate over stop records (from one agent or merged across them), at `now`; pure.
pub fn evaluate(gate: &Gate, stops: &[StopView], unanswered: usize, now: SystemTime) -> GateResult {
    let from = now
        .checked_sub(gate.since)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let mine: Vec<&StopView> = stops
        .iter()
        .filter(|s| {
            s.container.namespace == gate.namespace && s.container.workload == gate.workload
        })
        // A stop without a parsable time is counted: a gate must not pass on what it cannot read.
        .filter(|s| began(s).is_none_or(|t| t >= from))
        .collect();
    GateResult {
        gate: gate.clone(),
        stops: mine.len(),
        open: mine.iter().filter(|s| !s.settled).count(),
        counts: GateKind::ALL
            .into_iter()
            .map(|k| (k, mine.iter().map(|s| k.count(s)).sum()))
            .collect(),
        unanswered,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn at(s: &str) -> SystemTime {
        humantime::parse_rfc3339_weak(s).unwrap()
    }

    fn stop(
        ns: &str,
        workload: &str,
        sigterm: &str,
        outcome: &str,
        loss: serde_json::Value,
    ) -> StopView {
        serde_json::from_value(json!({
            "id": format!("{workload}-{sigterm}"), "sigterm_at": sigterm, "settled": true,
            "outcome": outcome, "loss": loss,
            "container": {"name": workload, "namespace": ns, "workload": workload},
        }))
        .unwrap()
    }

    fn gate(allow: &[&str]) -> Gate {
        let allow: Vec<String> = allow.iter().map(|s| s.to_string()).collect();
        Gate::parse("shop/web", Duration::from_secs(600), &allow).unwrap()
    }

    const NOW: &str = "2026-12-07T10:10:00Z";

    #[test]
    fn a_drained_deploy_passes_and_says_so_in_one_line() {
        let stops = [
            stop(
                "shop",
                "web",
                "2026-12-07T10:01:00.000Z",
                "drained",
                json!({"idle_closed": 40}),
            ),
            stop(
                "shop",
                "web",
                "2026-12-07T10:02:00.000Z",
                "drained",
                json!({"accepted_after_sigterm": 3}),
            ),
        ];
        let r = evaluate(&gate(&[]), &stops, 0, at(NOW));
        assert!(r.passed(), "{r:?}");
        assert_eq!(r.stops, 2);
        assert_eq!(
            r.line(),
            "drainwatch gate PASS shop/web: 2 stop(s) in the last 10m: requests-cut 0, \
             streams-cut 0, sessions-cut 0, refused 0, unreachable 0, no-endpoints 0, sent-after-close 0, retry-duplicates 0, sigkills 0"
        );
    }

    #[test]
    fn each_kind_of_loss_fails_the_gate_and_is_named() {
        for (loss, outcome, kind, n) in [
            (
                json!({"inflight_cut": 4}),
                "exit_at_once",
                GateKind::RequestsCut,
                4,
            ),
            (
                json!({"streams_cut": 20}),
                "drained",
                GateKind::StreamsCut,
                20,
            ),
            (
                json!({"sessions_cut": 7}),
                "exited",
                GateKind::SessionsCut,
                7,
            ),
            (
                json!({"refused": 12}),
                "listener_closed_early",
                GateKind::Refused,
                12,
            ),
            (
                json!({"unreachable": 1}),
                "drained",
                GateKind::Unreachable,
                1,
            ),
            (
                json!({"sent_after_close": 9}),
                "drained",
                GateKind::SentAfterClose,
                9,
            ),
            (
                json!({"retry_duplicates": 2}),
                "drained",
                GateKind::RetryDuplicates,
                2,
            ),
            (json!({}), "killed_at_deadline", GateKind::Sigkills, 1),
        ] {
            let stops = [stop("shop", "web", "2026-12-07T10:05:00Z", outcome, loss)];
            let r = evaluate(&gate(&[]), &stops, 0, at(NOW));
            assert!(!r.passed());
            assert_eq!(r.failed(), [(kind, n)]);
            let line = r.line();
            assert!(
                line.starts_with("drainwatch gate FAIL shop/web: 1 stop(s)"),
                "{line}"
            );
            assert!(line.contains(&format!("{} {n} > 0", kind.name())), "{line}");
            assert!(!line.contains('\n'));
        }
    }

    #[test]
    fn only_the_workloads_stops_within_the_window_count() {
        let lossy = json!({"inflight_cut": 5});
        let stops = [
            // Before the window: a previous rollout.
            stop(
                "shop",
                "web",
                "2026-12-07T09:59:59Z",
                "exit_at_once",
                lossy.clone(),
            ),
            // Another workload, another namespace's workload of the same name.
            stop(
                "shop",
                "cart",
                "2026-12-07T10:05:00Z",
                "exit_at_once",
                lossy.clone(),
            ),
            stop(
                "dev",
                "web",
                "2026-12-07T10:05:00Z",
                "exit_at_once",
                lossy.clone(),
            ),
            stop(
                "shop",
                "web",
                "2026-12-07T10:00:01Z",
                "exit_at_once",
                json!({"inflight_cut": 2}),
            ),
        ];
        let r = evaluate(&gate(&[]), &stops, 0, at(NOW));
        assert_eq!((r.stops, r.failed()), (1, vec![(GateKind::RequestsCut, 2)]));
        // A crash has no stop signal: its exit dates it.
        let crash: StopView = serde_json::from_value(json!({
            "id": "c", "exit_at": "2026-12-07T10:09:00Z", "outcome": "crashed",
            "loss": {"inflight_cut": 1}, "container": {"namespace": "shop", "workload": "web"},
        }))
        .unwrap();
        let r = evaluate(&gate(&[]), &[crash], 0, at(NOW));
        assert_eq!((r.stops, r.open), (1, 1));
        assert!(r.line().contains("(1 still open)"), "{}", r.line());
    }

    #[test]
    fn allowances_raise_a_gate_and_a_missing_agent_fails_it() {
        let stops = [
            stop(
                "shop",
                "web",
                "2026-12-07T10:05:00Z",
                "drained",
                json!({"retry_duplicates": 2}),
            ),
            stop(
                "shop",
                "web",
                "2026-12-07T10:06:00Z",
                "drained",
                json!({"retry_duplicates": 1}),
            ),
        ];
        let r = evaluate(&gate(&["retry-duplicates=3"]), &stops, 0, at(NOW));
        assert!(r.passed());
        assert!(r.line().contains("retry-duplicates 3 <= 3"), "{}", r.line());
        let r = evaluate(&gate(&["retry-duplicates=2"]), &stops, 0, at(NOW));
        assert_eq!(r.failed(), [(GateKind::RetryDuplicates, 3)]);
        // Nothing lost where it answered, but a node did not: no pass.
        let r = evaluate(&gate(&["retry-duplicates=3"]), &stops, 1, at(NOW));
        assert!(!r.passed());
        assert!(
            r.line()
                .ends_with("; 1 agent(s) did not answer: their nodes' stops are missing")
        );
    }

    #[test]
    fn no_stops_pass_but_say_none_were_seen() {
        let r = evaluate(&gate(&[]), &[], 0, at(NOW));
        assert!(r.passed());
        assert!(
            r.line().contains(": 0 stop(s) in the last 10m:"),
            "{}",
            r.line()
        );
    }

    #[test]
    fn the_arguments_are_checked() {
        let d = Duration::from_secs(60);
        for bad in ["", "/web", "shop/", "a/b/c"] {
            assert_eq!(
                Gate::parse(bad, d, &[]),
                Err(GateError::Workload(bad.into()))
            );
        }
        for bad in ["refused", "refused=x", "cut=1", "refused=-1"] {
            assert_eq!(
                Gate::parse("shop/web", d, &[bad.into()]),
                Err(GateError::Allow(bad.into()))
            );
        }
        let g = Gate::parse("shop/web", d, &["sigkills=1".into(), "refused = 10".into()]).unwrap();
        assert_eq!(g.allow.len(), 2);
        assert_eq!(g.allowed(GateKind::Refused), 10);
        assert_eq!(g.allowed(GateKind::RequestsCut), 0);
        // Outside Kubernetes: no namespace.
        let g = Gate::parse("web", d, &[]).unwrap();
        assert_eq!((g.namespace.as_str(), g.target()), ("", "web".to_string()));
        let stops = [stop(
            "",
            "web",
            "2026-12-07T10:09:30Z",
            "drained",
            json!({"refused": 1}),
        )];
        let line = evaluate(&g, &stops, 0, at(NOW)).line();
        assert!(
            line.starts_with("drainwatch gate FAIL web: 1 stop(s) in the last 1m: "),
            "{line}"
        );
    }
}
