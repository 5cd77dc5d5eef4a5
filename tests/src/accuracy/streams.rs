//! The stream lab over randomized shapes: each seed draws how many clients hold streams, how
//! long the server lets a stream live (its rotation) and how often it sends (an event period
//! within the 1 s activity window), and the grace period, from well below the rotation (SIGKILL
//! cuts most streams) to above it (every stream ends at its rotation). The stop record is
//! compared with what the clients saw (a rotation's final event or a cut) and the server's log.
//! Also the truth of the fixed stream tests (`tests/tests/streams.rs`).

use std::{fmt, time::Duration};

use super::{Check, loss};
use crate::{
    agent::stop_record,
    lab::{SseLab, SseSpec},
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
        StreamsShape { seed, spec }
    }
}

impl fmt::Display for StreamsShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.spec;
        write!(
            f,
            "streams seed {}: {} clients, streams of {:?} with an event every {:?}, grace {} s",
            self.seed, s.clients, s.rotation, s.event, s.grace_secs
        )
    }
}

/// Runs `shape` with a fresh agent and compares.
pub fn run(shape: &StreamsShape) -> Vec<Check> {
    let agent = super::start_agent();
    let mut lab = SseLab::setup(shape.spec.clone());
    let run = lab.run();
    print!("{}", run.report());
    let stop = stop_record(&agent, &lab.old.id);
    println!(
        "drainwatch: {} {}",
        stop["loss"], stop["stream_rotation_seconds"]
    );
    let lifetimes = run.rotation_lifetimes();
    let rotation = lifetimes.iter().sum::<f64>() / lifetimes.len().max(1) as f64;
    let outcome = if run.old_exit_code == 137 {
        "killed_at_deadline"
    } else {
        "drained"
    };
    vec![
        Check::eq("outcome", outcome, stop["outcome"].as_str().unwrap_or("-")),
        Check::eq("streams_cut", run.cut_on_old(), loss(&stop, "streams_cut")),
        Check::eq(
            "idle_closed (rotations in the stop)",
            run.rotated_on_old_in_stop(),
            loss(&stop, "idle_closed"),
        ),
        Check::eq(
            "inflight_cut (no request pending)",
            0,
            loss(&stop, "inflight_cut"),
        ),
        Check::eq(
            "the server's own count of streams it never ended",
            run.cut_on_old(),
            run.server_opened - run.server_ended,
        ),
        Check::within(
            "stream_rotation_seconds",
            rotation - 0.3,
            rotation + 0.3,
            stop["stream_rotation_seconds"].as_f64().unwrap_or(-1.0),
        ),
    ]
}
