//! Releasing sequences that sit idle in their slots, and dropping backlog sequences whose
//! timeout expired.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::state::{Place, Sequence, State};
use super::{SequenceBatcher, earliest};
use crate::stats::FailureReason;

impl<T> SequenceBatcher<T> {
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
    pub(super) fn release_idle(&self, state: &mut State<T>, now: Instant) {
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
    pub(super) fn next_idle_deadline(&self, state: &State<T>) -> Option<Instant> {
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
}
