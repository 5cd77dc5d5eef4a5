//! A deploy's stops and starts on one time axis (seconds from its first moment), one row each:
//! a stop from its SIGTERM to its exit, with its losses; a start from its PID 1's start to its
//! first listen, with the connects refused before it. Where the old and the new overlap, or do
//! not, is the deploy's story; each record's own timeline is below.

use maud::{Markup, html};

use super::{
    px,
    text::Text,
    timeline::{GUTTER, PAD_RIGHT, W},
};
use crate::export::{
    format::{epoch, rel},
    view::{StartView, StopView},
};

const ROW: f64 = 18.0;
const TOP: f64 = 6.0;

/// One row: its container's name, a bar (from, to) and marks: its losses (a stop's) or its
/// refused connects (a start's).
struct Row<'a> {
    label: &'a str,
    kind: &'static str,
    /// The marks' class: a stop's losses, a start's refusals.
    mark: &'static str,
    from: f64,
    to: f64,
    marks: Vec<f64>,
}

fn stop_row(s: &StopView) -> Option<Row<'_>> {
    let from = epoch(s.sigterm_at.as_deref()?)?;
    let to = [&s.exit_at, &s.sigkill_at, &s.cgroup_removed_at]
        .into_iter()
        .find_map(|t| epoch(t.as_deref()?))
        .unwrap_or(from);
    let marks = s.loss_events.iter().filter_map(|e| epoch(&e.at)).collect();
    Some(Row {
        label: &s.container.name,
        kind: "stop",
        mark: "g-loss",
        from,
        to,
        marks,
    })
}

fn start_row(s: &StartView) -> Option<Row<'_>> {
    let from = epoch(&s.started_at)?;
    let to = s.first_listen_at.as_deref().and_then(epoch).unwrap_or(from);
    let marks = s.refused_at.iter().filter_map(|t| epoch(t)).collect();
    Some(Row {
        label: &s.container.name,
        kind: "start",
        mark: "g-refused",
        from,
        to,
        marks,
    })
}

/// The chart, when the deploy has two records or more to set side by side.
pub(super) fn chart(stops: &[&StopView], starts: &[&StartView]) -> Option<Markup> {
    let mut rows: Vec<Row> = stops
        .iter()
        .filter_map(|s| stop_row(s))
        .chain(starts.iter().filter_map(|s| start_row(s)))
        .collect();
    if rows.len() < 2 {
        return None;
    }
    rows.sort_by(|a, b| a.from.total_cmp(&b.from));
    let lo = rows.iter().map(|r| r.from).fold(f64::INFINITY, f64::min);
    let hi = rows
        .iter()
        .flat_map(|r| r.marks.iter().copied().chain([r.to]))
        .fold(lo, f64::max);
    let span = (hi - lo).max(1.0) * 1.05;
    let x = |t: f64| GUTTER + ((t - lo).max(0.0) / span) * (W - GUTTER - PAD_RIGHT);
    let height = TOP + ROW * rows.len() as f64 + 16.0;
    Some(html! {
        svg class="timeline overview" viewBox={ "0 0 " (W) " " (px(height)) } role="img"
            aria-label="the deploy's stops and starts on one time axis" {
            @for (i, r) in rows.iter().enumerate() {
                @let y = TOP + ROW * i as f64;
                g class={ "row " (r.kind) } data-kind=(r.kind) data-from=(px(r.from - lo)) {
                    text class="lane-label" x=(px(GUTTER - 8.0)) y=(px(y + 12.0)) {
                        (Text(r.label)) " " (r.kind)
                    }
                    rect class={ "bar " (r.kind) } x=(px(x(r.from))) y=(px(y + 3.0))
                        width=(px((x(r.to) - x(r.from)).max(2.0))) height="10" rx="2" {}
                    @for t in &r.marks {
                        circle class=(r.mark) cx=(px(x(*t))) cy=(px(y + 8.0)) r="3" {}
                    }
                }
            }
            text class="tick-label" x=(px(GUTTER)) y=(px(height - 3.0)) { "0 s" }
            text class="tick-label" x=(px(W - PAD_RIGHT)) y=(px(height - 3.0)) text-anchor="end" {
                (rel(span))
            }
        }
    })
}
