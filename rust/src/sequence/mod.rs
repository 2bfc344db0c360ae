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

mod batch;
mod cancel;
mod close;
mod config;
mod id;
mod idle;
mod plan;
mod pop;
mod push;
mod slots;
mod state;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use crate::error::CoreError;
use crate::stats::ModelStats;

pub use batch::{Entry, SequencePop, SlotBatch, Taken};
pub use cancel::SequenceTicket;
pub use config::{DEFAULT_MAX_SEQUENCE_IDLE, SequenceConfig, Strategy};
pub use id::CorrelationId;

use state::State;

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
}

/// The earlier of two optional instants (`None`: never).
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}
