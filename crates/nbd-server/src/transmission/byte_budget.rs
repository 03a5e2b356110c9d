//! The byte budget of one connection: the bytes of READ and WRITE payloads it may hold at
//! once, and the permits ([`BytePermit`]) a request holds until its reply has been written.
//!
//! Contract: bytes come from the connection's own reserve ([`RESERVED_BYTES_PER_CONNECTION`],
//! never shared) when it has room, else from the server-wide pool, of which one connection may
//! hold at most its fair share (`ServerConfig::max_in_flight_bytes` / [`FAIR_SHARE_DIVISOR`],
//! at least one maximum payload). So clients that stall (never read their replies, never send
//! the payload they announced) can hold at most their share each, and every connection can
//! still move small requests through its reserve: one client cannot starve the others.
//! Memory held for requests stays below `max_connections` x reserve + the pool. Permits are
//! released when dropped, whoever drops them (the reply writer, or a request that fails).

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bytes each connection has to itself, outside the shared pool.
pub(crate) const RESERVED_BYTES_PER_CONNECTION: u32 = 1 << 20;
/// One connection may hold at most the pool divided by this (at least one maximum payload).
pub(crate) const FAIR_SHARE_DIVISOR: usize = 4;

/// Byte permits of one request, released when its reply has been written (or dropped).
pub(super) enum BytePermit {
    /// From the connection's own reserve.
    Reserved { _permit: OwnedSemaphorePermit },
    /// From the shared pool, within the connection's fair share.
    Shared { _share: OwnedSemaphorePermit, _pool: OwnedSemaphorePermit },
}

/// The connection's byte budget: its reserve and its share of the server-wide pool.
pub(super) struct ByteBudget {
    pub(super) reserve: Arc<Semaphore>,
    pub(super) share: Arc<Semaphore>,
    pub(super) pool: Arc<Semaphore>,
}

impl ByteBudget {
    /// A new connection's budget over the server-wide `pool` of `pool_bytes`.
    pub(super) fn new(pool: Arc<Semaphore>, pool_bytes: usize) -> Self {
        let share = (pool_bytes / FAIR_SHARE_DIVISOR).max(crate::protocol::consts::MAX_PAYLOAD_BYTES as usize);
        Self {
            reserve: Arc::new(Semaphore::new(RESERVED_BYTES_PER_CONNECTION as usize)),
            share: Arc::new(Semaphore::new(share.min(pool_bytes))),
            pool,
        }
    }
}
