//! One clock for the host, the containers and the harness: `CLOCK_MONOTONIC`.
//!
//! Containers get no time namespace, so the nanosecond timestamps the backend writes in its logs
//! (`time.monotonic_ns()`) are on the host's `CLOCK_MONOTONIC`, the clock `std::time::Instant`
//! uses on Linux and the clock of eBPF's `bpf_ktime_get_ns()`.

use std::time::{Duration, Instant};

/// `CLOCK_MONOTONIC` now, in nanoseconds (the clock of `Instant` and `bpf_ktime_get_ns`).
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The `Instant` of a `CLOCK_MONOTONIC` nanosecond timestamp (to within a microsecond).
pub fn instant_of_mono_ns(ns: u64) -> Instant {
    let (now, now_ns) = (Instant::now(), mono_ns());
    if ns <= now_ns {
        now - Duration::from_nanos(now_ns - ns)
    } else {
        now + Duration::from_nanos(ns - now_ns)
    }
}

/// The `CLOCK_MONOTONIC` nanosecond timestamp of an `Instant` (to within a microsecond).
pub fn mono_ns_of(t: Instant) -> u64 {
    let (now, now_ns) = (Instant::now(), mono_ns());
    if t <= now {
        now_ns - (now - t).as_nanos() as u64
    } else {
        now_ns + (t - now).as_nanos() as u64
    }
}

/// Signed seconds from `base` to `t` (negative when `t` is earlier), for printing timelines.
pub fn secs_since(base: Instant, t: Instant) -> f64 {
    if t >= base {
        (t - base).as_secs_f64()
    } else {
        -(base - t).as_secs_f64()
    }
}

/// Sleeps until `t` (returns at once if it has passed).
pub fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}
