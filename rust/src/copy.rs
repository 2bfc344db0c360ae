//! Copying large tensors on several threads.
//!
//! One core copies memory at a fraction of what the memory system can move; splitting a
//! multi-MiB copy across two cores finishes it in about half the time on the 2-core
//! development machine. Small copies stay on the calling thread.
//!
//! The helpers are threads started once and parked between copies, not threads spawned per
//! copy: a thread spawned by a process that has been idle for a few milliseconds is placed on
//! its parent's core (both look equally idle to the scheduler) and only runs once the parent
//! blocks, which made a 64 MiB copy after an idle gap as slow as one thread's (3.8 ms against
//! 1.9 ms back to back, measured). Waking a parked thread goes to an idle core instead.
//!
//! A copy is cut into chunks that the caller and the helpers claim one at a time, so a helper
//! that wakes late (or not at all, while it serves another copy) only takes fewer chunks: the
//! caller never waits for work that nobody has started.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;

use parking_lot::{Condvar, Mutex};

/// Below this many bytes a copy runs on the calling thread.
pub const PARALLEL_COPY_BYTES: usize = 8 << 20;
/// Never more threads (the caller and its helpers) than this for one copy.
const MAX_COPY_THREADS: usize = 4;
/// Chunks are at least this large: libc copies a block this size with non-temporal stores
/// (past its cache-size threshold), which two threads need to double their speed. Measured
/// on two threads, 64 MiB of heap memory took 2.9 ms in 1 MiB pieces, 1.4 ms in 32 MiB ones.
const MIN_CHUNK_BYTES: usize = 4 << 20;
/// Each thread gets about this many chunks: enough that a helper that wakes late still takes
/// a share of what is left.
const CHUNKS_PER_THREAD: usize = 2;

/// Copies `len` bytes from `source` to `destination`.
///
/// # Safety
/// `source` must be valid for reads and `destination` for writes of `len` bytes, the two
/// ranges must not overlap, and nothing else may write either range during the call.
pub unsafe fn copy_nonoverlapping(source: *const u8, destination: *mut u8, len: usize) {
    let helpers = if len < PARALLEL_COPY_BYTES {
        None
    } else {
        helpers()
    };
    let Some(helpers) = helpers else {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(source, destination, len) };
        return;
    };
    let chunk = len
        .div_ceil(helpers.threads * CHUNKS_PER_THREAD)
        .max(MIN_CHUNK_BYTES)
        .next_multiple_of(64);
    let job = Arc::new(Job {
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
                std::ptr::copy_nonoverlapping(
                    (self.source + start) as *const u8,
                    (self.destination + start) as *mut u8,
                    count,
                );
            }
            self.done.fetch_add(1, Ordering::Release);
        }
    }

    /// Returns once every chunk is copied: the caller's last chunk is done, so at most the
    /// chunk each helper is copying right now remains (well under a millisecond).
    fn wait_done(&self) {
        let mut spins = 0u32;
        while self.done.load(Ordering::Acquire) < self.chunks {
            if spins < 1000 {
                std::hint::spin_loop();
                spins += 1;
            } else {
                thread::yield_now();
            }
        }
    }
}

/// The parked helper threads and the copy they are asked to join.
struct Helpers {
    /// Threads a copy is shared by: the caller and the helpers.
    threads: usize,
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

/// The helpers, started on first use: one fewer than the cores this process may use (asked
/// once: the query reads cgroup files), within `MAX_COPY_THREADS`; none on a single core, or
/// if no thread could be started.
fn helpers() -> Option<&'static Helpers> {
    static HELPERS: OnceLock<Option<&'static Helpers>> = OnceLock::new();
    *HELPERS.get_or_init(|| {
        let threads = thread::available_parallelism().map_or(1, |n| n.get().min(MAX_COPY_THREADS));
        if threads < 2 {
            return None;
        }
        let helpers: &'static Helpers = Box::leak(Box::new(Helpers {
            threads,
            posted: Mutex::new(Posted {
                serial: 0,
                job: None,
            }),
            wake: Condvar::new(),
        }));
        for index in 1..threads {
            let spawned = thread::Builder::new()
                .name(format!("tritonfast-copy-{index}"))
                .spawn(move || helpers.serve());
            if spawned.is_err() {
                return None; // copies stay on their callers' threads
            }
        }
        Some(helpers)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
