//! Admission: a request first takes one of the connection's request slots, then (READ and
//! WRITE) its length in byte permits ([`ByteBudget`], `byte_budget.rs`), before its payload is
//! read or its read issued.
//!
//! Bytes come from the connection's reserve when it has room, else from the pool within the
//! connection's share (share first, so a connection over its share waits without holding any
//! of the pool). Waits that may be abandoned (shutdown, a hard disconnect) go through
//! [`Gate::interruptible`]; before any wait the reader's collected replies are written, so it
//! never waits while holding unwritten replies (no deadlock on its own permits).

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::Transmission;
use super::byte_budget::{ByteBudget, BytePermit};
use super::reply_writer::{LocalReplies, SharedWriter};
use crate::error::Result;
use crate::send_file::ReplySink;

/// What admitting a request needs besides the socket (shared with other tasks, so `Sync`).
pub(super) struct Gate<'a, W> {
    pub(super) t: &'a Transmission,
    pub(super) slots: &'a Arc<Semaphore>,
    pub(super) shared: &'a SharedWriter<W>,
    pub(super) abort: &'a CancellationToken,
    pub(super) bytes: &'a ByteBudget,
}

impl<W: ReplySink> Gate<'_, W> {
    /// Waits for `wait` unless shutdown or abort comes first (then `None`). Only waits that
    /// are safe to abandon go through here; writes never do.
    pub(super) async fn interruptible<T>(&self, wait: impl Future<Output = T>) -> Option<T> {
        tokio::select! {
            biased;
            _ = self.t.shutdown.cancelled() => {
                debug!("shutdown: no more requests are read");
                None
            }
            _ = self.abort.cancelled() => None,
            value = wait => Some(value),
        }
    }

    /// `n` permits of `semaphore`, writing out `local` first if it has to wait.
    pub(super) async fn permits(
        &self,
        semaphore: &Arc<Semaphore>,
        n: u32,
        local: &mut LocalReplies,
    ) -> Result<Option<OwnedSemaphorePermit>> {
        if let Ok(permit) = semaphore.clone().try_acquire_many_owned(n) {
            return Ok(Some(permit));
        }
        local.flush(self.shared).await?;
        let acquired = self.interruptible(semaphore.clone().acquire_many_owned(n)).await;
        Ok(acquired.map(|p| p.expect("semaphores are never closed")))
    }

    /// `n` byte permits: from the reserve if it has room now, else from the pool within the
    /// connection's share (share first, so a connection over its share waits without holding
    /// any of the pool). Writes out `local` first if it has to wait.
    pub(super) async fn byte_permits(&self, n: u32, local: &mut LocalReplies) -> Result<Option<BytePermit>> {
        if let Ok(permit) = self.bytes.reserve.clone().try_acquire_many_owned(n) {
            return Ok(Some(BytePermit::Reserved { _permit: permit }));
        }
        let Some(share) = self.permits(&self.bytes.share, n, local).await? else { return Ok(None) };
        let Some(pool) = self.permits(&self.bytes.pool, n, local).await? else { return Ok(None) };
        Ok(Some(BytePermit::Shared { _share: share, _pool: pool }))
    }
}
