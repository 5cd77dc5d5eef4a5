//! What the lab's proxies (HAProxy, nginx) share when writing their configuration.

use std::time::Duration;

/// A duration in milliseconds, as both configuration languages write it (`2000ms`).
pub(super) fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}
