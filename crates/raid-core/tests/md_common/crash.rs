//! A crash in the middle of anything: members whose writes hang once a shared budget is
//! spent (the process stops there, with what was written before on the members, as a
//! SIGKILL leaves them), and a poll loop that tells a stuck future from a finished one.

use std::future::Future;
use std::io;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::task::{Context, Poll};

use raid_core::member::{BufResult, IoFuture};
use raid_core::{AlignedBuf, Member, MemoryMember};

/// A member whose writes (and flushes) hang forever once the shared budget is spent: the
/// process stops there, with what was written before on the members (a SIGKILL).
pub struct Hanging {
    pub inner: Arc<MemoryMember>,
    pub budget: Arc<AtomicI64>,
}

impl Hanging {
    fn spent(&self) -> bool {
        self.budget.fetch_sub(1, Ordering::SeqCst) <= 0
    }
}

impl Member for Hanging {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn len_bytes(&self) -> u64 {
        self.inner.len_bytes()
    }
    fn read_at(&self, offset_bytes: u64, buf: AlignedBuf) -> IoFuture<'_, BufResult> {
        self.inner.read_at(offset_bytes, buf)
    }
    fn write_at(&self, offset_bytes: u64, buf: AlignedBuf, fua: bool) -> IoFuture<'_, BufResult> {
        if self.spent() {
            return Box::pin(std::future::pending());
        }
        self.inner.write_at(offset_bytes, buf, fua)
    }
    fn flush(&self) -> IoFuture<'_, io::Result<()>> {
        if self.spent() {
            return Box::pin(std::future::pending());
        }
        self.inner.flush()
    }
    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        self.inner.discard(offset_bytes, len_bytes)
    }
    fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        self.inner.write_zeroes(offset_bytes, len_bytes)
    }
}

/// Polls `f` until it is ready, or `None` when it is stuck (a hung member: the crash).
pub fn run_or_crash<F: Future>(f: F) -> Option<F::Output> {
    let mut f = pin!(f);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    for _ in 0..1000 {
        if let Poll::Ready(out) = f.as_mut().poll(&mut cx) {
            return Some(out);
        }
    }
    None
}
