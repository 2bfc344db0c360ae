//! The shared-memory segments a batch's tensors travel in: the server writes a batch's inputs
//! into a segment of its own ([`InputSegment`]), the worker its outputs into one of the
//! worker's, which the server maps by name ([`OutputSegment`]). Each side replaces its segment
//! by a larger one when a batch needs more room; the other side maps the new one when a
//! message names it. One batch is in flight per worker, so a segment is never written while
//! the other side reads it.

use crate::error::CoreError;
use crate::shm::{AttachedSegment, OwnedSegment};

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
    serial: u64,
    current: Option<OwnedSegment>,
}

impl InputSegment {
    /// Segments named `<prefix>-<pid>-<serial>` (removed when replaced or dropped).
    pub fn new(prefix: &str) -> Self {
        InputSegment {
            prefix: format!("{prefix}-{}", std::process::id()),
            serial: 0,
            current: None,
        }
    }

    /// A segment of at least `len` bytes for the next batch, and its bare name (what the
    /// worker opens).
    pub fn reserve(&mut self, len: usize) -> Result<(&OwnedSegment, &str), CoreError> {
        if self.current.as_ref().is_none_or(|s| s.len() < len) {
            let size = len.max(FIRST_BYTES).next_power_of_two();
            self.current = None; // unlinked first: at most one segment per worker
            self.serial += 1;
            let name = format!("{}-{}", self.prefix, self.serial);
            self.current = Some(OwnedSegment::create(&name, size)?);
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
