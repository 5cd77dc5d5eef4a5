//! What a stop did to live streams: the streams it cut (at exit or by reset) against the
//! grace period and the lifetimes its server gives them, and a drain that ended them all at
//! once (no cut, but every client reconnects together).

use super::super::{
    format::{count, secs},
    view::StopView,
};
use crate::model::{activity::ROTATION_MARGIN, stop::Outcome, streams::LifetimeShape};

/// "the 6 s its server lets streams live", with the percentile when they vary.
fn lifetimes(stop: &StopView, upper: f64) -> String {
    match &stop.stream_lifetimes {
        Some(l) if l.shape != LifetimeShape::Fixed => format!(
            "the {} s its server lets streams live (95th percentile; median {} s, {})",
            secs(upper),
            secs(tenth(l.p50_seconds)),
            l.shape.as_str()
        ),
        _ => format!("the {} s its server lets streams live", secs(upper)),
    }
}

/// To the tenth, as shown: the margin covers the rest.
fn tenth(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// Live streams cut, why, and what to change: the grace period against the upper percentile
/// of the streams' lifetimes when it was the deadline that cut them.
pub(super) fn cut(stop: &StopView) -> Option<String> {
    let n = stop.loss.streams_cut;
    if n == 0 {
        return None;
    }
    let killed = stop.outcome == Some(Outcome::KilledAtDeadline);
    let mut what = count(n, "live stream", "live streams");
    what += if killed { " cut at SIGKILL" } else { " cut" };
    if let Some(c) = stop.storm_clients {
        what += &format!(" ({} back at once)", count(c, "client", "clients"));
    }
    if killed && stop.stop_signal_ignored.is_some() {
        return Some(what); // the server never saw SIGTERM: the ignored signal is the finding
    }
    let margin = ROTATION_MARGIN as f64 / 1e9;
    let upper = stop.stream_rotation_seconds.map(tenth);
    let timers = stop.streams_ended_by_server.on_their_timers;
    Some(match (upper, stop.grace()) {
        (Some(u), Some(g)) if killed && g < u + margin => format!(
            "{what}: the {} s grace period is shorter than {}: raise it to at least {} s (that + {} s)",
            secs(g),
            lifetimes(stop, u),
            secs((u + margin).ceil()),
            secs(margin)
        ),
        (Some(u), _) if killed => format!(
            "{what}: they outlived the grace period although its server ends 95% of its streams within {} s: on SIGTERM, close the listener and let open streams run to their own timers",
            secs(u)
        ),
        (None, _) if killed && timers > 0 => format!(
            "{what}: its server ended {} on their own timers in the grace period, these outlived it: raise it above the streams' longest lifetime + {} s (not learned before this stop: its streams had not been watched for twice their longest lifetime)",
            count(timers, "other", "others"),
            secs(margin)
        ),
        (Some(u), _) => format!(
            "{what}: the process exited with them open: on SIGTERM, close the listener and let open streams run to their own timers (a grace period of at least {} s)",
            secs((u + margin).ceil())
        ),
        (None, _) => format!(
            "{what}: their clients lost the stream and reconnect: on SIGTERM, close the listener and end streams over the grace period (a final message telling clients to reconnect, spread out)"
        ),
    })
}

/// A drain that ended its live streams all at once right after SIGTERM: not a loss (each
/// client got its stream's end), but every client reconnects together.
pub(super) fn ended_at_once(stop: &StopView) -> Option<String> {
    let n = stop.streams_ended_by_server.at_sigterm;
    if n == 0 {
        return None;
    }
    let over = stop.stream_rotation_seconds.map_or(String::new(), |u| {
        format!(" over up to {} s", secs(tenth(u)))
    });
    Some(format!(
        "its server ended {} at once right after SIGTERM (none cut: each client got its stream's end, and reconnects with the others at once): letting streams run to their own timers spreads the reconnects{over}",
        count(n, "live stream", "live streams")
    ))
}

/// "(40 live streams ended on their own timers)" after a clean drain's text.
pub(super) fn on_timers(stop: &StopView) -> String {
    match stop.streams_ended_by_server.on_their_timers {
        0 => String::new(),
        n => format!(
            " ({} ended on their own timers)",
            count(n, "live stream", "live streams")
        ),
    }
}
