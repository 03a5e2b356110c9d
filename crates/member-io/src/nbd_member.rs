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
//! A network blip is not a failed member. A request whose connection drops, or that gets no
//! answer for the member timeout (a server stopped or cut off), is re-sent on a new
//! connection, reconnecting with backoff for up to the member timeout from the first failure
//! (the engine holds the stripe lock of a write meanwhile, so a re-sent write races nothing).
//! Only then is the error returned and the member failed. One thing a new connection cannot
//! vouch for: writes the old one acknowledged but no FLUSH covered yet (a server with a
//! write cache may have lost them with the connection), so a connection lost with such writes
//! fails the member at once; the bitmap then knows what to resync. And a server that comes
//! back must hold the same member: its md superblock area (4 KiB at 4 KiB, which every
//! superblock write goes through this member to) must read as this member last wrote or read
//! it (or as a superblock write in flight would leave it); a server restarted empty or with
//! another disk fails the member instead of serving its zeros.

use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use nbd_client::{Client, ClientConfig, ClientError, ExportAddress};
use raid_core::AlignedBuf;
use raid_core::md::{SUPERBLOCK_BYTE_OFFSET, SUPERBLOCK_BYTES};
use raid_core::member::{BufResult, IoFuture, Member, check_range};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::error::Result;
use crate::link_stats::{LinkState, LinkStats};

/// Zero writes (export without WRITE_ZEROES) go out in pieces of at most this many bytes.
const ZERO_PIECE_BYTES: u64 = 1 << 20;
/// First and longest wait between reconnection attempts.
const BACKOFF_FIRST: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

pub struct NbdMember {
    name: String,
    address: ExportAddress,
    len_bytes: u64,
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
}

/// The member's superblock area as last seen, to recognise the member after a reconnect.
#[derive(Default)]
struct Identity {
    acked: Option<Vec<u8>>,
    /// A write of the area in flight.
    pending: Option<Vec<u8>>,
}

const IDENTITY: std::ops::Range<u64> = SUPERBLOCK_BYTE_OFFSET..SUPERBLOCK_BYTE_OFFSET + SUPERBLOCK_BYTES as u64;

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

impl NbdMember {
    /// Connects to the export at `uri`; a lost connection is retried for `member_timeout`.
    /// What the connection goes through is counted in `link` (shared by every member opened
    /// for this URI).
    pub async fn connect(uri: &str, member_timeout: Duration, link: Arc<LinkStats>) -> Result<Self> {
        let address = ExportAddress::parse(uri)?;
        let config = client_config(member_timeout);
        let client = Client::connect(&address, &config).await?;
        let d = *client.details();
        if d.min_block_bytes > 4096 {
            return Err(ClientError::Invalid {
                address: uri.to_string(),
                what: format!("a minimum block of {} bytes (members take at most 4096)", d.min_block_bytes),
            }
            .into());
        }
        let alignment = d.min_block_bytes as usize;
        let piece_bytes = u64::from(d.max_payload_bytes).min(32 << 20) / alignment as u64 * alignment as u64;
        info!(
            member = uri,
            len_bytes = d.size_bytes,
            min_block = d.min_block_bytes,
            max_payload = d.max_payload_bytes,
            read_only = d.read_only(),
            "NBD member connected"
        );
        let identity = Identity { acked: read_identity(&client, d.size_bytes).await?, pending: None };
        let connections = if address.connections > 1 && !d.can_multi_conn() {
            warn!(
                member = uri,
                "the export does not offer CAN_MULTI_CONN: one connection instead of {}", address.connections
            );
            1
        } else {
            address.connections as usize
        };
        let clients = more_connections(&address, &config, client, connections).await?;
        link.set_state(LinkState::Connected);
        Ok(Self {
            identity: Mutex::new(identity),
            name: uri.to_string(),
            address,
            len_bytes: d.size_bytes,
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
            link,
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
        self.link.set_state(state);
        io::Error::other(format!("{}: {why}", self.name))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.connection.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn check(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(&self.name, self.len_bytes, offset, len)
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
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(e)) if !e.is_fatal() => return Err(e.into()),
                Ok(Err(e)) => e.to_string(),
                Err(_) => {
                    LinkStats::count(&self.link.timeouts);
                    let why = format!("no answer within {:?}", self.member_timeout);
                    client.abandon(&why);
                    why
                }
            };
            let deadline = *deadline.get_or_insert_with(|| Instant::now() + self.member_timeout);
            self.reconnect(generation, &why, deadline).await?;
        }
    }

    /// Replaces connection `generation` (unless another task already did), retrying until
    /// `deadline`.
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
            self.link.set_state(LinkState::Reconnecting);
        }
        warn!(member = %self.name, "connection lost ({why}); reconnecting for up to {:?}", self.member_timeout);
        let mut wait = BACKOFF_FIRST;
        let config = client_config(self.member_timeout);
        loop {
            let attempt = async {
                let first = Client::connect(&self.address, &config).await?;
                if first.details().size_bytes != self.len_bytes {
                    return Ok(vec![Arc::new(first)]); // refused below
                }
                more_connections(&self.address, &config, first, self.connections).await
            };
            let outcome = tokio::time::timeout_at(deadline, attempt).await;
            match outcome {
                Ok(Ok(clients)) if clients[0].details().size_bytes == self.len_bytes => {
                    if let Err(failed) = self.same_member(&clients[0]).await {
                        return Err(self.give_up(&mut self.lock(), LinkState::Replaced(failed)));
                    }
                    let mut c = self.lock();
                    // Requests still waiting on the old connections are re-sent on the new.
                    for old in &c.clients {
                        old.abandon("replaced by a new connection");
                    }
                    c.clients = clients;
                    c.generation += 1;
                    c.acked_writes = 0;
                    c.flushed_writes = 0;
                    LinkStats::count(&self.link.reconnects);
                    self.link.set_state(LinkState::Connected);
                    let n = LinkStats::get(&self.link.reconnects);
                    info!(member = %self.name, reconnects = n, "NBD member reconnected; requests re-sent");
                    return Ok(());
                }
                Ok(Ok(clients)) => {
                    let failed = format!(
                        "the export came back with {} bytes instead of {}",
                        clients[0].details().size_bytes,
                        self.len_bytes
                    );
                    return Err(self.give_up(&mut self.lock(), LinkState::Replaced(failed)));
                }
                Ok(Err(e)) if Instant::now() + wait < deadline => {
                    tracing::debug!(member = %self.name, error = %e, "reconnect failed; retrying in {wait:?}");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(BACKOFF_MAX);
                }
                _ => {
                    let failed = format!("connection lost ({why}) and not back within {:?}", self.member_timeout);
                    return Err(self.give_up(&mut self.lock(), LinkState::Lost(failed)));
                }
            }
        }
    }

    async fn write_piece(&self, offset: u64, piece: Bytes, fua: bool) -> io::Result<()> {
        let end = offset + piece.len() as u64;
        let covers_identity = offset <= IDENTITY.start && end >= IDENTITY.end;
        if covers_identity {
            let at = (IDENTITY.start - offset) as usize;
            self.identity().pending = Some(piece[at..at + SUPERBLOCK_BYTES].to_vec());
        } else if offset < IDENTITY.end && end > IDENTITY.start {
            // Part of the area: what it holds now is not known here.
            self.identity().acked = None;
        }
        let native_fua = fua && self.can_fua;
        let mut written = self
            .run(|client| {
                let piece = piece.clone();
                async move { client.write(offset, piece, native_fua).await }
            })
            .await;
        if written.is_ok() && !native_fua {
            self.lock().acked_writes += 1;
            if fua {
                written = self.flush().await;
            }
        }
        if covers_identity {
            let mut identity = self.identity();
            let pending = identity.pending.take();
            if written.is_ok() {
                identity.acked = pending;
            }
        }
        written
    }

    fn identity(&self) -> std::sync::MutexGuard<'_, Identity> {
        self.identity.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the export behind `client` is this member: its superblock area reads as last
    /// seen here (or as a superblock write in flight left it).
    async fn same_member(&self, client: &Client) -> std::result::Result<(), String> {
        let now = read_identity(client, self.len_bytes).await.map_err(|e| format!("cannot read it back: {e}"))?;
        let identity = self.identity();
        match (&identity.acked, now) {
            (Some(known), Some(now)) if *known == now || identity.pending.as_ref() == Some(&now) => Ok(()),
            (None, _) | (_, None) => Err("the member's superblock area is not known here".into()),
            _ => Err("the export came back with other contents (its superblock area changed)".into()),
        }
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
                self.write_piece(offset + at, Bytes::from(vec![0u8; n as usize]), false).await?;
            }
            at += n;
        }
        Ok(())
    }
}

/// The superblock area of the export behind `client` (`None` if the export is too small).
async fn read_identity(client: &Client, len_bytes: u64) -> std::result::Result<Option<Vec<u8>>, ClientError> {
    if len_bytes < IDENTITY.end {
        return Ok(None);
    }
    Ok(Some(client.read(IDENTITY.start, SUPERBLOCK_BYTES as u32).await?))
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

impl Member for NbdMember {
    fn name(&self) -> &str {
        &self.name
    }

    fn len_bytes(&self) -> u64 {
        self.len_bytes
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
            let mut at = 0;
            while at < len {
                let n = (len - at).min(self.piece_bytes);
                let read = self.run(|client| async move { client.read(offset_bytes + at, n as u32).await }).await;
                match read {
                    Ok(data) => {
                        let start = offset_bytes + at;
                        if start <= IDENTITY.start && start + n >= IDENTITY.end && self.identity().pending.is_none() {
                            let from = (IDENTITY.start - start) as usize;
                            self.identity().acked = Some(data[from..from + SUPERBLOCK_BYTES].to_vec());
                        }
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
        Box::pin(async move {
            let len = data.len() as u64;
            self.check(offset_bytes, len)?;
            let mut at = 0;
            while at < len {
                let n = (len - at).min(self.piece_bytes);
                let piece = Bytes::copy_from_slice(&data[at as usize..(at + n) as usize]);
                self.write_piece(offset_bytes + at, piece, fua).await?;
                at += n;
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

    fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        Box::pin(self.zero(offset_bytes, len_bytes, false))
    }
}
