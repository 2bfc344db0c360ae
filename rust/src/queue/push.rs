//! The producer side: a push is a few atomic operations on the lock-free queue and never takes
//! a lock; it wakes a consumer only when one is actually parked.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering, fence};
use std::time::{Duration, Instant};

use super::cancel::{QUEUED, Ticket, TicketState};
use super::{CLOSED, Level, PUSHER, Queued, RequestMeta, RequestQueue};
use crate::error::CoreError;
use crate::stats::FailureReason;

/// Triton's message for a push to a full priority level (`Unavailable`).
pub const QUEUE_FULL_MESSAGE: &str = "Exceeds maximum queue size";

impl<T> RequestQueue<T> {
    /// Enqueues `item` at the default priority, with no timeout and shape key 0.
    ///
    /// See [`push_with`](Self::push_with) for the errors.
    pub fn push(&self, item: T, batch_size: u32) -> Result<(), CoreError> {
        self.push_with(item, RequestMeta::with_batch_size(batch_size))
    }

    /// Enqueues `item` as described by `meta`.
    ///
    /// Fails with `Unavailable` once the queue is closed or when the request's priority level is
    /// full ([`QUEUE_FULL_MESSAGE`]), and, when batching is on, with `InvalidArg` if the batch
    /// size is 0 or exceeds `max_batch_size`. A push that returns `Ok` is handed out by some
    /// `pop_batch` (in a batch, or as rejected), also when `close` races with it, unless it is
    /// cancelled.
    pub fn push_with(&self, item: T, meta: RequestMeta) -> Result<(), CoreError> {
        let level = self.level_for(meta.priority);
        self.push_inner(item, meta, level, Instant::now(), None)
    }

    /// Like [`push_with`](Self::push_with), returning a [`Ticket`] for [`cancel`](Self::cancel).
    pub fn push_cancellable(&self, item: T, meta: RequestMeta) -> Result<Ticket, CoreError> {
        let level = self.level_for(meta.priority);
        let enqueued_at = Instant::now();
        let ticket = Arc::new(TicketState {
            state: AtomicU8::new(QUEUED),
            queue_id: self.id,
            level,
            enqueued_at,
        });
        self.push_inner(item, meta, level, enqueued_at, Some(Arc::clone(&ticket)))?;
        Ok(Ticket(ticket))
    }

    /// The level index for a request priority.
    fn level_for(&self, priority: u32) -> u32 {
        let levels = self.config.priority_levels;
        if levels == 0 {
            0
        } else if priority == 0 || priority > levels {
            self.default_level
        } else {
            priority - 1
        }
    }

    fn push_inner(
        &self,
        item: T,
        meta: RequestMeta,
        level_no: u32,
        enqueued_at: Instant,
        ticket: Option<Arc<TicketState>>,
    ) -> Result<(), CoreError> {
        if self.rules.batching
            && (meta.batch_size == 0 || meta.batch_size > self.config.batch.max_batch_size)
        {
            return Err(self.bad_batch_size(meta.batch_size));
        }
        let state = self.state.fetch_add(PUSHER, Ordering::Acquire);
        if state & CLOSED != 0 {
            return Err(self.closed_error());
        }
        let mut timeout_ns = 0;
        if self.counted || self.timed {
            let level = &self.levels[level_no as usize];
            if level.counted()
                && level.queued.fetch_add(1, Ordering::Relaxed)
                    >= level.policy.max_queue_size as usize
            {
                return Err(self.queue_full(level));
            }
            if !level.policy.default_timeout.is_zero() {
                timeout_ns = level.policy.timeout_for(meta.timeout).map_or(0, |timeout| {
                    u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX)
                });
            }
        }
        self.items.push(Queued {
            item,
            batch_size: meta.batch_size,
            shape_key: meta.shape_key,
            enqueued_at,
            level: level_no,
            timeout_ns,
            ticket,
        });
        // Pairs with the fences in `wait`, `wait_idle` and `wake_for_leftovers`: either the
        // consumer sees the request before parking, or we see that it is parked and wake it.
        // An idle consumer is woken only while no one holds the former lock: its holder takes
        // the request (or wakes one for it as it lets go).
        fence(Ordering::SeqCst);
        if self.consumer_parked.load(Ordering::Relaxed) {
            self.unparker.unpark();
        } else if self.idle.any() && !self.former.is_locked() {
            self.idle.wake_one();
        }
        // Release: a consumer that sees the count drop also sees the request.
        self.state.fetch_sub(PUSHER, Ordering::Release);
        Ok(())
    }

    // The error paths of `push_inner`, kept out of line so the hot path stays small.

    #[cold]
    #[inline(never)]
    fn bad_batch_size(&self, batch_size: u32) -> CoreError {
        CoreError::invalid_arg(format!(
            "batch size {batch_size} must be between 1 and max_batch_size ({})",
            self.config.batch.max_batch_size
        ))
    }

    #[cold]
    #[inline(never)]
    fn closed_error(&self) -> CoreError {
        self.state.fetch_sub(PUSHER, Ordering::Release);
        CoreError::unavailable("the request queue is closed")
    }

    /// Undoes a push's counting on a full level.
    #[cold]
    #[inline(never)]
    fn queue_full(&self, level: &Level) -> CoreError {
        level.queued.fetch_sub(1, Ordering::Relaxed);
        self.state.fetch_sub(PUSHER, Ordering::Release);
        self.stats
            .record_failure(FailureReason::Rejected, Duration::ZERO);
        CoreError::unavailable(QUEUE_FULL_MESSAGE)
    }
}
