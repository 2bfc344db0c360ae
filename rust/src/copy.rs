//! Copying large tensors on several threads.
//!
//! One core copies memory at a fraction of what the memory system can move; splitting a
//! multi-MiB copy across two cores finishes it in about half the time on a 2-vCPU virtual
//! machine, when its host leaves it the memory bandwidth (at times two threads copy no faster
//! than one there). Large copies are also written with non-temporal stores
//! (`copy_run`). Small copies stay on the calling thread, as libc does them.
//!
//! The helpers are threads started once and parked between copies, not threads spawned per
//! copy: a thread spawned by a process that has been idle for a few milliseconds is placed on
//! its parent's core (both look equally idle to the scheduler) and only runs once the parent
//! blocks, so after an idle gap a spawned helper would leave a 64 MiB copy as slow as one
//! thread's. Waking a parked thread goes to an idle core instead.
//!
//! A copy is cut into chunks that the caller and the helpers claim one at a time, so a helper
//! that wakes late (or not at all, while it serves another copy) only takes fewer chunks: the
//! caller never waits for work that nobody has started.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::{self, Thread};

use parking_lot::{Condvar, Mutex};

/// Below this many bytes a copy runs on the calling thread, as libc copies.
pub const PARALLEL_COPY_BYTES: usize = 8 << 20;
/// Never more threads (the caller and its helpers) than this for one copy.
const MAX_COPY_THREADS: usize = 4;
/// Chunks are at least this large: two threads copying long runs each come close to twice
/// one thread's speed, copying small interleaved pieces they do not. Measured on two threads,
/// 64 MiB of heap memory took 2.9 ms in 1 MiB pieces, 1.7 ms in 8 MiB and 1.4 ms in 32 MiB.
const MIN_CHUNK_BYTES: usize = 4 << 20;
/// And at most this large, so that a caller done with its own chunks never waits long for a
/// helper's last one.
const MAX_CHUNK_BYTES: usize = 32 << 20;
/// Each thread gets about this many chunks: enough that a helper that wakes late still takes
/// a share of what is left.
const CHUNKS_PER_THREAD: usize = 2;

/// Copies `len` bytes from `source` to `destination`.
///
/// # Safety
/// `source` must be valid for reads and `destination` for writes of `len` bytes, the two
/// ranges must not overlap, and nothing else may write either range during the call.
pub unsafe fn copy_nonoverlapping(source: *const u8, destination: *mut u8, len: usize) {
    if len < PARALLEL_COPY_BYTES {
        // Small enough to stay in the cache, where the reader finds it soonest.
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(source, destination, len) };
        return;
    }
    let Some((helpers, threads)) = helpers() else {
        // SAFETY: the caller's contract.
        unsafe { copy_run(source, destination, len) };
        return;
    };
    let chunk = len
        .div_ceil(threads * CHUNKS_PER_THREAD)
        .clamp(MIN_CHUNK_BYTES, MAX_CHUNK_BYTES)
        .next_multiple_of(64);
    let job = Arc::new(Job {
        owner: thread::current(),
        source: source as usize,
        destination: destination as usize,
        len,
        chunk,
        chunks: len.div_ceil(chunk),
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
    });
    helpers.post(&job);
    // SAFETY: the caller's contract covers every chunk of `job`.
    unsafe { job.work() };
    job.wait_done();
    helpers.withdraw(&job);
}

/// One copy, shared out by chunks. Holds addresses, not references: what makes them valid is
/// the caller of [`copy_nonoverlapping`], which returns only once every chunk is copied.
struct Job {
    /// The caller, woken by the helper that copies the last chunk.
    owner: Thread,
    source: usize,
    destination: usize,
    len: usize,
    /// Bytes per chunk (the last one may be shorter).
    chunk: usize,
    chunks: usize,
    /// The next chunk to claim; claims at or past `chunks` touch nothing.
    next: AtomicUsize,
    /// Chunks copied.
    done: AtomicUsize,
}

impl Job {
    /// Claims and copies chunks until none is left.
    ///
    /// # Safety
    /// While any chunk is unclaimed, the ranges of `copy_nonoverlapping`'s contract must be
    /// valid (the caller keeps them so until [`Job::wait_done`] returns).
    unsafe fn work(&self) {
        let helping = thread::current().id() != self.owner.id();
        loop {
            let index = self.next.fetch_add(1, Ordering::Relaxed);
            if index >= self.chunks {
                return;
            }
            let start = index * self.chunk;
            let count = self.chunk.min(self.len - start);
            // SAFETY: `index < chunks`, so the call that owns the ranges has not returned
            // (it waits for this chunk in `wait_done`); `start + count <= len`, and chunks are
            // disjoint, each copied by the one thread that claimed it.
            unsafe {
                copy_run(
                    (self.source + start) as *const u8,
                    (self.destination + start) as *mut u8,
                    count,
                );
            }
            let finished = self.done.fetch_add(1, Ordering::Release) + 1 == self.chunks;
            #[cfg(test)]
            if helping {
                tests::HELPED_CHUNKS.fetch_add(1, Ordering::Relaxed);
            }
            if finished && helping {
                self.owner.unpark();
            }
        }
    }

    /// Returns once every chunk is copied. Called by the owner once it finds nothing left to
    /// claim, so at most the chunk each helper is copying right now remains: spun for briefly
    /// (it is often about to end), then slept on until the helper that ends the last chunk
    /// wakes the owner.
    fn wait_done(&self) {
        for _ in 0..1000 {
            if self.done.load(Ordering::Acquire) == self.chunks {
                return;
            }
            std::hint::spin_loop();
        }
        // `park` returns at once if the unpark came first, and may return early: hence the loop.
        while self.done.load(Ordering::Acquire) < self.chunks {
            thread::park();
        }
    }
}

/// Copies one run of a large copy (a chunk: a few MiB, but for the last): with non-temporal
/// stores where the processor has them (AVX), else as libc does.
///
/// Non-temporal stores write the destination without reading it into the cache first: a
/// plain copy of data larger than the cache reads the destination line by line only to
/// overwrite it, a third of its memory traffic. glibc switches to such stores only past a
/// threshold derived from the cache size, which virtual machines report far too large (288 MiB
/// on a 2-vCPU AMD EPYC one), so its large copies never use them there. Measured on that
/// virtual machine, 64 MiB: 2.3 ms with streaming stores against 2.9 ms with memcpy on one thread,
/// 1.2 against 1.4 ms on two. What the destination is for (a client's shared memory, read by
/// another process after the answer) gains nothing from being left in our cache.
///
/// # Safety
/// As [`copy_nonoverlapping`].
unsafe fn copy_run(source: *const u8, destination: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx") {
        // SAFETY: AVX is present (checked just above; the check is cached by std); the
        // ranges are the caller's.
        unsafe { stream::copy(source, destination, len) };
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(source, destination, len) };
}

#[cfg(target_arch = "x86_64")]
mod stream {
    use std::arch::x86_64::{__m256i, _mm_sfence, _mm256_loadu_si256, _mm256_stream_si256};

    /// Bytes moved per loop turn: four 32-byte registers.
    const STEP: usize = 128;

    /// Copies with 32-byte non-temporal stores into the destination's aligned middle, plain
    /// copies for its unaligned head and the tail, then a store fence.
    ///
    /// # Safety
    /// The CPU has AVX; `source` is valid for reads and `destination` for writes of `len`
    /// bytes, the ranges do not overlap, and nothing else writes them during the call.
    #[target_feature(enable = "avx")]
    #[expect(
        clippy::cast_ptr_alignment,
        reason = "loads take any alignment; stores go to 32-byte aligned addresses (see below)"
    )]
    pub(super) unsafe fn copy(source: *const u8, destination: *mut u8, len: usize) {
        let head = destination.align_offset(32).min(len);
        let body = (len - head) / STEP * STEP;
        // SAFETY: `head <= len`: inside both ranges.
        unsafe { std::ptr::copy_nonoverlapping(source, destination, head) };
        let mut offset = head;
        while offset < head + body {
            // SAFETY: `offset + STEP <= head + body <= len`, inside both ranges; the stores'
            // addresses are 32-byte aligned (the head made `destination + head` so, and
            // `offset - head` is a multiple of STEP; were `align_offset` ever to give up,
            // `head == len` and `body == 0`, so no store runs); loads take any alignment.
            unsafe {
                let from = source.add(offset).cast::<__m256i>();
                let to = destination.add(offset).cast::<__m256i>();
                let a = _mm256_loadu_si256(from);
                let b = _mm256_loadu_si256(from.add(1));
                let c = _mm256_loadu_si256(from.add(2));
                let d = _mm256_loadu_si256(from.add(3));
                _mm256_stream_si256(to, a);
                _mm256_stream_si256(to.add(1), b);
                _mm256_stream_si256(to.add(2), c);
                _mm256_stream_si256(to.add(3), d);
            }
            offset += STEP;
        }
        // SAFETY: the rest, `len - offset` bytes from `offset`, inside both ranges.
        unsafe {
            std::ptr::copy_nonoverlapping(
                source.add(offset),
                destination.add(offset),
                len - offset,
            );
        }
        // Streaming stores are weakly ordered: the fence makes them visible before whatever
        // this thread does next (counting the chunk done, answering the request).
        _mm_sfence();
    }
}

/// The parked helper threads and the copy they are asked to join.
struct Helpers {
    posted: Mutex<Posted>,
    wake: Condvar,
}

/// The copy the helpers are asked to join, with a serial so that a helper joins each once.
struct Posted {
    serial: u64,
    job: Option<Arc<Job>>,
}

impl Helpers {
    fn post(&self, job: &Arc<Job>) {
        let mut posted = self.posted.lock();
        posted.serial += 1;
        posted.job = Some(Arc::clone(job));
        drop(posted);
        self.wake.notify_all();
    }

    /// Takes `job` back down (unless a later copy has replaced it), so that no helper joins a
    /// copy that is over.
    fn withdraw(&self, job: &Arc<Job>) {
        let mut posted = self.posted.lock();
        if posted
            .job
            .as_ref()
            .is_some_and(|current| Arc::ptr_eq(current, job))
        {
            posted.job = None;
        }
    }

    fn serve(&self) {
        let mut joined = 0;
        loop {
            let job = {
                let mut posted = self.posted.lock();
                loop {
                    match &posted.job {
                        Some(job) if posted.serial != joined => {
                            joined = posted.serial;
                            break Arc::clone(job);
                        }
                        _ => self.wake.wait(&mut posted),
                    }
                }
            };
            // SAFETY: a posted job's ranges stay valid while it has unclaimed chunks (its
            // caller waits for all of them before returning), and `work` claims before it
            // copies.
            unsafe { job.work() };
        }
    }
}

/// The helpers, with how many threads a copy is shared by (the caller and the helpers that
/// started). Started on first use: one fewer than the cores this process may use (asked
/// once: the query reads cgroup files), within `MAX_COPY_THREADS`; none on a single core, or
/// if no thread could be started. (A process forked later has the helpers' state but not
/// their threads: its callers then claim every chunk themselves.)
fn helpers() -> Option<(&'static Helpers, usize)> {
    static HELPERS: OnceLock<Option<(&'static Helpers, usize)>> = OnceLock::new();
    *HELPERS.get_or_init(|| {
        let wanted = thread::available_parallelism().map_or(1, |n| n.get().min(MAX_COPY_THREADS));
        if wanted < 2 {
            return None;
        }
        let helpers: &'static Helpers = Box::leak(Box::new(Helpers {
            posted: Mutex::new(Posted {
                serial: 0,
                job: None,
            }),
            wake: Condvar::new(),
        }));
        let mut threads = 1;
        for index in 1..wanted {
            // Linux keeps 15 bytes of a thread's name.
            let spawned = thread::Builder::new()
                .name(format!("tf-copy-{index}"))
                .spawn(move || helpers.serve());
            threads += usize::from(spawned.is_ok());
        }
        (threads > 1).then_some((helpers, threads))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chunks copied by helper threads, over all tests.
    pub(super) static HELPED_CHUNKS: AtomicUsize = AtomicUsize::new(0);

    fn round_trip(len: usize) {
        let source: Vec<u8> = (0..len).map(|i| u8::try_from(i % 251).unwrap()).collect();
        let mut destination = vec![0u8; len];
        // SAFETY: two distinct vectors of `len` bytes.
        unsafe { copy_nonoverlapping(source.as_ptr(), destination.as_mut_ptr(), len) };
        assert!(source == destination, "len {len}");
    }

    #[test]
    fn copies_every_byte_small_and_large() {
        for len in [
            0,
            1,
            1000,
            PARALLEL_COPY_BYTES - 1,
            PARALLEL_COPY_BYTES,
            PARALLEL_COPY_BYTES + 4097,
            3 * PARALLEL_COPY_BYTES + MIN_CHUNK_BYTES / 2 + 1,
        ] {
            round_trip(len);
        }
    }

    #[test]
    fn streamed_runs_copy_unaligned_heads_and_tails() {
        let len = 4096 + 200;
        let source: Vec<u8> = (0..len).map(|i| u8::try_from(i % 253).unwrap()).collect();
        for (from, to, count) in [
            (0, 0, len),
            (1, 3, 4000),
            (5, 31, 129),
            (7, 0, 31),
            (0, 9, 0),
        ] {
            let mut destination = vec![0u8; len];
            // SAFETY: `from + count` and `to + count` are within the two distinct vectors.
            unsafe {
                copy_run(
                    source.as_ptr().add(from),
                    destination.as_mut_ptr().add(to),
                    count,
                );
            }
            assert_eq!(destination[to..to + count], source[from..from + count]);
            assert!(
                destination[..to].iter().all(|&b| b == 0),
                "{from} {to} {count}"
            );
            assert!(
                destination[to + count..].iter().all(|&b| b == 0),
                "{from} {to} {count}"
            );
        }
    }

    #[test]
    fn helpers_take_chunks_of_large_copies() {
        if helpers().is_none() {
            return; // one core: callers copy alone
        }
        // A parked helper needs tens of microseconds to wake, a chunk takes hundreds to copy:
        // it joins almost every copy; a few tries keep a busy machine from failing the test.
        let before = HELPED_CHUNKS.load(Ordering::Relaxed);
        for _ in 0..50 {
            round_trip(4 * PARALLEL_COPY_BYTES);
            if HELPED_CHUNKS.load(Ordering::Relaxed) > before {
                return;
            }
        }
        panic!("no helper took a chunk of 50 large copies");
    }

    #[test]
    fn concurrent_large_copies_share_the_helpers() {
        // More callers than helpers: each copy must still end whole, whoever copied its chunks.
        let callers: Vec<_> = (0..6)
            .map(|k| thread::spawn(move || round_trip(PARALLEL_COPY_BYTES + k * 4099)))
            .collect();
        for caller in callers {
            caller.join().unwrap();
        }
    }
}
