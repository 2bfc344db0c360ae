//! Queueing a request of a sequence.

use std::sync::Arc;
use std::sync::atomic::AtomicU8;
use std::time::{Duration, Instant};

use super::cancel::{QUEUED, SequenceTicket};
use super::state::{Place, State, Waiting};
use super::{CorrelationId, SequenceBatcher};
use crate::error::CoreError;

impl<T> SequenceBatcher<T> {
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
        self.check_request(id, batch_size)?;
        let now = Instant::now();
        let mut state = self.state.lock();
        if state.closed && (start || state.abandoned) {
            return Err(CoreError::unavailable("the request queue is closed"));
        }
        self.release_idle(&mut state, now);
        let place = self.place_for(&mut state, id, start, now)?;
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

    /// Refuses what sequence batching cannot take: a batch of more than one request, or a
    /// request of no sequence.
    fn check_request(&self, id: &CorrelationId, batch_size: u32) -> Result<(), CoreError> {
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
        Ok(())
    }

    /// Where the request's sequence is: where it lives, or for a `start` of a sequence that
    /// is not live, the place the new sequence takes.
    fn place_for(
        &self,
        state: &mut State<T>,
        id: &CorrelationId,
        start: bool,
        now: Instant,
    ) -> Result<Place, CoreError> {
        match state.live.get(id).copied() {
            Some(place) => Ok(place),
            None if start => Ok(state.place_new(id.clone(), now)),
            None => Err(CoreError::invalid_arg(format!(
                "inference request for sequence {id} to model '{}' must specify the \
                 START flag on the first request of the sequence",
                self.config.model
            ))),
        }
    }
}
