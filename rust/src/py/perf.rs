//! `tritonfast._core.LoadRun`: [`crate::perf`]'s load generator for `tritonfast perf`, started,
//! read and stopped from Python while its threads run without the GIL.

use parking_lot::Mutex;
use pyo3::exceptions::{PyConnectionError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::perf::{Load, LoadSpec, Pace, Protocol, Record};

/// Bytes per record in `take`'s answer: seven little-endian u64 (start, sent, first byte, end
/// in nanoseconds on the load's clock; ok; responses; the payload's index).
const RECORD_BYTES: usize = 56;

/// A running load against one server.
#[pyclass(name = "LoadRun", module = "tritonfast._core", frozen)]
pub(crate) struct PyLoadRun {
    load: Mutex<Load>,
}

#[pymethods]
impl PyLoadRun {
    /// Connects and starts sending. `protocol` is `"http"` (each payload a whole HTTP/1.1
    /// request), `"grpc"` (each payload a serialized message for `path`) or `"grpc-stream"`
    /// (`ModelStreamInfer`, one stream per context); exactly one of `concurrency` and `rate`
    /// (requests per second) is given. `scripts`: the payloads' order, one list per context;
    /// `serial`: an open loop sends a script's next request once its last is answered.
    #[new]
    #[pyo3(signature = (protocol, address, payloads, *, path = String::new(), threads = 1,
        connections_per_thread = 1, concurrency = None, rate = None, poisson = false, seed = 0,
        scripts = Vec::new(), decoupled = false, serial = false))]
    #[allow(clippy::too_many_arguments)] // keyword arguments, one per setting of the load
    fn new(
        py: Python<'_>,
        protocol: &str,
        address: String,
        payloads: Vec<Vec<u8>>,
        path: String,
        threads: usize,
        connections_per_thread: usize,
        concurrency: Option<usize>,
        rate: Option<f64>,
        poisson: bool,
        seed: u64,
        scripts: Vec<Vec<usize>>,
        decoupled: bool,
        serial: bool,
    ) -> PyResult<Self> {
        let protocol = match protocol {
            "http" => Protocol::Http,
            "grpc" => Protocol::Grpc,
            "grpc-stream" => Protocol::GrpcStream,
            other => return Err(PyValueError::new_err(format!("unknown protocol {other:?}"))),
        };
        let pace = match (concurrency, rate) {
            (Some(n), None) => Pace::Concurrency(n),
            (None, Some(per_second)) => Pace::Rate {
                per_second,
                poisson,
            },
            _ => return Err(PyValueError::new_err("give either concurrency or rate")),
        };
        let spec = LoadSpec {
            protocol,
            address,
            path,
            payloads,
            scripts,
            decoupled,
            serial,
            threads,
            connections_per_thread,
            pace,
            seed,
        };
        match py.detach(|| Load::start(spec)) {
            Ok(load) => Ok(Self {
                load: Mutex::new(load),
            }),
            Err(text) if text.starts_with("cannot connect") => {
                Err(PyConnectionError::new_err(text))
            }
            Err(text) => Err(PyValueError::new_err(text)),
        }
    }

    /// Nanoseconds since the load began, on the records' clock.
    fn now(&self) -> u64 {
        self.load.lock().now()
    }

    /// The requests answered since the last call, packed (see `RECORD_BYTES`).
    fn take<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let records = py.detach(|| self.load.lock().take());
        PyBytes::new_with(py, records.len() * RECORD_BYTES, |out| {
            for (record, slot) in records.iter().zip(out.chunks_exact_mut(RECORD_BYTES)) {
                pack(record, slot);
            }
            Ok(())
        })
        .expect("filling a bytes object cannot fail")
    }

    /// `(succeeded, failed)` so far.
    fn counts(&self) -> (u64, u64) {
        let counts = self.load.lock().counts();
        (counts.succeeded, counts.failed)
    }

    /// The distinct texts of the first failures.
    fn errors(&self) -> Vec<String> {
        self.load.lock().errors()
    }

    /// Sends nothing more and waits for what is in flight (at most 10 s).
    fn stop(&self, py: Python<'_>) {
        py.detach(|| self.load.lock().stop());
    }
}

fn pack(record: &Record, slot: &mut [u8]) {
    let fields = [
        record.start,
        record.sent,
        record.first_byte,
        record.end,
        u64::from(record.ok),
        u64::from(record.responses),
        u64::from(record.payload),
    ];
    for (field, bytes) in fields.iter().zip(slot.chunks_exact_mut(8)) {
        bytes.copy_from_slice(&field.to_le_bytes());
    }
}
