//! The public server: accepts connections, runs each through handshake and transmission,
//! and shuts down cleanly.
//!
//! Lifecycle (mini-redis `Listener`/`Handler` shape):
//!
//! ```text
//! Server::serve(listener, shutdown)
//!   loop: accept ─▶ connection slot free? ─ no ─▶ close at once
//!                          │ yes
//!                          ▼
//!          spawn: handshake (timeout) ─▶ transmission ─▶ close
//!   shutdown fires ─▶ stop accepting; connections stop reading requests, finish those
//!                     in flight and close (grace period, then abort) ─▶ flush every
//!                     export's device ─▶ return
//! ```
//!
//! The stream type is generic ([`NbdStream`]); TCP and Unix sockets are provided
//! ([`NbdListener`]). After STARTTLS the connection continues on TCP with the session in the
//! kernel (kernel TLS: copy-free send and in-place receive as before), or on a user-space TLS
//! stream split with `tokio::io::split` (`TcpTls` on TCP, which keeps the payload wake
//! threshold; [`GenericStream`] otherwise), whose replies are copied, file ranges included.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::BytesMut;
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, debug_span, info, warn};

use crate::access::allowed;
use crate::config::{Export, ServerConfig, validate_exports};
use crate::error::{Error, Result};
use crate::handshake::{Negotiated, Outcome, Policy, TlsState, greet, haggle};
use crate::protocol::handshake_codec::ClientFlags;
use crate::stream::{GenericStream, NbdStream};
use crate::tls::{PeerIdentity, TcpSession, TcpTls, Tls};
use crate::transmission::{self, Transmission};

/// Who connected.
#[derive(Debug, Clone)]
pub enum Peer {
    /// A TCP peer (checked against [`ServerConfig::allowed_addresses`]).
    Ip(std::net::SocketAddr),
    /// A Unix socket peer, described for logs.
    Local(String),
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Ip(a) => write!(f, "{a}"),
            Peer::Local(s) => f.write_str(s),
        }
    }
}

/// A source of incoming connections.
pub trait NbdListener: Send {
    type Stream: NbdStream;
    /// Accepts one connection and says who it is from.
    fn accept_stream(&self) -> impl Future<Output = io::Result<(Self::Stream, Peer)>> + Send;
}

impl NbdListener for TcpListener {
    type Stream = TcpStream;
    async fn accept_stream(&self) -> io::Result<(TcpStream, Peer)> {
        let (stream, peer) = self.accept().await?;
        // Replies are batched by the writer; Nagle would only add latency.
        stream.set_nodelay(true)?;
        Ok((stream, Peer::Ip(peer)))
    }
}

impl NbdListener for UnixListener {
    type Stream = UnixStream;
    async fn accept_stream(&self) -> io::Result<(UnixStream, Peer)> {
        let (stream, peer) = self.accept().await?;
        let peer = peer.as_pathname().map(|p| p.display().to_string()).unwrap_or_else(|| "unix".to_string());
        Ok((stream, Peer::Local(peer)))
    }
}

/// An NBD server for a fixed set of exports.
///
/// Cheap to clone; clones share exports, limits and the connection and byte budgets, so
/// one server can listen on TCP and a Unix socket at once (call [`Server::serve`] twice).
#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
}

struct Inner {
    exports: Vec<Export>,
    config: ServerConfig,
    tls: Option<Tls>,
    connection_slots: Arc<Semaphore>,
    /// Made once: it reads the CPU count (cgroup files), and watches `connection_slots`.
    send_file: crate::send_file::SendFilePolicy,
    in_flight_bytes: Arc<Semaphore>,
    next_connection_id: AtomicU64,
}

impl Server {
    /// Checks the exports (unique, valid names; at least one) and the limits.
    pub fn new(exports: Vec<Export>, config: ServerConfig) -> Result<Self> {
        Self::with_tls(exports, config, None)
    }

    /// A server that offers (or requires) TLS with `tls`; `None`: plaintext only.
    pub fn with_tls(exports: Vec<Export>, config: ServerConfig, tls: Option<Tls>) -> Result<Self> {
        config.validate()?;
        validate_exports(&exports, tls.is_some())?;
        let connection_slots = Arc::new(Semaphore::new(config.max_connections));
        Ok(Self {
            inner: Arc::new(Inner {
                tls,
                send_file: crate::send_file::SendFilePolicy::new(connection_slots.clone(), config.max_connections),
                connection_slots,
                in_flight_bytes: Arc::new(Semaphore::new(config.max_in_flight_bytes)),
                exports,
                config,
                next_connection_id: AtomicU64::new(1),
            }),
        })
    }

    pub fn exports(&self) -> &[Export] {
        &self.inner.exports
    }

    pub fn config(&self) -> &ServerConfig {
        &self.inner.config
    }

    /// Serves connections from `listener` until `shutdown` completes, then stops
    /// accepting, lets connections finish the requests in flight (up to
    /// `shutdown_grace`), flushes every export's device and returns.
    pub async fn serve<L, F>(&self, listener: L, shutdown: F) -> Result<()>
    where
        L: NbdListener,
        F: Future<Output = ()> + Send,
    {
        let token = CancellationToken::new();
        let mut connections = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
                accepted = listener.accept_stream() => match accepted {
                    Ok((_, Peer::Ip(address))) if !allowed(&self.inner.config.allowed_addresses, address.ip()) => {
                        warn!(peer = %address, "address not allowed (--allow); closing");
                    }
                    Ok((stream, peer)) => match self.inner.connection_slots.clone().try_acquire_owned() {
                        Ok(slot) => {
                            let server = self.clone();
                            let token = token.child_token();
                            connections.spawn(async move { server.run_connection(stream, peer, token, slot).await });
                        }
                        Err(_) => warn!(%peer, limit = self.inner.config.max_connections, "connection limit reached; closing"),
                    },
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
        // Close the listening socket now, so connections queued in the backlog are refused
        // rather than left waiting for the drain.
        drop(listener);
        info!(connections = connections.len(), "shutting down: draining connections");
        token.cancel();
        let drained = tokio::time::timeout(self.inner.config.shutdown_grace, async {
            while connections.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            warn!(left = connections.len(), "shutdown grace period over; dropping connections");
            connections.shutdown().await;
        }
        self.flush_all().await
    }

    /// Flushes every export's device (done at the end of [`Server::serve`]).
    pub async fn flush_all(&self) -> Result<()> {
        let mut first_error = None;
        for export in &self.inner.exports {
            if let Err(e) = export.device.flush().await {
                warn!(export = %export.name, error = %e, "flush at shutdown failed");
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            None => Ok(()),
            Some(e) => Err(Error::Io(io::Error::other(e))),
        }
    }

    /// Runs one already-accepted connection to its end (handshake, then transmission).
    /// `shutdown` asks it to stop reading new requests and finish. Useful for socket
    /// activation or tests; [`Server::serve`] calls it for every accepted connection
    /// (without the connection limit, which `serve` applies).
    pub async fn serve_connection<S: NbdStream>(&self, stream: S, shutdown: CancellationToken) -> Result<()> {
        let id = self.inner.next_connection_id.fetch_add(1, Ordering::Relaxed);
        self.connection(stream, shutdown).instrument(debug_span!("connection", id)).await
    }

    async fn run_connection<S: NbdStream>(
        &self,
        stream: S,
        peer: Peer,
        shutdown: CancellationToken,
        _slot: OwnedSemaphorePermit,
    ) {
        let id = self.inner.next_connection_id.fetch_add(1, Ordering::Relaxed);
        let span = debug_span!("connection", id, %peer);
        async {
            debug!("accepted");
            match self.connection(stream, shutdown).await {
                Ok(()) => debug!("closed"),
                Err(
                    e @ (Error::Protocol(_)
                    | Error::UnknownExport(_)
                    | Error::HandshakeTimeout(_)
                    | Error::Tls(_)
                    | Error::Stalled { .. }),
                ) => {
                    warn!(error = %e, "connection dropped");
                }
                Err(e) => debug!(error = %e, "connection ended with an error"),
            }
        }
        .instrument(span)
        .await
    }

    async fn connection<S: NbdStream>(&self, mut stream: S, shutdown: CancellationToken) -> Result<()> {
        let mut buf = BytesMut::with_capacity(8 * 1024);
        let timeout = self.inner.config.handshake_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let exports = &self.inner.exports;
        let Some(flags) = handshake_step(deadline, timeout, greet(&mut stream, &mut buf)).await? else {
            return Ok(());
        };
        let tls = match &self.inner.tls {
            None => TlsState::Unavailable,
            Some(tls) => TlsState::Offered { required: tls.require },
        };
        let policy = Policy { exports, tls };
        let haggled = haggle(&mut stream, &mut buf, flags, &policy, &shutdown);
        match handshake_step(deadline, timeout, haggled).await? {
            Outcome::Closed => Ok(()),
            Outcome::Transmission(negotiated) => self.transmit(stream, buf, negotiated, shutdown).await,
            Outcome::StartTls => {
                let credentials = &self.inner.tls.as_ref().expect("STARTTLS is acknowledged only with TLS").credentials;
                let secured = Secured { deadline, timeout, flags, shutdown };
                match stream.into_tcp() {
                    Ok(tcp) if !credentials.may_use_kernel_tls() => {
                        let (tls, peer) = handshake_step(deadline, timeout, credentials.accept(tcp)).await?;
                        debug!(?peer, "TLS established");
                        self.after_starttls(TcpTls(tls), buf, &peer, secured).await
                    }
                    Ok(tcp) => match handshake_step(deadline, timeout, credentials.accept_tcp(tcp)).await? {
                        (TcpSession::Kernel { tcp, plaintext }, peer) => {
                            debug!(?peer, "TLS established, in the kernel");
                            buf.extend_from_slice(&plaintext);
                            self.after_starttls(tcp, buf, &peer, secured).await
                        }
                        (TcpSession::User(tls), peer) => {
                            debug!(?peer, "TLS established");
                            self.after_starttls(GenericStream(tls), buf, &peer, secured).await
                        }
                    },
                    Err(stream) => {
                        let (tls, peer) = handshake_step(deadline, timeout, credentials.accept(stream)).await?;
                        debug!(?peer, "TLS established");
                        self.after_starttls(GenericStream(tls), buf, &peer, secured).await
                    }
                }
            }
        }
    }

    /// Option haggling again on the TLS stream, then transmission.
    async fn after_starttls<T: NbdStream>(
        &self,
        mut stream: T,
        mut buf: BytesMut,
        peer: &PeerIdentity,
        s: Secured,
    ) -> Result<()> {
        let policy = Policy { exports: &self.inner.exports, tls: TlsState::Established(peer) };
        let haggled = haggle(&mut stream, &mut buf, s.flags, &policy, &s.shutdown);
        match handshake_step(s.deadline, s.timeout, haggled).await? {
            Outcome::Closed => Ok(()),
            Outcome::Transmission(negotiated) => self.transmit(stream, buf, negotiated, s.shutdown).await,
            Outcome::StartTls => Err(Error::protocol("STARTTLS acknowledged twice")),
        }
    }

    /// The transmission phase of a negotiated connection.
    async fn transmit<S: NbdStream>(
        &self,
        stream: S,
        buf: BytesMut,
        negotiated: Negotiated,
        shutdown: CancellationToken,
    ) -> Result<()> {
        let export = &self.inner.exports[negotiated.export_index];
        debug!(
            export = %export.name,
            size = negotiated.advertised.size_bytes,
            flags = negotiated.advertised.transmission_flags,
            framing = ?negotiated.framing,
            meta_contexts = negotiated.meta_contexts,
            "transmission"
        );
        let (reader, writer) = stream.into_halves();
        let t = Transmission {
            device: export.device.clone(),
            advertised: negotiated.advertised,
            framing: negotiated.framing,
            meta_contexts: negotiated.meta_contexts,
            in_flight_bytes: self.inner.in_flight_bytes.clone(),
            in_flight_pool_bytes: self.inner.config.max_in_flight_bytes,
            max_requests: self.inner.config.max_requests_per_connection,
            idle_timeout: self.inner.config.idle_timeout,
            stall_timeout: self.inner.config.stall_timeout,
            shutdown,
            send_file: self.inner.send_file.clone(),
        };
        transmission::run(reader, writer, buf, t).await
    }
}

/// What carries over a STARTTLS into the rest of the handshake.
struct Secured {
    deadline: tokio::time::Instant,
    timeout: Duration,
    flags: ClientFlags,
    shutdown: CancellationToken,
}

/// Runs one step of the handshake phase, which must end by `deadline` (`timeout` after accept).
async fn handshake_step<T>(
    deadline: tokio::time::Instant,
    timeout: Duration,
    step: impl Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout_at(deadline, step).await.map_err(|_| Error::HandshakeTimeout(timeout))?
}
