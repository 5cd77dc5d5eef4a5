//! Reconnect storms end to end: the real agent, a socket service in real podman containers
//! whose connect path is bounded (10 concurrent authorisations of 20 ms: 500 connects/s, backlog
//! 4096), N = 2000 persistent clients in this process (see `drainwatch_tests::lab::storm`). The
//! service's container is stopped (a rolling update: the clients reconnect to the replacement of
//! the same workload) or restarted in place, and the agent's storm record is checked against
//! what the clients counted and timed.
//!
//! Which client-side time is the kernel's accept wait: the agent measures handshake completion
//! → `accept()` returning. A client sees `connect()` return at handshake completion and the
//! greeting one authorisation (20 ms) after `accept()`, so its measure is
//! `greeted - connected - 20 ms`. Measuring from `connect()` start instead adds the handshake,
//! which is where a listener that drops SYNs (a full queue) hides whole seconds of SYN
//! retransmission from any accept-queue measure: the client counts them, the queue never held
//! those connections. Hence the large backlog, and the check that no reconnect needed a SYN
//! retransmission and nothing overflowed, before comparing.

use std::time::{Duration, Instant};

use drainwatch_tests::{
    agent::{Agent, api, get, instant, sync},
    lab::{Replace, StormLab, StormRun, StormSpec, clock, storm::quantile},
};
use serde_json::Value;

const N: usize = 2000;

struct Case {
    agent: Agent,
    lab: StormLab,
    run: StormRun,
    storm: Value,
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

fn case(spec: StormSpec) -> Case {
    let agent = Agent::start(&[]);
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
    let storm = storms.into_iter().next().unwrap();
    Case {
        agent,
        lab,
        run,
        storm,
    }
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64()
        .unwrap_or_else(|| panic!("{k} is not a number in {v:#}"))
}

/// |a / b - 1| ≤ tolerance.
fn within(a: f64, b: f64, tolerance: f64) -> bool {
    (a / b - 1.0).abs() <= tolerance
}

impl Case {
    /// The stop record of the old container: the one the storm must be linked to.
    fn old_stop(&self) -> Value {
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

    /// What holds for every storm: identity and link to the stop, exact client count, no loss
    /// in the accept path, arrival timing as the clients saw it.
    fn check_common(&self) {
        let (s, run) = (&self.storm, &self.run);
        assert_eq!(s["workload"], run.spec.workload.as_str());
        assert_eq!(
            s["container"],
            run.target_container.as_str(),
            "the listener that took it"
        );
        assert_eq!(s["port"], 8080);
        assert_eq!(
            s["stop_id"],
            self.old_stop()["id"],
            "caused by the old container's stop"
        );
        let (_, deploys) = api(&self.agent, "/api/v1/deploys");
        let deploy = deploys
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| {
                d["stops"]
                    .as_array()
                    .is_some_and(|st| st.contains(&s["stop_id"]))
            })
            .unwrap_or_else(|| panic!("no deploy holds {}: {deploys:#}", s["stop_id"]));
        assert_eq!(
            s["deploy_id"], deploy["id"],
            "linked to the deploy of its stop"
        );
        // Every client came back exactly once. The handshakes the listener completed after the
        // stop are those, plus any the old server's listener completed while it was closing
        // (its queue reset before the client's connect() returned: only a client reconnecting
        // at once to the same address can meet it).
        assert_eq!(run.clients_back(), N, "clients greeted again");
        if run.spec.replace == Replace::Rolling {
            assert_eq!(
                run.reset_in_handshake(),
                0,
                "no reconnect to a closing listener"
            );
        }
        assert_eq!(
            run.arrivals().len(),
            N + run.reset_in_handshake(),
            "handshakes completed after the stop"
        );
        assert_eq!(
            s["clients"],
            run.arrivals().len() as u64,
            "storm clients = handshakes the clients completed; per 100 ms where they differ: {}",
            self.bucket_diff()
        );
        let buckets: u64 = s["arrivals_per_100ms"]
            .as_array()
            .expect("arrivals_per_100ms")
            .iter()
            .filter_map(Value::as_u64)
            .sum();
        assert_eq!(
            buckets,
            run.arrivals().len() as u64,
            "arrivals per 100 ms add up to the clients"
        );
        // Nothing overflowed, as the agent and the namespace's own counter agree.
        assert_eq!(
            s["overflows"], run.listen_overflows,
            "overflows = ListenOverflows delta"
        );
        assert_eq!(
            s["netns_listen_overflows"], run.listen_overflows,
            "the namespace's ListenOverflows growth, as the agent sampled it"
        );
        assert_eq!(
            run.listen_overflows, 0,
            "backlog {} holds the storm",
            run.spec.backlog
        );
        // No SYN was dropped on the way to a fresh replacement. (Back to the same address, a
        // client's new port can meet one of the server's own TIME_WAIT sockets of the old
        // connections: it answers the SYN with an ACK, the client resets it and sends the SYN
        // again after a few ms; `client_waits` leave the handshake out either way.)
        if run.spec.replace == Replace::Rolling {
            assert_eq!(
                run.syn_retransmitted(),
                0,
                "no reconnect needed a SYN retransmission"
            );
        }
        // First arrival to 95%: each handshake completed between its client's connect() start
        // and return, so the kernel's i-th arrival lies between the clients' i-th start and
        // i-th return (order statistics keep the bounds).
        let (lo, hi) = run.seconds_to_95_bounds().expect("arrivals");
        let t95 = f(s, "seconds_to_95_percent");
        assert!(
            t95 >= lo - 0.002 && t95 <= hi + 0.002,
            "seconds_to_95_percent {t95} outside what the clients saw: {lo:.3}..{hi:.3} s"
        );
    }

    /// A storm faster than the service: the clients waited (p50 over 0.5 s), and the agent's
    /// accept-wait p50 and p95 are within 25% of theirs.
    fn check_queued_waits(&self) {
        for (q, key) in [
            (0.5, "accept_wait_p50_seconds"),
            (0.95, "accept_wait_p95_seconds"),
        ] {
            let (client, agent) = self.waits(q, key);
            println!("accept wait q{q}: clients {client:.3}s, drainwatch {agent:.3}s");
            assert!(client > 0.5, "clients waited (q{q} {client:.3}s)");
            assert!(
                within(agent, client, 0.25),
                "{key} {agent:.3}s vs clients' {client:.3}s: more than 25% apart"
            );
        }
    }

    /// Arrivals per 100 ms, the agent's against the clients' (their `connect()` returns,
    /// bucketed from the agent's first arrival): `[bucket] agent/clients` where they differ.
    fn bucket_diff(&self) -> String {
        let Some(first) = instant(&self.storm["first_arrival_at"]) else {
            return "no first_arrival_at".into();
        };
        let agent: Vec<u64> = self.storm["arrivals_per_100ms"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_u64)
            .collect();
        let mut clients = vec![0u64; agent.len()];
        let mut outside = Vec::new();
        for a in self.run.arrivals() {
            let at = clock::secs_since(first, a.handshake_by().expect("arrivals completed"));
            match clients.get_mut((at / 0.1).floor() as usize) {
                Some(n) if at >= 0.0 => *n += 1,
                _ => outside.push(format!("{at:+.3}s")),
            }
        }
        let mut out: Vec<String> = agent
            .iter()
            .zip(&clients)
            .enumerate()
            .filter(|(_, (a, c))| a != c)
            .map(|(i, (a, c))| format!("[{i}] {a}/{c}"))
            .collect();
        if !outside.is_empty() {
            out.push(format!(
                "clients outside the agent's buckets at {outside:?}"
            ));
        }
        out.join(" ")
    }

    /// The client-side accept wait quantile `q` and the agent's.
    fn waits(&self, q: f64, key: &str) -> (f64, f64) {
        let client = quantile(&self.run.client_waits(), q).expect("client waits");
        (client, f(&self.storm, key))
    }
}

/// Case (a): 2000 clients back within a 0.5–1.5 s jitter window, against 500 connects/s: they
/// need 4 s, so most wait in the accept queue (about 0–3 s, p50 ≈ 1.5 s).
#[test]
fn reconnects_within_one_second_wait_in_the_accept_queue() {
    let spec = StormSpec::new(
        N,
        (Duration::from_millis(500), Duration::from_millis(1500)),
        Replace::Rolling,
    );
    let capacity = spec.capacity();
    let c = case(spec);
    c.check_common();
    let (s, run) = (&c.storm, &c.run);
    assert_eq!(
        run.old_exit_code,
        Some(143),
        "the old server died on SIGTERM"
    );
    // The queue backed up: far beyond the 10 workers, as the agent sampled it.
    let depth = s["max_queue_depth"].as_u64().expect("max_queue_depth");
    assert!(
        depth >= N as u64 / 4 && depth <= run.max_queue().0 as u64 + 50,
        "max_queue_depth {depth}: expected ≥ {} and at most the 10 ms samples' max {}",
        N / 4,
        run.max_queue().0
    );
    c.check_queued_waits();
    // The window the service needed: clients ÷ what it sustains (N / 500 = 4 s).
    let window = f(s, "recommended_window_seconds");
    let want = N as f64 / capacity;
    assert!(
        within(window, want, 0.25),
        "recommended_window_seconds {window:.3} vs N / capacity {want:.3}"
    );
}

/// Case (b): the same clients spread over 2 × N / 500 = 8 s: arrivals at half the capacity,
/// almost none waits; the agent says the window was wide enough.
#[test]
fn reconnects_spread_over_twice_the_needed_window_barely_wait() {
    let window = Duration::from_secs_f64(2.0 * N as f64 / 500.0);
    let spec = StormSpec::new(N, (Duration::ZERO, window), Replace::Rolling);
    let c = case(spec);
    c.check_common();
    let (s, run) = (&c.storm, &c.run);
    let (client95, agent95) = c.waits(0.95, "accept_wait_p95_seconds");
    println!("accept wait p95: clients {client95:.3}s, drainwatch {agent95:.3}s");
    // Near the 20 ms service time: arrivals at half the capacity find a worker free but for
    // chance bunching (10 workers at 50% load: a few % wait, for part of one authorisation),
    // so p95 is within one authorisation; measured: 0 ms (agent), 2 ms (clients).
    let service = run.spec.auth.as_secs_f64();
    assert!(
        agent95 <= service,
        "accept wait p95 {agent95:.3}s: more than one 20 ms authorisation"
    );
    assert!(
        client95 <= service,
        "clients' wait p95 {client95:.3}s: the load did not stay under capacity"
    );
    let depth = s["max_queue_depth"].as_u64().expect("max_queue_depth");
    assert!(
        depth < N as u64 / 20 && run.max_queue().0 < N as u32 / 20,
        "max_queue_depth {depth} (10 ms samples: {}): the queue backed up",
        run.max_queue().0
    );
    // The window was wide enough: nothing to recommend.
    assert!(
        s["sustained_accept_rate"].is_null() && s["recommended_window_seconds"].is_null(),
        "no backlog, so no sustained rate and no recommendation: {s:#}"
    );
}

/// A restart in place: the same container (same id, name and address) stopped and started
/// again; its clients come back to it, and the storm is linked to that container's stop. The
/// jitter window starts at 0 so that some come back during the restart (which takes 0.2–0.8 s
/// here): they are refused and retry after another jitter. The very first can even complete a
/// handshake with the old server's listener, which the kernel closes last when the process
/// exits (tens of ms after its connections): reset in its queue, an arrival all the same.
#[test]
fn a_restart_in_place_storm_belongs_to_the_restarted_container() {
    let spec = StormSpec::new(
        N,
        (Duration::ZERO, Duration::from_secs(1)),
        Replace::InPlace,
    );
    let c = case(spec);
    c.check_common();
    let (s, run) = (&c.storm, &c.run);
    assert_eq!(
        run.target_container, c.lab.old.container,
        "the same container"
    );
    c.check_queued_waits();
    let stop = c.old_stop();
    assert!(
        s["stop_id"]
            .as_str()
            .is_some_and(|id| id.starts_with(&c.lab.old.id[..12])),
        "stop id {} names the container",
        s["stop_id"]
    );
    // Some reconnects reached the address before the server listened again and were refused.
    // The stop counts those refused before the agent adopted the restarted container again
    // (it settles the old stop then), not those between that and the new listen(): printed.
    assert!(run.refused() > 0, "some came back during the restart");
    let refused = stop["loss"]["refused"].as_u64().expect("loss.refused");
    println!("refused: stop record {refused}, clients {}", run.refused());
    assert!(
        refused > 0 && refused <= run.refused() as u64,
        "the stop counts refusals the clients met: {refused} of {}",
        run.refused()
    );
}
