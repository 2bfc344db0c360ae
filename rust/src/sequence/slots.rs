//! Placing sequences: the slot (or backlog place) a new sequence takes, and which backlog
//! sequence takes a slot that frees up.

use std::time::Instant;

use super::state::{Place, Sequence, State, Waiting};
use super::{CorrelationId, SequenceBatcher};

impl<T> State<T> {
    /// Places a new sequence in the best free slot, or at the end of the backlog.
    pub(super) fn place_new(&mut self, id: CorrelationId, now: Instant) -> Place {
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

    /// The free slot a new sequence takes: the lowest slot index, then the lowest instance.
    fn free_slot(&self) -> Option<(usize, usize)> {
        let slots = self.slots.first().map_or(0, Vec::len);
        (0..slots).find_map(|slot| {
            (0..self.slots.len())
                .find(|&instance| self.slots[instance][slot].is_none())
                .map(|instance| (instance, slot))
        })
    }
}

impl<T> SequenceBatcher<T> {
    /// Frees a slot and gives it to the oldest backlog sequence (cancelling, in turn, backlog
    /// sequences that hold a cancelled request).
    pub(super) fn free_slot(&self, state: &mut State<T>, instance: usize, slot: usize) {
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
}
