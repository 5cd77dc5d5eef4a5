//! What of the tracker a restarted agent resumes from: the open stops with their timelines,
//! the most recent settled ones, and the learned check schedules. A resumed open stop is
//! marked with the gap the agent was down (`AgentGap`) and is incomplete: what happened then
//! is not in it. Kernel monotonic times stay valid across an agent restart (not a reboot: the
//! file names its boot, see `crate::checkpoint`).

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::{ContainerState, Tracker};
use crate::{
    correlate::probes::Learned,
    model::stop::{AgentGap, Stop},
};

/// Settled records a checkpoint keeps, newest; open ones are always kept.
pub const RECENT_SETTLED: usize = 100;

/// Borrowed from the tracker when written (it is written every second a record changes: a
/// clone of every kept record each time was megabytes of churn a second, the soak's RSS
/// drift), owned when read back.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StopsCheckpoint<'a> {
    /// Oldest first.
    pub stops: Vec<Cow<'a, Stop>>,
    pub schedules: Vec<(u32, Cow<'a, str>, Learned)>,
}

impl Tracker {
    pub fn checkpoint(&self) -> StopsCheckpoint<'_> {
        let all = self.records.all();
        let settled = all.iter().filter(|s| s.settled).count();
        let skip = settled.saturating_sub(RECENT_SETTLED);
        let mut skipped = 0;
        let stops = all
            .iter()
            .filter(|s| {
                let drop = s.settled && skipped < skip;
                skipped += usize::from(drop);
                !drop
            })
            .map(Cow::Borrowed)
            .collect();
        StopsCheckpoint {
            stops,
            schedules: self.probes.learned(),
        }
    }

    /// Takes up what a previous run checkpointed, before any observation of this run: open
    /// stops go on (their containers point at them again), marked with `gap`.
    pub fn resume(&mut self, cp: StopsCheckpoint<'_>, gap: AgentGap) {
        self.gap = Some(gap);
        self.probes.restore(cp.schedules);
        for stop in cp.stops {
            let mut stop = stop.into_owned();
            let key = stop.container.id.clone();
            let open = !stop.settled;
            if open {
                stop.agent_gap = Some(gap);
                stop.complete = false;
                // Their sockets are not followed across the restart: their outcome is unknown.
                stop.attempts_unresolved += std::mem::take(&mut stop.attempts_in_flight);
            }
            let n = stop
                .id
                .rsplit_once('-')
                .and_then(|(_, n)| n.parse::<u32>().ok())
                .unwrap_or(0);
            let listeners = stop.listeners.clone();
            let identity = stop.container.clone();
            let last_accept_at = stop.last_accept_at;
            let seq = self.records.push(stop);
            let c: &mut ContainerState = self.containers.entry(key).or_default();
            c.stops_seen = c.stops_seen.max(n);
            if open {
                c.identity = identity;
                c.listeners = listeners;
                c.last_accept_at = last_accept_at;
                c.stop = Some(seq);
            }
        }
        self.records.bound(self.config.max_stops);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ContainerIdentity, ExitInfo, Observation, SECOND, Sender, stop::SIGTERM};

    fn container() -> ContainerIdentity {
        ContainerIdentity {
            id: "abcdef0123456789".into(),
            name: "web".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_resumed_stop_goes_on_to_its_exit_marked_with_the_gap() {
        let mut t = Tracker::default();
        t.observe(
            SECOND,
            Observation::Container {
                identity: Box::new(container()),
                listeners: vec![],
                inbound: vec![],
            },
        );
        t.on_signal(
            2 * SECOND,
            "abcdef0123456789",
            SIGTERM,
            Sender {
                pid: 1,
                comm: "runc".into(),
            },
            None,
        );
        let cp = t.checkpoint();
        let json = serde_json::to_string(&cp).unwrap();
        let back: StopsCheckpoint = serde_json::from_str(&json).unwrap();
        assert_eq!(back, cp);

        let mut t = Tracker::default();
        let gap = AgentGap {
            from: 3 * SECOND,
            to: 5 * SECOND,
        };
        t.resume(back, gap);
        let s = &t.stops()[0];
        assert_eq!(s.sigterm_at, Some(2 * SECOND));
        assert_eq!(s.agent_gap, Some(gap));
        assert!(!s.complete);
        // This run's scan announces the container again: the stop stays its open one.
        t.observe(
            6 * SECOND,
            Observation::Container {
                identity: Box::new(container()),
                listeners: vec![],
                inbound: vec![],
            },
        );
        t.on_exit(
            7 * SECOND,
            "abcdef0123456789",
            ExitInfo {
                code: Some(0),
                signal: None,
            },
        );
        let s = &t.stops()[0];
        assert_eq!(t.stops().len(), 1);
        assert_eq!(s.id, "abcdef012345-1");
        assert_eq!(s.exit_at, Some(7 * SECOND));
        assert_eq!(s.sigterm_at, Some(2 * SECOND));
    }

    #[test]
    fn an_exit_with_no_signal_seen_soon_after_the_gap_may_have_had_it_in_the_gap() {
        let gap = AgentGap {
            from: 3 * SECOND,
            to: 5 * SECOND,
        };
        let exit_0 = ExitInfo {
            code: Some(0),
            signal: None,
        };
        let resumed = || {
            let mut t = Tracker::default();
            t.resume(
                StopsCheckpoint {
                    stops: vec![],
                    schedules: vec![],
                },
                gap,
            );
            t.observe(
                6 * SECOND,
                Observation::Container {
                    identity: Box::new(container()),
                    listeners: vec![],
                    inbound: vec![],
                },
            );
            t
        };
        // Drained and exited 0 within the grace period of the gap: its SIGTERM may have come
        // unseen. Incomplete, never crashed.
        let mut t = resumed();
        t.on_exit(9 * SECOND, "abcdef0123456789", exit_0);
        t.tick(60 * SECOND);
        let s = &t.stops()[0];
        assert_eq!(s.agent_gap, Some(gap));
        assert!(s.settled && !s.complete);
        assert_eq!(s.outcome(), Some(crate::model::stop::Outcome::Exited));
        // Long after the gap (past 300 s): its own exit, complete.
        let mut t = resumed();
        t.on_exit(400 * SECOND, "abcdef0123456789", exit_0);
        t.tick(500 * SECOND);
        assert_eq!(t.stops()[0].agent_gap, None);
        assert!(t.stops()[0].complete);
        // Started after the gap: no signal of the gap was for it.
        let mut t = resumed();
        t.observe(
            6 * SECOND,
            Observation::Started {
                identity: std::sync::Arc::new(container()),
                at: 6 * SECOND,
                netns: None,
                restart: false,
                fresh_netns: false,
            },
        );
        t.on_exit(9 * SECOND, "abcdef0123456789", exit_0);
        assert_eq!(t.stops()[0].agent_gap, None);
    }

    #[test]
    fn a_checkpoint_keeps_open_stops_and_the_newest_settled() {
        let mut t = Tracker::default();
        for i in 0..RECENT_SETTLED + 5 {
            let mut s = Stop::new(format!("s-{i}"), ContainerIdentity::default());
            s.settled = i != 2;
            t.records.push(s);
        }
        let cp = t.checkpoint();
        assert_eq!(cp.stops.len(), RECENT_SETTLED + 1);
        assert_eq!(cp.stops[0].id, "s-2", "the open one, however old");
        assert_eq!(cp.stops[1].id, "s-5");
    }
}
