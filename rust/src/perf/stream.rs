//! gRPC bidirectional streams (`ModelStreamInfer`) for the load generator: each context holds
//! one stream and sends its next request once the last one is complete: after its one
//! response, or, for a decoupled model, after the response that carries
//! `triton_final_response` (the requests ask for it with `triton_enable_empty_final_response`).

use bytes::{Buf, Bytes, BytesMut};
use h2::client::ResponseFuture;
use h2::{RecvStream, SendStream};

use super::{Exchange, Shared};
use crate::wire::{Wire, fields};

pub const STREAM_INFER_PATH: &str = "/inference.GRPCInferenceService/ModelStreamInfer";

/// One open `ModelStreamInfer` call.
#[derive(Debug)]
pub struct StreamCall {
    send: SendStream<Bytes>,
    receive: Receive,
    /// Bytes received and not yet a whole gRPC message.
    pending: BytesMut,
    decoupled: bool,
}

/// The answer's side: its headers come with the first response.
#[derive(Debug)]
enum Receive {
    Waiting(ResponseFuture),
    Open(RecvStream),
}

/// What one message of the stream says about the request in flight.
#[derive(Debug, PartialEq, Eq)]
struct Said {
    error: Option<String>,
    last: bool,
    /// A response without outputs (a decoupled model's empty final response).
    empty: bool,
}

impl StreamCall {
    pub fn new(send: SendStream<Bytes>, answer: ResponseFuture, decoupled: bool) -> StreamCall {
        StreamCall {
            send,
            receive: Receive::Waiting(answer),
            pending: BytesMut::new(),
            decoupled,
        }
    }

    /// Sends `message` (framed) and reads the stream until its request is complete. An error
    /// here breaks the stream: the caller opens another for the next request.
    pub async fn exchange(&mut self, message: &Bytes, shared: &Shared) -> Result<Exchange, String> {
        self.send
            .send_data(message.clone(), false)
            .map_err(|e| format!("gRPC stream: {e}"))?;
        let sent = shared.now();
        let mut first_byte = None;
        let mut responses = 0u32;
        loop {
            let said = self.next_message().await?;
            first_byte.get_or_insert_with(|| shared.now());
            responses += u32::from(!said.empty);
            if let Some(text) = said.error {
                shared.error(format!("gRPC stream error: {text}"));
                return Ok(Exchange {
                    sent,
                    first_byte: first_byte.unwrap_or(sent),
                    ok: false,
                    responses,
                });
            }
            if said.last || !self.decoupled {
                return Ok(Exchange {
                    sent,
                    first_byte: first_byte.unwrap_or(sent),
                    ok: true,
                    responses,
                });
            }
        }
    }

    async fn next_message(&mut self) -> Result<Said, String> {
        loop {
            if let Some(message) = take_message(&mut self.pending)? {
                return said(&message)
                    .ok_or_else(|| "a malformed ModelStreamInferResponse".to_string());
            }
            let body = match &mut self.receive {
                Receive::Open(body) => body,
                Receive::Waiting(answer) => {
                    let head = answer.await.map_err(|e| format!("gRPC stream: {e}"))?;
                    self.receive = Receive::Open(head.into_body());
                    let Receive::Open(body) = &mut self.receive else {
                        unreachable!()
                    };
                    body
                }
            };
            match body.data().await {
                Some(Ok(chunk)) => {
                    let _ = body.flow_control().release_capacity(chunk.len());
                    self.pending.extend_from_slice(&chunk);
                }
                Some(Err(e)) => return Err(format!("gRPC stream: {e}")),
                None => {
                    let status = match body.trailers().await {
                        Ok(Some(trailers)) => super::grpc::status_text(&trailers),
                        _ => None,
                    };
                    return Err(status.unwrap_or_else(|| "the server ended the stream".to_string()));
                }
            }
        }
    }
}

/// The next whole gRPC message in `pending`, taken out of it.
fn take_message(pending: &mut BytesMut) -> Result<Option<Bytes>, String> {
    if pending.len() < 5 {
        return Ok(None);
    }
    if pending[0] != 0 {
        return Err("a compressed gRPC message, which the load generator does not ask for".into());
    }
    let length = u32::from_be_bytes([pending[1], pending[2], pending[3], pending[4]]) as usize;
    if pending.len() < 5 + length {
        return Ok(None);
    }
    pending.advance(5);
    Ok(Some(pending.split_to(length).freeze()))
}

/// A `ModelStreamInferResponse`: `error_message` (1), and whether `infer_response` (2) has
/// the parameter `triton_final_response` (its parameters are field 4) set true and any
/// outputs (field 5).
fn said(message: &[u8]) -> Option<Said> {
    let mut said = Said {
        error: None,
        last: false,
        empty: true,
    };
    let mut top = fields(message, 0..message.len());
    while let Some((number, value)) = top.next_field().ok()? {
        match (number, value) {
            (1, Wire::Bytes(range)) if !range.is_empty() => {
                said.error = Some(String::from_utf8_lossy(&message[range]).into_owned());
            }
            (2, Wire::Bytes(range)) => (said.last, said.empty) = final_and_empty(message, range)?,
            _ => {}
        }
    }
    Some(said)
}

fn final_and_empty(message: &[u8], response: std::ops::Range<usize>) -> Option<(bool, bool)> {
    let mut response = fields(message, response);
    let (mut last, mut empty) = (false, true);
    while let Some((number, value)) = response.next_field().ok()? {
        if number == 5 {
            empty = false;
        }
        let (4, Wire::Bytes(entry)) = (number, value) else {
            continue;
        };
        if parameter_is_true(message, entry, b"triton_final_response")? {
            last = true;
        }
    }
    Some((last, empty))
}

/// Whether the parameters' map entry `entry` is `name` with `bool_param` true.
fn parameter_is_true(message: &[u8], entry: std::ops::Range<usize>, name: &[u8]) -> Option<bool> {
    let (mut key, mut flag) = (None, false);
    let mut entry = fields(message, entry);
    while let Some((number, value)) = entry.next_field().ok()? {
        match (number, value) {
            (1, Wire::Bytes(range)) => key = Some(&message[range]),
            (2, Wire::Bytes(range)) => {
                let mut parameter = fields(message, range);
                while let Some((number, value)) = parameter.next_field().ok()? {
                    if let (1, Wire::Varint(v)) = (number, value) {
                        flag = v != 0;
                    }
                }
            }
            _ => {}
        }
    }
    Some(key == Some(name) && flag)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(number: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![(number << 3) | 2, u8::try_from(payload.len()).unwrap()];
        out.extend_from_slice(payload);
        out
    }

    fn response(final_flag: Option<bool>) -> Vec<u8> {
        let mut infer = field(1, b"model");
        if final_flag != Some(true) {
            infer.extend(field(5, b"output"));
        }
        if let Some(flag) = final_flag {
            let parameter = [0x08, u8::from(flag)]; // bool_param = flag
            let entry = [field(1, b"triton_final_response"), field(2, &parameter)].concat();
            infer.extend(field(4, &entry));
        }
        field(2, &infer)
    }

    #[test]
    fn the_final_flag_outputs_and_errors_are_read() {
        let said_of = |error: Option<&str>, last, empty| {
            Some(Said {
                error: error.map(str::to_string),
                last,
                empty,
            })
        };
        assert_eq!(said(&response(Some(true))), said_of(None, true, true));
        assert_eq!(said(&response(Some(false))), said_of(None, false, false));
        assert_eq!(said(&response(None)), said_of(None, false, false));
        assert_eq!(
            said(&field(1, b"bad shape")),
            said_of(Some("bad shape"), false, true)
        );
        assert_eq!(said(&[0xff]), None);
    }

    #[test]
    fn messages_are_taken_whole_from_the_stream() {
        let mut pending = BytesMut::from(&b"\0\0\0\0\x03abc\0\0\0\0\x02d"[..]);
        assert_eq!(
            take_message(&mut pending).unwrap().unwrap(),
            Bytes::from_static(b"abc")
        );
        assert_eq!(take_message(&mut pending).unwrap(), None);
        pending.extend_from_slice(b"e");
        assert_eq!(
            take_message(&mut pending).unwrap().unwrap(),
            Bytes::from_static(b"de")
        );
        assert!(take_message(&mut BytesMut::from(&b"\x01\0\0\0\0"[..])).is_err());
    }
}
