//! The crate's one error type, and the one place where failures become NBD error values.
//!
//! [`Error`] is what fallible server functions return (I/O, protocol violations that end a
//! connection, configuration mistakes). Errors that are *answered* rather than ending a
//! connection never become an [`Error`]: a refused option is an option reply, a refused
//! request an NBD errno. [`device_errno`] is the single mapping from
//! [`DeviceErrorKind`] to the NBD error value sent on the wire.

use std::time::Duration;

use crate::device::DeviceErrorKind;
use crate::protocol::consts::errno;

/// Everything that can go wrong in this crate without being answered on the wire.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The peer broke a MUST of the protocol; the connection is hard-disconnected.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The peer closed the connection in the middle of a message.
    #[error("connection closed by peer mid-message")]
    UnexpectedEof,
    /// A client held resources for a request and made no progress (a WRITE payload that
    /// stopped arriving, replies it did not read) for the stall timeout.
    #[error("client stopped {what} for {after:?}; closing")]
    Stalled { what: &'static str, after: Duration },
    #[error("handshake not finished within {0:?}")]
    HandshakeTimeout(Duration),
    /// EXPORT_NAME named an export that does not exist (the spec demands a hard disconnect).
    #[error("client asked for unknown export {0:?}")]
    UnknownExport(String),
    /// The TLS handshake after STARTTLS failed (wrong key, untrusted certificate, ...).
    #[error("TLS handshake failed: {0}")]
    Tls(String),
    #[error("invalid server configuration: {0}")]
    Config(String),
}

impl Error {
    pub(crate) fn protocol(what: impl Into<String>) -> Self {
        Error::Protocol(what.into())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The NBD error value for a device failure.
///
/// `fast_zero` says whether the failed request was a WRITE_ZEROES with FAST_ZERO: the spec
/// allows `ENOTSUP` only there, so elsewhere "not supported" becomes `EINVAL`.
pub fn device_errno(kind: DeviceErrorKind, fast_zero: bool) -> u32 {
    match kind {
        DeviceErrorKind::Io => errno::EIO,
        DeviceErrorKind::NoSpace => errno::ENOSPC,
        DeviceErrorKind::Invalid => errno::EINVAL,
        DeviceErrorKind::NotSupported if fast_zero => errno::ENOTSUP,
        DeviceErrorKind::NotSupported => errno::EINVAL,
        DeviceErrorKind::ReadOnly => errno::EPERM,
        DeviceErrorKind::ShuttingDown => errno::ESHUTDOWN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_supported_is_enotsup_only_for_fast_zero() {
        assert_eq!(device_errno(DeviceErrorKind::NotSupported, true), errno::ENOTSUP);
        assert_eq!(device_errno(DeviceErrorKind::NotSupported, false), errno::EINVAL);
        assert_eq!(device_errno(DeviceErrorKind::Io, false), errno::EIO);
        assert_eq!(device_errno(DeviceErrorKind::NoSpace, false), errno::ENOSPC);
        assert_eq!(device_errno(DeviceErrorKind::ReadOnly, false), errno::EPERM);
        assert_eq!(device_errno(DeviceErrorKind::ShuttingDown, false), errno::ESHUTDOWN);
    }
}
