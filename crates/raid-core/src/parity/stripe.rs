//! Whole-stripe operations: [`ParityImpl::compute_parity`] and
//! [`ParityImpl::parity_matches`], plus the helpers recovery shares: [`StripeShape`] (where
//! P and Q are, validated) and [`HornerOrder`] (data blocks sorted by descending exponent on
//! the stack, so that any exponent set, gaps included, is one kernel pass).

use std::cmp::Reverse;

use super::gf256::exponent_mod_order;
use super::syndrome::{self, Finish, Job};
use super::{BlockKind, MAX_DATA_BLOCKS, ParityImpl};

/// Validated positions of a stripe's parity blocks.
#[derive(Debug, Clone, Copy)]
pub(super) struct StripeShape {
    pub p_index: usize,
    pub q_index: Option<usize>,
}

impl StripeShape {
    /// # Panics
    /// Unless `kinds` has exactly one `P`, at most one `Q` and at most
    /// [`MAX_DATA_BLOCKS`] data blocks, and `block_count == kinds.len()`.
    pub fn of(kinds: &[BlockKind], block_count: usize) -> StripeShape {
        assert_eq!(block_count, kinds.len(), "parity: {block_count} blocks but {} kinds", kinds.len());
        let mut p_index = None;
        let mut q_index = None;
        let mut data_count = 0usize;
        for (index, kind) in kinds.iter().enumerate() {
            match kind {
                BlockKind::Data { .. } => data_count += 1,
                BlockKind::P => {
                    assert!(p_index.is_none(), "parity: more than one P block");
                    p_index = Some(index);
                }
                BlockKind::Q => {
                    assert!(q_index.is_none(), "parity: more than one Q block");
                    q_index = Some(index);
                }
            }
        }
        assert!(data_count <= MAX_DATA_BLOCKS, "parity: {data_count} data blocks, at most {MAX_DATA_BLOCKS}");
        StripeShape { p_index: p_index.expect("parity: stripe without a P block"), q_index }
    }
}

/// The common length of all blocks.
///
/// # Panics
/// If the lengths differ.
pub(super) fn common_len(mut lens: impl Iterator<Item = usize>) -> usize {
    let first = lens.next().unwrap_or(0);
    for len in lens {
        assert_eq!(len, first, "parity: blocks of a stripe have different lengths");
    }
    first
}

/// Sources: every data block, plus one parity block when recovering by XOR.
const HORNER_CAPACITY: usize = MAX_DATA_BLOCKS + 1;

/// Kernel sources in Horner order (descending exponent), built on the stack.
pub(super) struct HornerOrder {
    entries: [(u8, *const u8); HORNER_CAPACITY],
    len: usize,
    sources: [*const u8; HORNER_CAPACITY],
    gaps: [u8; HORNER_CAPACITY],
}

impl HornerOrder {
    pub fn new() -> HornerOrder {
        HornerOrder {
            entries: [(0, std::ptr::null()); HORNER_CAPACITY],
            len: 0,
            sources: [std::ptr::null(); HORNER_CAPACITY],
            gaps: [0; HORNER_CAPACITY],
        }
    }

    /// Adds a source with Q coefficient g^exponent.
    ///
    /// # Panics
    /// Beyond `MAX_DATA_BLOCKS + 1` sources (callers validate with [`StripeShape::of`]).
    pub fn push(&mut self, source: *const u8, exponent: u8) {
        assert!(self.len < HORNER_CAPACITY, "parity: too many sources");
        self.entries[self.len] = (exponent_mod_order(exponent), source);
        self.len += 1;
    }

    /// Sorts the sources and describes the kernel pass.
    pub fn job(&mut self, len_bytes: usize, finish: Finish) -> Job<'_> {
        let entries = &mut self.entries[..self.len];
        entries.sort_unstable_by_key(|&(exponent, _)| Reverse(exponent));
        let mut previous_exponent = entries.first().map_or(0, |&(exponent, _)| exponent);
        for (k, &(exponent, source)) in entries.iter().enumerate() {
            self.sources[k] = source;
            self.gaps[k] = previous_exponent - exponent;
            previous_exponent = exponent;
        }
        Job {
            sources: &self.sources[..self.len],
            gaps: &self.gaps[..self.len],
            tail: previous_exponent,
            len_bytes,
            finish,
        }
    }
}

impl ParityImpl {
    /// Computes the P block (and the Q block if present) of a stripe from its data blocks.
    /// `blocks[i]` has kind `kinds[i]`. One pass over the data, no allocation.
    ///
    /// # Panics
    /// If the stripe is malformed (see [`crate::parity::compute_parity`]) or the
    /// implementation is not available.
    pub fn compute_parity(self, blocks: &mut [&mut [u8]], kinds: &[BlockKind]) {
        StripeShape::of(kinds, blocks.len());
        let len_bytes = common_len(blocks.iter().map(|block| block.len()));
        self.assert_available();
        let mut order = HornerOrder::new();
        let mut p = std::ptr::null_mut();
        let mut q = std::ptr::null_mut();
        for (block, kind) in blocks.iter_mut().zip(kinds) {
            match *kind {
                BlockKind::Data { exponent } => order.push(block.as_ptr(), exponent),
                BlockKind::P => p = block.as_mut_ptr(),
                BlockKind::Q => q = block.as_mut_ptr(),
            }
        }
        let job = order.job(len_bytes, Finish::Store { p, q });
        // SAFETY: available (asserted); every block is valid for len_bytes (common_len); the
        // blocks are distinct &mut slices, so the outputs P, Q overlap no source.
        unsafe { syndrome::run(self, &job) };
    }

    /// [`compute_parity`](Self::compute_parity) from data blocks borrowed apart from the
    /// parity blocks (a client's shared buffer, which is never written): `data[i]` has Q
    /// coefficient g^`exponents[i]`; P, and Q if given, are stored.
    ///
    /// # Panics
    /// If the lengths differ, there are more than [`MAX_DATA_BLOCKS`] data blocks, or the
    /// implementation is not available.
    pub fn compute_parity_split(self, data: &[&[u8]], exponents: &[u8], p: &mut [u8], q: Option<&mut [u8]>) {
        assert_eq!(data.len(), exponents.len(), "parity: one exponent per data block");
        assert!(data.len() <= MAX_DATA_BLOCKS, "parity: more than {MAX_DATA_BLOCKS} data blocks");
        let lens = data.iter().map(|block| block.len()).chain([p.len()]).chain(q.as_ref().map(|q| q.len()));
        let len_bytes = common_len(lens);
        self.assert_available();
        let mut order = HornerOrder::new();
        for (block, &exponent) in data.iter().zip(exponents) {
            order.push(block.as_ptr(), exponent);
        }
        let q = q.map_or(std::ptr::null_mut(), |q| q.as_mut_ptr());
        let job = order.job(len_bytes, Finish::Store { p: p.as_mut_ptr(), q });
        // SAFETY: available (asserted); every block is valid for len_bytes (common_len); P and
        // Q are &mut slices, so they overlap neither each other nor any (shared) data block.
        unsafe { syndrome::run(self, &job) };
    }

    /// Whether P (and Q, if the stripe has one) agree with the data. One pass, no allocation.
    ///
    /// # Panics
    /// If the stripe is malformed or the implementation is not available.
    pub fn parity_matches(self, blocks: &[&[u8]], kinds: &[BlockKind]) -> bool {
        StripeShape::of(kinds, blocks.len());
        let len_bytes = common_len(blocks.iter().map(|block| block.len()));
        self.assert_available();
        let mut order = HornerOrder::new();
        let mut p = std::ptr::null();
        let mut q = std::ptr::null();
        for (block, kind) in blocks.iter().zip(kinds) {
            match *kind {
                BlockKind::Data { exponent } => order.push(block.as_ptr(), exponent),
                BlockKind::P => p = block.as_ptr(),
                BlockKind::Q => q = block.as_ptr(),
            }
        }
        let job = order.job(len_bytes, Finish::Check { p, q });
        // SAFETY: available (asserted); every block is valid for reading len_bytes; nothing is written.
        unsafe { syndrome::run(self, &job) }
    }
}
