//! The deploy page the agent serves at `/`: recent deploys, newest first, each opening to its
//! stops drawn on one time axis (SIGTERM, routing lag, listener close, drain or cut, exit or
//! SIGKILL, cgroup removal, the grace period as a band, every loss where it happened), the
//! reconnect storms that followed, and the verdict with its fix (`verdict.rs`, shared with
//! `drainwatch report`).
//!
//! Pure: the report API's views in (the same values `/api/v1/*` serve), an HTML string out,
//! written with maud, which escapes every string it splices (text from containers is
//! attacker-controlled: `text.rs`). Server-rendered HTML with inline SVG and CSS
//! (`page.css`), no external assets, relative URLs only, so it works offline and through
//! `kubectl port-forward` or a path-prefix proxy. One small same-origin script (`page.js`)
//! re-renders it in place when the data changes.
//!
//! This file is the entry point and the layout; `deploys.rs` writes the deploy sections,
//! `overview.rs` a deploy's stops and starts on one axis, `stop.rs` a stop's heading and facts, `start.rs` a start's, `timeline.rs` its timeline, `storm.rs` a storm's
//! chart, `glyphs.rs` the loss glyphs and their legend.

mod deploys;
mod glyphs;
mod overview;
mod start;
mod stop;
mod storm;
mod text;
mod timeline;

use maud::{PreEscaped, html};
pub use text::esc;

use super::{
    format::hms,
    view::{DeployView, StartView, StopView, StormView},
};
use text::Text;

/// What the page says about where it runs.
#[derive(Debug, Clone, Default)]
pub struct PageInfo {
    pub host: String,
    pub version: String,
    /// Wall-clock time of rendering, RFC 3339.
    pub rendered_at: String,
}

/// How many of the newest deploys are shown open (in-progress ones always are).
pub const OPEN_DEPLOYS: usize = 3;

/// The same-origin script the page loads (served at `page.js`): every few seconds it fetches
/// the page again and, when the data changed (`data-state`), swaps `<main>` in place, keeping
/// the sections the reader opened or closed. No library, no external request.
pub const SCRIPT: &str = include_str!("page.js");

/// The page's style sheet, inline (the CSP allows inline styles, not scripts).
const CSS: &str = include_str!("page.css");

/// A coordinate in the page's SVG: one decimal.
fn px(x: f64) -> String {
    format!("{x:.1}")
}

/// A short FNV-1a hash: the page's `data-state`, which changes when its data does.
fn fnv(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Renders the whole page from the views `/api/v1/deploys`, `/api/v1/stops`,
/// `/api/v1/starts` and `/api/v1/storms` serve.
pub fn render(
    deploys: &[DeployView],
    stops: &[StopView],
    starts: &[StartView],
    storms: &[StormView],
    info: &PageInfo,
) -> String {
    let main = deploys::main(deploys, stops, starts, storms).into_string();
    // Every 2 s while a container is stopping, every 10 s otherwise.
    let refresh = if deploys.iter().any(|d| d.in_progress > 0) {
        2000
    } else {
        10000
    };
    let updated = hms(&info.rendered_at).split('.').next().unwrap_or("");
    html! {
        (PreEscaped("<!doctype html>\n"))
        html lang="en" {
            "\n"
            head {
                "\n"
                meta charset="utf-8";
                "\n"
                meta name="viewport" content="width=device-width, initial-scale=1";
                "\n"
                title { "drainwatch · " (Text(&info.host)) }
                "\n"
                style { "\n" (PreEscaped(CSS)) }
                "\n"
                script src="page.js" defer {}
                "\n"
            }
            "\n"
            body data-state=(fnv(&main)) data-refresh=(refresh) {
                "\n"
                header {
                    "\n"
                    div class="brand" {
                        span class="logo" { "drainwatch" }
                        span class="host" { (Text(&info.host)) }
                    }
                    "\n"
                    div class="tagline" {
                        "what each deploy did to TCP connections, seen from the kernel"
                    }
                    "\n"
                    nav {
                        span id="updated" { "updated " (Text(updated)) " UTC" }
                        " · " a href="api/v1/deploys" { "deploys" }
                        " · " a href="api/v1/stops" { "stops" }
                        " · " a href="api/v1/starts" { "starts" }
                        " · " a href="api/v1/storms" { "storms" }
                        " · " a href="metrics" { "metrics" }
                        " · v" (Text(&info.version))
                    }
                    "\n"
                }
                "\n"
                (PreEscaped(&main))
                "\n"
            }
            "\n"
        }
        "\n"
    }
    .into_string()
}

#[cfg(test)]
mod tests;
