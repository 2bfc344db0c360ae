//! [`crate::lane::ensemble`] for the server's Python: an ensemble the core runs whole, and
//! its runs (for cancelling them).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use super::infer::PyInferSignature;
use super::lane::{PyLaneRegistry, http_reply, request_body};
use super::outbox::PyOutStream;
use crate::lane::ensemble::{Ensemble, EnsembleRun, EnsembleStep, Started};

/// A request running through an `EnsembleLane`.
#[pyclass(name = "EnsembleRun", module = "tritonfast._core", frozen)]
pub(crate) struct PyEnsembleRun(Arc<EnsembleRun<Py<PyAny>>>);

/// An ensemble version whose steps all run on lanes: the core runs its requests whole.
#[pyclass(name = "EnsembleLane", module = "tritonfast._core", frozen)]
pub(crate) struct PyEnsembleLane(Arc<Ensemble<Py<PyAny>>>);

/// A step as Python describes it: its model, its version (empty: the default), `(model input,
/// ensemble tensor)` pairs, `(model output, ensemble tensor)` pairs.
type PyStep = (String, String, Vec<(String, String)>, Vec<(String, String)>);

impl PyEnsembleLane {
    fn started(started: Started<Py<PyAny>>) -> Option<PyEnsembleRun> {
        match started {
            Started::Running(run) => Some(PyEnsembleRun(run)),
            Started::Reference => None,
        }
    }
}

#[pymethods]
impl PyEnsembleLane {
    /// `outputs`: the ensemble's outputs in its configuration's order; `steps`: every step,
    /// their models' lanes found in `registry` as each request starts.
    #[new]
    fn new(
        signature: &Bound<'_, PyInferSignature>,
        model_version: String,
        outputs: Vec<String>,
        steps: Vec<PyStep>,
        registry: &Bound<'_, PyLaneRegistry>,
    ) -> Self {
        let steps = steps
            .into_iter()
            .map(|(model, version, inputs, outputs)| EnsembleStep {
                model,
                version,
                inputs,
                outputs,
            })
            .collect();
        Self(Arc::new(Ensemble::new(
            model_version,
            signature.get().inner.clone(),
            outputs,
            steps,
            Arc::clone(&registry.get().0),
        )))
    }

    /// What the requests it ran came to: `{"success": (count, ns), "fail": (count, ns),
    /// "inferences", "last_ms", "queue_ns", "compute_input_ns", "compute_infer_ns",
    /// "compute_output_ns"}`.
    fn counts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let counts = self.0.counts();
        let dict = PyDict::new(py);
        dict.set_item("success", (counts.success, counts.success_ns))?;
        dict.set_item("fail", (counts.fail, counts.fail_ns))?;
        dict.set_item("inferences", counts.inferences)?;
        dict.set_item("last_ms", counts.last_ms)?;
        dict.set_item("queue_ns", counts.spent.queue)?;
        dict.set_item("compute_input_ns", counts.spent.compute_input)?;
        dict.set_item("compute_infer_ns", counts.spent.compute_infer)?;
        dict.set_item("compute_output_ns", counts.spent.compute_output)?;
        Ok(dict)
    }

    /// A `generate` request: always the reference path's (an ensemble's generate answers are
    /// made from the responses of its steps in Python). The signature of
    /// `Lane.submit_generate_http`.
    #[allow(clippy::unused_self)]
    fn submit_generate_http(
        &self,
        body: &Bound<'_, PyAny>,
        stream: &Bound<'_, PyOutStream>,
        minor: u8,
        keep_alive: bool,
        token: u64,
    ) -> Option<PyEnsembleRun> {
        let _ = (body, stream, minor, keep_alive, token);
        None
    }

    /// A `generate_stream` request: always the reference path's (an ensemble is not a
    /// decoupled model's lane). The signature of `Lane.submit_generate_events`.
    fn submit_generate_events(
        &self,
        body: &Bound<'_, PyAny>,
        stream: &Bound<'_, PyOutStream>,
        token: u64,
    ) -> Option<PyEnsembleRun> {
        let _ = (self, body, stream, token);
        None
    }

    /// As `Lane.submit_http`: an `EnsembleRun` once started, None when the reference path
    /// must take the request (it words every refusal). (Its steps copy their inputs:
    /// `body_object` is not used.)
    #[pyo3(signature = (body, json_length, stream, minor, keep_alive, token, body_object=None))]
    #[allow(clippy::too_many_arguments)]
    fn submit_http(
        &self,
        py: Python<'_>,
        body: &Bound<'_, PyAny>,
        json_length: usize,
        stream: &Bound<'_, PyOutStream>,
        minor: u8,
        keep_alive: bool,
        token: u64,
        body_object: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<PyEnsembleRun>> {
        let _ = body_object;
        let body = request_body(body)?;
        let reply = http_reply(stream, minor, keep_alive, token);
        let ensemble = &self.0;
        Ok(Self::started(
            py.detach(|| ensemble.submit_http(body, json_length, reply)),
        ))
    }

    /// As `Lane.submit_grpc`: the reply, serialized, goes to the `deliver` of the lane whose
    /// step finishes the request, with `sink`.
    fn submit_grpc(
        &self,
        py: Python<'_>,
        message: &Bound<'_, PyBytes>,
        sink: Py<PyAny>,
    ) -> Option<PyEnsembleRun> {
        let message = message.as_bytes();
        let ensemble = &self.0;
        Self::started(py.detach(|| ensemble.submit_grpc(message, sink)))
    }

    /// Stops the run's queued steps: True when it will not be answered.
    #[allow(clippy::unused_self)]
    fn cancel(&self, py: Python<'_>, run: &Bound<'_, PyEnsembleRun>) -> bool {
        let run = &run.get().0;
        py.detach(|| Ensemble::cancel(run))
    }
}
