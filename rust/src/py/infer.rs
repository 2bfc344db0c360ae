//! [`crate::infer`] for the frontends: a model's signature, and requests decoded against it
//! without the GIL.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use super::error::to_py_err;
use crate::infer::{Decoded, Signature, TensorSpec, decode_http, grpc_target};

/// The model name and version a serialized `ModelInferRequest` names; None when it is not
/// one the core can read (the reference path answers it).
#[pyfunction]
pub(crate) fn grpc_model(message: &[u8]) -> Option<(String, String)> {
    grpc_target(message)
}

/// A model's inputs and outputs, mirrored from its configuration at load.
#[pyclass(name = "InferSignature", module = "tritonfast._core", frozen)]
pub(crate) struct PyInferSignature {
    pub(super) inner: Signature,
}

/// `(id, inputs, outputs, binary_default, priority, timeout, batch_size)` of a decoded request:
/// inputs as `(name, datatype, shape, bytes)`, outputs as `(name, binary)` or None.
type DecodedTuple<'py> = Bound<'py, PyTuple>;

#[pymethods]
impl PyInferSignature {
    /// `inputs`: `(name, datatype, dims, optional)` each (the wire name of the datatype, the
    /// dimensions without the batch dimension); `outputs`: the outputs' names.
    #[new]
    fn new(
        model: String,
        max_batch_size: u64,
        inputs: Vec<(String, String, Vec<i64>, bool)>,
        outputs: Vec<String>,
    ) -> Self {
        let inputs = inputs
            .into_iter()
            .map(|(name, datatype, dims, optional)| TensorSpec {
                name,
                datatype,
                dims,
                optional,
            })
            .collect();
        PyInferSignature {
            inner: Signature::new(model, max_batch_size, inputs, outputs),
        }
    }

    /// The HTTP request `body` (its JSON header `json_length` bytes long) decoded and checked;
    /// None when the reference path must decide (shared-memory references included). Raises Triton's error for a request its
    /// model refuses.
    fn decode_http<'py>(
        &self,
        py: Python<'py>,
        body: &Bound<'py, PyBytes>,
        json_length: usize,
    ) -> PyResult<Option<DecodedTuple<'py>>> {
        let bytes = body.as_bytes();
        // `bytes` objects never change, and `body` keeps this one alive until we return.
        let decoded = py.detach(|| decode_http(bytes, json_length, &self.inner));
        let (request, batch_size) = match decoded {
            Decoded::Reference => return Ok(None),
            Decoded::Request(request, _) if request.uses_regions() => return Ok(None),
            Decoded::Refused(error) => return Err(to_py_err(py, &error)),
            Decoded::Request(request, batch_size) => (request, batch_size),
        };
        let inputs = request
            .inputs
            .iter()
            .map(|input| {
                (
                    input.name.as_str(),
                    input.datatype.name(),
                    PyTuple::new(py, &input.shape).map(Bound::unbind),
                    PyBytes::new(py, input.data.bytes(bytes)).unbind(),
                )
            })
            .map(|(n, d, s, b)| Ok((n, d, s?, b)))
            .collect::<PyResult<Vec<_>>>()?;
        let outputs = request.outputs.as_ref().map(|outputs| {
            outputs
                .iter()
                .map(|o| (o.name.as_str(), o.binary))
                .collect::<Vec<_>>()
        });
        let fields = (
            request.id.as_str(),
            inputs,
            outputs,
            request.binary_default,
            request.priority,
            request.timeout_us,
            batch_size,
        );
        Ok(Some(fields.into_pyobject(py)?))
    }
}
