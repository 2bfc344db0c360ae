//! What a queue is configured with: how it batches, its priority levels and their queue
//! policies, and what a producer says about each request.

use std::time::Duration;

use crate::batcher::Rules;
use crate::error::CoreError;

/// The most priority levels a queue accepts.
pub const MAX_PRIORITY_LEVELS: u32 = 1024;

/// How a queue groups requests into batches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchPolicy {
    /// Largest sum of request batch sizes in one batch; 0 turns batching off (one request per
    /// batch).
    pub max_batch_size: u32,
    /// How long a batch that is not yet full may wait for more requests, counted from the moment
    /// its oldest request was enqueued.
    pub max_queue_delay: Duration,
    /// Batch sizes worth sending without waiting for `max_queue_delay`.
    pub preferred_batch_sizes: Vec<u32>,
}

impl BatchPolicy {
    /// A policy with batching off: every batch is one request.
    pub fn unbatched() -> Self {
        Self::default()
    }

    /// Whether requests are grouped at all.
    pub fn batching(&self) -> bool {
        self.max_batch_size > 0
    }

    fn validate(&self) -> Result<(), CoreError> {
        if !self.batching() && !self.preferred_batch_sizes.is_empty() {
            return Err(CoreError::invalid_arg(
                "preferred batch sizes need batching (max_batch_size > 0)",
            ));
        }
        for &size in &self.preferred_batch_sizes {
            if size == 0 || size > self.max_batch_size {
                return Err(CoreError::invalid_arg(format!(
                    "preferred batch size {size} must be between 1 and max_batch_size ({})",
                    self.max_batch_size
                )));
            }
        }
        Ok(())
    }

    pub(super) fn rules(&self) -> Rules {
        let mut preferred: Vec<u64> = self
            .preferred_batch_sizes
            .iter()
            .map(|&s| u64::from(s))
            .collect();
        preferred.sort_unstable();
        preferred.dedup();
        let max_batch_size = u64::from(self.max_batch_size);
        Rules {
            batching: self.batching(),
            max_batch_size,
            max_preferred: preferred.last().copied().unwrap_or(max_batch_size),
            preferred,
            max_queue_delay: self.max_queue_delay,
        }
    }
}

/// What happens to a request whose queue timeout expires (Triton's `TimeoutAction`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TimeoutAction {
    /// Hand it back to be answered with an error.
    #[default]
    Reject,
    /// Move it behind the level's unexpired requests.
    Delay,
}

/// The policy of one priority level (Triton's `ModelQueuePolicy`); see the
/// [module docs](crate::queue).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueuePolicy {
    pub timeout_action: TimeoutAction,
    /// Zero: requests never time out.
    pub default_timeout: Duration,
    pub allow_timeout_override: bool,
    /// Zero: unlimited.
    pub max_queue_size: u32,
}

impl QueuePolicy {
    /// The timeout a request asking for `requested` (zero: none) gets, if any.
    pub fn timeout_for(&self, requested: Duration) -> Option<Duration> {
        let mut timeout = self.default_timeout;
        if self.allow_timeout_override && !requested.is_zero() && requested < timeout {
            timeout = requested;
        }
        (!timeout.is_zero()).then_some(timeout)
    }
}

/// Everything a queue is configured with (Triton's `ModelDynamicBatching`, less what the
/// scheduler handles itself).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueConfig {
    pub batch: BatchPolicy,
    /// Zero: a single level.
    pub priority_levels: u32,
    /// The level of requests with priority 0 (or above `priority_levels`); 1 to
    /// `priority_levels` when there are levels, ignored otherwise.
    pub default_priority_level: u32,
    /// The policy of every level not listed in `priority_queue_policy`.
    pub default_queue_policy: QueuePolicy,
    /// `(level, policy)` overrides.
    pub priority_queue_policy: Vec<(u32, QueuePolicy)>,
    /// Keep recent request durations for latency quantiles (Prometheus summaries).
    pub latency_summaries: bool,
}

impl From<BatchPolicy> for QueueConfig {
    fn from(batch: BatchPolicy) -> Self {
        Self {
            batch,
            ..Self::default()
        }
    }
}

impl QueueConfig {
    pub(super) fn validate(&self) -> Result<(), CoreError> {
        self.batch.validate()?;
        let levels = self.priority_levels;
        if levels > MAX_PRIORITY_LEVELS {
            return Err(CoreError::invalid_arg(format!(
                "priority_levels {levels} exceeds the supported maximum of {MAX_PRIORITY_LEVELS}"
            )));
        }
        if levels > 0 && !(1..=levels).contains(&self.default_priority_level) {
            return Err(CoreError::invalid_arg(format!(
                "default_priority_level must be in range [1, {levels}], got {}",
                self.default_priority_level
            )));
        }
        for &(level, _) in &self.priority_queue_policy {
            if !(1..=levels).contains(&level) {
                return Err(CoreError::invalid_arg(format!(
                    "priority_queue_policy level {level} must be in range [1, {levels}]"
                )));
            }
        }
        Ok(())
    }

    /// The policy of each level, highest priority first.
    pub(super) fn level_policies(&self) -> Vec<QueuePolicy> {
        let count = self.priority_levels.max(1) as usize;
        let mut policies = vec![self.default_queue_policy.clone(); count];
        for (level, policy) in &self.priority_queue_policy {
            policies[*level as usize - 1] = policy.clone();
        }
        policies
    }
}

/// What a producer says about a request besides the request itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestMeta {
    /// The request's batch dimension (its first dimension); with batching off it is only used
    /// for statistics.
    pub batch_size: u32,
    /// 1 (highest) to `priority_levels`; 0 for the default level.
    pub priority: u32,
    /// The timeout the request asks for; zero for none (see [`QueuePolicy::timeout_for`]).
    pub timeout: Duration,
    /// Requests batch together only when their shape keys are equal; 0 when the caller does not
    /// need shape grouping.
    pub shape_key: u64,
}

impl Default for RequestMeta {
    fn default() -> Self {
        Self {
            batch_size: 1,
            priority: 0,
            timeout: Duration::ZERO,
            shape_key: 0,
        }
    }
}

impl RequestMeta {
    /// Default metadata with the given batch size.
    pub fn with_batch_size(batch_size: u32) -> Self {
        Self {
            batch_size,
            ..Self::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Code;
    use crate::queue::RequestQueue;

    #[test]
    fn policy_validation() {
        let bad = |max, preferred: &[u32]| {
            RequestQueue::<u32>::new(BatchPolicy {
                max_batch_size: max,
                max_queue_delay: Duration::ZERO,
                preferred_batch_sizes: preferred.to_vec(),
            })
            .unwrap_err()
            .code
        };
        assert_eq!(bad(0, &[1]), Code::InvalidArg);
        assert_eq!(bad(4, &[0]), Code::InvalidArg);
        assert_eq!(bad(4, &[5]), Code::InvalidArg);
    }

    #[test]
    fn level_validation() {
        let bad = |levels, default, overrides: &[u32]| {
            RequestQueue::<u32>::with_config(QueueConfig {
                priority_levels: levels,
                default_priority_level: default,
                priority_queue_policy: overrides
                    .iter()
                    .map(|&l| (l, QueuePolicy::default()))
                    .collect(),
                ..QueueConfig::default()
            })
            .map(drop)
            .map_err(|e| e.code)
        };
        assert_eq!(bad(0, 0, &[]), Ok(()));
        assert_eq!(bad(0, 3, &[]), Ok(()));
        assert_eq!(bad(3, 2, &[1, 3]), Ok(()));
        assert_eq!(bad(3, 0, &[]), Err(Code::InvalidArg));
        assert_eq!(bad(3, 4, &[]), Err(Code::InvalidArg));
        assert_eq!(bad(3, 1, &[4]), Err(Code::InvalidArg));
        assert_eq!(bad(0, 0, &[1]), Err(Code::InvalidArg));
        assert_eq!(bad(MAX_PRIORITY_LEVELS + 1, 1, &[]), Err(Code::InvalidArg));
    }

    #[test]
    fn timeout_override_only_shortens() {
        let policy = |default_us, allow| QueuePolicy {
            default_timeout: Duration::from_micros(default_us),
            allow_timeout_override: allow,
            ..QueuePolicy::default()
        };
        let us = Duration::from_micros;
        assert_eq!(policy(0, true).timeout_for(us(5)), None);
        assert_eq!(policy(100, true).timeout_for(us(5)), Some(us(5)));
        assert_eq!(policy(100, true).timeout_for(us(500)), Some(us(100)));
        assert_eq!(policy(100, true).timeout_for(us(0)), Some(us(100)));
        assert_eq!(policy(100, false).timeout_for(us(5)), Some(us(100)));
    }
}
