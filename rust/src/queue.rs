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
//!   for up to 50 µs, then parks) for more requests, the batch deadline or the next queue timeout. Other
//!   consumers wait for the former lock (with their own timeout), so batches leave in order and
//!   every request goes to exactly one consumer. This mirrors Triton, where one scheduler thread
//!   forms batches for all the model's instances.
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

use std::fmt;
use std::hint;
use std::sync::Arc;
use std::sync::atomic::{
    AtomicBool, AtomicIsize, AtomicU8, AtomicU64, AtomicUsize, Ordering, fence,
};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;
use crossbeam_utils::CachePadded;
use crossbeam_utils::sync::{Parker, Unparker};
use parking_lot::Mutex;

use crate::batcher::{Cursor, Plan, Rules, Staged};
use crate::error::CoreError;
use crate::stats::{FailureReason, ModelStats};

/// Triton's message for a push to a full priority level (`Unavailable`).
pub const QUEUE_FULL_MESSAGE: &str = "Exceeds maximum queue size";

/// The most priority levels a queue accepts.
pub const MAX_PRIORITY_LEVELS: u32 = 1024;

/// How a queue groups requests into batches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchPolicy {
    /// Largest sum of request batch sizes in one batch; 0 turns batching off (one request per
    /// batch).
    pub max_batch_size: u32,
    /// How long a batch that is not yet full may wait for more requests, counted from the moment
    /// its oldest request was enqueued.
    pub max_queue_delay: Duration,
    /// Batch sizes worth sending without waiting for `max_queue_delay`.
    pub preferred_batch_sizes: Vec<u32>,
}

impl BatchPolicy {
    /// A policy with batching off: every batch is one request.
    pub fn unbatched() -> Self {
        Self::default()
    }

    /// Whether requests are grouped at all.
    pub fn batching(&self) -> bool {
        self.max_batch_size > 0
    }

    fn validate(&self) -> Result<(), CoreError> {
        if !self.batching() && !self.preferred_batch_sizes.is_empty() {
            return Err(CoreError::invalid_arg(
                "preferred batch sizes need batching (max_batch_size > 0)",
            ));
        }
        for &size in &self.preferred_batch_sizes {
            if size == 0 || size > self.max_batch_size {
                return Err(CoreError::invalid_arg(format!(
                    "preferred batch size {size} must be between 1 and max_batch_size ({})",
                    self.max_batch_size
                )));
            }
        }
        Ok(())
    }

    fn rules(&self) -> Rules {
        let mut preferred: Vec<u64> = self
            .preferred_batch_sizes
            .iter()
            .map(|&s| u64::from(s))
            .collect();
        preferred.sort_unstable();
        preferred.dedup();
        let max_batch_size = u64::from(self.max_batch_size);
        Rules {
            batching: self.batching(),
            max_batch_size,
            max_preferred: preferred.last().copied().unwrap_or(max_batch_size),
            preferred,
            max_queue_delay: self.max_queue_delay,
        }
    }
}

/// What happens to a request whose queue timeout expires (Triton's `TimeoutAction`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TimeoutAction {
    /// Hand it back to be answered with an error.
    #[default]
    Reject,
    /// Move it behind the level's unexpired requests.
    Delay,
}

/// The policy of one priority level (Triton's `ModelQueuePolicy`); see the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueuePolicy {
    pub timeout_action: TimeoutAction,
    /// Zero: requests never time out.
    pub default_timeout: Duration,
    pub allow_timeout_override: bool,
    /// Zero: unlimited.
    pub max_queue_size: u32,
}

impl QueuePolicy {
    /// The timeout a request asking for `requested` (zero: none) gets, if any.
    pub fn timeout_for(&self, requested: Duration) -> Option<Duration> {
        let mut timeout = self.default_timeout;
        if self.allow_timeout_override && !requested.is_zero() && requested < timeout {
            timeout = requested;
        }
        (!timeout.is_zero()).then_some(timeout)
    }
}

/// Everything a queue is configured with (Triton's `ModelDynamicBatching`, less what the
/// scheduler handles itself).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueConfig {
    pub batch: BatchPolicy,
    /// Zero: a single level.
    pub priority_levels: u32,
    /// The level of requests with priority 0 (or above `priority_levels`); 1 to
    /// `priority_levels` when there are levels, ignored otherwise.
    pub default_priority_level: u32,
    /// The policy of every level not listed in `priority_queue_policy`.
    pub default_queue_policy: QueuePolicy,
    /// `(level, policy)` overrides.
    pub priority_queue_policy: Vec<(u32, QueuePolicy)>,
    /// Keep recent request durations for latency quantiles (Prometheus summaries).
    pub latency_summaries: bool,
}

impl From<BatchPolicy> for QueueConfig {
    fn from(batch: BatchPolicy) -> Self {
        Self {
            batch,
            ..Self::default()
        }
    }
}

impl QueueConfig {
    fn validate(&self) -> Result<(), CoreError> {
        self.batch.validate()?;
        let levels = self.priority_levels;
        if levels > MAX_PRIORITY_LEVELS {
            return Err(CoreError::invalid_arg(format!(
                "priority_levels {levels} exceeds the supported maximum of {MAX_PRIORITY_LEVELS}"
            )));
        }
        if levels > 0 && !(1..=levels).contains(&self.default_priority_level) {
            return Err(CoreError::invalid_arg(format!(
                "default_priority_level must be in range [1, {levels}], got {}",
                self.default_priority_level
            )));
        }
        for &(level, _) in &self.priority_queue_policy {
            if !(1..=levels).contains(&level) {
                return Err(CoreError::invalid_arg(format!(
                    "priority_queue_policy level {level} must be in range [1, {levels}]"
                )));
            }
        }
        Ok(())
    }

    /// The policy of each level, highest priority first.
    fn level_policies(&self) -> Vec<QueuePolicy> {
        let count = self.priority_levels.max(1) as usize;
        let mut policies = vec![self.default_queue_policy.clone(); count];
        for (level, policy) in &self.priority_queue_policy {
            policies[*level as usize - 1] = policy.clone();
        }
        policies
    }
}

/// What a producer says about a request besides the request itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestMeta {
    /// The request's batch dimension (its first dimension); with batching off it is only used
    /// for statistics.
    pub batch_size: u32,
    /// 1 (highest) to `priority_levels`; 0 for the default level.
    pub priority: u32,
    /// The timeout the request asks for; zero for none (see [`QueuePolicy::timeout_for`]).
    pub timeout: Duration,
    /// Requests batch together only when their shape keys are equal; 0 when the caller does not
    /// need shape grouping.
    pub shape_key: u64,
}

impl Default for RequestMeta {
    fn default() -> Self {
        Self {
            batch_size: 1,
            priority: 0,
            timeout: Duration::ZERO,
            shape_key: 0,
        }
    }
}

impl RequestMeta {
    /// Default metadata with the given batch size.
    pub fn with_batch_size(batch_size: u32) -> Self {
        Self {
            batch_size,
            ..Self::default()
        }
    }
}

const QUEUED: u8 = 0;
const TAKEN: u8 = 1;
const CANCELLED: u8 = 2;
const REJECTED: u8 = 3;

/// Where a cancellable request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TicketStatus {
    /// Still in the queue.
    Queued,
    /// Handed out in a batch (it runs or ran).
    Taken,
    /// Removed by [`RequestQueue::cancel`].
    Cancelled,
    /// Handed back as timed out (REJECT).
    Rejected,
}

#[derive(Debug)]
pub(crate) struct TicketState {
    state: AtomicU8,
    queue_id: u64,
    level: u32,
    enqueued_at: Instant,
}

/// The handle of a request pushed with [`RequestQueue::push_cancellable`].
#[derive(Debug, Clone)]
pub struct Ticket(Arc<TicketState>);

impl Ticket {
    pub fn status(&self) -> TicketStatus {
        match self.0.state.load(Ordering::Acquire) {
            QUEUED => TicketStatus::Queued,
            TAKEN => TicketStatus::Taken,
            CANCELLED => TicketStatus::Cancelled,
            _ => TicketStatus::Rejected,
        }
    }

    /// When the request was enqueued.
    pub fn enqueued_at(&self) -> Instant {
        self.0.enqueued_at
    }
}

/// A request as it sat in the queue.
#[derive(Debug)]
pub struct Queued<T> {
    pub item: T,
    pub batch_size: u32,
    /// Index of its priority level (0 is the highest).
    pub(crate) level: u32,
    pub shape_key: u64,
    /// When it was enqueued.
    pub(crate) enqueued_at: Instant,
    /// Its queue timeout in nanoseconds after `enqueued_at`; 0 for none. (A count rather than
    /// an `Option<Instant>`: every byte of this struct is moved several times.)
    pub(crate) timeout_ns: u64,
    pub(crate) ticket: Option<Arc<TicketState>>,
}

impl<T> Queued<T> {
    /// When it was enqueued.
    pub fn enqueued_at(&self) -> Instant {
        self.enqueued_at
    }

    /// When its queue timeout fires, if it has one.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        if self.timeout_ns == 0 {
            None
        } else {
            self.enqueued_at
                .checked_add(Duration::from_nanos(self.timeout_ns))
        }
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.ticket
            .as_ref()
            .is_some_and(|t| t.state.load(Ordering::Acquire) == CANCELLED)
    }

    fn transition(&self, to: u8) -> bool {
        self.ticket.as_ref().is_none_or(|t| {
            t.state
                .compare_exchange(QUEUED, to, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        })
    }

    /// Claims the request for a batch; false if it was cancelled.
    pub(crate) fn claim(&self) -> bool {
        self.transition(TAKEN)
    }

    /// Claims the request for rejection; false if it was cancelled.
    pub(crate) fn claim_for_rejection(&self) -> bool {
        self.transition(REJECTED)
    }

    #[cfg(test)]
    pub(crate) fn for_test(
        item: T,
        batch_size: u32,
        level: u32,
        shape_key: u64,
        enqueued_at: Instant,
        timeout: Duration,
    ) -> Self {
        Self {
            item,
            batch_size,
            level,
            shape_key,
            enqueued_at,
            timeout_ns: u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
            ticket: None,
        }
    }
}

/// A batch handed out by [`RequestQueue::pop_batch`].
#[derive(Debug, PartialEq, Eq)]
pub struct Batch<T> {
    /// One or more requests, in candidate order (priority, then arrival).
    pub items: Vec<T>,
    /// 0, 1, 2, ... in the order batches left the queue (for ordered completion).
    pub seq: u64,
}

/// What [`RequestQueue::pop_batch`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum PopResult<T> {
    /// A batch to run.
    Batch(Batch<T>),
    /// Requests whose queue timeout expired under the REJECT action: answer each with an error.
    Rejected(Vec<T>),
    /// Nothing arrived before the timeout.
    TimedOut,
    /// The queue is closed and everything in it has been handed out.
    Closed,
}

impl<T> PopResult<T> {
    /// The batch's items, if this is a batch.
    pub fn into_batch(self) -> Option<Vec<T>> {
        match self {
            PopResult::Batch(batch) => Some(batch.items),
            PopResult::Rejected(_) | PopResult::TimedOut | PopResult::Closed => None,
        }
    }

    /// Applies `f` to every item of a batch or rejection.
    pub fn map<U>(self, f: impl FnMut(T) -> U) -> PopResult<U> {
        match self {
            PopResult::Batch(batch) => PopResult::Batch(Batch {
                items: batch.items.into_iter().map(f).collect(),
                seq: batch.seq,
            }),
            PopResult::Rejected(items) => PopResult::Rejected(items.into_iter().map(f).collect()),
            PopResult::TimedOut => PopResult::TimedOut,
            PopResult::Closed => PopResult::Closed,
        }
    }
}

/// How long [`RequestQueue::abandon`] waits at a time for a consumer forming a batch.
const ABANDON_WAIT: Duration = Duration::from_millis(1);

/// `state` bit: the queue is closed.
const CLOSED: usize = 1;
/// `state` increment for each push in progress (the count lives above the `CLOSED` bit).
const PUSHER: usize = 2;
/// Most requests one refill moves from the lock-free queue to the staging area. Priority order
/// holds among the requests staged; under a flood of more than this many pushes between two
/// batches, a later high-priority request may wait for the next refill.
const REFILL_LIMIT: usize = 4096;
/// How long a waiting consumer keeps polling for work before it parks. Waking a parked thread
/// takes the OS 15-20 µs on the machines we measure on, longer than an instance that has just
/// finished a batch usually waits for the next request under load, and longer than the whole
/// enqueue-to-instance budget. A batch deadline inside the window is waited for by polling too,
/// which keeps short `max_queue_delay`s exact.
const SPIN_WINDOW: Duration = Duration::from_micros(50);
/// The shortest a waiting consumer polls once polling has stopped paying (see [`Spin`]).
const MIN_SPIN: Duration = Duration::from_micros(2);
/// Polls between two readings of the clock while spinning.
const SPINS_PER_CLOCK_READ: u32 = 16;

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

/// How long the former lock holder polls before it parks, adapted to how soon work has been
/// coming. Polling pays only when work arrives within [`SPIN_WINDOW`]; when it comes later
/// (a loaded server whose producers are busy elsewhere, or one request at a time), the polls
/// burn a core the producers need. So each wait that ends with news within the window doubles
/// the poll time (up to the window), and each that ends later halves it (down to [`MIN_SPIN`]).
struct Spin {
    window: Duration,
}

impl Spin {
    fn new() -> Self {
        Self {
            window: SPIN_WINDOW,
        }
    }

    fn learn(&mut self, waited: Duration) {
        self.window = if waited <= SPIN_WINDOW {
            (self.window * 2).min(SPIN_WINDOW)
        } else {
            (self.window / 2).max(MIN_SPIN)
        };
    }
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

/// How the former proceeds with a plan.
enum Decision {
    Take(Cursor),
    /// Wait for more requests until this instant (`None`: the delay overflowed, no deadline).
    WaitUntil(Option<Instant>),
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
                spin: Spin::new(),
            })),
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
        // Pairs with the fence in `wait`: either the consumer sees the request before parking,
        // or we see that it is parked and wake it.
        fence(Ordering::SeqCst);
        if self.consumer_parked.load(Ordering::Relaxed) {
            self.unparker.unpark();
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

    /// Removes a queued request before it runs. Returns `true` if it was still queued (it will
    /// never be handed out, and counts as a CANCELED failure), `false` if it was already handed
    /// out, rejected or cancelled. Fails with `InvalidArg` for a ticket of another queue.
    pub fn cancel(&self, ticket: &Ticket) -> Result<bool, CoreError> {
        let state = &ticket.0;
        if state.queue_id != self.id {
            return Err(CoreError::invalid_arg(
                "the ticket belongs to another request queue",
            ));
        }
        if state
            .state
            .compare_exchange(QUEUED, CANCELLED, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Ok(false);
        }
        self.release(state.level);
        self.cancelled_held.fetch_add(1, Ordering::Relaxed);
        self.stats
            .record_failure(FailureReason::Canceled, state.enqueued_at.elapsed());
        // Let a parked consumer drop it (and re-plan without it) now rather than later.
        if self.consumer_parked.load(Ordering::Relaxed) {
            self.unparker.unpark();
        }
        Ok(true)
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

    /// Waits up to `timeout` for at least one request and returns a batch formed by the
    /// batching rules, or requests rejected by a queue timeout; `TimedOut` if nothing came;
    /// `Closed` once the queue is closed and drained. May return `TimedOut` early.
    pub fn pop_batch(&self, timeout: Duration) -> PopResult<T> {
        self.pop_with(Some(timeout), |queued| queued.item)
    }

    /// Like [`pop_batch`](Self::pop_batch), keeping each request's metadata.
    pub fn pop_batch_queued(&self, timeout: Duration) -> PopResult<Queued<T>> {
        self.pop_with(Some(timeout), |queued| queued)
    }

    /// Never waits: the batch (or rejections) that may leave right now, else `TimedOut` (also
    /// when another consumer is forming a batch, or a partial batch is still within its delay);
    /// `Closed` once closed and drained.
    pub fn try_pop_batch(&self) -> PopResult<T> {
        self.pop_with(None, |queued| queued.item)
    }

    /// Like [`try_pop_batch`](Self::try_pop_batch), keeping each request's metadata.
    pub fn try_pop_batch_queued(&self) -> PopResult<Queued<T>> {
        self.pop_with(None, |queued| queued)
    }

    /// Forms a batch and hands it out, converting each request with `convert`. `timeout: None`
    /// means never wait.
    fn pop_with<U>(
        &self,
        timeout: Option<Duration>,
        mut convert: impl FnMut(Queued<T>) -> U,
    ) -> PopResult<U> {
        // The clock is read only once a wait is needed (reading it costs tens of ns on VMs).
        let mut deadline = None;
        let mut deadline_for = |timeout: Duration| {
            *deadline.get_or_insert_with(|| Instant::now().checked_add(timeout))
        };
        let former = self.former.try_lock().or_else(|| {
            let timeout = timeout?;
            match deadline_for(timeout) {
                Some(deadline) => self.former.try_lock_until(deadline),
                None => Some(self.former.lock()),
            }
        });
        let Some(mut former) = former else {
            return PopResult::TimedOut;
        };
        let former = &mut *former;
        loop {
            // Read the state before refilling: if it says "closed, no push in progress", the
            // refill below sees every request that will ever arrive.
            let state = self.state.load(Ordering::Acquire);
            let closed = state & CLOSED != 0;
            if self.direct {
                // Unbatched, one level, no timeouts: the oldest live request is the batch, with
                // no planning.
                if former.staged.len() == 0 {
                    self.refill(former, 1);
                }
                let first = former.staged.take_first();
                self.sync(former);
                if let Some(queued) = first {
                    let seq = former.next_seq;
                    former.next_seq += 1;
                    self.release(queued.level);
                    return PopResult::Batch(Batch {
                        items: vec![convert(queued)],
                        seq,
                    });
                }
            }
            self.refill(former, REFILL_LIMIT);

            if self.timed && former.staged.has_expiries() {
                let now = Instant::now();
                let mut rejected = Vec::new();
                former.staged.expire(now, &mut rejected);
                if !rejected.is_empty() {
                    for queued in &rejected {
                        self.release(queued.level);
                        self.stats.record_failure(
                            FailureReason::Rejected,
                            now.saturating_duration_since(queued.enqueued_at),
                        );
                    }
                    self.sync(former);
                    return PopResult::Rejected(rejected.into_iter().map(&mut convert).collect());
                }
            }

            let Some(plan) = former.staged.plan(&self.rules) else {
                self.sync(former);
                if closed {
                    if state >= PUSHER {
                        // A push that started before `close` is about to land.
                        thread::yield_now();
                        continue;
                    }
                    return PopResult::Closed;
                }
                let Some(timeout) = timeout else {
                    return PopResult::TimedOut;
                };
                let deadline = deadline_for(timeout);
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return PopResult::TimedOut;
                }
                let former = &mut *former;
                self.wait(&mut former.spin, &former.parker, deadline);
                continue;
            };

            let end = match self.decide(&former.staged, &plan, closed) {
                Decision::Take(end) => end,
                Decision::WaitUntil(until) => {
                    self.sync(former);
                    if timeout.is_none() {
                        return PopResult::TimedOut;
                    }
                    let wake = match (until, former.staged.next_expiry()) {
                        (Some(until), Some(expiry)) => Some(until.min(expiry)),
                        (until, expiry) => until.or(expiry),
                    };
                    let former = &mut *former;
                    self.wait(&mut former.spin, &former.parker, wake);
                    continue;
                }
            };
            let mut items = Vec::with_capacity(end.count);
            former.staged.take(end, |queued| {
                self.release(queued.level);
                items.push(convert(queued));
            });
            self.sync(former);
            if items.is_empty() {
                // Everything planned was cancelled in the meantime.
                continue;
            }
            let seq = former.next_seq;
            former.next_seq += 1;
            return PopResult::Batch(Batch { items, seq });
        }
    }

    /// Whether `plan` leaves now, and how much of it; or until when it may wait. Reads the
    /// clock (and the batch's age) only when the answer depends on them.
    fn decide(&self, staged: &Staged<T>, plan: &Plan, closed: bool) -> Decision {
        let delay = self.rules.max_queue_delay;
        let batch_deadline = || {
            staged
                .oldest(plan.all)
                .and_then(|oldest| oldest.checked_add(delay))
        };
        if let Some(best) = plan.best {
            if best == plan.all || delay.is_zero() {
                return Decision::Take(best);
            }
            // The best cut is a strict prefix: it wins unless the batch already waited its
            // delay, in which case everything that fits leaves.
            let exceeded = batch_deadline().is_some_and(|d| Instant::now() >= d);
            return Decision::Take(if exceeded { plan.all } else { best });
        }
        if plan.full || closed || delay.is_zero() {
            return Decision::Take(plan.all);
        }
        match batch_deadline() {
            Some(deadline) if Instant::now() >= deadline => Decision::Take(plan.all),
            until => Decision::WaitUntil(until),
        }
    }

    /// Closes the queue: later pushes fail with `Unavailable`, every waiting consumer wakes, and
    /// what is still queued is handed out before `pop_batch` reports `Closed`. Idempotent.
    pub fn close(&self) {
        self.state.fetch_or(CLOSED, Ordering::SeqCst);
        self.unparker.unpark();
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

    /// Moves up to `limit` requests from the lock-free queue into the staging area. (Bounded, so
    /// a steady stream of pushes cannot keep it busy; not by `items.len()`, which reads the
    /// producers' hot cache lines. The only caller of `SegQueue::pop`, which keeps it inlined: returning a `Queued`
    /// through memory from an out-of-line call costs a store-forwarding stall per request.)
    fn refill(&self, former: &mut Former<T>, limit: usize) {
        for _ in 0..limit {
            let Some(queued) = self.items.pop() else {
                break;
            };
            former.staged.push(queued);
        }
    }

    /// Publishes the staged count and the cancelled requests the former dropped.
    fn sync(&self, former: &mut Former<T>) {
        let staged = former.staged.len();
        if self.staged_len.load(Ordering::Relaxed) != staged {
            self.staged_len.store(staged, Ordering::Relaxed);
        }
        let swept = former.staged.take_swept();
        if swept > 0 {
            self.cancelled_held.fetch_sub(
                isize::try_from(swept).unwrap_or(isize::MAX),
                Ordering::Relaxed,
            );
        }
    }

    /// Something a waiting consumer must look at: a new request, or the queue closing.
    fn has_news(&self) -> bool {
        !self.items.is_empty() || self.state.load(Ordering::Relaxed) & CLOSED != 0
    }

    /// Waits (poll for up to the spin window, then park) until there is news or `deadline`
    /// passes. May return early; callers loop. A deadline within [`SPIN_WINDOW`] is polled
    /// for whatever the window, so short batch delays stay exact.
    fn wait(&self, spin: &mut Spin, parker: &Parker, deadline: Option<Instant>) {
        let start = Instant::now();
        let poll_end = match deadline {
            Some(deadline) if deadline <= start + SPIN_WINDOW => deadline,
            _ => start + spin.window,
        };
        loop {
            for _ in 0..SPINS_PER_CLOCK_READ {
                if self.has_news() {
                    spin.learn(start.elapsed());
                    return;
                }
                hint::spin_loop();
            }
            let now = Instant::now();
            if deadline.is_some_and(|deadline| now >= deadline) {
                return;
            }
            if now >= poll_end {
                break;
            }
        }
        self.consumer_parked.store(true, Ordering::Relaxed);
        // Pairs with the fence in `push` (see there).
        fence(Ordering::SeqCst);
        if !self.has_news() {
            match deadline {
                Some(deadline) => {
                    precise_timers::enable_for_this_thread();
                    parker.park_deadline(deadline);
                }
                None => parker.park(),
            }
        }
        self.consumer_parked.store(false, Ordering::Relaxed);
        if self.has_news() {
            spin.learn(start.elapsed());
        }
    }
}

/// Batch deadlines are tens of microseconds away; Linux lets a timed sleep overrun by the
/// thread's timer slack (50 µs by default), which would more than double a 100 µs
/// `max_queue_delay`. Consumers that wait on a deadline ask for 1 ns of slack instead.
mod precise_timers {
    #[cfg(target_os = "linux")]
    pub(super) fn enable_for_this_thread() {
        use std::cell::Cell;
        thread_local!(static DONE: Cell<bool> = const { Cell::new(false) });
        DONE.with(|done| {
            if !done.get() {
                // SAFETY: PR_SET_TIMERSLACK takes one integer argument and only changes this
                // thread's timer slack; it touches no memory of ours.
                unsafe {
                    libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
                }
                done.set(true);
            }
        });
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn enable_for_this_thread() {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Code;

    #[test]
    fn spin_window_shrinks_when_work_comes_late_and_grows_when_it_comes_soon() {
        let mut spin = Spin::new();
        assert_eq!(spin.window, SPIN_WINDOW);
        let late = SPIN_WINDOW * 3;
        spin.learn(late);
        assert_eq!(spin.window, SPIN_WINDOW / 2);
        for _ in 0..20 {
            spin.learn(late);
        }
        assert_eq!(spin.window, MIN_SPIN);
        spin.learn(Duration::from_micros(10));
        assert_eq!(spin.window, MIN_SPIN * 2);
        for _ in 0..20 {
            spin.learn(Duration::ZERO);
        }
        assert_eq!(spin.window, SPIN_WINDOW);
    }

    fn queue(max: u32, delay_us: u64, preferred: &[u32]) -> RequestQueue<u32> {
        RequestQueue::new(BatchPolicy {
            max_batch_size: max,
            max_queue_delay: Duration::from_micros(delay_us),
            preferred_batch_sizes: preferred.to_vec(),
        })
        .unwrap()
    }

    #[test]
    fn policy_validation() {
        let bad = |max, preferred: &[u32]| {
            RequestQueue::<u32>::new(BatchPolicy {
                max_batch_size: max,
                max_queue_delay: Duration::ZERO,
                preferred_batch_sizes: preferred.to_vec(),
            })
            .unwrap_err()
            .code
        };
        assert_eq!(bad(0, &[1]), Code::InvalidArg);
        assert_eq!(bad(4, &[0]), Code::InvalidArg);
        assert_eq!(bad(4, &[5]), Code::InvalidArg);
    }

    #[test]
    fn level_validation() {
        let bad = |levels, default, overrides: &[u32]| {
            RequestQueue::<u32>::with_config(QueueConfig {
                priority_levels: levels,
                default_priority_level: default,
                priority_queue_policy: overrides
                    .iter()
                    .map(|&l| (l, QueuePolicy::default()))
                    .collect(),
                ..QueueConfig::default()
            })
            .map(drop)
            .map_err(|e| e.code)
        };
        assert_eq!(bad(0, 0, &[]), Ok(()));
        assert_eq!(bad(0, 3, &[]), Ok(()));
        assert_eq!(bad(3, 2, &[1, 3]), Ok(()));
        assert_eq!(bad(3, 0, &[]), Err(Code::InvalidArg));
        assert_eq!(bad(3, 4, &[]), Err(Code::InvalidArg));
        assert_eq!(bad(3, 1, &[4]), Err(Code::InvalidArg));
        assert_eq!(bad(0, 0, &[1]), Err(Code::InvalidArg));
        assert_eq!(bad(MAX_PRIORITY_LEVELS + 1, 1, &[]), Err(Code::InvalidArg));
    }

    #[test]
    fn timeout_override_only_shortens() {
        let policy = |default_us, allow| QueuePolicy {
            default_timeout: Duration::from_micros(default_us),
            allow_timeout_override: allow,
            ..QueuePolicy::default()
        };
        let us = Duration::from_micros;
        assert_eq!(policy(0, true).timeout_for(us(5)), None);
        assert_eq!(policy(100, true).timeout_for(us(5)), Some(us(5)));
        assert_eq!(policy(100, true).timeout_for(us(500)), Some(us(100)));
        assert_eq!(policy(100, true).timeout_for(us(0)), Some(us(100)));
        assert_eq!(policy(100, false).timeout_for(us(5)), Some(us(100)));
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
