//! An inference request as the core holds it once decoded: protocol-neutral, its tensors'
//! bytes either left where they arrived (a range of the request's body) or parsed into a
//! buffer of their own (numbers written as JSON).

use std::ops::Range;
use std::sync::Arc;

use super::datatype::DataType;
use crate::sequence::CorrelationId;
use crate::shm::Region;

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

/// A window of a registered shared-memory region, as a request names it (Triton's
/// `shared_memory_region`, `shared_memory_offset` and `shared_memory_byte_size` parameters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionRef {
    pub region: String,
    pub offset: u64,
    pub byte_size: u64,
}

/// A window of a region found in the server's registry: held, so that unregistering the region
/// while the request runs leaves it mapped.
#[derive(Debug, Clone)]
pub struct RegionWindow {
    pub region: Arc<Region>,
    pub offset: u64,
    pub byte_size: u64,
}

impl PartialEq for RegionWindow {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.region, &other.region)
            && (self.offset, self.byte_size) == (other.offset, other.byte_size)
    }
}

impl Eq for RegionWindow {}

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
    /// In a registered region, as the request names it: found there before the request is
    /// queued (it becomes `Owned` or `Placed`).
    Region(RegionRef),
}

impl TensorData {
    /// The tensor's bytes, given the body they may lie in (none for a placed one).
    pub fn bytes<'a>(&'a self, body: &'a [u8]) -> &'a [u8] {
        match self {
            TensorData::Body(range) => &body[range.clone()],
            TensorData::Owned(bytes) => bytes,
            TensorData::Shared(bytes) => bytes,
            TensorData::Placed(..) | TensorData::Region(_) => &[],
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
    /// Where in a client's shared memory it goes, if it does.
    pub region: Option<OutputRegion>,
}

/// Where an output bound for shared memory goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputRegion {
    /// As the request names it.
    Named(RegionRef),
    /// Found in the registry: the core writes the output there, unless the worker wrote it
    /// into the client's object itself (the request's `output_places` name it).
    Window(RegionWindow),
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
                region: None,
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

impl CoreRequest {
    /// Whether any of its tensors lies in a client's shared-memory region.
    pub fn uses_regions(&self) -> bool {
        self.inputs
            .iter()
            .any(|input| matches!(input.data, TensorData::Region(_)))
            || self
                .outputs
                .iter()
                .flatten()
                .any(|output| output.region.is_some())
    }

    /// The output it names `name`, if it names that one.
    pub fn output(&self, name: &str) -> Option<&CoreOutput> {
        self.outputs.as_ref()?.iter().find(|o| o.name == name)
    }
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
