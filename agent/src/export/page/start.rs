//! One start on the page: an `<article>` with the API's data for machines (`data-*`), its
//! heading, the shared verdict, a timeline from the start to the first listen with every
//! refused request where it happened, and the facts (times relative to the start).

use maud::{Markup, html};

use super::{px, text::Text};
use crate::export::{
    format::{epoch, hms, rel, thousands},
    verdict,
    view::StartView,
};

const WIDTH: f64 = 960.0;
const LEFT: f64 = 20.0;
const RIGHT: f64 = 30.0;

pub(super) fn article(s: &StartView) -> Markup {
    let v = verdict::start(s);
    let c = &s.container;
    let id12: String = c.id.chars().take(12).collect();
    let what = if s.restart { "restart" } else { "start" };
    html! {
        article class="start" id={ "start-" (Text(&s.id)) } data-start-id=(Text(&s.id))
            data-container-id=(Text(&c.id)) data-started-at=(Text(&s.started_at))
            data-first-listen-at=(Text(s.first_listen_at.as_deref().unwrap_or("")))
            data-refused-before-listen=(s.loss.refused_before_listen) {
            "\n"
            h3 {
                span class={ "badge " (v.level.as_str()) } { (what) }
                span class="cname" { (Text(&c.name)) }
                span class="cmeta" {
                    (Text(&c.runtime)) " " (Text(&id12))
                    @if !c.pod.is_empty() {
                        " · pod "
                        @if !c.namespace.is_empty() { (Text(&c.namespace)) "/" }
                        (Text(&c.pod))
                    }
                }
            }
            "\n"
            p class={ "verdict " (v.level.as_str()) } data-level=(v.level.as_str()) { (v.text) }
            "\n"
            (timeline(s))
            (facts(s))
        }
    }
}

/// Seconds after the start of an API time.
fn after(s: &StartView, t: &str) -> Option<f64> {
    Some(epoch(t)? - epoch(&s.started_at)?)
}

fn timeline(s: &StartView) -> Markup {
    let listen = s.first_listen_at.as_deref().and_then(|t| after(s, t));
    let accept = s.first_accept_at.as_deref().and_then(|t| after(s, t));
    let refused: Vec<f64> = s.refused_at.iter().filter_map(|t| after(s, t)).collect();
    let last = refused.iter().copied().fold(0.0f64, f64::max);
    let span = listen
        .unwrap_or(0.0)
        .max(accept.unwrap_or(0.0))
        .max(last)
        .max(1.0)
        * 1.1;
    let x = |t: f64| LEFT + (t.max(0.0) / span) * (WIDTH - LEFT - RIGHT);
    html! {
        svg class="timeline" viewBox={ "0 0 " (WIDTH) " 64" } role="img"
            aria-label="start timeline: refused connects before the first listen" {
            rect class="lane" x=(px(LEFT)) y="18" width=(px(WIDTH - LEFT - RIGHT)) height="22" rx="3" {}
            line class="marker m-term" x1=(px(x(0.0))) x2=(px(x(0.0))) y1="12" y2="46" {}
            text class="marker-label" x=(px(x(0.0))) y="10" { tspan class="m-term" { "started" } }
            @if let Some(l) = listen {
                line class="marker m-listener" x1=(px(x(l))) x2=(px(x(l))) y1="12" y2="46" {}
                text class="marker-label" x=(px(x(l))) y="10" text-anchor="middle" {
                    tspan class="m-listener" { "listen +" (rel(l)) }
                }
            }
            @if let Some(a) = accept {
                circle class="g-accept" cx=(px(x(a))) cy="29" r="3" {}
            }
            @for t in &refused {
                circle class="g-refused" cx=(px(x(*t))) cy="29" r="4" {}
            }
            text class="tick-label" x=(px(WIDTH - RIGHT)) y="58" { "+" (rel(span)) }
        }
    }
}

fn facts(s: &StartView) -> Markup {
    let rel_of = |t: &Option<String>| t.as_deref().and_then(|t| after(s, t)).map(rel);
    let ports: Vec<String> = s.ports.iter().map(u16::to_string).collect();
    html! {
        div class="facts" {
            div class="loss" {
                @if s.loss.refused_before_listen > 0 {
                    span class="chip refused" data-loss="refused_before_listen" {
                        b { (thousands(s.loss.refused_before_listen)) } " refused before listen"
                    }
                } @else {
                    span class="chip none" { "nothing refused" }
                }
                @if s.loss.probes.refused > 0 {
                    span class="chip probe" data-loss="probes" {
                        b { (thousands(s.loss.probes.refused)) }
                        (if s.loss.probes.refused == 1 { " health check" } else { " health checks" })
                        " refused (normal while starting)"
                    }
                }
            }
            dl {
                div { dt { "started" } dd { (hms(&s.started_at)) " UTC" } }
                div { dt { "first listen" } dd { (rel_of(&s.first_listen_at).unwrap_or_else(|| "not yet".into())) } }
                div { dt { "first accept" } dd { (rel_of(&s.first_accept_at).unwrap_or_else(|| "not yet".into())) } }
                @if !ports.is_empty() {
                    div { dt { "ports" } dd { (ports.join(", ")) } }
                }
            }
        }
    }
}
