//! What is known of how a range's bytes are stored: NBD's `base:allocation` states (a hole,
//! bytes that read as zero) for members and for the volumes made of them.
//!
//! Truthfulness is one-sided, as in the NBD spec: `hole` and `zero` are claims a reader may
//! act on (copy nothing, read nothing), so they are set only where they are known to hold;
//! "allocated data" is always a true answer.

/// One extent of a `base:allocation` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    pub len_bytes: u64,
    /// Not allocated (NBD_STATE_HOLE).
    pub hole: bool,
    /// Reads as zeros (NBD_STATE_ZERO).
    pub zero: bool,
}

impl Allocation {
    /// Allocated bytes that may hold anything (always a true answer).
    pub const fn data(len_bytes: u64) -> Self {
        Self { len_bytes, hole: false, zero: false }
    }

    /// Unallocated bytes that read as zeros.
    pub const fn hole(len_bytes: u64) -> Self {
        Self { len_bytes, hole: true, zero: true }
    }

    /// Whether two extents claim the same states.
    pub fn same_state(&self, other: &Allocation) -> bool {
        self.hole == other.hole && self.zero == other.zero
    }
}

/// Appends `extent` to `extents`, merged into the last one when it claims the same states.
pub fn push_merged(extents: &mut Vec<Allocation>, extent: Allocation) {
    if extent.len_bytes == 0 {
        return;
    }
    match extents.last_mut() {
        Some(last) if last.same_state(&extent) => last.len_bytes += extent.len_bytes,
        _ => extents.push(extent),
    }
}

/// The total length of `extents`.
pub fn total_bytes(extents: &[Allocation]) -> u64 {
    extents.iter().map(|e| e.len_bytes).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pushes_merge_equal_states_and_skip_empty_extents() {
        let mut v = Vec::new();
        push_merged(&mut v, Allocation::hole(512));
        push_merged(&mut v, Allocation::hole(1024));
        push_merged(&mut v, Allocation::data(0));
        push_merged(&mut v, Allocation::data(512));
        push_merged(&mut v, Allocation { len_bytes: 512, hole: false, zero: true });
        assert_eq!(
            v,
            vec![Allocation::hole(1536), Allocation::data(512), Allocation { len_bytes: 512, hole: false, zero: true }]
        );
        assert_eq!(total_bytes(&v), 2560);
    }
}
