//! Long-lived streams on a container's listeners: which closes cut a live stream, and the
//! rotation its server ends streams at by itself (a write timeout, a max connection age).
//!
//! A by-container close with no request pending is a cut stream when the connection was
//! active ([`Activity::active`]) and a stream (its own evidence, [`Activity::streaming`], or
//! its listener's: one of its connections showed it, which covers streams too young to show
//! it themselves), and it was not the server's rotation: a close by the process itself at the
//! learned lifetime. A close at exit (SIGKILL, or an exit without close()) is never one.

use std::{collections::VecDeque, net::IpAddr};

use super::{ContainerState, Tracker};
use crate::model::{Emitted, HashMap, LossKind, Mono, SECOND, activity::Activity, stop::Stop};

/// Stream lifetimes kept per listener.
const AGES_KEPT: usize = 16;
/// Lifetimes needed before a rotation is trusted.
const MIN_AGES: usize = 3;

#[derive(Debug, Default)]
pub(super) struct Streams {
    listeners: HashMap<u16, Listener>,
    /// The rotation last reported to telemetry.
    reported: Option<Mono>,
}

#[derive(Debug, Default)]
struct Listener {
    /// One of its connections showed a stream.
    streaming: bool,
    /// Lifetimes of the streams its server ended itself, outside stops, newest last.
    ages: VecDeque<Mono>,
}

impl Listener {
    /// The regular lifetime: the median of the kept ones, when two thirds of them lie within
    /// a tenth of it (at least half a second).
    fn rotation(&self) -> Option<Mono> {
        if self.ages.len() < MIN_AGES {
            return None;
        }
        let mut ages: Vec<Mono> = self.ages.iter().copied().collect();
        ages.sort_unstable();
        let median = ages[ages.len() / 2];
        let near = ages.iter().filter(|a| near(**a, median)).count();
        (3 * near >= 2 * ages.len()).then_some(median)
    }
}

fn near(age: Mono, rotation: Mono) -> bool {
    age.abs_diff(rotation) <= (rotation / 10).max(SECOND / 2)
}

impl Streams {
    /// The longest rotation learned on any of its listeners.
    pub(super) fn rotation(&self) -> Option<Mono> {
        self.listeners.values().filter_map(Listener::rotation).max()
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

/// Decides a close (and learns from it): a cut stream or an idle (harmless) close, and
/// whether it taught a stream lifetime.
pub(super) fn judge(streams: &mut Streams, close: &Close) -> (LossKind, bool) {
    let l = streams.listeners.entry(close.port).or_default();
    let own = close.activity.streaming();
    l.streaming |= own;
    if !close.activity.active() || !l.streaming {
        return (LossKind::IdleClosed, false);
    }
    if close.at_exit {
        return (LossKind::StreamsCut, false);
    }
    if !close.in_stop {
        // The server ended a stream by itself: a lifetime to learn its rotation from.
        let Some(age) = close.age.filter(|_| own) else {
            return (LossKind::IdleClosed, false);
        };
        if l.ages.len() == AGES_KEPT {
            l.ages.pop_front();
        }
        l.ages.push_back(age);
        return (LossKind::IdleClosed, true);
    }
    match (l.rotation(), close.age) {
        (Some(r), Some(age)) if near(age, r) => (LossKind::IdleClosed, false),
        _ => (LossKind::StreamsCut, false),
    }
}

impl Tracker {
    /// An inbound connection of `key` closed by the container with nothing pending.
    pub(super) fn closed_unpending(&mut self, key: &str, now: Mono, close: Close, peer: IpAddr) {
        let Some(c) = self.containers.get_mut(key) else {
            return;
        };
        let (kind, learned) = judge(&mut c.streams, &close);
        if learned {
            let rotation = c.streams.rotation();
            report_rotation(c, rotation, &mut self.emitted);
        }
        if close.in_stop && close.at_exit && kind == LossKind::IdleClosed {
            // Idle or a lost session: its client's return tells (`sessions`).
            self.hold_session(key, peer, now, close.age, None);
        } else if close.in_stop {
            self.count(key, kind, None, now, close.age);
            // Its client's return is a first connection of the storm all the same.
            self.hold_session(key, peer, now, close.age, Some(kind));
        }
    }

    /// Whether the container's main process has exited by `now`, in its stop in progress.
    pub(super) fn exited_by(&mut self, key: &str, now: Mono) -> bool {
        self.stop_mut(key)
            .and_then(|s: &mut Stop| s.exit_at)
            .is_some_and(|e| e <= now)
    }
}

/// Tells telemetry of a rotation learned, or changed by more than a tenth.
fn report_rotation(c: &mut ContainerState, rotation: Option<Mono>, out: &mut Vec<Emitted>) {
    let Some(r) = rotation else { return };
    if c.streams.reported.is_some_and(|p| p.abs_diff(r) <= r / 10) {
        return;
    }
    c.streams.reported = Some(r);
    out.push(Emitted::StreamRotation {
        container: c.identity.clone(),
        seconds: r as f64 / SECOND as f64,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Mono = 1_000_000;

    fn stream(quiet_ms: Mono, sending_ms: Mono) -> Activity {
        Activity {
            quiet_for: Some(quiet_ms * MS),
            sending_for: Some(sending_ms * MS),
            segs_in: 1,
            segs_out: 1 + (sending_ms / 200) as u32,
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

    #[test]
    fn rotation_is_learned_from_regular_lifetimes_and_spares_streams_at_their_deadline() {
        let mut s = Streams::default();
        // Steady state: the server ends streams at 6 s (± 80 ms), right after a final event.
        for age in [6000, 6040, 5980, 6080] {
            let k = judge(&mut s, &close(stream(0, age - 5), age, false, false));
            assert_eq!(k, (LossKind::IdleClosed, true));
        }
        assert_eq!(s.rotation(), Some(6040 * MS));
        // In a drain, a stream ending at its deadline is the rotation, not a cut ...
        let (end, _) = judge(&mut s, &close(stream(0, 6010), 6020, false, true));
        assert_eq!(end, LossKind::IdleClosed);
        // ... the server closing a 2 s-old stream on SIGTERM is a cut ...
        let (early, _) = judge(&mut s, &close(stream(150, 2000), 2010, false, true));
        assert_eq!(early, LossKind::StreamsCut);
        // ... and at exit every live stream is, a young one too (its listener streams) and
        // one whose age happens to match the rotation.
        for (sending, age) in [(300, 400), (6000, 6030)] {
            let (k, _) = judge(&mut s, &close(stream(120, sending), age, true, true));
            assert_eq!(k, LossKind::StreamsCut);
        }
        // A stream quiet for longer than the window is idle.
        let (quiet, _) = judge(&mut s, &close(stream(1500, 4000), 5000, true, true));
        assert_eq!(quiet, LossKind::IdleClosed);
    }

    #[test]
    fn irregular_lifetimes_give_no_rotation() {
        let mut s = Streams::default();
        for age in [2000, 9000, 4000, 15000] {
            judge(&mut s, &close(stream(0, age), age, false, false));
        }
        assert_eq!(s.rotation(), None);
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
        };
        let slow = Activity {
            quiet_for: Some(0),
            sending_for: Some(1500 * MS),
            segs_in: 1,
            segs_out: 2,
        };
        for a in [pooled, slow] {
            for (at_exit, in_stop) in [(false, false), (false, true), (true, true)] {
                let k = judge(&mut s, &close(a, 1600, at_exit, in_stop));
                assert_eq!(
                    k,
                    (LossKind::IdleClosed, false),
                    "{a:?} {at_exit} {in_stop}"
                );
            }
        }
        assert_eq!(s.rotation(), None);
    }
}
