//! A Socket.IO fleet with the real libraries against the real agent (issue 41): socket.io 4.8
//! and socket.io-client 4.8 from npm (`tests/lab/socketio/`, `cargo xtask setup` installs
//! them), the host's Node in podman containers. CI-sized ([`ci_spec`]): 500 clients,
//! websocket-only, the library's default reconnection, a server with no SIGTERM handler whose
//! `io.use` middleware waits for one of 5 pool connections and a 20 ms query; the server
//! stopped and a replacement started at the same address, listening 0.5 s after it starts
//! (see `drainwatch_tests::lab::socketio`).
//!
//! The lab runs once (about 35 s); each test below asserts one property of the records against
//! the clients', the servers' and the namespaces' own records (`accuracy::socketio` has the
//! checks, and prints every one with its truth and drainwatch's figure). The heavier shapes
//! (the published setups with 500 and 1,500 clients, default transports, CPU-bound
//! authorisation, SIGKILL at the deadline) are in `cargo xtask accuracy --lab socketio`
//! (seeds 1–6: the setups).

use std::{
    panic::{AssertUnwindSafe, catch_unwind},
    sync::Mutex,
    time::{Duration, Instant},
};

use drainwatch_tests::{
    accuracy::{
        Check,
        socketio::{PROPERTIES, SioCase, property},
    },
    lab::socketio::{AuthWork, SioSpec, Transports},
};

/// 500 clients, websocket-only, a pool of 5 in front of a 20 ms query (250 authorisations/s:
/// the clients need a 2 s window, twice the spread of their first attempts), the replacement
/// listening 0.5 s after it starts (its namespace refuses the first attempts meanwhile).
fn ci_spec() -> SioSpec {
    let auth = AuthWork::Io {
        pool: 5,
        query: Duration::from_millis(20),
    };
    let mut spec = SioSpec::new(500, Transports::Websocket, auth);
    spec.listen_delay = Duration::from_millis(500);
    spec
}

/// The lab's checks once it has run (or why it could not), shared by the tests.
static OUTCOME: Mutex<Option<Result<Vec<Check>, String>>> = Mutex::new(None);

fn checks() -> Vec<Check> {
    let mut guard = OUTCOME.lock().unwrap_or_else(|e| e.into_inner());
    let outcome = guard.get_or_insert_with(|| {
        let t = Instant::now();
        let spec = ci_spec();
        let r = catch_unwind(AssertUnwindSafe(|| SioCase::run(spec).checks()));
        println!("socket.io lab ran in {:.1} s", t.elapsed().as_secs_f64());
        r.map_err(|e| {
            e.downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "the lab panicked".into())
        })
        .inspect(|checks| {
            for p in PROPERTIES {
                let of: Vec<&Check> = checks.iter().filter(|c| property(c) == p).collect();
                let exact = of.iter().filter(|c| c.exact()).count();
                println!("{p}: {exact}/{} exact", of.len());
                for c in of {
                    let mark = if c.exact() { "ok  " } else { "DIFF" };
                    println!(
                        "  {mark} {}: truth {} drainwatch {}",
                        c.field, c.truth, c.drainwatch
                    );
                }
            }
        })
    });
    match outcome {
        Ok(c) => c.clone(),
        Err(e) => panic!("the Socket.IO lab did not run: {e}"),
    }
}

/// Every check of `p` is exact.
fn holds(p: &str) {
    let all = checks();
    let of: Vec<&Check> = all.iter().filter(|c| property(c) == p).collect();
    assert!(!of.is_empty(), "no checks of {p}");
    let wrong: Vec<&&Check> = of.iter().filter(|c| !c.exact()).collect();
    assert!(wrong.is_empty(), "{p}: against the truth: {wrong:#?}");
}

/// The truth holds together: every client connected, lost its session at the stop and came
/// back; the old server died of SIGTERM; the refusals after the replacement started are within
/// the RSTs its namespace sent by its listen.
#[test]
fn the_labs_truth_holds_together() {
    holds("lab");
}

/// A server with no SIGTERM handler run with `--init` dies of the signal: `exit_at_once`.
#[test]
fn the_stop_is_an_exit_at_once() {
    holds("stop");
}

/// Every client lost its session at the exit and reconnected at once: `loss.sessions_cut`
/// is their count, and nothing of it is `idle_closed`, `inflight_cut` or `streams_cut`.
#[test]
fn sessions_cut_are_the_clients_that_reconnected() {
    holds("sessions");
}

/// Refusals are on the record of the namespace that sent them: the replacement's RSTs before
/// its listen are its start's `refused_before_listen`, never the old stop's.
#[test]
fn refusals_are_on_the_record_of_the_namespace_that_sent_them() {
    holds("refusals");
}

/// One return, one storm record, whose clients are the clients' first connections.
#[test]
fn the_storms_demand_is_the_clients_first_connections() {
    holds("demand");
}

/// The accept wait is the kernel's; the capacity is what the server served while saturated
/// (its own log of authorisations: the middleware's pool, after `accept()`, which the kernel
/// times by the server's answers in the storming namespace), within 10%; the window is
/// clients ÷ that rate (within 10%), given only when the clients' first attempts were spread
/// narrower than it.
#[test]
fn the_window_is_the_clients_over_the_servers_served_rate() {
    holds("capacity");
}

/// The replacement's `ListenOverflows` (a new namespace: from 0).
#[test]
fn the_replacements_listen_overflows_are_on_the_storm() {
    holds("counters");
}
