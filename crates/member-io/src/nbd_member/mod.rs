//! [`NbdMember`]: a member that is an NBD export on another host (network RAID), reached with
//! nbd-client over `nbd://HOST[:PORT]/EXPORT` or `nbd+unix:///EXPORT?socket=PATH`.
//!
//! Requests are split at the export's maximum payload; alignment is the export's minimum
//! block (at most 4096). Member `discard` and `write_zeroes` must leave zeros, which NBD's
//! TRIM does not promise, so both are WRITE_ZEROES (without and with NO_HOLE), or zero
//! writes when the export has no WRITE_ZEROES. FUA and FLUSH pass through; on an export
//! without FUA a FUA write is a write and a FLUSH.
//!
//! With `?connections=N` and an export offering CAN_MULTI_CONN (its connections see one
//! another's writes, and a FLUSH on one covers what completed on all), requests go round N
//! connections; without CAN_MULTI_CONN one is used (with a warning).
//!
//! Holes: `allocation` asks the export's `base:allocation` (negotiated with structured
//! replies), so a sparse remote member keeps rebuilds and copies of the array sparse.
//!
//! Every wait is bounded. Opening the member (connect, TLS, option haggling, the identity
//! read, more connections) must finish within the member timeout; so must every request.
//! A network blip is not a failed member: a request whose connection drops, that gets no
//! answer in time (a server stopped, cut off or stalled), or whose reply breaks the protocol
//! is re-sent on a new connection, reconnecting with backoff (`backoff.rs`: exponential, with
//! jitter, kept across reconnects until a connection answers a request) for up to the member
//! timeout from the first failure (the engine holds the stripe lock of a write meanwhile, so
//! a re-sent write races nothing). Only then is the error returned and the member failed.
//!
//! What fails a member at once: writes the old connection acknowledged but no FLUSH covered
//! yet (a server with a write cache may have lost them with the connection); a server that
//! comes back as another disk (`identity.rs`); [`MAX_VIOLATIONS`] protocol violations within
//! [`VIOLATION_WINDOW`] (nothing it sends is trusted). An error the server answered (its
//! disk failed) is returned as is. Warnings about one member are rate-limited
//! (`log_limit.rs`); what went wrong last, and of which kind, is in its [`LinkStats`].

mod backoff;
mod identity;
mod log_limit;

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use nbd_client::{Client, ClientConfig, ClientError, ExportAddress};
use nbd_server::protocol::consts::{state, tflags};
use raid_core::member::{BufResult, IoFuture, Member, check_range};
use raid_core::{AlignedBuf, Allocation};
use tokio::time::Instant;
use tracing::{info, warn};

use self::backoff::Backoff;
use self::identity::{Identity, read_identity};
use self::log_limit::LogLimit;
use crate::error::Result;
use crate::link_stats::{LinkErrorKind, LinkState, LinkStats};

/// Zero writes (export without WRITE_ZEROES) go out in pieces of at most this many bytes.
const ZERO_PIECE_BYTES: u64 = 1 << 20;
/// This many protocol violations within [`VIOLATION_WINDOW`] fail the member.
pub const MAX_VIOLATIONS: usize = 3;
pub const VIOLATION_WINDOW: Duration = Duration::from_secs(600);

pub struct NbdMember {
    name: String,
    address: ExportAddress,
    /// The export's size: what it said at connect, larger after [`Member::refresh_len`] saw it grow.
    len_bytes: AtomicU64,
    alignment: usize,
    /// Largest piece of one READ/WRITE (the export's maximum payload, whole alignments).
    piece_bytes: u64,
    can_flush: bool,
    /// Without it, a FUA write is a write and a FLUSH.
    can_fua: bool,
    can_write_zeroes: bool,
    member_timeout: Duration,
    /// Connections kept open.
    connections: usize,
    connection: Mutex<Connection>,
    /// One reconnection at a time.
    reconnecting: tokio::sync::Mutex<()>,
    link: Arc<LinkStats>,
    identity: Mutex<Identity>,
    backoff: Mutex<Backoff>,
    /// A request was answered since the last reconnect (cheap to set on every answer).
    answered: AtomicBool,
    /// When recent protocol violations happened, and on which connection generation the
    /// last one was counted (one broken reply fails every request of its connection).
    violations: Mutex<(VecDeque<Instant>, Option<u64>)>,
    log: Mutex<LogLimit>,
}

/// The current connections and what they hold that new ones could not vouch for.
struct Connection {
    /// One, or `?connections=N` when the export has CAN_MULTI_CONN; replaced together.
    clients: Vec<Arc<Client>>,
    /// Requests go round the clients.
    next: usize,
    generation: u64,
    /// Writes acknowledged without FUA, counted; `flushed`: how many of them a FLUSH covered.
    acked_writes: u64,
    flushed_writes: u64,
    /// Why the member is done for (no more reconnecting).
    failed: Option<String>,
}

/// The kind of a client error, for the link's last error.
fn kind_of(e: &ClientError) -> LinkErrorKind {
    match e {
        ClientError::Timeout { .. } => LinkErrorKind::Timeout,
        ClientError::Protocol { .. } => LinkErrorKind::ProtocolViolation,
        ClientError::Errno { .. } => LinkErrorKind::IoError,
        ClientError::Refused { .. } | ClientError::Tls { .. } => LinkErrorKind::Refused,
        _ => LinkErrorKind::ConnectionLost,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl NbdMember {
    /// Connects to the export at `uri` within `member_timeout` (connect, handshake, identity
    /// read, every connection); later, a lost connection is retried for `member_timeout`.
    /// What the connection goes through is counted in `link` (shared by every member opened
    /// for this URI).
    pub async fn connect(uri: &str, member_timeout: Duration, link: Arc<LinkStats>) -> Result<Self> {
        let address = ExportAddress::parse(uri)?;
        let opened = tokio::time::timeout(member_timeout, Self::open(uri, &address, member_timeout)).await;
        let error = match opened {
            Ok(Ok(member)) => {
                let member = Self { link, ..member };
                member.link.set_framing(member.lock().clients[0].details().framing.name());
                member.link.set_state(LinkState::Connected);
                return Ok(member);
            }
            Ok(Err(e)) => e,
            Err(_) => ClientError::Timeout {
                address: uri.to_string(),
                what: format!("the member was not open within {member_timeout:?} (connect, handshake, identity)"),
            },
        };
        link.record_error(kind_of(&error), error.to_string());
        if link.state().is_up() || matches!(link.state(), LinkState::Lost(_)) {
            link.set_state(LinkState::Lost(format!("cannot connect: {error}")));
        }
        Err(error.into())
    }

    /// The connections and what they say, without a time limit (the caller sets one).
    async fn open(
        uri: &str,
        address: &ExportAddress,
        member_timeout: Duration,
    ) -> std::result::Result<Self, ClientError> {
        let config = client_config(member_timeout);
        let client = Client::connect(address, &config).await?;
        let d = *client.details();
        if d.min_block_bytes > 4096 {
            return Err(ClientError::Invalid {
                address: uri.to_string(),
                what: format!("a minimum block of {} bytes (members take at most 4096)", d.min_block_bytes),
            });
        }
        let alignment = d.min_block_bytes as usize;
        let piece_bytes = u64::from(d.max_payload_bytes).min(32 << 20) / alignment as u64 * alignment as u64;
        info!(
            member = uri,
            len_bytes = d.size_bytes,
            min_block = d.min_block_bytes,
            max_payload = d.max_payload_bytes,
            read_only = d.read_only(),
            framing = d.framing.name(),
            base_allocation = d.allocation_context.is_some(),
            tls = client.tls().name(),
            "NBD member connected"
        );
        let identity = Identity::new(read_identity(&client, d.size_bytes).await?);
        let connections = if address.connections > 1 && !d.can_multi_conn() {
            warn!(
                member = uri,
                "the export does not offer CAN_MULTI_CONN: one connection instead of {}", address.connections
            );
            1
        } else {
            address.connections as usize
        };
        let clients = more_connections(address, &config, client, connections).await?;
        Ok(Self {
            identity: Mutex::new(identity),
            name: uri.to_string(),
            address: address.clone(),
            len_bytes: AtomicU64::new(d.size_bytes),
            alignment,
            piece_bytes: piece_bytes.max(alignment as u64),
            can_flush: d.can_flush(),
            can_fua: d.can_fua(),
            can_write_zeroes: d.can_write_zeroes(),
            member_timeout,
            connections,
            connection: Mutex::new(Connection {
                clients,
                next: 0,
                generation: 0,
                acked_writes: 0,
                flushed_writes: 0,
                failed: None,
            }),
            reconnecting: tokio::sync::Mutex::new(()),
            link: Arc::default(),
            backoff: Mutex::default(),
            answered: AtomicBool::new(false),
            violations: Mutex::default(),
            log: Mutex::default(),
        })
    }

    /// Whether the export refuses writes.
    pub fn read_only(&self) -> bool {
        self.lock().clients[0].details().read_only()
    }

    /// What the connection went through.
    pub fn link(&self) -> &Arc<LinkStats> {
        &self.link
    }

    /// Gives up on the member for good: `why`, with the link state it leaves.
    fn give_up(&self, c: &mut Connection, state: LinkState) -> io::Error {
        let why = state.reason().unwrap_or("failed").to_string();
        warn!(member = %self.name, "{why}: the member fails");
        c.failed = Some(why.clone());
        for client in &c.clients {
            client.abandon(&why);
        }
        self.link.set_state(state);
        io::Error::other(format!("{}: {why}", self.name))
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        lock(&self.connection)
    }

    fn check(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(&self.name, self.len_bytes(), offset, len)
    }

    /// A warning about this member, unless too many were logged lately (then counted).
    fn warn_limited(&self, message: std::fmt::Arguments<'_>) {
        match lock(&self.log).admit(std::time::Instant::now()) {
            Some(0) => warn!(member = %self.name, "{message}"),
            Some(held) => warn!(member = %self.name, "{message} ({held} similar lines held back)"),
            None => LinkStats::count(&self.link.log_lines_suppressed),
        }
    }

    /// Counts a protocol violation of connection `generation` (once per connection; `None`:
    /// a connection being opened, always counted); the member fails at the
    /// [`MAX_VIOLATIONS`]th within [`VIOLATION_WINDOW`].
    fn violation(&self, generation: Option<u64>, what: &str) -> io::Result<()> {
        let mut v = lock(&self.violations);
        if let Some(g) = generation {
            if v.1 == Some(g) {
                return Ok(());
            }
            v.1 = Some(g);
        }
        let now = Instant::now();
        v.0.retain(|&at| now.duration_since(at) < VIOLATION_WINDOW);
        v.0.push_back(now);
        let count = v.0.len();
        drop(v);
        self.link.record_error(LinkErrorKind::ProtocolViolation, what);
        if count >= MAX_VIOLATIONS {
            let why = format!("{count} protocol violations within {VIOLATION_WINDOW:?}, the last: {what}");
            return Err(self.give_up(&mut self.lock(), LinkState::Misbehaved(why)));
        }
        Ok(())
    }

    /// Runs `op` on the current connection, reconnecting and re-sending it while the member
    /// timeout allows. Errors the server answered (and invalid requests) are returned as is.
    async fn run<T, F, Fut>(&self, op: F) -> io::Result<T>
    where
        F: Fn(Arc<Client>) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, ClientError>>,
    {
        let mut deadline = None;
        loop {
            if deadline.is_some() {
                LinkStats::count(&self.link.retries);
            }
            let (client, generation) = {
                let mut c = self.lock();
                if let Some(why) = &c.failed {
                    return Err(io::Error::other(format!("{}: {why}", self.name)));
                }
                let client = c.clients[c.next % c.clients.len()].clone();
                c.next = c.next.wrapping_add(1);
                (client, c.generation)
            };
            let why = match tokio::time::timeout(self.member_timeout, op(client.clone())).await {
                Ok(Ok(value)) => {
                    if !self.answered.load(Ordering::Relaxed) {
                        self.answered.store(true, Ordering::Relaxed);
                    }
                    return Ok(value);
                }
                Ok(Err(e)) if !e.is_fatal() => {
                    if matches!(e, ClientError::Errno { .. }) {
                        self.link.record_error(LinkErrorKind::IoError, e.to_string());
                    }
                    return Err(e.into());
                }
                Ok(Err(e)) => {
                    let why = e.to_string();
                    match kind_of(&e) {
                        LinkErrorKind::ProtocolViolation => self.violation(Some(generation), &why)?,
                        kind => self.link.record_error(kind, why.clone()),
                    }
                    why
                }
                Err(_) => {
                    LinkStats::count(&self.link.timeouts);
                    let why = format!("no answer within {:?}", self.member_timeout);
                    self.link.record_error(LinkErrorKind::Timeout, why.clone());
                    client.abandon(&why);
                    why
                }
            };
            let deadline = *deadline.get_or_insert_with(|| Instant::now() + self.member_timeout);
            self.reconnect(generation, &why, deadline).await?;
        }
    }

    /// Replaces connection `generation` (unless another task already did), retrying with
    /// backoff until `deadline`.
    async fn reconnect(&self, generation: u64, why: &str, deadline: Instant) -> io::Result<()> {
        let _one = self.reconnecting.lock().await;
        {
            let mut c = self.lock();
            if c.generation != generation || c.failed.is_some() {
                return Ok(());
            }
            LinkStats::count(&self.link.disconnects);
            let unflushed = c.acked_writes - c.flushed_writes;
            if self.can_flush && unflushed > 0 {
                let failed = format!("connection lost ({why}) with {unflushed} acknowledged writes not yet flushed");
                return Err(self.give_up(&mut c, LinkState::Lost(failed)));
            }
            for old in &c.clients {
                old.abandon("replaced by a new connection");
            }
            self.link.set_state(LinkState::Reconnecting);
        }
        self.warn_limited(format_args!("connection lost ({why}); reconnecting for up to {:?}", self.member_timeout));
        // A connection that answered requests earns an immediate retry; one that failed
        // before answering anything (or a first attempt that failed) waits, longer each time.
        if self.answered.swap(false, Ordering::Relaxed) {
            lock(&self.backoff).proven();
        }
        let mut immediate = lock(&self.backoff).is_fresh();
        let not_back = |detail: &str| {
            let failed = format!("connection lost ({why}) and not back within {:?}{detail}", self.member_timeout);
            self.give_up(&mut self.lock(), LinkState::Lost(failed))
        };
        let config = client_config(self.member_timeout);
        loop {
            let wait = lock(&self.backoff).next_wait();
            if !immediate {
                if Instant::now() + wait >= deadline {
                    return Err(not_back(""));
                }
                tokio::time::sleep(wait).await;
            }
            immediate = false;
            let attempt = async {
                let first = Client::connect(&self.address, &config).await?;
                // Larger is the same disk grown (a resized volume; `refresh` takes the room).
                if first.details().size_bytes < self.len_bytes() {
                    return Ok(Err(first.details().size_bytes));
                }
                let now = read_identity(&first, self.len_bytes()).await?;
                let clients = more_connections(&self.address, &config, first, self.connections).await?;
                Ok(Ok((clients, now)))
            };
            let (clients, now) = match tokio::time::timeout_at(deadline, attempt).await {
                Err(_) => {
                    let what = "the last attempt to reconnect got no answer in time";
                    self.link.record_error(LinkErrorKind::Timeout, what);
                    return Err(not_back(" (the last attempt got no answer)"));
                }
                Ok(Err(e)) => {
                    match kind_of(&e) {
                        // A server that breaks the protocol while being reconnected counts
                        // towards failing it as one that breaks it on a request.
                        LinkErrorKind::ProtocolViolation => self.violation(None, &e.to_string())?,
                        // The server is there and answers with an error (its disk failed, as
                        // a request's error would say): the member fails now.
                        LinkErrorKind::IoError => {
                            self.link.record_error(LinkErrorKind::IoError, e.to_string());
                            let failed = format!("reconnected, but the server answers with an error: {e}");
                            return Err(self.give_up(&mut self.lock(), LinkState::Failed(failed)));
                        }
                        kind => self.link.record_error(kind, e.to_string()),
                    }
                    tracing::debug!(member = %self.name, error = %e, "reconnect failed; retrying");
                    continue;
                }
                Ok(Ok(Err(size))) => {
                    let failed = format!("the export came back with {size} bytes, fewer than {}", self.len_bytes());
                    self.link.record_error(LinkErrorKind::IdentityChanged, failed.clone());
                    return Err(self.give_up(&mut self.lock(), LinkState::Replaced(failed)));
                }
                Ok(Ok(Ok(found))) => found,
            };
            if let Err(failed) = lock(&self.identity).recognise(now.as_deref()) {
                self.link.record_error(LinkErrorKind::IdentityChanged, failed.clone());
                return Err(self.give_up(&mut self.lock(), LinkState::Replaced(failed)));
            }
            let mut c = self.lock();
            if c.failed.is_some() {
                // Retired while reconnecting.
                return Err(io::Error::other(format!("{}: {}", self.name, c.failed.clone().unwrap_or_default())));
            }
            // Requests still waiting on the old connections are re-sent on the new.
            self.link.set_framing(clients[0].details().framing.name());
            c.clients = clients;
            c.generation += 1;
            c.acked_writes = 0;
            c.flushed_writes = 0;
            LinkStats::count(&self.link.reconnects);
            self.link.set_state(LinkState::Connected);
            let n = LinkStats::get(&self.link.reconnects);
            drop(c);
            info!(member = %self.name, reconnects = n, "NBD member reconnected; requests re-sent");
            return Ok(());
        }
    }

    /// The export's size now, from a new connection. When it grew (and the export is still
    /// the same disk), every connection is replaced by ones that see the new size, after a
    /// FLUSH of the old ones so that nothing acknowledged depends on a connection that goes.
    /// The array asks while no request of its own is in flight; a write that was anyway
    /// leaves the old connections in place and the refresh fails (to be asked again).
    async fn refresh(&self) -> io::Result<u64> {
        let config = client_config(self.member_timeout);
        let len = self.len_bytes();
        let timed_out = || {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{}: no answer within {:?}", self.name, self.member_timeout),
            )
        };
        let probe = tokio::time::timeout(self.member_timeout, Client::connect(&self.address, &config))
            .await
            .map_err(|_| timed_out())?
            .map_err(io::Error::from)?;
        let size = probe.details().size_bytes;
        if size <= len {
            return Ok(size);
        }
        let seen = tokio::time::timeout(self.member_timeout, read_identity(&probe, len))
            .await
            .map_err(|_| timed_out())?
            .map_err(io::Error::from)?;
        lock(&self.identity)
            .recognise(seen.as_deref())
            .map_err(|why| io::Error::other(format!("{}: its size is not taken: {why}", self.name)))?;
        self.flush().await?;
        let clients = tokio::time::timeout(
            self.member_timeout,
            more_connections(&self.address, &config, probe, self.connections),
        )
        .await
        .map_err(|_| timed_out())?
        .map_err(io::Error::from)?;
        let _one = self.reconnecting.lock().await;
        let mut c = self.lock();
        if let Some(why) = &c.failed {
            return Err(io::Error::other(format!("{}: {why}", self.name)));
        }
        if c.acked_writes > c.flushed_writes {
            return Err(io::Error::other(format!(
                "{}: writes arrived while its new size was taken; ask again",
                self.name
            )));
        }
        for old in &c.clients {
            old.abandon("replaced by connections that see the export's new size");
        }
        c.clients = clients;
        c.generation += 1;
        c.acked_writes = 0;
        c.flushed_writes = 0;
        self.len_bytes.store(size, Ordering::Release);
        drop(c);
        info!(member = %self.name, from_bytes = len, to_bytes = size, "NBD member grew: connections replaced");
        Ok(size)
    }

    /// One WRITE request of `pieces`, sent one after another from `offset`.
    async fn write_piece(&self, offset: u64, pieces: Vec<Bytes>, fua: bool) -> io::Result<()> {
        let covers_identity = match pieces.as_slice() {
            [one] => lock(&self.identity).writing(offset, one),
            _ => {
                debug_assert!(!touches_identity(offset, pieces.iter().map(Bytes::len).sum()), "joined first");
                false
            }
        };
        let native_fua = fua && self.can_fua;
        let mut written = self
            .run(|client| {
                let pieces = pieces.clone();
                async move { client.write_pieces(offset, pieces, native_fua).await }
            })
            .await;
        if written.is_ok() && !native_fua {
            self.lock().acked_writes += 1;
            if fua {
                written = self.flush().await;
            }
        }
        if covers_identity {
            lock(&self.identity).written(written.is_ok());
        }
        written
    }

    async fn zero(&self, offset: u64, len: u64, may_deallocate: bool) -> io::Result<()> {
        self.check(offset, len)?;
        let mut at = 0;
        while at < len {
            let limit = if self.can_write_zeroes { u64::from(u32::MAX) / 2 / 4096 * 4096 } else { ZERO_PIECE_BYTES };
            let n = (len - at).min(limit);
            if self.can_write_zeroes {
                self.run(
                    |client| async move { client.write_zeroes(offset + at, n as u32, may_deallocate, false).await },
                )
                .await?;
                self.lock().acked_writes += 1;
            } else {
                self.write_piece(offset + at, vec![Bytes::from(vec![0u8; n as usize])], false).await?;
            }
            at += n;
        }
        Ok(())
    }
}

/// `first` and `count - 1` more connections to `address` (all or none).
async fn more_connections(
    address: &ExportAddress,
    config: &ClientConfig,
    first: Client,
    count: usize,
) -> std::result::Result<Vec<Arc<Client>>, ClientError> {
    let mut clients = vec![Arc::new(first)];
    while clients.len() < count {
        clients.push(Arc::new(Client::connect(address, config).await?));
    }
    Ok(clients)
}

fn client_config(member_timeout: Duration) -> ClientConfig {
    ClientConfig { connect_timeout: member_timeout.min(Duration::from_secs(10)), ..ClientConfig::default() }
}

/// Whether a write of `len` bytes at `offset` touches the member's identity area.
fn touches_identity(offset: u64, len: usize) -> bool {
    offset < identity::IDENTITY.end && offset + len as u64 > identity::IDENTITY.start
}

/// A member read's buffer, lent to nbd-client to receive the data in place.
struct MemberBuf(AlignedBuf);

impl nbd_client::ReadBuffer for MemberBuf {
    fn bytes_mut(&mut self) -> &mut [u8] {
        self.0.as_mut_slice()
    }
    fn bytes(&self) -> &[u8] {
        self.0.as_slice()
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        self
    }
}

impl Member for NbdMember {
    fn name(&self) -> &str {
        &self.name
    }

    fn len_bytes(&self) -> u64 {
        self.len_bytes.load(Ordering::Acquire)
    }

    fn refresh_len(&self) -> IoFuture<'_, io::Result<u64>> {
        Box::pin(self.refresh())
    }

    fn alignment(&self) -> usize {
        self.alignment
    }

    fn read_at(&self, offset_bytes: u64, mut buf: AlignedBuf) -> IoFuture<'_, BufResult> {
        Box::pin(async move {
            let len = buf.len() as u64;
            if let Err(e) = self.check(offset_bytes, len) {
                return (Err(e), buf);
            }
            if len <= self.piece_bytes {
                // One request, received straight into a buffer of its own (each attempt a
                // fresh one: a timed-out attempt's reply may still be landing in the last).
                let read = self
                    .run(|client| async move {
                        client.read_into(offset_bytes, MemberBuf(AlignedBuf::for_overwrite(len as usize))).await
                    })
                    .await;
                return match read {
                    Ok(MemberBuf(data)) => {
                        lock(&self.identity).seen(offset_bytes, data.as_slice());
                        (Ok(()), data)
                    }
                    Err(e) => (Err(e), buf),
                };
            }
            let mut at = 0;
            while at < len {
                let n = (len - at).min(self.piece_bytes);
                let read = self.run(|client| async move { client.read(offset_bytes + at, n as u32).await }).await;
                match read {
                    Ok(data) => {
                        lock(&self.identity).seen(offset_bytes + at, &data);
                        buf.as_mut_slice()[at as usize..(at + n) as usize].copy_from_slice(&data)
                    }
                    Err(e) => return (Err(e), buf),
                }
                at += n;
            }
            (Ok(()), buf)
        })
    }

    fn write_at(&self, offset_bytes: u64, buf: AlignedBuf, fua: bool) -> IoFuture<'_, BufResult> {
        Box::pin(async move {
            let result = self.write_slice_at(offset_bytes, buf.as_slice(), fua).await;
            (result, buf)
        })
    }

    fn write_slice_at<'a>(&'a self, offset_bytes: u64, data: &'a [u8], fua: bool) -> IoFuture<'a, io::Result<()>> {
        // One copy into shared bytes; `write_shared_at` splits it into requests.
        Box::pin(async move {
            self.check(offset_bytes, data.len() as u64)?;
            raid_core::copy_count::copied(data.len());
            self.write_shared_at(offset_bytes, vec![Bytes::copy_from_slice(data)], fua).await
        })
    }

    /// Requests of at most `piece_bytes`, each sent straight from the shared pieces.
    fn write_shared_at(&self, offset_bytes: u64, mut pieces: Vec<Bytes>, fua: bool) -> IoFuture<'_, io::Result<()>> {
        Box::pin(async move {
            let len: usize = pieces.iter().map(Bytes::len).sum();
            self.check(offset_bytes, len as u64)?;
            if pieces.len() > 1 && touches_identity(offset_bytes, len) {
                // The superblock area is remembered from one contiguous buffer.
                raid_core::copy_count::copied(len);
                pieces = vec![Bytes::from(pieces.concat())];
            }
            let (mut at, mut request, mut request_len) = (offset_bytes, Vec::new(), 0u64);
            for mut piece in pieces {
                while !piece.is_empty() {
                    let take = (self.piece_bytes - request_len).min(piece.len() as u64) as usize;
                    request.push(piece.split_to(take));
                    request_len += take as u64;
                    if request_len == self.piece_bytes {
                        self.write_piece(at, std::mem::take(&mut request), fua).await?;
                        (at, request_len) = (at + self.piece_bytes, 0);
                    }
                }
            }
            if request_len > 0 {
                self.write_piece(at, request, fua).await?;
            }
            Ok(())
        })
    }

    fn flush(&self) -> IoFuture<'_, io::Result<()>> {
        Box::pin(async move {
            // An export without FLUSH has no write cache: its writes are durable when answered.
            if !self.can_flush {
                return Ok(());
            }
            // Writes acknowledged before the FLUSH is sent are covered by it.
            let (covered, generation) = {
                let c = self.lock();
                (c.acked_writes, c.generation)
            };
            self.run(|client| async move { client.flush().await }).await?;
            let mut c = self.lock();
            if c.generation == generation {
                c.flushed_writes = c.flushed_writes.max(covered);
            }
            Ok(())
        })
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        Box::pin(self.zero(offset_bytes, len_bytes, true))
    }

    /// CACHE passed on to an export that offers it (up to 4 GiB of it); nothing otherwise.
    fn cache(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        Box::pin(async move {
            self.check(offset_bytes, len_bytes)?;
            let align = self.alignment as u64;
            let n = len_bytes.min(u64::from(u32::MAX)) / align * align;
            if n == 0 || !offset_bytes.is_multiple_of(align) {
                return Ok(());
            }
            self.run(|client| async move {
                if !client.details().can(tflags::SEND_CACHE) {
                    return Ok(());
                }
                client.cache(offset_bytes, n as u32).await
            })
            .await
        })
    }

    /// The export's own `base:allocation` (nbdkit, qemu-nbd and raidnbd answer it), in one
    /// BLOCK_STATUS of up to 4 GiB; all data from an export without the context.
    fn allocation(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<Vec<Allocation>>> {
        Box::pin(async move {
            self.check(offset_bytes, len_bytes)?;
            let align = self.alignment as u64;
            let n = len_bytes.min(u64::from(u32::MAX)) / align * align;
            if n == 0 || !offset_bytes.is_multiple_of(align) {
                return Ok(vec![Allocation::data(len_bytes)]);
            }
            let answer = self
                .run(|client| async move {
                    if client.details().allocation_context.is_none() {
                        return Ok(None);
                    }
                    client.block_status(offset_bytes, n as u32).await.map(Some)
                })
                .await?;
            Ok(match answer {
                None => vec![Allocation::data(len_bytes)],
                Some(extents) => extents
                    .into_iter()
                    .map(|(len, flags)| Allocation {
                        len_bytes: u64::from(len),
                        hole: flags & state::HOLE != 0,
                        zero: flags & state::ZERO != 0,
                    })
                    .collect(),
            })
        })
    }

    fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        Box::pin(self.zero(offset_bytes, len_bytes, false))
    }

    /// The array failed or removed the member: close the connections; the link says why,
    /// unless it is down for a reason of its own already (lost, replaced, misbehaved).
    fn retire(&self, why: &str) {
        let mut c = self.lock();
        c.failed.get_or_insert_with(|| why.to_string());
        for client in &c.clients {
            client.abandon(why);
        }
        self.link.set_state_if_up(LinkState::Failed(why.to_string()));
    }
}
