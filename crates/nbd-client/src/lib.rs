//! nbd-client: an async, pipelined NBD client, the member side of network RAID (a RAID member
//! that is an NBD export on another host).
//!
//! ```no_run
//! # async fn demo() -> nbd_client::Result<()> {
//! use nbd_client::{Client, ClientConfig, ExportAddress};
//! let address = ExportAddress::parse("nbd://127.0.0.1:10809/disk")?;
//! let client = Client::connect(&address, &ClientConfig::default()).await?;
//! client.write(0, bytes::Bytes::from(vec![7u8; 4096]), true).await?;
//! assert_eq!(client.read(0, 4096).await?, vec![7u8; 4096]);
//! # Ok(()) }
//! ```
//!
//! - `address`: libnbd's URI syntax (`nbd://`, `nbd+unix://`, `nbds://`, `nbds+unix://`);
//!   `tls`: the client side of STARTTLS (rustls for X.509, OpenSSL for PSK).
//! - `handshake`: fixed newstyle, structured replies, GO with block sizes ([`ExportDetails`]).
//! - `client`: [`Client`], requests checked against the export and pipelined with bounded
//!   bytes in flight; `replies`: the reader task, which checks every reply before using it
//!   (fuzzed: `fuzzing`, `fuzz/`); `shared`: the requests in flight and why the connection
//!   ended, shared by both; `waiter`: one request in flight and what its reply has brought.
//!   Dependencies point one way: `client` → `replies` → `shared` → `waiter` (each uses only
//!   modules to its right).
//! - `handoff`: [`handoff()`], a socket negotiated with simple replies for the kernel's
//!   driver (`raidnbd attach`).
//! - `error`: [`ClientError`]; an `Errno` fails one request, anything else the connection.
//!
//! The wire format is nbd-server's `protocol` module (pure codecs); this crate knows
//! nothing of RAID.

mod address;
mod client;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod handoff;
mod handshake;
mod replies;
mod sender;
mod shared;
mod tls;
mod waiter;

pub use address::{DEFAULT_PORT, Endpoint, ExportAddress, MAX_CONNECTIONS, TlsCredentialFiles, TlsSettings};
pub use client::{Client, ClientConfig};
pub use error::{ClientError, Result};
pub use handoff::{Handoff, handoff};
pub use handshake::ExportDetails;
pub use tls::TlsMode;
pub use waiter::ReadBuffer;
