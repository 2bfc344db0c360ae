//! gRPC answers to inference requests, written by the core: a `ModelInferResponse` whose
//! outputs' bytes travel in `raw_output_contents`, serialized as the server's reference
//! encoder serializes it (fields in number order, empty strings left out, shapes packed).

use super::message::Slot;
use super::response::{ResponseParts, in_region};
use crate::error::CoreError;
use crate::infer::{CoreRequest, NamedModel};

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(u8::try_from(value & 0x7f).unwrap_or(0) | 0x80);
        value >>= 7;
    }
    out.push(u8::try_from(value).unwrap_or(0));
}

fn bytes_field(out: &mut Vec<u8>, number: u64, payload: &[u8]) {
    varint(out, (number << 3) | 2);
    varint(out, payload.len() as u64);
    out.extend_from_slice(payload);
}

/// A string field, left out when empty (proto3).
fn string_field(out: &mut Vec<u8>, number: u64, text: &str) {
    if !text.is_empty() {
        bytes_field(out, number, text.as_bytes());
    }
}

fn output_tensor(slot: &Slot) -> Vec<u8> {
    let mut tensor = Vec::with_capacity(32);
    string_field(&mut tensor, 1, &slot.name);
    string_field(&mut tensor, 2, &slot.datatype);
    if !slot.shape.is_empty() {
        let mut dims = Vec::with_capacity(slot.shape.len());
        for &d in &slot.shape {
            #[allow(clippy::cast_sign_loss)] // int64 on the wire: two's complement
            varint(&mut dims, d as u64);
        }
        bytes_field(&mut tensor, 3, &dims);
    }
    tensor
}

/// How a gRPC reply is framed: a `ModelInfer` call's `ModelInferResponse`, or the
/// `ModelStreamInferResponse` a `ModelStreamInfer` stream writes for a response of a request
/// (the `ModelInferResponse` as its `infer_response`, with `triton_final_response` saying
/// whether it is the request's last).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrpcForm {
    Unary,
    Stream,
}

/// The `parameters` map entry `triton_final_response: bool_param <last>` (a false
/// `bool_param` is written, as the reference encoder writes it: the field is in a oneof).
fn final_parameter(last: bool) -> Vec<u8> {
    let mut entry = Vec::with_capacity(28);
    string_field(&mut entry, 1, "triton_final_response");
    bytes_field(&mut entry, 2, &[0x08, u8::from(last)]);
    entry
}

/// The `ModelStreamInferResponse` that only says a stream's request is complete, for a
/// request that asked for it: no outputs, the model as the request named it, its id, and
/// `triton_final_response` true.
pub fn grpc_empty_final(request: &CoreRequest, named: &NamedModel) -> Vec<u8> {
    let mut message = Vec::with_capacity(64);
    string_field(&mut message, 1, &named.name);
    string_field(&mut message, 2, &named.version);
    string_field(&mut message, 3, &request.id);
    bytes_field(&mut message, 4, &final_parameter(true));
    let mut reply = Vec::with_capacity(message.len() + 4);
    bytes_field(&mut reply, 2, &message);
    reply
}

/// The serialized reply to `request` in `form` (`last`: a stream's reply is its request's
/// last); None when the response carries parameters (the reference encoder writes those), an
/// error when an output's bytes are not where its slot says.
pub fn grpc_answer(
    request: &CoreRequest,
    response: &ResponseParts<'_>,
    form: GrpcForm,
    last: bool,
) -> Result<Option<Vec<u8>>, CoreError> {
    if !response.parameters.is_empty() && response.parameters != "{}" {
        return Ok(None);
    }
    let mut message = Vec::with_capacity(128);
    string_field(&mut message, 1, response.model_name);
    string_field(&mut message, 2, response.model_version);
    let id = if response.id.is_empty() {
        request.id.as_str()
    } else {
        response.id
    };
    string_field(&mut message, 3, id);
    if form == GrpcForm::Stream {
        bytes_field(&mut message, 4, &final_parameter(last));
    }
    let mut raws = Vec::new();
    for slot in response.outputs {
        if let Some(wanted) = &request.outputs
            && !wanted.iter().any(|o| o.name == slot.name)
        {
            continue;
        }
        bytes_field(&mut message, 5, &output_tensor(slot));
        // An output in shared memory keeps its (empty) entry, so that entries match outputs.
        raws.push(if in_region(request, slot) {
            &[][..]
        } else {
            response.data(request, slot)?.unwrap_or_default()
        });
    }
    for raw in raws {
        bytes_field(&mut message, 6, raw);
    }
    if form == GrpcForm::Stream {
        let mut reply = Vec::with_capacity(message.len() + 8);
        bytes_field(&mut reply, 2, &message);
        return Ok(Some(reply));
    }
    Ok(Some(message))
}
