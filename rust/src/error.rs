//! One error type for the whole core, carrying Triton's status codes.

use std::fmt;

/// Triton's server error codes (`TRITONSERVER_Error_Code`).
///
/// The Python layer maps each one to the exception class of the same code in
/// `tritonfast.errors`; the frontends map codes to HTTP and gRPC statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    Unknown,
    Internal,
    NotFound,
    InvalidArg,
    Unavailable,
    Unsupported,
    AlreadyExists,
    Cancelled,
}

impl Code {
    /// Every code, in declaration order.
    pub const ALL: [Code; 8] = [
        Code::Unknown,
        Code::Internal,
        Code::NotFound,
        Code::InvalidArg,
        Code::Unavailable,
        Code::Unsupported,
        Code::AlreadyExists,
        Code::Cancelled,
    ];

    /// The code's name as Triton spells it (and as `tritonfast.errors.Code` names its members).
    pub const fn name(self) -> &'static str {
        match self {
            Code::Unknown => "UNKNOWN",
            Code::Internal => "INTERNAL",
            Code::NotFound => "NOT_FOUND",
            Code::InvalidArg => "INVALID_ARG",
            Code::Unavailable => "UNAVAILABLE",
            Code::Unsupported => "UNSUPPORTED",
            Code::AlreadyExists => "ALREADY_EXISTS",
            Code::Cancelled => "CANCELLED",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An error with a Triton status code and a message meant for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreError {
    pub code: Code,
    pub message: String,
}

impl CoreError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    pub fn invalid_arg(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArg, message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(Code::Unavailable, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Code::Internal, message)
    }
}

impl fmt::Display for CoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}", self.code, self.message)
    }
}

impl std::error::Error for CoreError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_the_python_code_enum() {
        let names: Vec<_> = Code::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(
            names,
            [
                "UNKNOWN",
                "INTERNAL",
                "NOT_FOUND",
                "INVALID_ARG",
                "UNAVAILABLE",
                "UNSUPPORTED",
                "ALREADY_EXISTS",
                "CANCELLED"
            ]
        );
    }

    #[test]
    fn display_carries_code_and_message() {
        let err = CoreError::invalid_arg("batch size 9 exceeds 8");
        assert_eq!(err.to_string(), "[INVALID_ARG] batch size 9 exceeds 8");
        assert_eq!(err.code, Code::InvalidArg);
    }
}
