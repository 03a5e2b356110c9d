//! x86-64 vector [`Lanes`]: AVX2, AVX-512BW and AVX-512 + GFNI.
//!
//! - Doubling (the Horner step of Q) as Linux `lib/raid6/avx2.c`/`avx512.c`: add the byte to
//!   itself, XOR 0x1d into the lanes whose top bit was set (no tables).
//! - Multiplication by other constants (gaps between exponents, recovery) with two PSHUFB
//!   nibble lookups, as `recov_avx2.c`; with GFNI, every multiplication (doubling included)
//!   is one `vgf2p8affineqb` with the constant's bit matrix, as ISA-L `pq_gen_avx512_gfni`.
//!
//! These types are only instantiated inside the `#[target_feature]` entry points in
//! [`super::syndrome`], after `is_x86_feature_detected!` said yes (see
//! [`super::ParityImpl::is_available`]); that is what makes the intrinsic calls sound.

use std::arch::x86_64::*;

use super::gf256::{AFFINE_MATRICES, NIBBLE_PRODUCTS};
use super::lanes::Lanes;

/// 32 bytes; needs `avx2`.
#[derive(Clone, Copy)]
pub(crate) struct Avx2(__m256i);

/// 64 bytes; needs `avx512f` and `avx512bw`.
#[derive(Clone, Copy)]
pub(crate) struct Avx512Bw(__m512i);

/// 64 bytes; needs `avx512f`, `avx512bw` and `gfni`.
#[derive(Clone, Copy)]
pub(crate) struct Avx512Gfni(__m512i);

/// The two 16-byte nibble-product tables of a constant, broadcast to every 128-bit lane.
#[derive(Clone, Copy)]
pub(crate) struct NibbleTables256 {
    low: __m256i,
    high: __m256i,
}

#[derive(Clone, Copy)]
pub(crate) struct NibbleTables512 {
    low: __m512i,
    high: __m512i,
}

// In each impl below, every unsafe block relies on the module contract (lanes.rs "# Safety"):
// the CPU has the type's target features, and pointers are valid for BYTES bytes.

impl Lanes for Avx2 {
    const BYTES: usize = 32;
    type Coef = NibbleTables256;

    #[inline(always)]
    unsafe fn load(ptr: *const u8) -> Self {
        // SAFETY: avx2 present and 32 readable bytes at ptr (Lanes contract); loadu is unaligned.
        Avx2(unsafe { _mm256_loadu_si256(ptr.cast()) })
    }
    #[inline(always)]
    unsafe fn store(self, ptr: *mut u8) {
        // SAFETY: avx2 present and 32 writable bytes at ptr (Lanes contract); storeu is unaligned.
        unsafe { _mm256_storeu_si256(ptr.cast(), self.0) }
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: avx2 present (Lanes contract).
        Avx2(unsafe { _mm256_setzero_si256() })
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        // SAFETY: avx2 present (Lanes contract).
        Avx2(unsafe { _mm256_xor_si256(self.0, other.0) })
    }
    #[inline(always)]
    unsafe fn or(self, other: Self) -> Self {
        // SAFETY: avx2 present (Lanes contract).
        Avx2(unsafe { _mm256_or_si256(self.0, other.0) })
    }
    #[inline(always)]
    unsafe fn is_zero(self) -> bool {
        // SAFETY: avx2 present (Lanes contract).
        unsafe { _mm256_testz_si256(self.0, self.0) != 0 }
    }
    #[inline(always)]
    unsafe fn mul2(self) -> Self {
        // SAFETY: avx2 present (Lanes contract).
        unsafe {
            // 0xff where the byte is negative (top bit set): Linux's vpcmpgtb against zero.
            let overflow = _mm256_cmpgt_epi8(_mm256_setzero_si256(), self.0);
            let doubled = _mm256_add_epi8(self.0, self.0);
            Avx2(_mm256_xor_si256(doubled, _mm256_and_si256(overflow, _mm256_set1_epi8(0x1d))))
        }
    }
    #[inline(always)]
    unsafe fn coef(c: u8) -> Self::Coef {
        let table = &NIBBLE_PRODUCTS[usize::from(c)];
        // SAFETY: avx2 present (Lanes contract); table is 32 bytes, so both 16-byte loads are in bounds.
        unsafe {
            NibbleTables256 {
                low: _mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr().cast())),
                high: _mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr().add(16).cast())),
            }
        }
    }
    #[inline(always)]
    unsafe fn mul(self, c: Self::Coef) -> Self {
        // SAFETY: avx2 present (Lanes contract).
        unsafe {
            let nibble_mask = _mm256_set1_epi8(0x0f);
            let low = _mm256_and_si256(self.0, nibble_mask);
            let high = _mm256_and_si256(_mm256_srli_epi16::<4>(self.0), nibble_mask);
            Avx2(_mm256_xor_si256(_mm256_shuffle_epi8(c.low, low), _mm256_shuffle_epi8(c.high, high)))
        }
    }
}

impl Lanes for Avx512Bw {
    const BYTES: usize = 64;
    type Coef = NibbleTables512;

    #[inline(always)]
    unsafe fn load(ptr: *const u8) -> Self {
        // SAFETY: avx512f present and 64 readable bytes at ptr (Lanes contract); loadu is unaligned.
        Avx512Bw(unsafe { _mm512_loadu_si512(ptr.cast()) })
    }
    #[inline(always)]
    unsafe fn store(self, ptr: *mut u8) {
        // SAFETY: avx512f present and 64 writable bytes at ptr (Lanes contract); storeu is unaligned.
        unsafe { _mm512_storeu_si512(ptr.cast(), self.0) }
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: avx512f present (Lanes contract).
        Avx512Bw(unsafe { _mm512_setzero_si512() })
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        // SAFETY: avx512f present (Lanes contract).
        Avx512Bw(unsafe { _mm512_xor_si512(self.0, other.0) })
    }
    #[inline(always)]
    unsafe fn or(self, other: Self) -> Self {
        // SAFETY: avx512f present (Lanes contract).
        Avx512Bw(unsafe { _mm512_or_si512(self.0, other.0) })
    }
    #[inline(always)]
    unsafe fn is_zero(self) -> bool {
        // SAFETY: avx512f present (Lanes contract).
        unsafe { _mm512_test_epi64_mask(self.0, self.0) == 0 }
    }
    #[inline(always)]
    unsafe fn mul2(self) -> Self {
        // SAFETY: avx512f + avx512bw present (Lanes contract).
        unsafe {
            let overflow = _mm512_movepi8_mask(self.0);
            let doubled = _mm512_add_epi8(self.0, self.0);
            Avx512Bw(_mm512_xor_si512(doubled, _mm512_maskz_mov_epi8(overflow, _mm512_set1_epi8(0x1d))))
        }
    }
    #[inline(always)]
    unsafe fn coef(c: u8) -> Self::Coef {
        let table = &NIBBLE_PRODUCTS[usize::from(c)];
        // SAFETY: avx512f present (Lanes contract); table is 32 bytes, so both 16-byte loads are in bounds.
        unsafe {
            NibbleTables512 {
                low: _mm512_broadcast_i32x4(_mm_loadu_si128(table.as_ptr().cast())),
                high: _mm512_broadcast_i32x4(_mm_loadu_si128(table.as_ptr().add(16).cast())),
            }
        }
    }
    #[inline(always)]
    unsafe fn mul(self, c: Self::Coef) -> Self {
        // SAFETY: avx512f + avx512bw present (Lanes contract).
        unsafe {
            let nibble_mask = _mm512_set1_epi8(0x0f);
            let low = _mm512_and_si512(self.0, nibble_mask);
            let high = _mm512_and_si512(_mm512_srli_epi16::<4>(self.0), nibble_mask);
            Avx512Bw(_mm512_xor_si512(_mm512_shuffle_epi8(c.low, low), _mm512_shuffle_epi8(c.high, high)))
        }
    }
}

impl Lanes for Avx512Gfni {
    const BYTES: usize = 64;
    type Coef = __m512i;

    #[inline(always)]
    unsafe fn load(ptr: *const u8) -> Self {
        // SAFETY: avx512f present and 64 readable bytes at ptr (Lanes contract); loadu is unaligned.
        Avx512Gfni(unsafe { _mm512_loadu_si512(ptr.cast()) })
    }
    #[inline(always)]
    unsafe fn store(self, ptr: *mut u8) {
        // SAFETY: avx512f present and 64 writable bytes at ptr (Lanes contract); storeu is unaligned.
        unsafe { _mm512_storeu_si512(ptr.cast(), self.0) }
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: avx512f present (Lanes contract).
        Avx512Gfni(unsafe { _mm512_setzero_si512() })
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        // SAFETY: avx512f present (Lanes contract).
        Avx512Gfni(unsafe { _mm512_xor_si512(self.0, other.0) })
    }
    #[inline(always)]
    unsafe fn or(self, other: Self) -> Self {
        // SAFETY: avx512f present (Lanes contract).
        Avx512Gfni(unsafe { _mm512_or_si512(self.0, other.0) })
    }
    #[inline(always)]
    unsafe fn is_zero(self) -> bool {
        // SAFETY: avx512f present (Lanes contract).
        unsafe { _mm512_test_epi64_mask(self.0, self.0) == 0 }
    }
    #[inline(always)]
    unsafe fn mul2(self) -> Self {
        // SAFETY: avx512f + gfni present (Lanes contract).
        unsafe { self.mul(Self::coef(2)) }
    }
    #[inline(always)]
    unsafe fn coef(c: u8) -> Self::Coef {
        // SAFETY: avx512f present (Lanes contract).
        unsafe { _mm512_set1_epi64(AFFINE_MATRICES[usize::from(c)] as i64) }
    }
    #[inline(always)]
    unsafe fn mul(self, c: Self::Coef) -> Self {
        // SAFETY: avx512f + gfni present (Lanes contract).
        Avx512Gfni(unsafe { _mm512_gf2p8affine_epi64_epi8::<0>(self.0, c) })
    }
}
