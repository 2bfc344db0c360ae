//! HTTP answers to inference requests, written by the core: the response's JSON header
//! (`KServe` v2, as the server's reference encoder writes it, key order and number format
//! included) and the outputs asked for as binary data after it, with the status line and
//! headers; or an error's JSON body with Triton's HTTP status.

use std::fmt::Write as _;
use std::sync::Arc;

use super::message::Slot;
use super::regions;
use crate::error::{Code, CoreError};
use crate::infer::{CoreRequest, DataType};
use crate::outbox::{Stream, WriteError};

/// Binary outputs from this size on are sent from where they lie (the worker's segment)
/// instead of being copied into the answer; smaller ones are cheaper copied than sent apart.
const SENT_IN_PLACE_BYTES: usize = 64 * 1024;

/// An HTTP answer: its bytes up to its first large binary output, and the large outputs and
/// whatever follows them, borrowed from where they lie.
#[derive(Debug)]
pub struct HttpAnswer<'a> {
    pub head: Vec<u8>,
    pub tail: Vec<&'a [u8]>,
}

impl HttpAnswer<'_> {
    /// An answer whose bytes are all in `bytes`.
    pub fn whole(bytes: Vec<u8>) -> HttpAnswer<'static> {
        HttpAnswer {
            head: bytes,
            tail: Vec::new(),
        }
    }

    /// All its bytes in one buffer.
    pub fn into_bytes(self) -> Vec<u8> {
        let mut bytes = self.head;
        for part in self.tail {
            bytes.extend_from_slice(part);
        }
        bytes
    }

    /// Sends it on `stream` (see `Stream::write_parts_now`).
    pub fn write_now(&self, stream: &Arc<Stream>) -> Result<(), WriteError> {
        if self.tail.is_empty() {
            return stream.write_now(&self.head);
        }
        let mut parts = Vec::with_capacity(1 + self.tail.len());
        parts.push(self.head.as_slice());
        parts.extend_from_slice(&self.tail);
        stream.write_parts_now(&parts)
    }
}

/// How the connection reads the answer: HTTP/1.`minor`, and whether it stays open after.
#[derive(Debug, Clone, Copy)]
pub struct Framing {
    pub minor: u8,
    pub keep_alive: bool,
}

/// A response's fields and where its outputs' bytes are.
#[derive(Debug)]
pub struct ResponseParts<'a> {
    pub model_name: &'a str,
    pub model_version: &'a str,
    pub id: &'a str,
    /// A JSON object's text, or empty.
    pub parameters: &'a str,
    pub outputs: &'a [Slot],
    /// The bytes the slots' offsets are within.
    pub segment: &'a [u8],
    /// The request's body, where an output the worker found lying in it is (see
    /// [`regions::in_body`]); empty for a request whose body is not in a shared object.
    pub body: &'a [u8],
}

impl<'a> ResponseParts<'a> {
    /// Output `slot`'s bytes: in the worker's segment, or in the request's own body where the
    /// worker answered it lies there; None for one the worker wrote into a client's object.
    ///
    /// # Errors
    /// INTERNAL for bytes that are not where the slot says (a worker's fault).
    pub fn data(&self, request: &CoreRequest, slot: &Slot) -> Result<Option<&'a [u8]>, CoreError> {
        let Some(place) = &slot.place else {
            return slot_bytes(self.segment, slot).map(Some);
        };
        if !regions::is_body_place(request, place) {
            return Ok(None);
        }
        regions::in_body(request, place, self.body)
            .map(Some)
            .ok_or_else(|| {
                CoreError::internal(format!("output '{}' lies outside its body", slot.name))
            })
    }
}

/// Triton's `HttpCodeFromError`.
pub fn http_status(code: Code) -> u16 {
    match code {
        Code::Internal => 500,
        Code::NotFound => 404,
        Code::Unavailable => 503,
        Code::Unsupported => 501,
        Code::Unknown | Code::InvalidArg | Code::AlreadyExists | Code::Cancelled => 400,
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        _ => "",
    }
}

fn head(
    out: &mut Vec<u8>,
    status: u16,
    content_type: &str,
    length: usize,
    extra: &str,
    framing: Framing,
) {
    let connection = match (framing.keep_alive, framing.minor) {
        (true, 0) => "Connection: keep-alive\r\n",
        (false, m) if m >= 1 => "Connection: close\r\n",
        _ => "",
    };
    let mut text = String::with_capacity(128);
    let _ = write!(
        text,
        "HTTP/1.{} {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {length}\r\n\
         {extra}{connection}\r\n",
        framing.minor,
        reason(status)
    );
    out.extend_from_slice(text.as_bytes());
}

/// The answer to a failed request: `{"error": message}` with the code's status.
pub fn error_answer(error: &CoreError, framing: Framing) -> Vec<u8> {
    json_answer(
        http_status(error.code),
        &error_json(&error.message),
        framing,
    )
}

/// `{"error": message}`.
pub fn error_json(message: &str) -> Vec<u8> {
    let mut body = Vec::with_capacity(message.len() + 16);
    body.extend_from_slice(b"{\"error\":");
    json_string(&mut body, message.as_bytes());
    body.push(b'}');
    body
}

/// An answer of `status` whose body is the JSON document `body`.
pub fn json_answer(status: u16, body: &[u8], framing: Framing) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 128);
    head(
        &mut out,
        status,
        "application/json",
        body.len(),
        "",
        framing,
    );
    out.extend_from_slice(body);
    out
}

/// The answer to `request` with `response`; an error when an output's bytes are not where its
/// slot says (a worker's fault, answered as INTERNAL).
pub fn response_answer<'a>(
    request: &CoreRequest,
    response: &ResponseParts<'a>,
    framing: Framing,
) -> Result<HttpAnswer<'a>, CoreError> {
    let mut json = Vec::with_capacity(256);
    let mut binary: Vec<&'a [u8]> = Vec::new();
    json.push(b'{');
    let id = if response.id.is_empty() {
        request.id.as_str()
    } else {
        response.id
    };
    if !id.is_empty() {
        json.extend_from_slice(b"\"id\":");
        json_string(&mut json, id.as_bytes());
        json.push(b',');
    }
    json.extend_from_slice(b"\"model_name\":");
    json_string(&mut json, response.model_name.as_bytes());
    json.extend_from_slice(b",\"model_version\":");
    json_string(&mut json, response.model_version.as_bytes());
    if !response.parameters.is_empty() && response.parameters != "{}" {
        json.extend_from_slice(b",\"parameters\":");
        json.extend_from_slice(response.parameters.as_bytes());
    }
    json.extend_from_slice(b",\"outputs\":[");
    let mut first = true;
    for slot in response.outputs {
        let binary_wanted = match &request.outputs {
            None => request.binary_default,
            Some(wanted) => match wanted.iter().find(|o| o.name == slot.name) {
                Some(output) => output.binary,
                None => continue,
            },
        };
        let shared = in_region(request, slot);
        let bytes = if shared {
            &[]
        } else {
            response.data(request, slot)?.unwrap_or_default()
        };
        if !first {
            json.push(b',');
        }
        first = false;
        json.extend_from_slice(b"{\"name\":");
        json_string(&mut json, slot.name.as_bytes());
        json.extend_from_slice(b",\"datatype\":");
        json_string(&mut json, slot.datatype.as_bytes());
        json.extend_from_slice(b",\"shape\":[");
        for (k, d) in slot.shape.iter().enumerate() {
            if k > 0 {
                json.push(b',');
            }
            let _ = write_int(&mut json, *d);
        }
        json.push(b']');
        if shared {
            // The data is in the client's shared memory: the entry says what it is, no more.
        } else if binary_wanted {
            let _ = write!(
                Text(&mut json),
                ",\"parameters\":{{\"binary_data_size\":{}}}",
                bytes.len()
            );
            if !bytes.is_empty() {
                binary.push(bytes);
            }
        } else {
            json.extend_from_slice(b",\"data\":");
            json_data(&mut json, &slot.datatype, bytes)?;
        }
        json.push(b'}');
    }
    json.extend_from_slice(b"]}");
    let body_length = json.len() + binary.iter().map(|b| b.len()).sum::<usize>();
    let copied = binary
        .iter()
        .position(|part| part.len() >= SENT_IN_PLACE_BYTES)
        .unwrap_or(binary.len());
    let copied_length: usize = binary[..copied].iter().map(|b| b.len()).sum();
    let mut out = Vec::with_capacity(json.len() + copied_length + 160);
    if binary.is_empty() {
        head(&mut out, 200, "application/json", body_length, "", framing);
    } else {
        let extra = format!("Inference-Header-Content-Length: {}\r\n", json.len());
        head(
            &mut out,
            200,
            "application/octet-stream",
            body_length,
            &extra,
            framing,
        );
    }
    out.extend_from_slice(&json);
    for part in &binary[..copied] {
        out.extend_from_slice(part);
    }
    Ok(HttpAnswer {
        head: out,
        tail: binary.split_off(copied),
    })
}

/// Whether output `slot` went into a client's shared memory (written there by the worker, or
/// by the core for a region the request names).
pub fn in_region(request: &CoreRequest, slot: &Slot) -> bool {
    slot.place
        .as_ref()
        .is_some_and(|place| !regions::is_body_place(request, place))
        || request
            .output(&slot.name)
            .is_some_and(|o| o.region.is_some())
}

/// The bytes of `slot` within `segment`.
pub fn slot_bytes<'a>(segment: &'a [u8], slot: &Slot) -> Result<&'a [u8], CoreError> {
    usize::try_from(slot.offset)
        .ok()
        .zip(usize::try_from(slot.len).ok())
        .and_then(|(start, len)| segment.get(start..start.checked_add(len)?))
        .ok_or_else(|| {
            CoreError::internal(format!("output '{}' lies outside its segment", slot.name))
        })
}

struct Text<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for Text<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

fn write_int(out: &mut Vec<u8>, v: impl std::fmt::Display) -> std::fmt::Result {
    write!(Text(out), "{v}")
}

/// A double as the reference encoder (orjson) writes it: the shortest form that reads back
/// the same, a positive exponent with its sign (`1e+16`); `null` for what JSON cannot hold.
fn write_double(out: &mut Vec<u8>, v: f64) {
    if !v.is_finite() {
        out.extend_from_slice(b"null");
        return;
    }
    let mut buffer = ryu::Buffer::new();
    let text = buffer.format_finite(v).as_bytes();
    match text.iter().position(|&c| c == b'e') {
        Some(e) if text.get(e + 1) != Some(&b'-') => {
            out.extend_from_slice(&text[..=e]);
            out.push(b'+');
            out.extend_from_slice(&text[e + 1..]);
        }
        _ => out.extend_from_slice(text),
    }
}

/// A half-precision float's value (exact in single precision).
fn half_to_f32(bits: u16) -> f32 {
    let exponent = i32::from((bits >> 10) & 0x1f);
    let fraction = f32::from(bits & 0x3ff);
    let magnitude = match exponent {
        0 => fraction * 2f32.powi(-24),
        0x1f if fraction == 0.0 => f32::INFINITY,
        0x1f => f32::NAN,
        _ => (1.0 + fraction / 1024.0) * 2f32.powi(exponent - 15),
    };
    if bits >> 15 == 1 {
        -magnitude
    } else {
        magnitude
    }
}

/// An output's elements as a flat JSON array.
pub(crate) fn json_data(out: &mut Vec<u8>, datatype: &str, bytes: &[u8]) -> Result<(), CoreError> {
    let datatype = DataType::from_name(datatype)
        .ok_or_else(|| CoreError::internal(format!("unknown datatype '{datatype}'")))?;
    out.push(b'[');
    let mut first = true;
    let mut sep = |out: &mut Vec<u8>| {
        if !std::mem::replace(&mut first, false) {
            out.push(b',');
        }
    };
    macro_rules! each {
        ($t:ty, $n:expr, $write:expr) => {
            for chunk in bytes.chunks_exact($n) {
                sep(out);
                let v = <$t>::from_le_bytes(chunk.try_into().unwrap_or([0; $n]));
                $write(out, v);
            }
        };
    }
    match datatype {
        DataType::Bool => {
            for &b in bytes {
                sep(out);
                out.extend_from_slice(if b != 0 { b"true" } else { b"false" });
            }
        }
        DataType::Uint8 => each!(u8, 1, |o, v| {
            let _ = write_int(o, v);
        }),
        DataType::Uint16 => each!(u16, 2, |o, v| {
            let _ = write_int(o, v);
        }),
        DataType::Uint32 => each!(u32, 4, |o, v| {
            let _ = write_int(o, v);
        }),
        DataType::Uint64 => each!(u64, 8, |o, v| {
            let _ = write_int(o, v);
        }),
        DataType::Int8 => each!(i8, 1, |o, v| {
            let _ = write_int(o, v);
        }),
        DataType::Int16 => each!(i16, 2, |o, v| {
            let _ = write_int(o, v);
        }),
        DataType::Int32 => each!(i32, 4, |o, v| {
            let _ = write_int(o, v);
        }),
        DataType::Int64 => each!(i64, 8, |o, v| {
            let _ = write_int(o, v);
        }),
        DataType::Fp16 => each!(u16, 2, |o, v| write_double(o, f64::from(half_to_f32(v)))),
        DataType::Bf16 => each!(u16, 2, |o, v: u16| write_double(
            o,
            f64::from(f32::from_bits(u32::from(v) << 16))
        )),
        DataType::Fp32 => each!(f32, 4, |o, v: f32| write_double(o, f64::from(v))),
        DataType::Fp64 => each!(f64, 8, write_double),
        DataType::Bytes => {
            let mut rest = bytes;
            while !rest.is_empty() {
                let (length, tail) = rest
                    .split_first_chunk::<4>()
                    .ok_or_else(|| CoreError::internal("a BYTES output is framed wrongly"))?;
                let length = u32::from_le_bytes(*length) as usize;
                let element = tail
                    .get(..length)
                    .ok_or_else(|| CoreError::internal("a BYTES output is framed wrongly"))?;
                sep(out);
                json_string(out, String::from_utf8_lossy(element).as_bytes());
                rest = &tail[length..];
            }
        }
    }
    out.push(b']');
    Ok(())
}

/// A JSON string, escaped as the reference encoder escapes (quote, backslash and control
/// characters; everything else as its UTF-8).
pub fn json_string(out: &mut Vec<u8>, text: &[u8]) {
    out.push(b'"');
    let mut start = 0;
    for (k, &c) in text.iter().enumerate() {
        let escape: &[u8] = match c {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&text[start..k]);
        if escape.is_empty() {
            let _ = write!(Text(out), "\\u{c:04x}");
        } else {
            out.extend_from_slice(escape);
        }
        start = k + 1;
    }
    out.extend_from_slice(&text[start..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn double(v: f64) -> String {
        let mut out = Vec::new();
        write_double(&mut out, v);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn doubles_are_written_as_the_reference_encoder_writes_them() {
        // orjson's text for each.
        for (v, text) in [
            (1e16, "1e+16"),
            (1.5e-7, "1.5e-7"),
            (1e15, "1000000000000000.0"),
            (1e-5, "0.00001"),
            (2.5e-6, "2.5e-6"),
            (-0.0, "-0.0"),
            (100.0, "100.0"),
            (1.797_693_134_862_315_7e308, "1.7976931348623157e+308"),
            (f64::NAN, "null"),
        ] {
            assert_eq!(double(v), text);
        }
    }

    #[test]
    fn large_binary_outputs_are_sent_from_where_they_lie_and_in_order() {
        use crate::infer::{Decoded, Signature, TensorSpec, decode_http};
        let spec = TensorSpec {
            name: "IN".into(),
            datatype: "UINT8".into(),
            dims: vec![-1],
            optional: false,
        };
        let signature = Signature::new("m", 0, vec![spec], vec!["BIG".into(), "SMALL".into()]);
        let header = r#"{"inputs":[{"name":"IN","datatype":"UINT8","shape":[1],
            "parameters":{"binary_data_size":1}}],"parameters":{"binary_data_output":true}}"#;
        let mut body = header.as_bytes().to_vec();
        body.push(7);
        let Decoded::Request(request, _) = decode_http(&body, header.len(), &signature) else {
            panic!("not taken")
        };
        let large = SENT_IN_PLACE_BYTES as u64;
        let segment: Vec<u8> = (0..large + 3).map(|i| (i % 251) as u8).collect();
        let slot = |name: &str, offset: u64, len: u64| Slot {
            name: name.into(),
            datatype: "UINT8".into(),
            shape: vec![i64::try_from(len).unwrap()],
            offset,
            len,
            place: None,
        };
        let outputs = [
            slot("SMALL", large, 3),
            slot("BIG", 0, large),
            slot("SMALL", large, 3),
        ];
        let parts = ResponseParts {
            model_name: "m",
            model_version: "1",
            id: "",
            parameters: "",
            outputs: &outputs,
            segment: &segment,
            body: &[],
        };
        let framing = Framing {
            minor: 1,
            keep_alive: true,
        };
        let answer = response_answer(&request, &parts, framing).unwrap();
        // The small output before the large one is copied; the large one and all after it
        // are not.
        assert!(answer.head.ends_with(&segment[segment.len() - 3..]));
        assert_eq!(answer.tail.len(), 2);
        assert_eq!(answer.tail[0].as_ptr(), segment.as_ptr());
        assert_eq!(answer.tail[0].len(), segment.len() - 3);
        let head_length = answer.head.len();
        let bytes = answer.into_bytes();
        assert_eq!(
            &bytes[head_length..head_length + segment.len() - 3],
            &segment[..segment.len() - 3]
        );
        assert!(bytes.ends_with(&segment[segment.len() - 3..]));
    }

    #[test]
    fn strings_escape_what_json_needs() {
        let mut out = Vec::new();
        json_string(&mut out, "a\"b\\c\n\u{1}é".as_bytes());
        assert_eq!(String::from_utf8(out).unwrap(), r#""a\"b\\c\n\u0001é""#);
    }

    #[test]
    #[allow(clippy::float_cmp)] // exact: every half is a single
    fn halves_convert_exactly() {
        assert_eq!(half_to_f32(0x3c00), 1.0);
        assert_eq!(half_to_f32(0xc000), -2.0);
        assert_eq!(half_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(half_to_f32(0x7c00), f32::INFINITY);
        assert!(half_to_f32(0x7e00).is_nan());
    }
}
