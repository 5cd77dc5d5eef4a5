//! A reconnect storm on the page: arrivals per 100 ms against the accept capacity measured
//! while connections queued, the observed window (95% back) beside the recommended one, the
//! accept-path numbers, and the shared verdict.

use maud::{Markup, html};

use super::{
    px,
    text::Text,
    timeline::{Axis, GUTTER, PAD_RIGHT, W},
};
use crate::export::{
    format::{ceil_tenth, secs, thousands},
    verdict,
    view::StormView,
};

const TOP: f64 = 10.0;
const PLOT_H: f64 = 120.0;
const LEFT: f64 = GUTTER;
const RIGHT: f64 = W - PAD_RIGHT;

/// The chart's scales: seconds since the first arrival → x, arrivals per 100 ms → y.
struct Scale {
    hi: f64,
    ymax: f64,
}

impl Scale {
    fn x(&self, t: f64) -> f64 {
        LEFT + t / self.hi * (RIGHT - LEFT)
    }

    fn y(&self, c: f64) -> f64 {
        TOP + PLOT_H - c / self.ymax * PLOT_H
    }
}

/// A window under the chart: its bar, its label beside the bar, or inside it when the bar
/// reaches the right edge.
fn window(sc: &Scale, class: &str, wy: f64, until: f64, label: String) -> Markup {
    let xe = sc.x(until);
    let width = label.chars().count() as f64 * 6.4;
    let (lx, anchor, on) = if xe + 6.0 + width < RIGHT {
        (xe + 6.0, "start", "")
    } else {
        (xe - 6.0, "end", " on-drain")
    };
    html! {
        rect class={ "win " (class) } x=(LEFT) y=(px(wy)) width=(px((xe - LEFT).max(2.0)))
            height="13" rx="2" {}
        text class={ "band-label" (on) } x=(px(lx)) y=(px(wy + 10.5)) text-anchor=(anchor) {
            (label)
        }
    }
}

fn chart(st: &StormView) -> Markup {
    let buckets = &st.arrivals_per_100ms;
    let observed = st.seconds_to_95_percent;
    let recommended = st.recommended_window_seconds;
    let dur = buckets.len() as f64 * 0.1;
    let hi = dur.max(observed).max(recommended.unwrap_or(0.0)).max(0.5) * 1.04;
    let per_bucket_rate = st.sustained_accept_rate.map(|r| r / 10.0);
    let ymax = (buckets.iter().copied().max().unwrap_or(1) as f64)
        .max(per_bucket_rate.unwrap_or(0.0))
        .max(1.0)
        * 1.15;
    let sc = Scale { hi, ymax };
    let height = TOP + PLOT_H + 70.0;
    let ytop = px(sc.y(ymax / 1.15));
    let bw = (sc.x(0.1) - sc.x(0.0)).max(1.0);
    let (step, _) = Axis {
        lo: 0.0,
        hi,
        left: LEFT,
        right: RIGHT,
    }
    .ticks();
    let mut ticks = Vec::new();
    let mut t = 0.0;
    while t <= hi + 1e-9 {
        ticks.push(t);
        t += step;
    }
    let wy = TOP + PLOT_H + 10.0;
    html! {
        svg class="storm-chart" viewBox={ "0 0 " (W) " " (format!("{height:.0}")) } role="img"
            aria-label="reconnect storm" {
            rect class="lane" x=(LEFT) y=(TOP) width=(px(RIGHT - LEFT)) height=(PLOT_H) rx="3" {}
            text class="lane-label" x=(px(LEFT - 8.0)) y=(px(TOP + 14.0)) { "arrivals" }
            text class="lane-sub" x=(px(LEFT - 8.0)) y=(px(TOP + 27.0)) { "per 100 ms" }
            line class="tick" x1=(LEFT) y1=(ytop) x2=(px(RIGHT)) y2=(ytop) {}
            text class="tick-label" x=(px(LEFT + 4.0)) y=(px(sc.y(ymax / 1.15) - 3.0))
                text-anchor="start" { ((ymax / 1.15).round()) }
            @for (i, n) in buckets.iter().enumerate() {
                @let t = i as f64 * 0.1;
                @let c = f64::from(*n);
                rect class={ "bar" @if per_bucket_rate.is_some_and(|r| c > r) { " over" } }
                    x=(px(sc.x(t) + 0.5)) y=(px(sc.y(c))) width=(px((bw - 1.0).max(0.8)))
                    height=(px((TOP + PLOT_H - sc.y(c)).max(0.0))) {
                    title { (n) " arrivals at +" (format!("{t:.1}")) " s" }
                }
            }
            @if let (Some(r), Some(rate)) = (per_bucket_rate, st.sustained_accept_rate) {
                @let yr = px(sc.y(r));
                line class="rate" x1=(LEFT) y1=(yr) x2=(px(RIGHT)) y2=(yr) {}
                text class="band-label rate-label" x=(px(RIGHT - 4.0)) y=(px(sc.y(r) - 4.0))
                    text-anchor="end" { "capacity " (thousands(rate.round() as u64)) " connections/s" }
            }
            (window(&sc, "observed", wy, observed, format!("95% back in {} s", secs(observed))))
            @if let Some(r) = recommended {
                (window(&sc, "recommended", wy + 18.0, r,
                    format!("recommended window ≥ {} s", secs(ceil_tenth(r)))))
            }
            @for t in ticks {
                text class="tick-label" x=(px(sc.x(t))) y=(px(height - 6.0)) { "+" (secs(t)) " s" }
            }
        }
    }
}

pub(super) fn article(st: &StormView) -> Markup {
    let v = verdict::storm(st);
    let lvl = v.level.as_str();
    let q = |x: Option<f64>| x.map_or("–".into(), |x| format!("{} s", secs(x)));
    let peak = thousands(st.peak_arrivals_per_second.round() as u64);
    html! {
        article class="storm" data-storm-stop-id=(Text(&st.stop_id)) data-port=(st.port)
            data-clients=(st.clients) {
            "\n"
            h3 {
                span class={ "badge " (lvl) } { "reconnect storm" }
                span class="cname" { (Text(&st.container)) }
                span class="cmeta" { "port " (st.port) " · after stop " (Text(&st.stop_id)) }
            }
            "\n"
            p class={ "verdict " (lvl) } data-level=(lvl) { (v.text) }
            "\n"
            (chart(st))
            "\n"
            div class="facts" {
                dl {
                    div {
                        dt { "clients" }
                        dd {
                            (thousands(st.clients))
                            @if st.connections > st.clients {
                                " (" (thousands(st.connections)) " connections)"
                            }
                            @if let Some(s) = st.first_attempts_seconds {
                                " · first connections over " (secs(s)) " s"
                            }
                        }
                    }
                    div { dt { "peak" } dd { (peak) " arrivals/s" } }
                    div {
                        dt { "accept queue" }
                        dd {
                            "max " (st.max_queue_depth) " waiting · " (st.overflows) " overflowed"
                        }
                    }
                    div {
                        dt { "accept wait" }
                        dd {
                            "p50 " (q(st.accept_wait_p50_seconds))
                            " · p95 " (q(st.accept_wait_p95_seconds))
                            " · max " (q(st.accept_wait_max_seconds))
                        }
                    }
                }
            }
            "\n"
        }
        "\n"
    }
}
