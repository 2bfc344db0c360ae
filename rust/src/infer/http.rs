//! An HTTP inference request body (`KServe` v2 JSON, with Triton's binary tensor data
//! extension) decoded into a [`CoreRequest`].
//!
//! The body is a JSON header, `json_length` bytes long (the `Inference-Header-Content-Length`
//! header; the whole body without it), followed by the binary inputs' bytes in input order,
//! each input giving its size in `parameters.binary_data_size`.

use super::Decoded;
use super::datatype::DataType;
use super::json::{self, Value};
use super::request::{CoreInput, CoreOutput, CoreRequest, OutputRegion, RegionParams, TensorData};
use super::signature::Signature;
use crate::jsondata::{NumberKind, Numbers, parse_numbers};
use crate::jsonscan;
use crate::sequence::CorrelationId;

/// Decodes `body` and checks it against `signature`.
pub fn decode_http(body: &[u8], json_length: usize, signature: &Signature) -> Decoded {
    let Some(request) = request(body, json_length) else {
        return Decoded::Reference;
    };
    match signature.check(&request) {
        Ok(batch_size) => Decoded::Request(request, batch_size),
        // The reference path finds the regions first, and words their errors first.
        Err(_) if request.uses_regions() => Decoded::Reference,
        Err(error) => Decoded::Refused(error),
    }
}

/// The request, when it is one the core takes on (see the module's parent).
fn request(body: &[u8], json_length: usize) -> Option<CoreRequest> {
    // 0: a raw binary request (no JSON at all), the reference path's.
    if json_length == 0 || json_length > body.len() {
        return None;
    }
    let doc = &body[..json_length];
    jsonscan::scan(doc).ok()?;
    let root = json::parse(doc)?;
    let Value::Object(members) = &root else {
        return None;
    };
    let mut request = CoreRequest::default();
    let mut inputs = None;
    let mut outputs = None;
    for (name, value) in members {
        match *name {
            "id" => string(value)?.clone_into(&mut request.id),
            "parameters" => parameters(value, &mut request)?,
            "inputs" => inputs = Some(value),
            "outputs" => outputs = Some(value),
            _ => {} // Triton reads none of the others
        }
    }
    let mut offset = json_length;
    for entry in array(inputs?)? {
        request.inputs.push(input(entry, body, &mut offset)?);
    }
    if offset != body.len() {
        return None;
    }
    if let Some(outputs) = outputs {
        let named: Vec<CoreOutput> = array(outputs)?.iter().map(output).collect::<Option<_>>()?;
        // An empty list names no output: every output comes back, as in Triton.
        request.outputs = (!named.is_empty()).then_some(named);
    }
    Some(request)
}

fn string<'a>(value: &Value<'a>) -> Option<&'a str> {
    match value {
        Value::Str(text) => Some(text),
        _ => None,
    }
}

fn array<'v, 'a>(value: &'v Value<'a>) -> Option<&'v [Value<'a>]> {
    match value {
        Value::Array(items, _) => Some(items),
        _ => None,
    }
}

/// An unsigned integer written as one (no sign, fraction or exponent).
fn unsigned(value: &Value<'_>) -> Option<u64> {
    match value {
        Value::Number(text) if text.bytes().all(|c| c.is_ascii_digit()) => text.parse().ok(),
        _ => None,
    }
}

fn members<'v, 'a>(value: &'v Value<'a>) -> Option<&'v [(&'a str, Value<'a>)]> {
    match value {
        Value::Object(members) => Some(members),
        _ => None,
    }
}

/// The request's parameters the core understands; any other takes the reference path.
fn parameters(value: &Value<'_>, request: &mut CoreRequest) -> Option<()> {
    for (name, value) in members(value)? {
        match *name {
            "binary_data_output" => match value {
                Value::Bool(flag) => request.binary_default = *flag,
                _ => return None,
            },
            "priority" => request.priority = Some(unsigned(value)?),
            "timeout" => request.timeout_us = Some(unsigned(value)?),
            "sequence_id" => {
                request.sequence.get_or_insert_default().id = match value {
                    Value::Str(text) => CorrelationId::Text((*text).to_owned()),
                    _ => CorrelationId::Number(unsigned(value)?),
                };
            }
            "sequence_start" | "sequence_end" => {
                let Value::Bool(flag) = value else {
                    return None;
                };
                let sequence = request.sequence.get_or_insert_default();
                if *name == "sequence_start" {
                    sequence.start = *flag;
                } else {
                    sequence.end = *flag;
                }
            }
            _ => return None,
        }
    }
    Some(())
}

fn input(entry: &Value<'_>, body: &[u8], offset: &mut usize) -> Option<CoreInput> {
    let name = string(entry.get("name")?)?;
    let datatype = DataType::from_name(string(entry.get("datatype")?)?)?;
    let shape = array(entry.get("shape")?)?
        .iter()
        .map(|d| unsigned(d).filter(|&d| i64::try_from(d).is_ok()))
        .collect::<Option<Vec<u64>>>()?;
    let count = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?))?;
    let mut binary_size = None;
    let mut region = RegionParams::default();
    if let Some(parameters) = entry.get("parameters") {
        for (key, value) in members(parameters)? {
            match *key {
                "binary_data_size" => binary_size = Some(unsigned(value)?),
                _ => region_parameter(&mut region, key, value)?,
            }
        }
    }
    let region = region.named().ok()?;
    let data = match (binary_size, entry.get("data")) {
        (None, None) => TensorData::Region(region?),
        _ if region.is_some() => return None,
        (Some(size), None) => {
            let start = *offset;
            let end = start.checked_add(usize::try_from(size).ok()?)?;
            let bytes = body.get(start..end)?;
            if !fits(datatype, count, bytes) {
                return None;
            }
            *offset = end;
            TensorData::Body(start..end)
        }
        // Triton never looks at the data of an empty tensor.
        (None, Some(_)) if count == 0 => TensorData::Owned(Vec::new()),
        (None, Some(array @ Value::Array(_, text))) => TensorData::Owned(match datatype {
            DataType::Bool | DataType::Bytes => literals(datatype, count, array)?,
            _ => numbers(datatype, count, text)?,
        }),
        _ => return None,
    };
    Some(CoreInput {
        name: name.to_owned(),
        datatype,
        shape,
        data,
    })
}

/// Whether `bytes` hold exactly `count` elements of `datatype`.
pub(crate) fn fits(datatype: DataType, count: usize, bytes: &[u8]) -> bool {
    match datatype.element_size() {
        Some(size) => count.checked_mul(size) == Some(bytes.len()),
        None => bytes_elements(bytes) == Some(count),
    }
}

/// How many elements the raw data of a `BYTES` tensor holds, if it is framed whole.
pub(crate) fn bytes_elements(mut bytes: &[u8]) -> Option<usize> {
    let mut count = 0;
    while !bytes.is_empty() {
        let (length, rest) = bytes.split_first_chunk::<4>()?;
        let length = usize::try_from(u32::from_le_bytes(*length)).ok()?;
        bytes = rest.get(length..)?;
        count += 1;
    }
    Some(count)
}

/// The numbers of a JSON `data` array as `count` elements of `datatype` in the wire's layout
/// (little end first); None for a datatype or a value the core leaves to the reference path.
pub(super) fn numbers(datatype: DataType, count: usize, text: &[u8]) -> Option<Vec<u8>> {
    let kind = match datatype {
        DataType::Fp32 | DataType::Fp64 => NumberKind::Float,
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => NumberKind::Signed,
        DataType::Uint8 | DataType::Uint16 | DataType::Uint32 | DataType::Uint64 => {
            NumberKind::Unsigned
        }
        _ => return None,
    };
    let parsed = parse_numbers(text, kind)?;
    let mut out = Vec::with_capacity(count * datatype.element_size()?);
    // Narrowing wraps and doubles round to the nearest single, as the reference path's numpy
    // casts (and Triton's C casts) do.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    match (parsed, datatype) {
        (Numbers::Float(v), DataType::Fp32) if v.len() == count => {
            for &x in &v {
                out.extend((x as f32).to_le_bytes());
            }
        }
        (Numbers::Float(v), DataType::Fp64) if v.len() == count => {
            for &x in &v {
                out.extend(x.to_le_bytes());
            }
        }
        (Numbers::Signed(v), _) if v.len() == count => {
            let size = datatype.element_size()?;
            for &x in &v {
                out.extend_from_slice(&x.to_le_bytes()[..size]);
            }
        }
        (Numbers::Unsigned(v), _) if v.len() == count => {
            let size = datatype.element_size()?;
            for &x in &v {
                out.extend_from_slice(&x.to_le_bytes()[..size]);
            }
        }
        _ => return None,
    }
    Some(out)
}

/// The elements of a JSON `data` array of BOOL (`true`/`false`) or BYTES (strings, as their
/// UTF-8) as `count` elements in the wire's layout; None for anything else.
pub(super) fn literals(datatype: DataType, count: usize, array: &Value<'_>) -> Option<Vec<u8>> {
    let mut flat = Vec::with_capacity(count);
    flatten(array, &mut flat)?;
    if flat.len() != count {
        return None;
    }
    let mut out = Vec::with_capacity(count);
    for value in flat {
        match (datatype, value) {
            (DataType::Bool, Value::Bool(truth)) => out.push(u8::from(*truth)),
            (DataType::Bytes, Value::Str(text)) => {
                out.extend_from_slice(&u32::try_from(text.len()).ok()?.to_le_bytes());
                out.extend_from_slice(text.as_bytes());
            }
            _ => return None,
        }
    }
    Some(out)
}

/// The elements of nested arrays, in order.
fn flatten<'v, 'a>(value: &'v Value<'a>, out: &mut Vec<&'v Value<'a>>) -> Option<()> {
    let Value::Array(items, _) = value else {
        return None;
    };
    for item in items {
        if matches!(item, Value::Array(..)) {
            flatten(item, out)?;
        } else {
            out.push(item);
        }
    }
    Some(())
}

/// An output the request names.
fn output(entry: &Value<'_>) -> Option<CoreOutput> {
    let name = string(entry.get("name")?)?;
    let mut binary = false;
    let mut region = RegionParams::default();
    if let Some(parameters) = entry.get("parameters") {
        for (key, value) in members(parameters)? {
            match (*key, value) {
                ("binary_data", Value::Bool(flag)) => binary = *flag,
                _ => region_parameter(&mut region, key, value)?,
            }
        }
    }
    let region = region.named().ok()?.map(OutputRegion::Named);
    if binary && region.is_some() {
        return None; // both: an error the reference path words
    }
    Some(CoreOutput {
        name: name.to_owned(),
        binary,
        region,
    })
}

/// One of a tensor's shared-memory parameters: the region's name a string, the offset and
/// size unsigned integers, as Triton reads them; None for any other parameter or value.
fn region_parameter(region: &mut RegionParams, key: &str, value: &Value<'_>) -> Option<()> {
    match key {
        "shared_memory_region" => region.set_region(string(value)?.to_owned()),
        _ => region.set_number(key, unsigned(value)?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infer::{RegionRef, TensorSpec};

    fn identity() -> Signature {
        let spec = |name: &str| TensorSpec {
            name: name.into(),
            datatype: "FP32".into(),
            dims: vec![-1],
            optional: false,
        };
        Signature::new("identity", 64, vec![spec("INPUT0")], vec!["OUTPUT0".into()])
    }

    fn binary_body(header: &str, data: &[u8]) -> (Vec<u8>, usize) {
        let mut body = header.as_bytes().to_vec();
        body.extend_from_slice(data);
        (body, header.len())
    }

    #[test]
    fn takes_binary_inputs_in_place() {
        let header = r#"{"id":"7","inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,2],
            "parameters":{"binary_data_size":8}}],"outputs":[{"name":"OUTPUT0",
            "parameters":{"binary_data":true}}]}"#;
        let (body, length) = binary_body(header, &[0, 0, 128, 63, 0, 0, 0, 64]);
        let Decoded::Request(request, batch) = decode_http(&body, length, &identity()) else {
            panic!("not taken")
        };
        assert_eq!(batch, 1);
        assert_eq!(request.id, "7");
        assert_eq!(request.inputs[0].data, TensorData::Body(length..length + 8));
        assert_eq!(
            request.outputs.unwrap()[0],
            CoreOutput {
                name: "OUTPUT0".into(),
                binary: true,
                region: None,
            }
        );
    }

    #[test]
    fn parses_json_numbers_into_the_wire_layout() {
        let header =
            r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,2],"data":[[1,2.0]]}]}"#;
        let Decoded::Request(request, _) =
            decode_http(header.as_bytes(), header.len(), &identity())
        else {
            panic!("not taken")
        };
        let expected: Vec<u8> = [1f32, 2f32].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(request.inputs[0].data, TensorData::Owned(expected));
    }

    #[test]
    fn an_empty_output_list_names_every_output() {
        let header = r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,1],"data":[1]}],
            "outputs":[]}"#;
        let Decoded::Request(request, _) =
            decode_http(header.as_bytes(), header.len(), &identity())
        else {
            panic!("not taken")
        };
        assert_eq!(request.outputs, None);
    }

    #[test]
    fn words_a_wrong_shape_as_triton() {
        let header = r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[2],"data":[1,2]}]}"#;
        let Decoded::Refused(error) = decode_http(header.as_bytes(), header.len(), &identity())
        else {
            panic!("not refused")
        };
        assert!(error.message.starts_with(
            "[request id: <id_unknown>] unexpected shape for input 'INPUT0' for model 'identity'. \
             Expected [-1,-1], got [2]. NOTE:"
        ));
    }

    #[test]
    fn reads_a_sequences_parameters() {
        let header = r#"{"parameters":{"sequence_id":"s1","sequence_end":true},
            "inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,1],"data":[1]}]}"#;
        let Decoded::Request(request, _) =
            decode_http(header.as_bytes(), header.len(), &identity())
        else {
            panic!("not taken")
        };
        let sequence = request.sequence.unwrap();
        assert_eq!(sequence.id, CorrelationId::Text("s1".into()));
        assert!(!sequence.start && sequence.end);
    }

    #[test]
    fn reads_shared_memory_windows() {
        let header = r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,2],
            "parameters":{"shared_memory_region":"in","shared_memory_byte_size":8,
            "shared_memory_offset":16}}],"outputs":[{"name":"OUTPUT0","parameters":
            {"shared_memory_region":"out","shared_memory_byte_size":8,"binary_data":false}}]}"#;
        let Decoded::Request(request, _) =
            decode_http(header.as_bytes(), header.len(), &identity())
        else {
            panic!("not taken")
        };
        let window = |region: &str, offset| RegionRef {
            region: region.into(),
            offset,
            byte_size: 8,
        };
        assert_eq!(request.inputs[0].data, TensorData::Region(window("in", 16)));
        let outputs = request.outputs.unwrap();
        assert_eq!(
            outputs[0].region,
            Some(OutputRegion::Named(window("out", 0)))
        );
    }

    #[test]
    fn leaves_the_rest_to_the_reference_path() {
        for header in [
            r#"{"inputs":[]}x"#,
            r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,1],"data":[1],
                "parameters":{"shared_memory_region":"r","shared_memory_byte_size":4}}]}"#,
            r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,1],
                "parameters":{"shared_memory_region":"r"}}]}"#,
            r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,1],
                "parameters":{"shared_memory_offset":0,"shared_memory_byte_size":4}}]}"#,
            r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[2],
                "parameters":{"shared_memory_region":"r","shared_memory_byte_size":4}}]}"#,
            r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,1],"data":[1]}],
                "outputs":[{"name":"OUTPUT0","parameters":{"shared_memory_region":"r",
                "shared_memory_byte_size":4,"binary_data":true}}]}"#,
            r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,2],"data":[1]}]}"#,
            r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,1],"data":["a"]}]}"#,
            r#"{"parameters":{"custom":1},"inputs":[]}"#,
            r#"{"parameters":{"sequence_id":-1},"inputs":[]}"#,
            r#"{"parameters":{"sequence_start":1},"inputs":[]}"#,
            r#"{"inputs":[{"name":"IN\u0030","datatype":"FP32","shape":[1],"data":[1]}]}"#,
        ] {
            assert_eq!(
                decode_http(header.as_bytes(), header.len(), &identity()),
                Decoded::Reference
            );
        }
    }

    #[test]
    fn frames_bytes_elements() {
        assert_eq!(bytes_elements(b""), Some(0));
        assert_eq!(bytes_elements(b"\x01\0\0\0a\0\0\0\0"), Some(2));
        assert_eq!(bytes_elements(b"\x02\0\0\0a"), None);
        assert_eq!(bytes_elements(b"\x01\0\0"), None);
    }
}
