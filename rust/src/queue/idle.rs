//! Consumers with nothing to do, and which of them a new request wakes.
//!
//! A consumer that finds no request and has polled its window out lets go of the former lock
//! and parks here. A producer wakes the one that took a batch last: its instance's caches are
//! the warmest. With a model of several instances and one request at a time, waking them in
//! turn would leave every instance idle for as long as the others take, long enough for its
//! code and data to leave the caches: a lone request then spends tens of microseconds more in
//! the instance (and, for a worker process, in its Python) than on an instance that just ran.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use crossbeam_utils::sync::{Parker, Unparker};
use parking_lot::Mutex;

/// Source of consumer threads' ids.
static NEXT_CONSUMER: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's parker for idle waits (a thread waits in one queue at a time).
    static PARKER: Parker = Parker::new();
    static CONSUMER: u64 = NEXT_CONSUMER.fetch_add(1, Ordering::Relaxed);
    /// When this thread last took a batch (a queue-wide order: see [`note_batch_taken`]).
    static LAST_BATCH: Cell<u64> = const { Cell::new(0) };
}

/// Source of the order in which batches are taken, over every queue (only the order of one
/// queue's consumers is ever compared).
static BATCHES_TAKEN: AtomicU64 = AtomicU64::new(1);

/// Records that this thread just took a batch.
pub(super) fn note_batch_taken() {
    LAST_BATCH.set(BATCHES_TAKEN.fetch_add(1, Ordering::Relaxed));
}

struct Waiting {
    consumer: u64,
    last_batch: u64,
    unparker: Unparker,
}

/// The idle consumers, the one that took a batch last at the end.
#[derive(Default)]
pub(super) struct IdleConsumers {
    waiting: Mutex<Vec<Waiting>>,
    /// How many wait: producers read it on every push, without the lock.
    count: AtomicUsize,
}

impl IdleConsumers {
    /// How many consumers wait here.
    pub(super) fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// Whether any consumer is (about to be) parked here.
    #[inline]
    pub(super) fn any(&self) -> bool {
        self.count.load(Ordering::Relaxed) > 0
    }

    /// Adds this thread. The caller then fences, looks for news once more, and only then
    /// [`park`](Self::park)s, so that a producer either wakes it or it sees the request.
    pub(super) fn enter(&self) {
        let waiting = Waiting {
            consumer: CONSUMER.with(|id| *id),
            last_batch: LAST_BATCH.get(),
            unparker: PARKER.with(|parker| parker.unparker().clone()),
        };
        let mut all = self.waiting.lock();
        let at = all.partition_point(|other| other.last_batch <= waiting.last_batch);
        all.insert(at, waiting);
        self.count.store(all.len(), Ordering::Relaxed);
    }

    /// Parks this thread until woken or `deadline`; may return early (a wake-up meant for an
    /// earlier wait). Then leaves the idle set if no one took it out.
    pub(super) fn park(&self, deadline: Option<Instant>) {
        PARKER.with(|parker| match deadline {
            Some(deadline) => parker.park_deadline(deadline),
            None => parker.park(),
        });
        self.leave();
    }

    /// Takes this thread out of the idle set, if it is still in it.
    pub(super) fn leave(&self) {
        let me = CONSUMER.with(|id| *id);
        let mut all = self.waiting.lock();
        if let Some(at) = all.iter().rposition(|waiting| waiting.consumer == me) {
            all.remove(at);
            self.count.store(all.len(), Ordering::Relaxed);
        }
    }

    /// Wakes the consumer that took a batch last, if any waits.
    pub(super) fn wake_one(&self) {
        let mut all = self.waiting.lock();
        if let Some(waiting) = all.pop() {
            self.count.store(all.len(), Ordering::Relaxed);
            drop(all);
            waiting.unparker.unpark();
        }
    }

    /// Wakes every idle consumer (the queue closed).
    pub(super) fn wake_all(&self) {
        let woken = std::mem::take(&mut *self.waiting.lock());
        self.count.store(0, Ordering::Relaxed);
        for waiting in woken {
            waiting.unparker.unpark();
        }
    }
}
