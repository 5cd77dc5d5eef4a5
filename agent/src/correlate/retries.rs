//! Proxy retry duplicates: when a backend cuts a proxy's upstream connection with a request
//! pending, did the proxy re-send that request to another backend? A new upstream connection
//! from the same proxy process, to a different backend, opened within the retry window, that
//! carried a request of the same size, is a **retry duplicate** (the client saw a success;
//! the backends did the work twice). A cut with no such follow-up is an **upstream abort**
//! (the client saw a 502 or a reset). Requests are compared by size in bytes, not parsed, so
//! this works for any protocol and through TLS. Pure: fed observations and a clock.

use std::collections::BTreeMap;

pub use crate::model::Proxy;
use crate::model::{HashMap, Mono, SECOND};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    pub at: Mono,
    pub proxy: Proxy,
    /// The backend container that cut it.
    pub backend: String,
    /// Bytes the proxy had sent on the cut connection (the request).
    pub request_bytes: u64,
    /// When the proxy opened the cut connection.
    pub upstream_opened_at: Mono,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Re-sent to `retried_on`; `added` is how much later than the original the retry began.
    Duplicate {
        retried_on: String,
        added_seconds: f64,
    },
    Abort,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub cut: Cut,
    pub verdict: Verdict,
}

#[derive(Debug, Clone)]
struct Upstream {
    proxy: u32,
    backend: String,
    opened_at: Mono,
    /// Bytes sent, once closed.
    closed_bytes: Option<u64>,
    /// Already matched to a cut.
    used: bool,
}

#[derive(Debug)]
pub struct Matcher {
    window: Mono,
    /// Undecided cuts: wait for the window and for candidate connections to close.
    cuts: Vec<Cut>,
    upstreams: HashMap<u64, Upstream>,
    /// How long to wait for a candidate connection to close before deciding anyway.
    max_wait: Mono,
}

impl Matcher {
    pub fn new(window: Mono) -> Self {
        Self {
            window,
            cuts: Vec::new(),
            upstreams: HashMap::default(),
            max_wait: 300 * SECOND,
        }
    }

    pub fn opened(&mut self, sock: u64, proxy: u32, backend: String, at: Mono) {
        self.upstreams.insert(
            sock,
            Upstream {
                proxy,
                backend,
                opened_at: at,
                closed_bytes: None,
                used: false,
            },
        );
    }

    pub fn closed(&mut self, sock: u64, bytes_sent: u64) {
        if let Some(u) = self.upstreams.get_mut(&sock) {
            u.closed_bytes.get_or_insert(bytes_sent);
        }
    }

    pub fn cut(&mut self, cut: Cut) {
        self.cuts.push(cut);
    }

    fn candidates<'a>(&'a self, c: &'a Cut) -> impl Iterator<Item = (&'a u64, &'a Upstream)> + 'a {
        self.upstreams.iter().filter(move |(_, u)| {
            u.proxy == c.proxy.tgid
                && u.backend != c.backend
                && !u.used
                && u.opened_at >= c.at
                && u.opened_at <= c.at + self.window
        })
    }

    /// Decides the cuts that can be decided at `now`, oldest first.
    pub fn tick(&mut self, now: Mono) -> Vec<Decision> {
        let mut out = Vec::new();
        self.cuts.sort_by_key(|c| c.at);
        let mut remaining = Vec::new();
        for cut in std::mem::take(&mut self.cuts) {
            // The oldest matching connection of the right size, in opening order.
            let mut matching: Vec<(u64, Mono)> = self
                .candidates(&cut)
                .filter(|(_, u)| u.closed_bytes == Some(cut.request_bytes))
                .map(|(s, u)| (*s, u.opened_at))
                .collect();
            matching.sort_by_key(|(_, at)| *at);
            if let Some((sock, opened)) = matching.first().copied() {
                let retried_on = self
                    .upstreams
                    .get(&sock)
                    .map(|u| u.backend.clone())
                    .unwrap_or_default();
                if let Some(u) = self.upstreams.get_mut(&sock) {
                    u.used = true;
                }
                let added = opened.saturating_sub(cut.upstream_opened_at) as f64 / SECOND as f64;
                out.push(Decision {
                    cut,
                    verdict: Verdict::Duplicate {
                        retried_on,
                        added_seconds: added,
                    },
                });
                continue;
            }
            let window_over = now > cut.at + self.window;
            let still_open = self.candidates(&cut).any(|(_, u)| u.closed_bytes.is_none());
            if window_over && (!still_open || now > cut.at + self.max_wait) {
                out.push(Decision {
                    cut,
                    verdict: Verdict::Abort,
                });
            } else {
                remaining.push(cut);
            }
        }
        self.cuts = remaining;
        // Forget closed connections no undecided cut can use any more.
        let oldest = self.cuts.iter().map(|c| c.at).min().unwrap_or(now);
        let horizon = oldest.saturating_sub(self.window);
        self.upstreams
            .retain(|_, u| u.closed_bytes.is_none() || u.opened_at >= horizon);
        out
    }

    /// Counts of undecided cuts per proxy (for tests and debugging).
    pub fn pending(&self) -> BTreeMap<u32, usize> {
        let mut m = BTreeMap::new();
        for c in &self.cuts {
            *m.entry(c.proxy.tgid).or_default() += 1;
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Mono = 1_000_000;
    const T: Mono = 1_000 * SECOND;

    fn nginx() -> Proxy {
        Proxy {
            tgid: 77,
            name: "nginx".into(),
            prober: false,
        }
    }

    fn cut(at: Mono, bytes: u64) -> Cut {
        Cut {
            at,
            proxy: nginx(),
            backend: "s1".into(),
            request_bytes: bytes,
            upstream_opened_at: at - 650 * MS,
        }
    }

    #[test]
    fn a_resend_of_the_same_size_to_another_backend_is_a_duplicate() {
        let mut m = Matcher::new(SECOND);
        m.opened(1, 77, "s1".into(), T - 650 * MS);
        m.cut(cut(T, 120));
        m.closed(1, 120);
        m.opened(2, 77, "s2".into(), T + 2 * MS);
        assert!(m.tick(T + 10 * MS).is_empty(), "the retry is still running");
        m.closed(2, 120);
        let d = m.tick(T + 1400 * MS);
        assert_eq!(d.len(), 1);
        assert_eq!(
            d[0].verdict,
            Verdict::Duplicate {
                retried_on: "s2".into(),
                added_seconds: 0.652
            }
        );
    }

    #[test]
    fn no_follow_up_is_an_abort_once_the_window_is_over() {
        let mut m = Matcher::new(SECOND);
        m.cut(cut(T, 120));
        assert!(m.tick(T + 500 * MS).is_empty());
        let d = m.tick(T + SECOND + MS);
        assert_eq!(d[0].verdict, Verdict::Abort);
        assert!(m.pending().is_empty());
    }

    #[test]
    fn two_concurrent_requests_of_equal_size_match_one_to_one() {
        let mut m = Matcher::new(SECOND);
        m.cut(cut(T, 120));
        m.cut(cut(T + MS, 120));
        m.opened(10, 77, "s2".into(), T + 2 * MS);
        m.opened(11, 77, "s2".into(), T + 3 * MS);
        m.closed(10, 120);
        m.closed(11, 120);
        let d = m.tick(T + 2 * SECOND);
        let dups = d
            .iter()
            .filter(|d| matches!(d.verdict, Verdict::Duplicate { .. }))
            .count();
        assert_eq!(dups, 2);
    }

    #[test]
    fn only_one_retry_for_two_cuts_leaves_one_abort() {
        let mut m = Matcher::new(SECOND);
        m.cut(cut(T, 120));
        m.cut(cut(T + MS, 120));
        m.opened(10, 77, "s2".into(), T + 2 * MS);
        m.closed(10, 120);
        let d = m.tick(T + 2 * SECOND);
        let verdicts: Vec<_> = d
            .iter()
            .map(|d| matches!(d.verdict, Verdict::Duplicate { .. }))
            .collect();
        assert_eq!(verdicts, [true, false]);
    }

    #[test]
    fn a_retry_after_the_window_or_of_another_size_or_proxy_is_not_a_duplicate() {
        let mut m = Matcher::new(SECOND);
        m.cut(cut(T, 120));
        m.opened(20, 77, "s2".into(), T + 1500 * MS); // too late
        m.opened(21, 77, "s2".into(), T + 5 * MS); // different request
        m.opened(22, 78, "s2".into(), T + 6 * MS); // another proxy process
        m.opened(23, 77, "s1".into(), T + 7 * MS); // the same backend again
        for s in 20..24 {
            m.closed(s, if s == 21 { 300 } else { 120 });
        }
        let d = m.tick(T + 2 * SECOND);
        assert_eq!(d[0].verdict, Verdict::Abort);
    }

    #[test]
    fn keep_alive_upstream_connections_opened_before_the_cut_are_not_retries() {
        let mut m = Matcher::new(SECOND);
        // A pooled connection to s2, opened long before, closing later with many requests.
        m.opened(30, 77, "s2".into(), T - 60 * SECOND);
        m.cut(cut(T, 120));
        m.closed(30, 120);
        assert_eq!(m.tick(T + 2 * SECOND)[0].verdict, Verdict::Abort);
    }
}
