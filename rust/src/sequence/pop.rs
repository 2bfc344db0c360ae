//! Handing an instance its next batch.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::cancel::{QUEUED, TAKEN};
use super::plan::Plan;
use super::state::State;
use super::{
    Entry, SequenceBatcher, SequencePop, SequenceTicket, SlotBatch, Strategy, Taken, earliest,
};

impl<T> SequenceBatcher<T> {
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
            if let Some(taken) = state.claim_head(instance, slot) {
                if taken.end {
                    ended.push(slot);
                }
                entries.push(Entry {
                    slot,
                    request: Some(taken),
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

impl<T> State<T> {
    /// Takes the head request of the sequence in `slot` off its queue, claiming its ticket;
    /// `None` if it was cancelled since the plan.
    fn claim_head(&mut self, instance: usize, slot: usize) -> Option<Taken<T>> {
        let sequence = self.slots[instance][slot]
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
        if !claimed {
            return None;
        }
        self.waiting -= 1;
        Some(Taken {
            item: waiting.item,
            batch_size: waiting.batch_size,
            enqueued_at: waiting.enqueued_at,
            start: waiting.start,
            end: waiting.end,
            ticket: SequenceTicket {
                state: waiting.ticket,
                enqueued_at: waiting.enqueued_at,
            },
        })
    }
}
