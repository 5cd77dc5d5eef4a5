//! Health checks apart from requests. A connection is a probe when the node's kubelet opened it
//! (exact: its process, see `model::PROBERS`), or when it fits a load balancer's check
//! schedule, learned from the proxy's own traffic: connections from one proxy process to one
//! backend at a regular cadence (1–10 s, each interval within 2% or 20 ms of the others),
//! carrying the same request size. Four such connections in a row (three intervals) teach the
//! schedule, so at most 30 s of checking. After that, a connection opened on a tick of the
//! schedule (one to four intervals after the last check, within the same tolerance), with the
//! schedule's request size when it is known, is a check; one check per tick, the first that
//! fits, and each check moves the schedule's phase along. Refused and unreachable attempts
//! carry no size: time alone decides for them, the one closest to the tick's due time.
//!
//! Pure: fed the proxies' upstream connections and a clock (their open times).

use std::{borrow::Cow, collections::VecDeque};

use crate::model::{HashMap, Mono, Proxy, SECOND};

/// How a probe was told apart from requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeSource {
    /// The kubelet opened it.
    Kubelet,
    /// It fit a balancer's learned check schedule.
    Schedule,
}

const MIN_INTERVAL: Mono = SECOND;
const MAX_INTERVAL: Mono = 10 * SECOND;
/// Intervals in a row that teach a schedule.
const LEARN_INTERVALS: usize = 3;
/// Ticks a check may be late by (checks that failed and were not seen, a paused balancer).
const MAX_TICKS: u64 = 4;
/// Upstream connections remembered after they close, for the observations that name them
/// late (the container side of a cut, a refusal joined after the proxy's close).
const RECENT_CLOSED: usize = 4096;
/// Request sizes followed per (proxy, backend): a balancer's checks have one; requests many.
const MAX_SIZES: usize = 32;

fn tolerance(interval: Mono) -> Mono {
    (interval / 50).max(20_000_000)
}

#[derive(Debug, Clone)]
struct Upstream {
    route: (u32, String),
    opened_at: Mono,
    prober: bool,
    /// The attempt failed (refused, unreachable): it carries no size.
    failed: bool,
    /// Decided once, so the observations of one connection agree.
    class: Option<Option<ProbeSource>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Learned {
    interval: Mono,
    size: u64,
    /// The last check's open time: the phase of the schedule.
    last: Mono,
}

#[derive(Debug, Default)]
struct Route {
    /// Open times of recent completed connections, by request size (oldest first).
    by_size: HashMap<u64, VecDeque<Mono>>,
    learned: Option<Learned>,
}

impl Route {
    /// A connection opened at `at` completed with `size`: whether it was a check on the
    /// schedule (which then moves its phase along).
    fn completed(&mut self, size: u64, at: Mono) -> bool {
        if !self.by_size.contains_key(&size) && self.by_size.len() >= MAX_SIZES {
            // Many sizes: requests. Start over rather than grow.
            self.by_size.clear();
        }
        let times = self.by_size.entry(size).or_default();
        times.push_back(at);
        while times.len() > LEARN_INTERVALS + 1 {
            times.pop_front();
        }
        let regular = regular(times);
        // A check on the schedule moves its phase along: the schedule holds for as long as
        // the checks go on, not only for `MAX_TICKS` intervals after it was learned.
        if self.learned.is_some_and(|l| l.size == size) && self.fits(at, Some(size), true) {
            return true;
        }
        // A live schedule (checked within its last `MAX_TICKS` ticks) is not replaced by
        // another size's: a client as regular as a balancer's checks must not take their place.
        let live = self
            .learned
            .is_some_and(|l| l.size != size && at <= l.last + MAX_TICKS * l.interval);
        if let Some(interval) = regular.filter(|_| !live) {
            self.learned = Some(Learned {
                interval,
                size,
                last: at,
            });
        }
        false
    }

    /// The due time of the schedule's tick that a connection opened at `at` (with `size`, if
    /// known) fits: one to `MAX_TICKS` intervals after the last check, within tolerance.
    fn due(&self, at: Mono, size: Option<u64>) -> Option<Mono> {
        let l = self.learned.as_ref()?;
        if size.is_some_and(|s| s != l.size) {
            return None;
        }
        let since = at.checked_sub(l.last)?;
        let ticks = (since + l.interval / 2) / l.interval;
        let due = l.last + ticks * l.interval;
        ((1..=MAX_TICKS).contains(&ticks) && at.abs_diff(due) <= tolerance(l.interval))
            .then_some(due)
    }

    /// Whether a connection opened at `at` (with `size`, if known) is the schedule's next
    /// check; consumes the tick when it is and `consume`.
    fn fits(&mut self, at: Mono, size: Option<u64>, consume: bool) -> bool {
        if self.due(at, size).is_none() {
            return false;
        }
        if consume && let Some(l) = self.learned.as_mut() {
            l.last = at;
        }
        true
    }
}

/// The common interval of `times`, when they are evenly spaced at a check's cadence.
fn regular(times: &VecDeque<Mono>) -> Option<Mono> {
    if times.len() < LEARN_INTERVALS + 1 {
        return None;
    }
    let mut gaps: Vec<Mono> = times
        .iter()
        .zip(times.iter().skip(1))
        .map(|(a, b)| b.saturating_sub(*a))
        .collect();
    gaps.sort_unstable();
    let median = gaps[gaps.len() / 2];
    let tol = tolerance(median);
    ((MIN_INTERVAL..=MAX_INTERVAL).contains(&median)
        && gaps.iter().all(|g| g.abs_diff(median) <= tol))
    .then_some(median)
}

/// A learned check schedule, as others read it: its interval and its latest check's open time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    pub interval: Mono,
    pub last: Mono,
}

/// Of refused connects at `times` (no proxy known: a starting container's first refusals
/// come before the agent knows its address), those on the ticks of `s` counted back from its
/// latest check: per tick the one closest to its due time, within the tolerance of the ticks
/// between (at most a quarter interval). A balancer checks a new server before it listens at
/// the cadence it checks it at after: these are its checks.
pub fn on_ticks_before(s: Schedule, times: &[Mono]) -> Vec<usize> {
    let mut best: HashMap<u64, (usize, Mono)> = HashMap::default();
    if s.interval == 0 {
        return Vec::new();
    }
    for (i, &t) in times.iter().enumerate() {
        let Some(back) = s.last.checked_sub(t) else {
            continue;
        };
        let k = (back + s.interval / 2) / s.interval;
        let due = s.last - k * s.interval;
        let off = t.abs_diff(due);
        if k == 0 || off > (tolerance(s.interval) * k).min(s.interval / 4) {
            continue;
        }
        let b = best.entry(k).or_insert((i, off));
        if off < b.1 {
            *b = (i, off);
        }
    }
    let mut on: Vec<usize> = best.into_values().map(|(i, _)| i).collect();
    on.sort_unstable();
    on
}

/// One upstream connection: its socket and when it opened (the kernel reuses a closed
/// socket's address at once, e.g. for a proxy's retry of a refused connect).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Attempt {
    sock: u64,
    opened_at: Mono,
}

#[derive(Debug, Default)]
pub struct Probes {
    upstreams: HashMap<Attempt, Upstream>,
    /// The latest connection on each socket: what an observation naming the socket means.
    current: HashMap<u64, Attempt>,
    /// Connections closed (or replaced on their socket), oldest first.
    closed: VecDeque<Attempt>,
    routes: HashMap<(u32, String), Route>,
}

impl Probes {
    /// A proxy (or prober) on this node opened `sock` to `backend` (a container key).
    pub fn opened(&mut self, sock: u64, proxy: &Proxy, backend: &str, at: Mono) {
        let id = Attempt {
            sock,
            opened_at: at,
        };
        self.upstreams.insert(
            id,
            Upstream {
                route: (proxy.tgid, backend.to_string()),
                opened_at: at,
                prober: proxy.prober,
                failed: false,
                class: None,
            },
        );
        if let Some(old) = self.current.insert(sock, id)
            && old != id
        {
            self.retire(old);
        }
    }

    /// Remembers `id` for a while after it closed, for the observations that name it late
    /// (the container side of a cut, a refusal judged after its tick).
    fn retire(&mut self, id: Attempt) {
        self.closed.push_back(id);
        while self.closed.len() > RECENT_CLOSED {
            if let Some(old) = self.closed.pop_front() {
                self.upstreams.remove(&old);
                if self.current.get(&old.sock) == Some(&old) {
                    self.current.remove(&old.sock);
                }
            }
        }
    }

    /// That connection closed after the proxy sent `bytes_sent` on it: a completed request
    /// (or check) of that size teaches the route's schedule.
    pub fn closed(&mut self, sock: u64, bytes_sent: u64) {
        let Some(id) = self.current.get(&sock).copied() else {
            return;
        };
        let Some(u) = self.upstreams.get_mut(&id) else {
            return;
        };
        if bytes_sent > 0 && !u.prober {
            let (route, at) = (u.route.clone(), u.opened_at);
            let r = self.routes.entry(route).or_default();
            // Decided here when it took its tick, as the container's side may ask after.
            if r.completed(bytes_sent, at) && u.class.is_none() {
                u.class = Some(Some(ProbeSource::Schedule));
            }
            tracing::debug!(sock, bytes_sent, at, backend = %u.route.1, learned = ?r.learned, "probes: upstream closed");
        }
        self.retire(id);
    }

    /// Whether the connection `sock` (a proxy's or prober's; `None`: opened by no process on
    /// this node that is followed) is a probe, and how that was told. `size`: its request
    /// size, when known; `None`: the attempt failed (refused, unreachable).
    pub fn classify(&mut self, sock: Option<u64>, size: Option<u64>) -> Option<ProbeSource> {
        let id = *self.current.get(&sock?)?;
        self.classify_attempt(id, size)
    }

    /// As `classify`, for a connection named before its socket may have been reused.
    pub fn classify_attempt(&mut self, id: Attempt, size: Option<u64>) -> Option<ProbeSource> {
        let u = self.upstreams.get_mut(&id)?;
        if let Some(class) = u.class {
            return class;
        }
        u.failed |= size.is_none();
        let class = if u.prober {
            Some(ProbeSource::Kubelet)
        } else {
            let (at, route) = (u.opened_at, u.route.clone());
            let closer = size.is_none() && self.closer_on_tick(id, &route, at);
            (!closer
                && self
                    .routes
                    .get_mut(&route)
                    .is_some_and(|r| r.fits(at, size, true)))
            .then_some(ProbeSource::Schedule)
        };
        let u = self.upstreams.get_mut(&id)?;
        u.class = Some(class);
        tracing::debug!(sock = id.sock, ?size, at = u.opened_at, backend = %u.route.1, ?class, learned = ?self.routes.get(&u.route).and_then(|r| r.learned), "probes: classified");
        class
    }

    /// Whether another failed, undecided attempt on `route` fits the same tick as `id`
    /// (opened at `at`), closer to its due time. Failed attempts carry no size; the check is
    /// the one on time (a request that happened to come on the tick is off it by
    /// milliseconds). Only attempts known to have failed are rivals: one still connecting may
    /// never be judged.
    fn closer_on_tick(&self, id: Attempt, route: &(u32, String), at: Mono) -> bool {
        let Some(r) = self.routes.get(route) else {
            return false;
        };
        let Some(due) = r.due(at, None) else {
            return false;
        };
        self.upstreams.iter().any(|(&other, o)| {
            other != id
                && o.route == *route
                && o.failed
                && o.class.is_none()
                && o.opened_at.abs_diff(due) < at.abs_diff(due)
                && r.due(o.opened_at, None) == Some(due)
        })
    }

    /// The attempt on `sock` was refused: which connection it was, and when it can be
    /// judged. A refusal is known microseconds after its connect, before a later attempt of
    /// the same tick has even connected, so one on a tick waits until the tick's window is
    /// over and every rival is known (`closer_on_tick`). `None`: judge it at once (decided
    /// already, a prober's, on no tick).
    pub fn refused(&mut self, sock: Option<u64>) -> Option<(Attempt, Mono)> {
        let id = *self.current.get(&sock?)?;
        let u = self.upstreams.get_mut(&id)?;
        if u.class.is_some() || u.prober {
            return None;
        }
        u.failed = true;
        let r = self.routes.get(&u.route)?;
        let due = r.due(u.opened_at, None)?;
        Some((id, due + tolerance(r.learned?.interval)))
    }

    /// Whether an accepted connection looks like a probe, before its size is known: decided
    /// for good only at its close (with its size), so that a request opened on a tick does not
    /// take the tick from the check that follows.
    pub fn peek(&mut self, sock: Option<u64>) -> Option<ProbeSource> {
        let u = self.upstreams.get(self.current.get(&sock?)?)?;
        if let Some(class) = u.class {
            return class;
        }
        if u.prober {
            return Some(ProbeSource::Kubelet);
        }
        let at = u.opened_at;
        let class = self
            .routes
            .get_mut(&u.route)
            .is_some_and(|r| r.fits(at, None, false))
            .then_some(ProbeSource::Schedule);
        tracing::debug!(sock, at, backend = %u.route.1, ?class, "probes: peek");
        class
    }

    /// The learned check schedules of every proxy that checks `backend`.
    pub fn schedules_of(&self, backend: &str) -> Vec<Schedule> {
        self.routes
            .iter()
            .filter(|((_, b), _)| b == backend)
            .filter_map(|(_, r)| r.learned)
            .map(|l| Schedule {
                interval: l.interval,
                last: l.last,
            })
            .collect()
    }

    /// The schedules learned, by (proxy process, backend), for a checkpoint.
    pub fn learned(&self) -> Vec<(u32, Cow<'_, str>, Learned)> {
        let routes = self.routes.iter();
        routes
            .filter_map(|((pid, b), r)| Some((*pid, b.as_str().into(), r.learned?)))
            .collect()
    }

    /// Schedules a previous run of the agent learned: checks go on being told apart at once.
    pub fn restore<'a>(&mut self, learned: impl IntoIterator<Item = (u32, Cow<'a, str>, Learned)>) {
        for (pid, backend, l) in learned {
            let key = (pid, backend.into_owned());
            self.routes.entry(key).or_default().learned = Some(l);
        }
    }

    /// Forgets the routes to a container that is gone.
    pub fn forget_backend(&mut self, backend: &str) {
        self.routes.retain(|(_, b), _| b != backend);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Mono = 1_000_000;

    fn haproxy() -> Proxy {
        Proxy {
            tgid: 7,
            name: "haproxy".into(),
            prober: false,
        }
    }

    /// A completed connection of `size` bytes opened at `at`; returns its socket.
    fn conn(p: &mut Probes, sock: u64, at: Mono, size: u64) -> u64 {
        p.opened(sock, &haproxy(), "s1", at);
        p.closed(sock, size);
        sock
    }

    /// Checks of 38 bytes every 2 s (+1 ms each), from 0.
    fn learned() -> Probes {
        let mut p = Probes::default();
        for i in 0..4 {
            let s = conn(&mut p, 100 + i, i * 2001 * MS, 38);
            // The checks that teach the schedule were judged before it was known.
            assert_eq!(p.classify(Some(s), Some(38)), None, "check {i}");
        }
        p
    }

    #[test]
    fn four_evenly_spaced_same_size_connections_teach_the_schedule() {
        let mut p = learned();
        // The next tick, a little late: a check; its size decides when known.
        p.opened(1, &haproxy(), "s1", 4 * 2001 * MS + 5 * MS);
        assert_eq!(p.classify(Some(1), None), Some(ProbeSource::Schedule));
        // Decided once: asking again with the size agrees.
        assert_eq!(p.classify(Some(1), Some(38)), Some(ProbeSource::Schedule));
        // A second attempt on the same tick is a request.
        p.opened(2, &haproxy(), "s1", 4 * 2001 * MS + 8 * MS);
        assert_eq!(p.classify(Some(2), None), None);
    }

    #[test]
    fn a_request_accepted_on_a_tick_does_not_take_it_from_the_check() {
        let mut p = learned();
        let next = 4 * 2001 * MS;
        // A request accepted on the tick looks like a check until its size is known...
        p.opened(1, &haproxy(), "s1", next + MS);
        assert_eq!(p.peek(Some(1)), Some(ProbeSource::Schedule));
        // ...and the check accepted just after it too: peeking takes no tick.
        p.opened(2, &haproxy(), "s1", next + 3 * MS);
        assert_eq!(p.peek(Some(2)), Some(ProbeSource::Schedule));
        // The request's size says it is none; the check's says it is one.
        assert_eq!(p.classify(Some(1), Some(120)), None);
        assert_eq!(p.classify(Some(2), Some(38)), Some(ProbeSource::Schedule));
    }

    #[test]
    fn requests_between_ticks_or_of_another_size_are_not_checks() {
        let mut p = learned();
        let next = 4 * 2001 * MS;
        p.opened(1, &haproxy(), "s1", next - 500 * MS);
        assert_eq!(p.classify(Some(1), None), None);
        p.opened(2, &haproxy(), "s1", next + 45 * MS);
        assert_eq!(p.classify(Some(2), None), None, "outside 40 ms");
        p.opened(3, &haproxy(), "s1", next);
        assert_eq!(p.classify(Some(3), Some(120)), None, "another size");
        // Another backend, another process: no schedule there.
        p.opened(4, &haproxy(), "s2", next);
        assert_eq!(p.classify(Some(4), None), None);
        assert_eq!(p.classify(None, None), None);
    }

    #[test]
    fn a_gone_backends_schedule_is_forgotten() {
        let mut p = learned();
        p.forget_backend("s1");
        p.opened(1, &haproxy(), "s1", 4 * 2001 * MS);
        assert_eq!(p.classify(Some(1), None), None);
    }

    #[test]
    fn missed_ticks_keep_the_phase_for_a_few_intervals() {
        let mut p = learned();
        let last = 3 * 2001 * MS;
        p.opened(1, &haproxy(), "s1", last + 3 * 2001 * MS);
        assert_eq!(p.classify(Some(1), None), Some(ProbeSource::Schedule));
        p.opened(2, &haproxy(), "s1", last + 3 * 2001 * MS + 5 * 2001 * MS);
        assert_eq!(p.classify(Some(2), None), None, "more than 4 ticks");
    }

    #[test]
    fn the_schedule_holds_for_as_long_as_the_checks_go_on() {
        let mut p = learned();
        // A minute of checks that fail nothing (never classified), a same-size request
        // between two of them.
        for i in 4..34 {
            conn(&mut p, 100 + i, i * 2001 * MS, 38);
        }
        conn(&mut p, 99, 20 * 2001 * MS + 700 * MS, 38);
        // Then one refused on the next tick: a check.
        p.opened(1, &haproxy(), "s1", 34 * 2001 * MS + 3 * MS);
        assert_eq!(p.classify(Some(1), None), Some(ProbeSource::Schedule));
    }

    #[test]
    fn a_check_the_proxy_closed_first_is_still_a_check_when_the_container_side_asks() {
        let mut p = learned();
        let s = conn(&mut p, 1, 4 * 2001 * MS + 2 * MS, 38);
        assert_eq!(p.peek(Some(s)), Some(ProbeSource::Schedule));
        assert_eq!(p.classify(Some(s), Some(38)), Some(ProbeSource::Schedule));
    }

    #[test]
    fn of_two_refusals_on_one_tick_the_one_on_time_is_the_check() {
        let mut p = learned();
        let due = 3 * 2001 * MS + 2001 * MS;
        // A request refused 12 ms before the tick, the check 1 ms after it: both refusals
        // wait out the tick's window, then the request is judged first.
        p.opened(1, &haproxy(), "s1", due - 12 * MS);
        p.opened(2, &haproxy(), "s1", due + MS);
        let window = due + tolerance(2001 * MS);
        assert_eq!(p.refused(Some(1)).map(|r| r.1), Some(window));
        assert_eq!(p.refused(Some(2)).map(|r| r.1), Some(window));
        assert_eq!(p.classify(Some(1), None), None);
        assert_eq!(p.classify(Some(2), None), Some(ProbeSource::Schedule));
        // Closer to the next tick: a connection of another size, and one still connecting
        // (it may never fail): no rivals.
        let due = due + MS + 2001 * MS;
        p.opened(3, &haproxy(), "s1", due);
        p.closed(3, 120);
        p.opened(4, &haproxy(), "s1", due + MS);
        p.opened(5, &haproxy(), "s1", due + 5 * MS);
        assert_eq!(
            p.refused(Some(5)).map(|r| r.1),
            Some(due + tolerance(2001 * MS))
        );
        assert_eq!(p.classify(Some(5), None), Some(ProbeSource::Schedule));
        // Decided or off any tick: judged at once.
        assert_eq!(p.refused(Some(5)), None);
        p.opened(6, &haproxy(), "s1", due + 900 * MS);
        assert_eq!(p.refused(Some(6)), None);
    }

    #[test]
    fn a_refusal_judged_after_its_socket_was_reused_is_still_that_attempt() {
        let mut p = learned();
        let due = 4 * 2001 * MS;
        p.opened(1, &haproxy(), "s1", due + MS);
        let (attempt, _) = p.refused(Some(1)).expect("on a tick: held");
        // The proxy's next connect (a retry on another server) gets the same socket address
        // before the refusal is judged.
        p.closed(1, 0);
        p.opened(1, &haproxy(), "s2", due + 2 * MS);
        assert_eq!(
            p.classify_attempt(attempt, None),
            Some(ProbeSource::Schedule)
        );
        assert_eq!(p.classify(Some(1), Some(90)), None, "s2's connection");
    }

    #[test]
    fn requests_as_regular_as_the_checks_do_not_take_their_schedule() {
        let mut p = learned();
        // Checks go on every 2001 ms; a client's 87-byte requests every 1334 ms through the
        // same proxy to the same backend.
        for i in 0..8 {
            conn(&mut p, 200 + i, 4 * 2001 * MS + i * 2001 * MS, 38);
            conn(
                &mut p,
                300 + i,
                4 * 2001 * MS + 500 * MS + i * 1334 * MS,
                87,
            );
        }
        let next = 12 * 2001 * MS;
        p.opened(1, &haproxy(), "s1", next + 2 * MS);
        assert_eq!(p.classify(Some(1), None), Some(ProbeSource::Schedule));
        p.opened(
            2,
            &haproxy(),
            "s1",
            4 * 2001 * MS + 500 * MS + 8 * 1334 * MS,
        );
        assert_eq!(
            p.classify(Some(2), None),
            None,
            "a request refused on the client's cadence"
        );
    }

    #[test]
    fn steady_requests_are_never_a_schedule() {
        let mut p = Probes::default();
        // Same-size requests every 200 ms: below the cadence of any check.
        for i in 0..50 {
            conn(&mut p, i, i * 200 * MS, 95);
        }
        // Jittered same-size requests about every 2 s: not even enough.
        for (i, at) in [0, 2000, 4300, 6100, 8400, 10_200].into_iter().enumerate() {
            conn(&mut p, 100 + i as u64, 20 * SECOND + at * MS, 95);
        }
        p.opened(999, &haproxy(), "s1", 32_400 * MS);
        assert_eq!(p.classify(Some(999), None), None);
    }

    #[test]
    fn refusals_on_the_ticks_before_a_schedule_are_its_checks_one_per_tick() {
        let s = Schedule {
            interval: 1000 * MS,
            last: 20_000 * MS,
        };
        // Checks refused 15 and 14 ticks back (a few ms of drift each), a request 300 ms off a
        // tick, two refusals on one tick (the closer is the check), one after the last check.
        let times = [
            5_003 * MS,
            6_002 * MS,
            6_300 * MS,
            7_001 * MS,
            7_040 * MS,
            21_000 * MS,
        ];
        assert_eq!(on_ticks_before(s, &times), [0, 1, 3]);
        // Far off every tick: none.
        assert!(on_ticks_before(s, &[5_500 * MS, 12_400 * MS]).is_empty());
    }

    #[test]
    fn the_kubelets_connections_are_probes() {
        let mut p = Probes::default();
        let kubelet = Proxy {
            tgid: 1,
            name: "kubelet".into(),
            prober: true,
        };
        p.opened(5, &kubelet, "s1", 0);
        assert_eq!(p.classify(Some(5), None), Some(ProbeSource::Kubelet));
        p.closed(5, 0);
        assert_eq!(p.classify(Some(5), None), Some(ProbeSource::Kubelet));
    }
}
