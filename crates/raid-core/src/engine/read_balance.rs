//! Which copies of a mirrored piece a read may use: md's write-mostly, and measured latency.
//!
//! A write-mostly copy (md's `WriteMostly1` devflag: a slow or distant mirror) is written
//! like any other but read only when no other copy is readable. Copies are also compared by
//! the latency their reads have shown (an exponentially weighted mean): one more than
//! [`SLOW_FACTOR`] times (and [`SLOW_MARGIN_NS`]) slower than the fastest readable copy is
//! left out, so a RAID1 of a
//! local disk and a remote one reads at local speed without anyone saying which is which.
//! A copy left out for being slow still gets one read in [`PROBE_EVERY`], so its mean keeps
//! following what the link does now.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use super::Array;
use crate::geometry::Extent;
use crate::member::Member;

/// A copy this many times slower than the fastest, and by at least `SLOW_MARGIN_NS`, is not
/// read (but for probes). The margin keeps microsecond noise from mattering.
const SLOW_FACTOR: u64 = 4;
const SLOW_MARGIN_NS: u64 = 250_000;
/// A copy left out for slowness is read once per this many pieces it was passed over for.
const PROBE_EVERY: u64 = 128;
/// Weight of a new latency sample: 1/8 when slower than the mean, 1/2 when faster (a copy
/// that got fast again is back after a few probes; one slow read does not exclude a copy).
const EWMA_SHIFT_SLOWER: u32 = 3;
const EWMA_SHIFT_FASTER: u32 = 1;
/// A sample counts as at most this many times the mean: one stalled read (a descheduled
/// thread, a retransmit) moves the mean by at most 3/8 of itself, so it cannot exclude a
/// copy for hundreds of reads; a copy that stays slow still reaches its level in a few
/// dozen reads.
const SAMPLE_CAP_FACTOR: u64 = 4;

/// Per role: the write-mostly flag and the measured read latency.
#[derive(Default)]
pub(crate) struct ReadBalance {
    pub write_mostly: AtomicBool,
    /// Mean read latency in ns; 0 = not measured yet.
    latency_ns: AtomicU64,
    passed_over: AtomicU64,
}

impl ReadBalance {
    /// Records the latency of one read.
    pub fn record(&self, elapsed: Duration) {
        let sample = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX).max(1);
        // Races between readers lose a sample at worst.
        let old = self.latency_ns.load(Ordering::Relaxed);
        let new = if old == 0 {
            sample
        } else {
            let sample = sample.min(old.saturating_mul(SAMPLE_CAP_FACTOR));
            let shift = if sample < old { EWMA_SHIFT_FASTER } else { EWMA_SHIFT_SLOWER };
            old - (old >> shift) + (sample >> shift)
        };
        self.latency_ns.store(new.max(1), Ordering::Relaxed);
    }

    pub fn latency_ns(&self) -> u64 {
        self.latency_ns.load(Ordering::Relaxed)
    }

    /// Whether a copy passed over for slowness gets this read as a probe.
    fn probe(&self) -> bool {
        if self.passed_over.fetch_add(1, Ordering::Relaxed) + 1 >= PROBE_EVERY {
            self.passed_over.store(0, Ordering::Relaxed);
            return true;
        }
        false
    }
}

impl<M: Member + ?Sized> Array<M> {
    /// Narrows the readable copies of a piece to those a read should use: not write-mostly
    /// (unless all are), and not much slower than the fastest (unless probing).
    pub(super) fn read_candidates<'a>(&self, readable: Vec<&'a Extent>) -> Vec<&'a Extent> {
        let balance = |c: &Extent| &self.members.slots()[c.role].read_balance;
        let preferred: Vec<&Extent> =
            readable.iter().copied().filter(|c| !balance(c).write_mostly.load(Ordering::Relaxed)).collect();
        let copies = if preferred.is_empty() { readable } else { preferred };
        let Some(fastest) = copies.iter().map(|c| balance(c).latency_ns()).filter(|&l| l > 0).min() else {
            return copies;
        };
        let limit = fastest.saturating_mul(SLOW_FACTOR).max(fastest + SLOW_MARGIN_NS);
        let fast: Vec<&Extent> = copies
            .iter()
            .copied()
            .filter(|c| {
                let b = balance(c);
                b.latency_ns() <= limit || b.probe()
            })
            .collect();
        debug_assert!(!fast.is_empty(), "the fastest copy always qualifies");
        fast
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_stalled_read_does_not_make_a_copy_slow_but_a_slow_link_does() {
        let b = ReadBalance::default();
        for _ in 0..16 {
            b.record(Duration::from_micros(20));
        }
        b.record(Duration::from_millis(20));
        assert!(b.latency_ns() < 20_000 + SLOW_MARGIN_NS, "one spike: {} ns", b.latency_ns());
        for _ in 0..40 {
            b.record(Duration::from_millis(3));
        }
        assert!(b.latency_ns() > 2_000_000, "a slow link: {} ns", b.latency_ns());
    }
}
