//! [`Client`]: one connection to one export, pipelined.
//!
//! ```text
//!  read/write/flush/trim/zero ─▶ checks (range, alignment, payload size) ─▶ byte permits
//!     ─▶ cookie + waiter registered ─▶ request written by a spawned task (never cut short)
//!  reader task: replies in any order ─▶ replies.rs (checked, bounded) ─▶ waiter's oneshot
//! ```
//!
//! Requests are written whole or not at all: the write runs in its own task, so a caller
//! that drops its future cannot leave half a request on the wire. The bytes of READ and
//! WRITE payloads in flight are bounded by [`ClientConfig::max_in_flight_bytes`]. When the
//! connection ends (EOF, an I/O error, a protocol violation) every waiting request fails with
//! the reason, and so does every later one: reconnecting is the caller's business.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use nbd_server::protocol::client_codec::encode_request;
use nbd_server::protocol::consts::{cmd, cmd_flags, tflags};
use nbd_server::protocol::framing::Framing;
use nbd_server::protocol::request::RequestHeader;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::address::{Endpoint, ExportAddress};
use crate::error::{ClientError, Result};
use crate::handshake::{ExportDetails, greet, negotiate, start_tls};
use crate::replies::read_replies;
use crate::sender::{Outgoing, send_requests};
use crate::shared::{Closed, Shared};
use crate::tls::{Socket, TlsMode};
use crate::waiter::{Answer, Expect, ReadBuffer, Waiter};

/// Limits of one connection.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Connecting and the handshake must finish within this.
    pub connect_timeout: Duration,
    /// READ and WRITE payload bytes in flight at most (at least the largest request).
    pub max_in_flight_bytes: usize,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self { connect_timeout: Duration::from_secs(10), max_in_flight_bytes: 64 << 20 }
    }
}

type Writer = Box<dyn AsyncWrite + Send + Unpin>;
type Reader = Box<dyn AsyncRead + Send + Unpin>;

/// The handshake on a connected socket: plaintext, or (`nbds://`) STARTTLS first. `split`
/// gives a plaintext socket's own halves (no lock between them, unlike `tokio::io::split`).
async fn handshake<S: Socket>(
    mut stream: S,
    address: &ExportAddress,
    name: &str,
    split: impl FnOnce(S) -> (Reader, Writer),
) -> Result<Session> {
    if address.tls.is_some() {
        return handshake_tls(stream, address, name).await;
    }
    greet(&mut stream, name).await?;
    let details = negotiate(&mut stream, &address.export, name, Framing::Extended).await?;
    let (reader, writer) = split(stream);
    Ok(Session { details, reader, writer, tls: TlsMode::None })
}

/// Greeting, STARTTLS, the TLS handshake, then the export's negotiation over TLS.
async fn handshake_tls<S: Socket>(mut stream: S, address: &ExportAddress, name: &str) -> Result<Session> {
    let settings = address.tls.as_ref().expect("a TLS address");
    greet(&mut stream, name).await?;
    start_tls(&mut stream, name).await?;
    let (mut stream, tls) = crate::tls::connect(settings, stream, name).await?;
    let details = negotiate(&mut stream, &address.export, name, Framing::Extended).await?;
    let (r, w) = tokio::io::split(stream);
    Ok(Session { details, reader: Box::new(r), writer: Box::new(w), tls })
}

/// A negotiated connection, ready for requests.
struct Session {
    details: ExportDetails,
    reader: Reader,
    writer: Writer,
    tls: TlsMode,
}

/// A connection to one NBD export.
pub struct Client {
    details: ExportDetails,
    tls: TlsMode,
    shared: Arc<Shared>,
    /// To the task that owns the write half (`sender.rs`).
    outgoing: mpsc::UnboundedSender<Outgoing>,
    budget: Arc<Semaphore>,
    max_in_flight_bytes: usize,
    reader: JoinHandle<()>,
}

impl Drop for Client {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Client {
    /// Connects to `address` and negotiates its export.
    pub async fn connect(address: &ExportAddress, config: &ClientConfig) -> Result<Self> {
        let name = address.to_string();
        let io = |source| ClientError::Io { address: name.clone(), source };
        let connect = async {
            match &address.endpoint {
                Endpoint::Tcp { host, port } => {
                    let tcp = TcpStream::connect((host.as_str(), *port)).await.map_err(io)?;
                    tcp.set_nodelay(true).map_err(io)?;
                    handshake(tcp, address, &name, |s| {
                        let (r, w) = s.into_split();
                        (Box::new(r) as Reader, Box::new(w) as Writer)
                    })
                    .await
                }
                Endpoint::Unix { socket } => {
                    let unix = UnixStream::connect(socket).await.map_err(io)?;
                    handshake(unix, address, &name, |s| {
                        let (r, w) = s.into_split();
                        (Box::new(r) as Reader, Box::new(w) as Writer)
                    })
                    .await
                }
            }
        };
        let Session { details, reader, writer, tls } =
            tokio::time::timeout(config.connect_timeout, connect).await.map_err(|_| ClientError::Timeout {
                address: name.clone(),
                what: format!("connecting and the handshake did not finish within {:?}", config.connect_timeout),
            })??;
        let max_in_flight_bytes = config.max_in_flight_bytes.max(details.max_payload_bytes as usize);
        let shared = Arc::new(Shared::new(name));
        let reader = tokio::spawn(read_replies(reader, shared.clone(), details.framing));
        let (outgoing, queued) = mpsc::unbounded_channel();
        tokio::spawn(send_requests(writer, queued, shared.clone()));
        Ok(Self {
            details,
            tls,
            shared,
            outgoing,
            budget: Arc::new(Semaphore::new(max_in_flight_bytes)),
            max_in_flight_bytes,
            reader,
        })
    }

    pub fn details(&self) -> &ExportDetails {
        &self.details
    }

    /// Whether the connection runs TLS, and where.
    pub fn tls(&self) -> TlsMode {
        self.tls
    }

    pub fn address(&self) -> &str {
        &self.shared.address
    }

    /// Gives up on the connection (e.g. a server that stopped answering): every request in
    /// flight and every later one fails with `why`.
    pub fn abandon(&self, why: &str) {
        self.reader.abort();
        self.shared.close(Closed::lost(why));
    }

    /// Why the connection ended, if it has.
    pub fn closed(&self) -> Option<String> {
        self.shared.lock().closed.as_ref().map(|c| c.why.clone())
    }

    /// Reads `len` bytes at `offset`.
    pub async fn read(&self, offset: u64, len: u32) -> Result<Vec<u8>> {
        self.read_into(offset, vec![0u8; len as usize]).await
    }

    /// Reads `buf.bytes().len()` bytes at `offset` straight into `buf` (received in place, no
    /// copy), which comes back filled; on an error it is dropped.
    pub async fn read_into<B: ReadBuffer>(&self, offset: u64, buf: B) -> Result<B> {
        let len = buf.bytes().len();
        let len = u32::try_from(len).map_err(|_| self.invalid(format!("a read of {len} bytes")))?;
        match self.request_into(cmd::READ, 0, offset, len, Vec::new(), Some(Box::new(buf))).await? {
            Answer::Data(data) => Ok(*data.into_any().downcast::<B>().expect("the buffer lent comes back")),
            other => unreachable!("a READ answers with data, not {other:?}"),
        }
    }

    /// `base:allocation` of `len` bytes at `offset`: (length, NBD_STATE_* flags) extents from
    /// `offset` on, at least one, covering at most `len` (the server may answer less). Only
    /// when the export took the context ([`ExportDetails::allocation_context`]).
    pub async fn block_status(&self, offset: u64, len: u32) -> Result<Vec<(u32, u32)>> {
        if self.details.allocation_context.is_none() {
            return Err(self.invalid("the export has no base:allocation context".into()));
        }
        match self.request(cmd::BLOCK_STATUS, 0, offset, len, Vec::new()).await? {
            Answer::Status(extents) => Ok(extents),
            other => unreachable!("a BLOCK_STATUS answers with extents, not {other:?}"),
        }
    }

    /// Writes `data` at `offset`; with `fua`, durable when answered.
    pub async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<()> {
        self.write_pieces(offset, vec![data], fua).await
    }

    /// Writes `pieces` one after another from `offset` as one request, sent straight from
    /// them (no copy into one buffer); with `fua`, durable when answered.
    pub async fn write_pieces(&self, offset: u64, pieces: Vec<Bytes>, fua: bool) -> Result<()> {
        let total: usize = pieces.iter().map(Bytes::len).sum();
        let len = u32::try_from(total).map_err(|_| self.invalid(format!("a write of {total} bytes")))?;
        let flags = if fua { self.fua_flag()? } else { 0 };
        self.request(cmd::WRITE, flags, offset, len, pieces).await.map(drop)
    }

    /// Makes every answered write durable.
    pub async fn flush(&self) -> Result<()> {
        if !self.details.can(tflags::SEND_FLUSH) {
            return Err(self.invalid("the export has no FLUSH".into()));
        }
        self.request(cmd::FLUSH, 0, 0, 0, Vec::new()).await.map(drop)
    }

    /// Discards a range (a hint: it may read back as before or as zeros).
    pub async fn trim(&self, offset: u64, len: u32, fua: bool) -> Result<()> {
        if !self.details.can(tflags::SEND_TRIM) {
            return Err(self.invalid("the export has no TRIM".into()));
        }
        let flags = if fua { self.fua_flag()? } else { 0 };
        self.request(cmd::TRIM, flags, offset, len, Vec::new()).await.map(drop)
    }

    /// Asks the server to read a range ahead (NBD_CMD_CACHE, a hint).
    pub async fn cache(&self, offset: u64, len: u32) -> Result<()> {
        if !self.details.can(tflags::SEND_CACHE) {
            return Err(self.invalid("the export has no CACHE".into()));
        }
        self.request(cmd::CACHE, 0, offset, len, Vec::new()).await.map(drop)
    }

    /// Zeroes a range; `may_deallocate` lets the server punch a hole.
    pub async fn write_zeroes(&self, offset: u64, len: u32, may_deallocate: bool, fua: bool) -> Result<()> {
        if !self.details.can(tflags::SEND_WRITE_ZEROES) {
            return Err(self.invalid("the export has no WRITE_ZEROES".into()));
        }
        let mut flags = if fua { self.fua_flag()? } else { 0 };
        if !may_deallocate {
            flags |= cmd_flags::NO_HOLE;
        }
        self.request(cmd::WRITE_ZEROES, flags, offset, len, Vec::new()).await.map(drop)
    }

    /// Says goodbye (NBD_CMD_DISC) and closes the write side.
    pub async fn disconnect(&self) -> Result<()> {
        let header = RequestHeader { flags: 0, command: cmd::DISC, cookie: 0, offset: 0, length: 0 };
        let (raw, n) = encode_request(&header, self.details.framing);
        let (done, outcome) = oneshot::channel();
        let gone = || io::Error::new(io::ErrorKind::BrokenPipe, "the connection's sender is gone");
        let sent = match self.outgoing.send(Outgoing::Disconnect(Bytes::copy_from_slice(&raw[..n]), done)) {
            Ok(()) => outcome.await.unwrap_or_else(|_| Err(gone())),
            Err(_) => Err(gone()),
        };
        sent.map_err(|source| ClientError::Io { address: self.shared.address.clone(), source })
    }

    fn fua_flag(&self) -> Result<u16> {
        if self.details.can(tflags::SEND_FUA) {
            Ok(cmd_flags::FUA)
        } else {
            Err(self.invalid("the export has no FUA".into()))
        }
    }

    fn invalid(&self, what: String) -> ClientError {
        ClientError::Invalid { address: self.shared.address.clone(), what }
    }

    async fn request(&self, command: u16, flags: u16, offset: u64, len: u32, payload: Vec<Bytes>) -> Result<Answer> {
        self.request_into(command, flags, offset, len, payload, None).await
    }

    /// [`request`](Self::request), a READ received into `read_into` if given.
    async fn request_into(
        &self,
        command: u16,
        flags: u16,
        offset: u64,
        len: u32,
        payload: Vec<Bytes>,
        read_into: Option<Box<dyn ReadBuffer>>,
    ) -> Result<Answer> {
        let d = &self.details;
        let name = command_name(command);
        let end = offset.checked_add(u64::from(len));
        if command != cmd::FLUSH && end.is_none_or(|e| e > d.size_bytes) {
            return Err(self.invalid(format!("{name} at {offset}+{len} beyond the export's {} bytes", d.size_bytes)));
        }
        let min = u64::from(d.min_block_bytes);
        if !offset.is_multiple_of(min) || !u64::from(len).is_multiple_of(min) {
            return Err(self.invalid(format!("{name} at {offset}+{len} not aligned to the {min}-byte minimum block")));
        }
        let moves_data = command == cmd::READ || command == cmd::WRITE;
        if moves_data && len > d.max_payload_bytes {
            return Err(self.invalid(format!("{name} of {len} bytes over the {}-byte maximum", d.max_payload_bytes)));
        }
        if command == cmd::WRITE && d.read_only() {
            return Err(self.invalid("the export is read-only".into()));
        }
        let permit_bytes = if moves_data { (len as usize).min(self.max_in_flight_bytes) } else { 0 };
        // Held by the waiter until the reply is in (not by this future, which may be dropped).
        let permit =
            self.budget.clone().acquire_many_owned(permit_bytes as u32).await.expect("the budget is never closed");

        let (tx, rx) = oneshot::channel();
        let cookie = {
            let mut w = self.shared.lock();
            if let Some(closed) = &w.closed {
                return Err(closed.error(&self.shared.address));
            }
            let cookie = w.next_cookie;
            w.next_cookie += 1;
            let expect = match (command, d.allocation_context) {
                (cmd::READ, _) => Expect::Data,
                (cmd::BLOCK_STATUS, Some(context)) => Expect::Status(context),
                _ => Expect::Nothing,
            };
            w.by_cookie.insert(cookie, Waiter::new(name, offset, len, expect, tx, Some(permit), read_into));
            cookie
        };
        let header = RequestHeader { flags, command, cookie, offset, length: len.into() };
        let (raw, n) = encode_request(&header, d.framing);
        // Queued whole before this future can be dropped; the sender writes it whole.
        if self.outgoing.send(Outgoing::Request(Bytes::copy_from_slice(&raw[..n]), payload)).is_err() {
            self.shared.close(Closed::lost("the connection's sender is gone"));
        }
        rx.await.unwrap_or_else(|_| {
            Err(ClientError::ConnectionLost {
                address: self.shared.address.clone(),
                why: "the connection ended".into(),
            })
        })
    }
}

pub(crate) fn command_name(command: u16) -> &'static str {
    match command {
        cmd::READ => "READ",
        cmd::WRITE => "WRITE",
        cmd::FLUSH => "FLUSH",
        cmd::TRIM => "TRIM",
        cmd::WRITE_ZEROES => "WRITE_ZEROES",
        cmd::BLOCK_STATUS => "BLOCK_STATUS",
        cmd::CACHE => "CACHE",
        _ => "request",
    }
}
