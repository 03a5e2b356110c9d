//! [`ParityImpl::reconstruct`]: rebuild up to two lost blocks of a stripe in place, following
//! Linux `lib/raid6/recov.c` generalised to arbitrary data exponents e_k.
//!
//! With P′, Q′ the syndromes of the surviving data, Δp = P ⊕ P′ and Δq = Q ⊕ Q′:
//!
//! | lost        | rebuilt as                                                          |
//! |-------------|---------------------------------------------------------------------|
//! | P, Q, P+Q   | recomputed from the data                                            |
//! | D_a         | D_a = Δp (XOR of P and the other data, the RAID5 way)               |
//! | D_a + P     | D_a = g^−e_a·Δq, P = P′ ⊕ D_a                                       |
//! | D_a + Q     | D_a = Δp, Q = Q′ ⊕ g^e_a·D_a                                        |
//! | D_a + D_b   | D_b = (g^e_a ⊕ g^e_b)⁻¹·(g^e_a·Δp ⊕ Δq), D_a = Δp ⊕ D_b              |
//!
//! (For md's exponents, g^e_a/(g^e_a ⊕ g^e_b) = (g^(b−a) ⊕ 1)⁻¹ is Linux's `raid6_gfexi`.)
//! Every case is one kernel pass: P′ and Q′ never reach memory, so there is no scratch buffer.
//! Two data blocks whose exponents are equal modulo 255 cannot be separated: refused.

use super::gf256::{exponent_mod_order, gf_exp, gf_inv, gf_mul};
use super::stripe::{HornerOrder, StripeShape, common_len};
use super::syndrome::{self, Finish};
use super::{BlockKind, ParityImpl};

impl ParityImpl {
    /// Rebuilds the blocks at indexes `missing` from the others, in place: at most one
    /// without Q, at most two with Q (any two: data, P, Q). The contents of the missing blocks
    /// are ignored. Returns false and changes nothing if that is impossible: too many
    /// missing, an index out of range or repeated, or two data blocks with equal exponents.
    ///
    /// # Panics
    /// If the stripe is malformed (see [`crate::parity::compute_parity`]) or the
    /// implementation is not available.
    pub fn reconstruct(self, blocks: &mut [&mut [u8]], kinds: &[BlockKind], missing: &[usize]) -> bool {
        let shape = StripeShape::of(kinds, blocks.len());
        let len_bytes = common_len(blocks.iter().map(|block| block.len()));
        self.assert_available();

        let max_missing = if shape.q_index.is_some() { 2 } else { 1 };
        if missing.len() > max_missing
            || missing.iter().any(|&index| index >= blocks.len())
            || (missing.len() == 2 && missing[0] == missing[1])
        {
            return false;
        }
        let p_missing = missing.contains(&shape.p_index);
        let q_missing = shape.q_index.is_some_and(|q_index| missing.contains(&q_index));
        // Lost data blocks as (index, exponent mod 255), in the order given.
        let mut lost_data = [(0usize, 0u8); 2];
        let mut lost_data_count = 0;
        for &index in missing {
            if let BlockKind::Data { exponent } = kinds[index] {
                lost_data[lost_data_count] = (index, exponent_mod_order(exponent));
                lost_data_count += 1;
            }
        }
        let lost_data = &lost_data[..lost_data_count];
        if let [(_, exponent_a), (_, exponent_b)] = lost_data
            && exponent_a == exponent_b
        {
            return false;
        }

        // Pointers: sources are surviving data (and P for the XOR-only case), outputs are
        // the missing blocks; all from distinct &mut slices of `blocks`.
        let mut order = HornerOrder::new();
        let mut lost_data_ptrs = [std::ptr::null_mut::<u8>(); 2];
        let mut p = std::ptr::null_mut();
        let mut q = std::ptr::null_mut();
        for (index, (block, kind)) in blocks.iter_mut().zip(kinds).enumerate() {
            match *kind {
                BlockKind::Data { exponent } => {
                    if let Some(slot) = lost_data.iter().position(|&(lost, _)| lost == index) {
                        lost_data_ptrs[slot] = block.as_mut_ptr();
                    } else {
                        order.push(block.as_ptr(), exponent);
                    }
                }
                BlockKind::P => p = block.as_mut_ptr(),
                BlockKind::Q => q = block.as_mut_ptr(),
            }
        }
        let finish = match (lost_data, p_missing, q_missing) {
            ([], false, false) => return true,
            ([], p_missing, q_missing) => Finish::Store {
                p: if p_missing { p } else { std::ptr::null_mut() },
                q: if q_missing { q } else { std::ptr::null_mut() },
            },
            ([_], false, false) => {
                // XOR of P and the surviving data; Q is not involved.
                order.push(p, 0);
                Finish::Store { p: lost_data_ptrs[0], q: std::ptr::null_mut() }
            }
            ([(_, exponent)], true, false) => {
                Finish::RecoverDataAndP { q, out_data: lost_data_ptrs[0], out_p: p, coef_q: gf_inv(gf_exp(*exponent)) }
            }
            ([(_, exponent)], false, true) => {
                Finish::RecoverDataAndQ { p, out_data: lost_data_ptrs[0], out_q: q, coef_data: gf_exp(*exponent) }
            }
            ([(_, exponent_a), (_, exponent_b)], false, false) => {
                let coef_a = gf_exp(*exponent_a);
                let inv_sum = gf_inv(coef_a ^ gf_exp(*exponent_b));
                Finish::RecoverTwoData {
                    p,
                    q,
                    out_a: lost_data_ptrs[0],
                    out_b: lost_data_ptrs[1],
                    coef_p: gf_mul(coef_a, inv_sum),
                    coef_q: inv_sum,
                }
            }
            _ => unreachable!("at most two missing blocks were admitted"),
        };
        debug_assert!(lost_data_ptrs[..lost_data.len()].iter().all(|ptr| !ptr.is_null()));
        let job = order.job(len_bytes, finish);
        // SAFETY: available (asserted); every block is valid for len_bytes (common_len); the
        // outputs are the missing blocks (plus lost P/Q), never sources, and the blocks are
        // distinct &mut slices, so nothing overlaps.
        unsafe { syndrome::run(self, &job) };
        true
    }
}
