//! Parity arithmetic exactly as Linux computes it (`lib/raid6`, `crypto/xor.c`):
//! P = XOR of the data blocks; Q = Σ g^e_k · D_k over GF(2^8) with polynomial 0x11d and
//! generator g = 2; recovery of any one or two lost blocks of a stripe.
//!
//! Everything here works on byte slices of equal length (any length; typically 512 B to
//! 4 MiB) and allocates nothing: stripe bookkeeping lives on the stack and intermediate
//! syndromes stay in registers.
//!
//! High-level entry points used by the engine:
//! - [`xor_into`]: `dst ^= src`.
//! - [`compute_parity`]: fill P (and Q) of a stripe from its data blocks.
//! - [`reconstruct`]: fill up to two missing blocks (data, P or Q) of a stripe in place.
//! - [`mul_exp_xor_into`]: `dst ^= g^e · src` (raid6 read-modify-write of Q).
//! - [`update_parity`]: P and Q read-modify-write for one changed data block, in one pass.
//! - [`parity_matches`]: scrub check.
//! - [`gen_syndrome`]: Linux's `gen_syndrome` for data in md slot order.
//! - [`locate_bad_block`]: which one block of a raid6 stripe is wrong (scrub).
//!
//! Data blocks carry arbitrary exponents (md's slot order, or DDF's g^role with gaps); they
//! are taken modulo 255 (g^255 = 1).
//!
//! ```text
//!  mod.rs (API, best impl) ─▶ stripe.rs / recover.rs / ops.rs   which blocks, which formula
//!                                        │ Job { sources in Horner order, gaps, Finish }
//!                                        ▼
//!                             syndrome.rs  one generic Horner kernel + sinks
//!                                        │ compiled per instruction set
//!                     ┌──────────────────┼───────────────────┐
//!                 lanes.rs (u64 SWAR,  simd_x86.rs (AVX2,   gf256.rs (field, tables
//!                 u8 tails)            AVX-512BW, GFNI)      built at compile time)
//! ```
//!
//! Implementations ([`ParityImpl`]) are chosen at run time with `is_x86_feature_detected!`;
//! the portable scalar path is always there and the tests check every available
//! implementation against it and against bitwise/`gf256`-crate oracles.

mod gf256;
mod implementation;
mod lanes;
mod locate;
mod ops;
mod recover;
#[cfg(target_arch = "x86_64")]
mod simd_x86;
mod stripe;
mod syndrome;
#[cfg(test)]
mod tests;

pub use gf256::{GF_POLYNOMIAL, gf_exp, gf_inv, gf_log, gf_mul, gf_mul_bitwise, gf_mul2};
pub use implementation::ParityImpl;
pub use locate::{Located, locate_bad_block};

/// Most data blocks a stripe may have: Q coefficients g^e are distinct only for 255
/// exponents, and the kernels keep per-stripe bookkeeping on the stack.
pub const MAX_DATA_BLOCKS: usize = 255;

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
    ParityImpl::best().xor_into(dst, src)
}

/// `dst[i] ^= g^exponent · src[i]` in GF(2^8)/0x11d.
///
/// # Panics
/// If the lengths differ.
pub fn mul_exp_xor_into(dst: &mut [u8], src: &[u8], exponent: u8) {
    ParityImpl::best().mul_exp_xor_into(dst, src, exponent)
}

/// Read-modify-write of parity when the data block with exponent `exponent` changes from
/// `old_data` to `new_data`: `P ^= old ⊕ new`, and `Q ^= g^exponent·(old ⊕ new)` if `q` is
/// given. One pass, no delta buffer.
///
/// # Panics
/// If the lengths differ.
pub fn update_parity(p: &mut [u8], q: Option<&mut [u8]>, old_data: &[u8], new_data: &[u8], exponent: u8) {
    ParityImpl::best().update_parity(p, q, old_data, new_data, exponent)
}

/// Linux `gen_syndrome`: `p = ⊕ data[i]`, `q = ⊕ g^i·data[i]`, data in md slot order.
///
/// # Panics
/// If the lengths differ or there are more than [`MAX_DATA_BLOCKS`] data blocks.
pub fn gen_syndrome(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    ParityImpl::best().gen_syndrome(data, p, q)
}

/// Computes the P block (and the Q block if present) of a stripe from its data blocks.
/// `blocks[i]` has kind `kinds[i]`; exactly one `P`, at most one `Q`.
///
/// # Panics
/// If the stripe is malformed: `blocks.len() != kinds.len()`, not exactly one `P`, more
/// than one `Q`, more than [`MAX_DATA_BLOCKS`] data blocks, or blocks of different lengths.
pub fn compute_parity(blocks: &mut [&mut [u8]], kinds: &[BlockKind]) {
    ParityImpl::best().compute_parity(blocks, kinds)
}

/// [`compute_parity`] from data blocks borrowed apart from P and Q (which are stored):
/// `data[i]` has Q coefficient g^`exponents[i]`.
///
/// # Panics
/// If the lengths differ or there are more than [`MAX_DATA_BLOCKS`] data blocks.
pub fn compute_parity_split(data: &[&[u8]], exponents: &[u8], p: &mut [u8], q: Option<&mut [u8]>) {
    ParityImpl::best().compute_parity_split(data, exponents, p, q)
}

/// Rebuilds the blocks at indexes `missing` (at most 1 without Q, at most 2 with Q) from
/// the others, in place. Returns false (and changes nothing) if that is impossible: too many
/// missing, an index out of range or repeated, or two lost data blocks with equal exponents
/// (mod 255). An empty `missing` is trivially possible (true).
///
/// # Panics
/// If the stripe is malformed (as for [`compute_parity`]).
pub fn reconstruct(blocks: &mut [&mut [u8]], kinds: &[BlockKind], missing: &[usize]) -> bool {
    ParityImpl::best().reconstruct(blocks, kinds, missing)
}

/// Whether P (and Q) agree with the data. Used by scrub.
///
/// # Panics
/// If the stripe is malformed (as for [`compute_parity`]).
pub fn parity_matches(blocks: &[&[u8]], kinds: &[BlockKind]) -> bool {
    ParityImpl::best().parity_matches(blocks, kinds)
}
