//! The core's request decoders under arbitrary input: whatever bytes arrive, decoding ends in a
//! request, Triton's error or the reference path, never in a panic, and a request's tensors lie
//! within the body they came in (a generate body's hold exactly their shape's elements).

use proptest::prelude::*;
use tritonfast_core::infer::{
    DataType, Decoded, Signature, TensorData, TensorSpec, decode_generate, decode_grpc,
    decode_http, grpc_target,
};

fn signature() -> Signature {
    let spec = |name: &str, datatype: &str| TensorSpec {
        name: name.into(),
        datatype: datatype.into(),
        dims: vec![-1],
        optional: false,
    };
    Signature::new(
        "model",
        8,
        vec![spec("INPUT0", "FP32"), spec("INPUT1", "BYTES")],
        vec!["OUTPUT0".into()],
    )
}

/// Pieces real headers are made of, so that mutations reach deep into the decoder.
const PIECES: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"inputs\"",
    "\"outputs\"",
    "\"name\"",
    "\"INPUT0\"",
    "\"INPUT1\"",
    "\"datatype\"",
    "\"FP32\"",
    "\"BYTES\"",
    "\"shape\"",
    "\"data\"",
    "\"parameters\"",
    "\"binary_data_size\"",
    "\"binary_data\"",
    "\"shared_memory_region\"",
    "\"shared_memory_offset\"",
    "\"shared_memory_byte_size\"",
    "\"id\"",
    "true",
    "1",
    "4",
    "-1",
    "2.5",
    "1e400",
    "18446744073709551616",
    "\"\\u0041\"",
    " ",
    "\"max_tokens\"",
    "\"priority\"",
    "\"x\"",
    "false",
    "null",
];

fn header() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(prop::sample::select(PIECES), 0..60)
        .prop_map(|pieces| pieces.concat().into_bytes())
}

fn check(body: &[u8], json_length: usize) {
    if let Decoded::Request(request, _) = decode_http(body, json_length, &signature()) {
        for input in &request.inputs {
            if let TensorData::Body(range) = &input.data {
                assert!(range.start >= json_length && range.end <= body.len());
            }
        }
    }
}

fn check_generate(body: &[u8]) {
    let Some((request, parameters, _)) = decode_generate(body, &signature()) else {
        return;
    };
    for input in &request.inputs {
        let TensorData::Owned(bytes) = &input.data else {
            panic!("a generate input not in bytes of its own");
        };
        let count: u64 = input.shape.iter().product();
        if input.datatype == DataType::Fp32 {
            assert_eq!(bytes.len() as u64, count * 4);
        }
    }
    assert!(parameters.is_empty() || (parameters.starts_with('{') && parameters.ends_with('}')));
}

fn check_grpc(message: &[u8]) {
    let _ = grpc_target(message);
    for on_stream in [false, true] {
        if let Decoded::Request(request, _) = decode_grpc(message, &signature(), on_stream) {
            for input in &request.inputs {
                if let TensorData::Body(range) = &input.data {
                    assert!(range.end <= message.len());
                }
            }
        }
    }
}

/// Protobuf pieces of a `ModelInferRequest` (keys, lengths, names), for mutations that reach
/// deep into the decoder.
const PROTO_PIECES: &[&[u8]] = &[
    b"\x0a\x05model",
    b"\x1a\x02id",
    b"\x2a",
    b"\x3a",
    b"\x32",
    b"\x0a\x06INPUT0",
    b"\x12\x04FP32",
    b"\x12\x05BYTES",
    b"\x1a\x02\x01\x02",
    b"\x18\x01",
    b"\x04",
    b"\x08",
    b"\x10",
    b"\x00\x00\x80\x3f",
    b"\x22\x00",
    b"\x0a\x14shared_memory_region",
    b"\x0a\x17shared_memory_byte_size",
    b"\x12\x04\x1a\x02in",
    b"\x12\x02\x10\x08",
    b"\xff\xff\xff\xff\x0f",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes(body in prop::collection::vec(any::<u8>(), 0..300), cut in 0usize..320) {
        check(&body, cut.min(body.len()));
    }

    #[test]
    fn grpc_messages_of_arbitrary_bytes(message in prop::collection::vec(any::<u8>(), 0..300)) {
        check_grpc(&message);
    }

    #[test]
    fn grpc_messages_made_of_real_pieces(
        pieces in prop::collection::vec(prop::sample::select(PROTO_PIECES), 0..40)
    ) {
        check_grpc(&pieces.concat());
    }

    #[test]
    fn generate_bodies_of_arbitrary_bytes(body in prop::collection::vec(any::<u8>(), 0..300)) {
        check_generate(&body);
    }

    #[test]
    fn generate_bodies_made_of_real_pieces(body in header()) {
        check_generate(&body);
    }

    #[test]
    fn headers_made_of_real_pieces(head in header(), tail in prop::collection::vec(any::<u8>(), 0..40)) {
        let mut body = head.clone();
        body.extend_from_slice(&tail);
        check(&body, head.len());
    }
}

#[test]
fn a_deeply_nested_header_is_left_alone() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert_eq!(
        decode_http(deep.as_bytes(), deep.len(), &signature()),
        Decoded::Reference
    );
    let deep_input = format!(
        "{{\"INPUT0\":{}{}}}",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    assert!(decode_generate(deep_input.as_bytes(), &signature()).is_none());
}
