//! Memory accounting of the write-back cache, and its one wake-up signal.
//!
//! Every cached write owns a [`Chunk`]: the bytes plus a [`Charge`] of `len + CHUNK_OVERHEAD_BYTES`
//! against the [`Budget`]. The charge is released when the last reference to the chunk goes,
//! which may be later than its removal from the index (a write-back or a read still holds
//! it), so `used_bytes` is what the cache really keeps alive, and a reservation that would
//! exceed the capacity is refused: the writer must make room first.
//!
//! [`Budget::changed`] is notified on every event a waiter may care about (space freed,
//! range unlocked, new dirty data); waiters re-check their condition under the state lock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use event_listener::Event;

/// Bytes charged per cached write on top of its data: the index entries that can point into
/// it (up to two after one split), the chunk and `Arc` headers.
pub const CHUNK_OVERHEAD_BYTES: u64 = 256;

pub(crate) struct Budget {
    capacity_bytes: u64,
    used_bytes: AtomicU64,
    /// Space freed, a range unlocked, or new dirty data.
    pub changed: Event,
}

impl Budget {
    pub fn new(capacity_bytes: u64) -> Self {
        Self { capacity_bytes, used_bytes: AtomicU64::new(0), changed: Event::new() }
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    pub fn used_bytes(&self) -> u64 {
        self.used_bytes.load(Ordering::Acquire)
    }

    /// Reserves `bytes` if they fit under the capacity.
    pub fn try_charge(self: &Arc<Self>, bytes: u64) -> Option<Charge> {
        self.used_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&total| total <= self.capacity_bytes)
            })
            .ok()
            .map(|_| Charge { budget: self.clone(), bytes })
    }

    /// Wakes every waiter (they re-check their condition).
    pub fn notify(&self) {
        self.changed.notify(usize::MAX);
    }
}

/// A reservation, released on drop.
pub(crate) struct Charge {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        let before = self.budget.used_bytes.fetch_sub(self.bytes, Ordering::AcqRel);
        debug_assert!(before >= self.bytes, "budget released more than it charged");
        self.budget.notify();
    }
}

/// The bytes of one cached write; immutable, shared by the index entries and write-backs
/// that refer to parts of it.
pub(crate) struct Chunk {
    bytes: Box<[u8]>,
    _charge: Charge,
}

impl Chunk {
    pub fn new(data: &[u8], charge: Charge) -> Self {
        debug_assert!(charge.bytes >= data.len() as u64);
        crate::copy_count::copied(data.len());
        Self { bytes: data.into(), _charge: charge }
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_are_bounded_and_released_on_drop() {
        let budget = Arc::new(Budget::new(1000));
        let a = budget.try_charge(600).expect("fits");
        assert!(budget.try_charge(401).is_none());
        let b = budget.try_charge(400).expect("fits exactly");
        assert_eq!(budget.used_bytes(), 1000);
        drop(a);
        assert_eq!(budget.used_bytes(), 400);
        let chunk = Chunk::new(&[7; 100], budget.try_charge(356).expect("fits"));
        assert_eq!(chunk.bytes(), &[7; 100]);
        drop(b);
        drop(chunk);
        assert_eq!(budget.used_bytes(), 0);
        assert!(budget.try_charge(u64::MAX).is_none(), "no overflow");
    }
}
