//! A `generate` / `generate_stream` request body (the generate extension's flat JSON object)
//! decoded into a [`CoreRequest`] and the parameters its model gets.
//!
//! A member named like one of the model's inputs is that input: a scalar, or an array,
//! flattened, its shape taken from the model's metadata shape (fixed dimensions as they are,
//! the innermost variable one holding the rest, other variable ones 1); any other member is a
//! request parameter (string, number or boolean), `id` too, which (a string) is also the
//! request id; and the member `parameters`, an object, holds more members under the same
//! rules (inputs among them). As in Triton, no member sets how the request is scheduled, and
//! the model sees every one (those named like the protocol's own, `priority`, `timeout` or a
//! sequence's, too): the parameters carry [`MODEL_PARAMETERS_ONLY`] to say so, as the
//! reference path's do.
//!
//! The core takes on the bodies clients send every day; anything else (a member the model
//! would refuse, a value of another kind, an escape in a string, a name given twice, a shape
//! the model refuses) goes to the reference path (`frontends/http/generate.py`), which answers
//! every body as Triton does.

use super::datatype::DataType;
use super::http::{literals, numbers};
use super::json::{self, Value};
use super::request::{CoreInput, CoreRequest, TensorData};
use super::signature::{Signature, TensorSpec};
use crate::jsonscan;

/// The member whose object holds more members.
const NESTED: &str = "parameters";
/// The parameter (its JSON-escaped name) that tells the worker every other one is the model's,
/// none the protocol's (`data.types.MODEL_PARAMETERS_ONLY` on the Python side).
const MODEL_PARAMETERS_ONLY: &str = "\\u0000model-parameters-only";

/// A body the core takes on: the request, the parameters its model gets (a JSON object's
/// text, empty for none) and its batch size; None for the reference path.
pub fn decode_generate(body: &[u8], signature: &Signature) -> Option<(CoreRequest, String, u64)> {
    if signature.input(NESTED).is_some() {
        return None; // (refused: the reference path words it)
    }
    jsonscan::scan(body).ok()?;
    let root = json::parse(body)?;
    let Value::Object(members) = &root else {
        return None;
    };
    let mut request = CoreRequest::default();
    let mut parameters = Parameters::default();
    parameters.set(MODEL_PARAMETERS_ONLY, "true".to_owned());
    take_members(members, signature, &mut request, &mut parameters, true)?;
    let batch_size = signature.check(&request).ok()?;
    Some((request, parameters.text(), batch_size))
}

fn take_members(
    members: &[(&str, Value<'_>)],
    signature: &Signature,
    request: &mut CoreRequest,
    parameters: &mut Parameters,
    top: bool,
) -> Option<()> {
    for (name, value) in members {
        if let Some(spec) = signature.input(name) {
            if request.inputs.iter().any(|input| input.name == *name) {
                return None; // an input given twice
            }
            let metadata = metadata_shape(spec, signature.max_batch_size());
            request.inputs.push(input(spec, &metadata, value)?);
            continue;
        }
        match (*name, value) {
            (NESTED, Value::Object(nested)) if top => {
                take_members(nested, signature, request, parameters, false)?;
            }
            (NESTED, _) if top => return None, // not an object: refused
            ("id", Value::Str(id)) if top => {
                (*id).clone_into(&mut request.id);
                parameters.set(name, format!("\"{id}\""));
            }
            ("id", _) if top => return None, // not a string: refused
            (_, Value::Str(text)) => parameters.set(name, format!("\"{text}\"")),
            (_, Value::Number(text)) => parameters.set(name, (*text).to_owned()),
            (_, Value::Bool(truth)) => parameters.set(name, truth.to_string()),
            _ => return None, // a parameter of another kind: refused
        }
    }
    Some(())
}

/// An input's shape as the model's metadata gives it: its dimensions, after a variable batch
/// dimension for a model that batches.
fn metadata_shape(spec: &TensorSpec, max_batch_size: u64) -> Vec<i64> {
    let batch = (max_batch_size > 0).then_some(-1);
    batch.into_iter().chain(spec.dims.iter().copied()).collect()
}

/// The input `value` gives for `spec`.
fn input(spec: &TensorSpec, metadata: &[i64], value: &Value<'_>) -> Option<CoreInput> {
    let datatype = DataType::from_name(&spec.datatype)?;
    let (count, data) = match value {
        Value::Array(_, text) => {
            let mut flat = Vec::new();
            flatten_count(value, &mut flat)?;
            let count = flat.len();
            let data = match datatype {
                DataType::Bool | DataType::Bytes => literals(datatype, count, value)?,
                _ => numbers(datatype, count, text)?,
            };
            (count, data)
        }
        Value::Number(text) => (1, numbers(datatype, 1, format!("[{text}]").as_bytes())?),
        Value::Str(_) | Value::Bool(_) => {
            let array = Value::Array(vec![value.clone()], b"");
            (1, literals(datatype, 1, &array)?)
        }
        _ => return None,
    };
    Some(CoreInput {
        name: spec.name.clone(),
        datatype,
        shape: shape(metadata, count)?,
        data: TensorData::Owned(data),
    })
}

/// The elements of nested arrays, in order (None for an object among them).
fn flatten_count<'v, 'a>(value: &'v Value<'a>, out: &mut Vec<&'v Value<'a>>) -> Option<()> {
    let Value::Array(items, _) = value else {
        return None;
    };
    for item in items {
        match item {
            Value::Array(..) => flatten_count(item, out)?,
            Value::Object(_) => return None,
            _ => out.push(item),
        }
    }
    Some(())
}

/// The shape `count` elements take under the metadata shape `dims`.
fn shape(dims: &[i64], count: usize) -> Option<Vec<u64>> {
    let count = u64::try_from(count).ok()?;
    let fixed = dims
        .iter()
        .filter(|&&d| d != -1)
        .try_fold(1u64, |n, &d| n.checked_mul(u64::try_from(d).ok()?))?;
    let mut shape: Vec<u64> = dims
        .iter()
        .map(|&d| {
            if d == -1 {
                Some(1)
            } else {
                u64::try_from(d).ok()
            }
        })
        .collect::<Option<_>>()?;
    match dims.iter().rposition(|&d| d == -1) {
        None => (fixed == count).then_some(shape),
        Some(last) => {
            if fixed == 0 || count % fixed != 0 {
                return None;
            }
            shape[last] = count / fixed;
            Some(shape)
        }
    }
}

/// A request's parameters in the order first named (a later value replaces an earlier one
/// in its place, as in a Python dict), each value as its JSON text.
#[derive(Default)]
struct Parameters(Vec<(String, String)>);

impl Parameters {
    fn set(&mut self, name: &str, value: String) {
        match self.0.iter_mut().find(|(n, _)| n == name) {
            Some(entry) => entry.1 = value,
            None => self.0.push((name.to_owned(), value)),
        }
    }

    /// The parameters as a JSON object's text (empty for none).
    fn text(&self) -> String {
        if self.0.is_empty() {
            return String::new();
        }
        let members: Vec<String> = self
            .0
            .iter()
            .map(|(name, value)| format!("\"{name}\": {value}"))
            .collect();
        format!("{{{}}}", members.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signature(max_batch_size: u64) -> Signature {
        let spec = |name: &str, datatype: &str, dims: Vec<i64>| TensorSpec {
            name: name.to_owned(),
            datatype: datatype.to_owned(),
            dims,
            optional: false,
        };
        Signature::new(
            "m",
            max_batch_size,
            vec![
                spec("N", "INT32", vec![1]),
                spec("TEXT", "BYTES", vec![-1]),
                spec("X", "FP32", vec![2, -1]),
            ],
            vec!["OUT".to_owned()],
        )
    }

    fn decoded(body: &str, max_batch_size: u64) -> Option<(CoreRequest, String, u64)> {
        decode_generate(body.as_bytes(), &signature(max_batch_size))
    }

    #[test]
    fn inputs_take_the_metadata_shape_and_the_rest_are_parameters() {
        let body = r#"{"N": 3, "TEXT": ["a", "bc"], "X": [[1, 2.5], [3, 4]], "id": "r1",
            "max_tokens": 16, "stream": true, "note": "x",
            "parameters": {"temperature": 0.5, "max_tokens": 8, "priority": 2}}"#;
        let (request, parameters, batch) = decoded(body, 0).unwrap();
        assert_eq!(request.id, "r1");
        assert_eq!(batch, 1);
        let shapes: Vec<(&str, &[u64])> = request
            .inputs
            .iter()
            .map(|i| (i.name.as_str(), i.shape.as_slice()))
            .collect();
        assert_eq!(shapes, [("N", &[1][..]), ("TEXT", &[2]), ("X", &[2, 2])]);
        assert_eq!(
            request.inputs[0].data,
            TensorData::Owned(3i32.to_le_bytes().to_vec())
        );
        assert_eq!(
            request.inputs[1].data,
            TensorData::Owned(b"\x01\0\0\0a\x02\0\0\0bc".to_vec())
        );
        assert_eq!(request.priority, None, "a parameter like any other");
        assert_eq!(
            parameters,
            r#"{"\u0000model-parameters-only": true, "id": "r1", "max_tokens": 8, "stream": true, "note": "x", "temperature": 0.5, "priority": 2}"#
        );
    }

    #[test]
    fn a_batching_model_gets_a_batch_of_one() {
        let (request, parameters, batch) =
            decoded(r#"{"N": 7, "TEXT": "t", "X": [1, 2]}"#, 4).unwrap();
        assert_eq!(batch, 1);
        assert_eq!(request.inputs[0].shape, [1, 1]);
        assert_eq!(request.inputs[2].shape, [1, 2, 1]);
        assert_eq!(parameters, r#"{"\u0000model-parameters-only": true}"#);
    }

    #[test]
    fn what_the_reference_path_words_is_left_to_it() {
        for body in [
            "[1]",
            r#"{"N": 1, "TEXT": "t"}"#,                 // an input missing
            r#"{"N": 1, "TEXT": "t", "X": [1, 2, 3]}"#, // no shape for 3 values
            r#"{"N": 1.5, "TEXT": "t", "X": [1, 2]}"#,  // a fraction for INT32
            r#"{"N": 1, "TEXT": 5, "X": [1, 2]}"#,      // a number for BYTES
            r#"{"N": 1, "TEXT": "t", "X": [1, 2], "p": null}"#, // a parameter of no kind
            r#"{"N": 1, "TEXT": "t", "X": [1, 2], "p": [1]}"#,
            r#"{"N": 1, "TEXT": "t", "X": [1, {"a": 2}]}"#,
            r#"{"N": 1, "TEXT": "t", "X": [1, 2], "parameters": {"N": 2}}"#, // N twice
            r#"{"N": 1, "TEXT": "t\n", "X": [1, 2]}"#,                       // an escape
            r#"{"N": 1, "TEXT": "t", "X": [1, 2], "id": 5}"#,                // an id not a string
            r#"{"N": 1, "TEXT": "t", "X": [1, 2], "parameters": 5}"#,        // not an object
            r#"{"N": 1, "TEXT": "t", "X": [1, 2], "timeout": null}"#,
        ] {
            assert!(decoded(body, 0).is_none(), "{body}");
        }
        // A nested `id` or `parameters` is a parameter; the protocol's names set nothing.
        let (request, parameters, _) = decoded(
            r#"{"N": 1, "TEXT": "t", "X": [1, 2], "priority": -1, "timeout": "5",
                "parameters": {"id": "in", "parameters": "p", "sequence_id": 3}}"#,
            0,
        )
        .unwrap();
        assert_eq!(request.id, "");
        assert_eq!((request.priority, request.timeout_us), (None, None));
        assert_eq!(
            parameters,
            r#"{"\u0000model-parameters-only": true, "priority": -1, "timeout": "5", "id": "in", "parameters": "p", "sequence_id": 3}"#
        );
    }

    #[test]
    fn shapes_follow_the_innermost_variable_dimension() {
        assert_eq!(shape(&[-1, 3, -1], 12), Some(vec![1, 3, 4]));
        assert_eq!(shape(&[2, 2], 4), Some(vec![2, 2]));
        assert_eq!(shape(&[2, 2], 3), None);
        assert_eq!(shape(&[0, -1], 0), None);
        assert_eq!(shape(&[-1], 0), Some(vec![0]));
    }
}
