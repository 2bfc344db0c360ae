//! `CoreError` → the exception classes of `tritonfast.errors`, in one place.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::error::CoreError;

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

/// Converts a core error into the package's exception for its code. If `tritonfast.errors`
/// cannot be used (a broken install), raises `RuntimeError` with the same text instead, chained
/// to the failure.
pub(crate) fn to_py_err(py: Python<'_>, err: &CoreError) -> PyErr {
    match exception_for(py, err) {
        Ok(exception) => PyErr::from_value(exception),
        Err(lookup_failure) => {
            let fallback = PyRuntimeError::new_err(err.to_string());
            fallback.set_cause(py, Some(lookup_failure));
            fallback
        }
    }
}

impl From<CoreError> for PyErr {
    fn from(err: CoreError) -> Self {
        Python::attach(|py| to_py_err(py, &err))
    }
}
