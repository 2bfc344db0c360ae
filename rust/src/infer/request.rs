//! An inference request as the core holds it once decoded: protocol-neutral, its tensors'
//! bytes either left where they arrived (a range of the request's body) or parsed into a
//! buffer of their own (numbers written as JSON).

use std::ops::Range;
use std::sync::Arc;

use super::datatype::DataType;
use crate::sequence::CorrelationId;

/// Where a tensor lies in a client's system shared-memory object: the object's path and
/// identity (device, inode: a worker maps it only if it is still the same object) and the
/// window of it the tensor occupies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectPlace {
    pub path: String,
    pub device: u64,
    pub inode: u64,
    pub offset: u64,
    pub byte_size: u64,
}

/// Where an input's bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TensorData {
    /// A range of the request's body (binary data, raw contents): not copied.
    Body(Range<usize>),
    /// Parsed from the request into a buffer of its own, in the wire's layout.
    Owned(Vec<u8>),
    /// A buffer other requests share (an ensemble's tensor, taken by several steps).
    Shared(Arc<Vec<u8>>),
    /// In a client's shared-memory object, `len` bytes: the worker reads it there.
    Placed(ObjectPlace, u64),
}

impl TensorData {
    /// The tensor's bytes, given the body they may lie in (none for a placed one).
    pub fn bytes<'a>(&'a self, body: &'a [u8]) -> &'a [u8] {
        match self {
            TensorData::Body(range) => &body[range.clone()],
            TensorData::Owned(bytes) => bytes,
            TensorData::Shared(bytes) => bytes,
            TensorData::Placed(..) => &[],
        }
    }
}

/// One input tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreInput {
    pub name: String,
    pub datatype: DataType,
    pub shape: Vec<u64>,
    pub data: TensorData,
}

/// An output the request names, and whether it comes back as binary data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreOutput {
    pub name: String,
    pub binary: bool,
}

impl CoreOutput {
    /// The outputs `names` asks for, as a request that is not HTTP names them (binary is
    /// HTTP's question).
    pub fn named(names: Vec<String>) -> Vec<CoreOutput> {
        names
            .into_iter()
            .map(|name| CoreOutput {
                name,
                binary: false,
            })
            .collect()
    }
}

/// A decoded inference request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CoreRequest {
    /// The client's id; empty when it gave none.
    pub id: String,
    pub inputs: Vec<CoreInput>,
    /// The outputs it names; None: every output of the model.
    pub outputs: Option<Vec<CoreOutput>>,
    /// Whether outputs it does not name come back as binary data (HTTP's
    /// `binary_data_output`).
    pub binary_default: bool,
    /// Its `priority` parameter, when it set one.
    pub priority: Option<u64>,
    /// Its `timeout` parameter (microseconds), when it set one.
    pub timeout_us: Option<u64>,
    /// Outputs the model's worker writes straight into a client's shared-memory object.
    pub output_places: Vec<(String, ObjectPlace)>,
    /// The token of its trace, for the calls its model makes (0: untraced; the server's
    /// Python keeps the traces).
    pub trace: u64,
    /// Its sequence parameters (`sequence_id`, `sequence_start`, `sequence_end`), when it set
    /// any.
    pub sequence: Option<SequenceFields>,
}

/// A request's place in a sequence, as its parameters give it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceFields {
    /// Its correlation ID (0 when only a flag was given).
    pub id: CorrelationId,
    pub start: bool,
    pub end: bool,
}

impl Default for SequenceFields {
    fn default() -> Self {
        SequenceFields {
            id: CorrelationId::Number(0),
            start: false,
            end: false,
        }
    }
}
