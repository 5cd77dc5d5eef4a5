//! The small SVG shapes the timelines draw (one per loss kind, the stop signal, the grace band)
//! and the legend that explains them with the same shapes.

use maud::{Markup, html};

use super::px;
use crate::model::{LossKind, loss::Mark};

/// What a glyph stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Glyph {
    Cut,
    /// A live stream cut.
    Stream,
    Retried,
    Abort,
    Refused,
    Unreachable,
    /// A failed health check (cut, refused or unreachable): the balancer or kubelet still
    /// checking, not a user.
    Probe,
    /// A connection accepted after the stop signal.
    Late,
    /// The last connection accepted before it.
    Accept,
    Sigterm,
    /// The grace period with the drain inside it.
    Grace,
}

impl Glyph {
    /// The glyph of a loss kind on the timeline; none for kinds it does not draw.
    pub(super) fn of(kind: LossKind) -> Option<Glyph> {
        Some(match kind.info().mark? {
            Mark::Cut => Glyph::Cut,
            Mark::Stream => Glyph::Stream,
            Mark::Retried => Glyph::Retried,
            Mark::Abort => Glyph::Abort,
            Mark::Refused => Glyph::Refused,
            Mark::Unreachable => Glyph::Unreachable,
            Mark::Probe => Glyph::Probe,
            Mark::Late => Glyph::Late,
        })
    }
}

/// One glyph centred at (x, y).
pub(super) fn glyph(g: Glyph, x: f64, y: f64) -> Markup {
    match g {
        Glyph::Cut => {
            let (a, b, c, d) = (px(x - 4.5), px(y - 4.5), px(x + 4.5), px(y + 4.5));
            html! {
                path class="g-cut"
                    d={ "M" (a) " " (b) "L" (c) " " (d) "M" (a) " " (d) "L" (c) " " (b) } {}
            }
        }
        Glyph::Retried => html! {
            circle class="g-retried" cx=(px(x)) cy=(px(y)) r="6" {}
            path class="g-retried" d={ "M" (px(x + 3.0)) " " (px(y - 5.0)) "l3 -3l1 4z" } {}
        },
        Glyph::Stream => html! {
            path class="g-stream"
                d={ "M" (px(x - 5.0)) " " (px(y)) "l2.5 -3.5l2.5 3.5l2.5 3.5l2.5 -3.5" } {}
        },
        Glyph::Abort => html! {
            rect class="g-abort" x=(px(x - 4.0)) y=(px(y - 4.0)) width="8" height="8"
                transform={ "rotate(45 " (px(x)) " " (px(y)) ")" } {}
        },
        Glyph::Refused => html! { circle class="g-refused" cx=(px(x)) cy=(px(y)) r="4" {} },
        Glyph::Unreachable => {
            html! { circle class="g-unreachable" cx=(px(x)) cy=(px(y)) r="4" {} }
        }
        Glyph::Probe => html! {
            path class="g-probe"
                d={ "M" (px(x)) " " (px(y - 5.0)) "L" (px(x + 5.0)) " " (px(y + 4.0))
                    "L" (px(x - 5.0)) " " (px(y + 4.0)) "Z" } {}
        },
        Glyph::Late | Glyph::Accept => html! {
            rect class=(if g == Glyph::Late { "g-late" } else { "g-accept" })
                x=(px(x - 1.25)) y=(px(y - 6.0)) width="2.5" height="12" {}
        },
        Glyph::Sigterm => html! {
            rect class="g-sigterm" x=(px(x - 1.25)) y=(px(y - 8.0)) width="2.5" height="16" {}
        },
        Glyph::Grace => html! {
            rect class="grace" x=(px(x - 5.0)) y=(px(y - 6.0)) width="18" height="12" rx="2" {}
            rect class="drain good" x=(px(x - 5.0)) y=(px(y - 6.0)) width="9" height="12" rx="2" {}
        },
    }
}

/// What the glyphs mean: each drawn by the same code as on the timelines.
pub(super) fn legend() -> Markup {
    let items = [
        (Glyph::Sigterm, "stop signal"),
        (Glyph::Late, "accepted after it"),
        (Glyph::Refused, "refused"),
        (Glyph::Unreachable, "unreachable"),
        (Glyph::Cut, "in-flight cut"),
        (Glyph::Stream, "live stream cut"),
        (Glyph::Retried, "retried: done twice"),
        (Glyph::Abort, "cut, seen as 502"),
        (Glyph::Probe, "health check failed (not a user)"),
        (Glyph::Grace, "grace period, drain"),
    ];
    html! {
        div class="legend" {
            @for (g, label) in items {
                @let (w, x) = if g == Glyph::Grace { (24, 9.0) } else { (16, 8.0) };
                span {
                    svg viewBox={ "0 0 " (w) " 16" } width=(w) height="16" aria-hidden="true" {
                        (glyph(g, x, 8.0))
                    }
                    (label)
                }
            }
        }
    }
}
