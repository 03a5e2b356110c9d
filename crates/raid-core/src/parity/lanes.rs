//! [`Lanes`]: a register full of bytes and the handful of GF(2^8) operations the parity
//! kernels need, so that [`super::syndrome`] is written once and compiled for each
//! instruction set: `u64` (SWAR, the portable path, after Linux `lib/raid6/int.uc`), `u8`
//! (tails) and the x86 vector types in [`super::simd_x86`].
//!
//! Every method is `unsafe`: vector implementations execute instructions the CPU may lack.
//! The contract is the same for all of them, stated once here.
//!
//! # Safety
//! A method of `L: Lanes` may only be called when the CPU supports the target features of
//! `L` (none for `u8`/`u64`). `load`/`store` additionally need `ptr` valid for
//! `L::BYTES` bytes of reading/writing (no alignment needed).

use super::gf256::{MUL_TABLE, gf_mul2};

pub(crate) trait Lanes: Copy {
    /// Bytes per register.
    const BYTES: usize;
    /// A field constant prepared for [`Lanes::mul`] (tables, a matrix or the byte itself).
    type Coef: Copy;

    unsafe fn load(ptr: *const u8) -> Self;
    unsafe fn store(self, ptr: *mut u8);
    unsafe fn zero() -> Self;
    unsafe fn xor(self, other: Self) -> Self;
    unsafe fn or(self, other: Self) -> Self;
    unsafe fn is_zero(self) -> bool;
    /// Multiplies every byte by g = {02}.
    unsafe fn mul2(self) -> Self;
    /// Prepares the field element `c` for [`Lanes::mul`].
    unsafe fn coef(c: u8) -> Self::Coef;
    /// Multiplies every byte by the prepared constant.
    unsafe fn mul(self, c: Self::Coef) -> Self;
}

/// Bit 7 of every byte lane of a u64.
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;
/// The reduction constant 0x1d in every byte lane.
const REDUCE: u64 = 0x1d1d_1d1d_1d1d_1d1d;

/// The SWAR doubling of Linux `int.uc`: shift every lane left, reduce lanes whose top bit fell out.
#[inline(always)]
fn mul2_swar(v: u64) -> u64 {
    let high = v & HIGH_BITS;
    // (high << 1) - (high >> 7) turns each 0x80 into 0xff without crossing lanes.
    let reduce_mask = (high << 1).wrapping_sub(high >> 7);
    ((v << 1) & !0x0101_0101_0101_0101) ^ (reduce_mask & REDUCE)
}

impl Lanes for u64 {
    const BYTES: usize = 8;
    type Coef = &'static [u8; 256];

    #[inline(always)]
    unsafe fn load(ptr: *const u8) -> Self {
        // SAFETY: the caller guarantees 8 readable bytes at ptr; read_unaligned needs no alignment.
        u64::from_ne_bytes(unsafe { ptr.cast::<[u8; 8]>().read_unaligned() })
    }
    #[inline(always)]
    unsafe fn store(self, ptr: *mut u8) {
        // SAFETY: the caller guarantees 8 writable bytes at ptr; write_unaligned needs no alignment.
        unsafe { ptr.cast::<[u8; 8]>().write_unaligned(self.to_ne_bytes()) }
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        0
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        self ^ other
    }
    #[inline(always)]
    unsafe fn or(self, other: Self) -> Self {
        self | other
    }
    #[inline(always)]
    unsafe fn is_zero(self) -> bool {
        self == 0
    }
    #[inline(always)]
    unsafe fn mul2(self) -> Self {
        mul2_swar(self)
    }
    #[inline(always)]
    unsafe fn coef(c: u8) -> Self::Coef {
        &MUL_TABLE[usize::from(c)]
    }
    #[inline(always)]
    unsafe fn mul(self, c: Self::Coef) -> Self {
        // One lookup per byte in c's product row, as Linux's scalar recovery (recov.c).
        u64::from_ne_bytes(self.to_ne_bytes().map(|byte| c[usize::from(byte)]))
    }
}

impl Lanes for u8 {
    const BYTES: usize = 1;
    type Coef = &'static [u8; 256];

    #[inline(always)]
    unsafe fn load(ptr: *const u8) -> Self {
        // SAFETY: the caller guarantees one readable byte at ptr.
        unsafe { ptr.read() }
    }
    #[inline(always)]
    unsafe fn store(self, ptr: *mut u8) {
        // SAFETY: the caller guarantees one writable byte at ptr.
        unsafe { ptr.write(self) }
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        0
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        self ^ other
    }
    #[inline(always)]
    unsafe fn or(self, other: Self) -> Self {
        self | other
    }
    #[inline(always)]
    unsafe fn is_zero(self) -> bool {
        self == 0
    }
    #[inline(always)]
    unsafe fn mul2(self) -> Self {
        gf_mul2(self)
    }
    #[inline(always)]
    unsafe fn coef(c: u8) -> Self::Coef {
        &MUL_TABLE[usize::from(c)]
    }
    #[inline(always)]
    unsafe fn mul(self, c: Self::Coef) -> Self {
        c[usize::from(self)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parity::gf256::gf_mul_bitwise;

    #[test]
    fn swar_matches_bytewise() {
        // 32 u64 words cover all 256 byte values in every lane position once.
        for word_index in 0..32u8 {
            let bytes: [u8; 8] = std::array::from_fn(|lane| word_index * 8 + lane as u8);
            let word = u64::from_ne_bytes(bytes);
            // SAFETY: u64 needs no target features.
            let doubled = unsafe { word.mul2() }.to_ne_bytes();
            for lane in 0..8 {
                assert_eq!(doubled[lane], gf_mul2(bytes[lane]));
            }
            for c in 0..=255u8 {
                // SAFETY: u64 needs no target features.
                let product = unsafe { word.mul(u64::coef(c)) }.to_ne_bytes();
                for lane in 0..8 {
                    assert_eq!(product[lane], gf_mul_bitwise(c, bytes[lane]));
                }
            }
        }
    }
}
