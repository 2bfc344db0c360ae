//! Recycled tensor buffers in power-of-two size classes.
//!
//! Assembling a batch (or an output) allocates a buffer of a size that repeats from batch to
//! batch; taking it from a pool instead of the allocator avoids page faults on fresh memory,
//! which for large tensors cost more than the copy itself. A [`PoolBuffer`] returns to its
//! class when dropped; each class keeps at most [`TensorPool::max_free_per_class`] buffers, and
//! heap buffers of a mebibyte and more at most [`IDLE_MAPPED_BYTES`] between them, so an idle
//! pool holds a bounded amount of memory (a burst of large request bodies leaves little behind).
//!
//! A pool hands out heap memory, or, made with [`TensorPool::in_segment`], ranges of one
//! POSIX shared-memory segment it owns: such a buffer also has an [`offset`](PoolBuffer::offset)
//! in the segment, which is how another process that maps the segment by name finds the same
//! bytes (tensors passed between processes by offset, not copied through a pipe). Made with
//! [`TensorPool::in_objects`], each of its buffers is a shared-memory object of its own
//! ([`PoolBuffer::object`]), which another process maps by name: request bodies that a worker
//! reads where they were received.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::error::CoreError;
use crate::shm::OwnedSegment;

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

/// Heap blocks from this size on are mapped from the kernel directly: their pages are taken
/// only when first written (a body buffer that receives a few bytes holds a few pages), and
/// given back as soon as the block is freed, whatever the allocator's thresholds are.
const MAPPED_BYTES: usize = 1 << 20;

/// Mapped blocks ask for transparent huge pages past this many bytes ([`advise_huge_pages`]);
/// the head stays in small pages, so that a buffer written only a little (a body whose sender
/// stops early) holds only what was written.
const SMALL_PAGED_BYTES: usize = 2 << 20;
/// The huge page size the advice aims at (x86-64 and aarch64 with 4 KiB pages).
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// Asks the kernel to back the whole huge pages inside `start .. start + len` with transparent
/// huge pages (`MADV_HUGEPAGE`; most distributions enable them for advised ranges only).
/// Fresh anonymous memory is taken one page fault per page as it is first written: receiving
/// a 64 MiB request body into 4 KiB pages (16384 faults) cost the event loop 49 ms of CPU, in
/// 2 MiB pages (32 faults) 25-30 ms. Only the backing changes, never the contents; where
/// the kernel has no transparent huge pages the advice fails and changes nothing.
fn advise_huge_pages(start: *mut u8, len: usize) {
    let address = start as usize;
    let from = address.next_multiple_of(HUGE_PAGE_BYTES);
    let end = (address + len) / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
    if from < end {
        // SAFETY: advice on whole pages inside a mapping the caller owns.
        unsafe { libc::madvise(from as *mut libc::c_void, end - from, libc::MADV_HUGEPAGE) };
    }
}

/// The most bytes of idle mapped blocks the free lists of a heap pool keep, all classes
/// together; a large block freed past it goes back to the kernel.
pub const IDLE_MAPPED_BYTES: usize = 64 << 20;

/// 64-byte aligned bytes; the unit the free lists hold: heap memory, a range of the pool's
/// shared segment, or a shared-memory object of its own.
struct Block {
    start: *mut u8,
    capacity: usize,
    backing: Backing,
}

/// What a block's bytes are.
enum Backing {
    /// The heap's (mapped from the kernel from [`MAPPED_BYTES`] on).
    Heap,
    /// A range of the pool's segment, starting this far into it.
    Segment(usize),
    /// A shared-memory object of its own (a pool made with [`TensorPool::in_objects`]).
    Object(Box<ObjectBlock>),
}

/// A shared-memory object that is one block.
struct ObjectBlock {
    segment: OwnedSegment,
    /// Its first bytes whose memory is taken already ([`PoolBuffer::reserve`]).
    reserved: AtomicUsize,
}

/// Numbers the objects of this process's object pools, so that no two share a name.
static OBJECT_SERIALS: AtomicU64 = AtomicU64::new(1);

// SAFETY: a block is plain memory owned by the block (heap, or its own object) or by the
// pool's segment, which outlives it (buffers hold the pool); whoever holds the block has sole
// use of its bytes.
unsafe impl Send for Block {}
// SAFETY: `&Block` gives only the address and sizes; reading or writing the bytes goes through
// `PoolBuffer`, whose borrow rules (or the unsafe contracts of raw-pointer users) keep it sound.
unsafe impl Sync for Block {}

impl Block {
    /// Zeroed heap memory of at least `bytes` (and at least one chunk, so a layout exists).
    fn on_heap(bytes: usize) -> Result<Self, CoreError> {
        let capacity = bytes.max(1).next_multiple_of(ALIGN);
        let start = if capacity >= MAPPED_BYTES {
            // SAFETY: a fresh private anonymous mapping; no address hint, no descriptor.
            let mapped = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    capacity,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if mapped == libc::MAP_FAILED {
                return Err(CoreError::unavailable(format!(
                    "no memory for a buffer of {capacity} bytes"
                )));
            }
            if capacity > SMALL_PAGED_BYTES {
                // SAFETY: inside the mapping just made.
                let past_head = unsafe { mapped.cast::<u8>().add(SMALL_PAGED_BYTES) };
                advise_huge_pages(past_head, capacity - SMALL_PAGED_BYTES);
            }
            mapped.cast()
        } else {
            let layout = Self::layout(capacity);
            // SAFETY: the layout has a non-zero size.
            let start = unsafe { std::alloc::alloc_zeroed(layout) };
            if start.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            start
        };
        Ok(Self {
            start,
            capacity,
            backing: Backing::Heap,
        })
    }

    /// A new shared-memory object of `capacity` bytes, `<prefix>-<pid>-<n>` (the creator's pid
    /// next to last, as the sweep of what a killed server left behind reads it). Its memory is
    /// taken only as it is reserved or written.
    fn new_object(prefix: &str, capacity: usize) -> Result<Self, CoreError> {
        let serial = OBJECT_SERIALS.fetch_add(1, Ordering::Relaxed);
        let name = format!("{prefix}-{}-{serial}", std::process::id());
        let segment = OwnedSegment::create(&name, capacity)?;
        Ok(Self {
            start: segment.start(),
            capacity,
            backing: Backing::Object(Box::new(ObjectBlock {
                segment,
                reserved: AtomicUsize::new(0),
            })),
        })
    }

    /// Heap memory mapped from the kernel (see [`MAPPED_BYTES`]).
    fn mapped(&self) -> bool {
        matches!(self.backing, Backing::Heap) && self.capacity >= MAPPED_BYTES
    }

    /// Whether the block counts against the pool's idle bound while idle: memory of its own
    /// that the kernel gets back when it is dropped.
    fn idle_bounded(&self) -> bool {
        self.mapped() || matches!(self.backing, Backing::Object(_))
    }

    fn object(&self) -> Option<&ObjectBlock> {
        match &self.backing {
            Backing::Object(object) => Some(object),
            _ => None,
        }
    }

    fn layout(capacity: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(capacity, ALIGN).expect("a buffer size fits a layout")
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        // A range of the pool's segment goes with the segment; an object with its
        // `OwnedSegment` (unmapped and unlinked).
        if !matches!(self.backing, Backing::Heap) {
            return;
        }
        if self.mapped() {
            // SAFETY: mapped in `on_heap` with this length, and unmapped only here.
            unsafe { libc::munmap(self.start.cast(), self.capacity) };
        } else {
            // SAFETY: allocated in `on_heap` with this layout, and freed only here.
            unsafe { std::alloc::dealloc(self.start, Self::layout(self.capacity)) };
        }
    }
}

/// The segment a shared pool carves its blocks from, front to back; blocks are recycled
/// through the free lists, never returned to the segment.
struct SegmentArena {
    segment: OwnedSegment,
    next: Mutex<usize>,
}

impl SegmentArena {
    fn carve(&self, bytes: usize) -> Result<Block, CoreError> {
        let mut next = self.next.lock();
        let offset = *next;
        let end = bytes
            .checked_next_multiple_of(ALIGN)
            .and_then(|rounded| offset.checked_add(rounded))
            .filter(|&end| end <= self.segment.len())
            .ok_or_else(|| {
                CoreError::unavailable(format!(
                    "shared tensor pool '{}' is full ({} bytes)",
                    self.segment.name(),
                    self.segment.len()
                ))
            })?;
        *next = end;
        Ok(Block {
            // SAFETY: offset < end <= the segment's mapped length.
            start: unsafe { self.segment.start().add(offset) },
            capacity: end - offset,
            backing: Backing::Segment(offset),
        })
    }
}

struct Shared {
    free: Vec<Mutex<Vec<Block>>>,
    max_free_per_class: usize,
    /// Bytes of mapped blocks on the free lists (see [`IDLE_MAPPED_BYTES`]).
    idle_mapped: AtomicUsize,
    /// The most bytes `idle_mapped` may reach.
    idle_limit: usize,
    counters: Counters,
    arena: Option<SegmentArena>,
    /// The name prefix of a pool whose blocks are objects of their own.
    objects: Option<String>,
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
    /// A pool of heap buffers that keeps up to `max_free_per_class` idle buffers per class.
    pub fn new(max_free_per_class: usize) -> Self {
        Self::with_shared(max_free_per_class, None, None)
    }

    /// A pool whose buffers are ranges of a new shared-memory segment `name` of `bytes` bytes
    /// (created here, removed when the pool and its last buffer are gone).
    ///
    /// # Errors
    /// Those of [`OwnedSegment::create`].
    pub fn in_segment(
        name: &str,
        bytes: usize,
        max_free_per_class: usize,
    ) -> Result<Self, CoreError> {
        let arena = SegmentArena {
            segment: OwnedSegment::create(name, bytes)?,
            next: Mutex::new(0),
        };
        Ok(Self::with_shared(max_free_per_class, Some(arena), None))
    }

    /// A pool each of whose buffers is a shared-memory object of its own, named
    /// `<prefix>-<pid>-<n>` (removed when the buffer leaves the pool); idle ones are kept up
    /// to `idle_bytes` in all (their memory is the shared-memory file system's, which the
    /// server's segments need too).
    pub fn in_objects(prefix: &str, max_free_per_class: usize, idle_bytes: usize) -> Self {
        Self::with_shared(
            max_free_per_class,
            None,
            Some((prefix.to_owned(), idle_bytes)),
        )
    }

    fn with_shared(
        max_free_per_class: usize,
        arena: Option<SegmentArena>,
        objects: Option<(String, usize)>,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                free: (0..CLASSES).map(|_| Mutex::new(Vec::new())).collect(),
                max_free_per_class,
                idle_mapped: AtomicUsize::new(0),
                idle_limit: objects.as_ref().map_or(IDLE_MAPPED_BYTES, |o| o.1),
                counters: Counters::default(),
                arena,
                objects: objects.map(|(prefix, _)| prefix),
            }),
        }
    }

    /// The shared segment's POSIX name, for a pool made with [`TensorPool::in_segment`].
    pub fn segment_name(&self) -> Option<&str> {
        self.shared.arena.as_ref().map(|arena| arena.segment.name())
    }

    pub fn max_free_per_class(&self) -> usize {
        self.shared.max_free_per_class
    }

    /// A buffer of `len` bytes (contents unspecified), recycled when one of its class is free.
    ///
    /// # Errors
    /// Only from a shared pool: `UNAVAILABLE` when its segment has no room left.
    pub fn acquire(&self, len: usize) -> Result<PoolBuffer, CoreError> {
        let class = size_class(len);
        let counters = &self.shared.counters;
        let recycled = class.and_then(|class| self.shared.free[class].lock().pop());
        let block = if let Some(block) = recycled {
            counters.reused.fetch_add(1, Ordering::Relaxed);
            if block.idle_bounded() {
                self.shared
                    .idle_mapped
                    .fetch_sub(block.capacity, Ordering::Relaxed);
            }
            block
        } else {
            let shared = &self.shared;
            let block = match (&shared.arena, &shared.objects, class) {
                (Some(arena), _, Some(class)) => arena.carve(class_bytes(class))?,
                (None, Some(prefix), Some(class)) => Block::new_object(prefix, class_bytes(class))?,
                // A segment's ranges are never returned, so only pooled sizes come from it.
                (Some(_), _, None) | (None, Some(_), None) => {
                    return Err(CoreError::invalid_arg(format!(
                        "{len} bytes is too large for a shared tensor pool buffer"
                    )));
                }
                (None, None, class) => Block::on_heap(class.map_or(len, class_bytes))?,
            };
            counters.allocated.fetch_add(1, Ordering::Relaxed);
            block
        };
        Ok(PoolBuffer {
            block: Some(block),
            len,
            class,
            pool: Arc::clone(&self.shared),
        })
    }

    /// One buffer holding `parts` back to back (a batch's inputs concatenated along the batch
    /// dimension).
    ///
    /// # Errors
    /// Those of [`TensorPool::acquire`].
    pub fn gather(&self, parts: &[&[u8]]) -> Result<PoolBuffer, CoreError> {
        let total = parts.iter().map(|part| part.len()).sum();
        let mut buffer = self.acquire(total)?;
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
        Ok(buffer)
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
        self.block.as_ref().map_or(0, |block| block.capacity)
    }

    /// Where the buffer starts in its pool's shared segment (None for heap buffers).
    pub fn offset(&self) -> Option<usize> {
        match self.block.as_ref()?.backing {
            Backing::Segment(offset) => Some(offset),
            _ => None,
        }
    }

    /// The shared-memory object the buffer is, from its start (a pool made with
    /// [`TensorPool::in_objects`]).
    pub fn object(&self) -> Option<&OwnedSegment> {
        self.block.as_ref()?.object().map(|object| &object.segment)
    }

    /// Takes the memory of the buffer's first `len` bytes now, for an object buffer (see
    /// [`OwnedSegment::reserve`]); nothing for others, whose memory cannot run out that way.
    ///
    /// # Errors
    /// `UNAVAILABLE` when shared memory has no room for them.
    pub fn reserve(&self, len: usize) -> Result<(), CoreError> {
        let Some(object) = self.block.as_ref().and_then(Block::object) else {
            return Ok(());
        };
        let len = len.min(self.len);
        if object.reserved.load(Ordering::Acquire) >= len {
            return Ok(());
        }
        object.segment.reserve(len)?;
        object.reserved.fetch_max(len, Ordering::AcqRel);
        Ok(())
    }

    /// Start of the buffer: 64-byte aligned, valid for `len` bytes while `self` lives, and
    /// never moved (heap blocks are not reallocated, segments not remapped, while on loan).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.block
            .as_ref()
            .map_or(std::ptr::null_mut(), |block| block.start)
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = self.len;
        let ptr = self.as_mut_ptr();
        if ptr.is_null() {
            return &mut [];
        }
        // SAFETY: `ptr` starts a live block of `capacity() >= len` initialized bytes (heap
        // blocks are zero-filled, segment pages read as zeros until written) that only this
        // `PoolBuffer` reaches in this process, and the slice borrows `self` mutably.
        unsafe { std::slice::from_raw_parts_mut(ptr, len) }
    }

    pub fn as_slice(&self) -> &[u8] {
        let Some(block) = self.block.as_ref() else {
            return &[];
        };
        // SAFETY: as in `as_mut_slice`; the shared borrow of `self` keeps writers out.
        unsafe { std::slice::from_raw_parts(block.start, self.len) }
    }
}

impl Drop for PoolBuffer {
    fn drop(&mut self) {
        let (Some(block), Some(class)) = (self.block.take(), self.class) else {
            return;
        };
        let mut free = self.pool.free[class].lock();
        // Heap blocks beyond the bounds go back to the allocator; a segment's blocks must stay
        // on the list (their range of the segment would be lost otherwise).
        if matches!(block.backing, Backing::Segment(_)) {
            free.push(block);
        } else if free.len() < self.pool.max_free_per_class {
            if block.idle_bounded() {
                let idle = &self.pool.idle_mapped;
                let kept = idle.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                    Some(held + block.capacity).filter(|&total| total <= self.pool.idle_limit)
                });
                if kept.is_err() {
                    return; // dropped: unmapped
                }
            }
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
        let mut first = pool.acquire(1000).unwrap();
        assert_eq!(first.len(), 1000);
        assert_eq!(first.capacity(), 1024);
        assert_eq!(first.as_mut_ptr() as usize % ALIGN, 0);
        let address = first.as_mut_ptr() as usize;
        drop(first);
        let mut again = pool.acquire(700).unwrap(); // same class (1024)
        assert_eq!(again.as_mut_ptr() as usize, address);
        assert_eq!(
            pool.stats(),
            PoolStats {
                allocated: 1,
                reused: 1,
                bytes_gathered: 0
            }
        );
        let other = pool.acquire(5000).unwrap(); // another class: fresh
        assert_eq!(other.capacity(), 8192);
        assert_eq!(pool.stats().allocated, 2);
    }

    #[test]
    fn idle_buffers_per_class_are_bounded() {
        let pool = TensorPool::new(2);
        let loans: Vec<_> = (0..5).map(|_| pool.acquire(300).unwrap()).collect();
        drop(loans);
        assert_eq!(pool.idle_buffers(), 2);
    }

    #[test]
    fn gather_concatenates_parts_in_order() {
        let pool = TensorPool::default();
        let joined = pool.gather(&[b"abc", b"", b"defg"]).unwrap();
        assert_eq!(joined.as_slice(), b"abcdefg");
        assert_eq!(pool.stats().bytes_gathered, 7);
        let empty = pool.gather(&[]).unwrap();
        assert!(empty.is_empty());
    }

    #[test]
    fn a_shared_pool_hands_out_offsets_into_its_segment() {
        let name = format!("/tritonfast-test-{}-pool", std::process::id());
        let pool = TensorPool::in_segment(&name, 4096, 2).unwrap();
        assert_eq!(pool.segment_name(), Some(name.as_str()));
        let first = pool.gather(&[b"hello"]).unwrap();
        let second = pool.gather(&[b"world!"]).unwrap();
        assert_eq!((first.offset(), second.offset()), (Some(0), Some(256)));
        // What another process sees when it maps the segment by name.
        let seen = std::fs::read(format!("/dev/shm{name}")).unwrap();
        assert_eq!(&seen[256..262], b"world!");
        drop(first);
        let again = pool.acquire(10).unwrap();
        assert_eq!(again.offset(), Some(0), "recycled, not carved again");
        let full = pool.acquire(8192).unwrap_err();
        assert_eq!(full.code, crate::Code::Unavailable);
        assert!(
            pool.acquire(usize::MAX).is_err(),
            "no overflow, no huge buffer"
        );
        // More buffers than the idle bound come back to the list: no range is lost.
        let name2 = format!("{name}-b");
        let small = TensorPool::in_segment(&name2, 4 * 256, 1).unwrap();
        let loans: Vec<_> = (0..4).map(|_| small.acquire(10).unwrap()).collect();
        drop(loans);
        let reused: Vec<_> = (0..4).map(|_| small.acquire(10).unwrap()).collect();
        assert_eq!(small.stats().reused, 4);
        drop((reused, small));
        drop((pool, second, again));
        assert!(!std::path::Path::new(&format!("/dev/shm{name}")).exists());
    }

    #[test]
    fn an_object_pool_hands_out_objects_of_their_own() {
        let prefix = format!("/tritonfast-test-{}-objects", std::process::id());
        let pool = TensorPool::in_objects(&prefix, 2, IDLE_MAPPED_BYTES);
        let mut first = pool.acquire(3 << 20).unwrap();
        let object = first.object().unwrap();
        let path = format!("/dev/shm{}", object.name());
        assert!(object.name().starts_with(&prefix));
        assert_eq!(object.len(), 4 << 20, "the size class");
        first.reserve(1 << 20).unwrap();
        first.as_mut_slice()[..5].copy_from_slice(b"hello");
        // What another process sees when it maps the object by name, and its identity.
        let seen = std::fs::read(&path).unwrap();
        assert_eq!(&seen[..5], b"hello");
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(
            first.object().unwrap().identity(),
            Some((
                std::os::unix::fs::MetadataExt::dev(&meta),
                std::os::unix::fs::MetadataExt::ino(&meta)
            ))
        );
        drop(first);
        let again = pool.acquire(4 << 20).unwrap();
        assert_eq!(
            again.object().unwrap().name(),
            &path["/dev/shm".len()..],
            "recycled"
        );
        assert!(pool.acquire(usize::MAX).is_err(), "no huge object");
        drop((pool, again));
        // Past the idle bound, an object goes: unlinked.
        let pool = TensorPool::in_objects(&prefix, 8, 32 << 20);
        let held: Vec<_> = (0..5).map(|_| pool.acquire(16 << 20).unwrap()).collect();
        let names: Vec<String> = held
            .iter()
            .map(|b| b.object().unwrap().name().to_owned())
            .collect();
        drop(held);
        let left = names
            .iter()
            .filter(|name| std::path::Path::new(&format!("/dev/shm{name}")).exists());
        assert_eq!(left.count(), 2, "32 MiB of idle objects");
        drop(pool);
        assert!(
            names
                .iter()
                .all(|name| !std::path::Path::new(&format!("/dev/shm{name}")).exists())
        );
    }

    #[test]
    fn idle_large_buffers_are_kept_up_to_a_total() {
        let pool = TensorPool::new(8);
        let block = 16 << 20;
        let held: Vec<_> = (0..8).map(|_| pool.acquire(block).unwrap()).collect();
        drop(held);
        assert_eq!(
            pool.shared.idle_mapped.load(Ordering::Relaxed),
            IDLE_MAPPED_BYTES
        );
        // What was kept is reused, and taking it lowers the idle total.
        let again: Vec<_> = (0..5).map(|_| pool.acquire(block).unwrap()).collect();
        assert_eq!(pool.stats().reused, 4);
        assert_eq!(pool.shared.idle_mapped.load(Ordering::Relaxed), 0);
        drop(again);
        assert_eq!(
            pool.shared.idle_mapped.load(Ordering::Relaxed),
            IDLE_MAPPED_BYTES
        );
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
                        let buffer = pool.gather(&[&part, &part]).unwrap();
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

    /// The `VmFlags` of the mapping (in /proc/self/smaps) that holds `address`.
    fn vm_flags_at(address: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps readable");
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ')
                && let Some((low, high)) = range.split_once('-')
                && let (Ok(low), Ok(high)) = (
                    usize::from_str_radix(low, 16),
                    usize::from_str_radix(high, 16),
                )
            {
                inside = (low..high).contains(&address);
            } else if inside && let Some(flags) = line.strip_prefix("VmFlags:") {
                return flags.trim().to_owned();
            }
        }
        panic!("no mapping holds {address:#x}");
    }

    #[test]
    fn large_blocks_ask_for_huge_pages_past_their_head() {
        if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() {
            return; // a kernel without transparent huge pages refuses the advice
        }
        let pool = TensorPool::new(2);
        let mut buffer = pool.acquire(16 << 20).unwrap();
        let bytes = buffer.as_mut_slice();
        let start = bytes.as_ptr() as usize;
        let flags = |address| vm_flags_at(address).split(' ').any(|flag| flag == "hg");
        assert!(!flags(start), "the head stays in small pages");
        assert!(!flags(start + SMALL_PAGED_BYTES - 1));
        assert!(flags(start + 2 * SMALL_PAGED_BYTES.max(HUGE_PAGE_BYTES)));
        assert!(flags(start + bytes.len() - 1), "the rest is advised");
        // A block (of the 2 MiB class) with no whole huge page past its head is left alone.
        let small = pool.acquire(3 << 19).unwrap();
        let end = small.as_slice().as_ptr() as usize + small.as_slice().len() - 1;
        assert!(!flags(end));
    }
}
