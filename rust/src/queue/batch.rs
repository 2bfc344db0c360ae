//! What a pop hands out: a batch, requests rejected by a queue timeout, or why there is
//! neither.

/// A batch handed out by [`RequestQueue::pop_batch`](super::RequestQueue::pop_batch).
#[derive(Debug, PartialEq, Eq)]
pub struct Batch<T> {
    /// One or more requests, in candidate order (priority, then arrival).
    pub items: Vec<T>,
    /// 0, 1, 2, ... in the order batches left the queue (for ordered completion).
    pub seq: u64,
}

/// What [`RequestQueue::pop_batch`](super::RequestQueue::pop_batch) found.
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
