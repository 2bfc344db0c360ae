//! Batch formation over the staged requests of a [`RequestQueue`](crate::RequestQueue).
//!
//! [`Staged`] holds the requests a consumer has taken off the lock-free inbound queue, one
//! [`Level`] per priority level (highest priority first). Each level has two lanes: `main`, in
//! arrival order, and `delayed`, for requests whose queue timeout expired under the DELAY
//! action; a level's candidates are its `main` lane, then its `delayed` lane. Everything here is
//! single-threaded: it belongs to whichever consumer holds the queue's former lock. The only
//! concurrent input is a request's [ticket](crate::Ticket) state, which a canceller may flip at
//! any time; every hand-out claims the ticket first, so a cancelled request is never handed out.
//!
//! # Batching rules (Triton's dynamic batcher)
//!
//! Candidates are considered in order (priority level, then lane, then arrival). A batch is the
//! longest run of candidates from the first one such that
//! * every candidate has the first one's shape key (requests with other non-batch dimensions
//!   cannot share an execution; the run stops at the first mismatch and leaves at once), and
//! * the sum of their batch sizes stays within `max_batch_size` (a request is never split).
//!
//! Within that run, the *best* cut is the longest prefix whose size is a preferred batch size,
//! or, when the next candidate would take the batch past the largest preferred size before any
//! preferred size was reached, everything before that candidate. Then:
//! * a best cut leaves at once, unless the batch has already waited `max_queue_delay` (counted
//!   from its oldest request), in which case the whole run leaves;
//! * otherwise the run leaves when it is full (the next candidate does not fit or has another
//!   shape, or the size reached the largest preferred size), when `max_queue_delay` has passed,
//!   when the delay is zero, or when the queue is closed; else it waits.
//!
//! With batching off every batch is the first candidate alone.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};
use std::time::{Duration, Instant};

use crate::queue::{Queued, TimeoutAction};

const MAIN: usize = 0;
const DELAYED: usize = 1;

/// The batching parameters [`Staged::plan`] applies, derived from a
/// [`BatchPolicy`](crate::BatchPolicy).
#[derive(Debug, Clone)]
pub(crate) struct Rules {
    pub(crate) batching: bool,
    pub(crate) max_batch_size: u64,
    /// Sorted, deduplicated.
    pub(crate) preferred: Vec<u64>,
    /// The largest preferred size, or `max_batch_size` when none is given.
    pub(crate) max_preferred: u64,
    pub(crate) max_queue_delay: Duration,
}

/// A position in candidate order: everything before it (exclusive end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cursor {
    level: usize,
    lane: usize,
    index: usize,
    /// Live requests before it when it was planned (a capacity hint for `take`).
    pub(crate) count: usize,
}

/// What the next batch would be, if it left now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    /// End of the whole run of candidates that fit together.
    pub(crate) all: Cursor,
    /// End of the best (preferred-size) prefix, if there is one.
    pub(crate) best: Option<Cursor>,
    /// The run cannot grow: the next candidate does not fit or has another shape, or the size
    /// reached the largest preferred size (always true with batching off).
    pub(crate) full: bool,
}

/// The requests of one priority level.
#[derive(Debug)]
struct Level<T> {
    /// `[main, delayed]`. `None` marks a request that left from the middle of a lane (a timeout,
    /// a purged cancellation); fronts are trimmed.
    lanes: [VecDeque<Option<Queued<T>>>; 2],
    /// Absolute position of `lanes[MAIN][0]`: positions stay valid while the front is popped.
    base: u64,
    action: TimeoutAction,
}

impl<T> Level<T> {
    fn trim(&mut self) {
        while matches!(self.lanes[MAIN].front(), Some(None)) {
            self.lanes[MAIN].pop_front();
            self.base += 1;
        }
        while matches!(self.lanes[DELAYED].front(), Some(None)) {
            self.lanes[DELAYED].pop_front();
        }
    }
}

/// Staged requests, by priority level. See the module docs.
#[derive(Debug)]
pub(crate) struct Staged<T> {
    levels: Vec<Level<T>>,
    /// `(deadline, level, absolute position)` of staged requests with a queue timeout. Entries
    /// whose request already left are skipped when they come up (so under steady load the heap
    /// holds about one timeout's worth of arrivals; it is cleared whenever nothing is staged).
    expiries: BinaryHeap<Reverse<(Instant, u32, u64)>>,
    /// Requests held (including cancelled ones not yet purged).
    len: usize,
    /// Cancelled requests dropped since the last [`take_swept`](Self::take_swept).
    swept: usize,
}

impl<T> Staged<T> {
    /// One level per entry of `actions` (each level's timeout action), highest priority first.
    pub(crate) fn new(actions: &[TimeoutAction]) -> Self {
        Self {
            levels: actions
                .iter()
                .map(|&action| Level {
                    lanes: [VecDeque::new(), VecDeque::new()],
                    base: 0,
                    action,
                })
                .collect(),
            expiries: BinaryHeap::new(),
            len: 0,
            swept: 0,
        }
    }

    /// Requests held, cancelled ones not yet purged included.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// How many cancelled requests were dropped since the last call.
    pub(crate) fn take_swept(&mut self) -> usize {
        std::mem::take(&mut self.swept)
    }

    /// Adds a request at the back of its level's main lane.
    pub(crate) fn push(&mut self, queued: Queued<T>) {
        let level = &mut self.levels[queued.level as usize];
        if let Some(deadline) = queued.deadline() {
            let position = level.base + level.lanes[MAIN].len() as u64;
            self.expiries
                .push(Reverse((deadline, queued.level, position)));
        }
        level.lanes[MAIN].push_back(Some(queued));
        self.len += 1;
    }

    /// Whether any staged request has a queue timeout that may still fire.
    pub(crate) fn has_expiries(&self) -> bool {
        !self.expiries.is_empty()
    }

    /// The earliest queue timeout among staged requests (possibly of one that already left).
    pub(crate) fn next_expiry(&self) -> Option<Instant> {
        self.expiries
            .peek()
            .map(|Reverse((deadline, ..))| *deadline)
    }

    /// Applies every queue timeout that passed by `now`: under REJECT the request moves to
    /// `rejected` (if its ticket could be claimed for rejection), under DELAY it moves to the back
    /// of its level's delayed lane.
    pub(crate) fn expire(&mut self, now: Instant, rejected: &mut Vec<Queued<T>>) {
        while let Some(&Reverse((deadline, level_no, position))) = self.expiries.peek() {
            if deadline > now {
                break;
            }
            self.expiries.pop();
            let level = &mut self.levels[level_no as usize];
            let Some(index) = position
                .checked_sub(level.base)
                .and_then(|i| usize::try_from(i).ok())
            else {
                continue;
            };
            let Some(queued) = level.lanes[MAIN].get_mut(index).and_then(Option::take) else {
                continue;
            };
            match level.action {
                TimeoutAction::Delay => level.lanes[DELAYED].push_back(Some(queued)),
                TimeoutAction::Reject => {
                    self.len -= 1;
                    if queued.claim_for_rejection() {
                        rejected.push(queued);
                    } else {
                        self.swept += 1;
                    }
                }
            }
            level.trim();
        }
        self.reset_if_empty();
    }

    /// The next batch under `rules` (see the module docs), or `None` when nothing live is
    /// staged. Cancelled requests met on the way are dropped.
    pub(crate) fn plan(&mut self, rules: &Rules) -> Option<Plan> {
        let mut sum = 0u64;
        let mut count = 0;
        let mut shape = None;
        let mut all = None;
        let mut best = None;
        let mut full = false;
        'scan: for (level_no, level) in self.levels.iter_mut().enumerate() {
            for (lane_no, lane) in level.lanes.iter_mut().enumerate() {
                for (index, slot) in lane.iter_mut().enumerate() {
                    let Some(queued) = slot else { continue };
                    if queued.is_cancelled() {
                        *slot = None;
                        self.len -= 1;
                        self.swept += 1;
                        continue;
                    }
                    let after = Cursor {
                        level: level_no,
                        lane: lane_no,
                        index: index + 1,
                        count: count + 1,
                    };
                    if !rules.batching {
                        all = Some(after);
                        full = true;
                        break 'scan;
                    }
                    let size = u64::from(queued.batch_size);
                    match shape {
                        None => shape = Some(queued.shape_key),
                        Some(key) => {
                            if sum + size > rules.max_preferred && best.is_none() {
                                best = all;
                            }
                            if sum + size > rules.max_batch_size || key != queued.shape_key {
                                full = true;
                                break 'scan;
                            }
                        }
                    }
                    sum += size;
                    count += 1;
                    all = Some(after);
                    if rules.preferred.binary_search(&sum).is_ok() {
                        best = all;
                    }
                }
            }
        }
        let all = all?;
        if sum >= rules.max_preferred {
            full = true;
        }
        Some(Plan { all, best, full })
    }

    /// The enqueue time of the oldest live request before `end` (the batch's age is counted
    /// from it); `None` if there is none.
    pub(crate) fn oldest(&self, end: Cursor) -> Option<Instant> {
        let mut oldest: Option<Instant> = None;
        for (level_no, level) in self.levels.iter().enumerate().take(end.level + 1) {
            for lane_no in [MAIN, DELAYED] {
                let stop = match (level_no, lane_no).cmp(&(end.level, end.lane)) {
                    Ordering::Less => level.lanes[lane_no].len(),
                    Ordering::Equal => end.index,
                    Ordering::Greater => break,
                };
                for queued in level.lanes[lane_no].range(..stop).flatten() {
                    oldest = Some(oldest.map_or(queued.enqueued_at, |o| o.min(queued.enqueued_at)));
                }
            }
        }
        oldest
    }

    /// Hands every live request before `end` to `out` (in candidate order), claiming each one's
    /// ticket; requests cancelled meanwhile are dropped instead.
    pub(crate) fn take(&mut self, end: Cursor, mut out: impl FnMut(Queued<T>)) {
        for (level_no, level) in self.levels.iter_mut().enumerate().take(end.level + 1) {
            for lane_no in [MAIN, DELAYED] {
                let stop = match (level_no, lane_no).cmp(&(end.level, end.lane)) {
                    Ordering::Less => level.lanes[lane_no].len(),
                    Ordering::Equal => end.index,
                    Ordering::Greater => break,
                };
                // `pop_front` in a loop: cheaper than `drain` for the few requests of a batch.
                for _ in 0..stop {
                    let Some(Some(queued)) = level.lanes[lane_no].pop_front() else {
                        continue;
                    };
                    self.len -= 1;
                    if queued.claim() {
                        out(queued);
                    } else {
                        self.swept += 1;
                    }
                }
                if lane_no == MAIN {
                    level.base += stop as u64;
                }
            }
            level.trim();
        }
        self.reset_if_empty();
    }

    /// Hands out the first live request in candidate order (claiming its ticket), dropping
    /// cancelled ones on the way; for unbatched queues, where that is the whole plan.
    pub(crate) fn take_first(&mut self) -> Option<Queued<T>> {
        for level in &mut self.levels {
            for lane_no in [MAIN, DELAYED] {
                while let Some(slot) = level.lanes[lane_no].pop_front() {
                    if lane_no == MAIN {
                        level.base += 1;
                    }
                    let Some(queued) = slot else { continue };
                    self.len -= 1;
                    if queued.claim() {
                        return Some(queued);
                    }
                    self.swept += 1;
                }
            }
        }
        None
    }

    /// With nothing staged, forgets tombstones and pending expiries.
    fn reset_if_empty(&mut self) {
        if self.len > 0 {
            return;
        }
        for level in &mut self.levels {
            if !level.lanes[MAIN].is_empty() {
                level.base += level.lanes[MAIN].len() as u64;
                level.lanes[MAIN].clear();
            }
            if !level.lanes[DELAYED].is_empty() {
                level.lanes[DELAYED].clear();
            }
        }
        if !self.expiries.is_empty() {
            self.expiries.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No queue timeout.
    const NONE: Duration = Duration::ZERO;

    fn rules(max: u64, preferred: &[u64], delay: Duration) -> Rules {
        let mut preferred = preferred.to_vec();
        preferred.sort_unstable();
        Rules {
            batching: max > 0,
            max_batch_size: max,
            max_preferred: preferred.last().copied().unwrap_or(max),
            preferred,
            max_queue_delay: delay,
        }
    }

    fn staged(levels: usize, entries: &[(u32, u32, u64)]) -> Staged<usize> {
        let mut staged = Staged::new(&vec![TimeoutAction::Reject; levels]);
        let now = Instant::now();
        for (item, &(batch_size, level, shape_key)) in entries.iter().enumerate() {
            staged.push(Queued::for_test(
                item, batch_size, level, shape_key, now, NONE,
            ));
        }
        staged
    }

    fn plan_and_take(staged: &mut Staged<usize>, rules: &Rules, use_best: bool) -> Vec<usize> {
        let plan = staged.plan(rules).unwrap();
        let end = if use_best {
            plan.best.unwrap_or(plan.all)
        } else {
            plan.all
        };
        let mut out = Vec::new();
        staged.take(end, |q| out.push(q.item));
        out
    }

    #[test]
    fn stops_before_a_request_that_would_split() {
        let mut s = staged(1, &[(3, 0, 0), (3, 0, 0), (3, 0, 0)]);
        let plan = s.plan(&rules(8, &[], Duration::ZERO)).unwrap();
        assert!(plan.full);
        assert_eq!(
            plan_and_take(&mut s, &rules(8, &[], Duration::ZERO), true),
            [0, 1]
        );
    }

    #[test]
    fn full_at_exactly_max() {
        let mut s = staged(1, &[(4, 0, 0), (4, 0, 0)]);
        let plan = s.plan(&rules(8, &[], Duration::ZERO)).unwrap();
        assert!(plan.full);
        assert_eq!(plan.best, None);
    }

    #[test]
    fn waits_when_short_of_max_and_preferred() {
        let mut s = staged(1, &[(2, 0, 0), (2, 0, 0)]);
        let plan = s.plan(&rules(8, &[6], Duration::ZERO)).unwrap();
        assert!(!plan.full);
        assert_eq!(plan.best, None);
    }

    #[test]
    fn best_is_the_largest_reachable_preferred_size() {
        let mut s = staged(1, &[(1, 0, 0), (1, 0, 0), (2, 0, 0), (1, 0, 0)]);
        // Prefix sums 1, 2, 4, 5: the best cut ends after 3 requests (sum 4).
        assert_eq!(
            plan_and_take(&mut s, &rules(16, &[2, 4], Duration::ZERO), true),
            [0, 1, 2]
        );
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn a_preferred_size_caps_the_batch_until_the_delay_passes() {
        // Preferred 4 of max 8: with 8 waiting, the best cut is 4; the whole run is 8.
        let mut s = staged(1, &[(1, 0, 0); 8]);
        let plan = s.plan(&rules(8, &[4], Duration::ZERO)).unwrap();
        let mut out = Vec::new();
        s.take(plan.best.unwrap(), |q| out.push(q.item));
        assert_eq!(out.len(), 4);
        let plan = s.plan(&rules(8, &[4], Duration::ZERO)).unwrap();
        s.take(plan.all, |q| out.push(q.item));
        assert_eq!(out.len(), 8);
    }

    #[test]
    fn passing_the_largest_preferred_size_cuts_before_it() {
        // Preferred [4, 8] of max 16: 3 + 3 = 6, then 9 would pass 8 with no preferred size
        // reached: the best cut is the 6.
        let mut s = staged(1, &[(3, 0, 0), (3, 0, 0), (3, 0, 0)]);
        let plan = s.plan(&rules(16, &[4, 8], Duration::ZERO)).unwrap();
        assert_eq!(plan.best.map(|c| c.index), Some(2));
        // The run (9) passed the largest preferred size: full, but the best cut wins.
        assert!(plan.full);
        assert_eq!(
            plan_and_take(&mut s, &rules(16, &[4, 8], Duration::ZERO), true),
            [0, 1]
        );
    }

    #[test]
    fn a_different_shape_ends_the_run_and_sends_it() {
        let mut s = staged(1, &[(1, 0, 7), (1, 0, 7), (1, 0, 9), (1, 0, 7)]);
        let r = rules(8, &[8], Duration::from_mins(1));
        let plan = s.plan(&r).unwrap();
        assert!(plan.full);
        assert_eq!(plan_and_take(&mut s, &r, false), [0, 1]);
        assert_eq!(plan_and_take(&mut s, &r, false), [2]);
        assert_eq!(plan_and_take(&mut s, &r, false), [3]);
        assert!(s.plan(&r).is_none());
    }

    #[test]
    fn higher_priority_levels_come_first_and_fifo_within_a_level() {
        let mut s = staged(3, &[(1, 2, 0), (1, 1, 0), (1, 0, 0), (1, 2, 0), (1, 0, 0)]);
        let r = rules(0, &[], Duration::ZERO);
        let order: Vec<_> = (0..5)
            .flat_map(|_| plan_and_take(&mut s, &r, false))
            .collect();
        assert_eq!(order, [2, 4, 1, 0, 3]);
    }

    #[test]
    fn batches_span_priority_levels() {
        let mut s = staged(2, &[(1, 1, 0), (1, 0, 0), (1, 1, 0)]);
        assert_eq!(
            plan_and_take(&mut s, &rules(4, &[3], Duration::ZERO), true),
            [1, 0, 2]
        );
    }

    #[test]
    fn reject_and_delay_on_expiry() {
        let now = Instant::now();
        let timeout = Duration::from_millis(10);
        let later = now + timeout;
        let mut s = Staged::new(&[TimeoutAction::Reject, TimeoutAction::Delay]);
        s.push(Queued::for_test(0, 1, 0, 0, now, timeout));
        s.push(Queued::for_test(1, 1, 0, 0, now, NONE));
        s.push(Queued::for_test(2, 1, 1, 0, now, timeout));
        s.push(Queued::for_test(3, 1, 1, 0, now, NONE));
        let mut rejected = Vec::new();
        s.expire(now, &mut rejected);
        assert!(rejected.is_empty());
        assert_eq!(s.next_expiry(), Some(later));
        s.expire(later, &mut rejected);
        assert_eq!(rejected.iter().map(|q| q.item).collect::<Vec<_>>(), [0]);
        assert!(!s.has_expiries());
        let r = rules(0, &[], Duration::ZERO);
        let order: Vec<_> = (0..3)
            .flat_map(|_| plan_and_take(&mut s, &r, false))
            .collect();
        // Level 1's expired request went behind level 1's others.
        assert_eq!(order, [1, 3, 2]);
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn expiry_of_a_request_that_already_left_is_ignored() {
        let now = Instant::now();
        let mut s = Staged::new(&[TimeoutAction::Reject]);
        s.push(Queued::for_test(0, 1, 0, 0, now, Duration::from_nanos(1)));
        s.push(Queued::for_test(1, 1, 0, 0, now, NONE));
        let r = rules(0, &[], Duration::ZERO);
        assert_eq!(plan_and_take(&mut s, &r, false), [0]);
        let mut rejected = Vec::new();
        s.expire(now + Duration::from_secs(1), &mut rejected);
        assert!(rejected.is_empty());
        assert_eq!(plan_and_take(&mut s, &r, false), [1]);
    }
}
