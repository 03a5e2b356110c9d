//! The crate's one error type. `Errno` is an error the server answered for one request (the
//! connection goes on); everything else ends the connection (`is_fatal`).

/// What can go wrong talking to an NBD server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    #[error("{address}: {source}")]
    Io { address: String, source: std::io::Error },
    /// The server broke the protocol (bad magic, a chunk outside the request, an unknown
    /// cookie, ...): nothing it sends on this connection can be trusted any more.
    #[error("{address}: protocol violation: {what}")]
    Protocol { address: String, what: String },
    /// The server refused an option (the export does not exist, TLS is required, ...).
    #[error("{address}: server refused {option}: {message} (reply type {reply_type:#x})")]
    Refused { address: String, option: &'static str, reply_type: u32, message: String },
    /// The server answered this request with an error.
    #[error("{address}: {command} at {offset}+{len}: server error {errno} ({message})")]
    Errno { address: String, command: &'static str, offset: u64, len: u64, errno: u32, message: String },
    /// Connecting, the handshake or an answer took longer than allowed.
    #[error("{address}: timed out: {what}")]
    Timeout { address: String, what: String },
    /// The connection ended (or was never usable) before this request was answered.
    #[error("{address}: connection lost: {why}")]
    ConnectionLost { address: String, why: String },
    /// A request the export cannot take (beyond its end, over its maximum payload, misaligned).
    #[error("{address}: invalid request: {what}")]
    Invalid { address: String, what: String },
    /// TLS could not be set up: credentials, or the handshake.
    #[error("{address}: TLS: {what}")]
    Tls { address: String, what: String },
    #[error("invalid NBD address {0}")]
    Address(String),
}

impl ClientError {
    /// Whether the connection is unusable after this error.
    pub fn is_fatal(&self) -> bool {
        !matches!(self, ClientError::Errno { .. } | ClientError::Invalid { .. })
    }
}

impl From<ClientError> for std::io::Error {
    fn from(e: ClientError) -> Self {
        let kind = match &e {
            ClientError::Invalid { .. } => std::io::ErrorKind::InvalidInput,
            ClientError::ConnectionLost { .. } => std::io::ErrorKind::ConnectionAborted,
            ClientError::Timeout { .. } => std::io::ErrorKind::TimedOut,
            _ => std::io::ErrorKind::Other,
        };
        std::io::Error::new(kind, e)
    }
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;
