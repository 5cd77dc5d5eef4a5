//! Requests a SIGKILL at the deadline cut, judged by their own age (since their connection's
//! last received data), never their connection's: on a keep-alive connection a request a few
//! milliseconds old rides a connection open for minutes. A request that arrived before the
//! stop signal outlived the grace period (raise it above the slowest); one that arrived after
//! it was served on a connection the server kept open (a longer grace period only serves more
//! of them before the same SIGKILL).

use super::{at_a_close, listener_closes};
use crate::export::{
    format::{count, epoch, secs},
    view::StopView,
};
use crate::model::LossKind;

/// The in-flight cuts of a stop not made as a listener closed, by when their request arrived.
#[derive(Debug, Default, PartialEq)]
pub(super) struct CutRequests {
    /// Arrived before the stop signal (or arrival unknown): they outlived the grace period.
    pub outlived: u64,
    /// The oldest of those, in seconds (the request's age, else its connection's).
    pub slowest: Option<f64>,
    /// Arrived after the stop signal.
    pub young: u64,
    /// The oldest of those, and the oldest connection one rode.
    pub young_oldest: Option<f64>,
    pub young_connection: Option<f64>,
    /// Some of those rode connections opened before the signal: kept-alive ones.
    pub kept_alive: bool,
}

pub(super) fn cut_requests(stop: &StopView) -> CutRequests {
    let closes = listener_closes(stop);
    let term = stop.sigterm_at.as_deref().and_then(epoch);
    let max = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    let mut c = CutRequests::default();
    for e in &stop.loss_events {
        if e.kind != LossKind::InflightCut || at_a_close(&closes, &e.at) {
            continue;
        }
        let at = epoch(&e.at);
        // When the request arrived, known from its own age only.
        let arrived = at.zip(e.request_seconds).map(|(a, r)| a - r);
        match (arrived, term) {
            (Some(arrived), Some(term)) if arrived >= term => {
                c.young += 1;
                c.young_oldest = max(c.young_oldest, e.request_seconds);
                c.young_connection = max(c.young_connection, e.open_seconds);
                let opened = at.zip(e.open_seconds).map(|(a, o)| a - o);
                c.kept_alive |= opened.is_some_and(|o| o < term);
            }
            _ => {
                c.outlived += 1;
                c.slowest = max(c.slowest, e.request_seconds.or(e.open_seconds));
            }
        }
    }
    c
}

impl CutRequests {
    /// "3 requests outlived the 8 s grace period: raise it above the slowest request (9.1 s
    /// seen)", for `n` cuts of which these were seen (the rest are counted as outlived: no
    /// event was kept for them).
    pub(super) fn outlived_finding(&self, n: u64, grace: &str) -> Option<String> {
        let outlived = n.saturating_sub(self.young);
        (outlived > 0).then(|| {
            let seen = self.slowest.map_or_else(
                || "still running when killed".into(),
                |s| format!("{} s seen", secs(s)),
            );
            format!(
                "{} outlived the {grace} period: raise it above the slowest request ({seen})",
                count(outlived, "request", "requests")
            )
        })
    }

    /// Requests that arrived after the signal and were cut: the server kept serving (its
    /// keep-alive connections, or new ones) until the SIGKILL.
    pub(super) fn young_finding(&self, grace: &str) -> Option<String> {
        if self.young == 0 {
            return None;
        }
        let n = count(self.young, "request", "requests");
        let oldest = self.young_oldest.map(age).unwrap_or_default();
        Some(if self.kept_alive {
            let conn = self.young_connection.map_or_else(String::new, |c| {
                format!(", on connections open up to {} s", secs(c))
            });
            format!(
                "{n} cut at SIGKILL had arrived after SIGTERM on keep-alive connections opened before it (the oldest {oldest} old{conn}): the server never closed its keep-alive connections and served on through the {grace} period: while draining answer `Connection: close` (or GOAWAY) and close idle keep-alive connections, then exit; a longer grace period changes nothing"
            )
        } else {
            format!(
                "{n} cut at SIGKILL had arrived after SIGTERM on connections accepted after it (the oldest {oldest} old): the server kept accepting through the {grace} period: close the listener once routing has moved, answer `Connection: close` while draining, then exit; a longer grace period changes nothing"
            )
        })
    }
}

/// A request's age as people say it: `150 ms`, `2.5 s`.
fn age(x: f64) -> String {
    if x < 1.0 {
        format!("{} ms", (x * 1e3).round())
    } else {
        format!("{} s", secs(x))
    }
}

/// Requests that reached connections it had already closed (`LossKind::SentAfterClose`).
pub(super) fn sent_after_close(stop: &StopView) -> Option<String> {
    let n = stop.loss.sent_after_close;
    (n > 0).then(|| {
        format!(
            "{} reached keep-alive connections it had already closed and were reset (the server never saw them): answer `Connection: close` (or GOAWAY) while draining, close idle connections only after routing has moved, and give clients an idle timeout shorter than the server's",
            count(n, "request", "requests")
        )
    })
}
