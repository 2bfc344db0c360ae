//! A gRPC `ModelInferRequest` (`inference.GRPCInferenceService/ModelInfer`, as received,
//! unparsed) decoded into a [`CoreRequest`], its `raw_input_contents` left in place.
//!
//! The core takes on the request clients send every day: named inputs whose bytes travel in
//! `raw_input_contents` or lie in a shared-memory region, outputs named without parameters or
//! bound for a region, an id, a sequence's ID and flags, and on a stream the flag that asks
//! for an empty final response. Other request or tensor parameters, typed `contents`,
//! anything malformed or refused: the reference path.

use std::ops::Range;

use super::Decoded;
use super::datatype::DataType;
use super::http::fits;
use super::request::{
    CoreInput, CoreOutput, CoreRequest, NamedModel, OutputRegion, RegionParams, RegionRef,
    TensorData,
};
use super::signature::Signature;
use crate::sequence::CorrelationId;
use crate::wire::{Wire, fields};

fn text(b: &[u8], range: &Range<usize>) -> Option<String> {
    std::str::from_utf8(&b[range.clone()])
        .ok()
        .map(str::to_owned)
}

/// The model name and version a `ModelInferRequest` names (fields 1 and 2), if it is
/// well-formed at the top level and names each at most once.
pub fn grpc_target(message: &[u8]) -> Option<(String, String)> {
    let mut name = None;
    let mut version = None;
    let mut all = fields(message, 0..message.len());
    while let Some((number, value)) = all.next_field().ok()? {
        let slot = match number {
            1 => &mut name,
            2 => &mut version,
            _ => continue,
        };
        let Wire::Bytes(range) = value else {
            return None;
        };
        if slot.replace(text(message, &range)?).is_some() {
            return None;
        }
    }
    Some((name?, version.unwrap_or_default()))
}

/// Decodes `message` and checks it against `signature` (`on_stream`: it came on a
/// `ModelStreamInfer` stream). A request its model refuses takes the reference path too,
/// which words the error with the gRPC frontend's rules.
pub fn decode_grpc(message: &[u8], signature: &Signature, on_stream: bool) -> Decoded {
    let Some(request) = request(message, on_stream) else {
        return Decoded::Reference;
    };
    match signature.check(&request) {
        Ok(batch_size) => Decoded::Request(request, batch_size),
        Err(_) => Decoded::Reference,
    }
}

/// The request, when it is one the core takes on.
fn request(b: &[u8], on_stream: bool) -> Option<CoreRequest> {
    let mut request = CoreRequest::default();
    let mut inputs = Vec::new();
    let mut outputs = Vec::new();
    let mut raws = Vec::new();
    let mut seen_id = false;
    let mut named = NamedModel::default();
    // Asked for an empty final response (None: the request did not say).
    let mut empty_final = None;
    let mut all = fields(b, 0..b.len());
    while let Some((number, value)) = all.next_field().ok()? {
        let Wire::Bytes(range) = value else {
            if matches!(number, 1..=7) {
                return None; // a known field of the wrong wire type
            }
            continue;
        };
        match number {
            1 => named.name = text(b, &range)?,
            2 => named.version = text(b, &range)?,
            3 => {
                if std::mem::replace(&mut seen_id, true) {
                    return None;
                }
                request.id = text(b, &range)?;
            }
            4 => parameter(b, range, &mut request, &mut empty_final)?,
            5 => inputs.push(input(b, range)?),
            6 => outputs.push(output(b, range)?),
            7 => raws.push(range),
            _ => return None, // a field this core does not know
        }
    }
    // Inputs in shared memory take no entry of `raw_input_contents`.
    if raws.len() != inputs.iter().filter(|input| input.region.is_none()).count() {
        return None;
    }
    let mut raws = raws.into_iter();
    for input in inputs {
        let data = if let Some(region) = input.region {
            TensorData::Region(region)
        } else {
            let range = raws.next()?;
            let count = input
                .shape
                .iter()
                .try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?))?;
            if !fits(input.datatype, count, &b[range.clone()]) {
                return None;
            }
            TensorData::Body(range)
        };
        request.inputs.push(CoreInput {
            name: input.name,
            datatype: input.datatype,
            shape: input.shape,
            data,
        });
    }
    if !outputs.is_empty() {
        request.outputs = Some(outputs);
    }
    match empty_final {
        // A call's model sees the flag among its parameters: the reference path's to pass.
        Some(_) if !on_stream => return None,
        Some(true) => request.empty_final = Some(named),
        _ => {}
    }
    Some(request)
}

/// One entry of the request's `parameters` map: the core takes a sequence's ID (a
/// non-negative `int64_param` or a `string_param`) and flags (`bool_param`), each given once,
/// and `triton_enable_empty_final_response` (a `bool_param`, into `empty_final`); any other
/// parameter takes the reference path.
fn parameter(
    b: &[u8],
    range: Range<usize>,
    request: &mut CoreRequest,
    empty_final: &mut Option<bool>,
) -> Option<()> {
    let (key, choice) = map_entry(b, range)?;
    if key == "triton_enable_empty_final_response" {
        let (1, Wire::Varint(flag)) = choice else {
            return None;
        };
        *empty_final = Some(flag != 0);
        return Some(());
    }
    let sequence = request.sequence.get_or_insert_default();
    match (key.as_str(), choice) {
        ("sequence_id", (2, Wire::Varint(id))) if i64::try_from(id).is_ok() => {
            sequence.id = CorrelationId::Number(id);
        }
        ("sequence_id", (3, Wire::Bytes(r))) => sequence.id = CorrelationId::Text(text(b, &r)?),
        ("sequence_start", (1, Wire::Varint(flag))) => sequence.start = flag != 0,
        ("sequence_end", (1, Wire::Varint(flag))) => sequence.end = flag != 0,
        _ => return None,
    }
    Some(())
}

/// An entry of a `parameters` map: its key and the one field its `InferParameter` sets (a
/// oneof of bool (1), int64 (2), string (3), double (4), uint64 (5)).
fn map_entry(b: &[u8], range: Range<usize>) -> Option<(String, (u64, Wire))> {
    let mut key = None;
    let mut value = None;
    let mut all = fields(b, range);
    while let Some((number, wire)) = all.next_field().ok()? {
        match (number, wire) {
            (1, Wire::Bytes(r)) if key.is_none() => key = Some(text(b, &r)?),
            (2, Wire::Bytes(r)) if value.is_none() => value = Some(r),
            _ => return None,
        }
    }
    let mut choice = None;
    let mut inner = fields(b, value?);
    while let Some(field) = inner.next_field().ok()? {
        if choice.replace(field).is_some() {
            return None;
        }
    }
    Some((key?, choice?))
}

/// One `parameters` entry of a tensor in shared memory: the region's name a `string_param`,
/// the offset and size non-negative `int64_param`s, as Triton reads them; None for anything
/// else.
fn region_parameter(region: &mut RegionParams, b: &[u8], range: Range<usize>) -> Option<()> {
    match map_entry(b, range)? {
        (key, (3, Wire::Bytes(r))) if key == "shared_memory_region" => {
            region.set_region(text(b, &r)?)
        }
        (key, (2, Wire::Varint(n))) => region.set_number(&key, dim(n)?),
        _ => None,
    }
}

/// An `InferInputTensor` as read: its data in `raw_input_contents` or a region.
struct Input {
    name: String,
    datatype: DataType,
    shape: Vec<u64>,
    region: Option<RegionRef>,
}

/// An `InferInputTensor`: name, datatype, shape and, for one in shared memory, its window.
fn input(b: &[u8], range: Range<usize>) -> Option<Input> {
    let mut name = None;
    let mut datatype = None;
    let mut shape = Vec::new();
    let mut region = RegionParams::default();
    let mut all = fields(b, range);
    while let Some((number, value)) = all.next_field().ok()? {
        match (number, value) {
            (1, Wire::Bytes(r)) if name.is_none() => name = Some(text(b, &r)?),
            (2, Wire::Bytes(r)) if datatype.is_none() => {
                datatype = Some(DataType::from_name(&text(b, &r)?)?);
            }
            (3, Wire::Varint(d)) => shape.push(dim(d)?),
            (3, Wire::Bytes(r)) => {
                let mut packed = fields(b, r);
                while !packed.at_end() {
                    shape.push(dim(packed.varint()?)?);
                }
            }
            (4, Wire::Bytes(r)) => region_parameter(&mut region, b, r)?,
            _ => return None, // contents, a repeated or mistyped field
        }
    }
    Some(Input {
        name: name?,
        datatype: datatype?,
        shape,
        region: region.named().ok()?,
    })
}

/// A dimension: an `int64` on the wire, the core's only if it is not negative.
fn dim(value: u64) -> Option<u64> {
    i64::try_from(value).is_ok().then_some(value)
}

/// An `InferRequestedOutputTensor` naming an output, without parameters or with a region's.
fn output(b: &[u8], range: Range<usize>) -> Option<CoreOutput> {
    let mut name = None;
    let mut region = RegionParams::default();
    let mut all = fields(b, range);
    while let Some((number, value)) = all.next_field().ok()? {
        match (number, value) {
            (1, Wire::Bytes(r)) if name.is_none() => name = Some(text(b, &r)?),
            (2, Wire::Bytes(r)) => region_parameter(&mut region, b, r)?,
            _ => return None,
        }
    }
    Some(CoreOutput {
        name: name?,
        binary: false,
        region: region.named().ok()?.map(OutputRegion::Named),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infer::TensorSpec;

    fn field(out: &mut Vec<u8>, number: u64, payload: &[u8]) {
        varint(out, (number << 3) | 2);
        varint(out, payload.len() as u64);
        out.extend_from_slice(payload);
    }

    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push(u8::try_from(v & 0x7f).unwrap() | 0x80);
            v >>= 7;
        }
        out.push(u8::try_from(v).unwrap());
    }

    fn message(shape: &[u64], raw: &[u8]) -> Vec<u8> {
        let mut tensor = Vec::new();
        field(&mut tensor, 1, b"INPUT0");
        field(&mut tensor, 2, b"FP32");
        let mut dims = Vec::new();
        for &d in shape {
            varint(&mut dims, d);
        }
        field(&mut tensor, 3, &dims);
        let mut m = Vec::new();
        field(&mut m, 1, b"identity");
        field(&mut m, 3, b"req");
        field(&mut m, 5, &tensor);
        field(&mut m, 7, raw);
        m
    }

    fn identity() -> Signature {
        let spec = TensorSpec {
            name: "INPUT0".into(),
            datatype: "FP32".into(),
            dims: vec![-1],
            optional: false,
        };
        Signature::new("identity", 8, vec![spec], vec!["OUTPUT0".into()])
    }

    #[test]
    fn takes_raw_contents_in_place() {
        let m = message(&[1, 2], &[0; 8]);
        assert_eq!(grpc_target(&m), Some(("identity".into(), String::new())));
        let Decoded::Request(request, 1) = decode_grpc(&m, &identity(), false) else {
            panic!("not taken")
        };
        assert_eq!(request.id, "req");
        assert_eq!(request.inputs[0].shape, vec![1, 2]);
        assert!(matches!(request.inputs[0].data, TensorData::Body(ref r) if r.len() == 8));
    }

    /// A `parameters` map entry: `key` set to the `InferParameter` field `number` (a varint's
    /// bytes for 1, 2, 5; the text for 3).
    fn parameter(key: &str, number: u64, value: &[u8]) -> Vec<u8> {
        let mut choice = Vec::new();
        if number == 3 {
            field(&mut choice, 3, value);
        } else {
            choice.push(u8::try_from(number << 3).unwrap());
            choice.extend_from_slice(value);
        }
        let mut entry = Vec::new();
        field(&mut entry, 1, key.as_bytes());
        field(&mut entry, 2, &choice);
        entry
    }

    #[test]
    fn reads_a_sequences_parameters() {
        let mut m = message(&[1, 2], &[0; 8]);
        field(&mut m, 4, &parameter("sequence_id", 2, &[42]));
        field(&mut m, 4, &parameter("sequence_start", 1, &[1]));
        let Decoded::Request(request, _) = decode_grpc(&m, &identity(), false) else {
            panic!("not taken")
        };
        let sequence = request.sequence.unwrap();
        assert_eq!(sequence.id, CorrelationId::Number(42));
        assert!(sequence.start && !sequence.end);
        let mut text = message(&[1, 2], &[0; 8]);
        field(&mut text, 4, &parameter("sequence_id", 3, b"abc"));
        let Decoded::Request(request, _) = decode_grpc(&text, &identity(), false) else {
            panic!("not taken")
        };
        assert_eq!(
            request.sequence.unwrap().id,
            CorrelationId::Text("abc".into())
        );
    }

    /// A tensor's `parameters` naming a window of region `region`.
    fn window(out: &mut Vec<u8>, number: u64, region: &str, byte_size: u8) {
        field(
            out,
            number,
            &parameter("shared_memory_region", 3, region.as_bytes()),
        );
        field(
            out,
            number,
            &parameter("shared_memory_byte_size", 2, &[byte_size]),
        );
    }

    #[test]
    fn reads_shared_memory_windows() {
        // INPUT0 in a region (no raw contents), OUTPUT0 to one.
        let mut tensor = Vec::new();
        field(&mut tensor, 1, b"INPUT0");
        field(&mut tensor, 2, b"FP32");
        field(&mut tensor, 3, &[1, 2]);
        window(&mut tensor, 4, "in", 8);
        let mut output = Vec::new();
        field(&mut output, 1, b"OUTPUT0");
        window(&mut output, 2, "out", 8);
        let mut m = Vec::new();
        field(&mut m, 1, b"identity");
        field(&mut m, 5, &tensor);
        field(&mut m, 6, &output);
        let Decoded::Request(request, _) = decode_grpc(&m, &identity(), false) else {
            panic!("not taken")
        };
        let named = |region: &str| RegionRef {
            region: region.into(),
            offset: 0,
            byte_size: 8,
        };
        assert_eq!(request.inputs[0].data, TensorData::Region(named("in")));
        let outputs = request.outputs.unwrap();
        assert_eq!(outputs[0].region, Some(OutputRegion::Named(named("out"))));
        // The same input with raw contents besides: the reference path's.
        field(&mut m, 7, &[0; 8]);
        assert_eq!(decode_grpc(&m, &identity(), false), Decoded::Reference);
    }

    #[test]
    fn leaves_the_rest_to_the_reference_path() {
        assert_eq!(
            decode_grpc(&message(&[1, 3], &[0; 8]), &identity(), false),
            Decoded::Reference
        );
        assert_eq!(
            decode_grpc(&message(&[2], &[0; 8]), &identity(), false),
            Decoded::Reference
        );
        let mut negative = message(&[1, 2], &[0; 8]);
        field(
            &mut negative,
            4,
            &parameter(
                "sequence_id",
                2,
                &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1],
            ),
        );
        assert_eq!(
            decode_grpc(&negative, &identity(), false),
            Decoded::Reference
        );
        let mut custom = message(&[1, 2], &[0; 8]);
        field(&mut custom, 4, &parameter("custom", 1, &[1]));
        assert_eq!(decode_grpc(&custom, &identity(), false), Decoded::Reference);
        let mut with_parameters = message(&[1, 2], &[0; 8]);
        field(&mut with_parameters, 4, b"");
        assert_eq!(
            decode_grpc(&with_parameters, &identity(), false),
            Decoded::Reference
        );
        assert_eq!(grpc_target(&[0xff]), None);
    }

    #[test]
    fn takes_the_empty_final_flag_on_a_stream_only() {
        let asking = |flag: u8| {
            let mut m = message(&[1, 2], &[0; 8]);
            field(&mut m, 2, b"3");
            field(
                &mut m,
                4,
                &parameter("triton_enable_empty_final_response", 1, &[flag]),
            );
            m
        };
        let Decoded::Request(request, _) = decode_grpc(&asking(1), &identity(), true) else {
            panic!("not taken")
        };
        let named = request.empty_final.expect("the flag");
        assert_eq!(
            (named.name.as_str(), named.version.as_str()),
            ("identity", "3")
        );
        assert!(request.sequence.is_none());
        let Decoded::Request(request, _) = decode_grpc(&asking(0), &identity(), true) else {
            panic!("not taken")
        };
        assert_eq!(request.empty_final, None);
        // A call's model sees the flag among its parameters: the reference path passes them.
        assert_eq!(
            decode_grpc(&asking(1), &identity(), false),
            Decoded::Reference
        );
        let mut typed = message(&[1, 2], &[0; 8]);
        field(
            &mut typed,
            4,
            &parameter("triton_enable_empty_final_response", 2, &[1]),
        );
        assert_eq!(decode_grpc(&typed, &identity(), true), Decoded::Reference);
    }
}
