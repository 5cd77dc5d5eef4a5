//! The stream lab over randomized shapes: each seed draws how many clients hold streams, how
//! long the server lets a stream live (the longest lifetime, and how lifetimes vary below it:
//! all the same, 0.8–1.0 or 0.2–1.0 of it), how often it sends (an event period within the 1 s
//! activity window), when the stop comes (after a warm-up, or 2 s after the fleet started),
//! how the server drains (streams run to their own deadlines, or all end at once on SIGTERM)
//! and the grace period, from well below the longest lifetime (SIGKILL cuts most streams) to
//! above it (every stream ends on its own). The stop record is compared with what the clients
//! saw (the server's final event or a cut) and the server's log (the lifetime it drew for each
//! stream, why it ended each). Also the truth of the fixed stream tests
//! (`tests/tests/streams.rs`).

use std::{fmt, time::Duration};

use serde_json::Value;

use super::{Check, loss};
use crate::{
    agent::{Agent, stop_record},
    lab::{Lifetimes, SseLab, SseRun, SseSpec, StopAt, StreamDrain},
};

/// One randomized stream stop.
#[derive(Clone, Debug)]
pub struct StreamsShape {
    pub seed: u64,
    pub spec: SseSpec,
}

impl StreamsShape {
    pub fn from_seed(seed: u64) -> StreamsShape {
        let mut rng = fastrand::Rng::with_seed(seed);
        let rotation = Duration::from_millis(rng.u64(3000..=7000));
        let mut spec = SseSpec::new(
            rng.usize(10..=50),
            rotation,
            rng.u32(1..=rotation.as_secs() as u32 + 3),
        );
        spec.event = Duration::from_millis(rng.u64(100..=800));
        spec.lifetimes = [Lifetimes::Fixed, Lifetimes::Jittered, Lifetimes::Spread][rng.usize(..3)];
        spec.stop_at = if rng.u32(..3) == 0 {
            StopAt::Early
        } else {
            StopAt::Warm
        };
        spec.drain = if rng.u32(..4) == 0 {
            StreamDrain::AtOnce
        } else {
            StreamDrain::Timers
        };
        spec.seed = seed;
        StreamsShape { seed, spec }
    }
}

impl fmt::Display for StreamsShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.spec;
        write!(
            f,
            "streams seed {}: {} clients, {} lifetimes up to {:?} with an event every {:?}, {} stop, {} drain, grace {} s",
            self.seed,
            s.clients,
            s.lifetimes.as_str(),
            s.rotation,
            s.event,
            match s.stop_at {
                StopAt::Warm => "warm",
                StopAt::Early => "early",
            },
            s.drain.as_str(),
            s.grace_secs
        )
    }
}

/// The stop's record against the lab's truth (see `checks`), for a shape run with `agent`.
pub struct StreamsCase {
    pub agent: Agent,
    pub lab: SseLab,
    pub run: SseRun,
    pub stop: Value,
}

impl StreamsCase {
    pub fn run_with(agent: Agent, spec: SseSpec) -> StreamsCase {
        let mut lab = SseLab::setup(spec);
        let run = lab.run();
        print!("{}", run.report());
        let stop = stop_record(&agent, &lab.old.id);
        println!(
            "drainwatch: {} lifetimes {} ended {} verdict {:?}",
            stop["loss"],
            stop["stream_lifetimes"],
            stop["streams_ended_by_server"],
            stop["verdict"].as_str().unwrap_or_default()
        );
        StreamsCase {
            agent,
            lab,
            run,
            stop,
        }
    }

    /// Every field the truth knows.
    pub fn checks(&self) -> Vec<Check> {
        let (run, stop) = (&self.run, &self.stop);
        let outcome = if run.old_exit_code == 137 {
            "killed_at_deadline"
        } else {
            "drained"
        };
        // A stream request still queued for accept() when the listener closed is reset by
        // the close: the client lost it, but the server never saw it (a request cut).
        let unaccepted = run.cut_unaccepted();
        let cut = run.cut_on_old() - unaccepted;
        let (deadline, at_once) = run.server_ended_in_stop();
        let ended = &stop["streams_ended_by_server"];
        let num = |v: &Value| v.as_u64().unwrap_or(u64::MAX);
        // Streams whose deadline came within the first 250 ms after the signal may fall in
        // an at-once drain's burst.
        let deadline_early = run.server_ended_at_deadline_within(Duration::from_millis(250));
        let mut checks = vec![
            Check::eq("outcome", outcome, stop["outcome"].as_str().unwrap_or("-")),
            Check::eq("streams_cut", cut, loss(stop, "streams_cut")),
            Check::eq(
                "inflight_cut (stream requests reset in an accept queue)",
                unaccepted + run.queued_reset,
                loss(stop, "inflight_cut"),
            ),
            Check::eq(
                "idle_closed (streams the server ended in the stop)",
                run.rotated_on_old_in_stop(),
                loss(stop, "idle_closed"),
            ),
            Check::eq(
                "the server's own count of streams it never ended",
                cut,
                run.server_opened - run.server_ended,
            ),
            Check::eq(
                "the server's own ends after SIGTERM = the clients'",
                run.rotated_on_old_in_stop(),
                deadline + at_once,
            ),
            Check::count(
                "streams_ended_by_server.at_sigterm",
                (at_once as u64, (at_once + deadline_early) as u64),
                num(&ended["at_sigterm"]),
            ),
            Check::eq(
                "streams_ended_by_server (both)",
                deadline + at_once,
                num(&ended["at_sigterm"]).saturating_add(num(&ended["on_their_timers"])),
            ),
        ];
        let l = &stop["stream_lifetimes"];
        match self.lab.spec.stop_at {
            // Only the shortest streams have ended: nothing may be learned from them.
            StopAt::Early => checks.push(Check::eq(
                "stream_lifetimes (censored: none)",
                "null",
                l.to_string(),
            )),
            StopAt::Warm => {
                checks.push(Check::eq(
                    "stream_lifetimes.shape",
                    self.lab.spec.lifetimes.as_str(),
                    l["shape"].as_str().unwrap_or("-"),
                ));
                // The p95 of the lifetimes the server drew, give or take the sample the
                // agent keeps (the newest 128) and the kernel's view (handshake to close).
                checks.push(Check::within(
                    "stream_lifetimes.p95_seconds",
                    run.drawn_lifetime(0.85) - 0.15,
                    run.drawn_lifetime(0.99) + 0.15,
                    l["p95_seconds"].as_f64().unwrap_or(-1.0),
                ));
            }
        }
        // No false finding: with nothing cut, the verdict names no cut.
        if cut + unaccepted + run.queued_reset == 0 {
            let v = stop["verdict"]
                .as_str()
                .unwrap_or_default()
                .replace("none cut", "");
            checks.push(Check::eq(
                "verdict names no cut when none was",
                false,
                v.contains(" cut") || v.contains("cutting") || v.contains("outlived"),
            ));
        }
        checks
    }
}

/// Runs `shape` with a fresh agent and compares.
pub fn run(shape: &StreamsShape) -> Vec<Check> {
    StreamsCase::run_with(super::start_agent(), shape.spec.clone()).checks()
}
