//! Criterion benches for `RequestQueue`. Kept short by default (small machines run it too):
//! `cargo bench --bench queue`.
//!
//! * `round_trip`: push + pop on one thread (no waiting involved).
//! * `wakeup`: a consumer thread blocked in `pop_batch`; the time from `push` on the producer
//!   thread until the consumer has the item. `idle` pushes 20 µs after the previous item was
//!   taken (an idle instance, still polling: the "enqueue to instance" budget); `parked` leaves
//!   the consumer time to park between items (the cold path, bound by the OS's thread wake-up);
//!   `back_to_back` pushes as soon as the previous item was acknowledged.
//! * `contention`: 4 producer threads pushing, one consumer taking batches; per item.
//! * `features`: the round trips again with what the scheduler uses: cancellable pushes, and a
//!   batched queue with 3 priority levels, queue timeouts and shape keys.
//!
//! After the criterion groups, the bench prints p50/p99 of the `idle` and `parked` wake-up
//! latencies measured item by item, since criterion reports means and medians of sample means.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, Criterion, Throughput, measurement::WallTime};
use tritonfast_core::{
    BatchPolicy, QueueConfig, QueuePolicy, RequestMeta, RequestQueue, TimeoutAction,
};

/// Gap before each push in the `parked` cases: long enough for the consumer's spin to end.
const PARK_GAP: Duration = Duration::from_micros(200);
/// Gap before each push in the `idle` cases: the consumer is idle, still polling.
const IDLE_GAP: Duration = Duration::from_micros(20);

fn unbatched<T>() -> RequestQueue<T> {
    RequestQueue::new(BatchPolicy::unbatched()).unwrap()
}

fn short(group: &mut BenchmarkGroup<'_, WallTime>) {
    group
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);
}

fn round_trip(c: &mut Criterion) {
    let mut group = c.benchmark_group("round_trip");
    short(&mut group);
    let q = unbatched::<u64>();
    group.bench_function("unbatched", |b| {
        b.iter(|| {
            q.push(black_box(1), 1).unwrap();
            black_box(q.pop_batch(Duration::ZERO));
        });
    });
    let batched = RequestQueue::new(BatchPolicy {
        max_batch_size: 8,
        max_queue_delay: Duration::ZERO,
        preferred_batch_sizes: Vec::new(),
    })
    .unwrap();
    group.throughput(Throughput::Elements(8));
    group.bench_function("batch_of_8", |b| {
        b.iter(|| {
            for i in 0..8u64 {
                batched.push(black_box(i), 1).unwrap();
            }
            black_box(batched.pop_batch(Duration::ZERO));
        });
    });
    group.finish();
}

/// A consumer thread that pops items (push instants) and reports each one's wake-up latency.
fn spawn_consumer(
    q: &Arc<RequestQueue<Instant>>,
) -> (thread::JoinHandle<()>, mpsc::Receiver<Duration>) {
    let (tx, rx) = mpsc::sync_channel(1);
    let q = Arc::clone(q);
    let handle = thread::spawn(move || {
        while let Some(batch) = q.pop_batch(Duration::from_mins(1)).into_batch() {
            let latency = batch[0].elapsed();
            if tx.send(latency).is_err() {
                return;
            }
        }
    });
    (handle, rx)
}

fn spin_for(gap: Duration) {
    let start = Instant::now();
    while start.elapsed() < gap {
        std::hint::spin_loop();
    }
}

fn wakeup(c: &mut Criterion) {
    let mut group = c.benchmark_group("wakeup");
    short(&mut group);
    for (name, gap) in [
        ("parked", PARK_GAP),
        ("idle", IDLE_GAP),
        ("back_to_back", Duration::ZERO),
    ] {
        let q = Arc::new(unbatched());
        let (consumer, latencies) = spawn_consumer(&q);
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    spin_for(gap);
                    q.push(Instant::now(), 1).unwrap();
                    total += latencies.recv().unwrap();
                }
                total
            });
        });
        q.close();
        consumer.join().unwrap();
    }
    group.finish();
}

fn contention(c: &mut Criterion) {
    const PRODUCERS: u64 = 4;
    let mut group = c.benchmark_group("contention");
    short(&mut group);
    group.throughput(Throughput::Elements(PRODUCERS));
    for max_batch_size in [0, 8] {
        let name = format!("4_producers_max_batch_{max_batch_size}");
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let q = Arc::new(
                    RequestQueue::new(BatchPolicy {
                        max_batch_size,
                        max_queue_delay: Duration::ZERO,
                        preferred_batch_sizes: Vec::new(),
                    })
                    .unwrap(),
                );
                let start = Instant::now();
                let producers: Vec<_> = (0..PRODUCERS)
                    .map(|_| {
                        let q = Arc::clone(&q);
                        thread::spawn(move || {
                            for i in 0..iters {
                                q.push(i, 1).unwrap();
                            }
                        })
                    })
                    .collect();
                let mut received = 0;
                while received < iters * PRODUCERS {
                    if let Some(batch) = q.pop_batch(Duration::from_secs(10)).into_batch() {
                        received += batch.len() as u64;
                    }
                }
                let elapsed = start.elapsed();
                for p in producers {
                    p.join().unwrap();
                }
                elapsed
            });
        });
    }
    group.finish();
}

fn features(c: &mut Criterion) {
    let mut group = c.benchmark_group("features");
    short(&mut group);
    let q = unbatched::<u64>();
    group.bench_function("cancellable_unbatched", |b| {
        b.iter(|| {
            let ticket = q
                .push_cancellable(black_box(1), RequestMeta::default())
                .unwrap();
            black_box(q.pop_batch(Duration::ZERO));
            black_box(ticket);
        });
    });
    let timeout = QueuePolicy {
        timeout_action: TimeoutAction::Reject,
        default_timeout: Duration::from_secs(10),
        allow_timeout_override: true,
        max_queue_size: 1000,
    };
    let busy = RequestQueue::with_config(QueueConfig {
        batch: BatchPolicy {
            max_batch_size: 8,
            max_queue_delay: Duration::ZERO,
            preferred_batch_sizes: vec![8],
        },
        priority_levels: 3,
        default_priority_level: 2,
        default_queue_policy: timeout.clone(),
        priority_queue_policy: vec![(
            3,
            QueuePolicy {
                timeout_action: TimeoutAction::Delay,
                ..timeout
            },
        )],
        latency_summaries: false,
    })
    .unwrap();
    group.throughput(Throughput::Elements(8));
    group.bench_function("levels_timeouts_shapes_batch_of_8", |b| {
        b.iter(|| {
            for i in 0..8u32 {
                let meta = RequestMeta {
                    batch_size: 1,
                    priority: 1 + i % 3,
                    timeout: Duration::from_secs(5),
                    shape_key: 7,
                };
                busy.push_cancellable(black_box(u64::from(i)), meta)
                    .unwrap();
            }
            black_box(busy.pop_batch(Duration::ZERO));
        });
    });
    group.finish();
}

/// p50/p99 of the wake-up latency of an idle and of a parked consumer, item by item.
fn wakeup_percentiles(name: &str, gap: Duration) {
    const SAMPLES: usize = 2_000;
    let q = Arc::new(unbatched());
    let (consumer, latencies) = spawn_consumer(&q);
    let mut seen: Vec<Duration> = (0..SAMPLES)
        .map(|_| {
            spin_for(gap);
            q.push(Instant::now(), 1).unwrap();
            latencies.recv().unwrap()
        })
        .collect();
    q.close();
    consumer.join().unwrap();
    seen.sort_unstable();
    let at = |p: usize| seen[(SAMPLES * p / 100).min(SAMPLES - 1)];
    println!(
        "wakeup/{name} per item over {SAMPLES}: p50 {:?}  p99 {:?}  max {:?}",
        at(50),
        at(99),
        seen[SAMPLES - 1]
    );
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    round_trip(&mut criterion);
    wakeup(&mut criterion);
    contention(&mut criterion);
    features(&mut criterion);
    criterion.final_summary();
    // `cargo test --benches` / `cargo bench -- --test` run each bench once; skip the extra report.
    if !std::env::args().any(|a| a == "--test" || a == "--list") {
        wakeup_percentiles("idle", IDLE_GAP);
        wakeup_percentiles("parked", PARK_GAP);
    }
}
