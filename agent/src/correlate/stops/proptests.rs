//! The stop tracker's invariants over random histories: containers announced, signalled (from
//! outside, stop signals and SIGKILL, repeated), exiting, their cgroups removed, connections
//! opened and closed, in any order, with the clock running. Whatever the history:
//! - a container has at most one open stop;
//! - the records stay within the cap, however many are open (settled ones go first);
//! - every record settles once time runs on far enough, and a settled record never changes;
//! - a complete record has an exit; loss timelines stay within their cap.

use proptest::prelude::*;

use super::{Config, Tracker};
use crate::model::{
    ContainerIdentity, ExitInfo, HashMap, Mono, Observation, SECOND, Sender,
    stop::{MAX_LOSS_EVENTS, SIGKILL, SIGQUIT, SIGTERM, Stop},
};

const KEYS: [&str; 3] = ["c0", "c1", "c2"];
const MAX_STOPS: usize = 4;

#[derive(Debug, Clone)]
enum Step {
    Announce(usize),
    Signal(usize, i32),
    Exit(usize, Option<i32>),
    Removed(usize),
    Opened(usize, u64),
    Closed(usize, u64, bool),
    /// The clock moves on this many milliseconds (the tracker ticks).
    Wait(u64),
}

fn step() -> impl Strategy<Value = Step> {
    let c = 0..KEYS.len();
    prop_oneof![
        c.clone().prop_map(Step::Announce),
        (
            c.clone(),
            prop::sample::select(vec![SIGTERM, SIGQUIT, SIGKILL])
        )
            .prop_map(|(c, s)| Step::Signal(c, s)),
        (
            c.clone(),
            prop::option::of(prop::sample::select(vec![SIGTERM, SIGKILL]))
        )
            .prop_map(|(c, s)| Step::Exit(c, s)),
        c.clone().prop_map(Step::Removed),
        (c.clone(), 1..6u64).prop_map(|(c, s)| Step::Opened(c, s)),
        (c, 1..6u64, any::<bool>()).prop_map(|(c, s, by)| Step::Closed(c, s, by)),
        (1..20_000u64).prop_map(Step::Wait),
    ]
}

fn identity(i: usize) -> ContainerIdentity {
    ContainerIdentity {
        id: KEYS[i].into(),
        name: KEYS[i].into(),
        workload: "w".into(),
        ..Default::default()
    }
}

fn apply(t: &mut Tracker, now: &mut Mono, s: &Step) {
    let key = |i: usize| KEYS[i].to_string();
    // A socket number per container, so two containers never share one.
    let sock = |i: usize, s: u64| (i as u64) << 8 | s;
    let obs = match s {
        Step::Announce(i) => Observation::Container {
            identity: Box::new(identity(*i)),
            listeners: vec![],
            inbound: vec![],
        },
        Step::Signal(i, sig) => Observation::Signal {
            key: std::sync::Arc::new(key(*i)),
            sig: *sig,
            sender: Sender {
                pid: 1,
                comm: "runc".into(),
            },
            ignored: None,
        },
        Step::Exit(i, signal) => Observation::Exit {
            key: std::sync::Arc::new(key(*i)),
            exit: ExitInfo {
                code: Some(signal.map_or(0, |s| 128 + s)),
                signal: *signal,
            },
        },
        Step::Removed(i) => Observation::CgroupRemoved {
            key: std::sync::Arc::new(key(*i)),
        },
        Step::Opened(i, s) => Observation::InboundEstablished {
            peer: [10, 88, 0, 1].into(),
            key: std::sync::Arc::new(key(*i)),
            sock: sock(*i, *s),
            upstream: None,
        },
        Step::Closed(i, s, by_container) => Observation::InboundClosed {
            peer: [10, 88, 0, 1].into(),
            key: std::sync::Arc::new(key(*i)),
            sock: sock(*i, *s),
            by_container: *by_container,
            pending: true,
            upstream: None,
            request_bytes: 10,
            port: 8080,
            activity: Default::default(),
        },
        Step::Wait(ms) => {
            *now += ms * 1_000_000;
            t.tick(*now);
            return;
        }
    };
    *now += 1_000_000;
    t.observe(*now, obs);
}

fn open_per_container(stops: &[Stop]) -> HashMap<String, usize> {
    let mut open: HashMap<String, usize> = HashMap::default();
    for s in stops.iter().filter(|s| !s.settled) {
        *open.entry(s.container.id.clone()).or_default() += 1;
    }
    open
}

/// Every invariant along `steps`, and all settled at the end.
fn check(steps: &[Step]) -> Result<(), TestCaseError> {
    let mut t = Tracker::new(Config {
        max_stops: MAX_STOPS,
        ..Default::default()
    });
    let mut now: Mono = SECOND;
    let mut settled: HashMap<String, Stop> = HashMap::default();
    for s in steps {
        apply(&mut t, &mut now, s);
        let stops = t.stops();
        for (id, n) in open_per_container(stops) {
            prop_assert!(n <= 1, "{id} has {n} open stops after {s:?}");
        }
        let open = stops.iter().filter(|s| !s.settled).count();
        prop_assert!(
            stops.len() <= MAX_STOPS.max(open),
            "{} records",
            stops.len()
        );
        for r in stops {
            prop_assert!(r.events.len() <= MAX_LOSS_EVENTS);
            if r.settled {
                prop_assert!(!r.complete || r.exit_at.is_some(), "complete without exit");
                if let Some(before) = settled.get(&r.id) {
                    prop_assert_eq!(before, r, "a settled record changed");
                }
                settled.insert(r.id.clone(), r.clone());
            }
        }
    }
    // Long after every deadline (grace unknown: 300 s, and 30 s more), all have settled.
    t.tick(now + 400 * SECOND);
    for r in t.stops() {
        prop_assert!(r.settled, "{} never settled", r.id);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn the_tracker_keeps_its_invariants(steps in prop::collection::vec(step(), 1..120)) {
        check(&steps)?;
    }
}

/// Every history the property ever failed on (each was a bug), kept.
#[test]
fn histories_that_once_broke_an_invariant() {
    use Step::*;
    let failed = [
        // The records went past the cap between two ticks.
        vec![
            Announce(0),
            Announce(2),
            Exit(2, None),
            Signal(0, 9),
            Wait(10273),
            Wait(19727),
            Announce(2),
            Exit(2, None),
            Announce(2),
            Signal(2, 15),
            Signal(0, 15),
        ],
        // A connection accepted after the stop settled moved its last accept.
        vec![
            Announce(2),
            Exit(2, None),
            Wait(1700),
            Wait(18645),
            Wait(19655),
            Opened(2, 1),
        ],
        // Signalled after its cgroup was gone, then announced again: two open stops.
        vec![
            Announce(1),
            Removed(1),
            Signal(1, 15),
            Announce(1),
            Signal(1, 15),
        ],
        // Its cgroup removal arrived after the crash record settled.
        vec![
            Announce(2),
            Exit(2, None),
            Wait(4831),
            Wait(13464),
            Wait(12184),
            Wait(9521),
            Removed(2),
        ],
        // A late SIGKILL or exit after a stop settled at its cgroup's removal.
        vec![
            Announce(1),
            Signal(1, 15),
            Removed(1),
            Wait(10000),
            Signal(1, 9),
        ],
        vec![
            Announce(1),
            Signal(1, 15),
            Removed(1),
            Wait(10000),
            Exit(1, None),
        ],
    ];
    for steps in failed {
        if let Err(e) = check(&steps) {
            panic!("{steps:?}: {e}");
        }
    }
}
