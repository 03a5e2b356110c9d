//! `RangeLocks`: the byte ranges of the array that some operation is writing to the members
//! right now (a write-back run, or a write/trim/zeroes that goes straight to the array).
//!
//! Held ranges never overlap, so two member writes of the same bytes are never in flight
//! at once and their order on the members is the order they were started in: an older
//! cached copy can never land after a newer one. Kept inside the cache's state mutex; the
//! async waiting lives in the cache ([`super::WriteCache`]).

use std::collections::BTreeMap;

#[derive(Debug, Default)]
pub(crate) struct RangeLocks {
    /// start -> end (exclusive), non-overlapping, non-empty.
    held: BTreeMap<u64, u64>,
}

impl RangeLocks {
    /// Whether `[start, end)` overlaps a held range.
    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        // Held ranges are disjoint, so the last one starting before `end` is the only candidate.
        self.held.range(..end).next_back().is_some_and(|(_, &held_end)| held_end > start)
    }

    pub fn insert(&mut self, start: u64, end: u64) {
        assert!(start < end, "empty range lock");
        assert!(!self.overlaps(start, end), "range lock {start}..{end} overlaps a held one");
        self.held.insert(start, end);
    }

    pub fn remove(&mut self, start: u64) {
        let removed = self.held.remove(&start);
        debug_assert!(removed.is_some(), "range lock at {start} was not held");
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_queries() {
        let mut locks = RangeLocks::default();
        locks.insert(100, 200);
        locks.insert(300, 400);
        assert!(!locks.overlaps(0, 100));
        assert!(locks.overlaps(0, 101));
        assert!(locks.overlaps(199, 300));
        assert!(!locks.overlaps(200, 300));
        assert!(locks.overlaps(150, 160));
        assert!(locks.overlaps(0, 1000));
        assert!(!locks.overlaps(400, 500));
        locks.remove(100);
        assert!(!locks.overlaps(0, 300));
        locks.remove(300);
        assert!(locks.is_empty());
    }
}
