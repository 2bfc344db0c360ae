//! Where a lane's batches come from: a request queue (the default scheduler and the dynamic
//! batcher), or the sequence batcher (a stateful model: each request runs on the instance slot
//! its sequence holds, with its control inputs). Both look the same to the drivers: a batch
//! is a list of [`Entry`]s, each a request or a null request, with what its statistics and
//! its cancellation need.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::LaneItem;
use super::sequence::{Controls, SequenceFlags};
use crate::error::{Code, CoreError};
use crate::queue::{PopResult, RequestMeta, RequestQueue, Ticket, TicketState};
use crate::sequence::{
    CorrelationId, SequenceBatcher, SequenceConfig, SequencePop, SequenceTicket,
};
use crate::stats::{ModelStats, RequestTiming};

/// Triton's answer to the requests of a sequence one of whose earlier requests was cancelled.
pub const SEQUENCE_CANCELLED_MESSAGE: &str = "an earlier request of this sequence was cancelled";
/// ... and to those of a backlog sequence whose timeout passed before it got a slot.
pub const SEQUENCE_EXPIRED_MESSAGE: &str = "timeout of the corresponding sequence has been expired";
/// Triton's answer to a request whose queue timeout expired under the REJECT action.
pub const REQUEST_TIMEOUT_MESSAGE: &str = "Request timeout expired";

/// A lane's batches' source.
// (One per lane, made once: the variants' sizes do not matter.)
#[allow(clippy::large_enum_variant)]
pub(crate) enum Source<E> {
    Queue(RequestQueue<LaneItem<E>>),
    Sequence(SequenceBatcher<LaneItem<E>>, Controls),
}

/// What a queued request is cancelled by.
#[derive(Debug, Clone)]
pub enum LaneTicket {
    Queue(Ticket),
    Sequence(SequenceTicket),
}

/// A running request's ticket, for a cancellation to find its batch position (or its open
/// stream).
#[derive(Debug, Clone)]
pub(crate) enum RunTicket {
    Queue(Arc<TicketState>),
    Sequence(SequenceTicket),
    /// A null request, or one that cannot be cancelled.
    None,
}

impl LaneTicket {
    /// Whether `running` is this ticket's request.
    pub(crate) fn is(&self, running: &RunTicket) -> bool {
        match (self, running) {
            (LaneTicket::Queue(ticket), RunTicket::Queue(state)) => ticket.is(state),
            (LaneTicket::Sequence(ticket), RunTicket::Sequence(other)) => ticket.is(other),
            _ => false,
        }
    }
}

/// One position of a batch.
pub(crate) struct Entry<E> {
    /// None: a null request (a sequence slot without a request in this batch).
    pub item: Option<LaneItem<E>>,
    pub timing: RequestTiming,
    pub ticket: RunTicket,
    /// A sequence request's flags (None for a model without sequence batching).
    pub sequence: Option<SequenceFlags>,
}

/// What a driver gets from [`Source::pop`].
pub(crate) enum Popped<E> {
    Batch(Vec<Entry<E>>),
    /// Requests to answer with the error, without running them.
    Rejected(Vec<LaneItem<E>>, CoreError),
    TimedOut,
    /// Closed, and nothing is left for this instance.
    Closed,
}

impl<E> Source<E> {
    /// A source of sequence batches.
    pub fn sequence(config: SequenceConfig, controls: Controls) -> Result<Self, CoreError> {
        Ok(Source::Sequence(SequenceBatcher::new(config)?, controls))
    }

    pub fn is_sequence(&self) -> bool {
        matches!(self, Source::Sequence(..))
    }

    /// The controls of a sequence source's requests.
    pub fn controls(&self) -> Option<&Controls> {
        match self {
            Source::Queue(_) => None,
            Source::Sequence(_, controls) => Some(controls),
        }
    }

    /// Queues a request: by `meta` in a queue; in sequence `id` (with its flags and timeout)
    /// in the sequence batcher.
    pub fn push(
        &self,
        item: LaneItem<E>,
        meta: RequestMeta,
        sequence: Option<(CorrelationId, bool, bool)>,
    ) -> Result<LaneTicket, CoreError> {
        match self {
            Source::Queue(queue) => queue.push_cancellable(item, meta).map(LaneTicket::Queue),
            Source::Sequence(batcher, _) => {
                let (id, start, end) = sequence.unwrap_or((CorrelationId::Number(0), false, false));
                let timeout = (!meta.timeout.is_zero()).then_some(meta.timeout);
                batcher
                    .push_timed(&id, start, end, item, meta.batch_size, timeout)
                    .map(LaneTicket::Sequence)
            }
        }
    }

    /// Instance `instance`'s next batch, waiting up to `timeout`; `forming` is told `ahead`
    /// of when a batch of the queue that waits out its delay leaves (see
    /// `RequestQueue::pop_batch_queued_noticing`).
    pub fn pop(
        &self,
        instance: usize,
        timeout: Duration,
        ahead: Duration,
        forming: &mut impl FnMut(Instant, usize),
    ) -> Popped<E> {
        match self {
            Source::Queue(queue) => {
                match queue.pop_batch_queued_noticing(timeout, ahead, forming) {
                    PopResult::Closed => Popped::Closed,
                    PopResult::TimedOut => Popped::TimedOut,
                    PopResult::Rejected(items) => Popped::Rejected(
                        items.into_iter().map(|q| q.item).collect(),
                        CoreError::unavailable(REQUEST_TIMEOUT_MESSAGE),
                    ),
                    PopResult::Batch(batch) => Popped::Batch(
                        batch
                            .items
                            .into_iter()
                            .map(|queued| Entry {
                                timing: RequestTiming {
                                    batch_size: queued.batch_size,
                                    enqueued_at: queued.enqueued_at(),
                                },
                                ticket: queued.ticket.map_or(RunTicket::None, RunTicket::Queue),
                                item: Some(queued.item),
                                sequence: None,
                            })
                            .collect(),
                    ),
                }
            }
            Source::Sequence(batcher, _) => match batcher.pop_batch(instance, timeout) {
                SequencePop::Closed => Popped::Closed,
                SequencePop::TimedOut => Popped::TimedOut,
                SequencePop::Cancelled(items) => Popped::Rejected(
                    items,
                    CoreError::new(Code::Cancelled, SEQUENCE_CANCELLED_MESSAGE),
                ),
                SequencePop::Expired(items) => {
                    Popped::Rejected(items, CoreError::unavailable(SEQUENCE_EXPIRED_MESSAGE))
                }
                SequencePop::Batch(batch) if batch.entries.is_empty() => Popped::TimedOut,
                SequencePop::Batch(batch) => Popped::Batch(
                    batch
                        .entries
                        .into_iter()
                        .map(|entry| match entry.request {
                            Some(taken) => Entry {
                                timing: RequestTiming {
                                    batch_size: taken.batch_size,
                                    enqueued_at: taken.enqueued_at,
                                },
                                ticket: RunTicket::Sequence(taken.ticket),
                                item: Some(taken.item),
                                sequence: Some(SequenceFlags {
                                    start: taken.start,
                                    end: taken.end,
                                    ready: true,
                                    slot: entry.slot,
                                }),
                            },
                            None => Entry {
                                timing: RequestTiming {
                                    batch_size: 1,
                                    enqueued_at: std::time::Instant::now(),
                                },
                                ticket: RunTicket::None,
                                item: None,
                                sequence: Some(SequenceFlags {
                                    slot: entry.slot,
                                    ..SequenceFlags::default()
                                }),
                            },
                        })
                        .collect(),
                ),
            },
        }
    }

    /// Removes a waiting request (true), else false (it runs, ran, or was cancelled).
    pub fn cancel(&self, ticket: &LaneTicket) -> Result<bool, CoreError> {
        match (self, ticket) {
            (Source::Queue(queue), LaneTicket::Queue(ticket)) => queue.cancel(ticket),
            (Source::Sequence(batcher, _), LaneTicket::Sequence(ticket)) => {
                Ok(batcher.cancel(ticket))
            }
            _ => Err(CoreError::invalid_arg("a ticket of another lane")),
        }
    }

    pub fn close(&self) {
        match self {
            Source::Queue(queue) => queue.close(),
            Source::Sequence(batcher, _) => batcher.close(),
        }
    }

    pub fn is_closed(&self) -> bool {
        match self {
            Source::Queue(queue) => queue.is_closed(),
            Source::Sequence(batcher, _) => batcher.is_closed(),
        }
    }

    /// Closes for good; what was still waiting, to answer.
    pub fn abandon(&self) -> Vec<LaneItem<E>> {
        match self {
            Source::Queue(queue) => queue.abandon(),
            Source::Sequence(batcher, _) => batcher.abandon(),
        }
    }

    pub fn stats(&self) -> &Arc<ModelStats> {
        match self {
            Source::Queue(queue) => queue.stats(),
            Source::Sequence(batcher, _) => batcher.stats(),
        }
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        match self {
            Source::Queue(queue) => queue.len(),
            Source::Sequence(batcher, _) => batcher.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
