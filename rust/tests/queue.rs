//! Behaviour of `RequestQueue`: ordering, batching, delays, timeouts, close, and thread stress.
//!
//! Every multi-threaded test runs under `within`, so a deadlock fails the test instead of
//! hanging the run.

mod common;
use common::within;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use tritonfast_core::{Batch, BatchPolicy, Code, PopResult, RequestQueue};

const LONG: Duration = Duration::from_secs(10);

fn queue<T>(max: u32, delay: Duration, preferred: &[u32]) -> Arc<RequestQueue<T>> {
    Arc::new(
        RequestQueue::new(BatchPolicy {
            max_batch_size: max,
            max_queue_delay: delay,
            preferred_batch_sizes: preferred.to_vec(),
        })
        .unwrap(),
    )
}

/// A small deterministic pseudo-random sequence (xorshift), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u32) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        u32::try_from(self.0 % u64::from(n)).unwrap()
    }
}

fn batch<T>(result: PopResult<T>) -> Vec<T> {
    match result {
        PopResult::Batch(batch) => batch.items,
        PopResult::Rejected(_) => panic!("expected a batch, got Rejected"),
        PopResult::TimedOut => panic!("expected a batch, got TimedOut"),
        PopResult::Closed => panic!("expected a batch, got Closed"),
    }
}

#[test]
fn unbatched_is_fifo_one_item_per_batch() {
    let q = queue(0, Duration::ZERO, &[]);
    for i in 0..1000 {
        q.push(i, 7).unwrap();
    }
    for i in 0..1000 {
        assert_eq!(batch(q.pop_batch(LONG)), vec![i]);
    }
    assert!(q.is_empty());
}

#[test]
fn batched_is_fifo_across_batches() {
    let q = queue(8, Duration::ZERO, &[]);
    let mut rng = Rng(7);
    let sizes: Vec<u32> = (0..500).map(|_| 1 + rng.below(8)).collect();
    for (i, &size) in sizes.iter().enumerate() {
        q.push((i, size), size).unwrap();
    }
    let mut seen = Vec::new();
    while seen.len() < sizes.len() {
        let b = batch(q.pop_batch(LONG));
        let total: u32 = b.iter().map(|&(_, s)| s).sum();
        assert!(total <= 8, "batch of size {total} exceeds max 8");
        seen.extend(b.into_iter().map(|(i, _)| i));
    }
    assert_eq!(seen, (0..sizes.len()).collect::<Vec<_>>());
}

#[test]
fn batches_never_split_items_and_fill_greedily() {
    let q = queue(8, Duration::ZERO, &[]);
    for (item, size) in [("a", 3), ("b", 3), ("c", 3), ("d", 5), ("e", 8)] {
        q.push(item, size).unwrap();
    }
    // a+b = 6; c (3) would make 9 > 8 and is not split: it heads the next batch with d.
    assert_eq!(batch(q.pop_batch(LONG)), vec!["a", "b"]);
    assert_eq!(batch(q.pop_batch(LONG)), vec!["c", "d"]);
    assert_eq!(batch(q.pop_batch(LONG)), vec!["e"]);
}

#[test]
fn push_validates_batch_size_when_batching() {
    let q = queue::<u8>(4, Duration::ZERO, &[]);
    assert_eq!(q.push(0, 5).unwrap_err().code, Code::InvalidArg);
    assert_eq!(q.push(0, 0).unwrap_err().code, Code::InvalidArg);
    q.push(0, 4).unwrap();
    // Without batching the size is not looked at.
    let unbatched = queue::<u8>(0, Duration::ZERO, &[]);
    unbatched.push(0, 1000).unwrap();
    assert_eq!(unbatched.len(), 1);
}

#[test]
fn timeout_returns_timed_out() {
    let q = queue::<u32>(0, Duration::ZERO, &[]);
    let start = Instant::now();
    assert_eq!(q.pop_batch(Duration::from_millis(30)), PopResult::TimedOut);
    assert!(start.elapsed() >= Duration::from_millis(30));
    assert_eq!(q.pop_batch(Duration::ZERO), PopResult::TimedOut);
}

#[test]
fn partial_batch_waits_for_the_delay_then_leaves() {
    let delay = Duration::from_millis(40);
    let q = queue(8, delay, &[]);
    // Taken before the push, so the item's enqueue time is not earlier.
    let pushed = Instant::now();
    q.push(1, 2).unwrap();
    assert_eq!(batch(q.pop_batch(LONG)), vec![1]);
    let waited = pushed.elapsed();
    assert!(waited >= delay, "left early: {waited:?}");
    assert!(
        waited < delay + Duration::from_secs(2),
        "left late: {waited:?}"
    );
}

#[test]
fn delay_counts_from_the_oldest_item() {
    let delay = Duration::from_millis(200);
    let q = queue(8, delay, &[]);
    let pushed = Instant::now();
    q.push(1, 1).unwrap();
    // Let the item age most of its delay before any consumer looks.
    thread::sleep(Duration::from_millis(150));
    assert_eq!(batch(q.pop_batch(LONG)), vec![1]);
    let since_push = pushed.elapsed();
    assert!(since_push >= delay, "left early: {since_push:?}");
    assert!(
        since_push < delay + Duration::from_secs(2),
        "left late: {since_push:?}"
    );
}

#[test]
fn full_batch_leaves_without_waiting_for_the_delay() {
    let q = queue(4, LONG, &[]);
    for i in 0..4 {
        q.push(i, 1).unwrap();
    }
    let start = Instant::now();
    assert_eq!(batch(q.pop_batch(LONG)), vec![0, 1, 2, 3]);
    assert!(start.elapsed() < Duration::from_secs(1));
}

#[test]
fn preferred_size_leaves_without_waiting_for_the_delay() {
    let q = queue(16, LONG, &[4, 2]);
    for i in 0..5 {
        q.push(i, 1).unwrap();
    }
    let start = Instant::now();
    // The largest preferred size reachable with 5 items is 4.
    assert_eq!(batch(q.pop_batch(LONG)), vec![0, 1, 2, 3]);
    assert!(start.elapsed() < Duration::from_secs(1));
    assert_eq!(q.len(), 1);
}

#[test]
fn a_batch_forming_consumer_is_woken_by_new_items() {
    // A consumer waiting (for the delay) with a partial batch returns once the batch fills.
    let q = queue(2, LONG, &[]);
    q.push(0, 1).unwrap();
    let consumer = {
        let q = Arc::clone(&q);
        thread::spawn(move || q.pop_batch(LONG))
    };
    // Give the consumer time to stage the first item and park; the test holds either way, this
    // only makes the wake-up path the likely one.
    thread::sleep(Duration::from_millis(20));
    q.push(1, 1).unwrap();
    let got = within(Duration::from_secs(5), move || consumer.join().unwrap());
    assert_eq!(batch(got), vec![0, 1]);
}

#[test]
fn pop_batch_queued_keeps_sizes_and_enqueue_times() {
    let q = queue(8, Duration::ZERO, &[]);
    let before = Instant::now();
    q.push("x", 3).unwrap();
    q.push("y", 2).unwrap();
    let after = Instant::now();
    let b = batch(q.pop_batch_queued(LONG));
    assert_eq!(
        b.iter().map(|e| (e.item, e.batch_size)).collect::<Vec<_>>(),
        [("x", 3), ("y", 2)]
    );
    for e in &b {
        assert!(before <= e.enqueued_at() && e.enqueued_at() <= after);
    }
    assert!(b[0].enqueued_at() <= b[1].enqueued_at());
}

#[test]
fn close_drains_then_reports_closed() {
    let q = queue(4, LONG, &[]);
    for i in 0..6 {
        q.push(i, 1).unwrap();
    }
    q.close();
    assert!(q.is_closed());
    assert_eq!(q.push(99, 1).unwrap_err().code, Code::Unavailable);
    // Queued items still come out, without waiting for the (long) delay.
    let start = Instant::now();
    assert_eq!(batch(q.pop_batch(LONG)), vec![0, 1, 2, 3]);
    assert_eq!(batch(q.pop_batch(LONG)), vec![4, 5]);
    assert_eq!(q.pop_batch(LONG), PopResult::Closed);
    assert_eq!(q.pop_batch(Duration::ZERO), PopResult::Closed);
    assert!(start.elapsed() < Duration::from_secs(1));
    q.close();
    assert!(q.is_closed());
}

#[test]
fn abandon_takes_back_everything_queued_even_while_a_consumer_waits_for_a_batch() {
    // A consumer holds the batch former waiting (for the long delay) on a partial batch.
    let q = queue::<u32>(8, LONG, &[]);
    q.push(1, 1).unwrap();
    let waiter = {
        let q = Arc::clone(&q);
        thread::spawn(move || q.pop_batch(LONG))
    };
    for i in 2..=5 {
        q.push(i, 1).unwrap();
    }
    let taken_by_waiter = within(Duration::from_secs(10), {
        let q = Arc::clone(&q);
        move || {
            let mut left = q.abandon();
            if let PopResult::Batch(b) = waiter.join().unwrap() {
                left.extend(b.items);
            }
            left.sort_unstable();
            left
        }
    });
    // Every request comes back exactly once, to the waiter (closing lets its batch leave) or
    // to `abandon`, and nothing is left.
    assert_eq!(taken_by_waiter, vec![1, 2, 3, 4, 5]);
    assert!(q.is_closed());
    assert_eq!(q.pop_batch(Duration::ZERO), PopResult::Closed);
    assert_eq!(q.push(9, 1).unwrap_err().code, Code::Unavailable);
    assert!(q.abandon().is_empty());
}

#[test]
fn abandoned_requests_count_as_failures() {
    let q = queue::<u32>(0, Duration::ZERO, &[]);
    for i in 0..3 {
        q.push(i, 1).unwrap();
    }
    assert_eq!(q.abandon(), vec![0, 1, 2]);
    let stats = q.stats().snapshot();
    assert_eq!(stats.fail.count, 3);
    assert_eq!(stats.success.count, 0);
}

#[test]
fn close_wakes_every_blocked_consumer() {
    let q = queue::<u32>(4, LONG, &[]);
    let consumers = 4;
    let started = Arc::new(Barrier::new(consumers + 1));
    let handles: Vec<_> = (0..consumers)
        .map(|_| {
            let q = Arc::clone(&q);
            let started = Arc::clone(&started);
            thread::spawn(move || {
                started.wait();
                q.pop_batch(Duration::from_mins(1))
            })
        })
        .collect();
    started.wait();
    q.close();
    let results = within(Duration::from_secs(10), move || {
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    assert!(
        results.iter().all(|r| *r == PopResult::Closed),
        "{results:?}"
    );
}

#[test]
fn waiting_consumers_time_out_while_another_forms_a_batch() {
    // One consumer holds the batch former waiting for items; another must still honour its own
    // short timeout.
    let q = queue::<u32>(0, Duration::ZERO, &[]);
    let holder = {
        let q = Arc::clone(&q);
        thread::spawn(move || q.pop_batch(Duration::from_secs(30)))
    };
    let start = Instant::now();
    assert_eq!(q.pop_batch(Duration::from_millis(50)), PopResult::TimedOut);
    assert!(start.elapsed() < Duration::from_secs(5));
    q.push(7, 1).unwrap();
    let got = within(Duration::from_secs(10), move || holder.join().unwrap());
    assert_eq!(got.into_batch(), Some(vec![7]));
}

/// Waits until `count` consumers of `q` wait idle.
fn until_idle(q: &RequestQueue<u32>, count: usize) {
    let start = Instant::now();
    while q.idle_consumers() < count {
        assert!(start.elapsed() < LONG, "the consumers never all went idle");
        thread::yield_now();
    }
}

/// Two consumers that each take one batch, send it to the test, and hold on to it (their
/// instance busy) until the test releases them.
struct HoldingConsumers {
    batches: mpsc::Receiver<Vec<u32>>,
    release: Arc<Barrier>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl HoldingConsumers {
    fn start(q: &Arc<RequestQueue<u32>>) -> Self {
        let (to_test, batches) = mpsc::channel();
        let release = Arc::new(Barrier::new(3));
        let threads = (0..2)
            .map(|_| {
                let q = Arc::clone(q);
                let to_test = to_test.clone();
                let release = Arc::clone(&release);
                thread::spawn(move || {
                    if let PopResult::Batch(batch) = q.pop_batch(LONG) {
                        to_test.send(batch.items).unwrap();
                        release.wait();
                    }
                })
            })
            .collect();
        until_idle(q, 2);
        HoldingConsumers {
            batches,
            release,
            threads,
        }
    }

    /// The two batches taken, in order of their items.
    fn batches(&self) -> Vec<Vec<u32>> {
        let mut batches: Vec<Vec<u32>> = (0..2)
            .map(|_| self.batches.recv_timeout(Duration::from_secs(5)).unwrap())
            .collect();
        batches.sort();
        batches
    }

    fn release(self) {
        self.release.wait();
        within(Duration::from_secs(10), move || {
            for consumer in self.threads {
                consumer.join().unwrap();
            }
        });
    }
}

/// `count` consumers of `q` that send each batch they take, with their number, to the test
/// until the queue closes.
struct LoopingConsumers {
    batches: mpsc::Receiver<(usize, Vec<u32>)>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl LoopingConsumers {
    fn start(q: &Arc<RequestQueue<u32>>, count: usize) -> Self {
        let (to_test, batches) = mpsc::channel();
        let threads = (0..count)
            .map(|consumer| {
                let q = Arc::clone(q);
                let to_test = to_test.clone();
                thread::spawn(move || {
                    while let PopResult::Batch(batch) = q.pop_batch(LONG) {
                        to_test.send((consumer, batch.items)).unwrap();
                    }
                })
            })
            .collect();
        LoopingConsumers { batches, threads }
    }

    fn close(self, q: &RequestQueue<u32>) {
        q.close();
        within(Duration::from_secs(10), move || {
            for consumer in self.threads {
                consumer.join().unwrap();
            }
        });
    }
}

#[test]
fn a_lone_request_goes_to_the_consumer_that_took_the_last_batch() {
    // Three consumers; requests one at a time, each pushed once all three wait idle: the one
    // that ran the previous request (its instance's caches the warmest) takes every next one,
    // not each consumer in turn.
    let q = queue::<u32>(0, Duration::ZERO, &[]);
    let consumers = LoopingConsumers::start(&q, 3);
    let mut takers = Vec::new();
    for item in 0..20 {
        until_idle(&q, 3);
        q.push(item, 1).unwrap();
        let (consumer, items) = consumers.batches.recv_timeout(LONG).unwrap();
        assert_eq!(items, vec![item]);
        takers.push(consumer);
    }
    assert!(
        takers.iter().all(|&consumer| consumer == takers[0]),
        "{takers:?}"
    );
    consumers.close(&q);
}

#[test]
fn requests_left_behind_a_batch_wake_an_idle_consumer() {
    // Two requests pushed together to two idle consumers (no batching): each consumer holds on
    // to what it took, so the second request needs the other one, which no later push wakes.
    // Repeated, for the pushes to land at every point of the first consumer's pop.
    for _ in 0..200 {
        let q = queue::<u32>(0, Duration::ZERO, &[]);
        let consumers = HoldingConsumers::start(&q);
        q.push(1, 1).unwrap();
        q.push(2, 1).unwrap();
        assert_eq!(consumers.batches(), vec![vec![1], vec![2]]);
        consumers.release();
    }
}

#[test]
fn a_request_staged_behind_a_full_batch_wakes_an_idle_consumer() {
    // Batches of two with a delay: the first consumer stages the first request and waits for
    // its batch; the next two pushes find it holding the former lock and wake no one. It takes
    // a full batch and leaves the third staged, which the idle consumer must take.
    let q = queue::<u32>(2, Duration::from_millis(200), &[]);
    let consumers = HoldingConsumers::start(&q);
    q.push(1, 1).unwrap();
    let start = Instant::now();
    while q.idle_consumers() > 1 || !q.is_forming() {
        assert!(start.elapsed() < LONG, "no consumer took the first request");
        thread::yield_now();
    }
    q.push(2, 1).unwrap();
    q.push(3, 1).unwrap();
    assert_eq!(consumers.batches(), vec![vec![1, 2], vec![3]]);
    consumers.release();
}

#[test]
fn bursts_left_staged_behind_full_batches_are_all_taken() {
    // Bursts of three to batches of two: each burst leaves a request staged behind a full
    // batch while the other consumers come and go idle. None may wait for a later push.
    let q = queue::<u32>(2, Duration::ZERO, &[]);
    let consumers = LoopingConsumers::start(&q, 3);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for burst in 0..2000 {
        // (A gap of 0-80 µs: the consumers' polls end, and they go idle, at every point of it.)
        let gap = Duration::from_micros(u64::from(rng.below(80)));
        let start = Instant::now();
        while start.elapsed() < gap {
            std::hint::spin_loop();
        }
        for item in 0..3 {
            q.push(burst * 3 + item, 1).unwrap();
        }
        let mut taken = 0;
        while taken < 3 {
            let (_, items) = consumers
                .batches
                .recv_timeout(Duration::from_secs(2))
                .expect("a request was left waiting");
            taken += items.len();
        }
    }
    consumers.close(&q);
}

/// Producers push `(producer, seq)` items; consumers collect batches until `Closed`. Checks that
/// every item arrives exactly once, batches respect the limit, and each producer's items reach
/// each consumer in order.
fn stress(max: u32, delay: Duration, producers: u32, consumers: usize, per_producer: u32) {
    let q = queue::<(u32, u32, u32)>(max, delay, &[]);
    let result = within(Duration::from_mins(1), move || {
        let consumer_handles: Vec<_> = (0..consumers)
            .map(|_| {
                let q = Arc::clone(&q);
                thread::spawn(move || {
                    let mut got = Vec::new();
                    loop {
                        match q.pop_batch(Duration::from_millis(5)) {
                            PopResult::Batch(Batch { items: b, .. }) => {
                                assert!(!b.is_empty());
                                if max > 0 {
                                    let total: u32 = b.iter().map(|&(_, _, s)| s).sum();
                                    assert!(total <= max, "batch {total} > max {max}");
                                } else {
                                    assert_eq!(b.len(), 1);
                                }
                                got.extend(b);
                            }
                            PopResult::TimedOut => {}
                            PopResult::Rejected(_) => panic!("nothing can time out"),
                            PopResult::Closed => return got,
                        }
                    }
                })
            })
            .collect();
        let producer_handles: Vec<_> = (0..producers)
            .map(|p| {
                let q = Arc::clone(&q);
                thread::spawn(move || {
                    let mut rng = Rng(u64::from(p) * 7919 + 1);
                    for seq in 0..per_producer {
                        let size = if max > 0 { 1 + rng.below(max) } else { 1 };
                        q.push((p, seq, size), size).unwrap();
                    }
                })
            })
            .collect();
        for h in producer_handles {
            h.join().unwrap();
        }
        q.close();
        consumer_handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });

    let mut all = HashSet::new();
    for got in &result {
        let mut last = vec![None; producers as usize];
        for &(p, seq, _) in got {
            assert!(all.insert((p, seq)), "item ({p}, {seq}) delivered twice");
            let prev = last[p as usize].replace(seq);
            assert!(prev < Some(seq), "producer {p}: {seq} after {prev:?}");
        }
    }
    assert_eq!(all.len(), (producers * per_producer) as usize, "items lost");
}

#[test]
fn stress_unbatched_many_producers_many_consumers() {
    stress(0, Duration::ZERO, 4, 3, 20_000);
}

#[test]
fn stress_batched_many_producers_many_consumers() {
    stress(8, Duration::from_micros(50), 4, 3, 20_000);
}

#[test]
fn stress_batched_no_delay() {
    stress(16, Duration::ZERO, 3, 2, 20_000);
}

#[test]
fn no_lost_wakeups_in_ping_pong() {
    // The consumer parks between items; a lost wake-up would stall it until the watchdog fires.
    let q = queue::<u32>(0, Duration::ZERO, &[]);
    within(Duration::from_mins(1), move || {
        let (ack_tx, ack_rx) = mpsc::channel();
        let consumer = {
            let q = Arc::clone(&q);
            thread::spawn(move || {
                while let Some(b) = q.pop_batch(Duration::from_secs(30)).into_batch() {
                    ack_tx.send(b[0]).unwrap();
                }
            })
        };
        for i in 0..5_000 {
            q.push(i, 1).unwrap();
            let got = ack_rx
                .recv_timeout(Duration::from_secs(10))
                .expect("lost wake-up");
            assert_eq!(got, i);
        }
        q.close();
        consumer.join().unwrap();
    });
}

#[test]
fn close_racing_with_pushes_loses_nothing() {
    for round in 0..20 {
        let q = queue::<u64>(4, Duration::ZERO, &[]);
        let pushed = Arc::new(AtomicU64::new(0));
        let (accepted, delivered) = within(Duration::from_secs(30), move || {
            let producers: Vec<_> = (0..3)
                .map(|p| {
                    let q = Arc::clone(&q);
                    let pushed = Arc::clone(&pushed);
                    thread::spawn(move || {
                        let mut accepted = 0u64;
                        for i in 0u64.. {
                            match q.push(p * 1_000_000 + i, 1) {
                                Ok(()) => {
                                    accepted += 1;
                                    pushed.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(e) => {
                                    assert_eq!(e.code, Code::Unavailable);
                                    return accepted;
                                }
                            }
                        }
                        unreachable!()
                    })
                })
                .collect();
            let consumer = {
                let q = Arc::clone(&q);
                thread::spawn(move || {
                    let mut delivered = 0u64;
                    loop {
                        match q.pop_batch(Duration::from_secs(10)) {
                            PopResult::Batch(b) => delivered += b.items.len() as u64,
                            PopResult::TimedOut | PopResult::Rejected(_) => {
                                panic!("consumer timed out")
                            }
                            PopResult::Closed => return delivered,
                        }
                    }
                })
            };
            // Close once some items have flowed.
            while pushed.load(Ordering::Relaxed) < 100 * (round + 1) {
                thread::yield_now();
            }
            q.close();
            let accepted: u64 = producers.into_iter().map(|h| h.join().unwrap()).sum();
            (accepted, consumer.join().unwrap())
        });
        assert_eq!(accepted, delivered, "round {round}");
    }
}

#[test]
fn try_pop_batch_never_waits() {
    let q = queue(4, LONG, &[]);
    assert_eq!(q.try_pop_batch(), PopResult::TimedOut);
    q.push(0, 1).unwrap();
    // A partial batch within its delay is not ready yet.
    let start = Instant::now();
    assert_eq!(q.try_pop_batch(), PopResult::TimedOut);
    assert!(start.elapsed() < Duration::from_secs(1));
    assert_eq!(q.len(), 1);
    for i in 1..4 {
        q.push(i, 1).unwrap();
    }
    assert_eq!(q.try_pop_batch().into_batch(), Some(vec![0, 1, 2, 3]));
    q.push(4, 1).unwrap();
    q.close();
    assert_eq!(q.try_pop_batch().into_batch(), Some(vec![4]));
    assert_eq!(q.try_pop_batch(), PopResult::Closed);
}

#[test]
fn try_pop_batch_returns_a_partial_batch_once_its_delay_passed() {
    let q = queue(4, Duration::from_millis(20), &[]);
    q.push(0, 1).unwrap();
    let got = within(Duration::from_secs(10), move || {
        loop {
            if let Some(b) = q.try_pop_batch().into_batch() {
                return b;
            }
            thread::yield_now();
        }
    });
    assert_eq!(got, vec![0]);
}
