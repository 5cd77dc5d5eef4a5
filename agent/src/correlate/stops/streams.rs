//! Long-lived streams on a container's listeners: which closes cut a live stream, and how
//! long its server lets streams live (a write timeout, a max connection age, a token's
//! expiry), learned from the streams it ends by itself.
//!
//! A by-container close with no request pending is of a live stream when the connection was
//! active ([`Activity::active`]) and a stream (its own evidence, [`Activity::streaming`], or
//! its listener's: one of its connections showed it, which covers streams too young to show
//! it themselves). A live stream is cut when the container's exit closed it (SIGKILL, or an
//! exit without close()) or its close was a reset: what a client loses. One the server ends
//! itself while it still runs is never a cut by itself, in a stop or not: outside stops it
//! teaches a lifetime; in a stop it is counted as ended by the server (`StreamEnds`), on its
//! timer or at the signal.
//!
//! Lifetimes are kept per listener (the newest [`KEPT`]) and trusted once the listener's
//! streams were watched for twice the longest of them: right after a start only the shortest
//! streams can have ended (a fleet of streams living 1.2–6 s, stopped 2 s after it started,
//! shows lifetimes of 1.2–2 s), so a distribution read then would be the shortest streams'.

use std::{collections::VecDeque, net::IpAddr};

use super::{ContainerState, Tracker};
use crate::model::{
    Emitted, HashMap, LossKind, Mono, activity::Activity, stop::Stop, streams::StreamLifetimes,
};

/// Stream lifetimes kept per listener: enough for a 95th percentile.
const KEPT: usize = 128;
/// Lifetimes needed before any distribution is trusted.
const MIN_LIFETIMES: usize = 8;

#[derive(Debug, Default)]
pub(super) struct Streams {
    listeners: HashMap<u16, Listener>,
    /// The upper percentile last reported to telemetry.
    reported: Option<Mono>,
}

#[derive(Debug, Default)]
struct Listener {
    /// One of its connections showed a stream.
    streaming: bool,
    /// Lifetimes of the streams its server ended itself, outside stops, newest last.
    lifetimes: VecDeque<Mono>,
    /// When the earliest stream of the current watch opened: lifetimes have been seen for
    /// this long. A watch ends when no lifetime came for twice the longest kept (the streams
    /// were gone: a new fleet starts it again).
    watched_since: Mono,
    last_learned: Mono,
}

impl Listener {
    fn longest(&self) -> Mono {
        self.lifetimes.iter().copied().max().unwrap_or(0)
    }

    fn learn(&mut self, lifetime: Mono, now: Mono) {
        let opened = now.saturating_sub(lifetime);
        if self.lifetimes.is_empty()
            || now.saturating_sub(self.last_learned) > 2 * self.longest().max(lifetime)
        {
            self.watched_since = opened;
        }
        // A longer stream that ended later may have opened first.
        self.watched_since = self.watched_since.min(opened);
        self.last_learned = now;
        if self.lifetimes.len() == KEPT {
            self.lifetimes.pop_front();
        }
        self.lifetimes.push_back(lifetime);
    }

    /// The lifetimes' distribution, once trusted at `now`: at least [`MIN_LIFETIMES`],
    /// watched for twice the longest.
    fn lifetimes(&self, now: Mono) -> Option<StreamLifetimes> {
        let watched = now.saturating_sub(self.watched_since);
        if self.lifetimes.len() < MIN_LIFETIMES || watched < 2 * self.longest() {
            return None;
        }
        let mut l: Vec<Mono> = self.lifetimes.iter().copied().collect();
        StreamLifetimes::of(&mut l)
    }
}

impl Streams {
    /// The lifetimes trusted at `now` on its listener whose streams live longest (p95).
    pub(super) fn lifetimes(&self, now: Mono) -> Option<StreamLifetimes> {
        self.listeners
            .values()
            .filter_map(|l| l.lifetimes(now))
            .max_by_key(|l| l.p95)
    }
}

/// One by-container close with nothing pending.
pub(super) struct Close {
    pub port: u16,
    pub activity: Activity,
    /// How long the connection had been open, when its handshake was seen.
    pub age: Option<Mono>,
    /// The container's main process had exited: the kernel closed it.
    pub at_exit: bool,
    /// A stop is in progress.
    pub in_stop: bool,
}

/// What a close was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Judged {
    /// Not a live stream: an idle (harmless) close.
    NotStream,
    /// A live stream its server ended itself outside a stop: a lifetime learned (or not, when
    /// its age or its own evidence is unknown).
    Ended { learned: bool },
    /// A live stream its server ended itself during a stop: not a cut.
    EndedInStop,
    /// A live stream cut: closed at exit, or reset.
    Cut,
}

impl Judged {
    /// The loss kind it counts as in a stop.
    pub(super) fn kind(self) -> LossKind {
        if self == Judged::Cut {
            LossKind::StreamsCut
        } else {
            LossKind::IdleClosed
        }
    }
}

/// Decides a close made at `now` (and learns from it).
pub(super) fn judge(streams: &mut Streams, close: &Close, now: Mono) -> Judged {
    let l = streams.listeners.entry(close.port).or_default();
    let own = close.activity.streaming();
    l.streaming |= own;
    if !close.activity.active() || !l.streaming {
        return Judged::NotStream;
    }
    if close.at_exit || close.activity.reset {
        return Judged::Cut;
    }
    if close.in_stop {
        return Judged::EndedInStop;
    }
    // The server ended a stream by itself: a lifetime, when the stream showed itself (a
    // younger one's age is not a stream's lifetime: it may have been a request).
    let Some(age) = close.age.filter(|_| own) else {
        return Judged::Ended { learned: false };
    };
    l.learn(age, now);
    Judged::Ended { learned: true }
}

impl Tracker {
    /// An inbound connection of `key` closed by the container with nothing pending.
    pub(super) fn closed_unpending(&mut self, key: &str, now: Mono, close: Close, peer: IpAddr) {
        let Some(c) = self.containers.get_mut(key) else {
            return;
        };
        let judged = judge(&mut c.streams, &close, now);
        if judged == (Judged::Ended { learned: true }) {
            let lifetimes = c.streams.lifetimes(now);
            report_lifetimes(c, lifetimes, &mut self.emitted);
        }
        if !close.in_stop {
            return;
        }
        let kind = judged.kind();
        if close.at_exit && kind == LossKind::IdleClosed {
            // Idle or a lost session: its client's return tells (`sessions`).
            self.hold_session(key, peer, now, close.age, None);
            return;
        }
        if judged == Judged::EndedInStop
            && let Some(s) = self.stop_mut(key).filter(|s| !s.settled)
        {
            s.stream_ends.count(now, s.sigterm_at);
        }
        self.count(key, kind, None, now, close.age);
        // Its client's return is a first connection of the storm all the same.
        self.hold_session(key, peer, now, close.age, Some(kind));
    }

    /// Whether the container's main process has exited by `now`, in its stop in progress.
    pub(super) fn exited_by(&mut self, key: &str, now: Mono) -> bool {
        self.stop_mut(key)
            .and_then(|s: &mut Stop| s.exit_at)
            .is_some_and(|e| e <= now)
    }
}

/// Tells telemetry of the lifetimes' upper percentile once trusted, or changed by more than
/// a tenth.
fn report_lifetimes(
    c: &mut ContainerState,
    lifetimes: Option<StreamLifetimes>,
    out: &mut Vec<Emitted>,
) {
    let Some(p95) = lifetimes.map(|l| l.p95) else {
        return;
    };
    if c.streams
        .reported
        .is_some_and(|p| p.abs_diff(p95) <= p95 / 10)
    {
        return;
    }
    c.streams.reported = Some(p95);
    out.push(Emitted::StreamRotation {
        container: c.identity.clone(),
        seconds: p95 as f64 / crate::model::SECOND as f64,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{SECOND, streams::LifetimeShape};

    const MS: Mono = 1_000_000;

    fn stream(quiet_ms: Mono, sending_ms: Mono) -> Activity {
        Activity {
            quiet_for: Some(quiet_ms * MS),
            sending_for: Some(sending_ms * MS),
            segs_in: 1,
            segs_out: 1 + (sending_ms / 200) as u32,
            reset: false,
        }
    }

    fn close(activity: Activity, age_ms: Mono, at_exit: bool, in_stop: bool) -> Close {
        Close {
            port: 8080,
            activity,
            age: Some(age_ms * MS),
            at_exit,
            in_stop,
        }
    }

    /// Streams that open every `every_ms` from 0 and live `lifetime(i)` ms, ended by the
    /// server outside stops, in the order they end.
    fn learn(s: &mut Streams, n: u64, every_ms: Mono, lifetime: impl Fn(u64) -> Mono) {
        let mut ends: Vec<(Mono, Mono)> = (0..n)
            .map(|i| (i * every_ms + lifetime(i), lifetime(i)))
            .collect();
        ends.sort_unstable();
        for (end, l) in ends {
            let k = judge(s, &close(stream(0, l - 5), l, false, false), end * MS);
            assert_eq!(k, Judged::Ended { learned: true });
        }
    }

    #[test]
    fn lifetimes_are_trusted_once_watched_for_twice_the_longest() {
        let mut s = Streams::default();
        // A fixed 6 s lifetime, a stream opening every 100 ms from 0: the first ends at 6 s.
        learn(&mut s, 100, 100, |_| 6_000);
        // Watched for 6–15.9 s: not yet at 11.9 s, from 12 s on.
        assert_eq!(s.lifetimes(11_900 * MS), None);
        let l = s.lifetimes(12_000 * MS).expect("trusted");
        assert_eq!(
            (l.p50, l.p95, l.shape),
            (6_000 * MS, 6_000 * MS, LifetimeShape::Fixed)
        );
        assert_eq!(l.streams, 100);
    }

    #[test]
    fn the_first_seconds_after_a_start_teach_nothing() {
        // Lifetimes spread over 1.2–6 s, a fleet of 60 opening within 0.5 s, each stream
        // followed by the next at once: at 2 s only the shortest have ended.
        let life = |i: u64| 1_200 + (i * 4_800 / 59 + i * 2_917) % 4_800;
        let mut s = Streams::default();
        let mut ends: Vec<(Mono, Mono)> = Vec::new();
        for c in 0..60 {
            let mut at = c * 500 / 60;
            for k in 0..8 {
                let l = life(c * 8 + k);
                at += l;
                ends.push((at, l));
            }
        }
        ends.sort_unstable();
        let learn_until = |s: &mut Streams, until: Mono| {
            for &(end, l) in ends.iter().filter(|(e, _)| *e <= until) {
                judge(s, &close(stream(0, l - 5), l, false, false), end * MS);
            }
        };
        learn_until(&mut s, 2_000);
        assert!(!s.listeners[&8080].lifetimes.is_empty(), "short ones ended");
        assert_eq!(
            s.lifetimes(2_000 * MS),
            None,
            "censored: only short ones ended"
        );
        // Warm: watched for twice the longest, the distribution is the server's.
        let mut s = Streams::default();
        learn_until(&mut s, 13_000);
        let l = s.lifetimes(13_000 * MS).expect("trusted when warm");
        assert_eq!(l.shape, LifetimeShape::Spread);
        assert!(l.p95 >= 5_400 * MS && l.max <= 6_000 * MS, "{l:?}");
    }

    #[test]
    fn a_new_fleet_after_a_quiet_spell_is_watched_again() {
        let mut s = Streams::default();
        // One stream of 2 s at the start, an hour of nothing, then a fleet.
        judge(
            &mut s,
            &close(stream(0, 1_995), 2_000, false, false),
            2 * SECOND,
        );
        let t = 3_600 * SECOND;
        for i in 0..10 {
            let k = judge(
                &mut s,
                &close(stream(0, 1_495), 1_500, false, false),
                t + i * MS,
            );
            assert_eq!(k, Judged::Ended { learned: true });
        }
        assert_eq!(s.lifetimes(t + SECOND), None);
        assert!(s.lifetimes(t + 5 * SECOND).is_some());
    }

    #[test]
    fn server_ends_in_a_stop_are_never_cuts_exits_and_resets_are() {
        let mut s = Streams::default();
        learn(&mut s, 20, 300, |_| 6_000);
        // In a drain, the server ending a stream at its deadline, or early (at the signal),
        // is not a cut: the client got its stream's end.
        for age in [6_010, 2_010, 300] {
            let k = judge(
                &mut s,
                &close(stream(100, age - 10), age, false, true),
                20 * SECOND,
            );
            assert_eq!(k, Judged::EndedInStop, "{age}");
            assert_eq!(k.kind(), LossKind::IdleClosed);
        }
        // At exit every live stream is, a young one too (its listener streams) and one whose
        // age happens to match the lifetime; and so is a reset while it ran.
        for (sending, age) in [(300, 400), (6_000, 6_030)] {
            let k = judge(
                &mut s,
                &close(stream(120, sending), age, true, true),
                21 * SECOND,
            );
            assert_eq!(k.kind(), LossKind::StreamsCut);
        }
        let reset = Activity {
            reset: true,
            ..stream(50, 3_000)
        };
        let k = judge(&mut s, &close(reset, 3_010, false, true), 21 * SECOND);
        assert_eq!(k, Judged::Cut);
        // A stream quiet for longer than the window is idle.
        let k = judge(
            &mut s,
            &close(stream(1500, 4000), 5000, true, true),
            21 * SECOND,
        );
        assert_eq!(k, Judged::NotStream);
    }

    #[test]
    fn request_response_connections_are_never_streams() {
        let mut s = Streams::default();
        // Keep-alive connections answered 50 ms before the close, slow responses (2 segments
        // after 1.5 s) closed right after: steady state and at exit.
        let pooled = Activity {
            quiet_for: Some(50 * MS),
            sending_for: Some(5 * MS),
            segs_in: 30,
            segs_out: 60,
            reset: false,
        };
        let slow = Activity {
            quiet_for: Some(0),
            sending_for: Some(1500 * MS),
            segs_in: 1,
            segs_out: 2,
            reset: false,
        };
        for a in [pooled, slow] {
            for (at_exit, in_stop) in [(false, false), (false, true), (true, true)] {
                let k = judge(&mut s, &close(a, 1600, at_exit, in_stop), 10 * SECOND);
                assert_eq!(k, Judged::NotStream, "{a:?} {at_exit} {in_stop}");
            }
        }
        assert_eq!(s.lifetimes(100 * SECOND), None);
    }
}
