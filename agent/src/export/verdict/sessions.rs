//! The finding on sessions a stop's exit cut: clients that lost their connection when the
//! process died with it open and came straight back (`model::LossKind::SessionsCut`).

use crate::export::{format::count, view::StopView};

/// "1,500 clients lost their session when the process exited and came back at once: …".
pub(super) fn sessions_cut(stop: &StopView) -> Option<String> {
    let n = stop.loss.sessions_cut;
    if n == 0 {
        return None;
    }
    let lost = format!(
        "{} lost their session when the process exited and came back at once",
        count(n, "client", "clients")
    );
    let fix = "on SIGTERM, close sessions yourself over the grace period, a few at a time (clients reconnect to other replicas, spread out), instead of leaving them to the exit";
    Some(if stop.stop_signal_ignored.is_some() {
        lost // the ignored signal is the finding: the server never knew it was stopping
    } else {
        format!("{lost}: {fix}")
    })
}
