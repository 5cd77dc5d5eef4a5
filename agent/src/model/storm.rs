//! A reconnect storm record: how many clients came back after a stop, how fast, how long they
//! waited in the accept queue, and the window that would have avoided the wait
//! (`correlate::storms` detects them).

use super::Mono;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Storm {
    pub namespace: String,
    pub workload: String,
    /// The container (name) whose listener took the storm, and the port.
    pub container: String,
    pub port: u16,
    /// The stop that caused it.
    pub stop_id: String,
    pub first_arrival: Mono,
    pub last_arrival: Mono,
    /// Clients that came back: their first connections when known (sessions the stop cut
    /// whose clients returned), else every arrival.
    pub clients: u64,
    /// Every connection that arrived, a client's follow-ups (a Socket.IO client's polling and
    /// upgrade connections, opened once the server answered its first) included.
    pub connections: u64,
    /// First to last of the clients' first connections, when known: the clients' own
    /// reconnect window, which the service's answers cannot stretch.
    pub first_attempts_seconds: Option<f64>,
    /// Arrivals per 100 ms, from the first arrival.
    pub arrivals_per_bucket: Vec<u32>,
    pub seconds_to_95_percent: f64,
    pub peak_arrivals_per_second: f64,
    pub max_queue_depth: u32,
    pub overflows: u64,
    /// Growth of the namespace's `ListenOverflows` / `ListenDrops` during the storm (these
    /// include SYNs the kernel dropped without a drop reason).
    pub netns_listen_overflows: Option<u64>,
    pub netns_listen_drops: Option<u64>,
    /// Accept waits seen, sorted.
    pub accept_waits: Vec<f64>,
    /// Accepts per second while connections were queued: the service's capacity. None when
    /// the queue never backed up (the clients came back slower than it accepts).
    pub sustained_accept_rate: Option<f64>,
    /// Clients ÷ sustained accept rate: the reconnect window that would have avoided waiting.
    /// None when nothing queued, or when it is no wider than the clients' own window (first
    /// to last arrival): the service kept up.
    pub recommended_window_seconds: Option<f64>,
}

impl Storm {
    pub fn accept_wait_quantile(&self, q: f64) -> Option<f64> {
        let n = self.accept_waits.len();
        if n == 0 {
            return None;
        }
        let i = ((q * n as f64).ceil() as usize).clamp(1, n) - 1;
        Some(self.accept_waits[i])
    }
}
