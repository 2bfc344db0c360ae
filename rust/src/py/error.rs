//! `CoreError` → Python exceptions, in one place: the only code of the bindings that builds
//! an exception. Every error of the core, and every value a binding refuses, is a `CoreError`
//! that reaches Python through [`to_py_err`] (directly, through `?` and `From`, or through
//! [`without_gil`](super::gil::without_gil)).
//!
//! | [`Kind`] | Python exception |
//! |---|---|
//! | `Status` | `tritonfast.errors.error_for(Code[<code>], message)`: the `TritonError` subclass of the code |
//! | `BadValue` | `ValueError(message)` |
//! | `BadType` | `TypeError(message)` |
//! | `System` | `OSError(message)` |
//! | `Disconnected` | `ConnectionError(message)` |

use pyo3::exceptions::{PyConnectionError, PyOSError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::error::{CoreError, Kind};

/// `tritonfast.errors.Code` and `tritonfast.errors.error_for`, looked up once.
struct ErrorsModule {
    code: Py<PyAny>,
    error_for: Py<PyAny>,
}

static ERRORS: PyOnceLock<ErrorsModule> = PyOnceLock::new();

fn errors_module(py: Python<'_>) -> PyResult<&ErrorsModule> {
    ERRORS.get_or_try_init(py, || {
        let module = py.import("tritonfast.errors")?;
        Ok(ErrorsModule {
            code: module.getattr("Code")?.unbind(),
            error_for: module.getattr("error_for")?.unbind(),
        })
    })
}

/// The exception `tritonfast.errors.error_for(Code[<name>], message)` builds for `err`.
fn exception_for<'py>(py: Python<'py>, err: &CoreError) -> PyResult<Bound<'py, PyAny>> {
    let errors = errors_module(py)?;
    // `Code::name` matches exhaustively on the Rust codes; the Python enum's member names are
    // the same strings.
    let code = errors.code.bind(py).get_item(err.code.name())?;
    errors
        .error_for
        .bind(py)
        .call1((code, err.message.as_str()))
}

/// Converts a core error into its Python exception (see the module docs). If
/// `tritonfast.errors` cannot be used (a broken install), a `Status` error raises
/// `RuntimeError` with the same text instead, chained to the failure.
pub(crate) fn to_py_err(py: Python<'_>, err: &CoreError) -> PyErr {
    match err.kind {
        Kind::Status => match exception_for(py, err) {
            Ok(exception) => PyErr::from_value(exception),
            Err(lookup_failure) => {
                let fallback = PyRuntimeError::new_err(err.to_string());
                fallback.set_cause(py, Some(lookup_failure));
                fallback
            }
        },
        Kind::BadValue => PyValueError::new_err(err.message.clone()),
        Kind::BadType => PyTypeError::new_err(err.message.clone()),
        Kind::System => PyOSError::new_err(err.message.clone()),
        Kind::Disconnected => PyConnectionError::new_err(err.message.clone()),
    }
}

impl From<CoreError> for PyErr {
    fn from(err: CoreError) -> Self {
        Python::attach(|py| to_py_err(py, &err))
    }
}
