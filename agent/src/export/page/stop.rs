//! One stop on the page: an `<article>` carrying the API's data for machines (`data-*`), its
//! heading (outcome badge, container, pod), the shared verdict, the timeline and the facts
//! under it (times relative to the stop signal, what the pod spec allowed, the loss).

use maud::{Markup, html};

use super::{deploys::chips, text::Text, timeline};
use crate::{
    export::{
        format::{count, epoch, hms, rel, secs, signal_name},
        verdict::{self, Level},
        view::StopView,
    },
    model::{LossKind, stop::Outcome, streams::LifetimeShape},
};

pub(super) fn outcome_level(outcome: Option<Outcome>) -> Level {
    match outcome {
        None => Level::Pending,
        Some(Outcome::Drained | Outcome::Exited) => Level::Good,
        Some(_) => Level::Bad,
    }
}

pub(super) fn outcome_label(outcome: Option<Outcome>) -> String {
    outcome.map_or("stopping".into(), |o| o.as_str().replace('_', " "))
}

/// The moment a stop's times are relative to: the stop signal, else the exit.
pub(super) fn origin(stop: &StopView) -> Option<f64> {
    let at = |t: &Option<String>| t.as_deref().and_then(epoch);
    at(&stop.sigterm_at).or_else(|| at(&stop.exit_at))
}

fn or_empty(t: &Option<String>) -> &str {
    t.as_deref().unwrap_or("")
}

pub(super) fn article(stop: &StopView) -> Markup {
    let v = verdict::stop(stop);
    let c = &stop.container;
    let id12: String = c.id.chars().take(12).collect();
    let listener_closed = stop
        .listeners
        .iter()
        .filter_map(|l| l.closed_at.as_deref())
        .min()
        .unwrap_or("");
    let num = |x: Option<f64>| x.map_or(String::new(), |x| x.to_string());
    let level = outcome_level(stop.outcome);
    html! {
        article class="stop" id={ "stop-" (Text(&stop.id)) } data-stop-id=(Text(&stop.id))
            data-container-id=(Text(&c.id)) data-outcome=(stop.outcome.map_or("", Outcome::as_str))
            data-sigterm-at=(or_empty(&stop.sigterm_at))
            data-sigkill-at=(or_empty(&stop.sigkill_at))
            data-exit-at=(or_empty(&stop.exit_at))
            data-cgroup-removed-at=(or_empty(&stop.cgroup_removed_at))
            data-listener-closed-at=(listener_closed) data-drain-seconds=(num(stop.drain_seconds))
            data-routing-lag-seconds=(num(stop.routing_lag_seconds))
            data-loss-events=(stop.loss_events.len()) {
            "\n"
            h3 {
                span class={ "badge " (level.as_str()) } { (outcome_label(stop.outcome)) }
                span class="cname" { (Text(&c.name)) }
                span class="cmeta" {
                    (Text(&c.runtime)) " " (Text(&id12))
                    @if !c.pod.is_empty() {
                        " · pod "
                        @if !c.namespace.is_empty() { (Text(&c.namespace)) "/" }
                        (Text(&c.pod))
                        @if !c.node.is_empty() { " on " (Text(&c.node)) }
                    }
                }
            }
            "\n"
            p class={ "verdict " (v.level.as_str()) } data-level=(v.level.as_str()) { (v.text) }
            "\n"
            (timeline::svg(stop))
            (facts(stop))
        }
        "\n"
    }
}

/// The facts under a stop's timeline, with times relative to the stop signal.
fn facts(stop: &StopView) -> Markup {
    let origin = origin(stop);
    let at = |t: &Option<String>| -> Option<String> {
        let raw = t.as_deref()?;
        let t = epoch(raw)?;
        Some(match origin {
            Some(o) => rel(t - o),
            None => hms(raw).to_string(),
        })
    };
    let mut rows: Vec<(&str, Markup)> = Vec::new();
    if let Some(t) = &stop.sigterm_at {
        let (comm, pid) = stop
            .sigterm_sender
            .as_ref()
            .map_or(("", 0), |s| (s.comm.as_str(), s.pid));
        let open = stop.connections_at_sigterm.unwrap_or(0);
        rows.push((
            "stop signal",
            html! {
                (hms(t)) " UTC from " (Text(comm)) " (pid " (pid) ") · "
                (count(open, "connection", "connections")) " open"
                @if let Some(why) = stop.stop_signal_ignored {
                    " · ignored by the kernel: " (why.words())
                }
            },
        ));
    }
    if let Some(last) = at(&stop.last_accept_at) {
        rows.push(("last accepted", html! { (last) }));
    }
    for l in &stop.listeners {
        let when = l
            .closed_at
            .as_deref()
            .and_then(epoch)
            .zip(origin)
            .map_or("still open".into(), |(t, o)| {
                format!("closed {}", rel(t - o))
            });
        rows.push(("listener", html! { (Text(&l.address)) " " (when) }));
    }
    if let Some(k) = at(&stop.sigkill_at) {
        rows.push(("SIGKILL", html! { (k) }));
    }
    if let Some(e) = at(&stop.exit_at) {
        let code = stop.exit_code.map_or("?".to_string(), |c| c.to_string());
        let how = match stop.exit_signal {
            Some(sig) => format!("killed by {} (code {code})", signal_name(sig)),
            None => format!("code {code}"),
        };
        let open = stop.connections_at_exit.unwrap_or(0);
        rows.push((
            "exit",
            html! {
                (e) " · " (how) " · " (count(open, "connection", "connections")) " still open"
            },
        ));
    }
    // What the pod spec allowed (Kubernetes API), when known.
    if let Some(g) = stop.grace_configured_seconds {
        rows.push(("grace period", html! { (g) " s configured" }));
    }
    if let Some(l) = &stop.stream_lifetimes {
        let text = if l.shape == LifetimeShape::Fixed {
            format!("{} s, fixed", secs(l.p95_seconds))
        } else {
            format!(
                "median {} s, 95th percentile {} s, longest {} s ({})",
                secs(l.p50_seconds),
                secs(l.p95_seconds),
                secs(l.max_seconds),
                l.shape.as_str()
            )
        };
        let from = count(u64::from(l.streams), "stream", "streams");
        rows.push((
            "stream lifetimes",
            html! { (text) " (learned from " (from) " its server ended itself)" },
        ));
    } else if let Some(r) = stop.stream_rotation_seconds {
        rows.push(("stream lifetimes", html! { "up to " (secs(r)) " s" }));
    }
    let ended = stop.streams_ended_by_server;
    if ended.on_their_timers + ended.at_sigterm > 0 {
        rows.push((
            "streams ended",
            html! {
                (ended.on_their_timers) " on their own timers · " (ended.at_sigterm)
                " at once after the stop signal (by its server, none cut)"
            },
        ));
    }
    if let Some(p) = stop.prestop {
        rows.push(("preStop hook", html! { (if p { "yes" } else { "none" }) }));
    }
    if let Some(d) = stop.drain_seconds {
        let text = match stop.grace() {
            Some(g) if g > 0.0 => format!(
                "{} s of {} s grace ({:.0}%)",
                secs(d),
                secs(g),
                (d / g * 100.0).min(999.0)
            ),
            _ => format!("{} s", secs(d)),
        };
        rows.push(("drain", html! { (text) }));
    }
    if let Some(r) = stop.routing_lag_seconds {
        rows.push((
            "routing lag",
            html! { (secs(r)) " s after the stop signal" },
        ));
    }
    if let Some(c) = at(&stop.cgroup_removed_at) {
        rows.push(("cgroup removed", html! { (c) }));
    }
    if let Some(c) = at(&stop.sandbox_stopped_at) {
        rows.push(("pod sandbox", html! { "stopped " (c) }));
    }
    let resets = &stop.loss.resets_sent;
    if stop.loss.get(LossKind::ResetsSent) > 0 {
        rows.push((
            "resets sent",
            html! {
                @for (i, (reason, n)) in resets.iter().enumerate() {
                    @if i > 0 { ", " }
                    (n) " " (Text(reason))
                }
            },
        ));
    }
    html! {
        div class="facts" {
            div class="loss" { (chips(&stop.loss)) }
            dl {
                @for (k, v) in rows {
                    div { dt { (k) } dd { (v) } }
                }
            }
        }
        "\n"
    }
}
