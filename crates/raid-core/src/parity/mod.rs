//! Parity arithmetic exactly as Linux computes it (`lib/raid6`, `crypto/xor.c`):
//! P = XOR of the data blocks; Q = Σ g^e_k · D_k over GF(2^8) with polynomial 0x11d and
//! generator g = 2; recovery of any one or two lost blocks of a stripe.
//!
//! Everything here works on byte slices of equal length; nothing allocates on the hot
//! path except where a function says so.
//!
//! High-level entry points used by the engine:
//! - [`xor_into`]: `dst ^= src`.
//! - [`compute_parity`]: fill P (and Q) of a stripe from its data blocks.
//! - [`reconstruct`]: fill up to two missing blocks (data, P or Q) of a stripe in place.
//! - [`mul_exp_xor_into`]: `dst ^= g^e · src` (raid6 read-modify-write of Q).

/// What a block of a stripe is, for [`compute_parity`] / [`reconstruct`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    /// A data block whose Q coefficient is g^exponent.
    Data {
        exponent: u8,
    },
    P,
    Q,
}

/// `dst[i] ^= src[i]`.
///
/// # Panics
/// If the lengths differ.
pub fn xor_into(dst: &mut [u8], src: &[u8]) {
    todo!()
}

/// `dst[i] ^= g^exponent · src[i]` in GF(2^8)/0x11d.
pub fn mul_exp_xor_into(dst: &mut [u8], src: &[u8], exponent: u8) {
    todo!()
}

/// Computes the P block (and the Q block if present) of a stripe from its data blocks.
/// `blocks[i]` has kind `kinds[i]`; exactly one `P`, at most one `Q`.
pub fn compute_parity(blocks: &mut [&mut [u8]], kinds: &[BlockKind]) {
    todo!()
}

/// Rebuilds the blocks at indexes `missing` (at most 1 without Q, at most 2 with Q) from
/// the others, in place. Returns false (and changes nothing) if that is impossible.
pub fn reconstruct(blocks: &mut [&mut [u8]], kinds: &[BlockKind], missing: &[usize]) -> bool {
    todo!()
}

/// Whether P (and Q) agree with the data. Used by scrub.
pub fn parity_matches(blocks: &[&[u8]], kinds: &[BlockKind]) -> bool {
    todo!()
}
