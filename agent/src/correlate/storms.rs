//! Reconnect storms: after a workload's container stops (or restarts in place), its clients
//! come back at once to the replacement(s). Per listener port, a storm is the run of arrivals
//! that starts after the stop and ends after a quiet second once its queue has drained (the
//! longest waits are accepted last, seconds after the last arrival). Clients that come back
//! later (refused until the replacement listened, backing off, their SYNs dropped by a full
//! queue) resume it: one return, one record, updated (`take_updated`) while the stop is
//! watched. It records how many came back, how
//! fast, how long they waited in the accept queue, the accept rate the service sustained
//! while connections queued (its capacity), and the reconnect window it would have needed:
//! clients ÷ that rate. Pure: fed listener facts, procfs samples and a clock.

use std::collections::BTreeMap;

use crate::model::{HashSet, ListenCounters, Mono, SECOND, Workload, storm::Storm};

pub use super::served::Answer;
use super::served::{self, Served};

/// Ticks (seconds) a container's namespace counters are kept without a new sample: longer
/// than the at-rest sampling period (10 s).
const STALE_TICKS: u32 = 15;

/// How long after a stop its workload's listeners are sampled fast, storm or not.
pub const HOT_AFTER_STOP: Mono = 10 * SECOND;

/// 100 ms: the resolution of arrival rates.
pub const BUCKET: Mono = SECOND / 10;
/// Finished storms kept by default (`--records-kept`; the oldest go first, counted).
pub const MAX_STORMS: usize = 1000;

/// An accept whose connection waited at least this long came from a backlog: the service
/// was busy, so the pace of such accepts is its capacity.
pub const QUEUED_SECS: f64 = 0.005;

/// A wider reconnect window is recommended only when the 95th-percentile client waited at
/// least this long in the accept queue: below it the service kept up, whatever its measured
/// capacity says (a service running just at its capacity measures just under the arrivals).
pub const WINDOW_WAIT_SECS: f64 = 0.1;

/// Clients ÷ capacity this much wider than the window the clients came back in (and by twice
/// `WINDOW_WAIT_SECS`) is demand the service could not have kept up with, whatever the kernel
/// saw them wait: clients then waited elsewhere (refused until the replacement listened,
/// backing off), which stretched their arrivals to the service's pace.
pub const WINDOW_MARGIN: f64 = 1.25;

/// Whether a needed window `w` is clearly beyond the clients' `span` (see `WINDOW_MARGIN`).
fn beyond(w: f64, span: f64) -> bool {
    w > span * WINDOW_MARGIN && w - span >= 2.0 * WINDOW_WAIT_SECS
}

#[derive(Debug, Clone)]
pub struct Config {
    /// How long after a stop arrivals at the workload still start a storm.
    pub watch: Mono,
    /// A storm ends after this long without arrivals, and once every arrival was accepted or
    /// this long passed without an accept too.
    pub quiet: Mono,
    /// Fewer clients than this are not a storm.
    pub min_clients: u64,
    /// Finished storms kept.
    pub kept: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            watch: 60 * SECOND,
            quiet: SECOND,
            min_clients: 10,
            kept: MAX_STORMS,
        }
    }
}

#[derive(Debug, Default, Clone)]
struct Open {
    /// A record of it was reported: its next end updates that one.
    reported: bool,
    stop_id: String,
    container: String,
    arrivals: Vec<Mono>,
    accepts: Vec<(Mono, f64)>,
    max_depth: u32,
    overflows: u64,
    /// The server's answers on the storm's connections (a storming namespace's).
    served: Served,
    /// The namespace's counters before the first arrival, and the latest.
    counters: Option<(ListenCounters, ListenCounters)>,
}

impl Open {
    /// No arrival for `quiet`, and no connection left in the queue: every arrival accepted, or
    /// no accept for `quiet` either (a client that gives up while queued is never accepted).
    fn ended(&self, now: Mono, quiet: Mono) -> bool {
        let Some(last) = self.arrivals.last() else {
            return false;
        };
        // Answers come after the accepts (work done after `accept()`): quiet too.
        now >= last + quiet
            && (self.accepts.len() >= self.arrivals.len()
                || self.accepts.last().is_none_or(|(at, _)| now >= at + quiet))
            && self.served.last.is_none_or(|at| now >= at + quiet)
    }
}

#[derive(Debug, Default)]
pub struct Storms {
    config: Config,
    /// Workloads that stopped recently: (stop id, when, the stopped container).
    watching: BTreeMap<Workload, (String, Mono, String)>,
    /// Storms in progress, per workload and port.
    open: BTreeMap<(Workload, u16), Open>,
    /// Storms gone quiet, resumed by the next arrival after the same stop.
    resting: BTreeMap<(Workload, u16), Open>,
    /// Reported storms that resumed and ended again since the last `take_updated`.
    updated: Vec<Storm>,
    /// The latest namespace counters per container (name), the baseline of the next storm:
    /// its workload, the counters, and the ticks since they were sampled.
    counters: BTreeMap<String, (Workload, ListenCounters, u32)>,
    done: Vec<Storm>,
    /// Per watched workload: when clients whose session a stop cut connected again (their
    /// first connection back, see `stops::sessions`), in time order, and whether their
    /// address was shared with other clients (`stops::Return::shared`).
    firsts: BTreeMap<Workload, Vec<(Mono, bool)>>,
    /// Finished storms dropped at the cap (`Config::kept`), oldest first.
    pub dropped: u64,
}

impl Storms {
    pub fn new(config: Config) -> Self {
        Self {
            config,
            ..Default::default()
        }
    }

    pub fn kept(&self) -> usize {
        self.config.kept
    }

    pub fn storms(&self) -> &[Storm] {
        &self.done
    }

    /// Records already reported whose storm resumed and ended again since the last call
    /// (their records in `storms` are updated in place).
    pub fn take_updated(&mut self) -> Vec<Storm> {
        std::mem::take(&mut self.updated)
    }

    /// A container of `workload` began stopping (or exited) at `at`.
    pub fn stopped(&mut self, workload: Workload, stop_id: &str, container: &str, at: Mono) {
        self.watching
            .insert(workload, (stop_id.to_string(), at, container.to_string()));
    }

    /// Workloads whose listen path deserves fast sampling: one of their containers stopped
    /// moments ago, or a storm on them is open. Not the whole watch window: each sample of a
    /// listener costs the kernel a walk of its whole TCP hash table (see `enrich/host.rs`).
    pub fn hot_workloads(&self, now: Mono) -> HashSet<Workload> {
        self.watching
            .iter()
            .filter(|(_, (_, since, _))| now <= since + HOT_AFTER_STOP)
            .map(|(w, _)| w.clone())
            .chain(self.open.keys().map(|(w, _)| w.clone()))
            .collect()
    }

    /// Workloads a storm may still start on (a stop within the watch window), or is open on.
    pub fn watched(&self, now: Mono) -> HashSet<Workload> {
        self.watching
            .iter()
            .filter(|(_, (_, since, _))| now <= since + self.config.watch)
            .map(|(w, _)| w.clone())
            .chain(self.open.keys().map(|(w, _)| w.clone()))
            .collect()
    }

    /// `container` of `workload` started in a network namespace made for it: its listen
    /// counters started at 0, the baseline of a storm on it before its first sample (which may
    /// come after the first arrival).
    pub fn fresh_netns(&mut self, workload: &Workload, container: &str) {
        let zero = ListenCounters::default();
        self.counters
            .insert(container.to_string(), (workload.clone(), zero, 0));
    }

    /// A sample of `container`'s network namespace counters.
    pub fn netns_counters(&mut self, workload: &Workload, container: &str, c: ListenCounters) {
        self.counters
            .insert(container.to_string(), (workload.clone(), c, 0));
        for ((w, _), o) in self.open.iter_mut().chain(self.resting.iter_mut()) {
            if w == workload
                && o.container == container
                && let Some((_, latest)) = &mut o.counters
            {
                *latest = c;
            }
        }
    }

    /// A connection completed its handshake on `container`'s listener on `port`.
    /// Whether no workload is watched for a storm and none is open: listener facts change
    /// nothing then.
    pub fn is_idle(&self) -> bool {
        self.watching.is_empty() && self.open.is_empty()
    }

    pub fn arrival(&mut self, workload: &Workload, container: &str, port: u16, at: Mono) {
        let Some((stop_id, since, _)) = self.watching.get(workload) else {
            return;
        };
        if at < *since || at > since + self.config.watch {
            return;
        }
        let stop_id = stop_id.clone();
        let key = (workload.clone(), port);
        if !self.open.contains_key(&key)
            && let Some(o) = self.resting.remove(&key)
            && o.stop_id == stop_id
        {
            self.open.insert(key.clone(), o);
        }
        let open = self.open.entry(key).or_insert_with(|| Open {
            stop_id,
            container: container.to_string(),
            counters: self.counters.get(container).map(|(_, c, _)| (*c, *c)),
            ..Default::default()
        });
        // In time order: an arrival the kernel held (`--hold`) may come after later ones.
        let i = open.arrivals.partition_point(|a| *a <= at);
        open.arrivals.insert(i, at);
    }

    /// A client whose session a stop of `workload` cut came back at `at`; `shared`: other
    /// clients were behind its address (told apart by count only).
    pub fn first_attempt(&mut self, workload: &Workload, at: Mono, shared: bool) {
        if !self.watching.contains_key(workload) {
            return;
        }
        let firsts = self.firsts.entry(workload.clone()).or_default();
        let i = firsts.partition_point(|(a, _)| *a <= at);
        firsts.insert(i, (at, shared));
    }

    pub fn accept_wait(&mut self, workload: &Workload, port: u16, secs: f64, at: Mono) {
        if let Some(o) = self.open.get_mut(&(workload.clone(), port)) {
            let i = o.accepts.partition_point(|(a, _)| *a <= at);
            o.accepts.insert(i, (at, secs));
        }
    }

    /// The server answered on a connection of `workload`'s listener on `port`.
    pub fn answered(&mut self, workload: &Workload, port: u16, a: Answer) {
        if let Some(o) = self.open.get_mut(&(workload.clone(), port)) {
            o.served.answer(a);
        }
    }

    pub fn overflow(&mut self, workload: &Workload, port: u16) {
        if let Some(o) = self.open.get_mut(&(workload.clone(), port)) {
            o.overflows += 1;
        }
    }

    pub fn queue_depth(&mut self, workload: &Workload, port: u16, depth: u32) {
        if let Some(o) = self.open.get_mut(&(workload.clone(), port)) {
            o.max_depth = o.max_depth.max(depth);
        }
    }

    /// Closes storms quiet for `quiet`; returns the ones large enough to report.
    pub fn tick(&mut self, now: Mono) -> Vec<Storm> {
        let quiet = self.config.quiet;
        let ended: Vec<_> = self
            .open
            .iter()
            .filter(|(_, o)| o.ended(now, quiet))
            .map(|(k, _)| k.clone())
            .collect();
        let mut out = Vec::new();
        for key in ended {
            let Some(mut o) = self.open.remove(&key) else {
                continue;
            };
            if (o.arrivals.len() as u64) < self.config.min_clients {
                self.resting.insert(key, o);
                continue;
            }
            // The clients' first attempts within this return: from its stop on (a client
            // refused before the first arrival made its first attempt then) to its last
            // arrival.
            let (first, last) = (o.arrivals[0], o.arrivals[o.arrivals.len() - 1]);
            let since = self
                .watching
                .get(&key.0)
                .filter(|(stop_id, ..)| *stop_id == o.stop_id)
                .map_or(first, |(_, since, _)| (*since).min(first));
            let firsts: Vec<(Mono, bool)> = self
                .firsts
                .get(&key.0)
                .map(|f| {
                    f.iter()
                        .copied()
                        .filter(|(a, _)| (since..=last).contains(a))
                        .collect()
                })
                .unwrap_or_default();
            let ((namespace, workload), port) = key.clone();
            let storm = summarize(namespace, workload, port, o.clone(), &firsts);
            let same = |s: &Storm| {
                (&s.stop_id, &s.namespace, &s.workload, s.port)
                    == (
                        &storm.stop_id,
                        &storm.namespace,
                        &storm.workload,
                        storm.port,
                    )
            };
            match self
                .done
                .iter_mut()
                .rev()
                .find(|s| same(s))
                .filter(|_| o.reported)
            {
                Some(s) => {
                    *s = storm.clone();
                    self.updated.push(storm);
                }
                None => {
                    if self.done.len() >= self.config.kept {
                        self.done.remove(0); // storms are rare: a shift per one at the cap
                        self.dropped += 1;
                    }
                    self.done.push(storm.clone());
                    out.push(storm);
                }
            }
            o.reported = true;
            self.resting.insert(key, o);
        }
        self.watching
            .retain(|_, (_, since, _)| now <= *since + self.config.watch);
        let (watching, open) = (&self.watching, &self.open);
        self.firsts
            .retain(|w, _| watching.contains_key(w) || open.keys().any(|(o, _)| o == w));
        // A quiet storm rests while its stop is watched (not after another stop).
        let watching = &self.watching;
        self.resting.retain(|(w, _), o| {
            watching
                .get(w)
                .is_some_and(|(stop_id, ..)| *stop_id == o.stop_id)
        });
        // A storm's baseline is the sample before its first arrival, which can come before the
        // fast sampling after a stop has run: keep every container's latest sample (all are
        // sampled every 10 s, and once when found), also while a container of its workload is
        // stopping or restarting (not sampled while it has no process; a restarted container's
        // namespace is the same), and forget the others once no longer sampled.
        let watching = &self.watching;
        self.counters.retain(|_, (w, _, ticks)| {
            *ticks += 1;
            *ticks <= STALE_TICKS || watching.contains_key(w)
        });
        out
    }
}

/// `firsts`: the clients' first connections among the arrivals, when known (with whether
/// their address was shared).
fn summarize(
    namespace: String,
    workload: String,
    port: u16,
    mut o: Open,
    firsts: &[(Mono, bool)],
) -> Storm {
    o.arrivals.sort_unstable();
    let first = o.arrivals[0];
    let last = o.arrivals[o.arrivals.len() - 1];
    let connections = o.arrivals.len() as u64;
    // Demand is the clients, by their first connection: a client's follow-ups come only once
    // the service answered its first, so they and their spread are the service's doing.
    let known = firsts.len() >= 2;
    let clients = if known {
        firsts.len() as u64
    } else {
        connections
    };
    let follow_ups = known && connections > clients + clients / 10;
    // Clients behind one address are matched with their returns by count, oldest first: with
    // follow-up connections, an early client's follow-ups take the place of a later client's
    // first attempt, and the spread of the first `clients` returns ends before the clients'
    // last first attempt (Socket.IO's default transports from one address: 0.59 s for 0.98).
    // Their count holds; their spread is not known.
    let shared = firsts.iter().any(|(_, shared)| *shared);
    let first_attempts =
        (known && !(shared && follow_ups)).then(|| firsts[firsts.len() - 1].0 - firsts[0].0);
    let mut buckets = vec![0u32; ((last - first) / BUCKET + 1) as usize];
    for a in &o.arrivals {
        buckets[((a - first) / BUCKET) as usize] += 1;
    }
    let i95 = ((connections as f64 * 0.95).ceil() as usize).clamp(1, o.arrivals.len()) - 1;
    let peak = buckets.iter().copied().max().unwrap_or(0) as f64 * (SECOND / BUCKET) as f64;
    o.accepts.sort_by_key(|(at, _)| *at);
    // What the service took in (accepts) and what it served (answers, where the kernel timed
    // them): its capacity is the narrower.
    let accepted = capacity(&o.accepts);
    let moments = o.served.moments();
    let answered = served::capacity(&moments);
    // Answers are per connection: with follow-up connections (Socket.IO's polling transport:
    // each client's CONNECT is answered on one of its 4-5 connections), connections served
    // per second are no clients served per second, and the accept rate is not the capacity
    // either when the answers show work after accept(): no capacity rather than a wrong one.
    let sustained = match (accepted, answered) {
        (_, Some(_)) if follow_ups => None,
        (Some(a), Some(s)) => Some(a.min(s)),
        (a, s) => a.or(s),
    };
    tracing::debug!(
        port,
        accepts = o.accepts.len(),
        served = moments.len(),
        served_dropped = o.served.dropped,
        accept_rate = ?accepted,
        served_rate = ?answered,
        follow_ups,
        served_floor = served::floor(&moments),
        served_wait_p95 = served::wait_p95(&moments),
        "storm capacity"
    );
    // A wider window is recommended only when the service needed more time to take every
    // client than they took to come back: a busy service that kept up needs none.
    let span = first_attempts.unwrap_or(last - first) as f64 / SECOND as f64;
    let mut waits: Vec<f64> = o.accepts.iter().map(|(_, w)| *w).collect();
    waits.sort_by(f64::total_cmp);
    let p95 = waits
        .get((waits.len() as f64 * 0.95) as usize)
        .or(waits.last())
        .copied()
        .unwrap_or(0.0);
    // Clients wait in the accept queue, or for the service's answer beyond its own time.
    let p95 = p95.max(served::wait_p95(&moments));
    let needed = sustained
        .map(|r| clients as f64 / r)
        .filter(|w| *w > span && (p95 >= WINDOW_WAIT_SECS || beyond(*w, span)));
    Storm {
        namespace,
        workload,
        container: o.container,
        port,
        stop_id: o.stop_id,
        first_arrival: first,
        last_arrival: last,
        clients,
        connections,
        first_attempts_seconds: first_attempts.map(|s| s as f64 / SECOND as f64),
        arrivals_per_bucket: buckets,
        seconds_to_95_percent: (o.arrivals[i95] - first) as f64 / SECOND as f64,
        peak_arrivals_per_second: peak,
        max_queue_depth: o.max_depth,
        overflows: o.overflows,
        netns_listen_overflows: o
            .counters
            .map(|(a, b)| b.overflows.saturating_sub(a.overflows)),
        netns_listen_drops: o.counters.map(|(a, b)| b.drops.saturating_sub(a.drops)),
        accept_waits: waits,
        sustained_accept_rate: sustained,
        recommended_window_seconds: needed,
    }
}

/// Accepts per second while the queue was backed up: an accept of a connection that was
/// already waiting at the previous accept ended a gap during which the queue never emptied;
/// capacity = those gaps ÷ their total time (gaps with idle time in them would understate
/// it). None unless at least a tenth of the accepts (and 10) came from a backlog: a few
/// unlucky waits in an unhurried return say nothing about capacity.
fn capacity(accepts: &[(Mono, f64)]) -> Option<f64> {
    let queued = accepts.iter().filter(|(_, w)| *w >= QUEUED_SECS).count();
    if queued < 10 || queued * 10 < accepts.len() {
        return None;
    }
    let (mut gaps, mut busy) = (0u64, 0u64);
    for pair in accepts.windows(2) {
        let ((before, _), (at, wait)) = (pair[0], pair[1]);
        let arrived = at.saturating_sub((wait * SECOND as f64) as Mono);
        if wait >= QUEUED_SECS && arrived <= before {
            gaps += 1;
            busy += at - before;
        }
    }
    (busy > 0).then(|| gaps as f64 / (busy as f64 / SECOND as f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Mono = 1_000_000;
    const T0: Mono = 1_000 * SECOND;

    fn web() -> Workload {
        (String::new(), "web".into())
    }

    /// `n` clients arriving evenly over `spread`, served at `rate` accepts per second.
    fn storm(n: u64, spread: Mono, rate: f64) -> Storms {
        let mut s = Storms::new(Config::default());
        s.stopped(web(), "old-1", "web-1", T0);
        let start = T0 + 500 * MS;
        let service = (SECOND as f64 / rate) as Mono;
        let mut free_at = start;
        for i in 0..n {
            let at = start + spread * i / n;
            s.arrival(&web(), "web-2", 8080, at);
            // One server: each accept waits for the previous one's service time.
            let accepted = free_at.max(at);
            free_at = accepted + service;
            s.accept_wait(
                &web(),
                8080,
                (accepted - at) as f64 / SECOND as f64,
                accepted,
            );
        }
        s
    }

    #[test]
    fn demand_is_the_clients_first_connections_and_their_spread() {
        // 200 clients whose sessions the stop cut come back over 0.5 s; each opens two more
        // connections once the service answered (Socket.IO's polling and upgrade), which
        // stretches the return to ~6 s. One server at 100 accepts/s.
        let mut s = Storms::new(Config::default());
        s.stopped(web(), "old-1", "web-1", T0);
        let start = T0 + 500 * MS;
        let mut arrivals: Vec<Mono> = Vec::new();
        for i in 0..200u64 {
            let at = start + 500 * MS * i / 200;
            s.first_attempt(&web(), at, false);
            arrivals.push(at);
        }
        // Follow-ups: served in turn, each client's two follow-ups right after its answer.
        let service = SECOND / 100;
        for i in 0..200u64 {
            let answered = start + service * (i + 1);
            arrivals.extend([answered + MS, answered + 2 * MS]);
        }
        arrivals.sort_unstable();
        let mut free_at = start;
        for at in arrivals {
            s.arrival(&web(), "web-2", 8080, at);
            let accepted = free_at.max(at);
            free_at = accepted + service / 3;
            s.accept_wait(
                &web(),
                8080,
                (accepted - at) as f64 / SECOND as f64,
                accepted,
            );
        }
        let st = &s.tick(T0 + 20 * SECOND)[0];
        assert_eq!((st.clients, st.connections), (200, 600));
        let spread = st.first_attempts_seconds.unwrap();
        assert!((spread - 0.4975).abs() < 0.01, "{spread}");
        let rate = st.sustained_accept_rate.unwrap();
        let window = st.recommended_window_seconds.unwrap();
        assert!(
            (window - 200.0 / rate).abs() < 0.01,
            "{window} vs 200 / {rate}"
        );
        // Without first connections known, every arrival is a client.
        let mut plain = storm(200, 400 * MS, 100.0);
        let st = &plain.tick(T0 + 5 * SECOND)[0];
        assert_eq!(
            (st.clients, st.connections, st.first_attempts_seconds),
            (200, 200, None)
        );
    }

    #[test]
    fn clients_behind_one_address_with_follow_ups_have_no_first_attempts_spread() {
        // 200 clients from one address (one fleet, a NAT) come back over 0.5 s, each opening
        // two follow-ups once served (100/s). Matched by count, the first 200 returns end
        // within ~0.7 s whoever made them: their count holds, their spread is not known.
        let mut s = Storms::new(Config::default());
        s.stopped(web(), "old-1", "web-1", T0);
        let start = T0 + 500 * MS;
        let mut arrivals: Vec<Mono> = (0..200u64).map(|i| start + 500 * MS * i / 200).collect();
        for i in 0..200u64 {
            let answered = start + SECOND / 100 * (i + 1);
            arrivals.extend([answered + MS, answered + 2 * MS]);
        }
        arrivals.sort_unstable();
        for (i, at) in arrivals.iter().take(200).enumerate() {
            s.first_attempt(&web(), *at, i < 199);
        }
        for at in &arrivals {
            s.arrival(&web(), "web-2", 8080, *at);
            s.accept_wait(&web(), 8080, 0.0, *at);
        }
        let st = &s.tick(T0 + 20 * SECOND)[0];
        assert_eq!((st.clients, st.connections), (200, 600));
        assert_eq!(st.first_attempts_seconds, None);
        assert_eq!(st.recommended_window_seconds, None);
    }

    #[test]
    fn work_after_accept_is_the_capacity_when_the_accept_queue_keeps_up() {
        // 500 clients back within 1 s (the Socket.IO fleet): accepted at once, each
        // upgraded at once, then authorised by a pool of 5 × 20 ms (250/s). The accept rate
        // says nothing; the answers after the pool are the capacity, and the window 2 s.
        let mut s = Storms::new(Config::default());
        s.stopped(web(), "old-1", "web-1", T0);
        let start = T0 + 500 * MS;
        let mut free = [start; 5];
        for i in 0..500u64 {
            let at = start + SECOND * i / 500;
            s.first_attempt(&web(), at, false);
            s.arrival(&web(), "web-2", 8080, at);
            s.accept_wait(&web(), 8080, 0.0, at);
            let answer = |index, data_at, answered| Answer {
                sock: 0x1000 + i,
                accepted_at: at,
                data_at,
                index,
                at: answered,
            };
            s.answered(&web(), 8080, answer(0, at + MS, at + MS));
            let slot = (0..5).min_by_key(|k| free[*k]).unwrap();
            let done = free[slot].max(at + 2 * MS) + 20 * MS;
            free[slot] = done;
            s.answered(&web(), 8080, answer(1, at + 2 * MS, done));
        }
        assert!(
            s.tick(start + 2 * SECOND).is_empty(),
            "answers still coming: the pool drains for 2 s"
        );
        let st = &s.tick(start + 5 * SECOND)[0];
        let rate = st.sustained_accept_rate.unwrap();
        assert!((rate - 250.0).abs() < 5.0, "{rate}");
        let window = st.recommended_window_seconds.unwrap();
        assert!((window - 2.0).abs() < 0.05, "{window}");
    }

    #[test]
    fn answers_on_follow_up_connections_give_no_capacity() {
        // 100 clients, each with 4 connections (a polling transport): 400 answered
        // connections, each waiting for a pool of 5 × 20 ms. Connections served per second
        // are not clients served per second.
        let mut s = Storms::new(Config::default());
        s.stopped(web(), "old-1", "web-1", T0);
        let start = T0 + 500 * MS;
        let mut free = [start; 5];
        for i in 0..400u64 {
            let at = start + SECOND * i / 400;
            if i % 4 == 0 {
                s.first_attempt(&web(), at, false);
            }
            s.arrival(&web(), "web-2", 8080, at);
            s.accept_wait(&web(), 8080, 0.0, at);
            let slot = (0..5).min_by_key(|k| free[*k]).unwrap();
            let done = free[slot].max(at + MS) + 20 * MS;
            free[slot] = done;
            s.answered(
                &web(),
                8080,
                Answer {
                    sock: 0x1000 + i,
                    accepted_at: at,
                    data_at: at + MS,
                    index: 0,
                    at: done,
                },
            );
        }
        let st = &s.tick(start + 10 * SECOND)[0];
        assert_eq!((st.clients, st.connections), (100, 400));
        assert_eq!(
            (st.sustained_accept_rate, st.recommended_window_seconds),
            (None, None)
        );
    }

    #[test]
    fn a_client_refused_before_the_first_arrival_made_its_first_attempt_then() {
        // 100 clients back over 0.5 s from +0.3 s; the replacement listens at +0.6 s, so the
        // first 60 were refused and connect again 1 s later (their first connection), the
        // other 40 connect at once. Their first attempts spread over 0.5 s, not 1.2 s.
        let mut s = Storms::new(Config::default());
        s.stopped(web(), "old-1", "web-1", T0);
        let attempts: Vec<Mono> = (0..100u64).map(|i| T0 + 300 * MS + 5 * MS * i).collect();
        let mut arrivals = Vec::new();
        for &at in &attempts {
            s.first_attempt(&web(), at, false);
            arrivals.push(if at < T0 + 600 * MS { at + SECOND } else { at });
        }
        arrivals.sort_unstable();
        for at in arrivals {
            s.arrival(&web(), "web-2", 8080, at);
        }
        let st = &s.tick(T0 + 20 * SECOND)[0];
        assert_eq!((st.clients, st.connections), (100, 100));
        let spread = st.first_attempts_seconds.unwrap();
        assert!((spread - 0.495).abs() < 0.001, "{spread}");
    }

    #[test]
    fn a_busy_service_that_kept_up_gets_no_recommended_window() {
        // 200 clients in pairs every 25 ms against 100 accepts/s: the second of each pair
        // waits 10 ms (the capacity is known), but 2 s of work came over 2.475 s.
        let mut s = Storms::new(Config::default());
        s.stopped(web(), "old-1", "web-1", T0);
        let start = T0 + 500 * MS;
        for pair in 0..100 {
            let at = start + pair * 25 * MS;
            for (i, wait) in [(0, 0), (1, 10 * MS)] {
                s.arrival(&web(), "web-2", 8080, at + i);
                s.accept_wait(&web(), 8080, wait as f64 / SECOND as f64, at + wait);
            }
        }
        let st = &s.tick(T0 + 5 * SECOND)[0];
        let rate = st.sustained_accept_rate.unwrap();
        assert!((rate - 100.0).abs() < 1.0, "{rate}");
        assert_eq!(st.recommended_window_seconds, None);
    }

    #[test]
    fn a_service_at_its_capacity_whose_clients_barely_waited_gets_no_recommended_window() {
        // Storm 37's shape: 600 clients over 1 s against 590 accepts/s measured, a backlog of
        // a few connections throughout (every accept waited 5-20 ms): 1.02 s of work over
        // 1 s, but nobody waited a tenth of a second.
        let mut s = Storms::new(Config::default());
        s.stopped(web(), "old-1", "web-1", T0);
        let start = T0 + 500 * MS;
        let service = SECOND / 590;
        for i in 0..600u64 {
            let at = start + SECOND * i / 600;
            let accepted = start + 10 * MS + service * i;
            s.arrival(&web(), "web-2", 8080, at);
            s.accept_wait(
                &web(),
                8080,
                accepted.saturating_sub(at) as f64 / SECOND as f64,
                accepted,
            );
        }
        let st = &s.tick(T0 + 5 * SECOND)[0];
        assert!(st.sustained_accept_rate.is_some());
        assert_eq!(st.recommended_window_seconds, None);
    }

    #[test]
    fn a_burst_faster_than_the_accept_rate_waits_and_recommends_a_wider_window() {
        // 200 clients within 0.4 s against 100 accepts/s: 2 s of work.
        let mut s = storm(200, 400 * MS, 100.0);
        assert!(s.tick(T0 + 1_000 * MS).is_empty(), "not quiet yet");
        let done = s.tick(T0 + 2 * SECOND);
        assert_eq!(done.len(), 1);
        let st = &done[0];
        assert_eq!(
            (
                st.clients,
                st.port,
                st.stop_id.as_str(),
                st.container.as_str()
            ),
            (200, 8080, "old-1", "web-2")
        );
        assert_eq!(st.arrivals_per_bucket, vec![50, 50, 50, 50]);
        assert_eq!(st.peak_arrivals_per_second, 500.0);
        let rate = st.sustained_accept_rate.unwrap();
        assert!((rate - 100.0).abs() < 1.0, "{rate}");
        let window = st.recommended_window_seconds.unwrap();
        assert!((window - 2.0).abs() < 0.05, "{window}");
        // The last arrivals waited about 2 s - 0.4 s.
        let max = st.accept_waits.last().copied().unwrap();
        assert!((max - 1.6).abs() < 0.05, "{max}");
        assert!(st.accept_wait_quantile(0.5).unwrap() > 0.5);
    }

    #[test]
    fn a_storm_stays_open_until_its_queue_has_drained() {
        // 100 arrivals within 0.1 s; the server accepts 50/s, and the agent sees each accept
        // when it happens: the last is 2 s after the first arrival, 1.9 s after the last.
        let mut s = Storms::new(Config::default());
        s.stopped(web(), "old-1", "web-1", T0);
        let start = T0 + 500 * MS;
        for i in 0..100 {
            s.arrival(&web(), "web-2", 8080, start + i * MS);
        }
        let mut done = Vec::new();
        for i in 0..100u64 {
            let at = start + i * 20 * MS;
            s.accept_wait(&web(), 8080, (at - (start + i * MS)) as f64 / 1e9, at);
            done.extend(s.tick(at));
            if i == 60 {
                assert!(
                    done.is_empty(),
                    "arrivals quiet for a second, 39 still queued"
                );
            }
        }
        assert_eq!(done.len(), 1, "ended with its last accept");
        let st = &done[0];
        assert_eq!(st.accept_waits.len(), 100, "every wait, the longest too");
        assert!(
            (st.accept_waits[99] - 1.881).abs() < 0.001,
            "{}",
            st.accept_waits[99]
        );
        // A queue whose last clients gave up (never accepted) ends a quiet second after the
        // last accept.
        let mut s = Storms::new(Config::default());
        s.stopped(web(), "old-1", "web-1", T0);
        for i in 0..20 {
            s.arrival(&web(), "web-2", 8080, start + i * MS);
        }
        s.accept_wait(&web(), 8080, 0.0, start);
        assert!(s.tick(start + 1_500 * MS).len() == 1);
    }

    #[test]
    fn a_spread_out_return_barely_waits_and_needs_no_wider_window() {
        // 100 clients over 2 s against 100 accepts/s: each finds the server free.
        let mut s = storm(100, 2 * SECOND, 100.0);
        let st = &s.tick(T0 + 5 * SECOND)[0];
        assert!(st.accept_wait_quantile(0.95).unwrap() < 0.001);
        assert_eq!(
            (st.sustained_accept_rate, st.recommended_window_seconds),
            (None, None)
        );
    }

    #[test]
    fn capacity_counts_only_the_time_connections_queued() {
        // An accept of an idle server, 100 accepts 2 ms apart from a backlog, then a lull
        // and 20 more immediate accepts: capacity is 500/s, not the overall pace.
        let mut accepts = vec![(T0, 0.0)];
        for i in 1..=100 {
            accepts.push((T0 + i * 2 * MS, 0.1));
        }
        for i in 0..20 {
            accepts.push((T0 + 2 * SECOND + i * 20 * MS, 0.0));
        }
        let rate = capacity(&accepts).unwrap();
        assert!((rate - 500.0).abs() < 1.0, "{rate}");
        // A few unlucky waits among many are no backlog.
        let mut calm: Vec<_> = (0..200).map(|i| (T0 + i * 10 * MS, 0.0)).collect();
        for a in calm.iter_mut().step_by(25) {
            a.1 = 0.01;
        }
        assert_eq!(capacity(&calm), None);
    }

    #[test]
    fn a_storm_reports_the_growth_of_its_namespace_counters() {
        let mut s = Storms::new(Config::default());
        let base = ListenCounters {
            overflows: 5,
            drops: 6,
        };
        s.netns_counters(&web(), "web-2", base);
        s.stopped(web(), "old-1", "web-1", T0);
        for i in 0..20 {
            s.arrival(&web(), "web-2", 8080, T0 + i * MS);
        }
        s.netns_counters(
            &web(),
            "web-2",
            ListenCounters {
                overflows: 9,
                drops: 12,
            },
        );
        let st = &s.tick(T0 + 2 * SECOND)[0];
        assert_eq!(
            (st.netns_listen_overflows, st.netns_listen_drops),
            (Some(4), Some(6))
        );
        assert!(
            s.hot_workloads(T0 + SECOND).contains(&web()),
            "just stopped"
        );
        assert!(
            s.hot_workloads(T0 + 30 * SECOND).is_empty(),
            "stopped a while ago, no storm open"
        );
        s.tick(T0 + 120 * SECOND);
        assert!(s.hot_workloads(T0 + 120 * SECOND).is_empty());
    }

    #[test]
    fn a_storm_right_after_a_stop_has_the_baseline_sampled_at_rest() {
        let mut s = Storms::new(Config::default());
        let c = |overflows| ListenCounters {
            overflows,
            drops: overflows,
        };
        // Sampled at rest, then the tick of that second.
        s.netns_counters(&web(), "web-2", c(5));
        s.netns_counters(&web(), "gone-1", c(1));
        assert!(s.tick(T0 - SECOND).is_empty());
        // Only web-2 is sampled again (every 10 s): gone-1's sample goes stale.
        for i in 0..STALE_TICKS {
            if i % 10 == 9 {
                s.netns_counters(&web(), "web-2", c(5));
            }
            s.tick(T0 - SECOND / 2);
        }
        // The first arrival comes before any sample after the stop.
        s.stopped(web(), "old-1", "web-1", T0);
        for i in 0..20 {
            s.arrival(&web(), "web-2", 8080, T0 + i * MS);
        }
        s.netns_counters(&web(), "web-2", c(7));
        let st = &s.tick(T0 + 2 * SECOND)[0];
        assert_eq!(st.netns_listen_overflows, Some(2));
        assert!(!s.counters.contains_key("gone-1"), "no longer sampled");
        // Restarted in place: not sampled while it has no process, its baseline stays.
        s.stopped(web(), "web-2-1", "web-2", T0 + 10 * SECOND);
        s.tick(T0 + 11 * SECOND);
        s.tick(T0 + 12 * SECOND);
        for i in 0..20 {
            s.arrival(&web(), "web-2", 8080, T0 + 12 * SECOND + i * MS);
        }
        s.netns_counters(&web(), "web-2", c(8));
        let st = &s.tick(T0 + 14 * SECOND)[0];
        assert_eq!(
            (st.stop_id.as_str(), st.netns_listen_overflows),
            ("web-2-1", Some(1))
        );
    }

    #[test]
    fn a_replacement_in_a_new_namespace_is_baselined_at_zero_before_its_first_sample() {
        let mut s = Storms::new(Config::default());
        s.stopped(web(), "old-1", "web-1", T0);
        // Started in a namespace made for it; its clients arrive before any sample of it.
        s.fresh_netns(&web(), "web-2");
        for i in 0..20 {
            s.arrival(&web(), "web-2", 8080, T0 + SECOND + i * MS);
        }
        let c = ListenCounters {
            overflows: 17,
            drops: 19,
        };
        s.netns_counters(&web(), "web-2", c);
        let st = &s.tick(T0 + 3 * SECOND)[0];
        assert_eq!(
            (st.netns_listen_overflows, st.netns_listen_drops),
            (Some(17), Some(19))
        );
        // Not made for it (and never sampled): unknown, not a guess.
        let mut s = Storms::new(Config::default());
        s.stopped(web(), "old-1", "web-1", T0);
        for i in 0..20 {
            s.arrival(&web(), "web-3", 8080, T0 + SECOND + i * MS);
        }
        s.netns_counters(&web(), "web-3", c);
        assert_eq!(s.tick(T0 + 3 * SECOND)[0].netns_listen_overflows, None);
    }

    #[test]
    fn a_return_with_quiet_spells_is_one_record_updated_as_it_resumes() {
        // Clients refused until the replacement listened come back in waves (their backoff),
        // a few before a long pause: 5, then 40 after 3 s, then 30 after 6 s more.
        let mut s = Storms::new(Config::default());
        s.stopped(web(), "old-1", "web-1", T0);
        let wave = |s: &mut Storms, at: Mono, n: u64| {
            for i in 0..n {
                s.arrival(&web(), "web-2", 8080, at + i * MS);
                s.accept_wait(&web(), 8080, 0.0, at + i * MS);
            }
        };
        wave(&mut s, T0 + SECOND, 5);
        assert!(s.tick(T0 + 3 * SECOND).is_empty(), "too few, so far");
        wave(&mut s, T0 + 4 * SECOND, 40);
        let first = s.tick(T0 + 6 * SECOND);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].clients, 45, "the few before the pause too");
        assert!(s.take_updated().is_empty());
        wave(&mut s, T0 + 12 * SECOND, 30);
        assert!(s.tick(T0 + 14 * SECOND).is_empty(), "no second record");
        let updated = s.take_updated();
        assert_eq!(updated.len(), 1);
        let st = &updated[0];
        assert_eq!((st.clients, st.first_arrival), (75, T0 + SECOND));
        assert!((st.seconds_to_95_percent - 11.0).abs() < 0.1, "{st:?}");
        assert_eq!(s.storms(), std::slice::from_ref(st), "updated in place");
        // After the stop's watch, or another stop of the workload: a new record.
        s.stopped(web(), "web-2-1", "web-2", T0 + 20 * SECOND);
        wave(&mut s, T0 + 21 * SECOND, 20);
        assert_eq!(s.tick(T0 + 23 * SECOND).len(), 1);
        assert_eq!(s.storms().len(), 2);
    }

    #[test]
    fn arrivals_without_a_stop_or_too_few_are_no_storm() {
        let mut s = Storms::new(Config::default());
        for i in 0..50 {
            s.arrival(&web(), "web-2", 8080, T0 + i * MS);
        }
        assert!(s.tick(T0 + 5 * SECOND).is_empty(), "no stop before");
        s.stopped(web(), "old-1", "web-1", T0 + 10 * SECOND);
        for i in 0..5 {
            s.arrival(&web(), "web-2", 8080, T0 + 11 * SECOND + i * MS);
        }
        assert!(
            s.tick(T0 + 20 * SECOND).is_empty(),
            "5 clients are no storm"
        );
        assert!(s.storms().is_empty());
    }
}
