//! A crash in the middle of anything: members whose writes hang once a shared budget is
//! spent (the process stops there, with what was written before on the members, as a
//! SIGKILL leaves them), and a poll loop that tells a stuck future from a finished one.

use std::future::Future;
use std::io;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::task::{Context, Poll};

use raid_core::engine::{MaintenanceWork, Step};
use raid_core::md::{self, StartOptions};
use raid_core::member::{BufResult, IoFuture};
use raid_core::{AlignedBuf, Member, MemoryMember};

use super::in_memory::Rng;

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

/// Starts the array on `members` again and again, each time over members that hang after
/// 1 to 24 more writes between them (a crash anywhere: inside a window's copy, between its
/// flush and its superblocks, half-way through the superblocks), stepping its reshape until
/// it ends; `on_start` checks every array that started. Returns how many crashes there were.
pub fn reshape_through_crashes(
    members: &[Arc<MemoryMember>],
    rng: &mut Rng,
    what: &str,
    mut on_start: impl FnMut(&md::Started<dyn Member>),
) -> usize {
    let mut crashes = 0;
    loop {
        let budget = Arc::new(AtomicI64::new(1 + (rng.next() % 24) as i64));
        let hanging: Vec<Arc<dyn Member>> = members
            .iter()
            .map(|m| Arc::new(Hanging { inner: m.clone(), budget: budget.clone() }) as Arc<dyn Member>)
            .collect();
        let assembly = super::assemble(&hanging);
        let Some(started) = run_or_crash(md::start(&assembly, &hanging, StartOptions::default())) else {
            crashes += 1;
            continue;
        };
        let started = started.expect("start");
        on_start(&started);
        // A crash while its end was being recorded: it is over.
        let mut done = started.array.shape().reshape().is_none();
        while !done {
            match run_or_crash(started.array.maintenance().step(16 << 20)) {
                None => {
                    crashes += 1;
                    break;
                }
                Some(Ok(Step::Finished(MaintenanceWork::Reshape))) => done = true,
                Some(Ok(Step::Worked { work: MaintenanceWork::Reshape, .. })) => {}
                Some(Ok(other)) => panic!("{what}: unexpected step {other:?} while reshaping"),
                Some(Err(e)) => panic!("{what}: reshape step failed: {e}"),
            }
        }
        if done {
            return crashes;
        }
    }
}
