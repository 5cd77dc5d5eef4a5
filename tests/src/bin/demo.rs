//! `cargo xtask demo`: every deploy-time failure mode, end to end, on this machine: real podman
//! containers behind a real load balancer (HAProxy with health checks, nginx with retries),
//! the real agent watching. Shows what the clients got and what drainwatch saw after each
//! step, prints `drainwatch report`, then keeps the agent up with its deploy page until Ctrl-C.
//!
//! Flags: `--port N` (default 9464, or a free port if that one is taken), `--screenshot PATH`
//! (a PNG of the page at the end, via headless Chromium), `--no-wait` (exit after the report).

use std::{
    fs::File,
    io::Write,
    net::TcpListener,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use drainwatch::{export::verdict, model::LossKind};
use drainwatch_tests::{
    agent::{Agent, api, binary, free_port, get, stop_record, sync},
    browser,
    lab::{
        Lab, Method, Mode, Replace, RetryLab, RetrySpec, ScenarioSpec, StormLab, StormSpec,
        Summary, Trigger, container::unique_name, storm::quantile,
    },
    require_root,
};
use serde_json::Value;

struct Args {
    port: Option<u16>,
    screenshot: Option<PathBuf>,
    wait: bool,
}

fn args() -> Args {
    let mut a = Args {
        port: None,
        screenshot: None,
        wait: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--port" => a.port = it.next().and_then(|p| p.parse().ok()),
            "--screenshot" => a.screenshot = it.next().map(PathBuf::from),
            "--no-wait" => a.wait = false,
            other => {
                eprintln!(
                    "demo: unknown argument {other:?} (flags: --port N, --screenshot PATH, --no-wait)"
                );
                std::process::exit(2);
            }
        }
    }
    a
}

fn say(text: &str) {
    println!("{text}");
    let _ = std::io::stdout().flush();
}

/// `24 ok, 2 cut, 4 refused`.
fn outcomes(s: &Summary) -> String {
    let order = ["ok", "cut", "refused", "timeout", "error"];
    let mut parts: Vec<String> = order
        .iter()
        .filter(|k| s.count(k) > 0)
        .map(|k| format!("{} {k}", s.count(k)))
        .collect();
    for (k, v) in &s.by_outcome {
        if !order.contains(&k.as_str()) {
            parts.push(format!("{v} {k}"));
        }
    }
    parts.join(", ")
}

/// What the agent recorded for a stop, in one line.
/// The verdict on an API stop record, as the page and `drainwatch report` say it.
fn stop_verdict(stop: &Value) -> String {
    serde_json::from_value(stop.clone()).map_or_else(
        |e| format!("(unreadable stop record: {e})"),
        |s| verdict::stop(&s).text,
    )
}

/// The verdict on an API storm record.
fn storm_verdict(storm: &Value) -> String {
    serde_json::from_value(storm.clone()).map_or_else(
        |e| format!("(unreadable storm record: {e})"),
        |s| verdict::storm(&s).text,
    )
}

fn seen(stop: &Value) -> String {
    let loss = &stop["loss"];
    let mut parts = Vec::new();
    // The kinds a user lost, in the agent's display order and words.
    for k in LossKind::ALL.iter().filter(|k| k.info().chip.is_some()) {
        let v = loss[k.as_str()].as_u64().unwrap_or(0);
        if v > 0 && *k != LossKind::IdleClosed {
            parts.push(format!("{v} {}", k.info().words));
        }
    }
    if parts.is_empty() {
        parts.push("nothing lost".into());
    }
    let mut line = format!(
        "{}: {}",
        stop["outcome"].as_str().unwrap_or("in progress"),
        parts.join(", ")
    );
    if let Some(d) = stop["drain_seconds"].as_f64() {
        line += &format!("; drain {d:.3} s");
    }
    if let Some(l) = stop["routing_lag_seconds"].as_f64() {
        line += &format!("; routing lag {l:.3} s");
    }
    line
}

/// Waits (bounded) until every cut of the stop has a proxy verdict (retried or not): every step
/// runs behind a proxy, which decides within its retry window (1 s) after the cut.
fn settled_stop(agent: &Agent, id: &str) -> Value {
    let mut stop = stop_record(agent, id);
    let deadline = Instant::now() + Duration::from_secs(5);
    let decided = |s: &Value| {
        s["loss"]["retry_duplicates"].as_u64().unwrap_or(0)
            + s["loss"]["retried_unexecuted"].as_u64().unwrap_or(0)
            + s["loss"]["upstream_aborts"].as_u64().unwrap_or(0)
    };
    while decided(&stop) < stop["loss"]["inflight_cut"].as_u64().unwrap_or(0)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(200));
        let (_, stops) = api(agent, "/api/v1/stops");
        if let Some(s) = stops
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["container"]["id"] == id)
        {
            stop = s.clone();
        }
    }
    stop
}

fn report_step(agent: &Agent, id: &str, clients: String) {
    let stop = settled_stop(agent, id);
    say(&format!("      clients saw      {clients}"));
    say(&format!("      drainwatch saw   {}", seen(&stop)));
    say(&format!("      verdict          {}", stop_verdict(&stop)));
}

/// A lab kept until the demo ends: removing its other containers and proxies while the agent
/// watches would add stops of their own to the page.
type Kept = Box<dyn std::any::Any>;

/// One HAProxy scenario: backend s1 in `mode`, stopped mid-load.
fn haproxy_step(
    agent: &Agent,
    prefix: &str,
    mode: Mode,
    tune: impl FnOnce(&mut ScenarioSpec),
) -> Kept {
    let mut spec = ScenarioSpec::new(mode, Trigger::Stop { grace_secs: 10 });
    spec.remove_when_down = true;
    spec.backend.name_prefix = Some(prefix.into());
    tune(&mut spec);
    let grace = match spec.trigger {
        Trigger::Stop { grace_secs } => grace_secs,
        Trigger::Crash => 0,
    };
    let waves = spec.waves_before + 1 + spec.waves_after;
    say(&format!(
        "      starting s1 and s2 (podman) behind HAProxy (health check every {:.0} s, down after {})",
        spec.haproxy.inter.as_secs_f64(),
        spec.haproxy.fall
    ));
    let lab = Lab::setup(spec);
    say(&format!(
        "      load: {waves} waves of {} requests, {:.1} s apart; `podman stop -t {grace}` of s1 mid-wave",
        lab.spec.per_wave,
        lab.spec.period.as_secs_f64()
    ));
    let run = lab.run();
    report_step(agent, &lab.s1.id, outcomes(&run.summary));
    Box::new(lab)
}

fn nginx_step(agent: &Agent) -> Kept {
    let mut spec = RetrySpec::new(Method::Get, None);
    spec.backend.name_prefix = Some("nginx-retry".into());
    say(
        "      starting s1 and s2 (podman, no SIGTERM handler) behind nginx (proxy_next_upstream on: its default)",
    );
    let lab = RetryLab::setup(spec);
    say(&format!(
        "      load: GETs of 1.3 s, {} in flight on s1 when it is stopped",
        lab.spec.in_flight
    ));
    let run = lab.run();
    let clients = format!(
        "{}; {} of them ran twice (started on both backends)",
        outcomes(&run.summary),
        run.duplicates.len()
    );
    report_step(agent, &lab.s1.id, clients);
    Box::new(lab)
}

/// A socket service's clients all reconnecting to its replacement at once.
fn storm_step(agent: &Agent) -> Kept {
    const CLIENTS: usize = 2000;
    let mut spec = StormSpec::new(
        CLIENTS,
        (Duration::from_millis(500), Duration::from_millis(1500)),
        Replace::Rolling,
    );
    spec.workload = unique_name("chat");
    say(&format!(
        "      starting old and new (podman, workload {}): a connect path of {:.0} connects/s",
        spec.workload,
        spec.capacity()
    ));
    let mut lab = StormLab::setup(spec);
    say(&format!(
        "      {CLIENTS} clients connect to old; `podman stop` of old; each reconnects to new after 0.5–1.5 s"
    ));
    let run = lab.run();
    let waits = run.client_waits();
    let clients = format!(
        "{} of {CLIENTS} back, 95% within {:.3} s; waited in the accept queue p50 {:.3} s, max {:.3} s",
        run.clients_back(),
        run.seconds_to_95().unwrap_or(0.0),
        quantile(&waits, 0.5).unwrap_or(0.0),
        waits.last().copied().unwrap_or(0.0)
    );
    // A storm ends after a quiet second and is summarised at the agent's next tick (bounded).
    let workload = run.spec.workload.clone();
    let deadline = Instant::now() + Duration::from_secs(20);
    let storm = loop {
        let body = get(agent.port, "/api/v1/storms", "application/json")
            .map(|r| r.2)
            .unwrap_or_default();
        let storms: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let found = storms
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["workload"] == workload.as_str())
            .cloned();
        match found {
            Some(s) => {
                sync(agent);
                break Some(s);
            }
            None if Instant::now() > deadline => break None,
            None => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    say(&format!("      clients saw      {clients}"));
    match storm {
        Some(s) => {
            let g = |k: &str| s[k].as_f64().map_or("-".into(), |v| format!("{v:.3}"));
            say(&format!(
                "      drainwatch saw   {} clients, 95% within {} s, max queue {}, accept wait p50 {} s, max {} s; capacity {} connections/s",
                s["clients"],
                g("seconds_to_95_percent"),
                s["max_queue_depth"],
                g("accept_wait_p50_seconds"),
                g("accept_wait_max_seconds"),
                g("sustained_accept_rate")
            ));
            say(&format!("      verdict          {}", storm_verdict(&s)));
        }
        None => say("      drainwatch saw   no storm record within 20 s"),
    }
    Box::new(lab)
}

fn main() {
    require_root();
    let a = args();
    let port = a.port.unwrap_or_else(|| {
        if TcpListener::bind(("127.0.0.1", 9464)).is_ok() {
            9464
        } else {
            free_port()
        }
    });
    let log_path = std::env::temp_dir().join(format!("drainwatch-demo-{}.log", std::process::id()));
    let log = File::create(&log_path).expect("the agent's log file");
    say("drainwatch demo: each deploy-time failure mode, end to end on this machine, with real");
    say("containers (podman + runc), real load balancers (HAProxy, nginx) and the real agent.");
    say("About three minutes.\n");
    let agent = Agent::start_on(port, &[], Stdio::from(log));
    let url = format!("http://127.0.0.1:{port}/");
    say(&format!(
        "agent  {} (log: {})",
        binary().display(),
        log_path.display()
    ));
    say(&format!(
        "page   {url}   open it now: it updates itself as the demo runs\n"
    ));

    type Step<'a> = (&'a str, &'a str, Box<dyn FnOnce(&Agent) -> Kept + 'a>);
    // Worst first, the right way last (the page lists the newest first: it opens on the fix).
    let steps: Vec<Step> = vec![
        (
            "no SIGTERM handler",
            "s1 dies on SIGTERM's default action with requests in flight; HAProxy routes to it until its health checks fail",
            Box::new(|ag| haproxy_step(ag, "no-handler", Mode::NoHandler, |_| {})),
        ),
        (
            "the same behind nginx: a retry duplicate",
            "s1 is cut mid-request; nginx re-sends the GETs to s2: clients see 200, the work runs twice",
            Box::new(nginx_step),
        ),
        (
            "listener closed on SIGTERM",
            "s1 closes its listener at once and finishes in-flight work; routing has not moved yet",
            Box::new(|ag| haproxy_step(ag, "listener-closed", Mode::CloseListener, |_| {})),
        ),
        (
            "killed at the deadline",
            "s1 fails /health and drains, but a 9 s request meets a 7 s grace period: SIGKILL cuts it",
            Box::new(|ag| {
                haproxy_step(ag, "grace-too-short", Mode::Slow, |spec| {
                    spec.trigger = Trigger::Stop { grace_secs: 7 };
                    spec.backend.drain_delay = Some(Duration::from_secs(5));
                    spec.long_request_ms = Some(9000);
                })
            }),
        ),
        (
            "readiness flip, then drain: the right way",
            "s1 fails /health on SIGTERM, serves 5 s more, closes its listener, finishes, exits 0",
            Box::new(|ag| haproxy_step(ag, "drain", Mode::Drain, |_| {})),
        ),
    ];
    let total = steps.len() + 1;
    let started = Instant::now();
    let mut labs: Vec<Kept> = Vec::new();
    for (i, (title, what, run)) in steps.into_iter().enumerate() {
        say(&format!("[{}/{total}] {title}", i + 1));
        say(&format!("      {what}"));
        let t = Instant::now();
        labs.push(run(&agent));
        say(&format!("      ({:.0} s)\n", t.elapsed().as_secs_f64()));
    }
    say(&format!("[{total}/{total}] reconnect storm"));
    say("      every client of a socket service comes back at once to the replacement");
    let t = Instant::now();
    labs.push(storm_step(&agent));
    say(&format!("      ({:.0} s)\n", t.elapsed().as_secs_f64()));
    say(&format!(
        "all steps done in {:.0} s. drainwatch report:\n",
        started.elapsed().as_secs_f64()
    ));
    let report = Command::new(binary())
        .args(["report", "--agent", &format!("127.0.0.1:{port}")])
        .output()
        .expect("drainwatch report");
    print!("{}", String::from_utf8_lossy(&report.stdout));
    eprint!("{}", String::from_utf8_lossy(&report.stderr));
    if let Some(path) = &a.screenshot {
        match browser::screenshot(&url, path, 1280, 1800) {
            Ok(()) => say(&format!("screenshot of the page: {}", path.display())),
            Err(e) => say(&format!("no screenshot: {e}")),
        }
    }
    if a.wait {
        say(&format!(
            "\nthe agent keeps running: the deploy page is at {url}\n(from elsewhere: ssh -L {port}:127.0.0.1:{port} this-host). Ctrl-C stops it."
        ));
        wait_for_signal();
    }
    // The agent first, so that removing the labs adds nothing to what it showed.
    say("stopping the agent and removing the lab's containers");
    drop(agent);
    drop(labs);
}

fn wait_for_signal() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    });
}
