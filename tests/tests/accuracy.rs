//! Ground truth over randomized shapes (`drainwatch_tests::accuracy`): every seed's stop record
//! field by field against the proxies' and backends' own logs. `DRAINWATCH_ACCURACY_SEEDS`
//! picks the seeds (`FIRST-LAST` or `a,b,c`, drawn from `Draw::Wide`; `slow:` in front draws
//! from `Draw::Slow`; `regressions`: every seed that ever failed; `cargo xtask accuracy` sets
//! it); by default a short slice for CI. Slow 16 and 23 (HAProxy L7 retries, a retry
//! sometimes missed) and Wide 45 (nginx pooled, an abort once counted twice) still fail at
//! times: not in CI until fixed.

use std::collections::BTreeMap;

use drainwatch_tests::{
    accuracy::{Check, Draw, Shape, run},
    require_root,
};

/// Seeds that once found a mismatch, with the distribution they drew from: each is run every
/// time.
/// - 1, 3, 11, 16, 18, 20, 23, 25, 27, 29: HAProxy's failed checks were read before its last
///   ones (the truth was short by one); now read once it marked the server DOWN.
/// - 29 (HAProxy, `retries 0`, a request every 27 ms): a false retry duplicate. HAProxy read a
///   new client request, then the cuts, then connected for that request: the chain opened at
///   the cut read took it. Chains now open at the proxy's close of the cut socket.
/// - 3, 16, 23, 27 (HAProxy L7 retries): retries missed (called aborts), for the same reason.
/// - Wide 2, 5, 7, 12, 15, 17, 19, 21, 23, 26, 31, 33, 34, 35, 40, 42, 45, 48, 50 (stops in
///   the stream's first few hundred ms): cuts missed. The proxy was known only after its
///   first connect reached the agent; the requests it sent meanwhile went unaccounted.
///   Connections to containers are now followed in the kernel from their connect.
///
/// Known, not fixed, not listed (it passed when run again): Wide 66 (HAProxy `retries 0`, a
/// request every 9 ms, stop 231 ms in) once read 17 upstream aborts for HAProxy's 18 `SH`.
/// Likely a connection reset while HAProxy was still to send the request: no request bytes,
/// so no cut.
const REGRESSIONS: &[(Draw, u64)] = &[
    (Draw::Slow, 1),
    (Draw::Slow, 3),
    (Draw::Slow, 11),
    (Draw::Slow, 16),
    (Draw::Slow, 18),
    (Draw::Slow, 20),
    (Draw::Slow, 23),
    (Draw::Slow, 25),
    (Draw::Slow, 27),
    (Draw::Slow, 29),
    (Draw::Wide, 2),
    (Draw::Wide, 5),
    (Draw::Wide, 7),
    (Draw::Wide, 12),
    (Draw::Wide, 15),
    (Draw::Wide, 17),
    (Draw::Wide, 19),
    (Draw::Wide, 21),
    (Draw::Wide, 23),
    (Draw::Wide, 26),
    (Draw::Wide, 31),
    (Draw::Wide, 33),
    (Draw::Wide, 34),
    (Draw::Wide, 35),
    (Draw::Wide, 40),
    (Draw::Wide, 42),
    (Draw::Wide, 45),
    (Draw::Wide, 48),
    (Draw::Wide, 50),
];

/// The slice CI runs when no seeds are given.
const CI_SEEDS: &[u64] = &[1, 2, 3];

fn seeds() -> Vec<(Draw, u64)> {
    let Ok(spec) = std::env::var("DRAINWATCH_ACCURACY_SEEDS") else {
        return CI_SEEDS.iter().map(|&n| (Draw::Wide, n)).collect();
    };
    if spec == "regressions" {
        return REGRESSIONS.to_vec();
    }
    let (draw, spec) = match spec.strip_prefix("slow:") {
        Some(rest) => (Draw::Slow, rest.to_string()),
        None => (Draw::Wide, spec),
    };
    let parse = |t: &str| {
        t.trim()
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("DRAINWATCH_ACCURACY_SEEDS: {t:?} is no seed"))
    };
    let seeds: Vec<u64> = match spec.split_once('-') {
        Some((a, b)) => (parse(a)..=parse(b)).collect(),
        None => spec.split(',').map(parse).collect(),
    };
    seeds.into_iter().map(|n| (draw, n)).collect()
}

#[test]
fn retries_and_health_checks_equal_the_logs_over_random_shapes() {
    require_root();
    // field -> (exact, runs)
    let mut exactness: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    let mut failed: Vec<(String, Vec<Check>)> = Vec::new();
    let seeds = seeds();
    let started = std::time::Instant::now();
    for (draw, seed) in &seeds {
        let shape = Shape::from_seed(*seed, *draw);
        println!("=== {shape}");
        let checks = run(&shape);
        for c in &checks {
            let e = exactness.entry(c.field).or_default();
            e.0 += usize::from(c.exact());
            e.1 += 1;
        }
        let wrong: Vec<Check> = checks.into_iter().filter(|c| !c.exact()).collect();
        if !wrong.is_empty() {
            println!("MISMATCH {shape}: {wrong:?}");
            failed.push((shape.to_string(), wrong));
        }
    }
    println!(
        "\n{} seeds in {:.0} s; per-field exactness:",
        seeds.len(),
        started.elapsed().as_secs_f64()
    );
    for (field, (exact, runs)) in &exactness {
        println!("  {field:<28} exact {exact}/{runs}");
    }
    assert!(
        failed.is_empty(),
        "mismatches (keep each seed in REGRESSIONS once fixed):\n{failed:#?}"
    );
}
