//! Just enough of the protobuf wire format to take large `bytes` fields out of a message
//! without copying them, and to read a message field by field ([`fields`]).
//!
//! A `ModelInferRequest` carries its tensors in `raw_input_contents` (field 7). Parsing it
//! with a protobuf library copies each tensor at least once more; instead the frontend asks
//! [`split_field`] where those payloads are, parses only the rest of the message, and views the
//! tensors in place.

use std::ops::Range;

use crate::error::CoreError;

/// Protobuf wire types.
const VARINT: u64 = 0;
const FIXED64: u64 = 1;
const LENGTH_DELIMITED: u64 = 2;
const FIXED32: u64 = 5;

/// A message without some field, and where that field's payloads were: `(start, end)` byte
/// ranges of the original message, in order.
pub type Split = (Vec<u8>, Vec<(usize, usize)>);

/// The message without the length-delimited occurrences of `field`, and the `(start, end)`
/// byte ranges of those occurrences' payloads within `message`, in order.
///
/// # Errors
/// `INVALID_ARG` when `message` is not well-formed protobuf at the top level.
pub fn split_field(message: &[u8], field: u64) -> Result<Split, CoreError> {
    let mut rest = Vec::new();
    let mut spans = Vec::new();
    let mut pos = 0;
    while pos < message.len() {
        let start = pos;
        let key = read_varint(message, &mut pos)?;
        let (number, wire_type) = (key >> 3, key & 7);
        let payload_start;
        match wire_type {
            VARINT => {
                read_varint(message, &mut pos)?;
                payload_start = pos;
            }
            FIXED64 => {
                pos = advance(message, pos, 8)?;
                payload_start = pos;
            }
            FIXED32 => {
                pos = advance(message, pos, 4)?;
                payload_start = pos;
            }
            LENGTH_DELIMITED => {
                let length = usize::try_from(read_varint(message, &mut pos)?)
                    .map_err(|_| malformed("length out of range"))?;
                payload_start = pos;
                pos = advance(message, pos, length)?;
            }
            _ => return Err(malformed("unsupported wire type")),
        }
        if number == field && wire_type == LENGTH_DELIMITED {
            spans.push((payload_start, pos));
        } else {
            rest.extend_from_slice(&message[start..pos]);
        }
    }
    Ok((rest, spans))
}

/// The key and length prefix of a length-delimited field: what precedes `length` payload
/// bytes of field `field` on the wire.
pub fn length_delimited_prefix(field: u64, length: u64) -> Vec<u8> {
    let mut prefix = Vec::with_capacity(12);
    write_varint(&mut prefix, (field << 3) | LENGTH_DELIMITED);
    write_varint(&mut prefix, length);
    prefix
}

fn malformed(what: &str) -> CoreError {
    CoreError::invalid_arg(format!("malformed protobuf message: {what}"))
}

fn advance(message: &[u8], pos: usize, by: usize) -> Result<usize, CoreError> {
    pos.checked_add(by)
        .filter(|&end| end <= message.len())
        .ok_or_else(|| malformed("a field runs past the end"))
}

fn read_varint(message: &[u8], pos: &mut usize) -> Result<u64, CoreError> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *message
            .get(*pos)
            .ok_or_else(|| malformed("a varint runs past the end"))?;
        *pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(malformed("a varint is longer than 10 bytes"))
}

fn write_varint(out: &mut Vec<u8>, mut value: u64) {
    // Each byte carries the low 7 bits; the masks make the narrowing casts exact.
    while value >= 0x80 {
        out.push((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    out.push((value & 0x7f) as u8);
}

// -- reading a message field by field ------------------------------------------------------

/// A field's value on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wire {
    Varint(u64),
    /// A length-delimited payload: its range in the message.
    Bytes(Range<usize>),
    Fixed,
}

/// A message that is not well-formed protobuf.
#[derive(Debug)]
pub struct Malformed;

/// The fields of the message `b[range]`, in order.
#[derive(Debug)]
pub struct Fields<'a> {
    b: &'a [u8],
    pos: usize,
    end: usize,
}

pub fn fields(b: &[u8], range: Range<usize>) -> Fields<'_> {
    Fields {
        b,
        pos: range.start,
        end: range.end,
    }
}

impl Fields<'_> {
    /// Whether every field has been read.
    pub fn at_end(&self) -> bool {
        self.pos >= self.end
    }

    pub fn varint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            if self.pos >= self.end {
                return None;
            }
            let byte = self.b[self.pos];
            self.pos += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    fn skip(&mut self, n: usize) -> Option<Range<usize>> {
        let start = self.pos;
        let end = start.checked_add(n).filter(|&e| e <= self.end)?;
        self.pos = end;
        Some(start..end)
    }

    /// The next field, `Ok(None)` at the end, an error for a malformed one.
    pub fn next_field(&mut self) -> Result<Option<(u64, Wire)>, Malformed> {
        if self.pos >= self.end {
            return Ok(None);
        }
        self.field().map(Some).ok_or(Malformed)
    }

    fn field(&mut self) -> Option<(u64, Wire)> {
        let key = self.varint()?;
        let value = match key & 7 {
            0 => Wire::Varint(self.varint()?),
            1 => {
                self.skip(8)?;
                Wire::Fixed
            }
            2 => {
                let n = usize::try_from(self.varint()?).ok()?;
                Wire::Bytes(self.skip(n)?)
            }
            5 => {
                self.skip(4)?;
                Wire::Fixed
            }
            _ => return None,
        };
        Some((key >> 3, value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(number: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = length_delimited_prefix(number, payload.len() as u64);
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn splits_out_every_occurrence_of_the_field() {
        let big = vec![7u8; 300]; // a two-byte length prefix
        let mut message = field(1, b"model");
        message.extend(field(7, &big));
        message.extend([0x10, 0x96, 0x01]); // field 2, varint 150
        message.extend(field(7, b""));
        message.extend([0x1d, 1, 2, 3, 4]); // field 3, fixed32
        message.extend([0x21, 1, 2, 3, 4, 5, 6, 7, 8]); // field 4, fixed64
        let (rest, spans) = split_field(&message, 7).unwrap();
        let mut expected = field(1, b"model");
        expected.extend([
            0x10, 0x96, 0x01, 0x1d, 1, 2, 3, 4, 0x21, 1, 2, 3, 4, 5, 6, 7, 8,
        ]);
        assert_eq!(rest, expected);
        assert_eq!(spans.len(), 2);
        assert_eq!(&message[spans[0].0..spans[0].1], &big[..]);
        assert_eq!(spans[1].0, spans[1].1);
    }

    #[test]
    fn rejects_malformed_messages() {
        for bad in [
            &[0x3a, 0x05, 1, 2][..], // length past the end
            &[0x3a, 0xff][..],       // truncated varint
            &[0x0b][..],             // group start: unsupported
            &[0x21, 1, 2][..],       // fixed64 cut short
            &[
                0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ][..],
        ] {
            assert!(split_field(bad, 7).is_err(), "{bad:?}");
        }
        assert_eq!(split_field(&[], 7).unwrap(), (vec![], vec![]));
    }

    #[test]
    fn prefixes_are_key_then_length() {
        assert_eq!(length_delimited_prefix(6, 3), [0x32, 3]);
        assert_eq!(length_delimited_prefix(6, 300), [0x32, 0xac, 0x02]);
    }
}
