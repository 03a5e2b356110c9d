//! nbd-server: a pipelined, multi-connection NBD server for any [`BlockDevice`].
//!
//! The crate knows nothing about what it serves: a RAID array, a file ([`FileDevice`]) or
//! memory ([`MemoryDevice`]) all implement the small [`BlockDevice`] trait.
//!
//! # Serving
//!
//! ```no_run
//! use std::sync::Arc;
//! use nbd_server::{Export, MemoryDevice, Server, ServerConfig};
//!
//! # async fn demo() -> nbd_server::Result<()> {
//! let disk = Arc::new(MemoryDevice::new(1 << 30));
//! let server = Server::new(vec![Export::new("disk", disk)], ServerConfig::default())?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:10809").await?;
//! // Any future works as the shutdown signal; the binary passes SIGTERM/SIGINT.
//! server.serve(listener, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```
//!
//! # Layout
//!
//! - [`device`]: the `BlockDevice` contract; [`memory_device`], [`file_device`]: two
//!   implementations.
//! - [`protocol`]: the wire format as pure functions (fuzzed): constants, handshake codec,
//!   request decoding/validation, reply encoding, and the client's side (`client_codec`).
//! - `handshake`: option haggling up to transmission; `transmission/`: the pipelined
//!   request/reply engine of one connection, one concept per file (`connection`: framing;
//!   `admission`: slots and byte permits; `byte_budget`: a connection's reserve and pool
//!   share; `receive`: payloads, in place or whole;
//!   `dispatch`: the device call and its reply; `reply_writer`: batched vectored writes;
//!   `mod`: the reader loop that answers ready requests itself and spawns the rest); `send_file`: [`ReplySink`], the write
//!   half that sends file ranges without a server copy; [`RequestSource`], the read half that
//!   waits for whole WRITE payloads; `stream`: [`NbdStream`], a connection's stream and its
//!   halves; `listener`: [`Server`], accept loop, limits and shutdown.
//! - `tls`: [`Tls`] credentials (rustls for X.509, OpenSSL for PSK) and the TLS stream.
//!   Dependencies point one way: `listener` → `handshake` → `tls` → `stream` (each uses
//!   only modules to its right).
//! - [`buffer_pool`]: recycled large I/O buffers (no page faults on every 1 MiB read).
//! - `config`: [`Export`], [`ServerConfig`]; `advertise`: flags and block sizes derived
//!   from a device; `error`: the crate's [`Error`] and the one device-error → NBD errno map.
//!
//! Protocol coverage: fixed newstyle; EXPORT_NAME, ABORT, LIST, INFO, GO, STRUCTURED_REPLY,
//! EXTENDED_HEADERS, LIST/SET_META_CONTEXT (`base:allocation` and the device's own), STARTTLS
//! ([`Tls`]: X.509 or PSK). Commands READ, WRITE, DISC, FLUSH, TRIM, CACHE, WRITE_ZEROES
//! (NO_HOLE, FAST_ZERO), BLOCK_STATUS; flags FUA, DF, REQ_ONE; simple or structured replies, or
//! extended headers (handshake.rs has the option table).

pub mod access;
pub mod device;
pub mod file_device;
pub mod file_mapping;
pub mod memory_device;
pub mod protocol;

mod advertise;
pub mod buffer_pool;
mod config;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod handshake;
pub mod kernel_tls;
mod listener;
mod read_buffer;
mod request_source;
mod send_file;
mod stream;
mod tls;
mod transmission;

pub use access::AddressRange;
pub use advertise::{Advertised, advertise, advertise_to};
pub use config::{Export, ServerConfig};
pub use device::{
    BlockDevice, DeviceError, DeviceErrorKind, DeviceFuture, DeviceInfo, DeviceResult, Extent, FileRange, ReadChunk,
    WriteTarget, ZeroFlags,
};
pub use error::{Error, Result, device_errno};
pub use file_device::FileDevice;
pub use file_mapping::{FileMapping, FileMappings};
pub use listener::{NbdListener, Peer, Server};
pub use memory_device::MemoryDevice;
pub use request_source::RequestSource;
pub use send_file::ReplySink;
pub use stream::{GenericStream, NbdStream};
pub use tls::{Tls, TlsCredentials};
pub use transmission::buffered_payload_copied_bytes;

/// The TLS credential files, as clients read them too (nbd-client's `nbds://`).
pub mod tls_files {
    pub use crate::tls::{load_private_key, read_psk_file};
}
pub use tokio_util::sync::CancellationToken;
