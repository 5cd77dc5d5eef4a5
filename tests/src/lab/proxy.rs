//! What the lab's proxies (HAProxy, nginx) share: durations in their configuration, waiting
//! for their logs.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

/// A duration in milliseconds, as both configuration languages write it (`2000ms`).
pub(super) fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// Waits (bounded) until a proxy's log, as `logged` reads it by request id, holds every id in
/// `ids`; returns what it holds then.
pub(super) fn wait_logged<T>(
    ids: &[&str],
    timeout: Duration,
    logged: impl Fn() -> HashMap<String, T>,
) -> HashMap<String, T> {
    let deadline = Instant::now() + timeout;
    loop {
        let by_id = logged();
        if ids.iter().all(|id| by_id.contains_key(*id)) || Instant::now() > deadline {
            return by_id;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
