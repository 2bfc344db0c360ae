//! An inference request as the core holds it once decoded: protocol-neutral, its tensors'
//! bytes either left where they arrived (a range of the request's body) or parsed into a
//! buffer of their own (numbers written as JSON).

use std::ops::Range;
use std::sync::Arc;

use super::datatype::DataType;
use crate::error::CoreError;
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

/// A request body received into a shared-memory object of its own, from the object's start:
/// the object as a worker opens it (its path, and identity: device and inode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyObject {
    pub path: String,
    pub device: u64,
    pub inode: u64,
}

/// A window of a registered shared-memory region, as a request names it (Triton's
/// `shared_memory_region`, `shared_memory_offset` and `shared_memory_byte_size` parameters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionRef {
    pub region: String,
    pub offset: u64,
    pub byte_size: u64,
}

/// A tensor's shared-memory parameters as a decoder reads them, each at most once.
#[derive(Debug, Default)]
pub(crate) struct RegionParams {
    region: Option<String>,
    offset: Option<u64>,
    byte_size: Option<u64>,
}

impl RegionParams {
    /// `shared_memory_region`; None when it was given already.
    pub(crate) fn set_region(&mut self, name: String) -> Option<()> {
        self.region.is_none().then(|| self.region = Some(name))
    }

    /// `shared_memory_offset` or `shared_memory_byte_size`; None for another name, or one
    /// given already.
    pub(crate) fn set_number(&mut self, key: &str, value: u64) -> Option<()> {
        let slot = match key {
            "shared_memory_offset" => &mut self.offset,
            "shared_memory_byte_size" => &mut self.byte_size,
            _ => return None,
        };
        slot.is_none().then(|| *slot = Some(value))
    }

    /// The window they name: None when no parameter was given; an error when they name one
    /// in part (no region or no size: the reference path words that).
    pub(crate) fn named(self) -> Result<Option<RegionRef>, ()> {
        match (self.region, self.byte_size) {
            (Some(region), Some(byte_size)) => Ok(Some(RegionRef {
                region,
                offset: self.offset.unwrap_or(0),
                byte_size,
            })),
            (None, None) if self.offset.is_none() => Ok(None),
            _ => Err(()),
        }
    }
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
    /// queued (it becomes `Window`, `Placed`, or for BYTES `Owned`).
    Region(RegionRef),
    /// In a registered region, found there: copied from the region straight into the batch's
    /// segment.
    Window(RegionWindow),
}

impl TensorData {
    /// The tensor's bytes, given the body they may lie in (none for one in a client's
    /// shared memory: see [`Self::len`]).
    pub fn bytes<'a>(&'a self, body: &'a [u8]) -> &'a [u8] {
        match self {
            TensorData::Body(range) => &body[range.clone()],
            TensorData::Owned(bytes) => bytes,
            TensorData::Shared(bytes) => bytes,
            TensorData::Placed(..) | TensorData::Region(_) | TensorData::Window(_) => &[],
        }
    }

    /// How many bytes it takes in a batch's segment.
    pub fn len(&self, body: &[u8]) -> usize {
        match self {
            TensorData::Window(window) => usize::try_from(window.byte_size).unwrap_or(usize::MAX),
            _ => self.bytes(body).len(),
        }
    }

    /// Copies it into `destination` (`self.len(body)` bytes).
    ///
    /// # Errors
    /// A region's window its object no longer backs.
    pub fn copy_into(&self, body: &[u8], destination: &mut [u8]) -> Result<(), CoreError> {
        if let TensorData::Window(window) = self {
            return window.region.read_into(window.offset, destination);
        }
        destination.copy_from_slice(self.bytes(body));
        Ok(())
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
    /// The shared-memory object its body was received into, when inputs of it are read
    /// there by the worker (`TensorData::Placed` in it).
    pub body_object: Option<Box<BodyObject>>,
    /// The token of its trace, for the calls its model makes (0: untraced; the server's
    /// Python keeps the traces).
    pub trace: u64,
    /// Its sequence parameters (`sequence_id`, `sequence_start`, `sequence_end`), when it set
    /// any.
    pub sequence: Option<SequenceFields>,
    /// A gRPC stream's request that asked for an empty final response
    /// (`triton_enable_empty_final_response`): the model as it named it, which that response
    /// names.
    pub empty_final: Option<NamedModel>,
}

/// A model's name and version as a request names them (the version may be empty).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamedModel {
    pub name: String,
    pub version: String,
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
