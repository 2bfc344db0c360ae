//! The consumer side: forming a batch and handing it out.
//!
//! One consumer at a time forms batches: the one that holds the *former* lock moves requests
//! from the lock-free queue into the staging area, applies queue timeouts, decides the batch,
//! and waits for more requests, the batch deadline or the next queue timeout. Other consumers
//! wait for the former lock (with their own timeout), so batches leave in order and every
//! request goes to exactly one consumer.

use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::MutexGuard;

use super::{Batch, CLOSED, Former, PUSHER, PopResult, Queued, RequestQueue, idle};
use crate::batcher::{Cursor, Plan, Staged};
use crate::stats::FailureReason;

/// Most requests one refill moves from the lock-free queue to the staging area. Priority order
/// holds among the requests staged; under a flood of more than this many pushes between two
/// batches, a later high-priority request may wait for the next refill.
const REFILL_LIMIT: usize = 4096;

/// How a pop goes on after one look at the queue.
enum Step<U> {
    /// It is over: this is what the pop hands back.
    Done(PopResult<U>),
    /// Nothing to take: it lets go of the former lock and waits idle (see [`super::idle`]).
    Idle,
}

impl<U> From<PopResult<U>> for Step<U> {
    fn from(result: PopResult<U>) -> Self {
        Step::Done(result)
    }
}

/// How the former proceeds with a plan.
enum Decision {
    Take(Cursor),
    /// Wait for more requests until this instant (`None`: the delay overflowed, no deadline).
    WaitUntil(Option<Instant>),
}

/// When a pop gives up waiting, worked out on first use: the clock is read only once a wait is
/// needed (reading it costs tens of ns on VMs).
#[derive(Default)]
struct LazyDeadline {
    worked_out: bool,
    /// `None`: the timeout overflows, no deadline.
    at: Option<Instant>,
}

impl LazyDeadline {
    /// `timeout` after the first call (later calls pass the same timeout).
    fn for_timeout(&mut self, timeout: Duration) -> Option<Instant> {
        if !self.worked_out {
            self.at = Instant::now().checked_add(timeout);
            self.worked_out = true;
        }
        self.at
    }
}

impl<T> Former<T> {
    /// The sequence number of the batch about to leave.
    fn take_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }
}

impl<T> RequestQueue<T> {
    /// Waits up to `timeout` for at least one request and returns a batch formed by the
    /// batching rules, or requests rejected by a queue timeout; `TimedOut` if nothing came;
    /// `Closed` once the queue is closed and drained. May return `TimedOut` early.
    pub fn pop_batch(&self, timeout: Duration) -> PopResult<T> {
        self.pop_with(
            Some(timeout),
            |queued| queued.item,
            Duration::ZERO,
            &mut |_, _| {},
        )
    }

    /// Like [`pop_batch`](Self::pop_batch), keeping each request's metadata.
    pub fn pop_batch_queued(&self, timeout: Duration) -> PopResult<Queued<T>> {
        self.pop_with(
            Some(timeout),
            |queued| queued,
            Duration::ZERO,
            &mut |_, _| {},
        )
    }

    /// Like [`pop_batch_queued`](Self::pop_batch_queued), telling `forming` (once per pop)
    /// when a staged batch waits out its delay, `ahead` before it leaves at the latest (or at
    /// once when less is left), that instant and how many requests are staged then: the
    /// consumer waiting for it is woken then to get ready for it.
    pub fn pop_batch_queued_noticing(
        &self,
        timeout: Duration,
        ahead: Duration,
        forming: &mut impl FnMut(Instant, usize),
    ) -> PopResult<Queued<T>> {
        self.pop_with(Some(timeout), |queued| queued, ahead, forming)
    }

    /// Never waits: the batch (or rejections) that may leave right now, else `TimedOut` (also
    /// when another consumer is forming a batch, or a partial batch is still within its delay);
    /// `Closed` once closed and drained.
    pub fn try_pop_batch(&self) -> PopResult<T> {
        self.pop_with(None, |queued| queued.item, Duration::ZERO, &mut |_, _| {})
    }

    /// Like [`try_pop_batch`](Self::try_pop_batch), keeping each request's metadata.
    pub fn try_pop_batch_queued(&self) -> PopResult<Queued<T>> {
        self.pop_with(None, |queued| queued, Duration::ZERO, &mut |_, _| {})
    }

    /// Forms a batch and hands it out, converting each request with `convert`. `timeout: None`
    /// means never wait. `forming`: see [`pop_batch_queued_noticing`](Self::pop_batch_queued_noticing).
    fn pop_with<U>(
        &self,
        timeout: Option<Duration>,
        mut convert: impl FnMut(Queued<T>) -> U,
        ahead: Duration,
        forming: &mut impl FnMut(Instant, usize),
    ) -> PopResult<U> {
        let mut deadline = LazyDeadline::default();
        let mut noticed = false;
        let mut idle_since: Option<Instant> = None;
        loop {
            let Some(mut former) = self.lock_former(timeout, &mut deadline) else {
                return PopResult::TimedOut;
            };
            if let Some(since) = idle_since.take() {
                former.spin.learn(since.elapsed());
            }
            let step = self.look(
                &mut former,
                timeout,
                &mut deadline,
                (ahead, &mut noticed, forming),
                &mut convert,
            );
            drop(former);
            match step {
                Step::Done(result) => {
                    match result {
                        PopResult::Batch(_) => idle::note_batch_taken(),
                        PopResult::Closed => return result,
                        PopResult::Rejected(_) | PopResult::TimedOut => {}
                    }
                    // (A pop that does not wait may leave requests staged, too.)
                    self.wake_for_leftovers();
                    return result;
                }
                Step::Idle => {
                    idle_since = Some(Instant::now());
                    // (Only a pop that may wait goes idle.)
                    self.wait_idle(timeout.and_then(|timeout| deadline.for_timeout(timeout)));
                }
            }
        }
    }

    /// Looks at the queue with the former lock held, as long as it has cause to: until a batch
    /// (or rejections, or the end) is there to hand back, or nothing is there to take.
    fn look<U>(
        &self,
        former: &mut Former<T>,
        timeout: Option<Duration>,
        deadline: &mut LazyDeadline,
        (ahead, noticed, forming): (Duration, &mut bool, &mut impl FnMut(Instant, usize)),
        convert: &mut impl FnMut(Queued<T>) -> U,
    ) -> Step<U> {
        loop {
            // Read the state before refilling: if it says "closed, no push in progress", the
            // refill below sees every request that will ever arrive.
            let state = self.state.load(Ordering::Acquire);
            if self.direct
                && let Some(batch) = self.pop_direct(former, convert)
            {
                return batch.into();
            }
            self.refill(former, REFILL_LIMIT);
            if self.timed
                && former.staged.has_expiries()
                && let Some(rejected) = self.reject_expired(former, convert)
            {
                return rejected.into();
            }
            let step = match former.staged.plan(&self.rules) {
                None => self.wait_for_requests(former, state, timeout, deadline),
                Some(plan) => match self.decide(&former.staged, &plan, state & CLOSED != 0) {
                    Decision::Take(end) => self.take_batch(former, end, convert),
                    Decision::WaitUntil(Some(until)) if !*noticed && timeout.is_some() => {
                        let notice_at = until.checked_sub(ahead).unwrap_or(until);
                        if Instant::now() >= notice_at {
                            *noticed = true;
                            forming(until, former.staged.len());
                            self.wait_for_batch(former, Some(until), timeout)
                        } else {
                            self.wait_for_batch(former, Some(notice_at), timeout)
                        }
                    }
                    Decision::WaitUntil(until) => self.wait_for_batch(former, until, timeout),
                }
                .map_break(Step::Done),
            };
            if let ControlFlow::Break(step) = step {
                return step;
            }
        }
    }

    /// Takes the former lock, waiting for it until the pop's deadline (not at all when
    /// `timeout` is `None`); `None` if it did not come in time.
    #[inline]
    fn lock_former(
        &self,
        timeout: Option<Duration>,
        deadline: &mut LazyDeadline,
    ) -> Option<MutexGuard<'_, Former<T>>> {
        self.former.try_lock().or_else(|| {
            let timeout = timeout?;
            match deadline.for_timeout(timeout) {
                Some(deadline) => self.former.try_lock_until(deadline),
                None => Some(self.former.lock()),
            }
        })
    }

    /// Unbatched, one level, no timeouts: the oldest live request is the batch, with no
    /// planning. `None` when there is none (the pop goes on as any other, to report `Closed`
    /// or wait).
    #[inline]
    fn pop_direct<U>(
        &self,
        former: &mut Former<T>,
        convert: &mut impl FnMut(Queued<T>) -> U,
    ) -> Option<PopResult<U>> {
        if former.staged.len() == 0 {
            self.refill(former, 1);
        }
        let first = former.staged.take_first();
        self.sync(former);
        let queued = first?;
        let seq = former.take_seq();
        self.release(queued.level);
        Some(PopResult::Batch(Batch {
            items: vec![convert(queued)],
            seq,
        }))
    }

    /// Hands back the staged requests whose queue timeout expired under REJECT, each counted
    /// as a rejection (DELAY moves the others behind their level's unexpired requests); `None`
    /// when none was rejected.
    fn reject_expired<U>(
        &self,
        former: &mut Former<T>,
        convert: &mut impl FnMut(Queued<T>) -> U,
    ) -> Option<PopResult<U>> {
        let now = Instant::now();
        let mut rejected = Vec::new();
        former.staged.expire(now, &mut rejected);
        if rejected.is_empty() {
            return None;
        }
        for queued in &rejected {
            self.release(queued.level);
            self.stats.record_failure(
                FailureReason::Rejected,
                now.saturating_duration_since(queued.enqueued_at),
            );
        }
        self.sync(former);
        Some(PopResult::Rejected(
            rejected.into_iter().map(convert).collect(),
        ))
    }

    /// Nothing to plan: `Closed` once closed and drained, `TimedOut` once the pop may wait no
    /// longer, else polls for requests (and the caller looks again), or, when none came in the
    /// spin window, `Idle`.
    fn wait_for_requests<U>(
        &self,
        former: &mut Former<T>,
        state: usize,
        timeout: Option<Duration>,
        deadline: &mut LazyDeadline,
    ) -> ControlFlow<Step<U>> {
        self.sync(former);
        if state & CLOSED != 0 {
            if state >= PUSHER {
                // A push that started before `close` is about to land.
                thread::yield_now();
                return ControlFlow::Continue(());
            }
            return ControlFlow::Break(PopResult::Closed.into());
        }
        let Some(timeout) = timeout else {
            return ControlFlow::Break(PopResult::TimedOut.into());
        };
        let deadline = deadline.for_timeout(timeout);
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return ControlFlow::Break(PopResult::TimedOut.into());
        }
        if self.poll_for_news(&mut former.spin, deadline) {
            ControlFlow::Continue(())
        } else {
            ControlFlow::Break(Step::Idle)
        }
    }

    /// A batch that may still grow: waits for more requests until it must leave (`until`) or
    /// the next queue timeout, and the caller looks again; a pop that never waits times out.
    fn wait_for_batch<U>(
        &self,
        former: &mut Former<T>,
        until: Option<Instant>,
        timeout: Option<Duration>,
    ) -> ControlFlow<PopResult<U>> {
        self.sync(former);
        if timeout.is_none() {
            return ControlFlow::Break(PopResult::TimedOut);
        }
        let wake = match (until, former.staged.next_expiry()) {
            (Some(until), Some(expiry)) => Some(until.min(expiry)),
            (until, expiry) => until.or(expiry),
        };
        self.wait(&mut former.spin, &former.parker, wake);
        ControlFlow::Continue(())
    }

    /// Takes the staged requests before `end` as the next batch; the caller looks again if
    /// they were all cancelled meanwhile.
    #[inline]
    fn take_batch<U>(
        &self,
        former: &mut Former<T>,
        end: Cursor,
        convert: &mut impl FnMut(Queued<T>) -> U,
    ) -> ControlFlow<PopResult<U>> {
        let mut items = Vec::with_capacity(end.count);
        former.staged.take(end, |queued| {
            self.release(queued.level);
            items.push(convert(queued));
        });
        self.sync(former);
        if items.is_empty() {
            // Everything planned was cancelled in the meantime.
            return ControlFlow::Continue(());
        }
        let seq = former.take_seq();
        ControlFlow::Break(PopResult::Batch(Batch { items, seq }))
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

    /// Moves up to `limit` requests from the lock-free queue into the staging area. (Bounded, so
    /// a steady stream of pushes cannot keep it busy; not by `items.len()`, which reads the
    /// producers' hot cache lines. The only caller of `SegQueue::pop`, which keeps it inlined:
    /// returning a `Queued` through memory from an out-of-line call costs a store-forwarding
    /// stall per request.)
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
}
