//! The sequence batcher's rules, and a stress test of its one guarantee under threads: no two
//! requests of a sequence run at once, and they run in arrival order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use tritonfast_core::Code;
use tritonfast_core::sequence::{
    CorrelationId, SequenceBatcher, SequenceConfig, SequencePop, SlotBatch, Strategy,
};

const WAIT: Duration = Duration::from_secs(5);

fn direct(instances: usize, max_batch_size: u32) -> SequenceConfig {
    SequenceConfig {
        model: "m".into(),
        instances,
        max_batch_size,
        strategy: Strategy::Direct {
            max_queue_delay: Duration::ZERO,
            minimum_slot_utilization: 0.0,
        },
        max_sequence_idle: Duration::from_mins(1),
        latency_summaries: false,
    }
}

fn id(n: u64) -> CorrelationId {
    CorrelationId::Number(n)
}

fn batch<T: std::fmt::Debug>(popped: SequencePop<T>) -> SlotBatch<T> {
    match popped {
        SequencePop::Batch(batch) => batch,
        other => panic!("expected a batch, got {other:?}"),
    }
}

/// (slot, item) of each entry; `None` items are null entries.
fn layout<T: Copy>(batch: &SlotBatch<T>) -> Vec<(usize, Option<T>)> {
    batch
        .entries
        .iter()
        .map(|entry| (entry.slot, entry.request.as_ref().map(|r| r.item)))
        .collect()
}

#[test]
fn new_sequences_spread_over_instances_then_slots() {
    let batcher = SequenceBatcher::new(direct(2, 2)).unwrap();
    for n in 1..=4 {
        batcher.push(&id(n), true, false, n, 1).unwrap();
    }
    // Sequence 1 → instance 0 slot 0, 2 → instance 1 slot 0, 3 → 0/1, 4 → 1/1.
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(1)), (1, Some(3))]
    );
    assert_eq!(
        layout(&batch(batcher.pop_batch(1, WAIT))),
        vec![(0, Some(2)), (1, Some(4))]
    );
}

#[test]
fn direct_batches_pad_empty_slots_below_the_highest_ready_one() {
    let batcher = SequenceBatcher::new(direct(1, 4)).unwrap();
    for n in 1..=3 {
        batcher.push(&id(n), true, false, n, 1).unwrap();
    }
    let first = batch(batcher.pop_batch(0, WAIT));
    assert_eq!(
        layout(&first),
        vec![(0, Some(1)), (1, Some(2)), (2, Some(3))]
    );
    assert!(
        first
            .entries
            .iter()
            .all(|e| e.request.as_ref().unwrap().start)
    );
    // Only sequence 3 has a request now: slots 0 and 1 are null entries.
    batcher.push(&id(3), false, true, 30, 1).unwrap();
    let second = batch(batcher.pop_batch(0, WAIT));
    assert_eq!(layout(&second), vec![(0, None), (1, None), (2, Some(30))]);
    assert!(second.entries[2].request.as_ref().unwrap().end);
    assert_eq!(second.seq, 1);
}

#[test]
fn one_request_per_sequence_per_batch_in_arrival_order() {
    let batcher = SequenceBatcher::new(direct(1, 4)).unwrap();
    batcher.push(&id(7), true, false, 1, 1).unwrap();
    batcher.push(&id(7), false, false, 2, 1).unwrap();
    batcher.push(&id(7), false, true, 3, 1).unwrap();
    for expected in 1..=3 {
        assert_eq!(
            layout(&batch(batcher.pop_batch(0, WAIT))),
            vec![(0, Some(expected))]
        );
    }
    assert_eq!(batcher.live_sequences(), 0);
}

#[test]
fn refuses_unknown_sequences_and_the_null_id() {
    let batcher = SequenceBatcher::new(direct(1, 1)).unwrap();
    let err = batcher.push(&id(5), false, false, 0, 1).unwrap_err();
    assert_eq!(err.code, Code::InvalidArg);
    assert!(
        err.message
            .contains("sequence 5 to model 'm' must specify the START flag")
    );
    let err = batcher.push(&id(0), true, false, 0, 1).unwrap_err();
    assert!(err.message.contains("non-zero or non-empty correlation ID"));
    let err = batcher
        .push(&CorrelationId::Text(String::new()), true, false, 0, 1)
        .unwrap_err();
    assert_eq!(err.code, Code::InvalidArg);
    // After END the ID is unknown again.
    batcher.push(&id(5), true, true, 1, 1).unwrap();
    assert!(batcher.push(&id(5), false, false, 2, 1).is_err());
}

#[test]
fn string_and_number_ids_are_distinct_sequences() {
    let batcher = SequenceBatcher::new(direct(1, 2)).unwrap();
    batcher
        .push(&CorrelationId::Text("1".into()), true, false, 1, 1)
        .unwrap();
    batcher.push(&id(1), true, false, 2, 1).unwrap();
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(1)), (1, Some(2))]
    );
}

#[test]
fn sequences_beyond_the_slots_wait_in_the_backlog_and_take_freed_slots() {
    let batcher = SequenceBatcher::new(direct(1, 1)).unwrap();
    batcher.push(&id(1), true, false, 10, 1).unwrap();
    batcher.push(&id(2), true, false, 20, 1).unwrap(); // backlog
    batcher.push(&id(2), false, true, 21, 1).unwrap();
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(10))]
    );
    // Sequence 1 holds the only slot: nothing for sequence 2 yet.
    assert!(matches!(
        batcher.pop_batch(0, Duration::from_millis(20)),
        SequencePop::TimedOut
    ));
    batcher.push(&id(1), false, true, 11, 1).unwrap();
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(11))]
    );
    // The END freed the slot for the backlog's sequence 2, in its order.
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(20))]
    );
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(21))]
    );
    assert_eq!(batcher.live_sequences(), 0);
}

#[test]
fn idle_sequences_free_their_slots_for_the_backlog() {
    let mut config = direct(1, 1);
    config.max_sequence_idle = Duration::from_millis(50);
    let batcher = SequenceBatcher::new(config).unwrap();
    batcher.push(&id(1), true, false, 1, 1).unwrap();
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(1))]
    );
    let started = Instant::now();
    // Sequence 2 waits in the backlog (never released there) until sequence 1 idles out.
    batcher.push(&id(2), true, false, 2, 1).unwrap();
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(2))]
    );
    assert!(started.elapsed() >= Duration::from_millis(50));
    let err = batcher.push(&id(1), false, false, 3, 1).unwrap_err();
    assert!(err.message.contains("must specify the START flag"));
    // Sequence 2's idle time counts from when it got its slot, not from its first request.
    batcher.push(&id(2), false, true, 4, 1).unwrap();
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(4))]
    );
    assert_eq!(batcher.live_sequences(), 0);
}

#[test]
fn a_second_start_joins_the_live_sequence_slot() {
    let batcher = SequenceBatcher::new(direct(1, 2)).unwrap();
    batcher.push(&id(1), true, false, 1, 1).unwrap();
    batcher.push(&id(1), false, false, 2, 1).unwrap();
    batcher.push(&id(1), true, false, 3, 1).unwrap();
    for expected in 1..=3 {
        let taken = batch(batcher.pop_batch(0, WAIT));
        assert_eq!(layout(&taken), vec![(0, Some(expected))]);
        assert_eq!(
            taken.entries[0].request.as_ref().unwrap().start,
            expected != 2
        );
    }
    assert_eq!(batcher.live_sequences(), 1);
}

#[test]
fn sequence_requests_carry_one_batch_element() {
    let batcher = SequenceBatcher::new(direct(1, 4)).unwrap();
    let err = batcher.push(&id(1), true, false, 1, 2).unwrap_err();
    assert_eq!(
        err.message,
        "inference request to model 'm' must specify batch-size 1 due to requirements of \
         sequence batcher"
    );
}

#[test]
fn a_cancelled_request_cancels_the_rest_of_its_sequence() {
    let batcher = SequenceBatcher::new(direct(1, 1)).unwrap();
    batcher.push(&id(1), true, false, 1, 1).unwrap();
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(1))]
    );
    let second = batcher.push(&id(1), false, false, 2, 1).unwrap();
    let third = batcher.push(&id(1), false, false, 3, 1).unwrap();
    batcher.push(&id(2), true, true, 4, 1).unwrap(); // backlog
    assert!(batcher.cancel(&second));
    assert!(!batcher.cancel(&second));
    // As in Triton: the requests behind the cancelled one come back to be answered
    // CANCELLED, the slot goes to the backlog, and the ID needs a START again.
    match batcher.pop_batch(0, WAIT) {
        SequencePop::Cancelled(items) => assert_eq!(items, vec![3]),
        other => panic!("expected the cancelled rest, got {other:?}"),
    }
    assert!(third.cancelled());
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(4))]
    );
    let err = batcher.push(&id(1), false, false, 5, 1).unwrap_err();
    assert!(err.message.contains("must specify the START flag"));
    let canceled = batcher
        .stats()
        .snapshot()
        .failures
        .iter()
        .map(|f| f.1)
        .sum::<u64>();
    assert_eq!(canceled, 2);
}

#[test]
fn a_backlog_sequence_with_a_cancelled_request_is_cancelled_whole() {
    let batcher = SequenceBatcher::new(direct(1, 1)).unwrap();
    batcher.push(&id(1), true, false, 1, 1).unwrap();
    let start = batcher.push(&id(2), true, false, 20, 1).unwrap(); // backlog
    batcher.push(&id(2), false, false, 21, 1).unwrap();
    batcher.push(&id(3), true, true, 30, 1).unwrap(); // backlog, behind sequence 2
    assert!(batcher.cancel(&start));
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(1))]
    );
    batcher.push(&id(1), false, true, 11, 1).unwrap();
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(11))]
    );
    match batcher.pop_batch(0, WAIT) {
        SequencePop::Cancelled(items) => assert_eq!(items, vec![21]),
        other => panic!("expected sequence 2 cancelled, got {other:?}"),
    }
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(30))]
    );
}

#[test]
fn a_backlog_sequence_past_its_requests_timeout_is_dropped_whole() {
    let batcher = SequenceBatcher::new(direct(1, 1)).unwrap();
    let timeout = Some(Duration::from_millis(50));
    batcher
        .push_timed(&id(1), true, false, 1, 1, timeout)
        .unwrap(); // a slot: no timeout
    batcher
        .push_timed(&id(2), true, false, 20, 1, timeout)
        .unwrap(); // backlog
    batcher.push(&id(2), false, false, 21, 1).unwrap();
    batcher.push(&id(3), true, false, 30, 1).unwrap(); // backlog, no timeout
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(1))]
    );
    // The slot stays held: sequence 2 reaches its deadline in the backlog. The wait for a
    // batch wakes for it.
    let waited = Instant::now();
    match batcher.pop_batch(0, WAIT) {
        SequencePop::Expired(items) => assert_eq!(items, vec![20, 21]),
        other => panic!("expected sequence 2 expired, got {other:?}"),
    }
    assert!(waited.elapsed() < Duration::from_secs(2));
    assert_eq!(batcher.len(), 1); // sequence 3's request
    let refused = batcher.push(&id(2), false, true, 22, 1).unwrap_err();
    assert_eq!(refused.code, Code::InvalidArg); // the ID needs a START again
    // Sequence 3 keeps its place and takes the slot when sequence 1 ends.
    batcher.push(&id(1), false, true, 11, 1).unwrap();
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(11))]
    );
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(30))]
    );
}

#[test]
fn a_sequence_that_gets_a_slot_in_time_keeps_its_requests() {
    let batcher = SequenceBatcher::new(direct(1, 1)).unwrap();
    batcher.push(&id(1), true, true, 1, 1).unwrap();
    let timeout = Some(Duration::from_millis(100));
    batcher
        .push_timed(&id(2), true, false, 20, 1, timeout)
        .unwrap(); // backlog
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(1))]
    );
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(20))]
    );
    // Past the deadline it had in the backlog, nothing comes back for it.
    assert!(matches!(
        batcher.pop_batch(0, Duration::from_millis(150)),
        SequencePop::TimedOut
    ));
    batcher.push(&id(2), false, true, 21, 1).unwrap();
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(21))]
    );
}

#[test]
fn direct_waits_for_utilization_or_the_queue_delay() {
    let mut config = direct(1, 4);
    config.strategy = Strategy::Direct {
        max_queue_delay: Duration::from_millis(100),
        minimum_slot_utilization: 0.5,
    };
    let batcher = SequenceBatcher::new(config).unwrap();
    batcher.push(&id(1), true, false, 1, 1).unwrap();
    let started = Instant::now();
    let first = batch(batcher.pop_batch(0, WAIT));
    assert!(
        started.elapsed() >= Duration::from_millis(90),
        "left before the delay"
    );
    assert_eq!(layout(&first), vec![(0, Some(1))]);
    batcher.push(&id(2), true, false, 2, 1).unwrap();
    batcher.push(&id(1), false, false, 3, 1).unwrap();
    let started = Instant::now();
    let second = batch(batcher.pop_batch(0, WAIT));
    assert!(
        started.elapsed() < Duration::from_millis(90),
        "half the slots should send"
    );
    assert_eq!(layout(&second), vec![(0, Some(3)), (1, Some(2))]);
}

#[test]
fn oldest_batches_the_oldest_requests_without_null_entries() {
    let config = SequenceConfig {
        strategy: Strategy::Oldest {
            max_candidate_sequences: 4,
            preferred_batch_sizes: vec![],
            max_queue_delay: Duration::ZERO,
        },
        ..direct(1, 2)
    };
    let batcher = SequenceBatcher::new(config).unwrap();
    for n in 1..=4 {
        batcher.push(&id(n), true, false, n, 1).unwrap();
    }
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(1)), (1, Some(2))]
    );
    batcher.push(&id(1), false, false, 5, 1).unwrap();
    // Sequences 3 and 4 waited longer than sequence 1's second request.
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(2, Some(3)), (3, Some(4))]
    );
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(5))]
    );
}

#[test]
fn ending_a_sequence_without_a_request_frees_its_slot_for_the_backlog() {
    let batcher = SequenceBatcher::new(direct(1, 1)).unwrap();
    batcher.push(&id(1), true, false, 1, 1).unwrap();
    batcher.push(&id(2), true, false, 2, 1).unwrap(); // waits in the backlog
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(1))]
    );
    batcher.end(&id(1));
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(2))]
    );
    // Sequence 1 is over: a request of it needs a START again.
    assert_eq!(
        batcher.push(&id(1), false, false, 11, 1).unwrap_err().code,
        Code::InvalidArg
    );
    batcher.end(&id(7)); // unknown: nothing happens
}

#[test]
fn close_refuses_new_sequences_and_drains_live_ones() {
    let mut config = direct(1, 1);
    config.max_sequence_idle = Duration::from_millis(50);
    let batcher = SequenceBatcher::new(config).unwrap();
    batcher.push(&id(1), true, false, 1, 1).unwrap();
    batcher.push(&id(2), true, false, 2, 1).unwrap();
    batcher.close();
    assert_eq!(
        batcher.push(&id(3), true, false, 3, 1).unwrap_err().code,
        Code::Unavailable
    );
    // A live sequence's requests are still taken.
    batcher.push(&id(1), false, true, 11, 1).unwrap();
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(1))]
    );
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(11))]
    );
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(2))]
    );
    // Sequence 2 never ends: the idle rule releases it, then the instance is done.
    assert!(matches!(batcher.pop_batch(0, WAIT), SequencePop::Closed));
}

#[test]
fn sequences_never_run_twice_at_once_and_keep_their_order() {
    // 3 instances x 2 slots, 16 sequences of 50 requests pushed from 4 threads: every
    // sequence's requests run one at a time, in order, on one instance.
    let batcher = Arc::new(SequenceBatcher::<(u64, u32)>::new(direct(3, 2)).unwrap());
    let running: Arc<Mutex<HashMap<u64, usize>>> = Arc::default();
    let seen: Arc<Mutex<HashMap<u64, Vec<u32>>>> = Arc::default();
    let workers: Vec<_> = (0..3)
        .map(|instance| {
            let (batcher, running, seen) = (batcher.clone(), running.clone(), seen.clone());
            thread::spawn(move || {
                loop {
                    match batcher.pop_batch(instance, Duration::from_millis(50)) {
                        SequencePop::Batch(batch) => {
                            let taken: Vec<_> = batch
                                .entries
                                .iter()
                                .filter_map(|e| e.request.as_ref().map(|r| r.item))
                                .collect();
                            for (sequence, _) in &taken {
                                let previous = running.lock().unwrap().insert(*sequence, instance);
                                assert!(
                                    previous.is_none(),
                                    "sequence {sequence} ran twice at once"
                                );
                            }
                            thread::yield_now();
                            for (sequence, step) in taken {
                                running.lock().unwrap().remove(&sequence);
                                seen.lock().unwrap().entry(sequence).or_default().push(step);
                            }
                        }
                        SequencePop::Closed => return,
                        SequencePop::Cancelled(items) => panic!("cancelled {items:?}"),
                        SequencePop::Expired(items) => panic!("expired {items:?}"),
                        SequencePop::TimedOut => {}
                    }
                }
            })
        })
        .collect();
    let producers: Vec<_> = (0..4u64)
        .map(|producer| {
            let batcher = batcher.clone();
            thread::spawn(move || {
                for sequence in (producer * 4 + 1)..=(producer * 4 + 4) {
                    for step in 0..50u32 {
                        batcher
                            .push(&id(sequence), step == 0, step == 49, (sequence, step), 1)
                            .unwrap();
                    }
                }
            })
        })
        .collect();
    for producer in producers {
        producer.join().unwrap();
    }
    batcher.close();
    for worker in workers {
        worker.join().unwrap();
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 16);
    for steps in seen.values() {
        assert_eq!(*steps, (0..50).collect::<Vec<_>>());
    }
}

#[test]
fn abandon_takes_back_every_waiting_request_and_refuses_even_live_sequences() {
    let batcher = SequenceBatcher::new(direct(1, 1)).unwrap();
    // Sequence 1 holds the only slot (one request handed out, one waiting); 2 waits in the
    // backlog.
    batcher.push(&id(1), true, false, 10, 1).unwrap();
    batcher.push(&id(1), false, false, 11, 1).unwrap();
    batcher.push(&id(2), true, false, 20, 1).unwrap();
    assert_eq!(
        layout(&batch(batcher.pop_batch(0, WAIT))),
        vec![(0, Some(10))]
    );
    let mut left = batcher.abandon();
    left.sort_unstable();
    assert_eq!(left, vec![11, 20]);
    assert_eq!(batcher.len(), 0);
    assert_eq!(batcher.live_sequences(), 0);
    assert!(matches!(batcher.pop_batch(0, WAIT), SequencePop::Closed));
    for start in [false, true] {
        let refused = batcher.push(&id(1), start, false, 12, 1).unwrap_err();
        assert_eq!(refused.code, Code::Unavailable);
    }
    assert_eq!(batcher.stats().snapshot().fail.count, 2);
}
