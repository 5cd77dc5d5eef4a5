//! The plain-language verdict on a container stop, a start and a reconnect storm, with the concrete
//! fix its evidence supports. One pure function each, shared by `drainwatch report` and the
//! deploy page, over the report API's views (what the report fetches and the page renders), so
//! both always say the same thing.

mod requests;
mod sessions;
mod start;
mod storm;
mod streams;

pub use start::start;
pub use storm::storm;

use super::{
    format::{count, epoch, or_null, secs},
    view::StopView,
};
use crate::model::{
    LossKind,
    stop::{IgnoredSignal, Outcome},
};

/// How bad it is, for colour on the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Nothing lost, nothing to change.
    Good,
    /// Nothing lost yet, but something to change (little margin, a storm that queued).
    Warning,
    /// Connections were lost.
    Bad,
    /// Still stopping: no verdict yet.
    Pending,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Good => "good",
            Level::Warning => "warning",
            Level::Bad => "bad",
            Level::Pending => "pending",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub level: Level,
    /// What happened, then `: ` and the fix (when there is one).
    pub text: String,
}

/// How soon after a listener's close a cut was made by it.
const BY_THE_CLOSE: f64 = 0.05;

/// When its listeners closed after the stop signal, before the exit (epoch seconds).
fn listener_closes(stop: &StopView) -> Vec<f64> {
    let after = |t: &Option<String>| t.as_deref().and_then(epoch);
    let (term, exit) = (after(&stop.sigterm_at), after(&stop.exit_at));
    stop.listeners
        .iter()
        .filter_map(|l| after(&l.closed_at))
        .filter(|c| term.is_some_and(|t| *c >= t) && exit.is_none_or(|e| *c < e))
        .collect()
}

fn at_a_close(closes: &[f64], at: &str) -> bool {
    epoch(at).is_some_and(|a| closes.iter().any(|c| a >= *c && a - c <= BY_THE_CLOSE))
}

/// In-flight requests cut as it closed a listener (within 50 ms of the close, after the stop
/// signal, before the exit), and how long after the signal: connections still queued for
/// `accept()` are reset by the close (the process never saw their requests). Neither the
/// grace period nor the exit cut those.
fn cut_by_listener_close(stop: &StopView) -> Option<(u64, f64)> {
    let closes = listener_closes(stop);
    let n = stop
        .loss_events
        .iter()
        .filter(|e| e.kind == LossKind::InflightCut && at_a_close(&closes, &e.at))
        .count() as u64;
    let term = stop.sigterm_at.as_deref().and_then(epoch)?;
    let first = closes.iter().copied().reduce(f64::min)?;
    (n > 0).then(|| (n, (first - term).max(0.0)))
}

/// The finding for those.
fn listener_close_finding(n: u64, after: f64) -> String {
    format!(
        "{} cut as it closed its listener {} s after SIGTERM (connections still queued for accept() are reset by the close): keep accepting until routing has moved, then close the listener",
        count(n, "request was", "requests were"),
        secs(after)
    )
}

/// "routing continued 3.8 s after SIGTERM", and how many attempts it cost, if it did.
fn routing(stop: &StopView) -> Option<(f64, String)> {
    let lag = stop.routing_lag_seconds.filter(|l| *l > 0.0)?;
    Some((
        lag,
        format!("routing continued {} s after SIGTERM", secs(lag)),
    ))
}

/// The fix for traffic that kept coming: how long to keep serving after failing readiness. On
/// Kubernetes a preStop hook that sleeps does the same without touching the app: SIGTERM comes
/// after the hook, so a hook already there was that much too short.
fn wait_fix(stop: &StopView, lag: f64) -> String {
    let wait = secs(lag.ceil().max(1.0));
    let fix = format!("fail readiness on SIGTERM and wait ≥ {wait} s before closing the listener");
    match stop.prestop {
        Some(true) => format!(
            "the preStop hook ended before routing moved: make it last ≥ {wait} s longer, or {fix}"
        ),
        Some(false) => format!("{fix} (or add a preStop hook that sleeps ≥ {wait} s)"),
        None => fix,
    }
}

/// A process that drained but still cut work when it exited.
fn cut_at_exit(cut: u64) -> String {
    format!(
        "exited with {} still in flight: wait for in-flight work (and queued connections) before exiting",
        count(cut, "request", "requests")
    )
}

/// Findings every outcome shares: what proxies made of the cuts, and attempts at a gone address.
fn common_findings(stop: &StopView, out: &mut Vec<String>) {
    let loss = &stop.loss;
    let dup = loss.retry_duplicates;
    if dup > 0 {
        out.push(format!(
            "a proxy re-sent {} to another backend: clients saw success, the work ran twice",
            count(dup, "cut request", "cut requests")
        ));
    }
    let unexecuted = loss.retried_unexecuted;
    if unexecuted > 0 {
        out.push(format!(
            "a proxy re-sent {} it had never read to another backend: done once, only later",
            count(unexecuted, "cut request", "cut requests")
        ));
    }
    let aborts = loss.upstream_aborts;
    if aborts > 0 {
        out.push(format!(
            "{} reached clients through a proxy as errors (502 or reset)",
            count(aborts, "cut request", "cut requests")
        ));
    }
    let unreachable = loss.unreachable;
    if unreachable > 0 {
        out.push(format!(
            "{} found its address gone: remove the endpoint before the pod goes",
            count(unreachable, "connection attempt", "connection attempts")
        ));
    }
    let rejected = loss.no_endpoints;
    if rejected > 0 {
        out.push(format!(
            "{} to its Service rejected by kube-proxy: the Service had no ready endpoints (all its pods stopping or not ready yet): keep a ready pod through the rollout (a surge, maxUnavailable 0, or more replicas)",
            count(rejected, "connect was", "connects were")
        ));
    }
    let p = &loss.probes;
    let checks = p.cut + p.refused + p.unreachable;
    if checks > 0 {
        out.push(format!(
            "{} failed (not users: the balancer or kubelet was still checking)",
            count(checks, "health check", "health checks")
        ));
    }
}

/// A stop signal the kernel dropped: what it cost and the fix, which is never the grace period.
fn ignored_signal(why: IgnoredSignal, grace: &str, cut: u64) -> String {
    let cost = if cut > 0 {
        format!(
            ", cutting {}",
            count(cut, "in-flight request", "in-flight requests")
        )
    } else {
        String::new()
    };
    let fix = match why {
        IgnoredSignal::Pid1WithoutHandler => {
            "handle SIGTERM in the server (stop accepting, finish in-flight work, exit), or run it under an init that forwards signals (tini, dumb-init; `--init`); a longer grace period changes nothing"
        }
        IgnoredSignal::IgnoredByProcess => {
            "stop ignoring SIGTERM (SIG_IGN, `trap '' TERM`), or set the image's stop signal to one the server handles; a longer grace period changes nothing"
        }
    };
    format!(
        "SIGTERM was ignored ({}): the kernel dropped it, the process served on through the {grace} period and was SIGKILLed{cost}: {fix}",
        why.words()
    )
}

/// What a record whose inputs were partly lost says about itself: events lost on the way,
/// eBPF program faults that lost part of what it reads.
fn lost_notes(events: u64, faults: u64) -> Vec<String> {
    let mut notes = Vec::new();
    if events > 0 {
        notes.push(format!(
            "may be incomplete: {} lost on the way while it was open (drainwatch_events_lost_total)",
            count(events, "kernel event was", "kernel events were")
        ));
    }
    if faults > 0 {
        notes.push(format!(
            "may be incomplete: the eBPF programs lost part of what it reads {} while it was open (drainwatch_ebpf_faults_total)",
            count(faults, "time", "times")
        ));
    }
    notes
}

/// The verdict on one stop record (`/api/v1/stops` element).
pub fn stop(stop: &StopView) -> Verdict {
    let cut = stop.loss.inflight_cut;
    // Connections a client lost with no request on them: streams, sessions.
    let streams = stop.loss.streams_cut + stop.loss.sessions_cut;
    let refused = stop.loss.refused;
    let mut level = Level::Bad;
    let mut parts: Vec<String> = Vec::new();
    // Cuts made as a listener closed, apart from those of the deadline or the exit.
    let by_close = cut_by_listener_close(stop);
    let closed_cut = by_close.map_or(0, |(n, _)| n.min(cut));
    let close_finding = by_close.map(|(n, after)| listener_close_finding(n, after));
    match stop.outcome {
        None if !stop.complete => {
            return Verdict {
                level: Level::Warning,
                text: format!(
                    "incomplete: no exit was seen {} (the process outlived the limit, or its exit event was lost): no outcome{}",
                    if stop.sigkill_at.is_some() {
                        "within 30 s of SIGKILL"
                    } else {
                        "within the grace period and 30 s"
                    },
                    if cut + refused + streams > 0 {
                        format!(
                            " ({cut} in-flight cut, {streams} streams or sessions cut, {refused} refused while it was seen)"
                        )
                    } else {
                        String::new()
                    }
                ),
            };
        }
        None => {
            let mut text = "stopping: no verdict until the process exits".to_string();
            if cut + refused > 0 {
                text += &format!(" ({cut} in-flight cut, {refused} refused so far)");
            }
            return Verdict {
                level: Level::Pending,
                text,
            };
        }
        Some(Outcome::Crashed) => {
            let mut text = format!(
                "exited with code {} without a stop signal: a crash, not a deploy",
                or_null(stop.exit_code)
            );
            if cut > 0 {
                text += &format!(
                    "; it cut {}",
                    count(cut, "in-flight request", "in-flight requests")
                );
            }
            parts.push(text);
        }
        Some(Outcome::Exited) => {
            // Its work done (a Job, a one-shot task): nothing to fix unless it cut something.
            let mut text =
                "exited with code 0 with no stop signal seen: a normal exit, not a crash"
                    .to_string();
            if cut > 0 {
                level = Level::Warning;
                text += &format!(
                    "; it cut {}: close connections only after their requests are answered",
                    count(cut, "in-flight request", "in-flight requests")
                );
            } else if refused == 0 && streams == 0 {
                level = Level::Good;
            }
            parts.push(text);
        }
        Some(Outcome::KilledAtDeadline) => {
            let g = stop
                .grace()
                .map_or_else(|| "grace".into(), |g| format!("{} s grace", secs(g)));
            if let Some(why) = stop.stop_signal_ignored {
                // Not slow work: the process never saw the signal. A longer grace period would
                // only serve on longer before the same SIGKILL.
                if cut + streams == 0 {
                    level = Level::Warning;
                }
                parts.push(ignored_signal(why, &g, cut));
            } else if cut > closed_cut {
                // By each request's own age: young ones on kept-alive connections are no
                // reason to raise the grace period.
                let requests = requests::cut_requests(stop);
                parts.extend(requests.outlived_finding(cut - closed_cut, &g));
                parts.extend(requests.young_finding(&g));
            } else if streams == 0 {
                if closed_cut == 0 {
                    level = Level::Warning;
                }
                parts.push(format!(
                    "did not exit within the {g} period and was SIGKILLed, though nothing in flight was cut by it: exit once in-flight work is done (close idle keep-alive connections; as PID 1 a process ignores SIGTERM unless it handles it)"
                ));
            }
            if stop.stop_signal_ignored.is_none() {
                parts.extend(close_finding);
            }
            if let Some((lag, r)) = routing(stop)
                && refused > 0
            {
                parts.push(format!("{r}: {}", wait_fix(stop, lag)));
            }
        }
        Some(Outcome::ExitAtOnce) if stop.sigterm_at.is_none() && stop.sigkill_at.is_some() => {
            // SIGKILL with no stop signal before it: `kill -9`, `podman rm -f`, the OOM killer.
            let mut text =
                "killed by SIGKILL with no stop signal first: nothing could drain".to_string();
            if cut > 0 {
                text += &format!(
                    ", {} cut",
                    count(cut, "in-flight request", "in-flight requests")
                );
            }
            parts.push(format!(
                "{text}: stop containers with SIGTERM and a grace period (a pod deletion, `podman stop`), not a kill; if the kernel killed it, raise its memory limit"
            ));
        }
        Some(Outcome::ExitAtOnce) => {
            let what = match stop.exit_signal {
                Some(sig) => format!(
                    "exited at once on the stop signal (exit signal {sig}, code {})",
                    or_null(stop.exit_code)
                ),
                None => format!(
                    "exited {} s after the stop signal without closing its listener first (code {})",
                    stop.drain_seconds.map_or("?".into(), secs),
                    or_null(stop.exit_code)
                ),
            };
            let mut text = if cut > 0 {
                format!(
                    "{what}, cutting {}",
                    count(cut, "in-flight request", "in-flight requests")
                )
            } else {
                what
            };
            let fix = match routing(stop) {
                Some((lag, r)) => {
                    if refused > 0 {
                        text += &format!(
                            "; {r} and {} refused",
                            count(
                                refused,
                                "connection attempt was",
                                "connection attempts were"
                            )
                        );
                    } else {
                        text += &format!("; {r}");
                    }
                    let wait = secs(lag.ceil().max(1.0));
                    let mut fix = format!(
                        "handle SIGTERM: fail readiness, wait ≥ {wait} s before closing the listener, finish in-flight work, then exit"
                    );
                    if stop.prestop == Some(false) {
                        // The hook runs before SIGTERM: routing moves and in-flight work ends
                        // while it sleeps, so even a process without a handler stops idle.
                        fix += &format!(" (or add a preStop hook that sleeps ≥ {wait} s)");
                    }
                    fix
                }
                None => "handle SIGTERM: stop accepting, finish in-flight work, then exit".into(),
            };
            parts.push(format!("{text}: {fix}"));
        }
        Some(Outcome::ListenerClosedEarly) => {
            let refused_text = count(
                refused,
                "connection attempt was",
                "connection attempts were",
            );
            parts.push(match routing(stop) {
                Some((lag, r)) => {
                    format!("{r} and {refused_text} refused: {}", wait_fix(stop, lag))
                }
                None => format!(
                    "closed its listener while routing still sent traffic and {refused_text} refused: fail readiness on SIGTERM and keep serving until routing has moved"
                ),
            });
            if cut > closed_cut {
                parts.push(cut_at_exit(cut - closed_cut));
            }
            parts.extend(close_finding);
        }
        Some(Outcome::Drained) if cut > 0 => {
            let d = stop.drain_seconds.map_or("?".into(), secs);
            if cut > closed_cut {
                parts.push(format!(
                    "drained for {d} s, then {}",
                    cut_at_exit(cut - closed_cut)
                ));
            } else {
                parts.push(format!("drained for {d} s"));
            }
            parts.extend(close_finding);
        }
        Some(Outcome::Drained) if streams > 0 => {
            let d = stop.drain_seconds.map_or("?".into(), secs);
            parts.push(format!("drained for {d} s"));
        }
        Some(Outcome::Drained) if stop.loss.sent_after_close > 0 => {
            let d = stop.drain_seconds.map_or("?".into(), secs);
            parts.push(format!("drained for {d} s"));
        }
        Some(Outcome::Drained) => {
            level = Level::Good;
            let mut text = match stop.drain_seconds {
                Some(d) => format!("drained cleanly in {} s: nothing lost", secs(d)),
                None => "drained cleanly: nothing lost".into(),
            };
            text += &streams::on_timers(stop);
            if let Some((_, r)) = routing(stop) {
                text += &format!(" ({r})");
            }
            if let (Some(d), Some(g)) = (stop.drain_seconds, stop.grace())
                && g > 0.0
                && d > 0.8 * g
            {
                level = Level::Warning;
                text += &format!(
                    "; but it used {} s of the {} s grace period: raise the grace period or drain faster",
                    secs(d),
                    secs(g)
                );
            }
            parts.push(text);
        }
    }
    parts.extend(streams::cut(stop));
    parts.extend(streams::ended_at_once(stop));
    parts.extend(sessions::sessions_cut(stop));
    parts.extend(requests::sent_after_close(stop));
    common_findings(stop, &mut parts);
    parts.extend(lost_notes(stop.events_lost, stop.ebpf_faults));
    if let Some(gap) = &stop.agent_gap {
        let when = if stop.sigterm_at.is_none() && stop.sigkill_at.is_none() {
            "just before it exited: its stop signal may have come then, unseen"
        } else {
            "while it was open"
        };
        parts.push(format!(
            "may be incomplete: the agent was not watching for {} s {when} (it restarted; agent_gap)",
            secs(gap.seconds)
        ));
    }
    if !stop.settled && stop.attempts_in_flight > 0 {
        parts.push(format!(
            "settling: {} to its vanished address still in flight (the kernel gives up on an unanswered SYN later; attempts_in_flight): the counts may grow",
            count(stop.attempts_in_flight, "connection attempt", "connection attempts")
        ));
    }
    if stop.attempts_unresolved > 0 {
        parts.push(format!(
            "may be incomplete: {} to its vanished address had no outcome within the kernel's SYN retry time (attempts_unresolved)",
            count(stop.attempts_unresolved, "connection attempt", "connection attempts")
        ));
    }
    let partial = stop.events_lost > 0
        || stop.ebpf_faults > 0
        || stop.agent_gap.is_some()
        || stop.attempts_unresolved > 0;
    if partial && level == Level::Good {
        level = Level::Warning; // "nothing lost" is not known
    }
    if !stop.settled && stop.attempts_in_flight > 0 && level == Level::Good {
        level = Level::Pending; // loss may still come
    }
    Verdict {
        level,
        text: parts.join("; "),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::export::view::{LossEventView, StartView, StormView};

    /// A stop record read from the API's field names; `extra` overrides.
    fn stop_with(outcome: &str, loss: Value, extra: Value) -> StopView {
        let mut s = json!({
            "outcome": outcome,
            "exit_code": 0, "exit_signal": null,
            "grace_seconds": null, "drain_seconds": 0.5, "routing_lag_seconds": null,
            "loss": loss, "loss_events": [],
        });
        for (k, v) in extra.as_object().unwrap() {
            s[k] = v.clone();
        }
        view(s)
    }

    fn view<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn cut_streams_are_judged_against_the_grace_period_and_the_lifetimes() {
        let killed = |grace: f64, lifetimes: Value, extra: Value| {
            let mut x = json!({"grace_seconds": grace, "exit_code": 137, "exit_signal": 9,
                   "stream_lifetimes": lifetimes, "storm_clients": 28});
            x["stream_rotation_seconds"] = lifetimes["p95_seconds"].clone();
            for (k, v) in extra.as_object().unwrap() {
                x[k] = v.clone();
            }
            stop(&stop_with(
                "killed_at_deadline",
                json!({"streams_cut": 28, "idle_closed": 60}),
                x,
            ))
        };
        let fixed = json!({"p50_seconds": 6.04, "p95_seconds": 6.04, "max_seconds": 6.05,
                           "shape": "fixed", "streams": 100});
        let short = killed(2.0, fixed.clone(), json!({}));
        assert_eq!(short.level, Level::Bad);
        assert_eq!(
            short.text,
            "28 live streams cut at SIGKILL (28 clients back at once): the 2 s grace period is shorter than the 6 s its server lets streams live: raise it to at least 8 s (that + 2 s)"
        );
        // Lifetimes that vary: the 95th percentile, and the median for scale.
        let spread = json!({"p50_seconds": 3.58, "p95_seconds": 5.74, "max_seconds": 5.98,
                            "shape": "spread", "streams": 128});
        assert_eq!(
            killed(2.0, spread, json!({})).text,
            "28 live streams cut at SIGKILL (28 clients back at once): the 2 s grace period is shorter than the 5.7 s its server lets streams live (95th percentile; median 3.6 s, spread): raise it to at least 8 s (that + 2 s)"
        );
        let long = killed(30.0, fixed, json!({}));
        assert!(
            long.text.starts_with("28 live streams cut at SIGKILL (28 clients back at once): they outlived the grace period although its server ends 95% of its streams within 6 s"),
            "{}",
            long.text
        );
        // Nothing learned (stopped early): its server's own ends in the stop say timers ran.
        let early = killed(
            2.0,
            Value::Null,
            json!({"streams_ended_by_server": {"on_their_timers": 12, "at_sigterm": 0}}),
        );
        assert!(
            early.text.contains("its server ended 12 others on their own timers in the grace period, these outlived it: raise it above the streams' longest lifetime + 2 s (not learned before this stop"),
            "{}",
            early.text
        );
        assert!(
            killed(2.0, Value::Null, json!({}))
                .text
                .contains("their clients lost the stream")
        );
        // A process that exited with its streams open.
        let exited = stop(&stop_with(
            "drained",
            json!({"streams_cut": 3}),
            json!({"stream_rotation_seconds": 6.0}),
        ));
        assert_eq!(exited.level, Level::Bad);
        assert_eq!(
            exited.text,
            "drained for 0.5 s; 3 live streams cut: the process exited with them open: on SIGTERM, close the listener and let open streams run to their own timers (a grace period of at least 8 s)"
        );
    }

    #[test]
    fn streams_the_server_ended_itself_are_named_never_as_cuts() {
        let ended = |timers: u64, at_sigterm: u64| {
            stop(&stop_with(
                "drained",
                json!({"idle_closed": timers + at_sigterm}),
                json!({"drain_seconds": 5.9, "stream_rotation_seconds": 5.74,
                       "streams_ended_by_server":
                           {"on_their_timers": timers, "at_sigterm": at_sigterm}}),
            ))
        };
        let rode = ended(40, 0);
        assert_eq!(rode.level, Level::Good);
        assert_eq!(
            rode.text,
            "drained cleanly in 5.9 s: nothing lost (40 live streams ended on their own timers)"
        );
        let at_once = ended(0, 40);
        assert_eq!(at_once.level, Level::Good);
        assert_eq!(
            at_once.text,
            "drained cleanly in 5.9 s: nothing lost; its server ended 40 live streams at once right after SIGTERM (none cut: each client got its stream's end, and reconnects with the others at once): letting streams run to their own timers spreads the reconnects over up to 5.7 s"
        );
    }

    #[test]
    fn requests_reset_as_the_listener_closed_are_not_blamed_on_the_grace_period() {
        // A stream's request queued for accept() when the listener closed at SIGTERM: reset
        // by the close, 2 s before SIGKILL cut 28 live streams.
        let s = stop_with(
            "killed_at_deadline",
            json!({"inflight_cut": 1, "streams_cut": 28}),
            json!({
                "exit_code": 137, "exit_signal": 9, "grace_seconds": 2.0,
                "sigterm_at": "2026-01-01T00:00:10.000Z",
                "sigkill_at": "2026-01-01T00:00:12.000Z",
                "exit_at": "2026-01-01T00:00:12.001Z",
                "stream_rotation_seconds": 6.0,
                "listeners": [{"address": "0.0.0.0:8080",
                               "closed_at": "2026-01-01T00:00:10.002Z"}],
                "loss_events": [
                    {"at": "2026-01-01T00:00:10.003Z", "kind": "inflight_cut",
                     "open_seconds": 0.004},
                ],
            }),
        );
        let v = stop(&s);
        assert_eq!(v.level, Level::Bad);
        assert!(
            !v.text.contains("outlived the 2 s grace period"),
            "{}",
            v.text
        );
        assert_eq!(
            v.text,
            "1 request was cut as it closed its listener 0.002 s after SIGTERM (connections still queued for accept() are reset by the close): keep accepting until routing has moved, then close the listener; 28 live streams cut at SIGKILL: the 2 s grace period is shorter than the 6 s its server lets streams live: raise it to at least 8 s (that + 2 s)"
        );
        // A request cut at SIGKILL still outlived it.
        let mut both = s.clone();
        both.loss.inflight_cut = 2;
        both.loss_events.push(LossEventView {
            at: "2026-01-01T00:00:12.002Z".into(),
            kind: LossKind::InflightCut,
            open_seconds: Some(3.5),
            request_seconds: None,
        });
        assert!(
            stop(&both).text.starts_with(
                "1 request outlived the 2 s grace period: raise it above the slowest request (3.5 s seen); 1 request was cut as it closed its listener"
            ),
            "{}",
            stop(&both).text
        );
        // Drained: the close's cut is not one the exit made.
        let mut drained = s.clone();
        drained.outcome = Some(Outcome::Drained);
        drained.loss.streams_cut = 0;
        drained.drain_seconds = Some(2.0);
        assert_eq!(
            stop(&drained).text,
            "drained for 2 s; 1 request was cut as it closed its listener 0.002 s after SIGTERM (connections still queued for accept() are reset by the close): keep accepting until routing has moved, then close the listener"
        );
    }

    #[test]
    fn sessions_the_exit_cut_are_a_loss_with_their_own_fix() {
        // A Socket.IO server without a SIGTERM handler, killed at once, its clients back.
        let v = stop(&stop_with(
            "exit_at_once",
            json!({"sessions_cut": 1500, "idle_closed": 3}),
            json!({"exit_code": 143, "exit_signal": 15}),
        ));
        assert_eq!(v.level, Level::Bad);
        assert!(
            v.text.contains("; 1,500 clients lost their session when the process exited and came back at once: on SIGTERM, close sessions yourself over the grace period"),
            "{}",
            v.text
        );
        // A drain that left its sessions to the exit is not clean.
        let d = stop(&stop_with("drained", json!({"sessions_cut": 2}), json!({})));
        assert_eq!(d.level, Level::Bad);
        assert!(!d.text.contains("nothing lost"), "{}", d.text);
    }

    #[test]
    fn a_record_that_lost_events_says_it_may_be_incomplete() {
        let s = stop_with("drained", json!({}), json!({"events_lost": 12}));
        assert_eq!(stop(&s).level, Level::Warning);
        assert_eq!(
            stop(&s).text,
            "drained cleanly in 0.5 s: nothing lost; may be incomplete: 12 kernel events were lost on the way while it was open (drainwatch_events_lost_total)"
        );
    }

    #[test]
    fn a_record_whose_programs_faulted_says_it_may_be_incomplete() {
        let s = stop_with(
            "drained",
            json!({}),
            json!({"events_lost": 2, "ebpf_faults": 3}),
        );
        assert_eq!(stop(&s).level, Level::Warning);
        assert_eq!(
            stop(&s).text,
            "drained cleanly in 0.5 s: nothing lost; may be incomplete: 2 kernel events were lost on the way while it was open (drainwatch_events_lost_total); may be incomplete: the eBPF programs lost part of what it reads 3 times while it was open (drainwatch_ebpf_faults_total)"
        );
        let mut by_inode = StartView {
            listen_after_seconds: Some(1.0),
            netns_by_inode: true,
            ..Default::default()
        };
        assert!(
            !super::start(&by_inode).text.contains("by inode"),
            "nothing refused"
        );
        by_inode.loss.refused_before_listen = 3;
        assert!(
            super::start(&by_inode)
                .text
                .ends_with("some may be a stopped container's at the same address"),
            "{}",
            super::start(&by_inode).text
        );
        let start = StartView {
            ebpf_faults: 1,
            ..Default::default()
        };
        assert!(
            super::start(&start)
                .text
                .ends_with("the eBPF programs lost part of what it reads 1 time while it was open (drainwatch_ebpf_faults_total)"),
            "{}",
            super::start(&start).text
        );
    }

    #[test]
    fn routing_that_outlasts_the_listener_says_how_long_to_wait() {
        let s = stop_with(
            "listener_closed_early",
            json!({"refused": 6}),
            json!({"routing_lag_seconds": 3.8}),
        );
        let v = stop(&s);
        assert_eq!(v.level, Level::Bad);
        assert_eq!(
            v.text,
            "routing continued 3.8 s after SIGTERM and 6 connection attempts were refused: fail readiness on SIGTERM and wait ≥ 4 s before closing the listener"
        );
    }

    #[test]
    fn on_kubernetes_the_fix_names_the_prestop_hook() {
        let mut s = stop_with(
            "listener_closed_early",
            json!({"refused": 6}),
            json!({"routing_lag_seconds": 3.8, "prestop": false}),
        );
        assert!(
            stop(&s).text.ends_with(
                "fail readiness on SIGTERM and wait ≥ 4 s before closing the listener (or add a preStop hook that sleeps ≥ 4 s)"
            ),
            "{}",
            stop(&s).text
        );
        s.prestop = Some(true);
        assert!(
            stop(&s).text.contains(
                "refused: the preStop hook ended before routing moved: make it last ≥ 4 s longer, or fail readiness"
            ),
            "{}",
            stop(&s).text
        );
    }

    #[test]
    fn young_requests_on_kept_alive_connections_are_not_told_to_raise_the_grace_period() {
        // SIGTERM at 0 s, SIGKILL at 8 s: three requests 20-150 ms old on connections open
        // 9-11.1 s (the run: "raise it above the slowest request (11.1 s seen)").
        let cut = |open: f64, request: Option<f64>| {
            json!({"at": "2026-01-01T00:00:08.002Z", "kind": "inflight_cut",
                   "open_seconds": open, "request_seconds": request})
        };
        let killed = |events: Vec<Value>| {
            stop_with(
                "killed_at_deadline",
                json!({"inflight_cut": events.len()}),
                json!({
                    "exit_code": 137, "exit_signal": 9, "grace_seconds": 8.002,
                    "sigterm_at": "2026-01-01T00:00:00Z",
                    "sigkill_at": "2026-01-01T00:00:08.002Z",
                    "loss_events": events,
                }),
            )
        };
        let young = vec![
            cut(11.1, Some(0.15)),
            cut(10.4, Some(0.02)),
            cut(9.0, Some(0.09)),
        ];
        let v = stop(&killed(young.clone()));
        assert_eq!(v.level, Level::Bad);
        assert!(
            v.text.starts_with(
                "3 requests cut at SIGKILL had arrived after SIGTERM on keep-alive connections opened before it (the oldest 150 ms old, on connections open up to 11.1 s): the server never closed its keep-alive connections"
            ),
            "{}",
            v.text
        );
        assert!(v.text.contains("answer `Connection: close`"), "{}", v.text);
        assert!(!v.text.contains("raise it"), "{}", v.text);
        // One that arrived before SIGTERM did outlive it: by its own age (8.5 s), not its
        // connection's (20 s).
        let mut mixed = young.clone();
        mixed.push(cut(20.0, Some(8.5)));
        let v = stop(&killed(mixed));
        assert!(
            v.text.starts_with(
                "1 request outlived the 8 s grace period: raise it above the slowest request (8.5 s seen); 3 requests cut at SIGKILL had arrived after SIGTERM"
            ),
            "{}",
            v.text
        );
        // An agent that knew no request ages: the connection's, as before.
        let v = stop(&killed(vec![cut(11.1, None)]));
        assert!(
            v.text
                .starts_with("1 request outlived the 8 s grace period: raise it above the slowest request (11.1 s seen)"),
            "{}",
            v.text
        );
        // New connections accepted after SIGTERM: the listener, not keep-alive.
        let v = stop(&killed(vec![cut(0.5, Some(0.05))]));
        assert!(
            v.text
                .starts_with("1 request cut at SIGKILL had arrived after SIGTERM on connections accepted after it (the oldest 50 ms old)"),
            "{}",
            v.text
        );
    }

    #[test]
    fn requests_sent_on_connections_it_had_closed_are_a_loss_with_the_keep_alive_fix() {
        let s = stop_with(
            "drained",
            json!({"sent_after_close": 9, "idle_closed": 19}),
            json!({"drain_seconds": 0.4}),
        );
        let v = stop(&s);
        assert_eq!(v.level, Level::Bad);
        assert_eq!(
            v.text,
            "drained for 0.4 s; 9 requests reached keep-alive connections it had already closed and were reset (the server never saw them): answer `Connection: close` (or GOAWAY) while draining, close idle connections only after routing has moved, and give clients an idle timeout shorter than the server's"
        );
        // Idle closes alone cost nothing.
        let clean = stop_with("drained", json!({"idle_closed": 19}), json!({}));
        assert_eq!(stop(&clean).level, Level::Good);
    }

    #[test]
    fn requests_longer_than_the_grace_period_say_how_long_the_slowest_ran() {
        let s = stop_with(
            "killed_at_deadline",
            json!({"inflight_cut": 2}),
            json!({
                "exit_code": 137, "exit_signal": 9, "grace_seconds": 10.002,
                "loss_events": [
                    {"at": "2026-01-01T00:00:10Z", "kind": "inflight_cut", "open_seconds": 11.4},
                    {"at": "2026-01-01T00:00:10Z", "kind": "inflight_cut", "open_seconds": 12.04},
                    {"at": "2026-01-01T00:00:10Z", "kind": "refused", "open_seconds": null},
                ],
            }),
        );
        assert_eq!(
            stop(&s).text,
            "2 requests outlived the 10 s grace period: raise it above the slowest request (12 s seen)"
        );
        // The configured grace period wins over the observed one when the agent knows it.
        let mut configured = s.clone();
        configured.grace_configured_seconds = Some(30);
        assert!(stop(&configured).text.contains("the 30 s grace period"));
        // Nothing cut: it just did not exit.
        let idle = stop_with(
            "killed_at_deadline",
            json!({}),
            json!({"grace_seconds": 10.0}),
        );
        let v = stop(&idle);
        assert_eq!(v.level, Level::Warning);
        assert!(
            v.text
                .starts_with("did not exit within the 10 s grace period and was SIGKILLed"),
            "{}",
            v.text
        );
    }

    #[test]
    fn an_exit_zero_with_no_stop_signal_is_a_normal_exit_never_a_crash() {
        let done = stop_with("exited", json!({}), json!({"exit_code": 0}));
        let v = stop(&done);
        assert_eq!(v.level, Level::Good);
        assert_eq!(
            v.text,
            "exited with code 0 with no stop signal seen: a normal exit, not a crash"
        );
        // Right after the agent's restart: its SIGTERM may have come unseen.
        let gap = stop_with(
            "exited",
            json!({}),
            json!({"exit_code": 0, "complete": false,
                   "agent_gap": {"from": "t0", "to": "t1", "seconds": 1.7}}),
        );
        let v = stop(&gap);
        assert_eq!(v.level, Level::Warning);
        assert!(
            v.text.ends_with("may be incomplete: the agent was not watching for 1.7 s just before it exited: its stop signal may have come then, unseen (it restarted; agent_gap)"),
            "{}",
            v.text
        );
        let cut = stop_with(
            "exited",
            json!({"inflight_cut": 2}),
            json!({"exit_code": 0}),
        );
        let v = stop(&cut);
        assert_eq!(v.level, Level::Warning);
        assert!(v.text.contains("it cut 2 in-flight requests"), "{}", v.text);
        assert!(!v.text.contains("crash,"), "{}", v.text);
    }

    #[test]
    fn an_ignored_sigterm_is_named_and_the_fix_is_not_the_grace_period() {
        // The CRI lab's PID-1 server: the kernel dropped SIGTERM, 7 requests cut at SIGKILL,
        // the slowest 2.5 s old: the grace period is not what to change.
        let s = stop_with(
            "killed_at_deadline",
            json!({"inflight_cut": 7}),
            json!({
                "exit_code": 137, "exit_signal": 9, "grace_seconds": 5.0,
                "stop_signal_ignored": "pid1_without_handler",
                "loss_events": [
                    {"at": "2026-01-01T00:00:05Z", "kind": "inflight_cut", "open_seconds": 2.5},
                ],
            }),
        );
        let v = stop(&s);
        assert_eq!(v.level, Level::Bad);
        assert_eq!(
            v.text,
            "SIGTERM was ignored (PID 1 of its container without a handler): the kernel dropped it, the process served on through the 5 s grace period and was SIGKILLed, cutting 7 in-flight requests: handle SIGTERM in the server (stop accepting, finish in-flight work, exit), or run it under an init that forwards signals (tini, dumb-init; `--init`); a longer grace period changes nothing"
        );
        assert!(!v.text.contains("raise"), "{}", v.text);
        // Nothing cut: it only held the rollout up for the whole grace period.
        let idle = stop_with(
            "killed_at_deadline",
            json!({}),
            json!({"grace_seconds": 5.0, "stop_signal_ignored": "ignored_by_process"}),
        );
        let v = stop(&idle);
        assert_eq!(v.level, Level::Warning);
        assert!(v.text.contains("stop ignoring SIGTERM"), "{}", v.text);
    }

    #[test]
    fn no_handler_says_to_handle_sigterm_and_how_long_routing_took() {
        let s = stop_with(
            "exit_at_once",
            json!({"inflight_cut": 2, "refused": 6}),
            json!({"exit_code": 143, "exit_signal": 15, "routing_lag_seconds": 3.52}),
        );
        assert_eq!(
            stop(&s).text,
            "exited at once on the stop signal (exit signal 15, code 143), cutting 2 in-flight requests; routing continued 3.5 s after SIGTERM and 6 connection attempts were refused: handle SIGTERM: fail readiness, wait ≥ 4 s before closing the listener, finish in-flight work, then exit"
        );
        let quiet = stop_with(
            "exit_at_once",
            json!({"inflight_cut": 1}),
            json!({"exit_code": 143, "exit_signal": 15}),
        );
        assert_eq!(
            stop(&quiet).text,
            "exited at once on the stop signal (exit signal 15, code 143), cutting 1 in-flight request: handle SIGTERM: stop accepting, finish in-flight work, then exit"
        );
    }

    #[test]
    fn a_cut_at_exit_after_draining_is_reported_without_renaming_the_outcome() {
        let s = stop_with(
            "drained",
            json!({"inflight_cut": 1}),
            json!({"drain_seconds": 2.5}),
        );
        let v = stop(&s);
        assert_eq!(v.level, Level::Bad);
        assert_eq!(
            v.text,
            "drained for 2.5 s, then exited with 1 request still in flight: wait for in-flight work (and queued connections) before exiting"
        );
        let early = stop_with(
            "listener_closed_early",
            json!({"refused": 3, "inflight_cut": 2}),
            json!({"routing_lag_seconds": 2.4}),
        );
        assert_eq!(
            stop(&early).text,
            "routing continued 2.4 s after SIGTERM and 3 connection attempts were refused: fail readiness on SIGTERM and wait ≥ 3 s before closing the listener; exited with 2 requests still in flight: wait for in-flight work (and queued connections) before exiting"
        );
        let at_once = stop_with("exit_at_once", json!({}), json!({"drain_seconds": 0.2}));
        assert_eq!(
            stop(&at_once).text,
            "exited 0.2 s after the stop signal without closing its listener first (code 0): handle SIGTERM: stop accepting, finish in-flight work, then exit"
        );
    }

    #[test]
    fn failed_health_checks_are_named_apart_and_decide_nothing() {
        let s = stop_with(
            "drained",
            json!({"probes": {"refused": 2, "by_schedule": 2}}),
            json!({"drain_seconds": 2.5}),
        );
        let v = stop(&s);
        assert_eq!(v.level, Level::Good);
        assert_eq!(
            v.text,
            "drained cleanly in 2.5 s: nothing lost; 2 health checks failed (not users: the balancer or kubelet was still checking)"
        );
    }

    #[test]
    fn a_kill_without_a_stop_signal_says_to_stop_with_sigterm() {
        let s = stop_with(
            "exit_at_once",
            json!({"inflight_cut": 1}),
            json!({"sigterm_at": null, "sigkill_at": "2026-01-01T00:00:00Z", "exit_code": 137, "exit_signal": 9}),
        );
        assert_eq!(
            stop(&s).text,
            "killed by SIGKILL with no stop signal first: nothing could drain, 1 in-flight request cut: stop containers with SIGTERM and a grace period (a pod deletion, `podman stop`), not a kill; if the kernel killed it, raise its memory limit"
        );
    }

    #[test]
    fn retries_and_aborts_through_a_proxy_are_named() {
        let s = stop_with(
            "exit_at_once",
            json!({"inflight_cut": 3, "retry_duplicates": 2, "upstream_aborts": 1}),
            json!({"exit_code": 143, "exit_signal": 15}),
        );
        let text = stop(&s).text;
        assert!(
            text.ends_with("; a proxy re-sent 2 cut requests to another backend: clients saw success, the work ran twice; 1 cut request reached clients through a proxy as errors (502 or reset)"),
            "{text}"
        );
    }

    #[test]
    fn a_drain_is_good_unless_it_nearly_ran_out_of_grace() {
        let s = stop_with(
            "drained",
            json!({"accepted_after_sigterm": 4}),
            json!({"drain_seconds": 5.1, "routing_lag_seconds": 3.5}),
        );
        let v = stop(&s);
        assert_eq!(v.level, Level::Good);
        assert_eq!(
            v.text,
            "drained cleanly in 5.1 s: nothing lost (routing continued 3.5 s after SIGTERM)"
        );
        let mut tight = s.clone();
        tight.grace_configured_seconds = Some(6);
        let v = stop(&tight);
        assert_eq!(v.level, Level::Warning);
        assert!(
            v.text.ends_with(
                "but it used 5.1 s of the 6 s grace period: raise the grace period or drain faster"
            ),
            "{}",
            v.text
        );
    }

    #[test]
    fn a_stop_waiting_for_attempts_in_flight_says_so_and_one_missing_their_outcome_is_partial() {
        let settling = stop_with(
            "drained",
            json!({"unreachable": 2}),
            json!({"settled": false, "attempts_in_flight": 5}),
        );
        let v = stop(&settling);
        assert!(
            v.text.ends_with(
                "; settling: 5 connection attempts to its vanished address still in flight (the kernel gives up on an unanswered SYN later; attempts_in_flight): the counts may grow"
            ),
            "{}",
            v.text
        );
        let clean = stop_with(
            "drained",
            json!({}),
            json!({"settled": false, "attempts_in_flight": 1}),
        );
        assert_eq!(stop(&clean).level, Level::Pending, "loss may still come");
        let unresolved = stop_with(
            "drained",
            json!({}),
            json!({"settled": true, "complete": false, "attempts_unresolved": 1}),
        );
        let v = stop(&unresolved);
        assert_eq!(v.level, Level::Warning);
        assert!(
            v.text.ends_with(
                "may be incomplete: 1 connection attempt to its vanished address had no outcome within the kernel's SYN retry time (attempts_unresolved)"
            ),
            "{}",
            v.text
        );
    }

    #[test]
    fn a_crash_and_a_stop_in_progress() {
        let s = stop_with(
            "crashed",
            json!({"inflight_cut": 2}),
            json!({"exit_code": 1}),
        );
        assert_eq!(
            stop(&s).text,
            "exited with code 1 without a stop signal: a crash, not a deploy; it cut 2 in-flight requests"
        );
        let pending: StopView = view(json!({"outcome": null, "loss": {"refused": 1}}));
        let v = stop(&pending);
        assert_eq!(v.level, Level::Pending);
        assert_eq!(
            v.text,
            "stopping: no verdict until the process exits (0 in-flight cut, 1 refused so far)"
        );
    }

    #[test]
    fn a_gone_address_says_to_remove_the_endpoint_first() {
        let s = stop_with("drained", json!({"unreachable": 3}), json!({}));
        assert!(
            stop(&s)
                .text
                .ends_with("; 3 connection attempts found its address gone: remove the endpoint before the pod goes")
        );
    }

    #[test]
    fn a_storm_faster_than_the_accept_rate_says_how_wide_to_spread() {
        let s: StormView = view(json!({
            "clients": 2000, "seconds_to_95_percent": 1.1, "overflows": 0,
            "sustained_accept_rate": 480.3, "recommended_window_seconds": 4.164,
        }));
        let v = storm(&s);
        assert_eq!(v.level, Level::Warning);
        assert_eq!(
            v.text,
            "2,000 clients reconnected within 1.1 s against 480 connections/s: spread reconnects over ≥ 4.2 s"
        );
        let mut dropped = s.clone();
        dropped.overflows = 12;
        let v = storm(&dropped);
        assert_eq!(v.level, Level::Bad);
        assert!(
            v.text
                .ends_with("; 12 handshakes were dropped by a full accept queue (clients retry after a second or more)")
        );
    }

    #[test]
    fn a_storm_the_listener_kept_up_with_needs_nothing() {
        let s: StormView = view(json!({
            "clients": 100, "seconds_to_95_percent": 0.9, "overflows": 0,
            "sustained_accept_rate": null, "recommended_window_seconds": null,
        }));
        let v = storm(&s);
        assert_eq!(v.level, Level::Good);
        assert_eq!(
            v.text,
            "100 clients reconnected within 0.9 s and the accept queue never backed up: no change needed"
        );
        let spread: StormView = view(json!({
            "clients": 100, "seconds_to_95_percent": 3.0, "overflows": 0,
            "sustained_accept_rate": 50.0, "recommended_window_seconds": 2.0,
        }));
        assert_eq!(
            storm(&spread).text,
            "100 clients reconnected within 3 s, wider than the 2 s its 50 connections/s need: no change needed"
        );
    }
}
