//! Start records (`model::start`). A start opens when the enricher reports a container that
//! started while the agent ran (`Observation::Started`: new, or restarted in place), which may
//! be a scan (a second) after its PID 1 started. Every connect refused in a namespace waits,
//! by port, for `LOOKBACK` (longer while a start of that namespace is open) until a container
//! started before it first listens on that port: those are its `refused_before_listen`
//! (health checks apart, in `probes.refused`); refusals at ports it never listens on are no
//! start's. A refusal reported after the listen it preceded (the enricher holds refusals a
//! moment) still counts. Namespaces are matched by cookie where the records carry one (see
//! `model::netns`): a start takes its own namespace's refusals, also those from before its
//! PID 1 started when the namespace was made for it (a runtime sets the network up first;
//! within `LOOKBACK`), and never those of another namespace that reused the inode.
//! A start settles `SETTLE_AFTER_LISTEN` after its first listen, when the container stops, or
//! `GIVE_UP` after it started without listening. As it settles, refusals on the ticks of a
//! balancer's check schedule of the container, learned from its checks once it listened
//! (`probes::on_ticks_before`), are moved to the probes: a balancer checks a new server
//! before it listens, and those first refusals come before the agent knows which process
//! made them (the container's address is unknown until a scan).

use std::{borrow::Cow, collections::VecDeque};

use super::probes::{Schedule, on_ticks_before};
use crate::model::{
    ContainerIdentity, Emitted, HashMap, HashSet, Mono, Netns, SECOND,
    start::{MAX_REFUSALS_KEPT, Start, StartLoss},
    stop::Lost,
};

/// The learned check schedules of a container (by key): what settling a start asks.
pub type Schedules<'a> = &'a dyn Fn(&str) -> Vec<Schedule>;

/// After its first listen, how long a start still takes the first listen of other ports.
pub const SETTLE_AFTER_LISTEN: Mono = 10 * SECOND;
/// A start that never listens settles this long after it started.
pub const GIVE_UP: Mono = 300 * SECOND;
/// Start records kept by default (`--records-kept`; the oldest settled go first).
pub const MAX_STARTS: usize = 1000;
/// How long a refusal waits for a start that opens later (its container found by a scan).
const LOOKBACK: Mono = 5 * SECOND;
/// Refusals waiting for a listen, in all; past it the oldest is dropped and counted on the
/// starts of its namespace (`refusals_lost`).
pub const MAX_WAITING: usize = 65_536;

/// A refused connect waiting for the listen that tells whose start it was.
#[derive(Debug, Clone, Copy)]
struct Waiting {
    netns: Netns,
    port: u16,
    at: Mono,
    probe: bool,
}

/// Whether a refusal may be start `s`'s: of its namespace (by cookie where both know it),
/// after it started, or before in a namespace made for it that the cookies say is the same.
fn in_start(s: &Start, w: &Waiting) -> bool {
    if s.netns != Some(w.netns.inum) {
        return false;
    }
    match (s.netns_cookie, w.netns.cookie()) {
        (Some(a), Some(b)) if a != b => false,
        (Some(_), Some(_)) if s.fresh_netns => w.at.saturating_add(LOOKBACK) >= s.started_at,
        _ => w.at >= s.started_at,
    }
}

#[derive(Debug, Default)]
pub struct Starts {
    records: Vec<Start>,
    waiting: VecDeque<Waiting>,
    /// Starts seen per container, for their ids.
    seen: HashMap<String, u64>,
    /// Containers with an open start: every accepted connection asks, and almost none has.
    open: HashSet<String>,
    /// Records kept at most (the oldest settled go first).
    kept: usize,
    /// Records dropped at the cap, for `stats`.
    pub dropped: u64,
    /// Waiting refusals dropped at [`MAX_WAITING`].
    pub waiting_dropped: u64,
    emitted: Vec<Emitted>,
}

impl Starts {
    /// Keeping at most `kept` records.
    pub fn new(kept: usize) -> Self {
        Self {
            kept,
            ..Default::default()
        }
    }

    pub fn kept(&self) -> usize {
        self.kept
    }

    /// The newest settled records, for a checkpoint: an open start does not survive a
    /// restart (the restarted agent's scan sees its container as running).
    pub fn checkpoint(&self, max: usize) -> Vec<Cow<'_, Start>> {
        let settled = self.records.iter().filter(|s| s.settled);
        let skip = settled.clone().count().saturating_sub(max);
        settled.skip(skip).map(Cow::Borrowed).collect()
    }

    /// Takes up a previous run's settled records, before any observation of this run.
    pub fn resume(&mut self, starts: Vec<Cow<'_, Start>>) {
        for s in starts.into_iter().take(self.kept) {
            let s = s.into_owned();
            let n =
                s.id.rsplit_once('-')
                    .and_then(|(_, n)| n.parse::<u64>().ok());
            let seen = self.seen.entry(s.container.id.clone()).or_default();
            *seen = (*seen).max(n.unwrap_or(0));
            self.records.push(s);
        }
    }

    /// Containers with an open start.
    pub fn open(&self) -> impl Iterator<Item = &str> {
        self.open.iter().map(String::as_str)
    }

    pub fn starts(&self) -> &[Start] {
        &self.records
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn take_emitted(&mut self) -> Vec<Emitted> {
        std::mem::take(&mut self.emitted)
    }

    fn open_index(&self, key: &str) -> Option<usize> {
        if !self.open.contains(key) {
            return None;
        }
        self.records
            .iter()
            .rposition(|s| !s.settled && s.container.id == key)
    }

    fn open_mut(&mut self, key: &str) -> Option<&mut Start> {
        let i = self.open_index(key)?;
        self.records.get_mut(i)
    }

    /// Record `i` is over: its balancers' checks told apart, emitted once, no longer open.
    fn settle(&mut self, i: usize, schedules: Schedules) {
        let Some(s) = self.records.get_mut(i).filter(|s| !s.settled) else {
            return;
        };
        // Requests first, then the checks already told: a tick a check took is not a request's.
        let requests = s.refused_at.len();
        let all: Vec<Mono> = s
            .refused_at
            .iter()
            .chain(&s.probe_refused_at)
            .copied()
            .collect();
        let mut checks: Vec<usize> = schedules(&s.container.id)
            .into_iter()
            .flat_map(|sch| on_ticks_before(sch, &all))
            .filter(|&i| i < requests)
            .collect();
        checks.sort_unstable();
        checks.dedup();
        let n = checks.len() as u64;
        s.loss.refused_before_listen -= n.min(s.loss.refused_before_listen);
        s.loss.probes.refused += n;
        for i in checks.into_iter().rev() {
            s.refused_at.remove(i);
        }
        s.settled = true;
        let done = s.clone();
        self.open.remove(&done.container.id);
        self.emitted.push(Emitted::StartSettled {
            start: Box::new(done),
        });
    }

    pub fn started(
        &mut self,
        container: &ContainerIdentity,
        at: Mono,
        (netns, fresh_netns): (Option<u32>, bool),
        restart: bool,
        schedules: Schedules,
    ) {
        if let Some(i) = self.open_index(&container.id) {
            self.settle(i, schedules);
        }
        let n = self.seen.entry(container.id.clone()).or_default();
        *n += 1;
        let short: String = container.id.chars().take(12).collect();
        let id = format!("{short}-start-{n}");
        if self.records.len() >= self.kept
            && let Some(i) = self.records.iter().position(|s| s.settled)
        {
            let evicted = self.records.remove(i);
            self.dropped += 1;
            // Its container's count of starts goes with its last record (a later start then
            // counts from 1 again, its id free), or it would grow with every container ever.
            let id = &evicted.container.id;
            if *id != container.id
                && !self.open.contains(id)
                && !self.records.iter().any(|s| s.container.id == *id)
            {
                self.seen.remove(id);
            }
        }
        self.open.insert(container.id.clone());
        self.records.push(Start {
            id,
            container: container.clone(),
            restart,
            netns,
            netns_cookie: None,
            fresh_netns,
            started_at: at,
            first_listen_at: None,
            first_accept_at: None,
            ports: Vec::new(),
            loss: StartLoss::default(),
            refused_at: Vec::new(),
            probe_refused_at: Vec::new(),
            refusals_lost: 0,
            events_lost: 0,
            ebpf_faults: 0,
            settled: false,
        });
    }

    /// A connect refused at `port` of namespace `netns`; `probe`: a health check.
    pub fn refused(&mut self, netns: Netns, port: u16, at: Mono, probe: bool) {
        let w = Waiting {
            netns,
            port,
            at,
            probe,
        };
        // Reported after the listen it preceded: that start's at once.
        if let Some(s) = self.records.iter_mut().find(|s| {
            !s.settled && in_start(s, &w) && s.ports.iter().any(|(p, l)| *p == port && at <= *l)
        }) {
            count(s, w);
            return;
        }
        if self.waiting.len() >= MAX_WAITING
            && let Some(old) = self.waiting.pop_front()
        {
            self.waiting_dropped += 1;
            for s in self.records.iter_mut() {
                if !s.settled && s.netns == Some(old.netns.inum) {
                    s.refusals_lost += 1;
                }
            }
        }
        self.waiting.push_back(w);
    }

    /// The container `key` listened on `port` at `at`, in namespace `netns` (the listener's
    /// own record: its cookie is the container's namespace's).
    pub fn listened(&mut self, key: &str, port: u16, at: Mono, netns: Netns) {
        let Some(s) = self.open_mut(key) else {
            return;
        };
        if netns.inum != 0 && s.netns.is_none_or(|ns| ns == netns.inum) {
            s.netns = Some(netns.inum);
            s.netns_cookie = s.netns_cookie.or(netns.cookie());
        }
        if s.ports.iter().any(|(p, _)| *p == port) {
            return;
        }
        s.ports.push((port, at));
        s.first_listen_at.get_or_insert(at);
        let Some(start) = self.open_index(key).and_then(|i| self.records.get(i)) else {
            return;
        };
        let mut mine = Vec::new();
        self.waiting.retain(|w| {
            let taken = in_start(start, w) && w.port == port && w.at <= at;
            if taken {
                mine.push(*w);
            }
            !taken
        });
        if let Some(s) = self.open_mut(key) {
            for w in mine {
                count(s, w);
            }
        }
    }

    /// The container's names (and its pod's Ready time) as the Kubernetes API gives them
    /// now: its latest start has them.
    pub fn identity(&mut self, identity: &ContainerIdentity) {
        if let Some(s) = self
            .records
            .iter_mut()
            .rev()
            .find(|s| s.container.id == identity.id)
        {
            s.container = identity.clone();
        }
    }

    /// accept() took a connection of the container `key` at `at`.
    pub fn accepted(&mut self, key: &str, at: Mono) {
        if let Some(s) = self.open_mut(key)
            && s.first_listen_at.is_some()
        {
            // The earliest: an accept the kernel held (`--hold`) may come after later ones.
            s.first_accept_at = Some(s.first_accept_at.map_or(at, |f| f.min(at)));
        }
    }

    /// The container began stopping: its start is over.
    pub fn stopped(&mut self, key: &str, schedules: Schedules) {
        if let Some(i) = self.open_index(key) {
            self.settle(i, schedules);
        }
    }

    /// `new`: events lost since the last call, charged to every open record.
    pub fn lost(&mut self, new: Lost) {
        for r in self.records.iter_mut().filter(|r| !r.settled) {
            r.events_lost += new.events;
            r.ebpf_faults += new.faults;
        }
    }

    pub fn tick(&mut self, now: Mono, schedules: Schedules) {
        // What no open start could take, once a later one could not either.
        let open: Vec<(u32, Mono)> = self
            .records
            .iter()
            .filter(|r| !r.settled)
            .filter_map(|r| Some((r.netns?, r.started_at)))
            .collect();
        // Kept while a start that may take it is open (`in_start`: from `LOOKBACK` before
        // the start, in a namespace made for it).
        self.waiting.retain(|w| {
            now <= w.at.saturating_add(LOOKBACK)
                || open
                    .iter()
                    .any(|(ns, from)| *ns == w.netns.inum && w.at.saturating_add(LOOKBACK) >= *from)
        });
        let due: Vec<usize> = (0..self.records.len())
            .filter(|&i| {
                let s = &self.records[i];
                !s.settled
                    && match s.first_listen_at {
                        Some(l) => now >= l.saturating_add(SETTLE_AFTER_LISTEN),
                        None => now >= s.started_at.saturating_add(GIVE_UP),
                    }
            })
            .collect();
        for i in due {
            self.settle(i, schedules);
        }
    }
}

/// A refusal taken by start `s`.
fn count(s: &mut Start, w: Waiting) {
    if w.probe {
        s.loss.probes.refused += 1;
        if s.probe_refused_at.len() < MAX_REFUSALS_KEPT {
            s.probe_refused_at.push(w.at);
        }
    } else {
        s.loss.refused_before_listen += 1;
        if s.refused_at.len() < MAX_REFUSALS_KEPT {
            s.refused_at.push(w.at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: Schedules = &|_| Vec::new();

    const MS: Mono = 1_000_000;
    const NS: u32 = 4026532177;

    fn web() -> ContainerIdentity {
        ContainerIdentity {
            id: "c0ffee".repeat(8),
            name: "web".into(),
            workload: "web".into(),
            ..Default::default()
        }
    }

    #[test]
    fn refusals_before_the_listen_on_their_port_are_the_starts_loss() {
        let mut s = Starts::new(MAX_STARTS);
        let c = web();
        // Before the start: another run's, not this one's.
        s.refused(Netns::by_inode(NS), 8080, 900 * MS, false);
        // Found by a scan after its first refusals: they are its own.
        s.refused(Netns::by_inode(NS), 8080, 1100 * MS, false);
        s.started(&c, 1000 * MS, (Some(NS), false), false, NONE);
        s.refused(Netns::by_inode(NS), 8080, 1200 * MS, false);
        s.refused(Netns::by_inode(NS), 8080, 1300 * MS, true);
        s.refused(Netns::by_inode(NS), 9999, 1400 * MS, false);
        s.refused(Netns::by_inode(NS + 1), 8080, 1500 * MS, false);
        s.refused(Netns::by_inode(NS), 8080, 2900 * MS, false);
        s.listened(&c.id, 8080, 3000 * MS, Netns::by_inode(NS));
        // Held by the enricher past the listen: still before it.
        s.refused(Netns::by_inode(NS), 8080, 2950 * MS, false);
        // After the listen (a backlog full, a listener bound elsewhere): no start's loss.
        s.refused(Netns::by_inode(NS), 8080, 3100 * MS, false);
        s.accepted(&c.id, 3050 * MS);
        let r = s.starts()[0].clone();
        assert_eq!(r.loss.refused_before_listen, 4);
        assert_eq!(r.loss.probes.refused, 1);
        assert_eq!(
            r.refused_at,
            vec![1100 * MS, 1200 * MS, 2900 * MS, 2950 * MS]
        );
        assert_eq!(r.first_listen_at, Some(3000 * MS));
        assert_eq!(r.first_accept_at, Some(3050 * MS));
        assert_eq!(r.listen_after_seconds(), Some(2.0));
        assert!(s.take_emitted().is_empty());
        s.tick(12_999 * MS, NONE);
        assert!(s.take_emitted().is_empty(), "settles 10 s after the listen");
        s.tick(13_000 * MS, NONE);
        let e = s.take_emitted();
        assert!(
            matches!(e.as_slice(), [Emitted::StartSettled { start }] if start.loss.refused_before_listen == 4),
            "{e:?}"
        );
        s.tick(13_000 * MS + LOOKBACK, NONE);
        assert!(s.waiting.is_empty(), "nothing waits past the lookback");
    }

    #[test]
    fn a_start_in_a_namespace_made_for_it_takes_its_refusals_by_cookie_and_none_of_another() {
        let mut s = Starts::new(MAX_STARTS);
        let c = web();
        const T: Mono = 10 * SECOND;
        let (old, new) = (Netns::new(NS, 41), Netns::new(NS, 57));
        // The namespace is set up before the PID 1 starts (at 1 s): its refusals from then
        // are this start's; the stopped container's namespace, whose inode it reused, refused
        // too (seen late) and so did a namespace long gone.
        s.refused(new, 8080, T + 700 * MS, false);
        s.refused(old, 8080, T + 800 * MS, false);
        s.refused(new, 8080, T + 1000 * MS - LOOKBACK - MS, false);
        s.started(&c, T + 1000 * MS, (Some(NS), true), false, NONE);
        s.refused(new, 8080, T + 1200 * MS, false);
        s.refused(old, 8080, T + 1300 * MS, false);
        s.listened(&c.id, 8080, T + 2000 * MS, new);
        // Held by the enricher past the listen.
        s.refused(new, 8080, T + 1900 * MS, true);
        s.refused(old, 8080, T + 1950 * MS, false);
        let r = &s.starts()[0];
        assert_eq!(r.netns_cookie, Some(57));
        assert_eq!(r.refused_at, vec![T + 700 * MS, T + 1200 * MS]);
        assert_eq!(
            (r.loss.refused_before_listen, r.loss.probes.refused),
            (2, 1)
        );
        // Without cookies (a kernel that has none), by inode from the PID 1's start.
        let mut s = Starts::new(MAX_STARTS);
        let by_inode = Netns::by_inode(NS);
        s.refused(by_inode, 8080, T + 700 * MS, false);
        s.started(&c, T + 1000 * MS, (Some(NS), true), false, NONE);
        s.refused(by_inode, 8080, T + 1300 * MS, false);
        s.listened(&c.id, 8080, T + 2000 * MS, by_inode);
        let r = &s.starts()[0];
        assert_eq!(
            (r.netns_cookie, r.refused_at.clone()),
            (None, vec![T + 1300 * MS])
        );
        // A namespace not made for it (a sidecar's, a restart in place): from its start on.
        let mut s = Starts::new(MAX_STARTS);
        s.refused(new, 8080, T + 700 * MS, false);
        s.started(&c, T + 1000 * MS, (Some(NS), false), true, NONE);
        s.refused(new, 8080, T + 1300 * MS, false);
        s.listened(&c.id, 8080, T + 2000 * MS, new);
        assert_eq!(s.starts()[0].refused_at, vec![T + 1300 * MS]);
    }

    #[test]
    fn a_restart_in_place_is_a_new_start_and_a_stop_ends_one() {
        let mut s = Starts::new(MAX_STARTS);
        let c = web();
        s.started(&c, 0, (Some(NS), false), false, NONE);
        s.listened(&c.id, 8080, 10 * MS, Netns::by_inode(NS));
        s.started(&c, 5000 * MS, (Some(NS), false), true, NONE);
        let e = s.take_emitted();
        assert!(
            matches!(e.as_slice(), [Emitted::StartSettled { .. }]),
            "the old one settles"
        );
        s.refused(Netns::by_inode(NS), 8080, 5100 * MS, false);
        s.stopped(&c.id, NONE);
        let ids: Vec<(String, bool, bool)> = s
            .starts()
            .iter()
            .map(|r| (r.id.clone(), r.restart, r.settled))
            .collect();
        assert_eq!(
            ids,
            [
                (format!("{}-start-1", &c.id[..12]), false, true),
                (format!("{}-start-2", &c.id[..12]), true, true),
            ]
        );
        // It never listened again: the refusal was no start's.
        assert_eq!(s.starts()[1].loss.refused_before_listen, 0);
    }

    #[test]
    fn a_start_that_never_listens_settles_and_the_cap_keeps_open_ones() {
        let mut s = Starts::new(MAX_STARTS);
        let c = web();
        s.started(&c, 0, (Some(NS), false), false, NONE);
        s.tick(GIVE_UP - 1, NONE);
        assert!(s.take_emitted().is_empty());
        s.tick(GIVE_UP, NONE);
        assert_eq!(s.take_emitted().len(), 1);
        for i in 0..MAX_STARTS as u64 + 5 {
            let mut other = web();
            other.id = format!("{i:064}");
            s.started(&other, i, (Some(NS), false), false, NONE);
        }
        assert_eq!(
            s.starts().len(),
            MAX_STARTS + 5,
            "open starts are never dropped"
        );
        assert_eq!(s.dropped, 1, "the one settled start went");
    }

    #[test]
    fn what_it_remembers_of_containers_goes_with_their_last_record() {
        let mut s = Starts::new(3);
        let run = |i: u64| {
            let mut c = web();
            c.id = format!("{i:064}");
            c
        };
        for i in 0..50 {
            s.started(&run(i), i * SECOND, (Some(NS), false), false, NONE);
            s.tick(i * SECOND + GIVE_UP, NONE);
        }
        assert_eq!(s.starts().len(), 3);
        assert_eq!(s.dropped, 47);
        assert!(s.seen.len() <= 4, "{} containers remembered", s.seen.len());
        // A container whose records are all gone starts counting again, its id free.
        s.started(&run(0), 100 * SECOND, (Some(NS), false), false, NONE);
        assert!(s.starts().last().unwrap().id.ends_with("-start-1"));
    }

    #[test]
    fn refusals_on_a_balancers_check_ticks_are_its_probes_when_the_start_settles() {
        let mut s = Starts::new(MAX_STARTS);
        let c = web();
        s.started(&c, 0, (Some(NS), false), false, NONE);
        // Checks every second from 0.5 s, refused until the listen at 3.2 s; requests refused
        // at 1.51 s and 2.0 s.
        for at in [500, 1510, 2000, 2500] {
            s.refused(Netns::by_inode(NS), 8080, at * MS, false);
        }
        // A check told at once (a schedule known from an earlier run) on the 1.5 s tick: the
        // request 10 ms after it is no check.
        s.refused(Netns::by_inode(NS), 8080, 1500 * MS, true);
        s.listened(&c.id, 8080, 3200 * MS, Netns::by_inode(NS));
        assert_eq!(
            s.starts()[0].loss.refused_before_listen,
            4,
            "until it settles"
        );
        // Learned from its checks once it listened: every second, the latest at 9.5 s.
        let learned: Schedules = &|key| {
            (key == web().id)
                .then_some(Schedule {
                    interval: 1000 * MS,
                    last: 9_500 * MS,
                })
                .into_iter()
                .collect()
        };
        s.tick(3200 * MS + SETTLE_AFTER_LISTEN, learned);
        let st = &s.starts()[0];
        assert!(st.settled);
        assert_eq!(
            (st.loss.refused_before_listen, st.loss.probes.refused),
            (2, 3)
        );
        assert_eq!(st.refused_at, [1510 * MS, 2000 * MS]);
    }
}
