//! `OpStats`: what happened to one kind of operation (an NBD command on an export, or an
//! I/O kind on a member): completions, errors, bytes moved, and latency.
//!
//! Recording is a handful of relaxed atomic adds and never allocates or locks; a scrape
//! reads the atomics. Operations are counted when they complete, as latency observations
//! (the completion count is the histogram's count); a future dropped before completion is
//! not counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::latency::LatencyHistogram;

/// Aligned to a cache line so that two kinds of operation recorded by different threads
/// do not share one.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct OpStats {
    pub errors: AtomicU64,
    /// Bytes of the operations that succeeded (payload or range length).
    pub bytes: AtomicU64,
    pub latency: LatencyHistogram,
}

impl OpStats {
    /// Records one completed operation that started at `started`.
    pub fn record(&self, started: Instant, ok: bool, bytes: u64) {
        self.latency.observe(started.elapsed());
        if !ok {
            self.errors.fetch_add(1, Ordering::Relaxed);
        } else if bytes > 0 {
            self.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    pub fn completed(&self) -> u64 {
        self.latency.count()
    }

    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_count_but_move_no_bytes() {
        let s = OpStats::default();
        s.record(Instant::now(), true, 4096);
        s.record(Instant::now(), false, 4096);
        s.record(Instant::now(), true, 0);
        assert_eq!((s.completed(), s.errors(), s.bytes()), (3, 1, 4096));
        assert_eq!(s.latency.snapshot().count, 3);
    }
}
