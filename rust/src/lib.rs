//! Rust core of tritonfast: the per-model request queue, dynamic batching and statistics that
//! feed model instances, the tensor pool, clients' shared-memory regions, the check of request
//! JSON against Triton's grammar, and the inflating of compressed request bodies.
//!
//! Everything here is pure Rust and tested with `cargo test`. The `python` feature (turned on by
//! maturin) adds the `py` module, the only code that knows about Python.

// POSIX shared memory and `mmap` are part of the core's job, and the loop handoff wakes the
// event loop through an `eventfd`, which only Linux has.
#[cfg(not(target_os = "linux"))]
compile_error!("tritonfast's core needs Linux (POSIX shared memory, eventfd)");

pub mod batcher;
pub mod copy;
pub mod error;
pub mod handoff;
pub mod infer;
pub mod inflate;
pub mod jsondata;
pub mod jsonscan;
pub mod lane;
pub mod latency;
pub mod outbox;
pub mod perf;
pub mod pool;
pub mod queue;
pub mod sequence;
pub mod shm;
pub mod slice;
pub mod spin;
pub mod stats;
pub mod wake;
pub mod wire;

#[cfg(feature = "python")]
mod py;

pub use error::{Code, CoreError};
pub use pool::{PoolBuffer, PoolStats, TensorPool};
pub use queue::{
    Batch, BatchPolicy, PopResult, QUEUE_FULL_MESSAGE, QueueConfig, QueuePolicy, Queued,
    RequestMeta, RequestQueue, Ticket, TicketStatus, TimeoutAction,
};
pub use stats::{
    BatchStat, ComputeTimes, FailureReason, ModelStats, RequestTiming, StatDuration, StatsSnapshot,
};
