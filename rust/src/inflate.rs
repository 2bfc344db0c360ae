//! Inflating a compressed request body (HTTP `Content-Encoding: gzip` or `deflate`) in bounded
//! steps, with no Python involved between them.
//!
//! Why here: Python's `zlib` lets go of the GIL only inside each `inflate` call; between calls
//! it joins the output into a `bytes` object and copies the input's unconsumed tail with the
//! GIL held, and takes the GIL back after every call. A body that inflates to hundreds of MiB
//! then makes thousands of GIL hand-overs, and the event loop, which answers every other
//! client, waits at each. Here a whole step (many MiB) runs without the GIL and writes straight
//! into the body's buffer; the caller checks its size bound and memory budget between steps.
//!
//! The inflating is zlib's own (`zlib-rs`, a port of it), set up as zlib's `windowBits = 15 +
//! 32`, the setting Triton inflates request bodies with: the gzip magic means
//! gzip (RFC 1952), anything else zlib (RFC 1950). So the outcomes are zlib's to the byte: the
//! first gzip member ends the body (what follows is ignored); input that stops early leaves
//! what inflated so far (`Truncated`); corrupt data, a bad header or a wrong checksum is
//! `Corrupt`.

use flate2::{Decompress, FlushDecompress, Status};

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const WINDOW_BITS: u8 = 15;
/// The first room an inflated body gets.
const MIN_ROOM: usize = 1 << 16;

/// Where an inflater stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InflateState {
    /// More output may come: call [`Inflater::step`] again.
    Running,
    /// The compressed stream ended properly.
    Ended,
    /// The input stopped before the stream's end: the output so far is all there is.
    Truncated,
    /// The input is not a valid zlib or gzip stream (from some point on).
    Corrupt,
}

/// Inflates one body, step by step, into a buffer it owns.
pub struct Inflater {
    input: Vec<u8>,
    /// Input bytes consumed.
    pos: usize,
    inner: Decompress,
    out: Vec<u8>,
    state: InflateState,
}

impl std::fmt::Debug for Inflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inflater")
            .field("input", &self.input.len())
            .field("pos", &self.pos)
            .field("out", &self.out.len())
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl Inflater {
    /// An inflater of `input`, a whole compressed body.
    pub fn new(input: Vec<u8>) -> Self {
        // zlib's automatic choice (windowBits + 32) made here, as zlib makes it: it waits for
        // two bytes, then looks for the gzip magic.
        let state = if input.len() < 2 {
            InflateState::Truncated
        } else {
            InflateState::Running
        };
        let inner = if input.starts_with(&GZIP_MAGIC) {
            Decompress::new_gzip(WINDOW_BITS)
        } else {
            Decompress::new_with_window_bits(true, WINDOW_BITS)
        };
        Self {
            input,
            pos: 0,
            inner,
            out: Vec::new(),
            state,
        }
    }

    pub fn state(&self) -> InflateState {
        self.state
    }

    /// Inflates up to `max_out` more bytes (fewer when the stream ends or breaks first) and
    /// returns the total inflated so far.
    pub fn step(&mut self, max_out: usize) -> usize {
        if self.state != InflateState::Running || max_out == 0 {
            return self.out.len();
        }
        let target = self.out.len().saturating_add(max_out);
        while self.state == InflateState::Running && self.out.len() < target {
            let (in_before, out_before) = (self.inner.total_in(), self.out.len());
            if self.out.capacity() == out_before {
                // Room as the body grows (doubling, from 64 KiB), never past this step's end:
                // a small body takes a small buffer, a large one not twice its size.
                let room = (target - out_before).min(out_before.max(MIN_ROOM));
                self.out.reserve_exact(room);
            }
            // `decompress_vec` writes into the spare capacity, which ends at `target` at most.
            let status = self.inner.decompress_vec(
                &self.input[self.pos..],
                &mut self.out,
                FlushDecompress::None,
            );
            self.advance(status.ok(), in_before, out_before);
        }
        self.out.len()
    }

    fn advance(
        &mut self,
        // None: the decompressor found the data corrupt.
        status: Option<Status>,
        in_before: u64,
        out_before: usize,
    ) {
        let consumed = usize::try_from(self.inner.total_in() - in_before).unwrap_or(usize::MAX);
        self.pos = self.pos.saturating_add(consumed).min(self.input.len());
        let produced = self.out.len() - out_before;
        match status {
            Some(Status::StreamEnd) => self.state = InflateState::Ended,
            Some(Status::Ok | Status::BufError) => {
                if consumed == 0 && produced == 0 && self.out.len() < self.out.capacity() {
                    // Room to write and nothing moved: the input ran out.
                    self.state = InflateState::Truncated;
                }
            }
            None => self.state = InflateState::Corrupt,
        }
    }

    /// The inflated bytes.
    pub fn into_output(self) -> Vec<u8> {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use flate2::Compression;
    use flate2::write::{GzEncoder, ZlibEncoder};

    use super::*;

    const GZIP_TRAILER_BYTES: usize = 8;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    fn zlib(data: &[u8]) -> Vec<u8> {
        let mut encoder = ZlibEncoder::new(Vec::new(), Compression::default());
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    fn inflate_all(input: Vec<u8>, step: usize) -> (Vec<u8>, InflateState) {
        let mut inflater = Inflater::new(input);
        while inflater.state() == InflateState::Running {
            inflater.step(step);
        }
        let state = inflater.state();
        (inflater.into_output(), state)
    }

    fn sample() -> Vec<u8> {
        (0..300_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect()
    }

    #[test]
    fn inflates_gzip_and_zlib_in_steps_of_any_size() {
        let data = sample();
        for compressed in [gzip(&data), zlib(&data)] {
            for step in [1, 1000, 1 << 16, 1 << 24] {
                let (out, state) = inflate_all(compressed.clone(), step);
                assert_eq!(state, InflateState::Ended);
                assert_eq!(out, data);
            }
        }
    }

    #[test]
    fn a_step_never_inflates_more_than_asked() {
        let data = vec![b' '; 1 << 20];
        let mut inflater = Inflater::new(gzip(&data));
        assert_eq!(inflater.step(4096), 4096);
        assert_eq!(inflater.step(10_000), 14_096);
        assert_eq!(inflater.state(), InflateState::Running);
    }

    #[test]
    fn what_follows_the_first_gzip_member_is_ignored() {
        let mut input = gzip(b"first");
        input.extend(gzip(b"second"));
        assert_eq!(
            inflate_all(input, 100),
            (b"first".to_vec(), InflateState::Ended)
        );
    }

    #[test]
    fn cut_short_input_keeps_what_inflated() {
        let data = sample();
        for compressed in [gzip(&data), zlib(&data)] {
            let cut = compressed[..compressed.len() / 2].to_vec();
            let (out, state) = inflate_all(cut, 1 << 16);
            assert_eq!(state, InflateState::Truncated);
            assert!(!out.is_empty() && data.starts_with(&out));
        }
        // Without its trailer, or with half a header.
        let whole = gzip(b"abc");
        let no_trailer = whole[..whole.len() - GZIP_TRAILER_BYTES].to_vec();
        assert_eq!(
            inflate_all(no_trailer, 10),
            (b"abc".to_vec(), InflateState::Truncated)
        );
        assert_eq!(
            inflate_all(whole[..5].to_vec(), 10),
            (vec![], InflateState::Truncated)
        );
        assert_eq!(
            inflate_all(vec![0x78], 10),
            (vec![], InflateState::Truncated)
        );
    }

    #[test]
    fn corrupt_input_is_told_apart() {
        let mut bad_crc = gzip(b"hello");
        let at = bad_crc.len() - GZIP_TRAILER_BYTES;
        bad_crc[at] ^= 1;
        assert_eq!(inflate_all(bad_crc, 10).1, InflateState::Corrupt);
        let mut bad_adler = zlib(b"hello");
        let last = bad_adler.len() - 1;
        bad_adler[last] ^= 1;
        assert_eq!(inflate_all(bad_adler, 10).1, InflateState::Corrupt);
        assert_eq!(
            inflate_all(b"not compressed".to_vec(), 10).1,
            InflateState::Corrupt
        );
        let mut bad_method = gzip(b"x");
        bad_method[2] = 7;
        assert_eq!(inflate_all(bad_method, 10).1, InflateState::Corrupt);
    }

    #[test]
    fn gzip_headers_with_optional_fields_are_skipped() {
        let mut input = gzip(b"payload");
        // FEXTRA (2 bytes of extra), FNAME and FCOMMENT inserted after the fixed header.
        input[3] |= 0x04 | 0x08 | 0x10;
        let mut fields = vec![2, 0, b'x', b'y'];
        fields.extend(b"name\0comment\0");
        input.splice(10..10, fields);
        assert_eq!(
            inflate_all(input, 3),
            (b"payload".to_vec(), InflateState::Ended)
        );
    }
}
