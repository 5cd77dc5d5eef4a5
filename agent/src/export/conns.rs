//! The HTTP server's connections. At most `max` are served; when one more arrives, the one idle
//! longest (no request in progress: a keep-alive connection between requests, or one still
//! sending its first headers, slowly or not at all) is closed to make room. So a scrape, the
//! page or the kubelet's probe is served at once whatever idle or slow clients hold. Only when
//! every connection is mid-request (each a few milliseconds) does a new one wait, up to `hard`
//! connections; past that it is closed at once.

use std::{
    sync::{Arc, Mutex},
    time::Instant,
};

use tokio::sync::oneshot;

use crate::model::HashMap;

#[derive(Debug)]
struct Entry {
    /// None while a request is in progress.
    idle_since: Option<Instant>,
    close: Option<oneshot::Sender<()>>,
}

#[derive(Debug, Default)]
struct Inner {
    next: u64,
    live: HashMap<u64, Entry>,
}

#[derive(Debug)]
pub struct Conns {
    max: usize,
    hard: usize,
    inner: Mutex<Inner>,
}

/// What `open` did.
#[derive(Debug)]
pub enum Opened {
    /// Served: its handle, the signal that it is to close, and how many idle ones were closed
    /// to make room.
    Served(Handle, oneshot::Receiver<()>, usize),
    /// Past `hard` with none idle: to be closed at once.
    Refused,
}

/// One served connection; dropping it forgets the connection.
#[derive(Debug)]
pub struct Handle {
    id: u64,
    conns: Arc<Conns>,
}

impl Conns {
    pub fn new(max: usize, hard: usize) -> Arc<Self> {
        Arc::new(Self {
            max,
            hard: hard.max(max),
            inner: Mutex::new(Inner::default()),
        })
    }

    pub fn open(self: &Arc<Self>, now: Instant) -> Opened {
        let Ok(mut inner) = self.inner.lock() else {
            return Opened::Refused;
        };
        let mut evicted = 0;
        while inner.live.len() >= self.max {
            let oldest = inner
                .live
                .iter()
                .filter_map(|(id, e)| Some((e.idle_since?, *id)))
                .min()
                .map(|(_, id)| id);
            let Some(id) = oldest else { break };
            if let Some(e) = inner.live.remove(&id)
                && let Some(close) = e.close
            {
                let _ = close.send(());
            }
            evicted += 1;
        }
        if inner.live.len() >= self.hard {
            return Opened::Refused;
        }
        let (tx, rx) = oneshot::channel();
        let id = inner.next;
        inner.next += 1;
        inner.live.insert(
            id,
            Entry {
                idle_since: Some(now),
                close: Some(tx),
            },
        );
        let handle = Handle {
            id,
            conns: Arc::clone(self),
        };
        Opened::Served(handle, rx, evicted)
    }

    #[cfg(test)]
    fn live(&self) -> usize {
        self.inner.lock().map_or(0, |i| i.live.len())
    }

    fn set(&self, id: u64, idle_since: Option<Instant>) {
        if let Ok(mut inner) = self.inner.lock()
            && let Some(e) = inner.live.get_mut(&id)
        {
            e.idle_since = idle_since;
        }
    }
}

impl Handle {
    /// A request began: not to be closed until it is answered.
    pub fn busy(&self) {
        self.conns.set(self.id, None);
    }

    /// Its request was answered.
    pub fn idle(&self, now: Instant) {
        self.conns.set(self.id, Some(now));
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        if let Ok(mut inner) = self.conns.inner.lock() {
            inner.live.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn served(o: Opened) -> (Handle, oneshot::Receiver<()>, usize) {
        match o {
            Opened::Served(h, rx, n) => (h, rx, n),
            Opened::Refused => panic!("refused"),
        }
    }

    #[test]
    fn the_longest_idle_makes_room_and_a_busy_one_never_does() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let c = Conns::new(2, 3);
        let (busy, mut busy_rx, _) = served(c.open(at(0)));
        busy.busy();
        let (_idle, mut idle_rx, _) = served(c.open(at(1)));
        // Full: the idle one goes, not the older busy one.
        let (third, _third_rx, evicted) = served(c.open(at(2)));
        assert_eq!(evicted, 1);
        assert!(idle_rx.try_recv().is_ok(), "told to close");
        assert!(busy_rx.try_recv().is_err());
        // Both busy: one more is served over the cap, up to the hard limit.
        third.busy();
        let (fourth, _, evicted) = served(c.open(at(3)));
        assert_eq!(evicted, 0);
        assert_eq!(c.live(), 3);
        fourth.busy();
        assert!(matches!(c.open(at(4)), Opened::Refused));
        drop(busy);
        assert_eq!(c.live(), 2);
    }
}
