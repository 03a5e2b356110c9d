//! `Faulty<M>`: fault injection for tests of degraded mode and rebuild, switchable at run
//! time through an `Arc<FaultControl>` the test keeps. A [`FaultGate`] is a member
//! decoration (raid-core's `decorator`): it decides, per operation, to delay and/or fail it.
//!
//! ```text
//!  test ── Arc<FaultControl> ── fail_after / fail_range / fail_randomly / set_delay /
//!                 │                corrupt_range / disarm
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
//! Corruption rules fail nothing: reads in the range return, and writes store, bytes with
//! one inverted per 4 KiB (`corrupt_range`), so the array meets a member that is wrong
//! without saying so.

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use raid_core::AlignedBuf;
use raid_core::decorator::{Decorated, Decoration, Gate, MemberOp, OpKind};
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
    /// Ops whose bytes are changed in these ranges (no error): reads return flipped bytes,
    /// writes store them.
    corrupt: Vec<(FaultOps, Range<u64>)>,
}

/// Every this many bytes of a corrupted range, one byte is flipped.
const CORRUPT_STRIDE_BYTES: u64 = 4096;

/// The runtime switchboard of one or more [`Faulty`] members.
#[derive(Debug, Default)]
pub struct FaultControl {
    rules: Mutex<Rules>,
    ops_seen: AtomicU64,
    injected_failures: AtomicU64,
    corrupted_bytes: AtomicU64,
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

    /// Matching ops overlapping `range_bytes` succeed with wrong bytes: reads return, or
    /// writes store, the byte at the start of every 4 KiB block (`CORRUPT_STRIDE_BYTES`) of the
    /// overlap inverted (a member that lies without an error: bit rot, a buggy or hostile
    /// member server). Rules accumulate; `disarm` clears them.
    pub fn corrupt_range(&self, ops: FaultOps, range_bytes: Range<u64>) {
        self.rules().corrupt.push((ops, range_bytes));
    }

    /// Bytes changed on purpose so far.
    pub fn corrupted_bytes(&self) -> u64 {
        self.corrupted_bytes.load(Ordering::Relaxed)
    }

    /// Inverts the bytes `data` (at member offset `offset`) holds in the corrupt ranges for
    /// `class`; whether any was.
    fn corrupt(&self, class: OpClass, offset: u64, data: &mut [u8]) -> bool {
        let end = offset + data.len() as u64;
        let r = self.rules();
        let mut changed = 0;
        for (_, bad) in r.corrupt.iter().filter(|(ops, bad)| ops.matches(class) && offset < bad.end && bad.start < end)
        {
            let mut at = bad.start.max(offset).next_multiple_of(CORRUPT_STRIDE_BYTES);
            while at < bad.end.min(end) {
                data[(at - offset) as usize] ^= 0xff;
                changed += 1;
                at += CORRUPT_STRIDE_BYTES;
            }
        }
        self.corrupted_bytes.fetch_add(changed, Ordering::Relaxed);
        changed > 0
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
        r.fail_after.is_some()
            || !r.ranges.is_empty()
            || r.random.is_some()
            || !r.delay.is_zero()
            || !r.corrupt.is_empty()
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
}

/// The decoration that applies a [`FaultControl`]'s rules to one member.
pub struct FaultGate {
    control: Arc<FaultControl>,
}

impl FaultGate {
    pub fn control(&self) -> &Arc<FaultControl> {
        &self.control
    }
}

impl From<Arc<FaultControl>> for FaultGate {
    fn from(control: Arc<FaultControl>) -> Self {
        Self { control }
    }
}

/// A member whose operations can be made to fail or slow down at run time:
/// `Faulty::new(inner, control)`.
pub type Faulty<M> = Decorated<M, FaultGate>;

impl Decoration for FaultGate {
    fn alters_data(&self) -> bool {
        true
    }

    fn after_read(&self, op: MemberOp, data: &mut [u8]) {
        self.control.corrupt(OpClass::Read, op.offset_bytes, data);
    }

    fn stored_instead(&self, op: MemberOp, data: &[u8]) -> Option<AlignedBuf> {
        if !self.control.rules().corrupt.iter().any(|(ops, _)| ops.matches(OpClass::Write)) {
            return None;
        }
        let mut copy = AlignedBuf::from_slice(data);
        self.control.corrupt(OpClass::Write, op.offset_bytes, copy.as_mut_slice()).then_some(copy)
    }

    fn gate(&self, op: MemberOp) -> Gate<'_> {
        let (class, range) = match op.kind {
            OpKind::Read => (OpClass::Read, Some(op.offset_bytes..op.offset_bytes.saturating_add(op.len_bytes))),
            OpKind::Flush => (OpClass::Write, None),
            _ => (OpClass::Write, Some(op.offset_bytes..op.offset_bytes.saturating_add(op.len_bytes))),
        };
        let (delay, fail) = self.control.decide(class, range);
        let eio = || io::Error::from_raw_os_error(libc::EIO);
        match (delay.is_zero(), fail) {
            (true, false) => Gate::Pass,
            (true, true) => Gate::Fail(eio()),
            (false, _) => Gate::Wait(Box::pin(async move {
                tokio::time::sleep(delay).await;
                if fail { Err(eio()) } else { Ok(()) }
            })),
        }
    }
}
