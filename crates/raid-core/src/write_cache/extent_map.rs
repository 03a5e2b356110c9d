//! `ExtentMap`: the index of dirty cached data.
//!
//! ```text
//!   by_offset: BTreeMap<offset, Extent>     non-overlapping, byte-exact (512-aligned in practice)
//!   by_age:    BTreeSet<(generation, offset)>  oldest first, for write-back order and FLUSH
//!   Extent { len, generation, chunk: Arc<Chunk>, chunk_offset }   a window into one write's bytes
//! ```
//!
//! Why this shape: an NBD write lands as one extent without copying again; a later write
//! that overlaps it *carves* the old extent (the surviving head/tail become windows into
//! the same chunk, no copy, no allocation of data); lookups for reads and write-back are
//! O(log n + overlapping). Adjacent extents are not merged in the index: write-back gathers
//! runs of adjacent extents into one array write instead, so merging never copies under
//! the lock.
//!
//! The generation identifies the write that produced the bytes (every piece of a carved
//! extent keeps it). Removing "the part of `[a, b)` that still has generation g" is how a
//! finished write-back marks exactly the data it wrote clean, and nothing newer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::budget::Chunk;

/// A window `[chunk_offset, chunk_offset + len_bytes)` into the bytes of one cached write.
#[derive(Clone)]
pub(crate) struct Extent {
    pub len_bytes: u64,
    pub generation: u64,
    pub chunk: Arc<Chunk>,
    pub chunk_offset: usize,
}

impl Extent {
    pub fn bytes(&self) -> &[u8] {
        &self.chunk.bytes()[self.chunk_offset..self.chunk_offset + self.len_bytes as usize]
    }

    /// The sub-window of `len_bytes` starting `skip_bytes` into this one.
    pub fn slice(&self, skip_bytes: u64, len_bytes: u64) -> Extent {
        debug_assert!(len_bytes > 0 && skip_bytes + len_bytes <= self.len_bytes);
        Extent {
            len_bytes,
            generation: self.generation,
            chunk: self.chunk.clone(),
            chunk_offset: self.chunk_offset + skip_bytes as usize,
        }
    }
}

#[derive(Default)]
pub(crate) struct ExtentMap {
    by_offset: BTreeMap<u64, Extent>,
    by_age: BTreeSet<(u64, u64)>,
    dirty_bytes: u64,
}

impl ExtentMap {
    /// Bytes of dirty data in the index.
    pub fn dirty_bytes(&self) -> u64 {
        self.dirty_bytes
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_offset.len()
    }

    /// Inserts `extent` at `offset`, replacing whatever it overlaps.
    pub fn insert(&mut self, offset: u64, extent: Extent) {
        drop(self.carve(offset, offset + extent.len_bytes));
        self.put(offset, extent);
    }

    /// Removes the parts of `[start, end)` whose generation satisfies `remove`; the others stay.
    /// Extents that are kept are not split.
    pub fn remove_where(&mut self, start: u64, end: u64, remove: impl Fn(u64) -> bool) {
        let doomed: Vec<(u64, u64)> = self
            .overlapping(start, end)
            .filter(|(_, e)| remove(e.generation))
            .map(|(o, e)| (o.max(start), (o + e.len_bytes).min(end)))
            .collect();
        for (from, to) in doomed {
            drop(self.carve(from, to));
        }
    }

    /// The extents overlapping `[start, end)`, in offset order, not clipped.
    pub fn overlapping(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, &Extent)> {
        let straddling = self.by_offset.range(..start).next_back().filter(|(o, e)| **o + e.len_bytes > start);
        straddling.into_iter().chain(self.by_offset.range(start..end)).map(|(o, e)| (*o, e))
    }

    pub fn get(&self, offset: u64) -> Option<&Extent> {
        self.by_offset.get(&offset)
    }

    /// The extent that ends exactly at `offset`.
    pub fn ending_at(&self, offset: u64) -> Option<(u64, &Extent)> {
        self.by_offset.range(..offset).next_back().filter(|(o, e)| **o + e.len_bytes == offset).map(|(o, e)| (*o, e))
    }

    /// `(generation, offset)` of every extent older than `before_generation`, oldest first.
    pub fn oldest(&self, before_generation: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.by_age.range(..(before_generation, 0)).copied()
    }

    /// Removes everything inside `[start, end)`, splitting extents that straddle its edges
    /// (their outer parts stay); returns the removed pieces, clipped, in offset order.
    fn carve(&mut self, start: u64, end: u64) -> Vec<(u64, Extent)> {
        let mut removed = Vec::new();
        if start >= end {
            return removed;
        }
        let straddling = self.by_offset.range(..start).next_back().map(|(o, e)| (*o, o + e.len_bytes));
        if let Some((offset, extent_end)) = straddling
            && extent_end > start
        {
            let extent = self.take(offset);
            self.put(offset, extent.slice(0, start - offset));
            if extent_end > end {
                self.put(end, extent.slice(end - offset, extent_end - end));
                removed.push((start, extent.slice(start - offset, end - start)));
                return removed;
            }
            removed.push((start, extent.slice(start - offset, extent_end - start)));
        }
        let inside: Vec<u64> = self.by_offset.range(start..end).map(|(o, _)| *o).collect();
        for offset in inside {
            let extent = self.take(offset);
            let extent_end = offset + extent.len_bytes;
            if extent_end > end {
                self.put(end, extent.slice(end - offset, extent_end - end));
                removed.push((offset, extent.slice(0, end - offset)));
            } else {
                removed.push((offset, extent));
            }
        }
        removed
    }

    fn put(&mut self, offset: u64, extent: Extent) {
        debug_assert!(extent.len_bytes > 0);
        debug_assert!(self.overlapping(offset, offset + extent.len_bytes).next().is_none(), "extents overlap");
        self.dirty_bytes += extent.len_bytes;
        self.by_age.insert((extent.generation, offset));
        self.by_offset.insert(offset, extent);
    }

    fn take(&mut self, offset: u64) -> Extent {
        let extent = self.by_offset.remove(&offset).expect("extent present");
        let aged = self.by_age.remove(&(extent.generation, offset));
        debug_assert!(aged, "age index out of step");
        self.dirty_bytes -= extent.len_bytes;
        extent
    }

    /// Checks the invariants (tests).
    #[cfg(test)]
    pub fn check(&self) {
        let mut end = 0;
        let mut total = 0;
        for (&offset, e) in &self.by_offset {
            assert!(offset >= end, "extents overlap at {offset}");
            assert!(e.len_bytes > 0);
            assert!(self.by_age.contains(&(e.generation, offset)));
            end = offset + e.len_bytes;
            total += e.len_bytes;
        }
        assert_eq!(self.by_age.len(), self.by_offset.len());
        assert_eq!(total, self.dirty_bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::super::budget::Budget;
    use super::*;

    fn extent(budget: &Arc<Budget>, fill: u8, len: u64, generation: u64) -> Extent {
        let chunk = Chunk::new(&vec![fill; len as usize], budget.try_charge(len).expect("budget"));
        Extent { len_bytes: len, generation, chunk: Arc::new(chunk), chunk_offset: 0 }
    }

    /// Flat view of `[0, size)`: 0 where nothing is cached.
    fn flat(map: &ExtentMap, size: u64) -> Vec<u8> {
        let mut out = vec![0u8; size as usize];
        for (o, e) in map.overlapping(0, size) {
            out[o as usize..(o + e.len_bytes) as usize].copy_from_slice(e.bytes());
        }
        out
    }

    #[test]
    fn overlapping_writes_carve_older_ones() {
        let budget = Arc::new(Budget::new(1 << 20));
        let mut map = ExtentMap::default();
        map.insert(0, extent(&budget, 1, 4096, 1));
        map.insert(1024, extent(&budget, 2, 1024, 2)); // inside: splits into head and tail
        map.insert(3584, extent(&budget, 3, 1024, 3)); // straddles the end
        map.check();
        let mut want = vec![1u8; 4096];
        want[1024..2048].fill(2);
        want[3584..].fill(3);
        want.resize(4608, 3);
        assert_eq!(flat(&map, 4608), want);
        assert_eq!(map.dirty_bytes(), 4608);
        assert_eq!(map.oldest(u64::MAX).map(|a| a.0).collect::<Vec<_>>(), vec![1, 1, 2, 3]);
        // Only generation-1 bytes of [0, 4096) removed: the newer writes stay.
        map.remove_where(0, 4096, |g| g == 1);
        map.check();
        assert_eq!(map.dirty_bytes(), 2048);
        assert_eq!(map.ending_at(2048).map(|(o, _)| o), Some(1024));
        assert!(map.get(3584).is_some());
        // A window straddling both ends of one extent.
        map.remove_where(1536, 1792, |_| true);
        map.check();
        assert_eq!(map.len(), 3);
        assert_eq!(map.dirty_bytes(), 1792);
        drop(map);
        assert_eq!(budget.used_bytes(), 0, "carving frees chunks once nothing refers to them");
    }
}
