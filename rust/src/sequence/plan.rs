//! Planning an instance's next batch by its strategy: which slots' head requests go, or until
//! when it waits for more.

use std::time::{Duration, Instant};

use super::state::State;
use super::{SequenceBatcher, Strategy};

/// What an instance should do now.
pub(super) enum Plan {
    /// Send a batch of these slots' head requests.
    Send(Vec<usize>),
    WaitUntil(Instant),
    Nothing,
}

/// The request at the head of a slot's sequence: the one of that sequence that runs next.
struct Head {
    slot: usize,
    batch_size: u32,
    enqueued_at: Instant,
}

impl<T> SequenceBatcher<T> {
    /// What `instance` should do now.
    pub(super) fn plan(&self, state: &mut State<T>, instance: usize, now: Instant) -> Plan {
        let mut heads = self.heads(state, instance);
        let Some(oldest) = heads.iter().map(|head| head.enqueued_at).min() else {
            return Plan::Nothing;
        };
        // A batch that waits for more leaves `delay` after its oldest request at the latest;
        // it is due once that has come (at once with no delay).
        let deadline = |delay: Duration| oldest.checked_add(delay).unwrap_or(now);
        let due = |delay: Duration| delay.is_zero() || now >= deadline(delay);
        match &self.config.strategy {
            Strategy::Direct {
                max_queue_delay,
                minimum_slot_utilization,
            } => plan_direct(
                &heads,
                state.slots[instance].len(),
                *minimum_slot_utilization,
                due(*max_queue_delay),
                deadline(*max_queue_delay),
            ),
            Strategy::Oldest {
                preferred_batch_sizes,
                max_queue_delay,
                ..
            } => plan_oldest(
                &mut heads,
                self.config.max_batch_size.max(1),
                preferred_batch_sizes,
                due(*max_queue_delay),
                deadline(*max_queue_delay),
            ),
        }
    }

    /// The head request of each of `instance`'s slots that has one waiting, by slot. On the
    /// way, cancels the sequences whose head was cancelled and frees the slots of ended
    /// sequences with nothing left to run.
    fn heads(&self, state: &mut State<T>, instance: usize) -> Vec<Head> {
        let mut heads = Vec::new();
        for slot in 0..state.slots[instance].len() {
            if self.cancel_if_head_cancelled(state, instance, slot) {
                continue;
            }
            let Some(sequence) = &state.slots[instance][slot] else {
                continue;
            };
            match sequence.waiting.front() {
                Some(head) => heads.push(Head {
                    slot,
                    batch_size: head.batch_size,
                    enqueued_at: head.enqueued_at,
                }),
                None if sequence.ending => self.free_slot(state, instance, slot),
                None => {}
            }
        }
        heads
    }
}

/// Direct: every slot with a request waiting, in slot order, once enough of the `slots` have
/// one or the batch is due.
fn plan_direct(
    heads: &[Head],
    slots: usize,
    minimum_slot_utilization: f32,
    due: bool,
    deadline: Instant,
) -> Plan {
    #[allow(clippy::cast_precision_loss)] // slot counts are small
    let utilization = heads.len() as f32 / slots as f32;
    if due || utilization >= minimum_slot_utilization {
        Plan::Send(heads.iter().map(|head| head.slot).collect())
    } else {
        Plan::WaitUntil(deadline)
    }
}

/// Oldest: the oldest head requests first, as many as fit in `limit`; they leave when the batch
/// is full or due, or early at a preferred size it cannot grow past.
fn plan_oldest(
    heads: &mut [Head],
    limit: u32,
    preferred_batch_sizes: &[u32],
    due: bool,
    deadline: Instant,
) -> Plan {
    heads.sort_by_key(|head| head.enqueued_at);
    let mut chosen = Vec::new();
    let mut size = 0;
    let mut preferred_at = None;
    for head in &*heads {
        if size + head.batch_size > limit {
            break;
        }
        size += head.batch_size;
        chosen.push(head.slot);
        if preferred_batch_sizes.contains(&size) {
            preferred_at = Some(chosen.len());
        }
    }
    if chosen.is_empty() {
        // A request larger than the batch limit cannot be pushed; be safe anyway.
        chosen.push(heads[0].slot);
    }
    let full = size >= limit || chosen.len() < heads.len();
    if full || due {
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
