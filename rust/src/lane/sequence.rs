//! What a stateful model's lane adds to each request it hands the model (Triton's sequence
//! batcher): the control inputs, and the null requests that fill a direct batch's empty slots.
//!
//! * **Control inputs** (`control_input`): START, END and READY as one of two given values,
//!   CORRID as the request's correlation ID in the control's datatype. Each is a one-element
//!   tensor, `[1, 1]` for a model that batches and `[1]` otherwise; the flags come first, in
//!   the order of the configuration, then CORRID.
//! * **Null requests**: a direct batch position whose slot has no request gets a request whose
//!   inputs are zeros shaped like the batch's first request's, READY, START and END false and
//!   CORRID 0. Its answer goes nowhere and it is not counted.
//!
//! * **Implicit state** (`state`): see [`super::state`].
//!
//! The server's Python reads the configuration and hands the lane each control and initial
//! state already encoded ([`Controls`]); the lane writes the tensors.

use super::state::StateSpec;
use crate::infer::{CoreInput, DataType};
use crate::sequence::CorrelationId;

/// Which flag a control carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagKind {
    Start,
    End,
    Ready,
}

/// A START, END or READY control: its input, and its two values in wire bytes.
#[derive(Debug, Clone)]
pub struct FlagControl {
    pub name: String,
    pub kind: FlagKind,
    pub datatype: DataType,
    pub off: Vec<u8>,
    pub on: Vec<u8>,
}

/// The control inputs of a model's requests.
#[derive(Debug, Clone, Default)]
pub struct Controls {
    pub flags: Vec<FlagControl>,
    /// The CORRID control's input and datatype (an integer type or BYTES).
    pub corrid: Option<(String, DataType)>,
    /// Whether the model batches (the controls' shape is `[1, 1]`, else `[1]`).
    pub batched: bool,
    /// Its implicit states.
    pub states: Vec<StateSpec>,
}

/// A request's place in its sequence, as the model is told it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SequenceFlags {
    pub start: bool,
    pub end: bool,
    /// False for a null request.
    pub ready: bool,
    /// The instance slot it runs in.
    pub slot: usize,
}

impl Controls {
    /// The control inputs of a request of sequence `id` with `flags`.
    pub fn inputs(&self, flags: SequenceFlags, id: &CorrelationId) -> Vec<CoreInput> {
        let shape = if self.batched { vec![1, 1] } else { vec![1] };
        let mut inputs = Vec::with_capacity(self.flags.len() + 1);
        for control in &self.flags {
            let on = flags.ready
                && match control.kind {
                    FlagKind::Ready => true,
                    FlagKind::Start => flags.start,
                    FlagKind::End => flags.end,
                };
            let bytes = if on { &control.on } else { &control.off };
            inputs.push(owned(
                &control.name,
                control.datatype,
                &shape,
                bytes.clone(),
            ));
        }
        if let Some((name, datatype)) = &self.corrid {
            let bytes = corrid_bytes(*datatype, id);
            inputs.push(owned(name, *datatype, &shape, bytes));
        }
        inputs
    }
}

fn owned(name: &str, datatype: DataType, shape: &[u64], bytes: Vec<u8>) -> CoreInput {
    CoreInput {
        name: name.to_owned(),
        datatype,
        shape: shape.to_vec(),
        data: crate::infer::TensorData::Owned(bytes),
    }
}

/// A correlation ID as a CORRID control of `datatype` carries it. As in Triton: a number's
/// low-order bytes for a narrower integer type, a string ID's number (when it is all digits,
/// else 0) for an integer type, and the ID's text for BYTES.
fn corrid_bytes(datatype: DataType, id: &CorrelationId) -> Vec<u8> {
    if datatype == DataType::Bytes {
        let text = id.to_string();
        let mut bytes = u32::try_from(text.len())
            .unwrap_or(u32::MAX)
            .to_le_bytes()
            .to_vec();
        bytes.extend_from_slice(text.as_bytes());
        return bytes;
    }
    let number = match id {
        CorrelationId::Number(number) => *number,
        CorrelationId::Text(text) if text.bytes().all(|c| c.is_ascii_digit()) => {
            text.parse().unwrap_or(0)
        }
        CorrelationId::Text(_) => 0,
    };
    number.to_le_bytes()[..datatype.element_size().unwrap_or(8).min(8)].to_vec()
}

/// The inputs of a null request like `template` (its first real request): the same names,
/// datatypes and shapes, all zeros (for BYTES, empty strings).
pub fn null_inputs(template: &[CoreInput]) -> Vec<CoreInput> {
    template
        .iter()
        .map(|input| {
            let count = input
                .shape
                .iter()
                .map(|&d| usize::try_from(d).unwrap_or(usize::MAX))
                .fold(1usize, usize::saturating_mul);
            // An empty BYTES element is its 4-byte length, 0.
            let size = input.datatype.element_size().unwrap_or(4);
            owned(
                &input.name,
                input.datatype,
                &input.shape,
                vec![0; count.saturating_mul(size)],
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infer::TensorData;

    fn bytes(input: &CoreInput) -> &[u8] {
        match &input.data {
            TensorData::Owned(bytes) => bytes,
            _ => panic!("not owned"),
        }
    }

    fn controls() -> Controls {
        let flag = |name: &str, kind| FlagControl {
            name: name.into(),
            kind,
            datatype: DataType::Int32,
            off: 0i32.to_le_bytes().to_vec(),
            on: 1i32.to_le_bytes().to_vec(),
        };
        Controls {
            flags: vec![
                flag("START", FlagKind::Start),
                flag("END", FlagKind::End),
                flag("READY", FlagKind::Ready),
            ],
            corrid: Some(("CORRID".into(), DataType::Uint32)),
            batched: true,
            states: Vec::new(),
        }
    }

    #[test]
    fn flags_follow_the_request_and_null_requests_are_all_off() {
        let start = SequenceFlags {
            start: true,
            end: false,
            ready: true,
            slot: 0,
        };
        let inputs = controls().inputs(start, &CorrelationId::Number((7 << 32) | 5));
        let values: Vec<&[u8]> = inputs.iter().map(bytes).collect();
        assert_eq!(
            values,
            [&[1, 0, 0, 0][..], &[0; 4], &[1, 0, 0, 0], &[5, 0, 0, 0]]
        );
        assert_eq!(inputs[0].shape, [1, 1]);
        let null = controls().inputs(SequenceFlags::default(), &CorrelationId::Number(0));
        assert!(
            null.iter()
                .all(|input| bytes(input).iter().all(|&b| b == 0))
        );
    }

    #[test]
    fn string_ids_become_numbers_or_text() {
        let text = CorrelationId::Text("42".into());
        assert_eq!(corrid_bytes(DataType::Int64, &text), 42u64.to_le_bytes());
        let word = CorrelationId::Text("abc".into());
        assert_eq!(corrid_bytes(DataType::Int64, &word), [0; 8]);
        assert_eq!(corrid_bytes(DataType::Bytes, &word), b"\x03\0\0\0abc");
        let number = CorrelationId::Number(9);
        assert_eq!(corrid_bytes(DataType::Bytes, &number), b"\x01\0\0\09");
    }

    #[test]
    fn null_inputs_are_zeros_of_the_template_shape() {
        let template = [CoreInput {
            name: "TEXT".into(),
            datatype: DataType::Bytes,
            shape: vec![1, 3],
            data: TensorData::Owned(b"\x01\0\0\0a".repeat(3)),
        }];
        let null = null_inputs(&template);
        assert_eq!(null[0].shape, [1, 3]);
        assert_eq!(bytes(&null[0]), [0; 12]);
    }
}
