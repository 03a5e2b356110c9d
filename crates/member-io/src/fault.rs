//! `Faulty<M>`: fault injection for tests of degraded mode and rebuild, switchable at run
//! time through an `Arc<FaultControl>` the test keeps.
//!
//! ```text
//!  test ── Arc<FaultControl> ── fail_after / fail_range / fail_randomly / set_delay / disarm
//!                 │ (shared)
//!  engine ──► Faulty<M> ── delay ─► rule says fail? ── yes ─► Err(EIO), inner untouched
//!                                                  └─ no ──► inner op
//! ```
//!
//! Operation classes: reads are `read_at`; writes are `write_at`, `discard`, `write_zeroes`
//! and `flush` (a dying disk fails its flushes too). Range rules apply to ops that overlap
//! the range; `flush` has no range and is only hit by count and probability rules.
//! Injected errors are `io::Error::from_raw_os_error(EIO)`, like a real medium error.
//! Probability rules use a seeded `StdRng`, so a failing run can be replayed exactly.

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use raid_core::member::{BufResult, IoFuture};
use raid_core::{AlignedBuf, Member};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Which operations a fault rule applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultOps {
    Reads,
    /// `write_at`, `discard`, `write_zeroes`, `flush`.
    Writes,
    All,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpClass {
    Read,
    Write,
}

impl FaultOps {
    fn matches(self, class: OpClass) -> bool {
        matches!(
            (self, class),
            (FaultOps::All, _) | (FaultOps::Reads, OpClass::Read) | (FaultOps::Writes, OpClass::Write)
        )
    }
}

#[derive(Debug, Default)]
struct Rules {
    /// Matching ops that still succeed before every later matching op fails.
    fail_after: Option<(FaultOps, u64)>,
    ranges: Vec<(FaultOps, Range<u64>)>,
    random: Option<(FaultOps, f64, StdRng)>,
    delay: Duration,
}

/// The runtime switchboard of one or more [`Faulty`] members.
#[derive(Debug, Default)]
pub struct FaultControl {
    rules: Mutex<Rules>,
    ops_seen: AtomicU64,
    injected_failures: AtomicU64,
}

impl FaultControl {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The next `successes` matching ops succeed; every matching op after that fails
    /// (`fail_after(ops, 0)` = fail from now on: a dead disk).
    pub fn fail_after(&self, ops: FaultOps, successes: u64) {
        self.rules().fail_after = Some((ops, successes));
    }

    /// Matching ops overlapping `range_bytes` (member offsets) fail. Rules accumulate.
    pub fn fail_range(&self, ops: FaultOps, range_bytes: Range<u64>) {
        self.rules().ranges.push((ops, range_bytes));
    }

    /// Each matching op fails with `probability` (0.0..=1.0), drawn from a RNG seeded with `seed`.
    pub fn fail_randomly(&self, ops: FaultOps, probability: f64, seed: u64) {
        let probability = if probability.is_nan() { 0.0 } else { probability.clamp(0.0, 1.0) };
        self.rules().random = Some((ops, probability, StdRng::seed_from_u64(seed)));
    }

    /// Delays every operation by `delay` (a slow member); `Duration::ZERO` turns it off.
    pub fn set_delay(&self, delay: Duration) {
        self.rules().delay = delay;
    }

    /// Clears every rule and the delay: the member behaves like its inner member again.
    pub fn disarm(&self) {
        *self.rules() = Rules::default();
    }

    /// Whether any failure rule or delay is set.
    pub fn is_armed(&self) -> bool {
        let r = self.rules();
        r.fail_after.is_some() || !r.ranges.is_empty() || r.random.is_some() || !r.delay.is_zero()
    }

    /// Operations seen by the members using this control (failed or not).
    pub fn ops_seen(&self) -> u64 {
        self.ops_seen.load(Ordering::Relaxed)
    }

    /// Operations failed on purpose so far.
    pub fn injected_failures(&self) -> u64 {
        self.injected_failures.load(Ordering::Relaxed)
    }

    fn rules(&self) -> std::sync::MutexGuard<'_, Rules> {
        self.rules.lock().expect("fault rules lock")
    }

    /// Decides the fate of one op: (delay, fail?).
    fn decide(&self, class: OpClass, range: Option<Range<u64>>) -> (Duration, bool) {
        self.ops_seen.fetch_add(1, Ordering::Relaxed);
        let mut r = self.rules();
        let mut fail = false;
        if let Some((ops, remaining)) = r.fail_after.as_mut()
            && ops.matches(class)
        {
            if *remaining == 0 {
                fail = true;
            } else {
                *remaining -= 1;
            }
        }
        if let Some(io) = &range {
            fail |= r.ranges.iter().any(|(ops, bad)| ops.matches(class) && io.start < bad.end && bad.start < io.end);
        }
        if let Some((ops, probability, rng)) = r.random.as_mut()
            && ops.matches(class)
        {
            // Draw even when already failing so the sequence depends only on the op count.
            fail |= rng.random::<f64>() < *probability;
        }
        if fail {
            self.injected_failures.fetch_add(1, Ordering::Relaxed);
        }
        (r.delay, fail)
    }

    async fn gate(&self, class: OpClass, range: Option<Range<u64>>) -> io::Result<()> {
        let (delay, fail) = self.decide(class, range);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if fail { Err(io::Error::from_raw_os_error(libc::EIO)) } else { Ok(()) }
    }
}

/// A member whose operations can be made to fail or slow down at run time.
pub struct Faulty<M> {
    inner: M,
    control: Arc<FaultControl>,
}

impl<M: Member> Faulty<M> {
    /// Wraps `inner`, governed by `control` (which may be shared by several members).
    pub fn new(inner: M, control: Arc<FaultControl>) -> Self {
        Self { inner, control }
    }

    pub fn control(&self) -> &Arc<FaultControl> {
        &self.control
    }

    pub fn inner(&self) -> &M {
        &self.inner
    }
}

fn io_range(offset_bytes: u64, len_bytes: u64) -> Option<Range<u64>> {
    Some(offset_bytes..offset_bytes.saturating_add(len_bytes))
}

impl<M: Member> Member for Faulty<M> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn len_bytes(&self) -> u64 {
        self.inner.len_bytes()
    }
    fn alignment(&self) -> usize {
        self.inner.alignment()
    }
    fn read_at(&self, offset_bytes: u64, buf: AlignedBuf) -> IoFuture<'_, BufResult> {
        Box::pin(async move {
            if let Err(e) = self.control.gate(OpClass::Read, io_range(offset_bytes, buf.len() as u64)).await {
                return (Err(e), buf);
            }
            self.inner.read_at(offset_bytes, buf).await
        })
    }
    fn write_at(&self, offset_bytes: u64, buf: AlignedBuf, fua: bool) -> IoFuture<'_, BufResult> {
        Box::pin(async move {
            if let Err(e) = self.control.gate(OpClass::Write, io_range(offset_bytes, buf.len() as u64)).await {
                return (Err(e), buf);
            }
            self.inner.write_at(offset_bytes, buf, fua).await
        })
    }
    fn flush(&self) -> IoFuture<'_, io::Result<()>> {
        Box::pin(async move {
            self.control.gate(OpClass::Write, None).await?;
            self.inner.flush().await
        })
    }
    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        Box::pin(async move {
            self.control.gate(OpClass::Write, io_range(offset_bytes, len_bytes)).await?;
            self.inner.discard(offset_bytes, len_bytes).await
        })
    }
    fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        Box::pin(async move {
            self.control.gate(OpClass::Write, io_range(offset_bytes, len_bytes)).await?;
            self.inner.write_zeroes(offset_bytes, len_bytes).await
        })
    }
}
