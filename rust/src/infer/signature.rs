//! A model's inputs and outputs, mirrored into the core when the model loads, and the check of
//! a decoded request against them, with Triton's messages (those of the server's reference
//! validator, `runtime/validate.py`, in the same order).

use std::collections::HashSet;
use std::fmt::Write;

use super::request::CoreRequest;
use crate::error::CoreError;

/// One input or output as the model's configuration declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    /// The wire name of its datatype (`"INVALID"` for one the configuration left unset).
    pub datatype: String,
    /// Its dimensions without the batch dimension; -1 for any size.
    pub dims: Vec<i64>,
    pub optional: bool,
}

/// What a model takes and gives.
#[derive(Debug, Clone)]
pub struct Signature {
    model: String,
    max_batch_size: u64,
    inputs: Vec<TensorSpec>,
    outputs: Vec<String>,
    required: usize,
}

/// Triton adds this hint when a batching model gets an input without its batch dimension.
const BATCH_DIM_NOTE: &str = "NOTE: Setting a non-zero max_batch_size in the model config \
requires a batch dimension to be prepended to each input shape. If you want to specify the full \
shape including the batch dim in your input dims config, try setting max_batch_size to zero. See \
the model configuration docs for more info on max_batch_size.";

/// How Triton's core starts messages about a request.
pub fn request_prefix(id: &str) -> String {
    format!(
        "[request id: {}] ",
        if id.is_empty() { "<id_unknown>" } else { id }
    )
}

fn shape_text(shape: impl IntoIterator<Item = i64>) -> String {
    let mut text = String::from("[");
    for (k, d) in shape.into_iter().enumerate() {
        if k > 0 {
            text.push(',');
        }
        let _ = write!(text, "{d}");
    }
    text.push(']');
    text
}

fn name_list<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let quoted: Vec<String> = names.into_iter().map(|n| format!("'{n}'")).collect();
    format!("[{}]", quoted.join(","))
}

impl Signature {
    pub fn new(
        model: impl Into<String>,
        max_batch_size: u64,
        inputs: Vec<TensorSpec>,
        outputs: Vec<String>,
    ) -> Self {
        let required = inputs.iter().filter(|s| !s.optional).count();
        Signature {
            model: model.into(),
            max_batch_size,
            inputs,
            outputs,
            required,
        }
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    pub fn max_batch_size(&self) -> u64 {
        self.max_batch_size
    }

    pub fn input(&self, name: &str) -> Option<&TensorSpec> {
        self.inputs.iter().find(|s| s.name == name)
    }

    /// Checks `request`; returns its batch size (1 for a model that does not batch).
    ///
    /// # Errors
    /// `INVALID_ARG` with Triton's message for the first thing wrong.
    pub fn check(&self, request: &CoreRequest) -> Result<u64, CoreError> {
        let model = &self.model;
        let refused = |message: String| {
            CoreError::invalid_arg(format!("{}{message}", request_prefix(&request.id)))
        };
        let count = request.inputs.len();
        if count > self.inputs.len() || count < self.required {
            let sent: Vec<&str> = request.inputs.iter().map(|t| t.name.as_str()).collect();
            return Err(refused(self.count_error(count, &sent, &sent)));
        }
        let mut seen: HashSet<&str> = HashSet::with_capacity(count);
        let mut batch_size = 1;
        for tensor in &request.inputs {
            let Some(spec) = self.input(&tensor.name) else {
                return Err(CoreError::invalid_arg(format!(
                    "unexpected inference input '{}' for model '{model}'",
                    tensor.name
                )));
            };
            if !seen.insert(&tensor.name) {
                return Err(refused(format!(
                    "input '{}' is specified more than once for model '{model}'",
                    tensor.name
                )));
            }
            if tensor.datatype.name() != spec.datatype {
                return Err(refused(format!(
                    "inference input '{}' data-type is '{}', but model '{model}' expects '{}'",
                    tensor.name,
                    tensor.datatype.name(),
                    spec.datatype
                )));
            }
            let mut shape = &tensor.shape[..];
            if self.max_batch_size > 0 {
                if shape.len() != spec.dims.len() + 1 {
                    let error = self.shape_error(&tensor.name, &tensor.shape, spec);
                    return Err(refused(format!("{error}{BATCH_DIM_NOTE}")));
                }
                let this_batch = shape[0];
                if this_batch > self.max_batch_size {
                    return Err(refused(format!(
                        "inference request batch-size must be <= {} for '{model}'",
                        self.max_batch_size
                    )));
                }
                if seen.len() > 1 && this_batch != batch_size {
                    return Err(refused(format!(
                        "input '{}' batch size does not match other inputs for '{model}'",
                        tensor.name
                    )));
                }
                batch_size = this_batch;
                shape = &shape[1..];
            }
            let matches = shape.len() == spec.dims.len()
                && shape
                    .iter()
                    .zip(&spec.dims)
                    .all(|(&s, &d)| d == -1 || u64::try_from(d).is_ok_and(|d| d == s));
            if !matches {
                return Err(refused(self.shape_error(&tensor.name, &tensor.shape, spec)));
            }
        }
        if self
            .inputs
            .iter()
            .any(|s| !s.optional && !seen.contains(s.name.as_str()))
        {
            let sent: Vec<&str> = request.inputs.iter().map(|t| t.name.as_str()).collect();
            return Err(refused(self.count_error(seen.len(), &sent, &sent)));
        }
        if let Some(outputs) = &request.outputs {
            for output in outputs {
                if !self.outputs.contains(&output.name) {
                    return Err(CoreError::invalid_arg(format!(
                        "unexpected inference output '{}' for model '{model}'",
                        output.name
                    )));
                }
            }
        }
        Ok(batch_size)
    }

    fn count_error(&self, count: usize, sent: &[&str], present: &[&str]) -> String {
        let every = self.inputs.len();
        let expected = if self.required == every {
            format!("{every} inputs")
        } else {
            format!("number of inputs between {} and {every}", self.required)
        };
        let missing: Vec<&str> = self
            .inputs
            .iter()
            .filter(|s| !s.optional && !present.contains(&s.name.as_str()))
            .map(|s| s.name.as_str())
            .collect();
        // With none missing (too many inputs) Triton's list of them reads "]".
        let missing_list = if missing.is_empty() {
            "]".to_owned()
        } else {
            name_list(missing)
        };
        format!(
            "expected {expected} but got {count} inputs for model '{}'. Got input(s) {}, but \
             missing required input(s) {missing_list}. Please provide all required input(s).",
            self.model,
            name_list(sent.iter().copied())
        )
    }

    fn shape_error(&self, name: &str, shape: &[u64], spec: &TensorSpec) -> String {
        let batch = (self.max_batch_size > 0).then_some(-1);
        let expected = shape_text(batch.into_iter().chain(spec.dims.iter().copied()));
        let got = shape_text(shape.iter().map(|&d| i64::try_from(d).unwrap_or(i64::MAX)));
        format!(
            "unexpected shape for input '{name}' for model '{}'. Expected {expected}, got {got}. ",
            self.model
        )
    }
}
