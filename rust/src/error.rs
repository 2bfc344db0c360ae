//! One error type for the whole core, carrying Triton's status codes.

use std::fmt;
use std::io;

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

/// What a failure is besides its status code, for a binding that raises its language's own
/// exception classes. Most errors answer a client's request ([`Kind::Status`]); the others
/// concern the server's own code and never reach a client as such.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A failure with a Triton status, answered to the client.
    #[default]
    Status,
    /// The caller (the server's code, not a client) passed a value the call cannot take.
    BadValue,
    /// The caller passed a value of a type the call does not take.
    BadType,
    /// The operating system refused a resource: a descriptor, a thread.
    System,
    /// The connection, or the stream over it, is closed.
    Disconnected,
}

/// An error with a Triton status code and a message meant for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreError {
    pub code: Code,
    pub message: String,
    pub kind: Kind,
}

impl CoreError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            kind: Kind::Status,
        }
    }

    /// A value the caller should not have passed (`InvalidArg`, [`Kind::BadValue`]).
    pub fn bad_value(message: impl Into<String>) -> Self {
        Self {
            kind: Kind::BadValue,
            ..Self::invalid_arg(message)
        }
    }

    /// A value of a type the call does not take (`InvalidArg`, [`Kind::BadType`]).
    pub fn bad_type(message: impl Into<String>) -> Self {
        Self {
            kind: Kind::BadType,
            ..Self::invalid_arg(message)
        }
    }

    /// A resource the operating system refused (`Internal`, [`Kind::System`]), with the
    /// system's own message.
    pub fn system(err: &io::Error) -> Self {
        Self {
            kind: Kind::System,
            ..Self::internal(err.to_string())
        }
    }

    /// A write to a connection that is closed (`Unavailable`, [`Kind::Disconnected`]).
    pub fn disconnected(message: impl Into<String>) -> Self {
        Self {
            kind: Kind::Disconnected,
            ..Self::unavailable(message)
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

impl From<io::Error> for CoreError {
    fn from(err: io::Error) -> Self {
        Self::system(&err)
    }
}

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
        assert_eq!(err.kind, Kind::Status);
    }

    #[test]
    fn kinds_keep_a_code_and_the_message() {
        let err = CoreError::bad_value("not an open socket");
        assert_eq!(
            (err.code, err.kind, err.message.as_str()),
            (Code::InvalidArg, Kind::BadValue, "not an open socket")
        );
        let os = io::Error::from_raw_os_error(libc::EMFILE);
        let err = CoreError::from(io::Error::from_raw_os_error(libc::EMFILE));
        assert_eq!((err.code, err.kind), (Code::Internal, Kind::System));
        assert_eq!(err.message, os.to_string());
        let err = CoreError::disconnected("connection closed");
        assert_eq!(
            (err.code, err.kind),
            (Code::Unavailable, Kind::Disconnected)
        );
    }
}
