//! The per-model request queue with simple dynamic batching.
//!
//! Producers (the frontends, through the scheduler) [`push`](RequestQueue::push) items; model
//! instances call [`pop_batch`](RequestQueue::pop_batch) and get whole batches back.
//!
//! # How it works
//!
//! * Items go into a lock-free [`SegQueue`]; a push is a few atomic operations and never takes a
//!   lock. The producer wakes a consumer only when one is actually parked.
//! * Batches are formed by one consumer at a time: the consumer that holds the *former* lock
//!   moves items from the lock-free queue into a small staging deque, decides the batch, and
//!   waits (spin briefly, then park) for more items or for the batch deadline. Other consumers
//!   wait for the former lock (with their own timeout), so batches leave in FIFO order and every
//!   item goes to exactly one consumer. This mirrors Triton, where one scheduler thread forms
//!   batches for all the model's instances.
//! * An item never splits across batches. An item that does not fit stays staged and heads the
//!   next batch.
//!
//! # Batching rules (when `max_batch_size > 0`)
//!
//! A batch takes items in FIFO order while the sum of their batch sizes stays within
//! `max_batch_size`. It leaves as soon as one of these holds:
//! * it is full: its size equals `max_batch_size`, or the next item would not fit;
//! * some prefix of the available items sums to a preferred batch size: the batch is the longest
//!   such prefix (the largest preferred size reachable now);
//! * `max_queue_delay` has passed since its oldest item was enqueued;
//! * the queue is closed (what is queued drains without waiting).
//!
//! With `max_batch_size == 0` batching is off: each batch is exactly one item.
//!
//! `pop_batch`'s timeout bounds the wait for the *first* item (and for the former lock). Once a
//! consumer has an item, the batch leaves by the rules above, at the latest `max_queue_delay`
//! after its oldest item was enqueued.

use std::collections::VecDeque;
use std::fmt;
use std::hint;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;
use crossbeam_utils::CachePadded;
use crossbeam_utils::sync::{Parker, Unparker};
use parking_lot::Mutex;

use crate::error::CoreError;

/// How a queue groups items into batches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchPolicy {
    /// Largest sum of item batch sizes in one batch; 0 turns batching off (one item per batch).
    pub max_batch_size: u32,
    /// How long a batch that is not yet full may wait for more items, counted from the moment
    /// its oldest item was enqueued.
    pub max_queue_delay: Duration,
    /// Batch sizes worth sending without waiting for `max_queue_delay`.
    pub preferred_batch_sizes: Vec<u32>,
}

impl BatchPolicy {
    /// A policy with batching off: every batch is one item.
    pub fn unbatched() -> Self {
        Self::default()
    }

    /// Whether items are grouped at all.
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
}

/// An item as it sat in the queue: the item, its batch size and when it was enqueued.
#[derive(Debug)]
pub struct Queued<T> {
    pub item: T,
    pub batch_size: u32,
    pub enqueued_at: Instant,
}

/// What [`RequestQueue::pop_batch`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum PopResult<T> {
    /// A batch of one or more items, in FIFO order.
    Batch(Vec<T>),
    /// No item arrived before the timeout.
    TimedOut,
    /// The queue is closed and everything in it has been handed out.
    Closed,
}

impl<T> PopResult<T> {
    /// The batch, if this is one.
    pub fn into_batch(self) -> Option<Vec<T>> {
        match self {
            PopResult::Batch(batch) => Some(batch),
            PopResult::TimedOut | PopResult::Closed => None,
        }
    }

    /// Applies `f` to every item of a batch.
    pub fn map<U>(self, f: impl FnMut(T) -> U) -> PopResult<U> {
        match self {
            PopResult::Batch(batch) => PopResult::Batch(batch.into_iter().map(f).collect()),
            PopResult::TimedOut => PopResult::TimedOut,
            PopResult::Closed => PopResult::Closed,
        }
    }
}

/// `state` bit: the queue is closed.
const CLOSED: usize = 1;
/// `state` increment for each push in progress (the count lives above the `CLOSED` bit).
const PUSHER: usize = 2;
/// Checks of the lock-free queue a waiting consumer makes before it parks.
const SPIN_CHECKS: u32 = 64;

/// Staged items and the parker, owned by whichever consumer holds the former lock.
struct Former<T> {
    /// Items taken from the lock-free queue but not yet handed out; they precede it in FIFO order.
    staged: VecDeque<Queued<T>>,
    /// Sum of the staged items' weights (batch sizes, or 1 each when batching is off).
    staged_weight: u64,
    /// Parks the former lock holder; producers hold the matching `Unparker`.
    parker: Parker,
}

/// A multi-producer, multi-consumer FIFO queue that hands out batches. See the module docs.
pub struct RequestQueue<T> {
    items: SegQueue<Queued<T>>,
    /// `CLOSED` bit plus `PUSHER` times the number of pushes in progress.
    state: CachePadded<AtomicUsize>,
    /// Set while the former lock holder is (about to be) parked.
    consumer_parked: CachePadded<AtomicBool>,
    /// Number of staged items, for `len()`.
    staged_len: AtomicUsize,
    unparker: Unparker,
    former: Mutex<Former<T>>,
    policy: BatchPolicy,
    /// `policy.preferred_batch_sizes`, sorted and deduplicated.
    preferred: Vec<u64>,
}

impl<T> fmt::Debug for RequestQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestQueue")
            .field("policy", &self.policy)
            .field("len", &self.len())
            .field("closed", &self.is_closed())
            .finish_non_exhaustive()
    }
}

impl<T> RequestQueue<T> {
    /// A new, open, empty queue. Fails with `InvalidArg` if a preferred batch size is 0, exceeds
    /// `max_batch_size`, or is given while batching is off.
    pub fn new(policy: BatchPolicy) -> Result<Self, CoreError> {
        policy.validate()?;
        let mut preferred: Vec<u64> = policy
            .preferred_batch_sizes
            .iter()
            .map(|&s| u64::from(s))
            .collect();
        preferred.sort_unstable();
        preferred.dedup();
        let parker = Parker::new();
        Ok(Self {
            items: SegQueue::new(),
            state: CachePadded::new(AtomicUsize::new(0)),
            consumer_parked: CachePadded::new(AtomicBool::new(false)),
            staged_len: AtomicUsize::new(0),
            unparker: parker.unparker().clone(),
            former: Mutex::new(Former {
                staged: VecDeque::new(),
                staged_weight: 0,
                parker,
            }),
            policy,
            preferred,
        })
    }

    pub fn policy(&self) -> &BatchPolicy {
        &self.policy
    }

    /// Enqueues `item`, whose batch dimension is `batch_size`.
    ///
    /// Fails with `Unavailable` once the queue is closed, and, when batching is on, with
    /// `InvalidArg` if `batch_size` is 0 or exceeds `max_batch_size`. With batching off
    /// `batch_size` is not looked at. A push that returns `Ok` is handed out by some
    /// `pop_batch`, also when `close` races with it.
    pub fn push(&self, item: T, batch_size: u32) -> Result<(), CoreError> {
        if self.policy.batching() && (batch_size == 0 || batch_size > self.policy.max_batch_size) {
            return Err(CoreError::invalid_arg(format!(
                "batch size {batch_size} must be between 1 and max_batch_size ({})",
                self.policy.max_batch_size
            )));
        }
        let state = self.state.fetch_add(PUSHER, Ordering::Acquire);
        if state & CLOSED != 0 {
            self.state.fetch_sub(PUSHER, Ordering::Release);
            return Err(CoreError::unavailable("the request queue is closed"));
        }
        self.items.push(Queued {
            item,
            batch_size,
            enqueued_at: Instant::now(),
        });
        // Pairs with the fence in `wait`: either the consumer sees the item before parking, or
        // we see that it is parked and wake it.
        fence(Ordering::SeqCst);
        if self.consumer_parked.load(Ordering::Relaxed) {
            self.unparker.unpark();
        }
        // Release: a consumer that sees the count drop also sees the item.
        self.state.fetch_sub(PUSHER, Ordering::Release);
        Ok(())
    }

    /// Waits up to `timeout` for at least one item and returns a batch formed by the module's
    /// rules; `TimedOut` if none came; `Closed` once the queue is closed and drained.
    pub fn pop_batch(&self, timeout: Duration) -> PopResult<T> {
        self.pop_with(Some(timeout), |queued| queued.item)
    }

    /// Like [`pop_batch`](Self::pop_batch), keeping each item's batch size and enqueue time.
    pub fn pop_batch_queued(&self, timeout: Duration) -> PopResult<Queued<T>> {
        self.pop_with(Some(timeout), |queued| queued)
    }

    /// Never waits: the batch that may leave right now, else `TimedOut` (also when another
    /// consumer is forming a batch, or a partial batch is still within its delay); `Closed` once
    /// closed and drained.
    pub fn try_pop_batch(&self) -> PopResult<T> {
        self.pop_with(None, |queued| queued.item)
    }

    /// Forms a batch and hands it out, converting each item with `convert`. `timeout: None`
    /// means never wait.
    fn pop_with<U>(
        &self,
        timeout: Option<Duration>,
        convert: impl FnMut(Queued<T>) -> U,
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
            // refill below sees every item that will ever arrive.
            let state = self.state.load(Ordering::Acquire);
            let closed = state & CLOSED != 0;
            self.refill(former);

            if former.staged.is_empty() {
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
                self.wait(&former.parker, deadline);
                continue;
            }

            let count = if self.policy.batching() {
                let (count, ready) = self.plan(&former.staged);
                if !(ready || closed) {
                    let oldest = former.staged[0].enqueued_at;
                    let batch_deadline = oldest.checked_add(self.policy.max_queue_delay);
                    if batch_deadline.is_none_or(|d| Instant::now() < d) {
                        if timeout.is_none() {
                            return PopResult::TimedOut;
                        }
                        self.wait(&former.parker, batch_deadline);
                        continue;
                    }
                }
                count
            } else {
                1
            };
            return PopResult::Batch(self.take(former, count, convert));
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

    /// Items queued and not yet handed out (a snapshot; it may be stale by the time it returns).
    pub fn len(&self) -> usize {
        self.items.len() + self.staged_len.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What an item counts for against the batch limit.
    fn weight(&self, queued: &Queued<T>) -> u64 {
        if self.policy.batching() {
            u64::from(queued.batch_size)
        } else {
            1
        }
    }

    /// Moves items from the lock-free queue into the staging deque until the staged weight
    /// reaches one batch's worth (so at most one staged item is beyond the batch limit).
    fn refill(&self, former: &mut Former<T>) {
        let limit = if self.policy.batching() {
            u64::from(self.policy.max_batch_size)
        } else {
            1
        };
        let before = former.staged.len();
        while former.staged_weight < limit {
            let Some(queued) = self.items.pop() else {
                break;
            };
            former.staged_weight += self.weight(&queued);
            former.staged.push_back(queued);
        }
        if former.staged.len() != before {
            self.staged_len
                .store(former.staged.len(), Ordering::Relaxed);
        }
    }

    /// How many staged items the next batch takes, and whether it may leave now (full, or a
    /// preferred size is reached).
    fn plan(&self, staged: &VecDeque<Queued<T>>) -> (usize, bool) {
        let max = u64::from(self.policy.max_batch_size);
        let mut sum = 0;
        let mut count = 0;
        let mut preferred_count = 0;
        for queued in staged {
            let next = sum + u64::from(queued.batch_size);
            if next > max {
                // The next item would split: the batch is as full as it gets.
                return (count, true);
            }
            sum = next;
            count += 1;
            if self.preferred.binary_search(&sum).is_ok() {
                preferred_count = count;
            }
        }
        if sum == max {
            (count, true)
        } else if preferred_count > 0 {
            (preferred_count, true)
        } else {
            (count, false)
        }
    }

    /// Hands out the first `count` staged items.
    fn take<U>(
        &self,
        former: &mut Former<T>,
        count: usize,
        mut convert: impl FnMut(Queued<T>) -> U,
    ) -> Vec<U> {
        let mut taken = 0;
        let batch = former
            .staged
            .drain(..count)
            .map(|queued| {
                taken += self.weight(&queued);
                convert(queued)
            })
            .collect();
        former.staged_weight -= taken;
        self.staged_len
            .store(former.staged.len(), Ordering::Relaxed);
        batch
    }

    /// Something a waiting consumer must look at: a new item, or the queue closing.
    fn has_news(&self) -> bool {
        !self.items.is_empty() || self.state.load(Ordering::Relaxed) & CLOSED != 0
    }

    /// Waits (spin briefly, then park) until there is news or `deadline` passes. May return
    /// early; callers loop.
    fn wait(&self, parker: &Parker, deadline: Option<Instant>) {
        for _ in 0..SPIN_CHECKS {
            if self.has_news() {
                return;
            }
            hint::spin_loop();
        }
        self.consumer_parked.store(true, Ordering::Relaxed);
        // Pairs with the fence in `push` (see there).
        fence(Ordering::SeqCst);
        if !self.has_news() {
            match deadline {
                Some(deadline) => parker.park_deadline(deadline),
                None => parker.park(),
            }
        }
        self.consumer_parked.store(false, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(max: u32, delay_us: u64, preferred: &[u32]) -> RequestQueue<u32> {
        RequestQueue::new(BatchPolicy {
            max_batch_size: max,
            max_queue_delay: Duration::from_micros(delay_us),
            preferred_batch_sizes: preferred.to_vec(),
        })
        .unwrap()
    }

    fn staged(sizes: &[u32]) -> VecDeque<Queued<u32>> {
        let now = Instant::now();
        sizes
            .iter()
            .map(|&batch_size| Queued {
                item: 0,
                batch_size,
                enqueued_at: now,
            })
            .collect()
    }

    #[test]
    fn plan_stops_before_an_item_that_would_split() {
        let q = queue(8, 0, &[]);
        assert_eq!(q.plan(&staged(&[3, 3, 3])), (2, true));
    }

    #[test]
    fn plan_full_at_exactly_max() {
        let q = queue(8, 0, &[]);
        assert_eq!(q.plan(&staged(&[4, 4])), (2, true));
    }

    #[test]
    fn plan_waits_when_short_of_max_and_preferred() {
        let q = queue(8, 0, &[6]);
        assert_eq!(q.plan(&staged(&[2, 2])), (2, false));
    }

    #[test]
    fn plan_takes_the_largest_reachable_preferred_size() {
        let q = queue(16, 0, &[2, 4]);
        // Prefix sums 1, 2, 4, 5: the longest prefix on a preferred size is 3 items (sum 4).
        assert_eq!(q.plan(&staged(&[1, 1, 2, 1])), (3, true));
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
        assert_eq!(bad(0, &[1]), crate::Code::InvalidArg);
        assert_eq!(bad(4, &[0]), crate::Code::InvalidArg);
        assert_eq!(bad(4, &[5]), crate::Code::InvalidArg);
    }

    #[test]
    fn len_counts_staged_and_queued_items() {
        let q = queue(4, 1_000_000, &[]);
        for i in 0..6 {
            q.push(i, 1).unwrap();
        }
        assert_eq!(q.len(), 6);
        // Batch of 4 leaves (full); 2 remain, one of them possibly staged.
        assert_eq!(
            q.pop_batch(Duration::ZERO),
            PopResult::Batch(vec![0, 1, 2, 3])
        );
        assert_eq!(q.len(), 2);
    }
}
