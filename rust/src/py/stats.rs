//! `StatsSnapshot` → the dict `RequestQueue.statistics()` returns.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::stats::{StatDuration, StatsSnapshot};

fn duration(py: Python<'_>, stat: StatDuration) -> PyResult<Bound<'_, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("count", stat.count)?;
    dict.set_item("ns", stat.ns)?;
    Ok(dict)
}

/// The snapshot in the layout of Triton's statistics extension (one `model_stats` entry, less
/// `name` and `version`), plus `failure_reasons`. Documented in `tritonfast.runtime.scheduler`.
pub(crate) fn snapshot_dict<'py>(
    py: Python<'py>,
    snap: &StatsSnapshot,
) -> PyResult<Bound<'py, PyDict>> {
    let inference = PyDict::new(py);
    inference.set_item("success", duration(py, snap.success)?)?;
    inference.set_item("fail", duration(py, snap.fail)?)?;
    inference.set_item("queue", duration(py, snap.queue)?)?;
    inference.set_item("compute_input", duration(py, snap.compute_input)?)?;
    inference.set_item("compute_infer", duration(py, snap.compute_infer)?)?;
    inference.set_item("compute_output", duration(py, snap.compute_output)?)?;
    // No response cache yet: Triton reports zeros.
    inference.set_item("cache_hit", duration(py, StatDuration::default())?)?;
    inference.set_item("cache_miss", duration(py, StatDuration::default())?)?;

    let batches = PyList::empty(py);
    for batch in &snap.batch_stats {
        let entry = PyDict::new(py);
        entry.set_item("batch_size", batch.batch_size)?;
        entry.set_item("compute_input", duration(py, batch.compute_input)?)?;
        entry.set_item("compute_infer", duration(py, batch.compute_infer)?)?;
        entry.set_item("compute_output", duration(py, batch.compute_output)?)?;
        batches.append(entry)?;
    }

    let failures = PyDict::new(py);
    for (reason, count) in snap.failures {
        failures.set_item(reason.name(), count)?;
    }

    let dict = PyDict::new(py);
    dict.set_item("last_inference", snap.last_inference_ms)?;
    dict.set_item("inference_count", snap.inference_count)?;
    dict.set_item("execution_count", snap.execution_count)?;
    dict.set_item("inference_stats", inference)?;
    dict.set_item("batch_stats", batches)?;
    dict.set_item("failure_reasons", failures)?;
    Ok(dict)
}
