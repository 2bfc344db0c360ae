//! The sequence batcher: requests of stateful models, pinned to the instance slot that holds
//! their sequence's state.
//!
//! A *sequence* is the run of requests that share a correlation ID, from the one flagged
//! `start` to the one flagged `end`. Each model instance has a fixed number of *slots*; a
//! sequence holds one slot from its start until its end (or until it sits idle for longer than
//! `max_sequence_idle`), and every request of it runs on that slot's instance, one at a time,
//! in arrival order. Sequences that start while every slot is held wait in a backlog, in
//! arrival order, and take slots as they free up.
//!
//! Each instance takes its batches with [`SequenceBatcher::pop_batch`], for its own slots only,
//! so no two requests of a sequence ever run at once, and a batch holds at most one request
//! per sequence. How a batch is formed depends on the [`Strategy`]:
//!
//! * **Direct** (Triton's default): an instance has `max(max_batch_size, 1)` slots and batch
//!   position *i* is slot *i*. A batch covers the slots from 0 to the highest slot with a
//!   waiting request; positions whose slot has nothing waiting are *null* entries (the server
//!   hands the model a request whose READY control is false). A batch leaves at once when at
//!   least `minimum_slot_utilization` of the slots have a request waiting (always, with the
//!   default 0), otherwise once its oldest request has waited `max_queue_delay`.
//! * **Oldest**: an instance has `max_candidate_sequences` slots (`max(max_batch_size, 1)` when
//!   that is 0); a batch takes the oldest waiting request of up to `max_batch_size` sequences,
//!   oldest first, with no null entries. It leaves when it is full or reaches the
//!   largest preferred batch size it can, otherwise once its oldest request has waited
//!   `max_queue_delay`.
//!
//! A new sequence takes the free slot with the lowest index, on the instance with the lowest
//! index among those with that slot free: sequences spread over the instances before they
//! share one instance's batches.
//!
//! A `start` for a live sequence is not an error (as in Triton): it joins the same slot,
//! behind the requests already waiting, and the model sees START again (and resets what it
//! keeps for the slot).
//!
//! Cancellation (as in Triton): a request cancelled while it waits never runs, and when it
//! reaches the head of its sequence the whole sequence is cancelled: the requests waiting
//! behind it come back from `pop_batch` as [`SequencePop::Cancelled`] (to be answered with a
//! CANCELLED error), the slot is freed and the ID needs a START again. A backlog sequence
//! holding a cancelled request is cancelled whole when its turn for a slot comes.
//!
//! Idle sequences: a sequence holding a slot, with no request waiting, whose last request
//! arrived (or was handed out, or which took its slot from the backlog) more than
//! `max_sequence_idle` ago is released. Backlog sequences are never released as idle. A later
//! request with a released sequence's ID is refused like any request of an unknown sequence.
//!
//! Timeouts (as in Triton): a request pushed with a timeout while its sequence waits in the
//! backlog gives that sequence a deadline (the earliest of its requests'); a backlog sequence
//! still there at its deadline is dropped whole, its requests come back from `pop_batch` as
//! [`SequencePop::Expired`] (to be answered UNAVAILABLE) and its ID needs a START again.
//! Requests of sequences that hold a slot have no timeout.
//!
//! Closing: new sequences are refused, requests of live sequences are still taken and handed
//! out, and `pop_batch` returns [`SequencePop::Closed`] to an instance once it holds no
//! sequence and the backlog is empty; sequences that never end are released by the idle rule.
//!
//! The batcher keeps its state behind one mutex: a sequence request's routing needs the
//! sequence table, and stateful models' request rates are set by their executions, not by
//! the queue.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::error::CoreError;
use crate::stats::{FailureReason, ModelStats};

/// Triton's default `max_sequence_idle_microseconds` (one second).
pub const DEFAULT_MAX_SEQUENCE_IDLE: Duration = Duration::from_secs(1);

/// A sequence's correlation ID: an unsigned integer or a string (0 and "" mean none).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CorrelationId {
    Number(u64),
    Text(String),
}

impl CorrelationId {
    /// Whether this is the "no sequence" ID (0 or the empty string).
    pub fn is_none(&self) -> bool {
        match self {
            CorrelationId::Number(id) => *id == 0,
            CorrelationId::Text(id) => id.is_empty(),
        }
    }
}

impl fmt::Display for CorrelationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CorrelationId::Number(id) => write!(f, "{id}"),
            CorrelationId::Text(id) => f.write_str(id),
        }
    }
}

/// How an instance's waiting requests become a batch (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub enum Strategy {
    Direct {
        max_queue_delay: Duration,
        /// 0.0 to 1.0: the share of slots with a waiting request that sends a batch at once.
        minimum_slot_utilization: f32,
    },
    Oldest {
        max_candidate_sequences: u32,
        preferred_batch_sizes: Vec<u32>,
        max_queue_delay: Duration,
    },
}

/// A sequence batcher's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceConfig {
    /// The model's name, for error messages.
    pub model: String,
    pub instances: usize,
    /// 0: the model does not batch (one request per execution).
    pub max_batch_size: u32,
    pub strategy: Strategy,
    pub max_sequence_idle: Duration,
    /// Keep recent durations for latency summaries.
    pub latency_summaries: bool,
}

impl SequenceConfig {
    /// How many slots each instance has.
    pub fn slots_per_instance(&self) -> usize {
        match &self.strategy {
            Strategy::Oldest {
                max_candidate_sequences,
                ..
            } if *max_candidate_sequences > 0 => *max_candidate_sequences as usize,
            // Direct, and oldest without a candidate count (Triton's fallback).
            _ => self.max_batch_size.max(1) as usize,
        }
    }

    fn validate(&self) -> Result<(), CoreError> {
        if self.instances == 0 {
            return Err(CoreError::invalid_arg(
                "a sequence batcher needs at least one instance",
            ));
        }
        match &self.strategy {
            Strategy::Direct {
                minimum_slot_utilization,
                ..
            } if !(0.0..=1.0).contains(minimum_slot_utilization) => {
                Err(CoreError::invalid_arg(format!(
                    "minimum_slot_utilization must be between 0 and 1, got {minimum_slot_utilization}"
                )))
            }
            Strategy::Oldest {
                preferred_batch_sizes,
                ..
            } if preferred_batch_sizes
                .iter()
                .any(|&size| size == 0 || size > self.max_batch_size.max(1)) =>
            {
                Err(CoreError::invalid_arg(format!(
                    "preferred batch sizes {preferred_batch_sizes:?} must be between 1 and \
                     max_batch_size ({})",
                    self.max_batch_size
                )))
            }
            _ => Ok(()),
        }
    }
}

const QUEUED: u8 = 0;
const TAKEN: u8 = 1;
const CANCELLED: u8 = 2;

/// The handle of a pushed request, for [`SequenceBatcher::cancel`].
#[derive(Debug, Clone)]
pub struct SequenceTicket {
    state: Arc<AtomicU8>,
    enqueued_at: Instant,
}

impl SequenceTicket {
    /// Whether the request was handed out to run.
    pub fn taken(&self) -> bool {
        self.state.load(Ordering::Acquire) == TAKEN
    }

    /// Whether it was cancelled before it ran.
    pub fn cancelled(&self) -> bool {
        self.state.load(Ordering::Acquire) == CANCELLED
    }
}

/// A request handed out in a batch, with its sequence flags.
#[derive(Debug)]
pub struct Taken<T> {
    pub item: T,
    pub batch_size: u32,
    pub enqueued_at: Instant,
    pub start: bool,
    pub end: bool,
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

/// What [`SequenceBatcher::pop_batch`] found.
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

#[derive(Debug)]
struct Waiting<T> {
    item: T,
    batch_size: u32,
    enqueued_at: Instant,
    start: bool,
    end: bool,
    ticket: Arc<AtomicU8>,
}

impl<T> Waiting<T> {
    fn cancelled(&self) -> bool {
        self.ticket.load(Ordering::Acquire) == CANCELLED
    }
}

/// A sequence: its requests waiting to run and when its last one arrived.
#[derive(Debug)]
struct Sequence<T> {
    id: CorrelationId,
    waiting: VecDeque<Waiting<T>>,
    last_request: Instant,
    /// Its END request has arrived (the ID may already start a new sequence).
    ending: bool,
    /// While in the backlog: when it is dropped (the earliest deadline of its requests that
    /// came with a timeout).
    expires: Option<Instant>,
}

impl<T> Sequence<T> {
    fn new(id: CorrelationId, now: Instant) -> Self {
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
enum Place {
    Slot { instance: usize, slot: usize },
    Backlog,
}

#[derive(Debug)]
struct State<T> {
    /// Live sequences (not yet ended) by ID.
    live: HashMap<CorrelationId, Place>,
    /// `slots[instance][slot]`: the sequence holding it.
    slots: Vec<Vec<Option<Sequence<T>>>>,
    backlog: VecDeque<Sequence<T>>,
    /// Requests of cancelled sequences, for the next `pop_batch`.
    cancelled: Vec<T>,
    /// Requests of backlog sequences whose timeout expired, for the next `pop_batch`.
    expired: Vec<T>,
    next_seq: Vec<u64>,
    /// Requests waiting (not cancelled).
    waiting: usize,
    closed: bool,
    /// Set by `abandon`: no request is taken any more, of any sequence.
    abandoned: bool,
}

impl<T> State<T> {
    /// Places a new sequence in the best free slot, or at the end of the backlog.
    fn place_new(&mut self, id: CorrelationId, now: Instant) -> Place {
        let place = if let Some((instance, slot)) = self.free_slot() {
            self.slots[instance][slot] = Some(Sequence::new(id.clone(), now));
            Place::Slot { instance, slot }
        } else {
            self.backlog.push_back(Sequence::new(id.clone(), now));
            Place::Backlog
        };
        self.live.insert(id, place);
        place
    }

    fn sequence_mut(&mut self, place: Place, id: &CorrelationId) -> &mut Sequence<T> {
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

    /// The free slot a new sequence takes: the lowest slot index, then the lowest instance.
    fn free_slot(&self) -> Option<(usize, usize)> {
        let slots = self.slots.first().map_or(0, Vec::len);
        (0..slots).find_map(|slot| {
            (0..self.slots.len())
                .find(|&instance| self.slots[instance][slot].is_none())
                .map(|instance| (instance, slot))
        })
    }

    fn nothing_left_for(&self, instance: usize) -> bool {
        self.backlog.is_empty() && self.slots[instance].iter().all(Option::is_none)
    }
}

/// The sequence batcher (see the module docs).
pub struct SequenceBatcher<T> {
    state: Mutex<State<T>>,
    /// One per instance: woken when its slots get work.
    ready: Vec<Condvar>,
    config: SequenceConfig,
    stats: Arc<ModelStats>,
}

impl<T> fmt::Debug for SequenceBatcher<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SequenceBatcher")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<T> SequenceBatcher<T> {
    pub fn new(config: SequenceConfig) -> Result<Self, CoreError> {
        config.validate()?;
        let slots = config.slots_per_instance();
        let stats = if config.latency_summaries {
            ModelStats::with_latency_summaries(config.max_batch_size)
        } else {
            ModelStats::new(config.max_batch_size)
        };
        Ok(Self {
            state: Mutex::new(State {
                live: HashMap::new(),
                slots: (0..config.instances)
                    .map(|_| (0..slots).map(|_| None).collect())
                    .collect(),
                backlog: VecDeque::new(),
                cancelled: Vec::new(),
                expired: Vec::new(),
                next_seq: vec![0; config.instances],
                waiting: 0,
                closed: false,
                abandoned: false,
            }),
            ready: (0..config.instances).map(|_| Condvar::new()).collect(),
            config,
            stats: Arc::new(stats),
        })
    }

    pub fn config(&self) -> &SequenceConfig {
        &self.config
    }

    pub fn stats(&self) -> &Arc<ModelStats> {
        &self.stats
    }

    /// Requests waiting to run.
    pub fn len(&self) -> usize {
        self.state.lock().waiting
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sequences holding a slot or waiting for one.
    pub fn live_sequences(&self) -> usize {
        self.state.lock().live.len()
    }

    /// Queues a request of sequence `id`. Fails with `InvalidArg` for a batch size other than 1
    /// (sequence batching takes one request per sequence), the "no sequence" ID, and a request
    /// without `start` whose sequence is not live; with `Unavailable` for a `start` once
    /// closed.
    pub fn push(
        &self,
        id: &CorrelationId,
        start: bool,
        end: bool,
        item: T,
        batch_size: u32,
    ) -> Result<SequenceTicket, CoreError> {
        self.push_timed(id, start, end, item, batch_size, None)
    }

    /// [`push`](Self::push) with the request's timeout: if its sequence is (or goes) to the
    /// backlog, the sequence is dropped when the timeout passes before it gets a slot.
    pub fn push_timed(
        &self,
        id: &CorrelationId,
        start: bool,
        end: bool,
        item: T,
        batch_size: u32,
        timeout: Option<Duration>,
    ) -> Result<SequenceTicket, CoreError> {
        if batch_size > 1 {
            return Err(CoreError::invalid_arg(format!(
                "inference request to model '{}' must specify batch-size 1 due to \
                 requirements of sequence batcher",
                self.config.model
            )));
        }
        if id.is_none() {
            return Err(CoreError::invalid_arg(format!(
                "inference request to model '{}' must specify a non-zero or non-empty \
                 correlation ID",
                self.config.model
            )));
        }
        let now = Instant::now();
        let mut state = self.state.lock();
        if state.closed && (start || state.abandoned) {
            return Err(CoreError::unavailable("the request queue is closed"));
        }
        self.release_idle(&mut state, now);
        let place = match state.live.get(id).copied() {
            Some(place) => place,
            None if start => state.place_new(id.clone(), now),
            None => {
                return Err(CoreError::invalid_arg(format!(
                    "inference request for sequence {id} to model '{}' must specify the \
                     START flag on the first request of the sequence",
                    self.config.model
                )));
            }
        };
        let ticket = Arc::new(AtomicU8::new(QUEUED));
        let sequence = state.sequence_mut(place, id);
        if place == Place::Backlog
            && let Some(deadline) = timeout.and_then(|timeout| now.checked_add(timeout))
        {
            sequence.expires = Some(sequence.expires.map_or(deadline, |d| d.min(deadline)));
        }
        sequence.waiting.push_back(Waiting {
            item,
            batch_size,
            enqueued_at: now,
            start,
            end,
            ticket: Arc::clone(&ticket),
        });
        sequence.last_request = now;
        if end {
            sequence.ending = true;
            state.live.remove(id);
        }
        state.waiting += 1;
        drop(state);
        if let Place::Slot { instance, .. } = place {
            self.ready[instance].notify_one();
        }
        Ok(SequenceTicket {
            state: ticket,
            enqueued_at: now,
        })
    }

    /// Removes a waiting request before it runs. Returns `true` if it was still waiting (it
    /// counts as a CANCELED failure), `false` if it already ran or was cancelled.
    pub fn cancel(&self, ticket: &SequenceTicket) -> bool {
        if ticket
            .state
            .compare_exchange(QUEUED, CANCELLED, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        self.state.lock().waiting -= 1;
        self.stats
            .record_failure(FailureReason::Canceled, ticket.enqueued_at.elapsed());
        // Its instance re-plans without it (a cancelled END frees the slot).
        for ready in &self.ready {
            ready.notify_all();
        }
        true
    }

    /// Ends the live sequence `id` without a request of its own (an iterative sequence whose
    /// request the backend did not reschedule): it takes no more requests and leaves its slot
    /// once none of its requests waits. Nothing happens to an unknown or ended sequence.
    pub fn end(&self, id: &CorrelationId) {
        let mut state = self.state.lock();
        if let Some(place) = state.live.remove(id) {
            state.sequence_mut(place, id).ending = true;
        }
        drop(state);
        for ready in &self.ready {
            ready.notify_all();
        }
    }

    /// Closes the batcher (see the module docs).
    pub fn close(&self) {
        self.state.lock().closed = true;
        for ready in &self.ready {
            ready.notify_all();
        }
    }

    pub fn is_closed(&self) -> bool {
        self.state.lock().closed
    }

    /// Closes the batcher for good and takes back every request still waiting (in a slot, in
    /// the backlog, or of a cancelled or expired sequence not yet handed out), for the caller
    /// to answer: what a model being unloaded does with what it can no longer run. Every
    /// sequence ends; later pushes fail with `Unavailable`, even for sequences that were live,
    /// and `pop_batch` returns `Closed`.
    pub fn abandon(&self) -> Vec<T> {
        let mut state = self.state.lock();
        state.closed = true;
        state.abandoned = true;
        state.live.clear();
        let now = Instant::now();
        let mut left = std::mem::take(&mut state.cancelled);
        left.append(&mut state.expired);
        let mut sequences: Vec<Sequence<T>> = state.backlog.drain(..).collect();
        for slots in &mut state.slots {
            sequences.extend(slots.iter_mut().filter_map(Option::take));
        }
        for mut sequence in sequences {
            let dropped = self.drop_waiting(&mut state, &mut sequence, FailureReason::Other, now);
            left.extend(dropped);
        }
        drop(state);
        for ready in &self.ready {
            ready.notify_all();
        }
        left
    }

    /// Waits up to `timeout` for a batch for `instance` and returns it, `TimedOut` if nothing
    /// came in time, or `Closed` once closed with nothing left for this instance.
    ///
    /// # Panics
    /// If `instance` is not below the configured number of instances.
    pub fn pop_batch(&self, instance: usize, timeout: Duration) -> SequencePop<T> {
        assert!(instance < self.config.instances, "no instance {instance}");
        let give_up = Instant::now().checked_add(timeout);
        let mut state = self.state.lock();
        loop {
            let now = Instant::now();
            self.release_idle(&mut state, now);
            if !state.cancelled.is_empty() {
                return SequencePop::Cancelled(std::mem::take(&mut state.cancelled));
            }
            if !state.expired.is_empty() {
                return SequencePop::Expired(std::mem::take(&mut state.expired));
            }
            let mut wake = self.next_idle_deadline(&state);
            match self.plan(&mut state, instance, now) {
                Plan::Send(positions) => {
                    return SequencePop::Batch(self.take(&mut state, instance, &positions));
                }
                Plan::WaitUntil(deadline) => wake = earliest(wake, Some(deadline)),
                Plan::Nothing => {
                    if state.closed && state.nothing_left_for(instance) {
                        return SequencePop::Closed;
                    }
                }
            }
            let wake = earliest(wake, give_up);
            if give_up.is_some_and(|limit| now >= limit) {
                return SequencePop::TimedOut;
            }
            match wake {
                Some(wake) => {
                    self.ready[instance].wait_until(&mut state, wake);
                }
                None => self.ready[instance].wait(&mut state),
            }
        }
    }

    // -- placing sequences ---------------------------------------------------------------------

    /// Frees a slot and gives it to the oldest backlog sequence (cancelling, in turn, backlog
    /// sequences that hold a cancelled request).
    fn free_slot(&self, state: &mut State<T>, instance: usize, slot: usize) {
        if let Some(sequence) = state.slots[instance][slot].take()
            && !sequence.ending
        {
            state.live.remove(&sequence.id);
        }
        while let Some(mut next) = state.backlog.pop_front() {
            if next.waiting.iter().any(Waiting::cancelled) {
                self.cancel_sequence(state, next);
                continue;
            }
            next.last_request = Instant::now();
            next.expires = None; // requests holding a slot have no timeout
            if !next.ending {
                state
                    .live
                    .insert(next.id.clone(), Place::Slot { instance, slot });
            }
            state.slots[instance][slot] = Some(next);
            self.ready[instance].notify_one();
            break;
        }
    }

    /// A sequence (out of its slot or the backlog) is cancelled: its waiting requests go to
    /// the cancelled list and its ID is no longer live.
    fn cancel_sequence(&self, state: &mut State<T>, mut sequence: Sequence<T>) {
        if !sequence.ending {
            state.live.remove(&sequence.id);
        }
        let dropped = self.drop_waiting(
            state,
            &mut sequence,
            FailureReason::Canceled,
            Instant::now(),
        );
        state.cancelled.extend(dropped);
        for ready in &self.ready {
            ready.notify_one();
        }
    }

    /// Takes a dropped sequence's waiting requests (those not cancelled one by one already),
    /// each counted as a failure for `reason`, to be answered.
    fn drop_waiting(
        &self,
        state: &mut State<T>,
        sequence: &mut Sequence<T>,
        reason: FailureReason,
        now: Instant,
    ) -> Vec<T> {
        let mut dropped = Vec::new();
        for waiting in sequence.waiting.drain(..) {
            if waiting.ticket.swap(CANCELLED, Ordering::AcqRel) == QUEUED {
                state.waiting -= 1;
                self.stats
                    .record_failure(reason, now.saturating_duration_since(waiting.enqueued_at));
                dropped.push(waiting.item);
            }
        }
        dropped
    }

    /// If the next request of the sequence in `slot` was cancelled, cancels the sequence and
    /// frees the slot; true if it did.
    fn cancel_if_head_cancelled(&self, state: &mut State<T>, instance: usize, slot: usize) -> bool {
        let cancelled = state.slots[instance][slot]
            .as_ref()
            .is_some_and(|sequence| sequence.waiting.front().is_some_and(Waiting::cancelled));
        if cancelled {
            let sequence = state.slots[instance][slot].take().expect("checked above");
            self.cancel_sequence(state, sequence);
            self.free_slot(state, instance, slot); // hands the emptied slot to the backlog
        }
        cancelled
    }

    /// Drops the backlog sequences whose deadline has come: their requests go to the expired
    /// list and their IDs are no longer live.
    fn expire_backlog(&self, state: &mut State<T>, now: Instant) {
        if !state
            .backlog
            .iter()
            .any(|s| s.expires.is_some_and(|d| d <= now))
        {
            return;
        }
        let (expired, kept): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut state.backlog)
            .into_iter()
            .partition(|s| s.expires.is_some_and(|d| d <= now));
        state.backlog = kept;
        for mut sequence in expired {
            if !sequence.ending && state.live.get(&sequence.id) == Some(&Place::Backlog) {
                state.live.remove(&sequence.id);
            }
            let dropped = self.drop_waiting(state, &mut sequence, FailureReason::Rejected, now);
            state.expired.extend(dropped);
        }
        for ready in &self.ready {
            ready.notify_one();
        }
    }

    /// Releases sequences idle for longer than `max_sequence_idle` (and drops expired backlog
    /// sequences).
    fn release_idle(&self, state: &mut State<T>, now: Instant) {
        self.expire_backlog(state, now);
        let idle = self.config.max_sequence_idle;
        let expired =
            |sequence: &Sequence<T>| now.saturating_duration_since(sequence.last_request) > idle;
        for instance in 0..state.slots.len() {
            for slot in 0..state.slots[instance].len() {
                if self.cancel_if_head_cancelled(state, instance, slot) {
                    continue;
                }
                // A sequence with a request waiting is not idle.
                let release = state.slots[instance][slot]
                    .as_ref()
                    .is_some_and(|sequence| {
                        sequence.waiting.is_empty() && (sequence.ending || expired(sequence))
                    });
                if release {
                    self.free_slot(state, instance, slot);
                }
            }
        }
    }

    /// When the next sequence may become idle, if any could.
    fn next_idle_deadline(&self, state: &State<T>) -> Option<Instant> {
        let idle = self.config.max_sequence_idle;
        let held = state
            .slots
            .iter()
            .flatten()
            .flatten()
            .filter(|sequence| sequence.waiting.is_empty());
        let idle_deadline = held
            .filter_map(|sequence| sequence.last_request.checked_add(idle))
            .min()
            // Past the deadline, not at it: idleness is "longer than".
            .map(|deadline| deadline + Duration::from_micros(1));
        let expiry = state.backlog.iter().filter_map(|s| s.expires).min();
        earliest(idle_deadline, expiry)
    }

    // -- forming batches -----------------------------------------------------------------------

    /// What `instance` should do now.
    fn plan(&self, state: &mut State<T>, instance: usize, now: Instant) -> Plan {
        // (slot, batch size, enqueued at) of each slot's head request.
        let mut heads: Vec<(usize, u32, Instant)> = Vec::new();
        for slot in 0..state.slots[instance].len() {
            if self.cancel_if_head_cancelled(state, instance, slot) {
                continue;
            }
            let Some(sequence) = &state.slots[instance][slot] else {
                continue;
            };
            match sequence.waiting.front() {
                Some(head) => heads.push((slot, head.batch_size, head.enqueued_at)),
                None if sequence.ending => self.free_slot(state, instance, slot),
                None => {}
            }
        }
        let Some(oldest) = heads.iter().map(|head| head.2).min() else {
            return Plan::Nothing;
        };
        let send_at = |delay: Duration| oldest.checked_add(delay).unwrap_or(now);
        match &self.config.strategy {
            Strategy::Direct {
                max_queue_delay,
                minimum_slot_utilization,
            } => {
                let slots = state.slots[instance].len();
                #[allow(clippy::cast_precision_loss)] // slot counts are small
                let utilization = heads.len() as f32 / slots as f32;
                let deadline = send_at(*max_queue_delay);
                if max_queue_delay.is_zero()
                    || utilization >= *minimum_slot_utilization
                    || now >= deadline
                {
                    Plan::Send(heads.iter().map(|head| head.0).collect())
                } else {
                    Plan::WaitUntil(deadline)
                }
            }
            Strategy::Oldest {
                preferred_batch_sizes,
                max_queue_delay,
                ..
            } => {
                heads.sort_by_key(|head| head.2);
                let limit = self.config.max_batch_size.max(1);
                let mut chosen = Vec::new();
                let mut size = 0;
                let mut preferred_at = None;
                for &(slot, batch_size, _) in &heads {
                    if size + batch_size > limit {
                        break;
                    }
                    size += batch_size;
                    chosen.push(slot);
                    if preferred_batch_sizes.contains(&size) {
                        preferred_at = Some(chosen.len());
                    }
                }
                if chosen.is_empty() {
                    // A request larger than the batch limit cannot be pushed; be safe anyway.
                    chosen.push(heads[0].0);
                }
                let full = size >= limit || chosen.len() < heads.len();
                let deadline = send_at(*max_queue_delay);
                if full || max_queue_delay.is_zero() || now >= deadline {
                    Plan::Send(chosen)
                } else if let Some(count) = preferred_at.filter(|_| {
                    // Preferred sizes only send early when the batch cannot grow past them.
                    preferred_batch_sizes.iter().all(|&p| p <= size)
                }) {
                    chosen.truncate(count);
                    Plan::Send(chosen)
                } else {
                    Plan::WaitUntil(deadline)
                }
            }
        }
    }

    /// Takes the head request of each slot in `slots` (ascending for direct, oldest first for
    /// oldest) into a batch.
    fn take(&self, state: &mut State<T>, instance: usize, slots: &[usize]) -> SlotBatch<T> {
        let direct = matches!(self.config.strategy, Strategy::Direct { .. });
        let mut entries: Vec<Entry<T>> = Vec::with_capacity(slots.len());
        let mut ended = Vec::new();
        let mut lost = Vec::new();
        for &slot in slots {
            if direct {
                // Null entries for the slots before this one that have nothing waiting.
                while entries.len() < slot {
                    entries.push(Entry {
                        slot: entries.len(),
                        request: None,
                    });
                }
            }
            let sequence = state.slots[instance][slot]
                .as_mut()
                .expect("a planned slot holds a sequence");
            let waiting = sequence
                .waiting
                .pop_front()
                .expect("a planned slot has a request waiting");
            // The plan saw it uncancelled; a cancel since then loses the race to this claim
            // only if it has not flipped the ticket yet.
            let claimed = waiting
                .ticket
                .compare_exchange(QUEUED, TAKEN, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
            sequence.last_request = Instant::now();
            if claimed {
                if waiting.end {
                    ended.push(slot);
                }
                state.waiting -= 1;
                entries.push(Entry {
                    slot,
                    request: Some(Taken {
                        item: waiting.item,
                        batch_size: waiting.batch_size,
                        enqueued_at: waiting.enqueued_at,
                        start: waiting.start,
                        end: waiting.end,
                    }),
                });
            } else {
                // Cancelled since the plan: the rest of its sequence is cancelled too.
                lost.push(slot);
                if direct {
                    entries.push(Entry {
                        slot,
                        request: None,
                    });
                }
            }
        }
        for slot in lost {
            if let Some(sequence) = state.slots[instance][slot].take() {
                self.cancel_sequence(state, sequence);
            }
            self.free_slot(state, instance, slot);
        }
        for slot in ended {
            self.free_slot(state, instance, slot);
        }
        let seq = state.next_seq[instance];
        state.next_seq[instance] += 1;
        // Trailing null entries (a request cancelled after planning) carry nothing.
        while entries.last().is_some_and(|entry| entry.request.is_none()) {
            entries.pop();
        }
        SlotBatch { entries, seq }
    }
}

enum Plan {
    /// Send a batch of these slots' head requests.
    Send(Vec<usize>),
    WaitUntil(Instant),
    Nothing,
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}
