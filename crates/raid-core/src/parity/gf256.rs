//! GF(2^8) with polynomial x⁸+x⁴+x³+x²+1 (0x11d) and generator g = {02}: the field of
//! Linux `lib/raid6` (`mktables.c`). All tables are built at compile time by `const fn`s,
//! so there is no start-up cost and nothing to get out of sync.
//!
//! - [`gf_exp`], [`gf_log`], [`gf_mul`], [`gf_inv`]: field arithmetic on single bytes.
//! - [`gf_mul_bitwise`]: the slow shift-and-add definition, the oracle for everything else.
//! - `MUL_TABLE[c]`: the 256 products c·x, Linux `raid6_gfmul` (scalar multiply by a constant).
//! - `NIBBLE_PRODUCTS[c]`: c·0x0..c·0xf then c·0x00..c·0xf0, the 32-byte PSHUFB tables of
//!   Linux `raid6_vgfmul` / ISA-L `gf_vect_mul_init`.
//! - `AFFINE_MATRICES[c]`: the 8×8 bit matrix of "multiply by c" in the layout
//!   `vgf2p8affineqb` expects (GFNI's own `gf2p8mulb` is fixed to 0x11b, so it is useless here).

/// The field polynomial, x⁸+x⁴+x³+x²+1.
pub const GF_POLYNOMIAL: u16 = 0x11d;

/// Doubles one byte: multiply by g = {02}, reducing by 0x1d when bit 7 falls out.
pub const fn gf_mul2(x: u8) -> u8 {
    (x << 1) ^ if x & 0x80 != 0 { 0x1d } else { 0 }
}

/// Multiplies by shift-and-add, one bit of `b` at a time. Slow; the definition the tables
/// are checked against.
pub const fn gf_mul_bitwise(a: u8, b: u8) -> u8 {
    let mut product = 0u8;
    let mut a_shifted = a;
    let mut bit = 0;
    while bit < 8 {
        if b & (1 << bit) != 0 {
            product ^= a_shifted;
        }
        a_shifted = gf_mul2(a_shifted);
        bit += 1;
    }
    product
}

const fn build_exp() -> [u8; 256] {
    let mut exp = [0u8; 256];
    let mut x = 1u8;
    let mut i = 0;
    while i < 256 {
        exp[i] = x;
        x = gf_mul2(x);
        i += 1;
    }
    exp
}

const fn build_log() -> [u8; 256] {
    let exp = build_exp();
    let mut log = [0u8; 256];
    let mut i = 0;
    while i < 255 {
        log[exp[i] as usize] = i as u8;
        i += 1;
    }
    log
}

/// `EXP[i] = g^i`; `EXP[255] = g^255 = 1`.
static EXP: [u8; 256] = build_exp();
/// `LOG[g^i] = i` for i in 0..255; `LOG[0]` is meaningless (0).
static LOG: [u8; 256] = build_log();

/// g^exponent. The multiplicative group has order 255, so `gf_exp(255) == gf_exp(0) == 1`.
pub fn gf_exp(exponent: u8) -> u8 {
    EXP[usize::from(exponent)]
}

/// The discrete logarithm: `gf_exp(gf_log(x)) == x` for x ≠ 0, in 0..255.
///
/// # Panics
/// If `x == 0` (zero has no logarithm).
pub fn gf_log(x: u8) -> u8 {
    assert!(x != 0, "gf_log(0) is undefined");
    LOG[usize::from(x)]
}

/// a·b in the field.
pub fn gf_mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        return 0;
    }
    let log_sum = (u16::from(LOG[usize::from(a)]) + u16::from(LOG[usize::from(b)])) % 255;
    EXP[usize::from(log_sum)]
}

/// x⁻¹, so that `gf_mul(x, gf_inv(x)) == 1`.
///
/// # Panics
/// If `x == 0`.
pub fn gf_inv(x: u8) -> u8 {
    assert!(x != 0, "gf_inv(0) is undefined");
    EXP[usize::from((255 - LOG[usize::from(x)]) % 255)]
}

/// Reduces an exponent modulo the group order 255 (so 255 becomes 0).
pub(crate) fn exponent_mod_order(exponent: u8) -> u8 {
    if exponent == 255 { 0 } else { exponent }
}

const fn build_mul_table() -> [[u8; 256]; 256] {
    // Via log/exp: cheap enough for compile-time evaluation of 65536 entries.
    let exp = build_exp();
    let log = build_log();
    let mut table = [[0u8; 256]; 256];
    let mut c = 1;
    while c < 256 {
        let mut x = 1;
        while x < 256 {
            table[c][x] = exp[(log[c] as usize + log[x] as usize) % 255];
            x += 1;
        }
        c += 1;
    }
    table
}

/// `MUL_TABLE[c][x] = c·x` (64 KiB; a multiplication touches one 256-byte row).
pub(crate) static MUL_TABLE: [[u8; 256]; 256] = build_mul_table();

const fn build_nibble_products() -> [[u8; 32]; 256] {
    let mut tables = [[0u8; 32]; 256];
    let mut c = 0;
    while c < 256 {
        let mut nibble = 0;
        while nibble < 16 {
            tables[c][nibble] = gf_mul_bitwise(c as u8, nibble as u8);
            tables[c][16 + nibble] = gf_mul_bitwise(c as u8, (nibble as u8) << 4);
            nibble += 1;
        }
        c += 1;
    }
    tables
}

/// `NIBBLE_PRODUCTS[c][n] = c·n` and `NIBBLE_PRODUCTS[c][16 + n] = c·(n << 4)` for n in 0..16,
/// so c·x = `[c][x & 15] ^ [c][16 + (x >> 4)]`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) static NIBBLE_PRODUCTS: [[u8; 32]; 256] = build_nibble_products();

const fn build_affine_matrices() -> [u64; 256] {
    let mut matrices = [0u64; 256];
    let mut c = 0;
    while c < 256 {
        // Column j of "multiply by c" is c·x^j; output bit i is the parity of
        // (row i & input), and vgf2p8affineqb takes row i from byte 7 - i of the qword.
        let mut matrix = 0u64;
        let mut out_bit = 0;
        while out_bit < 8 {
            let mut row = 0u8;
            let mut in_bit = 0;
            while in_bit < 8 {
                if gf_mul_bitwise(c as u8, 1 << in_bit) & (1 << out_bit) != 0 {
                    row |= 1 << in_bit;
                }
                in_bit += 1;
            }
            matrix |= (row as u64) << (8 * (7 - out_bit));
            out_bit += 1;
        }
        matrices[c] = matrix;
        c += 1;
    }
    matrices
}

/// `AFFINE_MATRICES[c]`: the `vgf2p8affineqb` matrix operand computing c·x per byte.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) static AFFINE_MATRICES: [u64; 256] = build_affine_matrices();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn powers_of_the_generator_match_linux() {
        // md-format.md §3: g¹..g⁸ = 02 04 08 10 20 40 80 1D.
        let powers: Vec<u8> = (1..=8).map(gf_exp).collect();
        assert_eq!(powers, [0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0x1d]);
        assert_eq!(gf_exp(255), 1);
        assert_eq!(gf_exp(0), 1);
        // g generates the whole multiplicative group.
        let mut seen = [false; 256];
        for e in 0..255u8 {
            let x = gf_exp(e);
            assert!(!seen[usize::from(x)], "g^{e} repeats");
            seen[usize::from(x)] = true;
            assert_eq!(gf_log(x), e);
        }
        assert!(!seen[0]);
    }

    #[test]
    fn table_multiply_matches_bitwise_for_all_pairs() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                assert_eq!(gf_mul(a, b), gf_mul_bitwise(a, b), "{a:#x}·{b:#x}");
            }
        }
    }

    #[test]
    fn bitwise_multiply_agrees_with_the_gf256_crate() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                let oracle = ::gf256::gf256::new(a) * ::gf256::gf256::new(b);
                assert_eq!(gf_mul_bitwise(a, b), oracle.get(), "{a:#x}·{b:#x}");
            }
        }
    }

    #[test]
    fn inverse_is_inverse() {
        for x in 1..=255u8 {
            assert_eq!(gf_mul(x, gf_inv(x)), 1, "{x:#x}");
        }
    }

    #[test]
    fn mul_table_multiplies() {
        for c in 0..=255u8 {
            for x in 0..=255u8 {
                assert_eq!(MUL_TABLE[usize::from(c)][usize::from(x)], gf_mul_bitwise(c, x));
            }
        }
    }

    #[test]
    fn nibble_tables_multiply() {
        for c in 0..=255u8 {
            let table = &NIBBLE_PRODUCTS[usize::from(c)];
            for x in 0..=255u8 {
                let product = table[usize::from(x & 15)] ^ table[16 + usize::from(x >> 4)];
                assert_eq!(product, gf_mul_bitwise(c, x));
            }
        }
    }

    /// Software model of `vgf2p8affineqb` (Intel SDM: bit i of the result is the parity of
    /// `matrix.byte[7 - i] & x`), to check the matrices independently of any CPU.
    fn affine_model(matrix: u64, x: u8) -> u8 {
        let mut result = 0u8;
        for i in 0..8 {
            let row = (matrix >> (8 * (7 - i))) as u8;
            if (row & x).count_ones() % 2 == 1 {
                result |= 1 << i;
            }
        }
        result
    }

    #[test]
    fn affine_matrices_multiply() {
        for c in 0..=255u8 {
            for x in 0..=255u8 {
                assert_eq!(affine_model(AFFINE_MATRICES[usize::from(c)], x), gf_mul_bitwise(c, x));
            }
        }
    }
}
