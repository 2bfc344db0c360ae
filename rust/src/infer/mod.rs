//! The request side of the core: an inference request decoded from its bytes and checked
//! against its model's [`Signature`], without Python.
//!
//! The core's decoders take on the requests clients send every day (named tensors as binary
//! data or as JSON numbers, the outputs they want, a priority or timeout, a sequence's ID and
//! flags) and answer each with
//! a [`Decoded`]: the request, ready for the model's queue; Triton's error for a request that
//! does not fit its model (worded as Triton words it); or [`Decoded::Reference`], for anything
//! else (a document Triton's parser would refuse, classification, custom parameters, escapes in
//! names, ...).  A tensor in a client's shared-memory region is decoded as the region's name
//! and window ([`RegionRef`]), which the model's lane finds in the server's registry before it
//! queues the request; any error about such a request is the reference path's to word. Those take the server's reference path, the
//! Python codec and validator, which reads and answers every request as Triton does. A
//! differential test holds the two to the same answers wherever the core answers.

mod datatype;
mod generate;
mod grpc;
mod http;
mod json;
mod request;
mod signature;

pub use datatype::DataType;
pub use generate::decode_generate;
pub use grpc::{decode_grpc, grpc_target};
pub use http::decode_http;
pub(crate) use http::fits;
pub use request::{
    BodyObject, CoreInput, CoreOutput, CoreRequest, NamedModel, ObjectPlace, OutputRegion,
    RegionRef, RegionWindow, SequenceFields, TensorData,
};
pub use signature::{Signature, TensorSpec, request_prefix};

use crate::error::CoreError;

/// What the core made of a request.
// (Decoded once per request and moved at once into its queue item: boxing the request would
// cost an allocation for nothing.)
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// A request its model takes; its batch size.
    Request(CoreRequest, u64),
    /// A request its model refuses, with Triton's error.
    Refused(CoreError),
    /// Not one the core takes on: the reference path decides.
    Reference,
}
