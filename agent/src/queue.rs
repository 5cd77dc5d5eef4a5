//! The bounded queue between the ring-buffer reader and the pipeline thread.
//!
//! std's `sync_channel(n)` (and crossbeam's `bounded`, the same code) allocates its n slots up
//! front and writes every slot's stamp, so all of it is resident from the start: 65,536 events
//! of 232 bytes were 15 MiB of the agent's 41 MiB at rest, for a queue that is empty nearly
//! always. This one is std's unbounded channel, whose blocks of 31 slots are allocated as
//! events arrive and freed as the pipeline takes them, bounded by a count: the same
//! capacity and the same `try_send` contract (a full queue refuses, and the reader counts the
//! event as `queue` loss), with memory in proportion to what is queued.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
    mpsc,
};

pub use std::sync::mpsc::{RecvTimeoutError, TryRecvError};

/// A queue of at most `capacity` items (at least 1).
pub fn bounded<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    let (tx, rx) = mpsc::channel();
    let len = Arc::new(AtomicUsize::new(0));
    (
        Sender {
            tx,
            len: len.clone(),
            capacity: capacity.max(1),
        },
        Receiver { rx, len },
    )
}

/// The producing end. Not `Clone`: with one producer, the check against the capacity and the
/// increment that follows cannot race another send (the consumer only makes room).
pub struct Sender<T> {
    tx: mpsc::Sender<T>,
    len: Arc<AtomicUsize>,
    capacity: usize,
}

impl<T> Sender<T> {
    /// Queues `item`, or gives it back when the queue is full or the consumer is gone.
    pub fn try_send(&self, item: T) -> Result<(), T> {
        if self.len.load(Ordering::Acquire) >= self.capacity {
            return Err(item);
        }
        self.len.fetch_add(1, Ordering::AcqRel);
        self.tx.send(item).map_err(|e| {
            self.len.fetch_sub(1, Ordering::AcqRel);
            e.0
        })
    }
}

pub struct Receiver<T> {
    rx: mpsc::Receiver<T>,
    len: Arc<AtomicUsize>,
}

impl<T> Receiver<T> {
    fn took(&self, item: T) -> T {
        self.len.fetch_sub(1, Ordering::AcqRel);
        item
    }

    pub fn recv(&self) -> Result<T, mpsc::RecvError> {
        self.rx.recv().map(|i| self.took(i))
    }

    pub fn recv_timeout(&self, timeout: std::time::Duration) -> Result<T, RecvTimeoutError> {
        self.rx.recv_timeout(timeout).map(|i| self.took(i))
    }

    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        self.rx.try_recv().map(|i| self.took(i))
    }

    /// Items queued now.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_beyond_its_capacity_and_takes_again_once_drained() {
        let (tx, rx) = bounded(3);
        assert_eq!((0..5).filter(|i| tx.try_send(*i).is_err()).count(), 2);
        assert_eq!(rx.len(), 3);
        assert_eq!(rx.try_recv(), Ok(0));
        assert_eq!(tx.try_send(5), Ok(()));
        assert_eq!(tx.try_send(6), Err(6));
        let got: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(got, vec![1, 2, 5]);
        assert!(rx.is_empty());
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    }

    #[test]
    fn ends_for_the_consumer_when_the_producer_is_gone_and_refuses_without_a_consumer() {
        let (tx, rx) = bounded(2);
        tx.try_send(1).unwrap();
        drop(tx);
        assert_eq!(rx.recv_timeout(std::time::Duration::ZERO), Ok(1));
        assert_eq!(
            rx.recv_timeout(std::time::Duration::ZERO),
            Err(RecvTimeoutError::Disconnected)
        );
        let (tx, rx) = bounded(2);
        drop(rx);
        assert_eq!(tx.try_send(7), Err(7));
    }

    #[test]
    fn a_consumer_on_another_thread_sees_every_item_in_order() {
        let (tx, rx) = bounded(64);
        let consumer = std::thread::spawn(move || {
            let mut got = Vec::new();
            while let Ok(i) = rx.recv() {
                got.push(i);
            }
            got
        });
        let mut sent = Vec::new();
        for i in 0..10_000u32 {
            if tx.try_send(i).is_ok() {
                sent.push(i);
            }
        }
        drop(tx);
        assert_eq!(consumer.join().unwrap(), sent);
    }
}
