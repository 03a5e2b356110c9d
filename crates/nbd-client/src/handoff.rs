//! A negotiated socket handed to someone else: the Linux kernel's NBD driver takes a
//! connected socket after the handshake (netlink `NBD_CMD_CONNECT` / `NBD_CMD_RECONFIGURE`)
//! and speaks only simple replies, so structured replies are not asked for. Plaintext only:
//! the driver cannot speak TLS.

use std::os::fd::OwnedFd;
use std::time::Duration;

use nbd_server::protocol::framing::Framing;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};

use crate::address::{Endpoint, ExportAddress};
use crate::error::{ClientError, Result};
use crate::handshake::{ExportDetails, greet, negotiate};

/// A socket ready for transmission (simple replies), blocking, and what the server said.
#[derive(Debug)]
pub struct Handoff {
    pub socket: OwnedFd,
    pub details: ExportDetails,
}

/// Connects to `address` and negotiates its export with simple replies, all within `timeout`.
pub async fn handoff(address: &ExportAddress, timeout: Duration) -> Result<Handoff> {
    let name = address.to_string();
    if address.tls.is_some() {
        return Err(ClientError::Protocol {
            address: name,
            what: "the kernel's NBD driver cannot speak TLS: attach a plaintext address (nbd:// or nbd+unix://)".into(),
        });
    }
    let io = |source| ClientError::Io { address: name.clone(), source };
    let connect = async {
        let (socket, details): (OwnedFd, _) = match &address.endpoint {
            Endpoint::Tcp { host, port } => {
                let mut tcp = TcpStream::connect((host.as_str(), *port)).await.map_err(io)?;
                tcp.set_nodelay(true).map_err(io)?;
                let details = simple(&mut tcp, &address.export, &name).await?;
                let std = tcp.into_std().map_err(io)?;
                std.set_nonblocking(false).map_err(io)?;
                (std.into(), details)
            }
            Endpoint::Unix { socket } => {
                let mut unix = UnixStream::connect(socket).await.map_err(io)?;
                let details = simple(&mut unix, &address.export, &name).await?;
                let std = unix.into_std().map_err(io)?;
                std.set_nonblocking(false).map_err(io)?;
                (std.into(), details)
            }
        };
        Ok(Handoff { socket, details })
    };
    tokio::time::timeout(timeout, connect).await.map_err(|_| ClientError::Timeout {
        address: name.clone(),
        what: format!("connecting and the handshake did not finish within {timeout:?}"),
    })?
}

/// Greeting and negotiation with simple replies.
async fn simple<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, export: &str, name: &str) -> Result<ExportDetails> {
    greet(stream, name).await?;
    negotiate(stream, export, name, Framing::Simple).await
}
