//! The only `PyO3` code in the crate: the `tritonfast._core` extension module.
//!
//! It converts types, maps [`CoreError`](crate::CoreError) to the package's exceptions
//! ([`error`]), and releases the GIL around every wait ([`gil::without_gil`]).

mod callreplies;
mod copy;
mod ensemble;
mod error;
mod gil;
mod handoff;
mod infer;
mod inflate;
mod jsondata;
mod jsonscan;
mod lane;
mod outbox;
mod perf;
mod pool;
mod queue;
mod sequence;
mod shm;
mod stats;
mod wire;

use pyo3::prelude::*;

/// `tritonfast._core`: the Rust core's Python face.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("QUEUE_FULL_MESSAGE", crate::queue::QUEUE_FULL_MESSAGE)?;
    m.add_class::<queue::PyRequestQueue>()?;
    m.add_class::<queue::PyQueuePolicy>()?;
    m.add_class::<queue::PyTicket>()?;
    m.add_class::<queue::PyBatch>()?;
    m.add_class::<sequence::PySequenceBatcher>()?;
    m.add_class::<sequence::PySequenceTicket>()?;
    m.add_class::<handoff::PyHandoff>()?;
    m.add_class::<handoff::HandoffDone>()?;
    m.add_class::<ensemble::PyEnsembleLane>()?;
    m.add_class::<ensemble::PyEnsembleRun>()?;
    m.add_class::<infer::PyInferSignature>()?;
    m.add_class::<inflate::PyInflater>()?;
    m.add_class::<callreplies::PyCallReplies>()?;
    m.add_class::<callreplies::PyRequestReplies>()?;
    m.add_class::<lane::PyLane>()?;
    m.add_class::<lane::PyLaneTicket>()?;
    m.add_class::<lane::PyLaneCompletions>()?;
    m.add_class::<lane::PyEventWriter>()?;
    m.add_class::<lane::PyLaneRegistry>()?;
    m.add_class::<lane::PyLaneWorkerLink>()?;
    m.add_class::<lane::PyLaneWorkerChannel>()?;
    m.add_class::<outbox::PyOutbox>()?;
    m.add_class::<outbox::PyOutStream>()?;
    m.add_class::<perf::PyLoadRun>()?;
    m.add_class::<pool::PyTensorPool>()?;
    m.add_class::<pool::PyPooledBuffer>()?;
    m.add_class::<pool::PyOwnedBytes>()?;
    m.add_class::<shm::PySharedMemoryRegistry>()?;
    m.add_class::<shm::RegionView>()?;
    m.add_function(wrap_pyfunction!(infer::grpc_model, m)?)?;
    m.add_function(wrap_pyfunction!(jsonscan::json_error, m)?)?;
    m.add_function(wrap_pyfunction!(jsondata::json_input_data, m)?)?;
    m.add_function(wrap_pyfunction!(jsondata::json_numbers, m)?)?;
    m.add_function(wrap_pyfunction!(copy::copy_into, m)?)?;
    m.add_function(wrap_pyfunction!(wire::split_message_field, m)?)?;
    m.add_function(wrap_pyfunction!(wire::length_delimited_prefix, m)?)?;
    Ok(())
}
