//! A stop's timeline as inline SVG: three lanes (connections routed to it, the process, the
//! loss) on one axis of seconds from the stop signal, with the grace band, the drain, the
//! routing lag, one glyph per loss event and labelled markers (SIGTERM, listener closed,
//! SIGKILL, exit, cgroup removed) whose labels never overlap.

use maud::{Markup, html};

use super::{
    glyphs::{Glyph, glyph},
    px,
    stop::{origin, outcome_level},
};
use crate::{
    export::{
        format::{epoch, rel, secs, signal_name, thousands},
        view::StopView,
    },
    model::LossKind,
};

/// The width of the page's charts, their left gutter (lane labels) and right margin.
pub(super) const W: f64 = 960.0;
pub(super) const GUTTER: f64 = 112.0;
pub(super) const PAD_RIGHT: f64 = 28.0;
const LABEL_ROW: f64 = 15.0;
const LABEL_ROWS: usize = 3;

/// Geometry of a time axis: seconds → x in the SVG.
pub(super) struct Axis {
    pub lo: f64,
    pub hi: f64,
    pub left: f64,
    pub right: f64,
}

impl Axis {
    fn x(&self, t: f64) -> f64 {
        let t = t.clamp(self.lo, self.hi);
        self.left + (t - self.lo) / (self.hi - self.lo) * (self.right - self.left)
    }

    /// Tick positions: a round step giving at most ten ticks.
    pub(super) fn ticks(&self) -> (f64, Vec<f64>) {
        let span = self.hi - self.lo;
        let steps = [
            0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0,
            30.0, 60.0, 120.0, 300.0, 600.0,
        ];
        let step = steps
            .into_iter()
            .find(|s| span / s <= 10.0)
            .unwrap_or(1200.0);
        let mut t = (self.lo / step).ceil() * step;
        let mut out = Vec::new();
        while t <= self.hi + 1e-9 && out.len() < 40 {
            out.push(t);
            t += step;
        }
        (step, out)
    }
}

/// A vertical marker on the timeline: when, its label, its class.
struct Marker {
    at: f64,
    label: String,
    class: &'static str,
}

/// What the timeline draws, in seconds from its origin (the stop signal, else the exit).
struct Moments {
    has_term: bool,
    exit: Option<f64>,
    kill: Option<f64>,
    cgroup: Option<f64>,
    /// Its pod's sandbox ended.
    sandbox: Option<f64>,
    lag: Option<f64>,
    grace: Option<f64>,
    closes: Vec<f64>,
    events: Vec<(f64, LossKind)>,
    last_accept: Option<f64>,
}

/// The lanes' vertical layout, top to bottom.
const TOP: f64 = LABEL_ROWS as f64 * LABEL_ROW + 6.0;
const LANE_H: f64 = 30.0;
/// The routed lane is taller: its band's label sits under the glyphs.
const TRAFFIC_H: f64 = 40.0;
const GAP: f64 = 8.0;
const TRAFFIC_Y: f64 = TOP;
const PROCESS_Y: f64 = TRAFFIC_Y + TRAFFIC_H + GAP;
const LOSS_Y: f64 = PROCESS_Y + LANE_H + GAP;
const BOTTOM: f64 = LOSS_Y + LANE_H;
const GLYPH_Y: f64 = TRAFFIC_Y + 13.0;

/// "3 cut, 1 streams cut": the counts of the timeline's kinds `row` takes, in display order.
fn count_kinds(events: &[(f64, LossKind)], row: impl Fn(LossKind) -> bool) -> String {
    let mut parts = Vec::new();
    for k in LossKind::ALL.iter().filter(|k| k.on_timeline() && row(**k)) {
        let c = events.iter().filter(|e| e.1 == *k).count();
        if c > 0 {
            parts.push(format!("{c} {}", k.info().short));
        }
    }
    parts.join(", ")
}

fn count_routed(events: &[(f64, LossKind)]) -> String {
    count_kinds(events, |k| k.is_routed() || k.is_probe())
}

fn count_lost(events: &[(f64, LossKind)]) -> String {
    count_kinds(events, |k| !k.is_routed() && !k.is_probe())
}

/// The timeline of a stop; empty when it has neither a stop signal nor an exit.
pub(super) fn svg(stop: &StopView) -> Markup {
    let Some(origin) = origin(stop) else {
        return html! {};
    };
    let rel_of = |t: &Option<String>| Some(epoch(t.as_deref()?)? - origin);
    let m = Moments {
        has_term: stop.sigterm_at.is_some(),
        exit: rel_of(&stop.exit_at),
        kill: rel_of(&stop.sigkill_at),
        cgroup: rel_of(&stop.cgroup_removed_at),
        sandbox: rel_of(&stop.sandbox_stopped_at),
        lag: stop.routing_lag_seconds,
        grace: stop.grace(),
        closes: stop
            .listeners
            .iter()
            .filter_map(|l| rel_of(&l.closed_at))
            .collect(),
        events: stop
            .loss_events
            .iter()
            .filter_map(|e| Some((epoch(&e.at)? - origin, e.kind)))
            .collect(),
        last_accept: rel_of(&stop.last_accept_at),
    };

    // The domain: everything that happened, from a little before the stop signal.
    let mut times: Vec<f64> = vec![0.0];
    times.extend(m.exit);
    times.extend(m.kill);
    times.extend(m.cgroup);
    times.extend(m.sandbox);
    times.extend(m.lag);
    times.extend(m.closes.iter().copied());
    times.extend(m.events.iter().map(|e| e.0));
    let mut hi = times.iter().copied().fold(0.0, f64::max);
    let mut lo = times.iter().copied().fold(0.0, f64::min);
    // A grace period that ends not far beyond the rest is drawn whole; a long one runs off the
    // right edge rather than squashing what happened.
    let grace_whole = m.grace.is_some_and(|g| g <= (hi * 1.6).max(1.0));
    if let Some(g) = m.grace.filter(|_| grace_whole) {
        hi = hi.max(g);
    }
    // The last accept before the signal, if it was recent, shows how busy it was.
    let accept_shown = m
        .last_accept
        .filter(|a| *a < 0.0 && *a >= -hi.max(0.05) * 0.25);
    if let Some(a) = accept_shown {
        lo = lo.min(a);
    }
    let span = (hi - lo).max(0.5);
    let axis = Axis {
        lo: lo - span * 0.04,
        hi: hi + span * 0.06,
        left: GUTTER,
        right: W - PAD_RIGHT,
    };
    let height = BOTTOM + 24.0;
    let level = outcome_level(stop.outcome);
    html! {
        svg class="timeline" viewBox={ "0 0 " (W) " " (format!("{height:.0}")) } role="img"
            aria-label="stop timeline" {
            (lanes(&m.events))
            (ticks(&axis))
            (process(&axis, &m, grace_whole, level.as_str()))
            (routed(&axis, m.lag, accept_shown))
            (events(&axis, &m.events))
            @if stop.loss_events_dropped > 0 {
                text class="lane-sub" x=(px(W - PAD_RIGHT - 4.0)) y=(px(LOSS_Y + LANE_H - 4.0))
                    text-anchor="end" { "+" (thousands(stop.loss_events_dropped)) " not drawn" }
            }
            (markers(&axis, &m, stop))
        }
        "\n"
    }
}

fn lanes(events: &[(f64, LossKind)]) -> Markup {
    let lanes = [
        (TRAFFIC_Y, TRAFFIC_H, "routed to it", count_routed(events)),
        (PROCESS_Y, LANE_H, "process", String::new()),
        (LOSS_Y, LANE_H, "lost", count_lost(events)),
    ];
    html! {
        @for (y, h, label, sub) in lanes {
            @let mid = y + h / 2.0;
            rect class="lane" x=(GUTTER) y=(px(y)) width=(px(W - PAD_RIGHT - GUTTER)) height=(h)
                rx="3" {}
            text class="lane-label" x=(px(GUTTER - 8.0))
                y=(px(mid + if sub.is_empty() { 4.0 } else { -2.0 })) { (label) }
            @if !sub.is_empty() {
                text class="lane-sub" x=(px(GUTTER - 8.0)) y=(px(mid + 10.0)) { (sub) }
            }
        }
    }
}

fn ticks(axis: &Axis) -> Markup {
    let (step, ticks) = axis.ticks();
    let decimals = if step >= 1.0 {
        0
    } else if step >= 0.1 {
        1
    } else if step >= 0.01 {
        2
    } else {
        3
    };
    let label = |t: f64| {
        if t.abs() < step / 2.0 {
            "0".to_string()
        } else {
            let sign = if t > 0.0 { "+" } else { "−" };
            format!("{sign}{:.*} s", decimals, t.abs())
        }
    };
    html! {
        @for t in ticks {
            @let x = px(axis.x(t));
            line class="tick" x1=(x) y1=(px(TOP)) x2=(x) y2=(px(BOTTOM)) {}
            text class="tick-label" x=(x) y=(px(BOTTOM + 15.0)) { (label(t)) }
        }
    }
}

/// The process lane: the grace band, and the part of it the drain used.
fn process(axis: &Axis, m: &Moments, grace_whole: bool, level: &str) -> Markup {
    let x0 = axis.x(0.0);
    let grace = m.grace.filter(|_| m.has_term);
    let exit = m.exit.filter(|_| m.has_term);
    html! {
        @if let Some(g) = grace {
            @let xg = axis.x(g);
            rect class="grace" x=(px(x0)) y=(px(PROCESS_Y + 3.0)) width=(px((xg - x0).max(1.0)))
                height=(px(LANE_H - 6.0)) rx="3" {}
            text class="band-label" x=(px(xg - 5.0)) y=(px(PROCESS_Y + 19.0)) text-anchor="end" {
                "grace " (secs(g)) " s" @if !grace_whole { " →" }
            }
        }
        @if let Some(e) = exit {
            @let xe = axis.x(e);
            @let label = format!("drain {} s", secs(e.max(0.0)));
            rect class={ "drain " (level) } x=(px(x0)) y=(px(PROCESS_Y + 3.0))
                width=(px((xe - x0).max(2.0))) height=(px(LANE_H - 6.0)) rx="3" {}
            @if xe - x0 > label.len() as f64 * 6.6 + 10.0 {
                text class="band-label on-drain" x=(px(x0 + 6.0)) y=(px(PROCESS_Y + 19.0)) {
                    (label)
                }
            }
        }
    }
}

/// The routed lane: the routing lag band with its label, and the last accept before the signal.
fn routed(axis: &Axis, lag: Option<f64>, accept_shown: Option<f64>) -> Markup {
    let x0 = axis.x(0.0);
    html! {
        @if let Some(l) = lag.filter(|l| *l > 0.0) {
            @let xl = axis.x(l);
            @let label = format!("routing continued {} s", secs(l));
            @let width = label.chars().count() as f64 * 6.4;
            @let (x, anchor) = if xl - x0 > width + 12.0 {
                (x0 + 6.0, "start")
            } else if xl + 6.0 + width < W - PAD_RIGHT {
                (xl + 6.0, "start")
            } else {
                (xl - 6.0, "end")
            };
            rect class="lag" x=(px(x0)) y=(px(TRAFFIC_Y + 3.0)) width=(px((xl - x0).max(1.0)))
                height=(px(TRAFFIC_H - 6.0)) rx="3" {}
            text class="band-label" x=(px(x)) y=(px(TRAFFIC_Y + TRAFFIC_H - 7.0))
                text-anchor=(anchor) { (label) }
        }
        @if let Some(a) = accept_shown {
            (glyph(Glyph::Accept, axis.x(a), GLYPH_Y))
        }
    }
}

/// One glyph per loss event: connections routed to it in the routed lane, the rest in the
/// loss lane. Glyphs at (nearly) the same moment stack vertically instead of hiding each other;
/// what a proxy made of a cut sits just after the cut.
fn events(axis: &Axis, events: &[(f64, LossKind)]) -> Markup {
    let mut stacked: Vec<(f64, f64, usize)> = Vec::new();
    let mut placed = Vec::new();
    for (t, kind) in events {
        let proxy_outcome = matches!(
            kind,
            LossKind::RetryDuplicates | LossKind::RetriedUnexecuted | LossKind::UpstreamAborts
        );
        let mut x = axis.x(*t) + if proxy_outcome { 11.0 } else { 0.0 };
        // Failed health checks sit with the routed traffic: the balancer was still checking.
        let y = if kind.is_routed() || kind.is_probe() {
            GLYPH_Y
        } else {
            let lane = LOSS_Y + LANE_H / 2.0;
            let k = stacked
                .iter()
                .position(|(sx, sy, _)| (sx - x).abs() < 3.0 && *sy == lane);
            let nth = match k {
                Some(i) => {
                    stacked[i].2 += 1;
                    x = stacked[i].0;
                    stacked[i].2
                }
                None => {
                    stacked.push((x, lane, 0));
                    0
                }
            };
            // 0, above, below, then on top of each other (the lane's count says how many).
            lane + [0.0, -8.0, 8.0][nth.min(2)]
        };
        placed.push((*t, *kind, x, y));
    }
    html! {
        @for (t, kind, x, y) in placed {
            g {
                title { (kind.as_str().replace('_', " ")) " " (rel(t)) }
                @if let Some(g) = Glyph::of(kind) { (glyph(g, x, y)) }
            }
        }
    }
}

/// Markers across the lanes, labels in rows above so they never overlap.
fn markers(axis: &Axis, m: &Moments, stop: &StopView) -> Markup {
    let mut markers: Vec<Marker> = Vec::new();
    let mut mark = |at: f64, label: String, class| markers.push(Marker { at, label, class });
    if m.has_term {
        let label = match stop.stop_signal_ignored {
            Some(_) => "SIGTERM (ignored)",
            None => "SIGTERM",
        };
        mark(0.0, label.into(), "m-term");
    }
    for c in &m.closes {
        mark(*c, "listener closed".into(), "m-listener");
    }
    if let Some(k) = m.kill {
        mark(k, "SIGKILL".into(), "m-kill");
    }
    if let Some(e) = m.exit {
        let label = match (stop.exit_signal, stop.exit_code) {
            (Some(sig), _) => format!("exit ({})", signal_name(sig)),
            (None, Some(code)) => format!("exit {code}"),
            _ => "exit".into(),
        };
        mark(e, label, "m-exit");
    }
    if let Some(c) = m.cgroup {
        mark(c, "cgroup removed".into(), "m-cgroup");
    }
    if let Some(c) = m.sandbox {
        mark(c, "pod sandbox stopped".into(), "m-cgroup");
    }
    markers.sort_by(|a, b| a.at.total_cmp(&b.at));
    // Markers a few pixels apart share one label ("SIGTERM · exit · listener closed"), each
    // part in its marker's colour; labels go in rows so that none overlaps another.
    let mut groups: Vec<Vec<&Marker>> = Vec::new();
    for m in &markers {
        match groups.last_mut() {
            Some(g) if axis.x(m.at) - axis.x(g[0].at) < 8.0 => g.push(m),
            _ => groups.push(vec![m]),
        }
    }
    let mut row_end = [f64::MIN; LABEL_ROWS];
    let mut labels = Vec::new();
    for g in groups {
        let x = axis.x(g[0].at);
        let text: usize = g.iter().map(|m| m.label.chars().count() + 3).sum();
        let width = text as f64 * 6.6 + 6.0;
        let right_side = x + width < W - 4.0;
        let (start, end) = if right_side {
            (x, x + width)
        } else {
            (x - width, x)
        };
        let row = (0..LABEL_ROWS)
            .find(|r| row_end[*r] < start)
            .unwrap_or(LABEL_ROWS - 1);
        row_end[row] = end;
        labels.push((x, (row + 1) as f64 * LABEL_ROW, right_side, g));
    }
    html! {
        @for m in &markers {
            @let x = px(axis.x(m.at));
            line class={ "marker " (m.class) } x1=(x) y1=(px(TOP - 3.0)) x2=(x) y2=(px(BOTTOM)) {}
        }
        @for (x, y, right_side, g) in labels {
            line class="marker-stem" x1=(px(x)) y1=(px(y + 3.0)) x2=(px(x)) y2=(px(TOP - 3.0)) {}
            text class="marker-label" x=(px(if right_side { x + 3.0 } else { x - 3.0 })) y=(px(y))
                text-anchor=(if right_side { "start" } else { "end" }) {
                @for (i, m) in g.iter().enumerate() {
                    @if i > 0 { tspan class="sep" { " · " } }
                    tspan class=(m.class) { (m.label) }
                }
            }
        }
    }
}
