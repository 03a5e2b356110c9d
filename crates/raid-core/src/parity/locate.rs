//! Which block of a raid6 stripe is wrong when P and Q disagree with the data (the math of
//! mdadm's `raid6check`; H. P. Anvin, "The mathematics of RAID-6", §4).
//!
//! With the syndromes of the stripe as read, `S_P = P ⊕ ΣD_k` and `S_Q = Q ⊕ Σ g^{e_k}·D_k`:
//! - both zero: consistent;
//! - only `S_P`: P is wrong; only `S_Q`: Q is wrong;
//! - one wrong data block `z` (error `E`) gives `S_P = E` and `S_Q = g^{e_z}·E`, so
//!   `log(S_Q) − log(S_P) = e_z` at every byte where `E ≠ 0`: the same exponent at every such
//!   byte names the block. Anything else (a byte where only one syndrome is set, or two
//!   exponents) is more than one wrong block: not located.
//!
//! Used by scrub on pages that already failed [`super::parity_matches`]; it allocates.

use super::{BlockKind, compute_parity, gf_log};

/// The verdict on one stripe (or page of one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Located {
    /// P and Q agree with the data.
    Consistent,
    /// Exactly this block (index into the stripe) is wrong.
    Block(usize),
    /// More than one block is wrong: no single one can be named.
    Unknown,
}

/// Locates the one wrong block of a raid6 stripe (`kinds` has a P and a Q), if there is one.
///
/// # Panics
/// If the stripe is malformed (as for [`compute_parity`]) or has no Q.
pub fn locate_bad_block(blocks: &[&[u8]], kinds: &[BlockKind]) -> Located {
    let p = kinds.iter().position(|k| *k == BlockKind::P).expect("a P block");
    let q = kinds.iter().position(|k| *k == BlockKind::Q).expect("locating needs a Q block");
    let mut computed: Vec<Vec<u8>> = blocks.iter().map(|b| b.to_vec()).collect();
    {
        let mut slices: Vec<&mut [u8]> = computed.iter_mut().map(|b| b.as_mut_slice()).collect();
        compute_parity(&mut slices, kinds);
    }
    let syndrome = |i: usize| -> Vec<u8> { blocks[i].iter().zip(&computed[i]).map(|(a, b)| a ^ b).collect() };
    let (sp, sq) = (syndrome(p), syndrome(q));
    let p_set = sp.iter().any(|&b| b != 0);
    let q_set = sq.iter().any(|&b| b != 0);
    match (p_set, q_set) {
        (false, false) => return Located::Consistent,
        (true, false) => return Located::Block(p),
        (false, true) => return Located::Block(q),
        (true, true) => {}
    }
    let mut exponent = None;
    for (&a, &b) in sp.iter().zip(&sq) {
        match (a, b) {
            (0, 0) => continue,
            (0, _) | (_, 0) => return Located::Unknown,
            _ => {
                let e = ((u16::from(gf_log(b)) + 255 - u16::from(gf_log(a))) % 255) as u8;
                if exponent.is_some_and(|x| x != e) {
                    return Located::Unknown;
                }
                exponent = Some(e);
            }
        }
    }
    let e = exponent.expect("some byte has both syndromes set");
    kinds
        .iter()
        .position(|k| matches!(k, BlockKind::Data { exponent } if exponent % 255 == e))
        .map_or(Located::Unknown, Located::Block)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stripe(data_blocks: usize, len: usize) -> (Vec<Vec<u8>>, Vec<BlockKind>) {
        let mut kinds: Vec<BlockKind> = (0..data_blocks).map(|e| BlockKind::Data { exponent: e as u8 }).collect();
        kinds.extend([BlockKind::P, BlockKind::Q]);
        let mut blocks: Vec<Vec<u8>> =
            (0..data_blocks + 2).map(|b| (0..len).map(|i| (i * 31 + b * 97 + 7) as u8).collect()).collect();
        let mut slices: Vec<&mut [u8]> = blocks.iter_mut().map(|b| b.as_mut_slice()).collect();
        compute_parity(&mut slices, &kinds);
        (blocks, kinds)
    }

    fn locate(blocks: &[Vec<u8>], kinds: &[BlockKind]) -> Located {
        let slices: Vec<&[u8]> = blocks.iter().map(|b| b.as_slice()).collect();
        locate_bad_block(&slices, kinds)
    }

    #[test]
    fn names_the_one_wrong_block_whichever_it_is() {
        let (good, kinds) = stripe(5, 4096);
        assert_eq!(locate(&good, &kinds), Located::Consistent);
        for bad in 0..kinds.len() {
            for (at, flip) in [(0usize, 1u8), (4095, 0x80), (1000, 0xff)] {
                let mut blocks = good.clone();
                blocks[bad][at] ^= flip;
                blocks[bad][at / 2] ^= 0x5a;
                assert_eq!(locate(&blocks, &kinds), Located::Block(bad), "block {bad} at {at}");
            }
        }
    }

    #[test]
    fn two_wrong_blocks_are_not_blamed_on_one() {
        let (good, kinds) = stripe(4, 512);
        for (a, b) in [(0, 1), (1, 4), (2, 5), (4, 5)] {
            let mut blocks = good.clone();
            blocks[a][10] ^= 3;
            blocks[b][10] ^= 9;
            blocks[b][300] ^= 1;
            assert_eq!(locate(&blocks, &kinds), Located::Unknown, "blocks {a} and {b}");
        }
    }
}
