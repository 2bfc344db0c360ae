//! The shared-memory segments a batch's tensors travel in: the server writes a batch's inputs
//! into a segment of its own ([`InputSegment`]), the worker its outputs into one of the
//! worker's, which the server maps by name ([`OutputSegment`]). Each side replaces its segment
//! by a larger one when a batch needs more room; the other side maps the new one when a
//! message names it. One batch is in flight per worker, so a segment is never written while
//! the other side reads it.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::CoreError;
use crate::shm::{AttachedSegment, OwnedSegment};

/// Numbers the segments this process creates, so that no two share a name.
static SERIALS: AtomicU64 = AtomicU64::new(1);

/// `<prefix>-<pid>-<n>`: the creator's pid next to last, as the sweep of what a killed server
/// left behind reads it (`memory/leftovers.py`).
fn segment_name(prefix: &str) -> String {
    let n = SERIALS.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{n}", std::process::id())
}

/// A new segment whose memory is taken now: the server writes all of it, and a page the
/// shared-memory file system cannot back would kill the server (SIGBUS) where this fails
/// with UNAVAILABLE.
fn backed_segment(prefix: &str, size: usize) -> Result<OwnedSegment, CoreError> {
    let segment = OwnedSegment::create(&segment_name(prefix), size)?;
    segment.reserve(size)?;
    Ok(segment)
}

/// Tensors start on 64-byte boundaries (cache lines), as the worker's writer places them.
pub const ALIGNMENT: usize = 64;
/// The first segment's size.
const FIRST_BYTES: usize = 1 << 20;

pub fn aligned(offset: usize) -> usize {
    offset.div_ceil(ALIGNMENT) * ALIGNMENT
}

/// The server's segment for one worker's inputs.
#[derive(Debug)]
pub struct InputSegment {
    prefix: String,
    current: Option<OwnedSegment>,
}

impl InputSegment {
    /// Segments named `<prefix>-<pid>-<n>` (removed when replaced or dropped).
    pub fn new(prefix: &str) -> Self {
        InputSegment {
            prefix: prefix.to_owned(),
            current: None,
        }
    }

    /// A segment of at least `len` bytes for the next batch, and its bare name (what the
    /// worker opens).
    pub fn reserve(&mut self, len: usize) -> Result<(&OwnedSegment, &str), CoreError> {
        if self.current.as_ref().is_none_or(|s| s.len() < len) {
            let size = len.max(FIRST_BYTES).next_power_of_two();
            self.current = None; // unlinked first: at most one segment per worker
            self.current = Some(backed_segment(&self.prefix, size)?);
        }
        let segment = self
            .current
            .as_ref()
            .ok_or_else(|| CoreError::internal("no segment"))?;
        Ok((segment, segment.name().trim_start_matches('/')))
    }
}

/// The server's view of one worker's output segment.
#[derive(Debug, Default)]
pub struct OutputSegment {
    current: Option<AttachedSegment>,
}

impl OutputSegment {
    /// The bytes a reply's output slots are within: those of the segment it names (`len`
    /// bytes), or, when it names none, `inline`, what the reply itself carries.
    pub fn of_reply<'a>(
        &'a mut self,
        name: &str,
        len: u64,
        inline: &'a [u8],
    ) -> Result<&'a [u8], CoreError> {
        if name.is_empty() {
            return Ok(inline);
        }
        self.bytes(name, usize::try_from(len).unwrap_or(usize::MAX))
    }

    /// The bytes of the segment `name` (`len` bytes), mapped again when the worker replaced it.
    pub fn bytes(&mut self, name: &str, len: usize) -> Result<&[u8], CoreError> {
        if self
            .current
            .as_ref()
            .is_none_or(|s| s.name() != name || s.len() < len)
        {
            self.current = None;
            self.current = Some(AttachedSegment::attach(name, len)?);
        }
        let segment = self
            .current
            .as_ref()
            .ok_or_else(|| CoreError::internal("no segment"))?;
        // SAFETY: the worker wrote these bytes before its reply and writes no more until the
        // next batch, which is sent only after the server is done reading them; the mapping
        // lives as long as `self.current`, which the returned borrow keeps.
        Ok(unsafe { std::slice::from_raw_parts(segment.start(), segment.len()) })
    }
}

/// One byte per request of the batch a worker runs, raised when that request's caller went
/// away: the worker's requests read theirs (`request.is_cancelled()` in the model).
#[derive(Debug)]
pub struct CancelFlags {
    segment: OwnedSegment,
}

/// Requests of a batch past this many are never seen cancelled while they run.
pub const CANCEL_FLAGS: usize = 4096;

impl CancelFlags {
    /// A segment named `<prefix>-<pid>-<n>`.
    pub fn new(prefix: &str) -> Result<Self, CoreError> {
        Ok(CancelFlags {
            segment: backed_segment(prefix, CANCEL_FLAGS)?,
        })
    }

    /// Its bare name (what the worker opens) and length.
    pub fn name(&self) -> &str {
        self.segment.name().trim_start_matches('/')
    }

    pub fn len(&self) -> usize {
        self.segment.len()
    }

    pub fn is_empty(&self) -> bool {
        self.segment.is_empty()
    }

    /// Lowers the first `count` flags, before a batch of `count` requests is sent.
    pub fn clear(&self, count: usize) {
        // SAFETY: at most the segment's length is written; the worker reads these bytes only
        // while running the batch sent after this.
        unsafe { std::ptr::write_bytes(self.segment.start(), 0, count.min(CANCEL_FLAGS)) };
    }

    /// Raises request `index`'s flag.
    pub fn raise(&self, index: usize) {
        if index < CANCEL_FLAGS {
            // SAFETY: within the segment; a byte the worker only reads (a racy read of a byte
            // that goes from 0 to 1 once, as the flags of the pipe's path are).
            unsafe { self.segment.start().add(index).write_volatile(1) };
        }
    }
}
