//! How an inbound connection's data stood when the container closed it, by the kernel's own
//! clock (`lsndtime`, `lrcvtime` and jiffies at the close): what tells a live stream cut from
//! an idle keep-alive connection closed.

use super::{Mono, SECOND};

/// Data moved within this long before the close: the connection was active. Short on
/// purpose: a stream sends at least every second (heartbeats, events); a keep-alive
/// connection between requests is quiet for longer, and one that answered within it is told
/// apart by [`Activity::streaming`].
pub const ACTIVE_WINDOW: Mono = SECOND;

/// A stream's evidence on one connection: this side kept sending for at least this long after
/// the peer's last data...
pub const STREAM_SENDING: Mono = SECOND;

/// ... in at least this many data segments per segment received. A request/response
/// connection sends a response or two per request (headers, body); a stream sends one per
/// event to a single request.
pub const STREAM_SEGMENTS_PER_SEGMENT_IN: u32 = 4;

/// How much longer than the streams' upper lifetime (p95) a grace period must be: the last
/// stream opened before the stop signal ends one lifetime later, and the process must still
/// exit.
pub const ROTATION_MARGIN: Mono = 2 * SECOND;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Activity {
    /// Since the last data segment either way; None when the kernel's clock was not read or
    /// its rate (HZ) is not learned yet.
    pub quiet_for: Option<Mono>,
    /// How long this side had been sending since the peer's last data (0 when it sent
    /// nothing after it); None as for `quiet_for`.
    pub sending_for: Option<Mono>,
    /// Data segments received and sent on the connection.
    pub segs_in: u32,
    pub segs_out: u32,
    /// The close was a reset this side sent (straight to CLOSE with no FIN: `SO_LINGER` 0,
    /// an abort, or the kernel giving up on a peer that stopped answering), not an orderly
    /// close.
    pub reset: bool,
}

impl Activity {
    /// Data moved within [`ACTIVE_WINDOW`] of the close.
    pub fn active(&self) -> bool {
        self.quiet_for.is_some_and(|q| q <= ACTIVE_WINDOW)
    }

    /// Since the peer's last data (the kernel's `lrcvtime`): on a connection with a request
    /// pending, how long that request had been in the server. None when nothing was received
    /// or the clock is unknown.
    pub fn since_received(&self) -> Option<Mono> {
        if self.segs_in == 0 {
            return None;
        }
        Some(self.quiet_for? + self.sending_for?)
    }

    /// The connection itself shows a stream: over [`STREAM_SENDING`] of sending since the
    /// peer last spoke, in many segments per segment received. A slow response (one or two
    /// segments after a long wait) is not one.
    pub fn streaming(&self) -> bool {
        self.sending_for.is_some_and(|s| s >= STREAM_SENDING)
            && self.segs_out >= STREAM_SEGMENTS_PER_SEGMENT_IN * self.segs_in.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Mono = 1_000_000;

    fn at(quiet_ms: Mono, sending_ms: Mono, segs_in: u32, segs_out: u32) -> Activity {
        Activity {
            quiet_for: Some(quiet_ms * MS),
            sending_for: Some(sending_ms * MS),
            segs_in,
            segs_out,
            reset: false,
        }
    }

    #[test]
    fn a_stream_sends_long_after_its_request_in_many_segments() {
        // An event stream: one request 3 s ago, an event every 200 ms.
        let sse = at(120, 3000, 1, 16);
        assert!(sse.active() && sse.streaming());
        // A slow response: 2 segments 1.5 s after the request, closed right after.
        let slow = at(0, 1500, 1, 2);
        assert!(slow.active() && !slow.streaming());
        // A keep-alive connection that answered 40 requests, quiet for 3 s.
        let pooled = at(3000, 5, 40, 80);
        assert!(!pooled.active() && !pooled.streaming());
        // The clock unknown: neither.
        let unknown = Activity {
            quiet_for: None,
            sending_for: None,
            ..sse
        };
        assert!(!unknown.active() && !unknown.streaming());
        // The limits are inclusive.
        assert!(at(1000, 1000, 1, 4).active() && at(1000, 1000, 1, 4).streaming());
        assert!(!at(1001, 999, 1, 4).active() && !at(0, 999, 1, 4).streaming());
    }

    #[test]
    fn the_request_age_is_since_the_peers_last_data() {
        // A request 30 ms ago, unanswered: quiet since it.
        assert_eq!(at(30, 0, 5, 4).since_received(), Some(30 * MS));
        // Answered in part 10 ms after it and quiet 20 ms since: 30 ms too.
        assert_eq!(at(20, 10, 5, 5).since_received(), Some(30 * MS));
        // Nothing received, or the clock unknown: no age.
        assert_eq!(at(20, 0, 0, 1).since_received(), None);
        let unknown = Activity {
            quiet_for: None,
            ..at(0, 0, 1, 1)
        };
        assert_eq!(unknown.since_received(), None);
    }
}
