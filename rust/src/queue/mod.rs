//! The per-model request queue: priority levels, queue policies, cancellation and dynamic
//! batching.
//!
//! Producers (the frontends, through the scheduler) [`push`](RequestQueue::push) requests;
//! model instances call [`pop_batch`](RequestQueue::pop_batch) and get whole batches back.
//!
//! # How it works
//!
//! * Requests go into a lock-free [`SegQueue`]; a push is a few atomic operations and never
//!   takes a lock. The producer wakes a consumer only when one is actually parked.
//! * Batches are formed by one consumer at a time: the consumer that holds the *former* lock
//!   moves requests from the lock-free queue into the staging area ([`batcher`](crate::batcher):
//!   one FIFO per priority level), applies queue timeouts, decides the batch, and waits (polls
//!   for up to 50 µs, then parks) for more requests, the batch deadline or the next queue
//!   timeout. Other consumers wait for the former lock (with their own timeout), so batches
//!   leave in order and every request goes to exactly one consumer. This mirrors Triton, where
//!   one scheduler thread forms batches for all the model's instances.
//! * A consumer that finds nothing at all to take polls as long, then lets go of the former
//!   lock and parks among the idle consumers; a request wakes the one of them that took a
//!   batch last ([`idle`]), so that requests one at a time keep going to the same instance.
//! * A request never splits across batches, and joins a batch only with requests of the same
//!   *shape key* (the caller's hash of the non-batch dimensions).
//! * Cancellation is lock-free: a request pushed with
//!   [`push_cancellable`](RequestQueue::push_cancellable) carries a [`Ticket`] whose state the
//!   canceller and the consumer race to flip; whoever wins decides whether it runs. A cancelled
//!   request is dropped by the next consumer that meets it.
//!
//! # Queue policies (Triton's `ModelQueuePolicy`, one per priority level)
//!
//! * `max_queue_size`: a push to a level that already holds that many requests fails with
//!   `Unavailable` ("Exceeds maximum queue size"); 0 means unlimited.
//! * `default_timeout`: how long a request may wait before its `timeout_action` applies; 0 means
//!   never. With `allow_timeout_override` a request may ask for a *shorter* non-zero timeout
//!   (as in Triton, it cannot lengthen the default, nor set one when the default is 0).
//! * `timeout_action`: REJECT hands the request back from `pop_batch` as
//!   [`PopResult::Rejected`] (the caller answers it with Triton's "Request timeout expired");
//!   DELAY moves it behind the level's unexpired requests.
//!
//! Priority levels are 1 (highest) to `priority_levels`; a request's priority 0, or one above
//! `priority_levels`, means `default_priority_level`. With `priority_levels == 0` there is a
//! single level governed by `default_queue_policy`.
//!
//! # Batching rules
//!
//! See [`batcher`](crate::batcher). `pop_batch`'s timeout bounds the wait for the *first*
//! request (and for the former lock). Once a consumer has a request, the batch leaves by the
//! batching rules, at the latest `max_queue_delay` after its oldest request was enqueued.

mod batch;
mod cancel;
mod close;
mod config;
mod idle;
mod pop;
mod push;
mod queued;
mod wait;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU64, AtomicUsize, Ordering};

use crossbeam_queue::SegQueue;
use crossbeam_utils::CachePadded;
use crossbeam_utils::sync::{Parker, Unparker};
use parking_lot::Mutex;

use crate::batcher::{Rules, Staged};
use crate::error::CoreError;
use crate::stats::ModelStats;

pub use batch::{Batch, PopResult};
pub(crate) use cancel::TicketState;
pub use cancel::{Ticket, TicketStatus};
pub use config::{
    BatchPolicy, MAX_PRIORITY_LEVELS, QueueConfig, QueuePolicy, RequestMeta, TimeoutAction,
};
pub use push::QUEUE_FULL_MESSAGE;
pub use queued::Queued;

use crate::spin::Spin;

/// `state` bit: the queue is closed.
const CLOSED: usize = 1;
/// `state` increment for each push in progress (the count lives above the `CLOSED` bit).
const PUSHER: usize = 2;

/// Source of queue ids, which tie tickets to their queue.
static NEXT_QUEUE_ID: AtomicU64 = AtomicU64::new(1);

/// Staged requests and the parker, owned by whichever consumer holds the former lock.
struct Former<T> {
    staged: Staged<T>,
    /// Parks the former lock holder; producers hold the matching `Unparker`.
    parker: Parker,
    /// Sequence number of the next batch.
    next_seq: u64,
    spin: Spin,
}

/// A priority level's policy and, when it has a size limit, its request count.
struct Level {
    policy: QueuePolicy,
    /// Requests of this level queued and not yet handed out, rejected or cancelled; counted
    /// only when `policy.max_queue_size > 0`.
    queued: CachePadded<AtomicUsize>,
}

impl Level {
    fn counted(&self) -> bool {
        self.policy.max_queue_size > 0
    }
}

/// A multi-producer, multi-consumer request queue that hands out batches. See the module docs.
pub struct RequestQueue<T> {
    items: SegQueue<Queued<T>>,
    /// `CLOSED` bit plus `PUSHER` times the number of pushes in progress.
    state: CachePadded<AtomicUsize>,
    /// Set while the former lock holder is (about to be) parked.
    consumer_parked: CachePadded<AtomicBool>,
    /// Number of staged requests, for `len()`. Consumers write it and the former lock on every
    /// batch: both sit on their own cache lines, away from what producers read on every push.
    staged_len: CachePadded<AtomicUsize>,
    former: CachePadded<Mutex<Former<T>>>,
    /// Consumers waiting for requests without the former lock (see [`idle`]).
    idle: CachePadded<idle::IdleConsumers>,
    /// Cancelled requests still held (inbound or staged), for `len()`; may dip below zero
    /// briefly when a consumer drops one before the canceller counts it.
    cancelled_held: CachePadded<AtomicIsize>,
    unparker: Unparker,
    config: QueueConfig,
    rules: Rules,
    levels: Box<[Level]>,
    /// Index of the default level.
    default_level: u32,
    /// No batching, one level, no timeouts: a pop can hand out the oldest inbound request
    /// without planning.
    direct: bool,
    /// Some level has a size limit (so its requests are counted in and out).
    counted: bool,
    /// Some level has a queue timeout.
    timed: bool,
    id: u64,
    stats: Arc<ModelStats>,
}

impl<T> fmt::Debug for RequestQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestQueue")
            .field("config", &self.config)
            .field("len", &self.len())
            .field("closed", &self.is_closed())
            .finish_non_exhaustive()
    }
}

impl<T> RequestQueue<T> {
    /// A new, open, empty queue with one level and no queue policy. Fails with `InvalidArg` if a
    /// preferred batch size is 0, exceeds `max_batch_size`, or is given while batching is off.
    pub fn new(policy: BatchPolicy) -> Result<Self, CoreError> {
        Self::with_config(policy.into())
    }

    /// A new, open, empty queue. Fails with `InvalidArg` for an invalid batch policy, a default
    /// priority level outside `[1, priority_levels]` (when there are levels), or a level policy
    /// for a level that does not exist.
    pub fn with_config(config: QueueConfig) -> Result<Self, CoreError> {
        config.validate()?;
        let stats = Arc::new(if config.latency_summaries {
            ModelStats::with_latency_summaries(config.batch.max_batch_size)
        } else {
            ModelStats::new(config.batch.max_batch_size)
        });
        Ok(Self::build(config, stats))
    }

    /// A new, open, empty queue that records into `stats` (typically another queue's
    /// [`stats`](Self::stats)) instead of statistics of its own: one queue per model instance,
    /// one set of statistics per model version. [`ModelStats`] holds only cumulative counters
    /// and durations, no state of any one queue (how many requests wait is each queue's
    /// [`len`](Self::len)), so every queue sharing it adds to the same totals.
    ///
    /// Fails as [`with_config`](Self::with_config) does, and with `InvalidArg` when
    /// `config.latency_summaries` differs from whether `stats` keeps latency summaries. Batch
    /// sizes above the maximum `stats` was made for are still counted, in a slower list.
    pub fn with_shared_stats(
        config: QueueConfig,
        stats: Arc<ModelStats>,
    ) -> Result<Self, CoreError> {
        config.validate()?;
        if config.latency_summaries != stats.keeps_latency_summaries() {
            return Err(CoreError::invalid_arg(format!(
                "latency_summaries={} differs from the statistics being shared, which {} them",
                config.latency_summaries,
                if stats.keeps_latency_summaries() {
                    "keep"
                } else {
                    "do not keep"
                }
            )));
        }
        Ok(Self::build(config, stats))
    }

    /// A queue for a validated `config`, recording into `stats`.
    fn build(config: QueueConfig, stats: Arc<ModelStats>) -> Self {
        let policies = config.level_policies();
        let actions: Vec<TimeoutAction> = policies.iter().map(|p| p.timeout_action).collect();
        let policies_timed: Vec<bool> = policies
            .iter()
            .map(|p| !p.default_timeout.is_zero())
            .collect();
        let levels: Box<[Level]> = policies
            .into_iter()
            .map(|policy| Level {
                policy,
                queued: CachePadded::new(AtomicUsize::new(0)),
            })
            .collect();
        let parker = Parker::new();
        Self {
            items: SegQueue::new(),
            state: CachePadded::new(AtomicUsize::new(0)),
            consumer_parked: CachePadded::new(AtomicBool::new(false)),
            staged_len: CachePadded::new(AtomicUsize::new(0)),
            cancelled_held: CachePadded::new(AtomicIsize::new(0)),
            unparker: parker.unparker().clone(),
            former: CachePadded::new(Mutex::new(Former {
                staged: Staged::new(&actions),
                parker,
                next_seq: 0,
                spin: wait::consumer_spin(),
            })),
            idle: CachePadded::new(idle::IdleConsumers::default()),
            rules: config.batch.rules(),
            direct: !config.batch.batching()
                && config.priority_levels <= 1
                && policies_timed.iter().all(|timed| !timed),
            counted: levels.iter().any(Level::counted),
            timed: policies_timed.iter().any(|&timed| timed),
            default_level: config.default_priority_level.saturating_sub(1),
            stats,
            config,
            levels,
            id: NEXT_QUEUE_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    pub fn policy(&self) -> &BatchPolicy {
        &self.config.batch
    }

    pub fn config(&self) -> &QueueConfig {
        &self.config
    }

    /// The queue's statistics (shared with other queues when made by
    /// [`with_shared_stats`](Self::with_shared_stats)): rejections and cancellations are
    /// counted here; executions are recorded by whoever runs the batches
    /// ([`ModelStats::record_execution`]).
    pub fn stats(&self) -> &Arc<ModelStats> {
        &self.stats
    }

    /// Consumers waiting for requests with nothing staged, the former lock let go (a
    /// snapshot).
    pub fn idle_consumers(&self) -> usize {
        self.idle.len()
    }

    /// Whether a consumer holds the former lock: forms a batch, or looks for requests (a
    /// snapshot).
    pub fn is_forming(&self) -> bool {
        self.former.is_locked()
    }

    /// Requests queued and not yet handed out, rejected or cancelled (a snapshot; it may be
    /// stale by the time it returns).
    pub fn len(&self) -> usize {
        let held = self.items.len() + self.staged_len.load(Ordering::Relaxed);
        let cancelled = self.cancelled_held.load(Ordering::Relaxed).max(0);
        held.saturating_sub(cancelled.unsigned_abs())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A request of `level` left the queue (handed out, rejected or cancelled).
    fn release(&self, level: u32) {
        if !self.counted {
            return;
        }
        let level = &self.levels[level as usize];
        if level.counted() {
            level.queued.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn queue(max: u32, delay_us: u64, preferred: &[u32]) -> RequestQueue<u32> {
        RequestQueue::new(BatchPolicy {
            max_batch_size: max,
            max_queue_delay: Duration::from_micros(delay_us),
            preferred_batch_sizes: preferred.to_vec(),
        })
        .unwrap()
    }

    #[test]
    fn len_counts_staged_and_queued_items() {
        let q = queue(4, 1_000_000, &[]);
        for i in 0..6 {
            q.push(i, 1).unwrap();
        }
        assert_eq!(q.len(), 6);
        // Batch of 4 leaves (full); 2 remain staged.
        assert_eq!(
            q.pop_batch(Duration::ZERO).into_batch(),
            Some(vec![0, 1, 2, 3])
        );
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn len_leaves_out_cancelled_requests() {
        let q = queue(0, 0, &[]);
        let tickets: Vec<_> = (0..3)
            .map(|i| q.push_cancellable(i, RequestMeta::default()).unwrap())
            .collect();
        assert!(q.cancel(&tickets[1]).unwrap());
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop_batch(Duration::ZERO).into_batch(), Some(vec![0]));
        assert_eq!(q.pop_batch(Duration::ZERO).into_batch(), Some(vec![2]));
        assert_eq!(q.len(), 0);
        assert_eq!(q.pop_batch(Duration::ZERO), PopResult::TimedOut);
        assert_eq!(q.len(), 0);
    }
}
