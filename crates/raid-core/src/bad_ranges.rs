//! `BadRanges`: a set of sector ranges, kept sorted, disjoint and merged.
//!
//! The engine holds one per role (member sectors from the data offset that the member
//! cannot be trusted to hold: md's bad blocks) and md's bad-block log encodes one per
//! device. Pure; every operation is linear in the number of ranges.

/// Sorted, disjoint, non-adjacent `(start, len)` ranges of sectors; no range is empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BadRanges {
    ranges: Vec<(u64, u64)>,
}

impl BadRanges {
    /// The set of `ranges` (any order, overlaps merged, empty ones dropped).
    pub fn from_ranges(ranges: impl IntoIterator<Item = (u64, u64)>) -> Self {
        let mut set = BadRanges::default();
        for (start, len) in ranges {
            set.add(start, len);
        }
        set
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges
    }

    /// Total sectors in the set.
    pub fn sectors(&self) -> u64 {
        self.ranges.iter().map(|r| r.1).sum()
    }

    /// Whether any sector of `[start, start + len)` is in the set.
    pub fn overlaps(&self, start: u64, len: u64) -> bool {
        let end = start.saturating_add(len);
        self.ranges.iter().any(|&(s, l)| s < end && start < s + l)
    }

    /// Whether every sector of `[start, start + len)` is in the set.
    pub fn covers(&self, start: u64, len: u64) -> bool {
        let end = start.saturating_add(len);
        len == 0 || self.ranges.iter().any(|&(s, l)| s <= start && end <= s + l)
    }

    /// Range boundaries strictly inside `(start, end)`, ascending: between two of them
    /// (or an end) every sector is either in the set or not.
    pub fn cuts(&self, start: u64, end: u64) -> impl Iterator<Item = u64> + '_ {
        self.ranges.iter().flat_map(|&(s, l)| [s, s + l]).filter(move |&b| start < b && b < end)
    }

    /// Adds `[start, start + len)`; returns whether the set changed.
    pub fn add(&mut self, start: u64, len: u64) -> bool {
        if len == 0 || self.covers(start, len) {
            return false;
        }
        let (mut lo, mut hi) = (start, start.saturating_add(len));
        // Ranges that overlap or touch the new one merge into it.
        self.ranges.retain(|&(s, l)| {
            let touches = s <= hi && lo <= s + l;
            if touches {
                lo = lo.min(s);
                hi = hi.max(s + l);
            }
            !touches
        });
        let at = self.ranges.partition_point(|&(s, _)| s < lo);
        self.ranges.insert(at, (lo, hi - lo));
        self.check();
        true
    }

    /// Removes `[start, start + len)`; returns whether the set changed.
    pub fn remove(&mut self, start: u64, len: u64) -> bool {
        if !self.overlaps(start, len) {
            return false;
        }
        let end = start.saturating_add(len);
        let mut out = Vec::with_capacity(self.ranges.len() + 1);
        for &(s, l) in &self.ranges {
            let e = s + l;
            if e <= start || end <= s {
                out.push((s, l));
                continue;
            }
            if s < start {
                out.push((s, start - s));
            }
            if end < e {
                out.push((end, e - end));
            }
        }
        self.ranges = out;
        self.check();
        true
    }

    fn check(&self) {
        debug_assert!(
            self.ranges.iter().all(|r| r.1 > 0) && self.ranges.windows(2).all(|w| w[0].0 + w[0].1 < w[1].0),
            "bad ranges sorted, disjoint and merged: {:?}",
            self.ranges
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_merge_and_removes_split() {
        let mut b = BadRanges::default();
        assert!(b.add(10, 5));
        assert!(b.add(20, 5));
        assert!(!b.add(11, 2), "already covered");
        assert!(b.add(15, 5), "fills the gap: touching ranges merge");
        assert_eq!(b.ranges(), &[(10, 15)]);
        assert!(b.remove(12, 3));
        assert_eq!(b.ranges(), &[(10, 2), (15, 10)]);
        assert!(!b.remove(12, 3));
        assert!(b.overlaps(11, 1) && !b.overlaps(12, 3) && b.overlaps(0, 100));
        assert!(b.covers(15, 10) && !b.covers(14, 2) && b.covers(3, 0));
        assert_eq!(b.cuts(0, 100).collect::<Vec<_>>(), vec![10, 12, 15, 25]);
        assert_eq!(b.cuts(12, 25).collect::<Vec<_>>(), vec![15]);
        assert_eq!(b.sectors(), 12);
        assert!(b.remove(0, 100));
        assert!(b.is_empty());
        assert_eq!(BadRanges::from_ranges([(8, 8), (0, 8), (30, 0)]).ranges(), &[(0, 16)]);
    }
}
