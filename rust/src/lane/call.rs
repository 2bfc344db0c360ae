//! Calls a model makes to the server (BLS `exec()`) that the core answers itself: the
//! worker sends a [`CallMessage`] over its channel while its batch runs, the driver thread
//! waiting for that batch's reply reads it, finds the target's lane in the server's
//! [`LaneRegistry`], checks the request against the target's signature and queues it there;
//! the driver thread that runs it sends the [`CallAnswer`] back on the caller's channel. A
//! call whose target is not on a lane (an ensemble, a decoupled or sequence model, an unknown
//! name) is answered [`CallAnswer::Reroute`]: the worker then makes it through the server's
//! Python, which answers every call as Triton does.
//!
//! While a call is in flight its instance counts as waiting on the server; a call to a model
//! all of whose instances wait so (a model calling itself, a cycle of calls) is refused at
//! once, as the reference path refuses it, instead of waiting forever.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::RwLock;

use super::channel::Channel;
use super::message::{Reader, Writer};
use super::{Lane, OwnedResponse};
use crate::error::{Code, CoreError};

/// The first byte of what a worker sends: a batch's reply, a call, or a decoupled model's
/// responses (`super::streams`).
pub const REPLY_TAG: u8 = 0;
pub const CALL_TAG: u8 = 1;
pub const STREAM_TAG: u8 = 2;

/// An input of a call: name, datatype, shape and its bytes (in the message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallTensor {
    pub name: String,
    pub datatype: String,
    pub shape: Vec<i64>,
    pub data: Vec<u8>,
}

/// A model's call to another model, as its worker sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallMessage {
    pub model_name: String,
    /// Empty for the model's default version.
    pub model_version: String,
    pub id: String,
    /// Its parameters as a JSON object's text; empty for none.
    pub parameters: String,
    pub priority: u64,
    pub timeout_us: u64,
    /// The outputs it asks for; None: all.
    pub outputs: Option<Vec<String>>,
    pub inputs: Vec<CallTensor>,
}

/// What a call came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallAnswer {
    Response {
        model_name: String,
        model_version: String,
        id: String,
        parameters: String,
        outputs: Vec<CallTensor>,
    },
    /// Refused before it ran (the worker's `NotRun`).
    NotRun(Code, String),
    /// It ran and failed.
    Error(Code, String),
    /// The core does not take it: make it through the server's Python.
    Reroute,
}

fn tensor(w: &mut Writer, t: &CallTensor) {
    w.str(&t.name);
    w.str(&t.datatype);
    w.count(t.shape.len());
    for &d in &t.shape {
        w.i64(d);
    }
    w.bytes(&t.data);
}

fn read_tensor(r: &mut Reader<'_>) -> Result<CallTensor, CoreError> {
    let name = r.str()?;
    let datatype = r.str()?;
    let n = r.count(8)?;
    let shape = (0..n).map(|_| r.i64()).collect::<Result<_, _>>()?;
    let data = r.bytes()?.to_vec();
    Ok(CallTensor {
        name,
        datatype,
        shape,
        data,
    })
}

impl CallMessage {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u8(CALL_TAG);
        w.str(&self.model_name);
        w.str(&self.model_version);
        w.str(&self.id);
        w.str(&self.parameters);
        w.u64(self.priority);
        w.u64(self.timeout_us);
        w.names(self.outputs.as_deref());
        w.count(self.inputs.len());
        for t in &self.inputs {
            tensor(&mut w, t);
        }
        w.buf
    }

    /// Decodes a message that starts with [`CALL_TAG`].
    pub fn decode(b: &[u8]) -> Result<Self, CoreError> {
        let mut r = Reader::new(b);
        if r.u8()? != CALL_TAG {
            return Err(CoreError::internal("not a call"));
        }
        let model_name = r.str()?;
        let model_version = r.str()?;
        let id = r.str()?;
        let parameters = r.str()?;
        let priority = r.u64()?;
        let timeout_us = r.u64()?;
        let outputs = r.names()?;
        let n = r.count(16)?;
        let inputs = (0..n)
            .map(|_| read_tensor(&mut r))
            .collect::<Result<_, _>>()?;
        r.done()?;
        Ok(CallMessage {
            model_name,
            model_version,
            id,
            parameters,
            priority,
            timeout_us,
            outputs,
            inputs,
        })
    }
}

impl CallAnswer {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        match self {
            CallAnswer::Response {
                model_name,
                model_version,
                id,
                parameters,
                outputs,
            } => {
                w.u8(0);
                w.response_head(model_name, model_version, id, parameters);
                w.count(outputs.len());
                for t in outputs {
                    tensor(&mut w, t);
                }
            }
            CallAnswer::NotRun(code, message) | CallAnswer::Error(code, message) => {
                w.u8(if matches!(self, CallAnswer::NotRun(..)) {
                    1
                } else {
                    2
                });
                w.str(code.name());
                w.str(message);
            }
            CallAnswer::Reroute => w.u8(3),
        }
        w.buf
    }

    pub fn decode(b: &[u8]) -> Result<Self, CoreError> {
        let mut r = Reader::new(b);
        let answer = match r.u8()? {
            0 => {
                let (model_name, model_version, id, parameters) = r.response_head()?;
                let n = r.count(16)?;
                let outputs = (0..n)
                    .map(|_| read_tensor(&mut r))
                    .collect::<Result<_, _>>()?;
                CallAnswer::Response {
                    model_name,
                    model_version,
                    id,
                    parameters,
                    outputs,
                }
            }
            kind @ (1 | 2) => {
                let code = r.code()?;
                let message = r.str()?;
                if kind == 1 {
                    CallAnswer::NotRun(code, message)
                } else {
                    CallAnswer::Error(code, message)
                }
            }
            3 => CallAnswer::Reroute,
            _ => return Err(CoreError::internal("malformed call answer")),
        };
        r.done()?;
        Ok(answer)
    }

    /// A lane's result for a call.
    pub fn of(result: Result<OwnedResponse, CoreError>) -> Self {
        match result {
            Ok(response) => CallAnswer::Response {
                model_name: response.model_name,
                model_version: response.model_version,
                id: response.id,
                parameters: response.parameters,
                outputs: response
                    .outputs
                    .into_iter()
                    .map(|o| CallTensor {
                        name: o.name,
                        datatype: o.datatype,
                        shape: o.shape,
                        data: o.data,
                    })
                    .collect(),
            },
            Err(error) => CallAnswer::Error(error.code, error.message),
        }
    }
}

/// The lanes of the server's models, by name and version, for calls to find.
pub struct LaneRegistry<E> {
    models: RwLock<HashMap<String, ModelLanes<E>>>,
}

struct ModelLanes<E> {
    versions: HashMap<String, Arc<Lane<E>>>,
    /// The version a call naming none gets.
    default: String,
}

impl<E> std::fmt::Debug for LaneRegistry<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaneRegistry")
            .field("models", &self.models.read().keys().collect::<Vec<_>>())
            .finish()
    }
}

impl<E> Default for LaneRegistry<E> {
    fn default() -> Self {
        LaneRegistry {
            models: RwLock::new(HashMap::new()),
        }
    }
}

impl<E> LaneRegistry<E> {
    /// `model`'s lanes from now on (its versions on lanes, and its default version's
    /// number); none: calls to it are rerouted.
    pub fn set(&self, model: &str, versions: HashMap<String, Arc<Lane<E>>>, default: String) {
        let mut models = self.models.write();
        if versions.is_empty() {
            models.remove(model);
        } else {
            models.insert(model.to_owned(), ModelLanes { versions, default });
        }
    }

    /// The lane a call to `model` (`version`; empty: its default) goes to.
    pub fn find(&self, model: &str, version: &str) -> Option<Arc<Lane<E>>> {
        let models = self.models.read();
        let lanes = models.get(model)?;
        let version = if version.is_empty() {
            &lanes.default
        } else {
            version
        };
        lanes.versions.get(version).cloned()
    }
}

/// Where a call's answer goes: the caller's channel; the caller's instance waits on the
/// server until then.
pub struct CallSink {
    pub(super) channel: Arc<Channel>,
    pub(super) waiting: Arc<AtomicUsize>,
}

impl std::fmt::Debug for CallSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallSink").finish_non_exhaustive()
    }
}

impl CallSink {
    /// Sends the call's answer (a worker gone meanwhile takes nothing), and pokes the
    /// caller's driver thread if it waits for the worker's next message
    /// ([`Channel::recv_after_call`]).
    pub fn answer(self, answer: &CallAnswer) {
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        let _ = self.channel.send(&answer.encode());
        self.channel.poke();
    }
}

/// Triton's refusal of a call to a model all of whose instances wait on calls.
pub fn stuck_message(model: &str) -> String {
    format!(
        "model '{model}' cannot take this call: every instance of it is waiting on a call to \
         the server (a model calling itself, or a cycle of calls), so it would wait forever"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_and_answers_round_trip() {
        let call = CallMessage {
            model_name: "m".into(),
            model_version: String::new(),
            id: "é".into(),
            parameters: r#"{"a":1}"#.into(),
            priority: 2,
            timeout_us: 30,
            outputs: Some(vec!["OUT".into()]),
            inputs: vec![CallTensor {
                name: "IN".into(),
                datatype: "FP32".into(),
                shape: vec![1, 2],
                data: vec![0, 0, 128, 63, 0, 0, 0, 64],
            }],
        };
        assert_eq!(CallMessage::decode(&call.encode()), Ok(call));
        for answer in [
            CallAnswer::Response {
                model_name: "m".into(),
                model_version: "1".into(),
                id: String::new(),
                parameters: String::new(),
                outputs: vec![CallTensor {
                    name: "OUT".into(),
                    datatype: "BYTES".into(),
                    shape: vec![1],
                    data: vec![1, 0, 0, 0, b'x'],
                }],
            },
            CallAnswer::NotRun(Code::InvalidArg, "no".into()),
            CallAnswer::Error(Code::Internal, "failed".into()),
            CallAnswer::Reroute,
        ] {
            assert_eq!(CallAnswer::decode(&answer.encode()), Ok(answer));
        }
        assert!(CallMessage::decode(&[CALL_TAG, 1]).is_err());
    }
}
