//! Ground truth over randomized shapes (`cargo xtask accuracy`): each seed draws a shape of
//! one lab (the retry labs, the stop lab, the storm lab, the stream lab, the Socket.IO lab, the
//! keep-alive lab), runs it against the real agent,
//! and compares every record field the lab's ground truth knows with it: the balancers' and
//! backends' own logs, the clients' own counts and clocks, the kernel's own counters. Never
//! drainwatch's arithmetic.

pub mod keepalive;
pub mod retry;
pub mod socketio;
pub mod stop;
pub mod storm;
pub mod streams;

use std::{fmt, time::Duration};

use serde_json::Value;

use crate::agent::{Agent, stop_record, sync};

pub use retry::{Draw, Shape};

/// One field of a record against its ground truth.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    pub field: &'static str,
    /// The truth as text: a value, or the range the truth allows.
    pub truth: String,
    pub drainwatch: String,
    exact: bool,
}

impl Check {
    /// The field equals the truth.
    pub fn eq(
        field: &'static str,
        truth: impl fmt::Display,
        drainwatch: impl fmt::Display,
    ) -> Check {
        let (truth, drainwatch) = (truth.to_string(), drainwatch.to_string());
        Check {
            field,
            exact: truth == drainwatch,
            truth,
            drainwatch,
        }
    }

    /// The truth is only known to lie in `lo..=hi` (an instant between two observations).
    pub fn within(field: &'static str, lo: f64, hi: f64, drainwatch: f64) -> Check {
        Check {
            field,
            truth: format!("{lo:.3}..{hi:.3}"),
            drainwatch: format!("{drainwatch:.3}"),
            exact: (lo..=hi).contains(&drainwatch),
        }
    }

    /// A count the truth knows exactly (`lo == hi`), or only within `lo..=hi`.
    pub fn count(field: &'static str, (lo, hi): (u64, u64), drainwatch: u64) -> Check {
        if lo == hi {
            Check::eq(field, lo, drainwatch)
        } else {
            Check {
                field,
                truth: format!("{lo}..{hi}"),
                drainwatch: drainwatch.to_string(),
                exact: (lo..=hi).contains(&drainwatch),
            }
        }
    }

    /// A measure of a duration the truth measures with its own noise: within `tolerance` of it
    /// (relative), or `slack` (absolute) for small values.
    pub fn near(
        field: &'static str,
        truth: f64,
        drainwatch: f64,
        tolerance: f64,
        slack: f64,
    ) -> Check {
        Check {
            field,
            truth: format!(
                "{truth:.3} (±{:.0}% or {:.0} ms)",
                tolerance * 100.0,
                slack * 1e3
            ),
            drainwatch: format!("{drainwatch:.3}"),
            exact: (drainwatch - truth).abs() <= (truth * tolerance).max(slack),
        }
    }

    pub fn exact(&self) -> bool {
        self.exact
    }
}

/// Which lab a seed runs, and from which distribution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lab {
    Retry(Draw),
    Stop,
    Storm,
    Streams,
    /// The Socket.IO lab: socket.io and socket.io-client from npm, the server replaced at the
    /// same address.
    Socketio,
    /// The keep-alive lab: clients reusing their connections (without a check, or Node's
    /// `http.Agent` pool) against a server closing them, draining or never closing them.
    Keepalive,
}

impl Lab {
    /// The name a seed list uses: `retry` (the wide draw), `slow` (the retry labs' first
    /// draw), `gone` (the wide draw through nginx with clients giving up), `stop`, `storm`,
    /// `streams`, `socketio`, `keepalive`.
    pub fn parse(name: &str) -> Option<Lab> {
        Some(match name {
            "retry" => Lab::Retry(Draw::Wide),
            "slow" => Lab::Retry(Draw::Slow),
            "gone" => Lab::Retry(Draw::Gone),
            "stop" => Lab::Stop,
            "storm" => Lab::Storm,
            "streams" => Lab::Streams,
            "socketio" => Lab::Socketio,
            "keepalive" => Lab::Keepalive,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Lab::Retry(Draw::Wide) => "retry",
            Lab::Retry(Draw::Slow) => "slow",
            Lab::Retry(Draw::Gone) => "gone",
            Lab::Stop => "stop",
            Lab::Storm => "storm",
            Lab::Streams => "streams",
            Lab::Socketio => "socketio",
            Lab::Keepalive => "keepalive",
        }
    }
}

/// Parses a seed list: items `LAB:FIRST-LAST` or `LAB:a,b,c`, separated by spaces (an item
/// without `LAB:` is the retry labs' wide draw).
pub fn parse_seeds(spec: &str) -> Result<Vec<(Lab, u64)>, String> {
    let mut out = Vec::new();
    for item in spec.split_whitespace() {
        let (lab, seeds) = match item.split_once(':') {
            Some((name, seeds)) => (
                Lab::parse(name).ok_or_else(|| {
                    format!(
                        "{name:?} is no lab (retry, slow, gone, stop, storm, streams, socketio, keepalive)"
                    )
                })?,
                seeds,
            ),
            None => (Lab::Retry(Draw::Wide), item),
        };
        let num = |t: &str| {
            t.trim()
                .parse::<u64>()
                .map_err(|_| format!("{t:?} is no seed"))
        };
        for t in seeds.split(',') {
            match t.split_once('-') {
                Some((a, b)) => out.extend((num(a)?..=num(b)?).map(|n| (lab, n))),
                None => out.push((lab, num(t)?)),
            }
        }
    }
    Ok(out)
}

/// Runs one seed of `lab` with a fresh agent: its shape as text, and the checks.
pub fn run(lab: Lab, seed: u64) -> (String, Vec<Check>) {
    match lab {
        Lab::Retry(draw) => {
            let shape = Shape::from_seed(seed, draw);
            println!("=== {shape}");
            (shape.to_string(), retry::run(&shape))
        }
        Lab::Stop => {
            let shape = stop::StopShape::from_seed(seed);
            println!("=== {shape}");
            (shape.to_string(), stop::run(&shape))
        }
        Lab::Storm => {
            let shape = storm::StormShape::from_seed(seed);
            println!("=== {shape}");
            (shape.to_string(), storm::run(&shape))
        }
        Lab::Streams => {
            let shape = streams::StreamsShape::from_seed(seed);
            println!("=== {shape}");
            (shape.to_string(), streams::run(&shape))
        }
        Lab::Socketio => {
            let shape = socketio::SioShape::from_seed(seed);
            println!("=== {shape}");
            (shape.to_string(), socketio::run(&shape))
        }
        Lab::Keepalive => {
            let shape = keepalive::KaShape::from_seed(seed);
            println!("=== {shape}");
            (shape.to_string(), keepalive::run(&shape))
        }
    }
}

/// The agent for one seed, with the arguments in `DRAINWATCH_ACCURACY_AGENT_ARGS`
/// (space-separated; `cargo xtask accuracy --agent-arg`), for an A/B run of an option.
pub fn start_agent() -> Agent {
    let extra = std::env::var("DRAINWATCH_ACCURACY_AGENT_ARGS").unwrap_or_default();
    let args: Vec<&str> = extra.split_whitespace().collect();
    Agent::start(&args)
}

/// A stop record once its verdicts are in: settled, and an abort is decided a second after its
/// cut (in the agent's event time), so a second and a half more of it.
pub fn settled_stop(agent: &Agent, container_id: &str) -> Value {
    stop_record(agent, container_id);
    std::thread::sleep(Duration::from_millis(1500));
    sync(agent);
    stop_record(agent, container_id)
}

/// `loss.<path>` of a stop record.
pub fn loss(stop: &Value, path: &str) -> u64 {
    let mut v = &stop["loss"];
    for p in path.split('.') {
        v = &v[p];
    }
    v.as_u64()
        .unwrap_or_else(|| panic!("loss.{path} in {stop:#}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_lists_name_their_lab() {
        assert_eq!(
            parse_seeds("1-2 stop:5,7 slow:3 storm:9-9"),
            Ok(vec![
                (Lab::Retry(Draw::Wide), 1),
                (Lab::Retry(Draw::Wide), 2),
                (Lab::Stop, 5),
                (Lab::Stop, 7),
                (Lab::Retry(Draw::Slow), 3),
                (Lab::Storm, 9),
            ])
        );
        assert_eq!(
            parse_seeds("stop:1-2,22"),
            Ok(vec![(Lab::Stop, 1), (Lab::Stop, 2), (Lab::Stop, 22)])
        );
        assert!(parse_seeds("fast:1").is_err());
        assert!(parse_seeds("stop:x").is_err());
    }

    #[test]
    fn a_check_within_a_range_is_exact_inside_it_only() {
        assert!(Check::within("t", 1.0, 2.0, 1.5).exact());
        assert!(!Check::within("t", 1.0, 2.0, 2.1).exact());
        assert!(Check::eq("n", 3, 3u64).exact());
        assert!(!Check::eq("n", 3, 4).exact());
        assert!(Check::near("w", 1.0, 1.2, 0.25, 0.02).exact());
        assert!(!Check::near("w", 0.01, 0.05, 0.25, 0.02).exact());
    }
}
