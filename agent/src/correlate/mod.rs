//! Correlate: turns attributed observations into container stop timelines, the connection loss
//! each stop caused, retry verdicts, reconnect storms and deploys. Pure: fed observations and a
//! clock (kernel monotonic nanoseconds), no I/O, so every rule is unit-tested without a kernel.
//! [`Correlator`] is its one entry point: observations in, [`Emitted`] out.

pub mod deploys;
pub mod probes;
pub mod retries;
mod served;
pub mod starts;
pub mod stops;
pub mod storms;

use crate::model::{
    Emitted, Fact, HashSet, ListenSample, Mono, Observation, Workload,
    start::Start,
    state::{StateMap, StateStat},
    stop::{Lost, Stop},
    storm::Storm,
};

/// The stop tracker (with its retry matcher), the start records and the storm detector
/// behind one door.
#[derive(Debug, Default)]
pub struct Correlator {
    tracker: stops::Tracker,
    starts: starts::Starts,
    storms: storms::Storms,
    /// What was lost so far, as last told (`lost`).
    lost_seen: Lost,
}

/// What a restarted agent resumes from (see `stops::StopsCheckpoint`): serialized by
/// `crate::checkpoint`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Checkpoint<'a> {
    pub tracker: stops::StopsCheckpoint<'a>,
    /// The newest settled start records.
    pub starts: Vec<std::borrow::Cow<'a, Start>>,
}

impl Correlator {
    /// Borrows the records: see `stops::StopsCheckpoint`.
    pub fn checkpoint(&self) -> Checkpoint<'_> {
        Checkpoint {
            tracker: self.tracker.checkpoint(),
            starts: self.starts.checkpoint(stops::RECENT_SETTLED),
        }
    }

    /// Takes up a previous run's checkpoint, before any observation of this run; `gap` is
    /// when the agent was not watching.
    pub fn resume(&mut self, cp: Checkpoint<'_>, gap: crate::model::stop::AgentGap) {
        self.tracker.resume(cp.tracker, gap);
        self.starts.resume(cp.starts);
    }

    pub fn new(tracker: stops::Config, storms: storms::Config) -> Self {
        Self {
            starts: starts::Starts::new(tracker.max_stops),
            tracker: stops::Tracker::new(tracker),
            storms: storms::Storms::new(storms),
            lost_seen: Lost::default(),
        }
    }

    /// Feeds the observations of one kernel event (`event`: its time says how far processing
    /// got) or of a scan, made at `at`.
    pub fn observe(&mut self, at: Mono, mut obs: Vec<Observation>, event: bool) -> Vec<Emitted> {
        let mut out = Vec::new();
        self.observe_into(at, &mut obs, event, &mut out);
        out
    }

    /// [`Self::observe`] from and into buffers the caller keeps (no allocation per event):
    /// `obs` is left empty, what happened is added to `out`.
    pub fn observe_into(
        &mut self,
        at: Mono,
        obs: &mut Vec<Observation>,
        event: bool,
        out: &mut Vec<Emitted>,
    ) {
        for o in obs.drain(..) {
            self.feed_starts(at, &o);
            match &o {
                Observation::Container { identity, .. } => out.push(Emitted::ContainerSeen {
                    container: crate::model::ContainerIdentity::clone(identity),
                }),
                Observation::Reset {
                    container,
                    direction,
                    reason,
                    ..
                } => out.push(Emitted::Reset {
                    container: container.clone(),
                    direction: *direction,
                    reason: reason.clone(),
                }),
                Observation::Listener {
                    container,
                    port,
                    fact,
                } => {
                    // Most of the time no storm is watched or open: no workload key to build.
                    if !self.storms.is_idle() {
                        let w = container.workload_key();
                        match fact {
                            Fact::Arrival => self.storms.arrival(&w, &container.name, *port, at),
                            Fact::AcceptWait(secs) => self.storms.accept_wait(&w, *port, *secs, at),
                            Fact::Overflow => self.storms.overflow(&w, *port),
                            Fact::Answered {
                                sock,
                                accepted_at,
                                data_at,
                                index,
                            } => self.storms.answered(
                                &w,
                                *port,
                                storms::Answer {
                                    sock: *sock,
                                    accepted_at: *accepted_at,
                                    data_at: *data_at,
                                    index: *index,
                                    at,
                                },
                            ),
                        }
                    }
                    // Answers are for storms only: no metric.
                    if matches!(fact, Fact::Answered { .. }) {
                        continue;
                    }
                    out.push(Emitted::Listener {
                        container: container.clone(),
                        port: *port,
                        fact: fact.clone(),
                    });
                    continue;
                }
                _ => {}
            }
            self.tracker.observe(at, o);
            for r in self.tracker.take_returns() {
                self.storms.first_attempt(&r.workload, r.at, r.shared);
            }
        }
        if event {
            self.tracker.processed(at);
        }
        self.drain(out);
    }

    /// Advances the clock (every second): storms that ended, stops that settled.
    /// `total`: what was lost so far (events on their way, faults that lose a record's
    /// inputs); the stop and start records open meanwhile carry what is new.
    pub fn lost(&mut self, total: Lost) {
        let new = total.since(self.lost_seen);
        self.lost_seen = Lost {
            events: self.lost_seen.events.max(total.events),
            faults: self.lost_seen.faults.max(total.faults),
        };
        if new.any() {
            self.tracker.lost(new);
            self.starts.lost(new);
        }
    }

    /// Its capped collections, for `drainwatch_state_*`.
    pub fn state(&self) -> Vec<StateStat> {
        let stat = |map, entries, capacity, dropped| StateStat {
            map,
            entries,
            capacity,
            dropped,
        };
        vec![
            stat(
                StateMap::Stops,
                self.tracker.stops().len(),
                self.tracker.max_stops(),
                self.tracker.stops_evicted(),
            ),
            stat(
                StateMap::Starts,
                self.starts.starts().len(),
                self.starts.kept(),
                self.starts.dropped,
            ),
            stat(
                StateMap::Storms,
                self.storms.storms().len(),
                self.storms.kept(),
                self.storms.dropped,
            ),
            stat(
                StateMap::RefusalsWaiting,
                self.starts.waiting(),
                starts::MAX_WAITING,
                self.starts.waiting_dropped,
            ),
            {
                let (entries, dropped) = self.tracker.sessions_waiting();
                stat(
                    StateMap::SessionsWaiting,
                    entries,
                    stops::MAX_SESSIONS_WAITING,
                    dropped,
                )
            },
            {
                let (entries, dropped) = self.tracker.attempts_in_flight();
                stat(
                    StateMap::AttemptsInFlight,
                    entries,
                    stops::MAX_IN_FLIGHT,
                    dropped,
                )
            },
        ]
    }

    pub fn tick(&mut self, now: Mono) -> Vec<Emitted> {
        let mut out: Vec<Emitted> = self
            .storms
            .tick(now)
            .into_iter()
            .map(|s| Emitted::Storm(Box::new(s)))
            .collect();
        let updated = self.storms.take_updated().into_iter();
        out.extend(updated.map(|s| Emitted::StormUpdated(Box::new(s))));
        self.tracker.tick(now);
        let tracker = &self.tracker;
        self.starts.tick(now, &|key| tracker.check_schedules(key));
        self.drain(&mut out);
        out
    }

    /// What start records need of an observation made at `at`.
    fn feed_starts(&mut self, at: Mono, o: &Observation) {
        match o {
            // A pod's sandbox serves nothing: its start is no start record (as its end is no
            // stop), so the pod's refusals before it listens go to its app's.
            Observation::Started { identity, .. } if identity.is_sandbox() => {}
            Observation::Started {
                identity,
                at,
                netns,
                restart,
                fresh_netns,
            } => {
                let tracker = &self.tracker;
                let schedules = |key: &str| tracker.check_schedules(key);
                let ns = (*netns, *fresh_netns);
                self.starts.started(identity, *at, ns, *restart, &schedules);
                if *fresh_netns {
                    self.storms
                        .fresh_netns(&identity.workload_key(), &identity.name);
                }
            }
            Observation::RefusedAt {
                netns,
                port,
                at,
                upstream,
                ..
            } => {
                let probe = self.tracker.is_probe(*upstream);
                self.starts.refused(*netns, *port, *at, probe);
            }
            Observation::ListenerOpened { key, addr, netns } => {
                self.starts.listened(key, addr.port(), at, *netns)
            }
            Observation::Listener {
                container,
                fact: Fact::AcceptWait(_),
                ..
            } => self.starts.accepted(&container.id, at),
            Observation::Signal { key, .. } | Observation::Exit { key, .. } => {
                let tracker = &self.tracker;
                self.starts.stopped(key, &|k| tracker.check_schedules(k))
            }
            Observation::Identity { identity } => self.starts.identity(identity),
            _ => {}
        }
    }

    /// A sample of the listen path: queue depths and namespace counters for storms.
    pub fn listen_sample(&mut self, sample: ListenSample) -> Vec<Emitted> {
        for (c, port, depth, _) in &sample.queues {
            self.storms.queue_depth(&c.workload_key(), *port, *depth);
        }
        for (c, counters) in &sample.netns {
            self.storms
                .netns_counters(&c.workload_key(), &c.name, *counters);
        }
        vec![Emitted::ListenSample(Box::new(sample))]
    }

    /// What the tracker reported since the last call; a stop's beginning also starts watching
    /// its workload for a storm.
    fn drain(&mut self, out: &mut Vec<Emitted>) {
        for e in self.tracker.take_emitted() {
            if let Emitted::StopBegan {
                container,
                stop_id,
                at,
            } = &e
            {
                self.storms
                    .stopped(container.workload_key(), stop_id, &container.name, *at);
            }
            out.push(e);
        }
        out.extend(self.starts.take_emitted());
    }

    /// What must be seen as it happens (`--hold`'s hot namespaces): containers stopping or
    /// starting, by key, and workloads whose reconnects a storm may follow.
    pub fn hot(&self, now: Mono) -> (HashSet<String>, HashSet<Workload>) {
        let keys = self
            .tracker
            .stopping()
            .chain(self.starts.open())
            .map(str::to_string)
            .collect();
        (keys, self.storms.watched(now))
    }

    /// Workloads a storm may follow or is open on.
    pub fn storm_watched(&self, now: Mono) -> HashSet<Workload> {
        self.storms.watched(now)
    }

    /// Workloads whose listen path is sampled fast (a recent stop, or a storm in progress).
    pub fn hot_workloads(&self, now: Mono) -> HashSet<Workload> {
        self.storms.hot_workloads(now)
    }

    pub fn stops(&self) -> &[Stop] {
        self.tracker.stops()
    }

    pub fn storms(&self) -> &[Storm] {
        self.storms.storms()
    }

    /// Start records, oldest first.
    pub fn starts(&self) -> &[Start] {
        self.starts.starts()
    }

    /// The newest event time fed so far.
    pub fn processed_until(&self) -> Mono {
        self.tracker.processed_until()
    }

    pub fn tracker(&self) -> &stops::Tracker {
        &self.tracker
    }
}

#[cfg(test)]
mod tests;
