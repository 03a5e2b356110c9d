//! What the server serves ([`Export`]) and its resource limits ([`ServerConfig`]).
//!
//! Every limit exists so that a stalled or hostile client cannot hold resources: a cap on
//! connections, a deadline for the handshake, a per-connection cap on requests in flight
//! and a global cap on request/reply bytes in flight (backpressure instead of memory
//! growth).

use std::sync::Arc;
use std::time::Duration;

use crate::access::AddressRange;
use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::protocol::consts::{MAX_PAYLOAD_BYTES, MAX_STRING_BYTES};

/// One named export.
///
/// The empty name is special: a client asking for `""` gets the export named `""` if there
/// is one, else the first export in the list (the "default export").
#[derive(Clone)]
pub struct Export {
    pub name: String,
    /// Shown by LIST and `NBD_INFO_DESCRIPTION`; when empty, the device's description is used.
    pub description: String,
    pub device: Arc<dyn BlockDevice>,
    /// Served only over TLS, even when the server merely offers it.
    pub tls_required: bool,
    /// With TLS, the clients this export is open to: DNS names of verified client
    /// certificates or PSK identities. Empty: every client the server accepts.
    pub tls_peers: Vec<String>,
}

impl Export {
    pub fn new(name: impl Into<String>, device: Arc<dyn BlockDevice>) -> Self {
        Self { name: name.into(), description: String::new(), device, tls_required: false, tls_peers: Vec::new() }
    }

    /// Serves this export only to clients that started TLS.
    pub fn require_tls(mut self, required: bool) -> Self {
        self.tls_required = required;
        self
    }

    /// Opens this export only to these TLS peers (see [`Export::tls_peers`]).
    pub fn tls_peers(mut self, names: Vec<String>) -> Self {
        self.tls_peers = names;
        self
    }

    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// The description advertised to clients.
    pub(crate) fn effective_description(&self) -> String {
        if self.description.is_empty() { self.device.info().description } else { self.description.clone() }
    }
}

impl std::fmt::Debug for Export {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Export").field("name", &self.name).field("description", &self.description).finish()
    }
}

/// Upper bound for [`ServerConfig::max_requests_per_connection`].
pub const MAX_REQUESTS_PER_CONNECTION: usize = 1 << 16;

/// Server-wide limits. `Default` gives values suitable for production.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Connections beyond this many (handshaking or transmitting) are closed right after accept.
    pub max_connections: usize,
    /// A client must reach transmission (or abort) within this time.
    pub handshake_timeout: Duration,
    /// Global bound on WRITE payloads being received/applied plus READ data being produced
    /// or sent. A request waits for room before its payload is read or its read is issued.
    /// Must be at least the 64 MiB maximum payload.
    pub max_in_flight_bytes: usize,
    /// Requests in flight per connection (the spec's clients use up to 128; qemu 16, the
    /// kernel 128 per socket). When full, the server stops reading that socket.
    pub max_requests_per_connection: usize,
    /// On shutdown, how long in-flight requests may take before connections are dropped.
    pub shutdown_grace: Duration,
    /// A connection in transmission with no request in flight and none arriving for this long
    /// is closed (`None`: never; the kernel client keeps idle connections open for good).
    pub idle_timeout: Option<Duration>,
    /// A connection that holds permits for a request and makes no progress for this long
    /// (a WRITE payload that stops arriving, a batch of replies the client does not read) is
    /// closed, so that what it held goes back to the others.
    pub stall_timeout: Duration,
    /// IP peers outside these ranges are closed at accept (empty: any peer).
    pub allowed_addresses: Vec<AddressRange>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            max_connections: 256,
            handshake_timeout: Duration::from_secs(10),
            max_in_flight_bytes: 256 * 1024 * 1024,
            max_requests_per_connection: 256,
            shutdown_grace: Duration::from_secs(30),
            idle_timeout: None,
            stall_timeout: Duration::from_secs(60),
            allowed_addresses: Vec::new(),
        }
    }
}

impl ServerConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        if self.max_connections == 0 {
            return Err(Error::Config("max_connections must be at least 1".into()));
        }
        if !(1..=MAX_REQUESTS_PER_CONNECTION).contains(&self.max_requests_per_connection) {
            return Err(Error::Config(format!(
                "max_requests_per_connection must be between 1 and {MAX_REQUESTS_PER_CONNECTION}"
            )));
        }
        if self.stall_timeout.is_zero() {
            return Err(Error::Config("stall_timeout must be positive".into()));
        }
        if self.max_in_flight_bytes < MAX_PAYLOAD_BYTES as usize {
            return Err(Error::Config(format!(
                "max_in_flight_bytes ({}) must be at least the maximum payload ({MAX_PAYLOAD_BYTES})",
                self.max_in_flight_bytes
            )));
        }
        // tokio's Semaphore holds at most usize::MAX >> 3 permits.
        if self.max_in_flight_bytes > usize::MAX >> 4 {
            return Err(Error::Config("max_in_flight_bytes is absurdly large".into()));
        }
        Ok(())
    }
}

/// Checks export names: unique, non-NUL, within the spec's string limit, at least one export;
/// TLS rules only where TLS is offered (`tls`).
pub(crate) fn validate_exports(exports: &[Export], tls: bool) -> Result<()> {
    if exports.is_empty() {
        return Err(Error::Config("at least one export is required".into()));
    }
    for (i, export) in exports.iter().enumerate() {
        if export.name.len() > MAX_STRING_BYTES || export.name.contains('\0') {
            return Err(Error::Config(format!("export name {:?} is not a valid NBD string", export.name)));
        }
        if !tls && (export.tls_required || !export.tls_peers.is_empty()) {
            return Err(Error::Config(format!("export {:?} has TLS rules but the server has no TLS", export.name)));
        }
        if exports[..i].iter().any(|other| other.name == export.name) {
            return Err(Error::Config(format!("export name {:?} is used twice", export.name)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory_device::MemoryDevice;

    #[test]
    fn limits_are_checked() {
        assert!(ServerConfig::default().validate().is_ok());
        for bad in [
            ServerConfig { max_connections: 0, ..ServerConfig::default() },
            ServerConfig { max_requests_per_connection: 0, ..ServerConfig::default() },
            ServerConfig { max_requests_per_connection: MAX_REQUESTS_PER_CONNECTION + 1, ..ServerConfig::default() },
            ServerConfig { max_in_flight_bytes: (MAX_PAYLOAD_BYTES - 1) as usize, ..ServerConfig::default() },
        ] {
            assert!(matches!(bad.validate(), Err(Error::Config(_))), "{bad:?}");
        }
    }

    fn validate_exports_plain(exports: &[Export]) -> Result<()> {
        validate_exports(exports, false)
    }

    #[test]
    fn tls_rules_need_tls() {
        let device = Arc::new(MemoryDevice::new(4096));
        let export = Export::new("a", device).require_tls(true);
        assert!(validate_exports(std::slice::from_ref(&export), false).is_err());
        assert!(validate_exports(&[export], true).is_ok());
    }

    #[test]
    fn export_names_are_checked() {
        let device = Arc::new(MemoryDevice::new(4096));
        assert!(validate_exports_plain(&[]).is_err());
        assert!(validate_exports_plain(&[Export::new("a", device.clone()), Export::new("a", device.clone())]).is_err());
        assert!(validate_exports_plain(&[Export::new("a\0b", device.clone())]).is_err());
        assert!(validate_exports_plain(&[Export::new("x".repeat(4097), device.clone())]).is_err());
        assert!(validate_exports_plain(&[Export::new("", device.clone()), Export::new("b", device)]).is_ok());
    }
}
