//! The messages between the server and a model's worker process, defined once here and
//! written in a compact binary form (little end first; strings and byte strings with their
//! length before them), not pickled.
//!
//! A [`BatchMessage`] names the segment the batch's inputs lie in and describes each request;
//! a [`ReplyMessage`] names the segment the worker wrote the outputs into (or carries small
//! outputs' bytes itself) and gives each request's result. Tensors are described by [`Slot`]s:
//! where in the segment their bytes are.

use super::call::REPLY_TAG;
use crate::error::{Code, CoreError};
use crate::infer::ObjectPlace;

/// Where a tensor's bytes lie: in a message's segment, or in a client's object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub name: String,
    pub datatype: String,
    pub shape: Vec<i64>,
    pub offset: u64,
    pub len: u64,
    /// Set when the bytes lie in a client's shared-memory object instead (`offset` unused).
    pub place: Option<ObjectPlace>,
}

/// One request of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchRequest {
    pub id: String,
    /// Its parameters as a JSON object's text; empty for none.
    pub parameters: String,
    /// The outputs it names; None: every output.
    pub outputs: Option<Vec<String>>,
    pub inputs: Vec<Slot>,
    /// Outputs to write straight into a client's object.
    pub output_places: Vec<(String, ObjectPlace)>,
    /// The token of the request's trace (the parent of the calls the model makes for it);
    /// 0 for an untraced request.
    pub trace: u64,
    /// The token its streamed responses carry (a decoupled model's request); 0: none.
    pub stream: u64,
}

/// A batch for the worker to run: requests of one model version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchMessage {
    pub model_name: String,
    pub model_version: String,
    pub segment: String,
    pub segment_len: u64,
    /// The segment of the batch's cancellation flags (one byte per request).
    pub cancel_segment: String,
    pub cancel_len: u64,
    pub requests: Vec<BatchRequest>,
}

/// One request's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Response {
        model_name: String,
        model_version: String,
        id: String,
        /// The response's parameters as a JSON object's text; empty for none.
        parameters: String,
        outputs: Vec<Slot>,
    },
    Error(Code, String),
    /// Answered through its stream (a decoupled model's request: see `super::streams`).
    Streamed,
}

/// The worker's answer to a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyMessage {
    /// The segment the outputs lie in (empty when no result has any, or when they lie in
    /// `data`).
    pub segment: String,
    pub segment_len: u64,
    /// With no segment: the outputs' bytes, which the slots' offsets are within. A batch's
    /// small outputs travel here: copying them in a message costs the worker less than laying
    /// them out in its segment.
    pub data: Vec<u8>,
    pub results: Vec<Outcome>,
    /// What the worker has for the server's Python besides (its custom metrics, when they
    /// changed), opaque here; empty for nothing.
    pub extra: Vec<u8>,
}

/// Appends values in the messages' layout.
#[derive(Debug, Default)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i64(&mut self, v: i64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn bytes(&mut self, v: &[u8]) {
        self.u32(u32::try_from(v.len()).unwrap_or(u32::MAX));
        self.buf
            .extend_from_slice(&v[..v.len().min(u32::MAX as usize)]);
    }
    pub fn str(&mut self, v: &str) {
        self.bytes(v.as_bytes());
    }
    /// A response's model, version, id and parameters (a batch's reply, a call's answer).
    pub fn response_head(
        &mut self,
        model_name: &str,
        model_version: &str,
        id: &str,
        parameters: &str,
    ) {
        self.str(model_name);
        self.str(model_version);
        self.str(id);
        self.str(parameters);
    }
    pub fn count(&mut self, n: usize) {
        self.u32(u32::try_from(n).unwrap_or(u32::MAX));
    }
    pub fn slot(&mut self, slot: &Slot) {
        self.str(&slot.name);
        self.str(&slot.datatype);
        self.count(slot.shape.len());
        for &d in &slot.shape {
            self.i64(d);
        }
        self.u64(slot.offset);
        self.u64(slot.len);
        match &slot.place {
            None => self.u8(0),
            Some(place) => {
                self.u8(1);
                self.place(place);
            }
        }
    }
    /// A request's result.
    pub fn outcome(&mut self, outcome: &Outcome) {
        match outcome {
            Outcome::Response {
                model_name,
                model_version,
                id,
                parameters,
                outputs,
            } => {
                self.u8(0);
                self.response_head(model_name, model_version, id, parameters);
                self.count(outputs.len());
                for s in outputs {
                    self.slot(s);
                }
            }
            Outcome::Error(code, message) => {
                self.u8(1);
                self.str(code.name());
                self.str(message);
            }
            Outcome::Streamed => self.u8(2),
        }
    }
    /// A list of names, or none (a request that names no outputs).
    pub fn names(&mut self, names: Option<&[String]>) {
        match names {
            None => self.u8(0),
            Some(names) => {
                self.u8(1);
                self.count(names.len());
                for name in names {
                    self.str(name);
                }
            }
        }
    }
    pub fn place(&mut self, place: &ObjectPlace) {
        self.str(&place.path);
        self.u64(place.device);
        self.u64(place.inode);
        self.u64(place.offset);
        self.u64(place.byte_size);
    }
}

/// Reads values in the messages' layout; every read checks what is left.
#[derive(Debug)]
pub struct Reader<'a> {
    b: &'a [u8],
}

fn malformed() -> CoreError {
    CoreError::internal("malformed message between the server and a worker process")
}

impl<'a> Reader<'a> {
    pub fn new(b: &'a [u8]) -> Self {
        Reader { b }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], CoreError> {
        if self.b.len() < n {
            return Err(malformed());
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }
    pub fn u8(&mut self) -> Result<u8, CoreError> {
        Ok(self.take(1)?[0])
    }
    pub fn u32(&mut self) -> Result<u32, CoreError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().map_err(|_| malformed())?,
        ))
    }
    pub fn u64(&mut self) -> Result<u64, CoreError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().map_err(|_| malformed())?,
        ))
    }
    pub fn i64(&mut self) -> Result<i64, CoreError> {
        Ok(i64::from_le_bytes(
            self.take(8)?.try_into().map_err(|_| malformed())?,
        ))
    }
    pub fn bytes(&mut self) -> Result<&'a [u8], CoreError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    /// What [`Writer::response_head`] wrote: model, version, id, parameters.
    pub fn response_head(&mut self) -> Result<(String, String, String, String), CoreError> {
        Ok((self.str()?, self.str()?, self.str()?, self.str()?))
    }

    /// A status code, by its name (an unknown one reads as INTERNAL).
    pub fn code(&mut self) -> Result<Code, CoreError> {
        let name = self.str()?;
        Ok(Code::ALL
            .into_iter()
            .find(|c| c.name() == name)
            .unwrap_or(Code::Internal))
    }

    pub fn str(&mut self) -> Result<String, CoreError> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| malformed())
    }
    /// A count of items, each at least `least` bytes: never more than what is left could hold.
    pub fn count(&mut self, least: usize) -> Result<usize, CoreError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(least) > self.b.len() {
            return Err(malformed());
        }
        Ok(n)
    }
    pub fn slot(&mut self) -> Result<Slot, CoreError> {
        let name = self.str()?;
        let datatype = self.str()?;
        let dims = self.count(8)?;
        let shape = (0..dims).map(|_| self.i64()).collect::<Result<_, _>>()?;
        let offset = self.u64()?;
        let len = self.u64()?;
        let place = if self.u8()? == 0 {
            None
        } else {
            Some(self.place()?)
        };
        Ok(Slot {
            name,
            datatype,
            shape,
            offset,
            len,
            place,
        })
    }
    /// What [`Writer::outcome`] wrote.
    pub fn outcome(&mut self) -> Result<Outcome, CoreError> {
        Ok(match self.u8()? {
            0 => {
                let (model_name, model_version, id, parameters) = self.response_head()?;
                let n = self.count(4)?;
                let outputs = (0..n).map(|_| self.slot()).collect::<Result<_, _>>()?;
                Outcome::Response {
                    model_name,
                    model_version,
                    id,
                    parameters,
                    outputs,
                }
            }
            1 => {
                let code = self.code()?;
                Outcome::Error(code, self.str()?)
            }
            2 => Outcome::Streamed,
            _ => return Err(malformed()),
        })
    }
    /// What [`Writer::names`] wrote.
    pub fn names(&mut self) -> Result<Option<Vec<String>>, CoreError> {
        if self.u8()? == 0 {
            return Ok(None);
        }
        let n = self.count(4)?;
        Ok(Some((0..n).map(|_| self.str()).collect::<Result<_, _>>()?))
    }
    pub fn place(&mut self) -> Result<ObjectPlace, CoreError> {
        Ok(ObjectPlace {
            path: self.str()?,
            device: self.u64()?,
            inode: self.u64()?,
            offset: self.u64()?,
            byte_size: self.u64()?,
        })
    }
    pub fn done(&self) -> Result<(), CoreError> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(malformed())
        }
    }
}

impl BatchMessage {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.str(&self.model_name);
        w.str(&self.model_version);
        w.str(&self.segment);
        w.u64(self.segment_len);
        w.str(&self.cancel_segment);
        w.u64(self.cancel_len);
        w.count(self.requests.len());
        for r in &self.requests {
            w.str(&r.id);
            w.str(&r.parameters);
            w.names(r.outputs.as_deref());
            w.count(r.inputs.len());
            for s in &r.inputs {
                w.slot(s);
            }
            w.count(r.output_places.len());
            for (name, place) in &r.output_places {
                w.str(name);
                w.place(place);
            }
            w.u64(r.trace);
            w.u64(r.stream);
        }
        w.buf
    }

    pub fn decode(b: &[u8]) -> Result<Self, CoreError> {
        let mut r = Reader::new(b);
        let model_name = r.str()?;
        let model_version = r.str()?;
        let segment = r.str()?;
        let segment_len = r.u64()?;
        let cancel_segment = r.str()?;
        let cancel_len = r.u64()?;
        let count = r.count(4)?;
        let mut requests = Vec::with_capacity(count);
        for _ in 0..count {
            let id = r.str()?;
            let parameters = r.str()?;
            let outputs = r.names()?;
            let n = r.count(4)?;
            let inputs = (0..n).map(|_| r.slot()).collect::<Result<_, _>>()?;
            let n = r.count(4)?;
            let output_places = (0..n)
                .map(|_| Ok((r.str()?, r.place()?)))
                .collect::<Result<_, CoreError>>()?;
            let trace = r.u64()?;
            let stream = r.u64()?;
            requests.push(BatchRequest {
                id,
                parameters,
                outputs,
                inputs,
                output_places,
                trace,
                stream,
            });
        }
        r.done()?;
        Ok(BatchMessage {
            model_name,
            model_version,
            segment,
            segment_len,
            cancel_segment,
            cancel_len,
            requests,
        })
    }
}

impl ReplyMessage {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u8(REPLY_TAG);
        w.str(&self.segment);
        w.u64(self.segment_len);
        w.bytes(&self.data);
        w.count(self.results.len());
        for result in &self.results {
            w.outcome(result);
        }
        w.bytes(&self.extra);
        w.buf
    }

    /// Decodes a message that starts with [`REPLY_TAG`].
    pub fn decode(b: &[u8]) -> Result<Self, CoreError> {
        let mut r = Reader::new(b);
        if r.u8()? != REPLY_TAG {
            return Err(malformed());
        }
        let segment = r.str()?;
        let segment_len = r.u64()?;
        let data = r.bytes()?.to_vec();
        let count = r.count(1)?;
        let mut results = Vec::with_capacity(count);
        for _ in 0..count {
            results.push(r.outcome()?);
        }
        let extra = r.bytes()?.to_vec();
        r.done()?;
        Ok(ReplyMessage {
            segment,
            segment_len,
            data,
            results,
            extra,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(name: &str) -> Slot {
        Slot {
            name: name.into(),
            datatype: "FP32".into(),
            shape: vec![1, -1],
            offset: 64,
            len: 8,
            place: None,
        }
    }

    fn place() -> ObjectPlace {
        ObjectPlace {
            path: "/dev/shm/client".into(),
            device: 1,
            inode: 2,
            offset: 3,
            byte_size: 4,
        }
    }

    #[test]
    fn batches_and_replies_round_trip() {
        let batch = BatchMessage {
            model_name: "m".into(),
            model_version: "1".into(),
            segment: "tritonfast-in-1".into(),
            segment_len: 1 << 20,
            cancel_segment: "tritonfast-cancel-1".into(),
            cancel_len: 4096,
            requests: vec![
                BatchRequest {
                    id: "é".into(),
                    parameters: r#"{"a":1}"#.into(),
                    outputs: Some(vec!["OUT".into()]),
                    inputs: vec![
                        slot("IN"),
                        Slot {
                            place: Some(place()),
                            ..slot("IN2")
                        },
                    ],
                    output_places: vec![("OUT".into(), place())],
                    trace: 7,
                    stream: 0,
                },
                BatchRequest {
                    id: String::new(),
                    parameters: String::new(),
                    outputs: None,
                    inputs: vec![],
                    output_places: vec![],
                    trace: 0,
                    stream: 12,
                },
            ],
        };
        assert_eq!(BatchMessage::decode(&batch.encode()), Ok(batch));
        let reply = ReplyMessage {
            segment: "out".into(),
            segment_len: 4096,
            data: vec![],
            results: vec![
                Outcome::Response {
                    model_name: "m".into(),
                    model_version: "1".into(),
                    id: "x".into(),
                    parameters: String::new(),
                    outputs: vec![slot("OUT")],
                },
                Outcome::Error(Code::InvalidArg, "no".into()),
                Outcome::Streamed,
            ],
            extra: vec![1, 2, 3],
        };
        assert_eq!(ReplyMessage::decode(&reply.encode()), Ok(reply));
    }

    #[test]
    fn a_cut_or_padded_message_is_refused() {
        let reply = ReplyMessage {
            segment: String::new(),
            segment_len: 0,
            data: vec![9; 5],
            results: vec![],
            extra: vec![],
        };
        let bytes = reply.encode();
        assert!(ReplyMessage::decode(&bytes[..bytes.len() - 1]).is_err());
        let mut padded = bytes.clone();
        padded.push(0);
        assert!(ReplyMessage::decode(&padded).is_err());
        // A count larger than the bytes could hold is refused before anything is allocated.
        // (Four empty names and two lengths, then a count of 2^32 - 1 requests.)
        let mut huge = vec![0; 32];
        huge.extend_from_slice(&[255; 4]);
        assert!(BatchMessage::decode(&huge).is_err());
    }
}
