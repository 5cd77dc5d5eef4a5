//! The page's `<main>`: an overview line with the legend, then one collapsible section per
//! deploy (its badge, workload, loss chips, its stops and the storms that followed them), and
//! the storms whose stop is no longer listed.

use maud::{Markup, html};

use super::{
    OPEN_DEPLOYS, glyphs, overview, start,
    stop::{self, outcome_label, outcome_level},
    storm,
    text::Text,
};
use crate::{
    export::{
        format::{count, date_time, thousands},
        verdict::Level,
        view::{DeployView, LossView, StartView, StopView, StormView},
    },
    model::{LossKind, stop::Outcome},
};

/// Loss chips: one per non-zero kind, each with its field name for machines.
pub(super) fn chips(loss: &LossView) -> Markup {
    let shown: Vec<_> = LossKind::ALL
        .iter()
        .filter_map(|k| Some((loss.get(*k), k.as_str(), k.info().words, k.info().chip?)))
        .filter(|(n, ..)| *n > 0)
        .collect();
    html! {
        @for (n, field, label, class) in &shown {
            span class={ "chip " (class) } data-loss=(field) { b { (thousands(*n)) } " " (label) }
        }
        @if shown.is_empty() {
            span class="chip none" { "nothing lost" }
        }
        (probe_chip(loss))
    }
}

/// Failed health checks, apart from the loss: evidence that the balancer (or the kubelet) was
/// still checking, and how many were told apart by the balancer's learned schedule.
fn probe_chip(loss: &LossView) -> Markup {
    let p = &loss.probes;
    let failed = p.cut + p.refused + p.unreachable;
    html! {
        @if failed > 0 {
            span class="chip probe" data-loss="probes"
                title="connections of the kubelet or of a balancer's active checks: not users" {
                b { (thousands(failed)) } " "
                (if failed == 1 { "health check failed" } else { "health checks failed" })
                @if p.by_schedule > 0 {
                    " (" (thousands(p.by_schedule)) " told apart by the balancer's check schedule)"
                }
            }
        }
    }
}

/// The worst outcome of a deploy, for its badge: pending, then bad, then good.
fn badge(d: &DeployView) -> (Level, String) {
    if d.in_progress > 0 {
        return (Level::Pending, format!("{} stopping", d.in_progress));
    }
    for o in Outcome::ALL {
        if let Some(c) = d.outcomes.get(&o) {
            let label = outcome_label(Some(o));
            let label = if d.outcomes.len() > 1 || *c > 1 {
                format!("{c} {label}")
            } else {
                label
            };
            return (outcome_level(Some(o)), label);
        }
    }
    if d.refused_before_listen > 0 {
        return (Level::Bad, "refused while starting".into());
    }
    (Level::Good, "started".into())
}

/// Each storm goes under the first deploy it belongs to: the one the API names, or else the
/// one holding its stop. The rest are orphans.
fn storms_by_deploy<'a>(
    deploys: &[DeployView],
    storms: &'a [StormView],
) -> (Vec<Vec<&'a StormView>>, Vec<&'a StormView>) {
    let mut shown = vec![false; storms.len()];
    let by_deploy = deploys
        .iter()
        .map(|d| {
            let mut ours = Vec::new();
            for (j, st) in storms.iter().enumerate() {
                let belongs = match &st.deploy_id {
                    Some(dep) => *dep == d.id,
                    None => d.stops.contains(&st.stop_id),
                };
                if belongs && !shown[j] {
                    shown[j] = true;
                    ours.push(st);
                }
            }
            ours
        })
        .collect();
    let orphans = storms
        .iter()
        .zip(&shown)
        .filter(|(_, shown)| !**shown)
        .map(|(st, _)| st)
        .collect();
    (by_deploy, orphans)
}

/// One deploy's section: summary line, then its stops, starts and storms.
fn deploy(
    i: usize,
    d: &DeployView,
    (stops, starts): (&[StopView], &[StartView]),
    storms: &[&StormView],
) -> Markup {
    let (level, badge) = badge(d);
    let open = i < OPEN_DEPLOYS || d.in_progress > 0;
    let mine_stops: Vec<&StopView> = d
        .stops
        .iter()
        .filter_map(|id| stops.iter().find(|s| s.id == *id))
        .collect();
    let mine_starts: Vec<&StartView> = d
        .starts
        .iter()
        .filter_map(|id| starts.iter().find(|s| s.id == *id))
        .collect();
    html! {
        details class={ "deploy " (level.as_str()) } data-key=(Text(&d.id))
            data-stops=(d.stops.len()) data-in-progress=(d.in_progress) open[open] {
            "\n"
            summary {
                span class={ "badge " (level.as_str()) } { (badge) }
                span class="workload" { (Text(&d.workload)) }
                @for x in [&d.workload_kind, &d.namespace] {
                    @if !x.is_empty() { span class="ns" { (Text(x)) } }
                }
                span class="when" {
                    (date_time(&d.started_at)) " UTC · "
                    (count(d.stops.len() as u64, "stop", "stops"))
                    @if !d.starts.is_empty() {
                        " · " (count(d.starts.len() as u64, "start", "starts"))
                    }
                    @if !d.revisions.is_empty() {
                        " · replaced revision " (Text(&d.revisions.join(", ")))
                    }
                }
                span class="chips" {
                    (chips(&d.loss))
                    @if d.refused_before_listen > 0 {
                        span class="chip refused" data-loss="refused_before_listen" {
                            b { (thousands(d.refused_before_listen)) } " refused before listen"
                        }
                    }
                }
            }
            "\n"
            @if let Some(chart) = overview::chart(&mine_stops, &mine_starts) { (chart) }
            @for s in &mine_stops { (stop::article(s)) }
            @for s in &mine_starts { (start::article(s)) }
            @for st in storms { (storm::article(st)) }
        }
        "\n"
    }
}

/// `<main>`, which the page's script swaps in place when the data changes.
pub(super) fn main(
    deploys: &[DeployView],
    stops: &[StopView],
    starts: &[StartView],
    storms: &[StormView],
) -> Markup {
    if deploys.is_empty() {
        return html! {
            main id="main" {
                "\n"
                section class="empty" {
                    h2 { "No container stops seen yet" }
                    p {
                        "Every container this agent sees stop (a rolling deploy, "
                        code { "podman stop" }
                        ", a crash) shows up here with what it cost: stop one, or run "
                        code { "cargo xtask demo" } " to see every failure mode."
                    }
                }
                "\n"
            }
        };
    }
    let total_stops: usize = deploys.iter().map(|d| d.stops.len()).sum();
    let (by_deploy, orphans) = storms_by_deploy(deploys, storms);
    html! {
        main id="main" {
            "\n"
            div class="overview" {
                span {
                    (count(deploys.len() as u64, "deploy", "deploys")) " · "
                    (count(total_stops as u64, "container stop", "container stops"))
                    @if !storms.is_empty() {
                        " · " (count(storms.len() as u64, "reconnect storm", "reconnect storms"))
                    }
                }
                (glyphs::legend())
            }
            @for (i, (d, storms)) in deploys.iter().zip(&by_deploy).enumerate() {
                (deploy(i, d, (stops, starts), storms))
            }
            @if !orphans.is_empty() {
                details class="deploy good" data-key="storms" open {
                    summary {
                        span class="workload" { "Reconnect storms" }
                        span class="when" { "after stops no longer listed" }
                    }
                    @for st in &orphans { (storm::article(st)) }
                }
                "\n"
            }
        }
    }
}
