//! What a sequence batcher is configured with.

use std::time::Duration;

use crate::error::CoreError;

/// Triton's default `max_sequence_idle_microseconds` (one second).
pub const DEFAULT_MAX_SEQUENCE_IDLE: Duration = Duration::from_secs(1);

/// How an instance's waiting requests become a batch (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub enum Strategy {
    Direct {
        max_queue_delay: Duration,
        /// 0.0 to 1.0: the share of slots with a waiting request that sends a batch at once.
        minimum_slot_utilization: f32,
    },
    Oldest {
        max_candidate_sequences: u32,
        preferred_batch_sizes: Vec<u32>,
        max_queue_delay: Duration,
    },
}

/// A sequence batcher's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceConfig {
    /// The model's name, for error messages.
    pub model: String,
    pub instances: usize,
    /// 0: the model does not batch (one request per execution).
    pub max_batch_size: u32,
    pub strategy: Strategy,
    pub max_sequence_idle: Duration,
    /// Keep recent durations for latency summaries.
    pub latency_summaries: bool,
}

impl SequenceConfig {
    /// How many slots each instance has.
    pub fn slots_per_instance(&self) -> usize {
        match &self.strategy {
            Strategy::Oldest {
                max_candidate_sequences,
                ..
            } if *max_candidate_sequences > 0 => *max_candidate_sequences as usize,
            // Direct, and oldest without a candidate count (Triton's fallback).
            _ => self.max_batch_size.max(1) as usize,
        }
    }

    pub(super) fn validate(&self) -> Result<(), CoreError> {
        if self.instances == 0 {
            return Err(CoreError::invalid_arg(
                "a sequence batcher needs at least one instance",
            ));
        }
        match &self.strategy {
            Strategy::Direct {
                minimum_slot_utilization,
                ..
            } if !(0.0..=1.0).contains(minimum_slot_utilization) => {
                Err(CoreError::invalid_arg(format!(
                    "minimum_slot_utilization must be between 0 and 1, got {minimum_slot_utilization}"
                )))
            }
            Strategy::Oldest {
                preferred_batch_sizes,
                ..
            } if preferred_batch_sizes
                .iter()
                .any(|&size| size == 0 || size > self.max_batch_size.max(1)) =>
            {
                Err(CoreError::invalid_arg(format!(
                    "preferred batch sizes {preferred_batch_sizes:?} must be between 1 and \
                     max_batch_size ({})",
                    self.max_batch_size
                )))
            }
            _ => Ok(()),
        }
    }
}
