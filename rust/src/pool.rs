//! Recycled tensor buffers in power-of-two size classes.
//!
//! Assembling a batch (or an output) allocates a buffer of a size that repeats from batch to
//! batch; taking it from a pool instead of the allocator avoids page faults on fresh memory,
//! which for large tensors cost more than the copy itself. A [`PoolBuffer`] returns to its
//! class when dropped; each class keeps at most [`TensorPool::max_free_per_class`] buffers, so an
//! idle pool holds a bounded amount of memory.
//!
//! The pool hands out plain heap memory. Buffers are addressed by pointer and length only,
//! so the same free lists can later manage ranges of a shared-memory segment.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// Smallest size class (smaller requests get this many bytes).
const MIN_CLASS_BYTES: usize = 256;
/// Number of size classes: 256 B up to 2^(8 + 32 - 1) B; larger requests are not pooled.
const CLASSES: usize = 32;
/// Buffers start on this boundary (what SIMD loops and DMA engines like).
const ALIGN: usize = 64;

/// Counters a pool keeps (cumulative, read without locks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Buffers served by a fresh allocation.
    pub allocated: u64,
    /// Buffers served from a free list.
    pub reused: u64,
    /// Bytes copied into pool buffers by [`TensorPool::gather`].
    pub bytes_gathered: u64,
}

#[derive(Default)]
struct Counters {
    allocated: AtomicU64,
    reused: AtomicU64,
    bytes_gathered: AtomicU64,
}

/// 64-byte aligned bytes; the unit the free lists hold.
struct Block {
    // `Vec` of cache-line-sized chunks gives the alignment without a custom allocator.
    chunks: Vec<Chunk>,
}

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Chunk([u8; ALIGN]);

impl Block {
    fn new(bytes: usize) -> Self {
        Self {
            chunks: vec![Chunk([0; ALIGN]); bytes.div_ceil(ALIGN)],
        }
    }

    fn capacity(&self) -> usize {
        self.chunks.len() * ALIGN
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.chunks.as_mut_ptr().cast()
    }
}

struct Shared {
    free: Vec<Mutex<Vec<Block>>>,
    max_free_per_class: usize,
    counters: Counters,
}

/// A pool of tensor buffers. Cheap to clone (clones share the free lists); thread-safe.
#[derive(Clone)]
pub struct TensorPool {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for TensorPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorPool")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Default for TensorPool {
    fn default() -> Self {
        Self::new(4)
    }
}

impl TensorPool {
    /// A pool that keeps up to `max_free_per_class` idle buffers of each size class.
    pub fn new(max_free_per_class: usize) -> Self {
        Self {
            shared: Arc::new(Shared {
                free: (0..CLASSES).map(|_| Mutex::new(Vec::new())).collect(),
                max_free_per_class,
                counters: Counters::default(),
            }),
        }
    }

    pub fn max_free_per_class(&self) -> usize {
        self.shared.max_free_per_class
    }

    /// A buffer of `len` bytes (contents unspecified), recycled when one of its class is free.
    pub fn acquire(&self, len: usize) -> PoolBuffer {
        let class = size_class(len);
        let counters = &self.shared.counters;
        let recycled = class.and_then(|class| self.shared.free[class].lock().pop());
        let block = if let Some(block) = recycled {
            counters.reused.fetch_add(1, Ordering::Relaxed);
            block
        } else {
            counters.allocated.fetch_add(1, Ordering::Relaxed);
            Block::new(class.map_or(len, class_bytes))
        };
        PoolBuffer {
            block: Some(block),
            len,
            class,
            pool: Arc::clone(&self.shared),
        }
    }

    /// One buffer holding `parts` back to back (a batch's inputs concatenated along the batch
    /// dimension).
    pub fn gather(&self, parts: &[&[u8]]) -> PoolBuffer {
        let total = parts.iter().map(|part| part.len()).sum();
        let mut buffer = self.acquire(total);
        let mut offset = 0;
        let bytes = buffer.as_mut_slice();
        for part in parts {
            bytes[offset..offset + part.len()].copy_from_slice(part);
            offset += part.len();
        }
        self.shared
            .counters
            .bytes_gathered
            .fetch_add(total as u64, Ordering::Relaxed);
        buffer
    }

    pub fn stats(&self) -> PoolStats {
        let counters = &self.shared.counters;
        PoolStats {
            allocated: counters.allocated.load(Ordering::Relaxed),
            reused: counters.reused.load(Ordering::Relaxed),
            bytes_gathered: counters.bytes_gathered.load(Ordering::Relaxed),
        }
    }

    /// Idle buffers held per size class (for tests and diagnostics).
    pub fn idle_buffers(&self) -> usize {
        self.shared.free.iter().map(|list| list.lock().len()).sum()
    }
}

/// The size class of a `len`-byte request; None when it is too large to pool.
fn size_class(len: usize) -> Option<usize> {
    let bytes = len.max(MIN_CLASS_BYTES).checked_next_power_of_two()?;
    let class = (bytes.trailing_zeros() - MIN_CLASS_BYTES.trailing_zeros()) as usize;
    (class < CLASSES).then_some(class)
}

fn class_bytes(class: usize) -> usize {
    MIN_CLASS_BYTES << class
}

/// A buffer on loan from a [`TensorPool`]; goes back to the pool when dropped.
pub struct PoolBuffer {
    block: Option<Block>,
    len: usize,
    class: Option<usize>,
    pool: Arc<Shared>,
}

impl std::fmt::Debug for PoolBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolBuffer")
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .finish_non_exhaustive()
    }
}

impl PoolBuffer {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes actually reserved (the size class), at least `len`.
    pub fn capacity(&self) -> usize {
        self.block.as_ref().map_or(0, Block::capacity)
    }

    /// Start of the buffer: 64-byte aligned, valid for `len` bytes while `self` lives, and
    /// never moved (the block's heap allocation is not reallocated while on loan).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.block
            .as_mut()
            .map_or(std::ptr::null_mut(), Block::as_mut_ptr)
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = self.len;
        let ptr = self.as_mut_ptr();
        // SAFETY: `ptr` starts a live allocation of `capacity() >= len` initialized bytes
        // (blocks are zero-filled when created) that only this `PoolBuffer` can reach, and the
        // returned slice borrows `self` mutably, so nothing else aliases it meanwhile.
        unsafe { std::slice::from_raw_parts_mut(ptr, len) }
    }

    pub fn as_slice(&self) -> &[u8] {
        let Some(block) = self.block.as_ref() else {
            return &[];
        };
        // SAFETY: as in `as_mut_slice`; the shared borrow of `self` keeps writers out.
        unsafe { std::slice::from_raw_parts(block.chunks.as_ptr().cast(), self.len) }
    }
}

impl Drop for PoolBuffer {
    fn drop(&mut self) {
        let (Some(block), Some(class)) = (self.block.take(), self.class) else {
            return;
        };
        let mut free = self.pool.free[class].lock();
        if free.len() < self.pool.max_free_per_class {
            free.push(block);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_are_powers_of_two_from_256_bytes() {
        assert_eq!(size_class(0), Some(0));
        assert_eq!(size_class(256), Some(0));
        assert_eq!(size_class(257), Some(1));
        assert_eq!(size_class(4 << 20), Some(14));
        assert_eq!(class_bytes(14), 4 << 20);
        assert_eq!(size_class(usize::MAX), None);
    }

    #[test]
    fn buffers_are_aligned_and_recycled_per_class() {
        let pool = TensorPool::new(2);
        let mut first = pool.acquire(1000);
        assert_eq!(first.len(), 1000);
        assert_eq!(first.capacity(), 1024);
        assert_eq!(first.as_mut_ptr() as usize % ALIGN, 0);
        let address = first.as_mut_ptr() as usize;
        drop(first);
        let mut again = pool.acquire(700); // same class (1024)
        assert_eq!(again.as_mut_ptr() as usize, address);
        assert_eq!(
            pool.stats(),
            PoolStats {
                allocated: 1,
                reused: 1,
                bytes_gathered: 0
            }
        );
        let other = pool.acquire(5000); // another class: fresh
        assert_eq!(other.capacity(), 8192);
        assert_eq!(pool.stats().allocated, 2);
    }

    #[test]
    fn idle_buffers_per_class_are_bounded() {
        let pool = TensorPool::new(2);
        let loans: Vec<_> = (0..5).map(|_| pool.acquire(300)).collect();
        drop(loans);
        assert_eq!(pool.idle_buffers(), 2);
    }

    #[test]
    fn gather_concatenates_parts_in_order() {
        let pool = TensorPool::default();
        let joined = pool.gather(&[b"abc", b"", b"defg"]);
        assert_eq!(joined.as_slice(), b"abcdefg");
        assert_eq!(pool.stats().bytes_gathered, 7);
        let empty = pool.gather(&[]);
        assert!(empty.is_empty());
    }

    #[test]
    fn pool_is_shared_across_threads() {
        let pool = TensorPool::new(8);
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let pool = pool.clone();
                std::thread::spawn(move || {
                    for round in 0..200u8 {
                        let part = [i, round];
                        let buffer = pool.gather(&[&part, &part]);
                        assert_eq!(buffer.as_slice(), &[i, round, i, round]);
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.join().unwrap();
        }
        let stats = pool.stats();
        assert_eq!(stats.allocated + stats.reused, 800);
        assert!(pool.idle_buffers() <= 8);
    }
}
