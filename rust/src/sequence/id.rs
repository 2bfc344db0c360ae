//! The correlation ID that ties a sequence's requests together.

use std::fmt;

/// A sequence's correlation ID: an unsigned integer or a string (0 and "" mean none).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CorrelationId {
    Number(u64),
    Text(String),
}

impl CorrelationId {
    /// Whether this is the "no sequence" ID (0 or the empty string).
    pub fn is_none(&self) -> bool {
        match self {
            CorrelationId::Number(id) => *id == 0,
            CorrelationId::Text(id) => id.is_empty(),
        }
    }
}

impl fmt::Display for CorrelationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CorrelationId::Number(id) => write!(f, "{id}"),
            CorrelationId::Text(id) => f.write_str(id),
        }
    }
}
