//! Proxy retries: when a backend cuts a proxy's upstream connection with a request pending,
//! did the proxy re-send that request to another backend, and had the cut backend read it?
//!
//! Evidence, not coincidence: the kernel (`sock_length`) reports the cut as the proxy's
//! worker thread saw it (its recv returned EOF or an error with a request of N bytes sent and
//! no response byte read), and reports as a candidate only the request that same thread
//! started right after it closed the cut socket: no client-side send between its latest cut
//! and the close (an abort answers the client its 502 there), then its next upstream action,
//! within the retry window, with no other socket I/O first (nginx and HAProxy both close the
//! cut connection and connect again in one go). The candidate is the retry when it went to another backend and its
//! size, counted per request (bytes sent since the last response byte, so pooled keep-alive
//! connections count too), is N. Then:
//! - the cut backend had read the request (its receive queue did not hold it when it
//!   closed): a **retry duplicate**, done twice or maybe twice;
//! - it had not (still unread, or its end was closed before the request was sent): **retried
//!   unexecuted**, done once;
//! - no retry: an **upstream abort**, the client saw an error.
//!
//! A retry whose client went away meanwhile is dropped by the proxy: its close of the retry's
//! connection (before any response byte) ends it, with what was sent of it (sent whole, the
//! backend has it: run, as `read_by_backend` has it for the cut backend).
//!
//! A reset that fails the proxy's first send on a fresh connection (the backend's listener
//! closed with it in its accept queue) is a cut of zero bytes: its retry is the worker's next
//! request elsewhere, whatever its size, and ran once; without one it is an abort.
//!
//! Pure: fed observations and a clock.

use std::collections::{BTreeMap, VecDeque};

pub use crate::model::Proxy;
use crate::model::{HashMap, Mono, RetryOutcome, SECOND};

/// A request a backend cut, as the proxy's worker saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    /// When the worker saw the cut.
    pub at: Mono,
    pub proxy: Proxy,
    /// The worker thread.
    pub tid: u32,
    /// The backend container that cut it.
    pub backend: String,
    /// The proxy's socket.
    pub sock: u64,
    /// The request's size.
    pub bytes: u64,
    /// When its first byte was sent.
    pub started_at: Mono,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub cut: Cut,
    pub outcome: RetryOutcome,
}

/// The request the cut's worker started next, until it was sent whole.
#[derive(Debug, Clone)]
struct Candidate {
    backend: String,
    started_at: Mono,
}

#[derive(Debug)]
struct Pending {
    cut: Cut,
    candidate: Option<Candidate>,
    /// How the cut backend's end closed. Taken at the cut: the kernel reuses a closed
    /// socket's address, often for the very retry that follows.
    close: Option<PeerClose>,
}

/// How the container's end of a proxy's connection closed.
#[derive(Debug, Clone)]
struct PeerClose {
    backend: String,
    at: Mono,
    unread: u32,
}

#[derive(Debug)]
pub struct Matcher {
    window: Mono,
    /// Undecided cuts, by the proxy's socket.
    pending: HashMap<u64, Pending>,
    /// Container-side closes of proxies' connections, by the proxy's socket, kept a while.
    closes: HashMap<u64, PeerClose>,
    close_order: VecDeque<u64>,
    /// How long a started retry may take to be sent whole before the cut is decided an abort
    /// (the proxy gave up on it: a timeout, or the client went away).
    max_wait: Mono,
    /// No pending cut is due before this: `tick` runs on every event, and scans only then.
    next_due: Mono,
}

/// Closes remembered (a cut is decided well within this many later closes).
const CLOSES: usize = 8192;

impl Matcher {
    /// `window`: how long after a cut without a candidate it is decided an abort. The kernel
    /// only reports candidates within its own (shorter) window; this one covers the events'
    /// way to the agent.
    pub fn new(window: Mono) -> Self {
        Self {
            window,
            pending: HashMap::default(),
            closes: HashMap::default(),
            close_order: VecDeque::new(),
            max_wait: 300 * SECOND,
            next_due: Mono::MAX,
        }
    }

    /// The container `backend` closed its end of the proxy's connection `sock`, leaving
    /// `unread` bytes.
    pub fn peer_closed(&mut self, sock: u64, backend: String, at: Mono, unread: u32) {
        let close = PeerClose {
            backend,
            at,
            unread,
        };
        // Normally the close comes first (the backend's stack closes, then the proxy reads
        // EOF); a late one still belongs to the cut it explains.
        if let Some(p) = self.pending.get_mut(&sock)
            && p.close.is_none()
            && p.cut.backend == close.backend
        {
            p.close = Some(close);
            return;
        }
        if self.closes.insert(sock, close).is_none() {
            self.close_order.push_back(sock);
        }
        while self.close_order.len() > CLOSES {
            if let Some(old) = self.close_order.pop_front() {
                self.closes.remove(&old);
            }
        }
    }

    pub fn cut(&mut self, cut: Cut) {
        self.next_due = self.next_due.min(cut.at.saturating_add(self.window));
        let close = self
            .closes
            .remove(&cut.sock)
            .filter(|c| c.backend == cut.backend);
        self.pending.insert(
            cut.sock,
            Pending {
                cut,
                candidate: None,
                close,
            },
        );
    }

    /// The cut's worker started its next request on a connection to `backend`.
    pub fn retry_started(&mut self, cut_sock: u64, tid: u32, backend: String, started_at: Mono) {
        if let Some(p) = self.pending.get_mut(&cut_sock)
            && p.cut.tid == tid
            && p.candidate.is_none()
        {
            p.candidate = Some(Candidate {
                backend,
                started_at,
            });
        }
    }

    /// That request was sent whole, `bytes` long, or the proxy closed its connection with
    /// `bytes` of it sent (its client gone): the cut is decided.
    pub fn retry_ended(&mut self, cut_sock: u64, tid: u32, bytes: u64) -> Option<Decision> {
        let p = self.pending.get(&cut_sock)?;
        if p.cut.tid != tid {
            return None;
        }
        let p = self.pending.remove(&cut_sock)?;
        let Some(c) = p.candidate else {
            return Some(Decision {
                cut: p.cut,
                outcome: RetryOutcome::Abort,
            });
        };
        // The same request again, elsewhere; anything else was the worker's next job. A cut of
        // zero bytes (a reset failed the request's first send) has no size to compare: the
        // worker's next request elsewhere is its retry, and ran once whatever it was. Nothing
        // sent (closed in its connect) is no retry.
        let same =
            c.backend != p.cut.backend && bytes != 0 && (p.cut.bytes == 0 || bytes == p.cut.bytes);
        let outcome = if !same {
            RetryOutcome::Abort
        } else {
            let added_seconds =
                c.started_at.saturating_sub(p.cut.started_at) as f64 / SECOND as f64;
            if read_by_backend(&p.cut, p.close.as_ref()) {
                RetryOutcome::Duplicate { added_seconds }
            } else {
                RetryOutcome::Unexecuted { added_seconds }
            }
        };
        Some(Decision {
            cut: p.cut,
            outcome,
        })
    }

    /// Decides the cuts that no retry followed within the window, and those whose retry was
    /// never sent whole within `max_wait`; oldest first. `now` is event time (the events up to
    /// it are in), so a pipeline behind the clock never decides a cut before its retry's
    /// events were read.
    pub fn tick(&mut self, now: Mono) -> Vec<Decision> {
        if now <= self.next_due {
            return Vec::new();
        }
        let (window, max_wait) = (self.window, self.max_wait);
        let due = |p: &Pending| {
            let limit = if p.candidate.is_some() {
                max_wait
            } else {
                window
            };
            p.cut.at.saturating_add(limit)
        };
        let over: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| now > due(p))
            .map(|(s, _)| *s)
            .collect();
        let mut out: Vec<Decision> = over
            .into_iter()
            .filter_map(|s| self.pending.remove(&s))
            .map(|p| Decision {
                cut: p.cut,
                outcome: RetryOutcome::Abort,
            })
            .collect();
        out.sort_by_key(|d| d.cut.at);
        self.next_due = self.pending.values().map(due).min().unwrap_or(Mono::MAX);
        out
    }

    /// Counts of undecided cuts per proxy (for tests and debugging).
    pub fn pending(&self) -> BTreeMap<u32, usize> {
        let mut m = BTreeMap::new();
        for p in self.pending.values() {
            *m.entry(p.cut.proxy.tgid).or_default() += 1;
        }
        m
    }
}

/// Whether the cut backend read the request (or may have): not if its end closed before the
/// request was sent, nor if its receive queue still held all of it at the close. Not knowing
/// how it closed counts as read: a duplicate is never ruled out on no evidence.
fn read_by_backend(cut: &Cut, close: Option<&PeerClose>) -> bool {
    if cut.bytes == 0 {
        return false; // nothing was sent
    }
    match close {
        Some(c) => c.at > cut.started_at && u64::from(c.unread) < cut.bytes,
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Mono = 1_000_000;
    const US: Mono = 1_000;
    const T: Mono = 1_000 * SECOND;

    fn nginx() -> Proxy {
        Proxy {
            tgid: 77,
            name: "nginx".into(),
            prober: false,
        }
    }

    fn cut(sock: u64, at: Mono, bytes: u64) -> Cut {
        Cut {
            at,
            proxy: nginx(),
            tid: 77,
            backend: "s1".into(),
            sock,
            bytes,
            started_at: at - 300 * MS,
        }
    }

    fn matcher() -> Matcher {
        Matcher::new(SECOND)
    }

    #[test]
    fn the_same_request_resent_elsewhere_after_the_backend_read_it_is_a_duplicate() {
        let mut m = matcher();
        m.peer_closed(1, "s1".into(), T - 50 * US, 0);
        m.cut(cut(1, T, 120));
        m.retry_started(1, 77, "s2".into(), T + 40 * US);
        assert!(m.tick(T + 10 * SECOND).is_empty(), "the retry is running");
        let d = m.retry_ended(1, 77, 120).unwrap();
        assert_eq!(
            d.outcome,
            RetryOutcome::Duplicate {
                added_seconds: 0.30004
            }
        );
        assert!(m.pending().is_empty());
    }

    #[test]
    fn a_request_the_backend_never_read_ran_once() {
        let mut m = matcher();
        // Died with the 120 bytes (and a FIN) still queued.
        m.peer_closed(1, "s1".into(), T - 50 * US, 121);
        m.cut(cut(1, T, 120));
        m.retry_started(1, 77, "s2".into(), T + 40 * US);
        // The retry's own connection, at the cut one's address, closed by its backend: it
        // does not stand for the cut backend's close.
        m.peer_closed(1, "s2".into(), T + MS, 0);
        let d = m.retry_ended(1, 77, 120).unwrap();
        assert!(matches!(d.outcome, RetryOutcome::Unexecuted { .. }));
        // A pooled connection whose backend end had closed before the request went out.
        let mut m = matcher();
        let c = cut(2, T, 120);
        m.peer_closed(2, "s1".into(), c.started_at - MS, 0);
        m.cut(c);
        m.retry_started(2, 77, "s2".into(), T + 40 * US);
        let d = m.retry_ended(2, 77, 120).unwrap();
        assert!(matches!(d.outcome, RetryOutcome::Unexecuted { .. }));
    }

    #[test]
    fn a_close_seen_after_the_cut_still_counts() {
        let mut m = matcher();
        m.cut(cut(1, T, 120));
        m.peer_closed(1, "s1".into(), T + 10 * US, 120);
        m.retry_started(1, 77, "s2".into(), T + 40 * US);
        let d = m.retry_ended(1, 77, 120).unwrap();
        assert!(matches!(d.outcome, RetryOutcome::Unexecuted { .. }));
    }

    #[test]
    fn no_retry_within_the_window_is_an_abort() {
        let mut m = matcher();
        m.cut(cut(1, T, 120));
        assert!(m.tick(T + 500 * MS).is_empty());
        let d = m.tick(T + SECOND + MS);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].outcome, RetryOutcome::Abort);
        assert!(m.pending().is_empty());
    }

    #[test]
    fn the_next_request_of_another_size_or_to_the_same_backend_is_not_a_retry() {
        for (backend, bytes) in [("s2", 121), ("s1", 120)] {
            let mut m = matcher();
            m.cut(cut(1, T, 120));
            m.retry_started(1, 77, backend.into(), T + 40 * US);
            let d = m.retry_ended(1, 77, bytes).unwrap();
            assert_eq!(d.outcome, RetryOutcome::Abort, "{backend} {bytes}");
        }
    }

    #[test]
    fn only_the_cut_workers_own_next_request_counts() {
        let mut m = matcher();
        m.cut(cut(1, T, 120));
        // Another thread's request, of the same size: nothing.
        m.retry_started(1, 78, "s2".into(), T + 40 * US);
        assert_eq!(m.retry_ended(1, 78, 120), None);
        assert_eq!(m.tick(T + 2 * SECOND)[0].outcome, RetryOutcome::Abort);
    }

    #[test]
    fn concurrent_cuts_match_their_own_retries_one_to_one() {
        let mut m = matcher();
        m.cut(cut(1, T, 120));
        m.cut(cut(2, T + MS, 120));
        m.retry_started(1, 77, "s2".into(), T + 40 * US);
        m.retry_started(2, 77, "s2".into(), T + MS + 40 * US);
        // A second start for the same cut is not taken.
        m.retry_started(1, 77, "s3".into(), T + 2 * MS);
        let a = m.retry_ended(2, 77, 120).unwrap();
        let b = m.retry_ended(1, 77, 120).unwrap();
        assert_eq!((a.cut.sock, b.cut.sock), (2, 1));
        assert!(matches!(a.outcome, RetryOutcome::Duplicate { .. }));
        assert!(matches!(b.outcome, RetryOutcome::Duplicate { .. }));
        assert_eq!(m.retry_ended(1, 77, 120), None, "decided once");
    }

    #[test]
    fn a_retry_never_sent_whole_is_an_abort_after_max_wait() {
        let mut m = matcher();
        m.cut(cut(1, T, 120));
        m.retry_started(1, 77, "s2".into(), T + 40 * US);
        assert!(m.tick(T + 299 * SECOND).is_empty());
        assert_eq!(m.tick(T + 301 * SECOND)[0].outcome, RetryOutcome::Abort);
    }

    #[test]
    fn a_request_a_reset_kept_from_going_out_is_retried_unexecuted_or_aborted() {
        let mut m = matcher();
        m.cut(cut(1, T, 0));
        m.retry_started(1, 77, "s2".into(), T + 40 * US);
        let d = m.retry_ended(1, 77, 133).unwrap();
        assert!(
            matches!(d.outcome, RetryOutcome::Unexecuted { .. }),
            "{d:?}"
        );
        // Its backend's close, with nothing unread, does not make it read.
        let mut m = matcher();
        m.peer_closed(1, "s1".into(), T - 50 * US, 0);
        m.cut(cut(1, T, 0));
        m.retry_started(1, 77, "s2".into(), T + 40 * US);
        let d = m.retry_ended(1, 77, 133).unwrap();
        assert!(
            matches!(d.outcome, RetryOutcome::Unexecuted { .. }),
            "{d:?}"
        );
        // To the same backend, or none at all: an abort.
        let mut m = matcher();
        m.cut(cut(1, T, 0));
        m.retry_started(1, 77, "s1".into(), T + 40 * US);
        assert_eq!(
            m.retry_ended(1, 77, 133).unwrap().outcome,
            RetryOutcome::Abort
        );
        let mut m = matcher();
        m.cut(cut(1, T, 0));
        assert_eq!(m.tick(T + 2 * SECOND)[0].outcome, RetryOutcome::Abort);
    }

    #[test]
    fn a_retry_closed_before_anything_was_sent_is_no_retry() {
        for cut_bytes in [120, 0] {
            let mut m = matcher();
            m.cut(cut(1, T, cut_bytes));
            m.retry_started(1, 77, "s2".into(), T + 40 * US);
            let d = m.retry_ended(1, 77, 0).unwrap();
            assert_eq!(d.outcome, RetryOutcome::Abort, "{cut_bytes}");
        }
        // Closed once sent whole (its client gone): the request reached the other backend.
        let mut m = matcher();
        m.peer_closed(1, "s1".into(), T - 50 * US, 0);
        m.cut(cut(1, T, 120));
        m.retry_started(1, 77, "s2".into(), T + 40 * US);
        let d = m.retry_ended(1, 77, 120).unwrap();
        assert!(matches!(d.outcome, RetryOutcome::Duplicate { .. }), "{d:?}");
    }

    #[test]
    fn closes_are_bounded() {
        let mut m = matcher();
        for s in 0..(CLOSES as u64 + 10) {
            m.peer_closed(s, "s1".into(), T, 0);
        }
        assert_eq!(m.closes.len(), CLOSES);
        assert!(!m.closes.contains_key(&0));
    }
}
