//! The verdict on a container start.

use super::{Level, Verdict, lost_notes};
use crate::export::{
    format::{count, secs},
    view::StartView,
};

/// The verdict on one container start (`/api/v1/starts` element).
pub fn start(start: &StartView) -> Verdict {
    let mut v = start_verdict(start);
    for note in lost_notes(start.events_lost, start.ebpf_faults) {
        v.text += &format!("; {note}");
    }
    let loss = &start.loss;
    if start.netns_by_inode && loss.refused_before_listen + loss.probes.refused > 0 {
        v.text += "; refusals matched to its network namespace by inode alone (no namespace \
            cookie before Linux 5.12): some may be a stopped container's at the same address";
    }
    v
}

fn start_verdict(start: &StartView) -> Verdict {
    let refused = start.loss.refused_before_listen;
    let probes = start.loss.probes.refused;
    let checks = if probes > 0 {
        format!(
            " ({} refused while it started: normal)",
            count(probes, "health check", "health checks")
        )
    } else {
        String::new()
    };
    let lost = if start.refusals_lost > 0 {
        format!(
            " (may be short by {}: dropped before its listen)",
            count(start.refusals_lost, "refusal", "refusals")
        )
    } else {
        String::new()
    };
    match start.listen_after_seconds {
        None if !start.settled => Verdict {
            level: Level::Pending,
            text: "starting: not listening yet".into(),
        },
        None => Verdict {
            level: Level::Good,
            text: format!("never listened: nothing routed to it was refused{checks}"),
        },
        Some(after) if refused > 0 => Verdict {
            level: Level::Bad,
            text: format!(
                "{} refused in the {} s before the server listened{lost}: it was routed to before it was ready: make readiness check the listener{checks}",
                count(refused, "connection", "connections"),
                secs(after)
            ),
        },
        Some(after) => Verdict {
            level: Level::Good,
            text: format!(
                "listened {} s after it started, nothing refused{lost}: no change needed{checks}",
                secs(after)
            ),
        },
    }
}
