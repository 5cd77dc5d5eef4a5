//! The storm lab over randomized shapes: each seed draws the fleet (how many clients), the
//! service's connect path (workers × authorisation time: its capacity), the clients' reconnect
//! jitter (from all at once, far beyond the capacity, to spread wider than needed) and whether
//! the container is replaced or restarted in place. The storm record is compared with what the
//! clients counted and timed and with the namespace's own `ListenOverflows`. Also the truth of
//! the fixed storm tests (`tests/tests/storms.rs`).
//!
//! The backlog stays large: a listener that drops handshakes hides them from the clients'
//! count of arrivals (`tests/tests/listen_overflow.rs` tests overflows).

use std::{
    fmt,
    time::{Duration, Instant},
};

use serde_json::Value;

use super::Check;
use crate::{
    agent::{Agent, api, get, sync},
    lab::{Replace, StormLab, StormRun, StormSpec, clock, storm::quantile},
};

/// One randomized storm.
#[derive(Clone, Debug)]
pub struct StormShape {
    pub seed: u64,
    pub spec: StormSpec,
}

impl StormShape {
    pub fn from_seed(seed: u64) -> StormShape {
        let mut rng = fastrand::Rng::with_seed(seed);
        let replace = if rng.u32(0..4) == 0 {
            Replace::InPlace
        } else {
            Replace::Rolling
        };
        let mut spec = StormSpec::new(0, (Duration::ZERO, Duration::ZERO), replace);
        spec.workers = rng.u32(5..=20);
        spec.auth = Duration::from_millis(rng.u64(10..=40));
        // At most 5 s of the service's capacity each way (the fleet connects through it too).
        let capacity = spec.capacity();
        spec.clients = rng.usize(300..=2000).min((capacity * 5.0) as usize);
        let needed = spec.clients as f64 / capacity;
        // From a tenth of the window the service needs to three times it.
        let width = needed * (0.1 + 2.9 * rng.f64());
        let lo = Duration::from_millis(rng.u64(0..=1000));
        spec.jitter = (lo, lo + Duration::from_secs_f64(width));
        spec.seed = seed;
        StormShape { seed, spec }
    }
}

impl fmt::Display for StormShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.spec;
        write!(
            f,
            "storm seed {}: {:?}, {} clients back within {:.3}–{:.3} s, {} workers × {} ms ({:.0} connects/s: {:.2} s needed)",
            self.seed,
            s.replace,
            s.clients,
            s.jitter.0.as_secs_f64(),
            s.jitter.1.as_secs_f64(),
            s.workers,
            s.auth.as_millis(),
            s.capacity(),
            s.clients as f64 / s.capacity()
        )
    }
}

/// Runs `shape` with a fresh agent and compares.
pub fn run(shape: &StormShape) -> Vec<Check> {
    StormCase::run(shape.spec.clone()).checks()
}

/// One storm: the agent, the lab, the clients' truth and the agent's storm record.
pub struct StormCase {
    pub agent: Agent,
    pub lab: StormLab,
    pub run: StormRun,
    pub storm: Value,
}

/// `/api/v1/storms` (it carries no processed-until header: `sync` first).
fn storms_json(agent: &Agent) -> Value {
    let (status, _, body) =
        get(agent.port, "/api/v1/storms", "application/json").expect("agent answers");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("JSON")
}

/// The storm records of `workload`, once one is there and everything before is processed.
fn storms_of(agent: &Agent, workload: &str) -> Vec<Value> {
    let of = |v: &Value| -> Vec<Value> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["workload"] == workload)
            .cloned()
            .collect()
    };
    // A storm ends after a quiet second and is summarised at the agent's next tick.
    let deadline = Instant::now() + Duration::from_secs(20);
    while of(&storms_json(agent)).is_empty() {
        assert!(
            Instant::now() < deadline,
            "no storm for {workload} within 20 s: {:#}",
            storms_json(agent)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    sync(agent);
    of(&storms_json(agent))
}

/// How far behind the agent's event processing is, sampled every 100 ms on its own thread:
/// (when, kernel time now - newest event processed, events lost so far). A pipeline that stalls
/// splits storms (they end after a quiet second) and overflows the ring buffer: this says so.
struct LagProbe {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<(Instant, f64, f64)>>,
}

impl LagProbe {
    fn start(port: u16) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut out = Vec::new();
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                let now = clock::mono_ns();
                let processed = get(port, "/api/v1/deploys", "application/json").ok();
                if let (Some((200, headers, _)), Ok((200, _, body))) =
                    (processed, get(port, "/metrics", "text/plain"))
                {
                    let processed: Option<u64> = headers
                        .iter()
                        .find(|(k, _)| k == "x-drainwatch-processed-until-ns")
                        .and_then(|(_, v)| v.parse().ok());
                    let lost: f64 = body
                        .lines()
                        .filter(|l| l.starts_with("drainwatch_events_lost_total{"))
                        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                        .sum();
                    let lag = processed.map_or(-1.0, |p| (now as f64 - p as f64) / 1e9);
                    out.push((Instant::now(), lag, lost));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            out
        });
        Self { stop, thread }
    }

    fn finish(self) -> Vec<(Instant, f64, f64)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().expect("lag probe")
    }
}

fn num(v: &Value, k: &str) -> f64 {
    v[k].as_f64()
        .unwrap_or_else(|| panic!("{k} is not a number in {v:#}"))
}

impl StormCase {
    /// Starts an agent, runs the storm lab and reads the one storm of its workload. Lost
    /// events make every count meaningless: that fails here, with when they were lost.
    pub fn run(spec: StormSpec) -> StormCase {
        let agent = super::start_agent();
        let mut lab = StormLab::setup(spec);
        let probe = LagProbe::start(agent.port);
        let run = lab.run();
        let lag = probe.finish();
        print!("{}", run.report());
        let worst = lag.iter().max_by(|a, b| a.1.total_cmp(&b.1));
        let first_loss = lag.iter().find(|l| l.2 > 0.0);
        println!(
            "agent: processing lag max {} ({} samples), events lost {}{}",
            worst.map_or("-".into(), |(t, l, _)| format!(
                "{l:.3}s at {:+.3}s",
                clock::secs_since(run.stop.issued, *t)
            )),
            lag.len(),
            lag.last().map_or(0.0, |l| l.2),
            first_loss.map_or(String::new(), |(t, _, n)| format!(
                " (first {n} by {:+.3}s)",
                clock::secs_since(run.stop.issued, *t)
            ))
        );
        let storms = storms_of(&agent, &run.spec.workload);
        println!("drainwatch: {:#}", Value::Array(storms.clone()));
        for stage in ["ringbuf", "queue", "decode"] {
            let lost = agent.metric(&format!(
                "drainwatch_events_lost_total{{stage=\"{stage}\"}}"
            ));
            assert_eq!(
                lost,
                Some(0.0),
                "events lost at {stage}: counts cannot be exact (see the agent line above for when)"
            );
        }
        assert_eq!(storms.len(), 1, "one storm for the workload");
        let storm = storms.into_iter().next().expect("one storm");
        StormCase {
            agent,
            lab,
            run,
            storm,
        }
    }

    /// The stop record of the old container: the one the storm must be linked to.
    pub fn old_stop(&self) -> Value {
        let (_, stops) = api(&self.agent, "/api/v1/stops");
        let mine: Vec<&Value> = stops
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["container"]["id"] == self.lab.old.id.as_str())
            .collect();
        assert_eq!(mine.len(), 1, "one stop of the old container: {stops:#}");
        mine[0].clone()
    }

    /// The start records of the old container (a restart in place starts it again).
    pub fn old_starts(&self) -> Vec<Value> {
        let (_, starts) = api(&self.agent, "/api/v1/starts");
        starts
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["container"]["id"] == self.lab.old.id.as_str())
            .cloned()
            .collect()
    }

    /// The client-side accept wait quantile `q` and the agent's `key`.
    /// The accept wait's quantile `q` from the server's own log (its `accept()` returned,
    /// carried in the greeting, minus the client's `connect()` returned), and the agent's.
    /// Not the clients' `greeted - connected - auth`: that adds whatever held the greeting up
    /// after accept() (storm seed 401 on a starved machine: p95 15.1 s, the server's 1.7 s).
    pub fn waits(&self, q: f64, key: &str) -> (f64, f64) {
        let server = quantile(&self.run.server_waits(), q).expect("server waits");
        (server, num(&self.storm, key))
    }

    /// Every field of the storm record the clients' truth knows, and the lab's own
    /// preconditions (prefixed `lab:`): identity and links, the exact client count, no loss in
    /// the accept path, arrival timing and accept waits as the server logged them.
    pub fn checks(&self) -> Vec<Check> {
        let (s, run) = (&self.storm, &self.run);
        let text = |v: &Value| v.as_str().unwrap_or("-").to_string();
        let stop_id = self.old_stop()["id"].clone();
        let (_, deploys) = api(&self.agent, "/api/v1/deploys");
        let deploy_id = deploys
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| {
                d["stops"]
                    .as_array()
                    .is_some_and(|st| st.contains(&stop_id))
            })
            .map_or("no deploy holds the stop".to_string(), |d| text(&d["id"]));
        let rolling = run.spec.replace == Replace::Rolling;
        let arrivals = run.arrivals().len();
        let buckets: u64 = s["arrivals_per_100ms"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_u64)
            .sum();
        let mut checks = vec![
            Check::eq("workload", &run.spec.workload, text(&s["workload"])),
            Check::eq(
                "container (the listener that took it)",
                &run.target_container,
                text(&s["container"]),
            ),
            Check::eq("port", 8080, &s["port"]),
            Check::eq(
                "stop_id (the old container's stop)",
                text(&stop_id),
                text(&s["stop_id"]),
            ),
            Check::eq(
                "deploy_id (the deploy of its stop)",
                deploy_id,
                text(&s["deploy_id"]),
            ),
            Check::eq(
                "lab: clients greeted again",
                run.spec.clients,
                run.clients_back(),
            ),
            // Every client came back exactly once. The handshakes the listener completed after
            // the stop are those, plus any the old server's listener completed while it was
            // closing (its queue reset before the greeting, before or just after the client's
            // connect() returned: only a client reconnecting at once to the same address can
            // meet it).
            Check::eq(
                "lab: handshakes completed after the stop",
                run.spec.clients + run.reset_before_greeting(),
                arrivals,
            ),
            Check::eq(
                "clients (handshakes the clients completed)",
                arrivals,
                &s["clients"],
            ),
            Check::eq("arrivals_per_100ms (sum)", arrivals, buckets),
            Check::eq(
                "overflows (ListenOverflows delta)",
                run.listen_overflows,
                &s["overflows"],
            ),
            Check::eq(
                "netns_listen_overflows",
                run.listen_overflows,
                &s["netns_listen_overflows"],
            ),
            Check::eq("lab: nothing overflowed", 0, run.listen_overflows),
        ];
        if rolling {
            checks.extend([
                Check::eq(
                    "lab: no reconnect to a closing listener",
                    0,
                    run.reset_before_greeting(),
                ),
                // Back to the same address, a client's new port can meet one of the server's
                // own TIME_WAIT sockets (an ACK, a reset, the SYN again): only rolling updates
                // are free of SYN retransmissions.
                Check::eq(
                    "lab: no reconnect needed a SYN retransmission",
                    0,
                    run.syn_retransmitted(),
                ),
            ]);
        }
        // Each handshake completed between its client's connect() start and return, so the
        // kernel's i-th arrival lies between the clients' i-th start and i-th return.
        if let Some((lo, hi)) = run.seconds_to_95_bounds() {
            checks.push(Check::within(
                "seconds_to_95_percent",
                lo - 0.002,
                hi + 0.002,
                num(s, "seconds_to_95_percent"),
            ));
        }
        // The server's accept wait: the lab reads the time after accept() returned, and the
        // client's connect() return may trail the handshake: a quarter, or one authorisation.
        let auth = run.spec.auth.as_secs_f64();
        for (q, key) in [
            (0.5, "accept_wait_p50_seconds"),
            (0.95, "accept_wait_p95_seconds"),
        ] {
            let (server, agent) = self.waits(q, key);
            checks.push(Check::near(key, server, agent, 0.25, auth));
        }
        // The queue as the lab sampled it every 10 ms, against the agent's samples every 100
        // ms: within what arrives or leaves in 100 ms (the peak arrival rate, the capacity) of
        // the lab's maximum.
        let (sampled, _) = run.max_queue();
        let moves = num(s, "peak_arrivals_per_second").max(run.spec.capacity()) * 0.1 + 10.0;
        checks.push(Check::within(
            "max_queue_depth",
            (f64::from(sampled) - moves).max(0.0),
            f64::from(sampled) + moves,
            num(s, "max_queue_depth"),
        ));
        // A backed-up storm gets a recommended window: what the service sustains (its workers
        // ÷ their authorisation time) into the clients. One that barely waited gets none.
        let (server95, _) = self.waits(0.95, "accept_wait_p95_seconds");
        let window = &s["recommended_window_seconds"];
        if server95 > 0.5 {
            let want = run.spec.clients as f64 / run.spec.capacity();
            checks.push(Check::near(
                "recommended_window_seconds",
                want,
                window.as_f64().unwrap_or(-1.0),
                0.25,
                0.0,
            ));
        } else if server95 <= auth {
            checks.push(Check::eq(
                "recommended_window_seconds (no backlog)",
                "null",
                window,
            ));
        }
        checks
    }
}
