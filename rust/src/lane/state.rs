//! Implicit state on a stateful model's lane (`sequence_batching.state`): the state a
//! sequence carries from one request to the next, kept by the lane, not the model.
//!
//! Each instance slot holds the states of the sequence that runs there. A request gets them
//! as the inputs named `input_name`; on START (or when its slot holds none) the slot takes a
//! fresh copy of the initial states first. The model returns the next states as the outputs
//! named `output_name`: the lane keeps them and takes them out of the response, which the
//! client never sees. A model that returns no state output leaves the state as it was, and
//! a state output's shape becomes the next input's (a state may grow). A request that fails
//! changes nothing; END forgets the slot's states once its response came. A null request
//! gets the initial states and keeps nothing. Requests of one sequence run one at a time on
//! its slot (the sequence batcher's rule), so a slot's states never race.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::message::Slot;
use super::response::slot_bytes;
use super::sequence::SequenceFlags;
use crate::error::CoreError;
use crate::infer::{CoreInput, DataType, TensorData};

/// A state's value: its shape and its bytes as they travel (BYTES elements length-prefixed),
/// shared by the slot that holds it and the batches it is an input of (copied only into a
/// batch's segment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateValue {
    pub shape: Vec<u64>,
    pub bytes: Arc<Vec<u8>>,
}

/// One implicit state of a model.
#[derive(Debug, Clone)]
pub struct StateSpec {
    /// The input the model gets the state as.
    pub input: String,
    /// The output the model returns the next state as.
    pub output: String,
    pub datatype: DataType,
    /// What a sequence starts with (the batch dimension included for a batching model).
    pub initial: StateValue,
}

/// A lane's implicit states: what each is, and what each instance slot holds.
#[derive(Debug, Default)]
pub struct ImplicitStates {
    specs: Vec<StateSpec>,
    /// By (instance, slot): the states, in the order of `specs`.
    held: Mutex<HashMap<(usize, usize), Vec<StateValue>>>,
}

impl ImplicitStates {
    pub fn new(specs: Vec<StateSpec>) -> Self {
        ImplicitStates {
            specs,
            held: Mutex::new(HashMap::new()),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    /// The state outputs every request asks for besides its own.
    pub fn output_names(&self) -> impl Iterator<Item = &str> {
        self.specs.iter().map(|spec| spec.output.as_str())
    }

    /// The state inputs of a request at `flags.slot` of instance `instance`.
    pub fn inputs(&self, instance: usize, flags: SequenceFlags) -> Vec<CoreInput> {
        let initial = || self.specs.iter().map(|spec| spec.initial.clone()).collect();
        let values: Vec<StateValue> = if flags.ready {
            let mut held = self.held.lock();
            let slot = held.entry((instance, flags.slot)).or_insert_with(initial);
            if flags.start {
                *slot = initial();
            }
            slot.clone()
        } else {
            initial()
        };
        self.specs
            .iter()
            .zip(values)
            .map(|(spec, value)| CoreInput {
                name: spec.input.clone(),
                datatype: spec.datatype,
                shape: value.shape,
                data: TensorData::Shared(value.bytes),
            })
            .collect()
    }

    /// Keeps the next states among a ready request's `outputs` (their bytes in `segment`),
    /// taking them out of the response; forgets the slot's states after its sequence's END.
    ///
    /// # Errors
    /// INTERNAL for a state output whose bytes are not where its slot says (a worker's fault).
    pub fn keep(
        &self,
        instance: usize,
        flags: SequenceFlags,
        outputs: &mut Vec<Slot>,
        segment: &[u8],
    ) -> Result<(), CoreError> {
        let mut next = Vec::new();
        let mut index = 0;
        while index < outputs.len() {
            let Some(which) = self
                .specs
                .iter()
                .position(|s| s.output == outputs[index].name)
            else {
                index += 1;
                continue;
            };
            let slot = outputs.remove(index);
            if slot.place.is_some() {
                return Err(CoreError::internal(format!(
                    "state output '{}' is not in the instance's outputs",
                    slot.name
                )));
            }
            let bytes = Arc::new(slot_bytes(segment, &slot)?.to_vec());
            let shape = slot.shape.iter().map(|&d| u64::try_from(d).unwrap_or(0));
            next.push((
                which,
                StateValue {
                    shape: shape.collect(),
                    bytes,
                },
            ));
        }
        let mut held = self.held.lock();
        let key = (instance, flags.slot);
        if flags.end {
            held.remove(&key);
        } else if let Some(states) = held.get_mut(&key) {
            for (which, value) in next {
                states[which] = value;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> StateSpec {
        StateSpec {
            input: "SUM_IN".into(),
            output: "SUM_OUT".into(),
            datatype: DataType::Int32,
            initial: StateValue {
                shape: vec![1, 1],
                bytes: Arc::new(1000i32.to_le_bytes().to_vec()),
            },
        }
    }

    fn flags(slot: usize, start: bool, end: bool) -> SequenceFlags {
        SequenceFlags {
            start,
            end,
            ready: true,
            slot,
        }
    }

    fn value_of(inputs: &[CoreInput]) -> (Vec<u64>, Vec<u8>) {
        match &inputs[0].data {
            TensorData::Shared(bytes) => (inputs[0].shape.clone(), bytes.to_vec()),
            _ => panic!("not shared"),
        }
    }

    /// A response's outputs: OUT, then the state output holding `state` (at offset 8).
    fn outputs(state: &[u8], shape: &[i64]) -> (Vec<Slot>, Vec<u8>) {
        let slot = |name: &str, offset, len| Slot {
            name: name.into(),
            datatype: "INT32".into(),
            shape: shape.to_vec(),
            offset,
            len,
            place: None,
        };
        let mut segment = vec![7u8; 8];
        segment.extend_from_slice(state);
        let len = state.len() as u64;
        (vec![slot("OUT", 0, 4), slot("SUM_OUT", 8, len)], segment)
    }

    #[test]
    fn a_sequence_carries_its_state_and_the_response_loses_it() {
        let states = ImplicitStates::new(vec![spec()]);
        let first = states.inputs(0, flags(2, true, false));
        assert_eq!(
            value_of(&first),
            (vec![1, 1], 1000i32.to_le_bytes().to_vec())
        );
        // The model returns a longer state: its shape is the next input's.
        let (mut out, segment) = outputs(&[1, 0, 0, 0, 2, 0, 0, 0], &[1, 2]);
        states
            .keep(0, flags(2, true, false), &mut out, &segment)
            .unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].name, "OUT");
        let second = states.inputs(0, flags(2, false, false));
        assert_eq!(
            value_of(&second),
            (vec![1, 2], vec![1, 0, 0, 0, 2, 0, 0, 0])
        );
        // Another slot, another instance, and a null request see the initial state.
        let initial = (vec![1, 1], 1000i32.to_le_bytes().to_vec());
        assert_eq!(value_of(&states.inputs(0, flags(3, false, false))), initial);
        assert_eq!(value_of(&states.inputs(1, flags(2, false, false))), initial);
        let null = SequenceFlags {
            slot: 2,
            ..SequenceFlags::default()
        };
        assert_eq!(value_of(&states.inputs(0, null)), initial);
        // START resets it; END forgets it.
        assert_eq!(value_of(&states.inputs(0, flags(2, true, false))), initial);
        let (mut out, segment) = outputs(&5i32.to_le_bytes(), &[1, 1]);
        states
            .keep(0, flags(2, false, true), &mut out, &segment)
            .unwrap();
        assert!(states.held.lock().get(&(0, 2)).is_none());
    }

    #[test]
    fn no_state_output_keeps_the_state() {
        let states = ImplicitStates::new(vec![spec()]);
        states.inputs(0, flags(0, true, false));
        let (mut out, segment) = outputs(&5i32.to_le_bytes(), &[1, 1]);
        states
            .keep(0, flags(0, false, false), &mut out, &segment)
            .unwrap();
        let mut none = vec![out[0].clone()];
        states
            .keep(0, flags(0, false, false), &mut none, &segment)
            .unwrap();
        let next = states.inputs(0, flags(0, false, false));
        assert_eq!(value_of(&next).1, 5i32.to_le_bytes());
    }

    #[test]
    fn a_state_output_outside_the_segment_is_the_workers_fault() {
        let states = ImplicitStates::new(vec![spec()]);
        states.inputs(0, flags(0, true, false));
        let (mut out, _) = outputs(&5i32.to_le_bytes(), &[1, 1]);
        let error = states.keep(0, flags(0, false, false), &mut out, &[0; 4]);
        assert!(error.is_err());
    }
}
