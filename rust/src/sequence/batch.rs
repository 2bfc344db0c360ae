//! What [`SequenceBatcher::pop_batch`](super::SequenceBatcher::pop_batch) hands out.

use std::time::Instant;

use super::SequenceTicket;

/// A request handed out in a batch, with its sequence flags.
#[derive(Debug)]
pub struct Taken<T> {
    pub item: T,
    pub batch_size: u32,
    pub enqueued_at: Instant,
    pub start: bool,
    pub end: bool,
    /// Its ticket, for a canceller to find it while it runs.
    pub ticket: SequenceTicket,
}

/// One position of a batch.
#[derive(Debug)]
pub struct Entry<T> {
    /// The instance slot it belongs to.
    pub slot: usize,
    /// `None`: a null entry (direct strategy), the slot has no request in this batch.
    pub request: Option<Taken<T>>,
}

/// A batch for one instance.
#[derive(Debug)]
pub struct SlotBatch<T> {
    pub entries: Vec<Entry<T>>,
    /// 0, 1, 2, ... in the order this instance's batches left.
    pub seq: u64,
}

/// What [`SequenceBatcher::pop_batch`](super::SequenceBatcher::pop_batch) found.
#[derive(Debug)]
pub enum SequencePop<T> {
    Batch(SlotBatch<T>),
    /// Requests of cancelled sequences: answer each with a CANCELLED error.
    Cancelled(Vec<T>),
    /// Requests of backlog sequences whose timeout expired: answer each UNAVAILABLE.
    Expired(Vec<T>),
    TimedOut,
    /// Closed, and nothing is left for this instance.
    Closed,
}
