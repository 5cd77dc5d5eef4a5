//! The verdict on a reconnect storm.

use super::{Level, Verdict};
use crate::export::{
    format::{ceil_tenth, count, rate, secs},
    view::StormView,
};

/// The verdict on one reconnect storm (`/api/v1/storms` element).
pub fn storm(storm: &StormView) -> Verdict {
    let clients = storm.clients;
    let within = storm.seconds_to_95_percent;
    let overflows = storm.overflows;
    let rate_v = storm.sustained_accept_rate;
    let window = storm.recommended_window_seconds;
    let came = format!(
        "{} reconnected within {} s",
        count(clients, "client", "clients"),
        secs(within)
    );
    let mut v = match (window, rate_v) {
        (Some(w), Some(r)) if w > within => Verdict {
            level: Level::Warning,
            text: format!(
                "{came} against {} connections/s: spread reconnects over ≥ {} s",
                rate(r),
                secs(ceil_tenth(w))
            ),
        },
        (Some(w), Some(r)) => Verdict {
            level: Level::Good,
            text: format!(
                "{came}, wider than the {} s its {} connections/s need: no change needed",
                secs(ceil_tenth(w)),
                rate(r)
            ),
        },
        _ => Verdict {
            level: Level::Good,
            text: format!("{came} and the accept queue never backed up: no change needed"),
        },
    };
    if overflows > 0 {
        v.level = Level::Bad;
        v.text += &format!(
            "; {} dropped by a full accept queue (clients retry after a second or more)",
            count(overflows, "handshake was", "handshakes were")
        );
    }
    v
}
