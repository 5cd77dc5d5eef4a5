//! The bounded queue between the ring-buffer reader and the pipeline thread.
//!
//! std's `sync_channel(n)` (and crossbeam's `bounded`, the same code) allocates its n slots up
//! front and writes every slot's stamp, so all of it is resident from the start: 65,536 events
//! of 232 bytes were 15 MiB of the agent's 41 MiB at rest, for a queue that is empty nearly
//! always. This one is std's unbounded channel, whose blocks of 31 slots are allocated as
//! events arrive and freed as the pipeline takes them, bounded by a count: the same
//! capacity and the same `try_send` contract (a full queue refuses, and the reader counts the
//! event as `queue` loss), with memory in proportion to what is queued.
//!
//! Items go in batches (a drain of the ring buffers is one): a send and a receive per event
//! each moved it once more and cost the channel's atomics, a tenth of the agent's time on pod
//! churn. The capacity still counts items.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
    mpsc,
};

pub use std::sync::mpsc::{RecvTimeoutError, TryRecvError};

/// A queue of at most `capacity` items (at least 1), in batches.
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
    tx: mpsc::Sender<Vec<T>>,
    len: Arc<AtomicUsize>,
    capacity: usize,
}

impl<T> Sender<T> {
    /// Queues as many of `items` as there is room for, in order; returns how many were
    /// refused (the last ones: the queue was full, or the consumer is gone).
    pub fn try_send_all(&self, mut items: Vec<T>) -> usize {
        let room = self
            .capacity
            .saturating_sub(self.len.load(Ordering::Acquire));
        let refused = items.len().saturating_sub(room);
        items.truncate(items.len() - refused);
        let n = items.len();
        if n == 0 {
            return refused;
        }
        self.len.fetch_add(n, Ordering::AcqRel);
        if self.tx.send(items).is_err() {
            self.len.fetch_sub(n, Ordering::AcqRel);
            return refused + n;
        }
        refused
    }
}

pub struct Receiver<T> {
    rx: mpsc::Receiver<Vec<T>>,
    len: Arc<AtomicUsize>,
}

impl<T> Receiver<T> {
    fn took(&self, batch: Vec<T>) -> Vec<T> {
        self.len.fetch_sub(batch.len(), Ordering::AcqRel);
        batch
    }

    /// The next batch, waiting for one.
    pub fn recv(&self) -> Result<Vec<T>, mpsc::RecvError> {
        self.rx.recv().map(|b| self.took(b))
    }

    pub fn recv_timeout(&self, timeout: std::time::Duration) -> Result<Vec<T>, RecvTimeoutError> {
        self.rx.recv_timeout(timeout).map(|b| self.took(b))
    }

    pub fn try_recv(&self) -> Result<Vec<T>, TryRecvError> {
        self.rx.try_recv().map(|b| self.took(b))
    }

    /// Items queued now (a batch taken is no longer queued).
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

    fn all<T>(rx: &Receiver<T>) -> Vec<T> {
        std::iter::from_fn(|| rx.try_recv().ok())
            .flatten()
            .collect()
    }

    #[test]
    fn refuses_beyond_its_capacity_and_takes_again_once_drained() {
        let (tx, rx) = bounded(3);
        assert_eq!((0..5).map(|i| tx.try_send_all(vec![i])).sum::<usize>(), 2);
        assert_eq!(rx.len(), 3);
        assert_eq!(rx.try_recv(), Ok(vec![0]));
        assert_eq!(tx.try_send_all(vec![5]), 0);
        assert_eq!(tx.try_send_all(vec![6]), 1);
        assert_eq!(all(&rx), vec![1, 2, 5]);
        assert!(rx.is_empty());
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    }

    #[test]
    fn a_batch_goes_whole_or_loses_its_last_items_to_a_full_queue() {
        let (tx, rx) = bounded(5);
        assert_eq!(tx.try_send_all(vec![1, 2, 3]), 0);
        assert_eq!(tx.try_send_all(vec![4, 5, 6, 7]), 2);
        assert_eq!(tx.try_send_all(vec![8]), 1);
        assert_eq!(tx.try_send_all(Vec::new()), 0);
        assert_eq!(rx.len(), 5);
        assert_eq!(rx.try_recv(), Ok(vec![1, 2, 3]));
        assert_eq!(rx.len(), 2);
        assert_eq!(tx.try_send_all(vec![9, 10]), 0);
        assert_eq!(all(&rx), vec![4, 5, 9, 10]);
        assert!(rx.is_empty());
    }

    #[test]
    fn ends_for_the_consumer_when_the_producer_is_gone_and_refuses_without_a_consumer() {
        let (tx, rx) = bounded(2);
        assert_eq!(tx.try_send_all(vec![1]), 0);
        drop(tx);
        assert_eq!(rx.recv_timeout(std::time::Duration::ZERO), Ok(vec![1]));
        assert_eq!(
            rx.recv_timeout(std::time::Duration::ZERO),
            Err(RecvTimeoutError::Disconnected)
        );
        let (tx, rx) = bounded(2);
        drop(rx);
        assert_eq!(tx.try_send_all(vec![7, 8, 9]), 3);
    }

    #[test]
    fn a_consumer_on_another_thread_sees_every_item_in_order() {
        let (tx, rx) = bounded(64);
        let consumer = std::thread::spawn(move || {
            let mut got = Vec::new();
            while let Ok(b) = rx.recv() {
                got.extend(b);
            }
            got
        });
        let mut sent: Vec<u32> = Vec::new();
        for i in (0..10_000u32).step_by(10) {
            let batch: Vec<u32> = (i..i + 10).collect();
            let refused = tx.try_send_all(batch.clone());
            sent.extend(&batch[..10 - refused]);
        }
        drop(tx);
        assert_eq!(consumer.join().unwrap(), sent);
    }
}
