//! Bytes of written data copied in memory between receiving a write and handing it to the
//! members: gathering sequential writes, building stripe and parity jobs, joining runs,
//! filling a page or a sector around a partial write, a member leg written from a borrowed
//! slice that the backend must own (a copy per mirror leg), an NBD member's request pieces.
//! Each written byte is also received once into a buffer; this counts the copies after that,
//! so copies per byte written = 1 + copied / written (the target of the one-copy write path
//! is 0 here).
//!
//! One counter per process (one server, any number of arrays), read by the metrics
//! (`raidnbd_data_copied_bytes`, which adds the NBD server's copies out of its read buffers)
//! and `raidnbd bench`; counting is one relaxed atomic add per copy, the copies themselves
//! cost far more.

use std::sync::atomic::{AtomicU64, Ordering};

static COPIED_BYTES: AtomicU64 = AtomicU64::new(0);

/// Counts a copy of `bytes` bytes of written data.
pub fn copied(bytes: usize) {
    COPIED_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// Bytes of written data copied so far in this process.
pub fn copied_bytes() -> u64 {
    COPIED_BYTES.load(Ordering::Relaxed)
}
