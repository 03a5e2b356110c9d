//! Admission: a request first takes one of the connection's request slots, then (READ and
//! WRITE) its length in permits of the server-wide byte budget, before its payload is read or
//! its read issued. Waits that may be abandoned (shutdown, a hard disconnect) go through
//! [`Gate::interruptible`]; before any wait the reader's collected replies are written, so it
//! never waits while holding unwritten replies (no deadlock on its own permits).

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::Transmission;
use super::reply_writer::{LocalReplies, SharedWriter};
use crate::error::Result;
use crate::send_file::ReplySink;

/// What admitting a request needs besides the socket (shared with other tasks, so `Sync`).
pub(super) struct Gate<'a, W> {
    pub(super) t: &'a Transmission,
    pub(super) slots: &'a Arc<Semaphore>,
    pub(super) shared: &'a SharedWriter<W>,
    pub(super) abort: &'a CancellationToken,
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
}
