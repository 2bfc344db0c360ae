//! Rust core of tritonfast: the per-model request queue and dynamic batching that feed model
//! instances.
//!
//! Everything here is pure Rust and tested with `cargo test`. The `python` feature (turned on by
//! maturin) adds the `py` module, the only code that knows about Python.

pub mod error;
pub mod queue;

#[cfg(feature = "python")]
mod py;

pub use error::{Code, CoreError};
pub use queue::{BatchPolicy, PopResult, Queued, RequestQueue};
