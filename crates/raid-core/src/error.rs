//! The crate's one error type.
//!
//! `RaidError` carries a small kind (what went wrong, for callers that map it to NBD
//! errors or exit codes) plus a message that names the member or range involved.

use std::io;

/// What kind of failure, for mapping to protocol errors once (see nbd mapping in the binary).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A member I/O failed and redundancy could not cover it (data unavailable).
    Io,
    /// The request is outside the array or not 512-byte aligned.
    OutOfRange,
    /// Metadata is corrupt, inconsistent or from another array.
    BadMetadata,
    /// The member set cannot form a working array (too many missing, wrong sizes...).
    CannotAssemble,
    /// A request that the array refuses by policy (read-only, too large).
    Refused,
    /// The array has failed (more members lost than redundancy allows).
    ArrayFailed,
}

#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct RaidError {
    pub kind: ErrorKind,
    pub message: String,
    #[source]
    pub source: Option<io::Error>,
}

impl RaidError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into(), source: None }
    }

    pub fn io(message: impl Into<String>, source: io::Error) -> Self {
        Self { kind: ErrorKind::Io, message: message.into(), source: Some(source) }
    }
}

pub type Result<T, E = RaidError> = std::result::Result<T, E>;
