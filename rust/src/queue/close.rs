//! Closing a queue, and abandoning it: taking back what it still holds when its model is
//! unloaded.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{CLOSED, PopResult, RequestQueue};
use crate::stats::FailureReason;

/// How long [`RequestQueue::abandon`] waits at a time for a consumer forming a batch.
const ABANDON_WAIT: Duration = Duration::from_millis(1);

impl<T> RequestQueue<T> {
    /// Closes the queue: later pushes fail with `Unavailable`, every waiting consumer wakes, and
    /// what is still queued is handed out before `pop_batch` reports `Closed`. Idempotent.
    pub fn close(&self) {
        self.state.fetch_or(CLOSED, Ordering::SeqCst);
        self.unparker.unpark();
        self.idle.wake_all();
    }

    pub fn is_closed(&self) -> bool {
        self.state.load(Ordering::Acquire) & CLOSED != 0
    }

    /// Closes the queue and takes back every request still in it, each counted as a failure
    /// (`Other`; those whose queue timeout had expired, as `Rejected`), for the caller to
    /// answer: what a model being unloaded does with what it can no longer run. Waits for a
    /// consumer forming a batch to finish with it; consumers see `Closed` from then on.
    pub fn abandon(&self) -> Vec<T> {
        self.close();
        let mut left = Vec::new();
        loop {
            match self.pop_batch_queued(ABANDON_WAIT) {
                PopResult::Batch(batch) => {
                    let now = Instant::now();
                    for queued in batch.items {
                        self.stats.record_failure(
                            FailureReason::Other,
                            now.saturating_duration_since(queued.enqueued_at),
                        );
                        left.push(queued.item);
                    }
                }
                // Already counted as rejected.
                PopResult::Rejected(items) => left.extend(items.into_iter().map(|q| q.item)),
                PopResult::TimedOut => {}
                PopResult::Closed => return left,
            }
        }
    }
}
