//! The retry labs over randomized shapes: each seed draws a shape of the retry labs (the proxy and how it is set up, the request interval, size and duration,
//! when the stop comes, HAProxy's check interval and fall), runs it against the real agent,
//! and compares every field of the stop record the lab's ground truth knows: nginx's and
//! HAProxy's own logs, the backends' own work logs, HAProxy's own failed-check count. Never
//! drainwatch's arithmetic.

use std::{fmt, time::Duration};

use serde_json::Value;

use super::{Check, loss, settled_stop};
use crate::lab::{
    Gone, HaproxyRetry, HaproxySteadyLab, Method, NginxOpts, RetryLab, RetrySpec, Stream,
    steady_haproxy::HaproxySteadyRun,
};

/// The proxy in front of the backends, and how it is set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proxy {
    /// nginx, `proxy_next_upstream` left at its default (`error timeout`), or `off`;
    /// `keepalive`: an upstream pool of that many idle connections.
    Nginx {
        retry: bool,
        keepalive: Option<u32>,
    },
    Haproxy(HaproxyRetry),
}

/// One randomized run.
#[derive(Clone, Debug)]
pub struct Shape {
    pub seed: u64,
    pub draw: Draw,
    pub proxy: Proxy,
    pub stream: Stream,
    /// HAProxy's check interval and fall (unused for nginx).
    pub inter: Duration,
    pub fall: u32,
}

/// The distribution a seed draws from. A regression seed names its distribution, so a seed
/// that once failed keeps drawing the shape it failed with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Draw {
    /// The first campaign's: a request every 25–80 ms, the stop 1.2–2.5 s in.
    Slow,
    /// A request every 5–80 ms (log-uniform: high rates are where a new request and a retry
    /// meet in one event-loop turn), the stop within the stream's first half.
    Wide,
    /// As `Wide`, through nginx only, and some clients give up around the stop: a cut whose
    /// client is gone gets no answer, the one socket I/O that otherwise ends its worker's
    /// wait for a retry, so a new same-size request the worker sends next must still not be
    /// taken for one.
    Gone,
}

impl Shape {
    pub fn from_seed(seed: u64, draw: Draw) -> Shape {
        let mut rng = fastrand::Rng::with_seed(seed);
        let proxy = match if draw == Draw::Gone { 0 } else { rng.u32(0..6) } {
            0..=3 => Proxy::Nginx {
                retry: rng.bool(),
                keepalive: rng.bool().then(|| rng.u32(2..=16)),
            },
            4 => Proxy::Haproxy(HaproxyRetry::Off),
            _ => Proxy::Haproxy(HaproxyRetry::L7Redispatch),
        };
        // POSTs only through nginx (the HAProxy labs' truth of a retry needs a GET).
        let method = if matches!(proxy, Proxy::Nginx { .. }) && rng.u32(0..4) == 0 {
            Method::Post(rng.usize(1..=512))
        } else {
            Method::Get
        };
        let stream = match draw {
            Draw::Slow => Stream {
                method,
                interval: Duration::from_millis(rng.u64(25..=80)),
                ms: rng.u64(250..=900),
                waves: rng.usize(6..=10),
                stop_after: Duration::from_millis(rng.u64(1200..=2500)),
                gone: None,
            },
            Draw::Wide | Draw::Gone => {
                let interval = Duration::from_secs_f64(0.005 * 16f64.powf(rng.f64()));
                let waves = rng.usize(6..=10);
                let span = interval * (waves as u32 * 10);
                Stream {
                    method,
                    interval,
                    ms: rng.u64(250..=900),
                    waves,
                    stop_after: span
                        .mul_f64(0.2 + 0.4 * rng.f64())
                        .max(Duration::from_millis(200)),
                    gone: (draw == Draw::Gone).then(|| Gone {
                        seed: rng.u64(..),
                        share: 0.2 + 0.6 * rng.f64(),
                        around: Duration::from_millis(rng.u64(2..=60)),
                        proxy_ignores: rng.bool(),
                    }),
                }
            }
        };
        Shape {
            seed,
            draw,
            proxy,
            stream,
            inter: Duration::from_millis(rng.u64(1000..=2000)),
            fall: rng.u32(2..=3),
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.stream;
        write!(
            f,
            "seed {} ({:?}): {:?}, {:?} every {} ms of {} ms work, {} requests, stop at {} ms",
            self.seed,
            self.draw,
            self.proxy,
            s.method,
            s.interval.as_millis(),
            s.ms,
            s.waves * 10,
            s.stop_after.as_millis()
        )?;
        if let Some(g) = s.gone {
            write!(
                f,
                ", {:.0}% of the clients in flight give up within {} ms of the stop{}",
                g.share * 100.0,
                g.around.as_millis(),
                if g.proxy_ignores {
                    " (proxy_ignore_client_abort on)"
                } else {
                    ""
                }
            )?;
        }
        if matches!(self.proxy, Proxy::Haproxy(_)) {
            write!(
                f,
                ", checks every {} ms, fall {}",
                self.inter.as_millis(),
                self.fall
            )?;
        }
        Ok(())
    }
}

/// Runs `shape` with a fresh agent and compares.
pub fn run(shape: &Shape) -> Vec<Check> {
    let agent = super::start_agent();
    match shape.proxy {
        Proxy::Nginx { retry, keepalive } => {
            let mut spec = RetrySpec::new(shape.stream.method, (!retry).then_some("off"));
            spec.nginx = NginxOpts {
                keepalive,
                ignore_client_abort: shape.stream.gone.is_some_and(|g| g.proxy_ignores),
                ..spec.nginx
            };
            let lab = RetryLab::setup(spec);
            let run = lab.run_steady(&shape.stream);
            print!("{}", run.report());
            assert!(
                run.unlogged.is_empty(),
                "nginx did not log {:?}",
                run.unlogged
            );
            let stop = settled_stop(&agent, &lab.s1.id);
            println!("drainwatch: {}", stop["loss"]);
            let n = |v: &Vec<String>| v.len() as u64;
            let (dups, unexec, maybe) = (
                n(&run.duplicates),
                n(&run.retried_unexecuted),
                n(&run.maybe_read),
            );
            let f = |field| loss(&stop, field);
            vec![
                Check::count(
                    "retry_duplicates",
                    (dups, dups + maybe),
                    f("retry_duplicates"),
                ),
                Check::count(
                    "retried_unexecuted",
                    (unexec - maybe, unexec),
                    f("retried_unexecuted"),
                ),
                Check::eq(
                    "retry_duplicates+retried_unexecuted",
                    dups + unexec,
                    f("retry_duplicates") + f("retried_unexecuted"),
                ),
                Check::eq("upstream_aborts", n(&run.aborts), f("upstream_aborts")),
                // Same-size requests on pooled connections, cut at exit: no stream.
                Check::eq("streams_cut (no streams)", 0, f("streams_cut")),
            ]
        }
        Proxy::Haproxy(retry) => {
            let lab = HaproxySteadyLab::setup(retry, shape.inter, shape.fall);
            let run = lab.run(&shape.stream);
            print!("{}", run.report());
            assert!(
                run.unlogged.is_empty(),
                "HAProxy did not log {:?}",
                run.unlogged
            );
            let stop = settled_stop(&agent, &lab.s1.id);
            println!("drainwatch: {}", stop["loss"]);
            haproxy_checks(retry, &run, &stop)
        }
    }
}

/// The fields HAProxy's log and its check count know. A retried request `s1` never started
/// was cut unread or refused, which the log does not tell apart: with retries on, only their
/// sum is known.
pub fn haproxy_checks(retry: HaproxyRetry, run: &HaproxySteadyRun, stop: &Value) -> Vec<Check> {
    let f = |path| loss(stop, path);
    let probes = f("probes.cut") + f("probes.refused") + f("probes.unreachable");
    let mut checks = vec![
        Check::eq(
            "probes (all failed checks)",
            run.failed_checks as usize,
            probes,
        ),
        Check::eq(
            "probes.by_schedule",
            run.failed_checks as usize,
            f("probes.by_schedule"),
        ),
        Check::count(
            "retry_duplicates",
            (
                run.duplicates.len() as u64,
                (run.duplicates.len() + run.maybe_read.len()) as u64,
            ),
            f("retry_duplicates"),
        ),
        Check::eq("upstream_aborts", run.aborts.len(), f("upstream_aborts")),
        Check::eq("streams_cut (no streams)", 0, f("streams_cut")),
        Check::eq(
            "retried_unexecuted+refused",
            run.retried_not_started.len() + run.refused.len(),
            f("retried_unexecuted") + f("refused"),
        ),
    ];
    if retry == HaproxyRetry::Off {
        checks.extend([
            Check::eq("retried_unexecuted", 0, f("retried_unexecuted")),
            Check::eq("refused", run.refused.len(), f("refused")),
        ]);
    }
    checks
}
