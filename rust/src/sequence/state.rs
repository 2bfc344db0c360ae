//! The batcher's state, behind its one mutex: the live sequences, the instances' slots and the
//! backlog, each sequence with its waiting requests.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Instant;

use super::CorrelationId;
use super::cancel::CANCELLED;

/// A request waiting in its sequence.
#[derive(Debug)]
pub(super) struct Waiting<T> {
    pub(super) item: T,
    pub(super) batch_size: u32,
    pub(super) enqueued_at: Instant,
    pub(super) start: bool,
    pub(super) end: bool,
    pub(super) ticket: Arc<AtomicU8>,
}

impl<T> Waiting<T> {
    pub(super) fn cancelled(&self) -> bool {
        self.ticket.load(Ordering::Acquire) == CANCELLED
    }
}

/// A sequence: its requests waiting to run and when its last one arrived.
#[derive(Debug)]
pub(super) struct Sequence<T> {
    pub(super) id: CorrelationId,
    pub(super) waiting: VecDeque<Waiting<T>>,
    pub(super) last_request: Instant,
    /// Its END request has arrived (the ID may already start a new sequence).
    pub(super) ending: bool,
    /// While in the backlog: when it is dropped (the earliest deadline of its requests that
    /// came with a timeout).
    pub(super) expires: Option<Instant>,
}

impl<T> Sequence<T> {
    pub(super) fn new(id: CorrelationId, now: Instant) -> Self {
        Self {
            id,
            waiting: VecDeque::new(),
            last_request: now,
            ending: false,
            expires: None,
        }
    }
}

/// Where a live sequence is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Place {
    Slot { instance: usize, slot: usize },
    Backlog,
}

/// Everything the batcher's mutex guards.
#[derive(Debug)]
pub(super) struct State<T> {
    /// Live sequences (not yet ended) by ID.
    pub(super) live: HashMap<CorrelationId, Place>,
    /// `slots[instance][slot]`: the sequence holding it.
    pub(super) slots: Vec<Vec<Option<Sequence<T>>>>,
    pub(super) backlog: VecDeque<Sequence<T>>,
    /// Requests of cancelled sequences, for the next `pop_batch`.
    pub(super) cancelled: Vec<T>,
    /// Requests of backlog sequences whose timeout expired, for the next `pop_batch`.
    pub(super) expired: Vec<T>,
    pub(super) next_seq: Vec<u64>,
    /// Requests waiting (not cancelled).
    pub(super) waiting: usize,
    pub(super) closed: bool,
    /// Set by `abandon`: no request is taken any more, of any sequence.
    pub(super) abandoned: bool,
}

impl<T> State<T> {
    pub(super) fn sequence_mut(&mut self, place: Place, id: &CorrelationId) -> &mut Sequence<T> {
        match place {
            Place::Slot { instance, slot } => self.slots[instance][slot]
                .as_mut()
                .expect("a live sequence's slot holds it"),
            // The newest backlog entry with this ID is the live one (older ones are ending).
            Place::Backlog => self
                .backlog
                .iter_mut()
                .rev()
                .find(|sequence| sequence.id == *id)
                .expect("a live backlog sequence is in the backlog"),
        }
    }

    pub(super) fn nothing_left_for(&self, instance: usize) -> bool {
        self.backlog.is_empty() && self.slots[instance].iter().all(Option::is_none)
    }
}
