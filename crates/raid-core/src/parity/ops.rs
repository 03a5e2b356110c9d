//! Block-level operations: `dst ^= src`, `dst ^= g^e·src`, RMW parity updates and the
//! Linux-slot-order syndrome. Each is one kernel pass, no allocation.

use super::gf256::exponent_mod_order;
use super::syndrome::{self, Finish, Job};
use super::{MAX_DATA_BLOCKS, ParityImpl};

impl ParityImpl {
    /// `dst[i] ^= src[i]`.
    ///
    /// # Panics
    /// If the lengths differ or the implementation is not available.
    pub fn xor_into(self, dst: &mut [u8], src: &[u8]) {
        assert_eq!(dst.len(), src.len(), "xor_into: block lengths differ");
        self.assert_available();
        let job = Job {
            sources: &[src.as_ptr()],
            gaps: &[0],
            tail: 0,
            len_bytes: dst.len(),
            finish: Finish::Accumulate { p: dst.as_mut_ptr(), q: std::ptr::null_mut() },
        };
        // SAFETY: available (asserted); src and dst are valid for len_bytes and cannot overlap
        // (a & and a &mut borrow).
        unsafe { syndrome::run(self, &job) };
    }

    /// `dst[i] ^= g^exponent · src[i]`.
    ///
    /// # Panics
    /// If the lengths differ or the implementation is not available.
    pub fn mul_exp_xor_into(self, dst: &mut [u8], src: &[u8], exponent: u8) {
        assert_eq!(dst.len(), src.len(), "mul_exp_xor_into: block lengths differ");
        self.assert_available();
        let job = Job {
            sources: &[src.as_ptr()],
            gaps: &[0],
            tail: exponent_mod_order(exponent),
            len_bytes: dst.len(),
            finish: Finish::Accumulate { p: std::ptr::null_mut(), q: dst.as_mut_ptr() },
        };
        // SAFETY: available (asserted); src and dst are valid for len_bytes and cannot overlap.
        unsafe { syndrome::run(self, &job) };
    }

    /// Read-modify-write update of a stripe's parity when one data block (Q coefficient
    /// g^exponent) changes from `old_data` to `new_data`: `P ^= old ⊕ new` and, if given,
    /// `Q ^= g^exponent·(old ⊕ new)`, in one pass without a delta buffer.
    ///
    /// # Panics
    /// If the lengths differ or the implementation is not available.
    pub fn update_parity(self, p: &mut [u8], q: Option<&mut [u8]>, old_data: &[u8], new_data: &[u8], exponent: u8) {
        let len_bytes = p.len();
        assert_eq!(old_data.len(), len_bytes, "update_parity: block lengths differ");
        assert_eq!(new_data.len(), len_bytes, "update_parity: block lengths differ");
        let q_ptr = match q {
            Some(q) => {
                assert_eq!(q.len(), len_bytes, "update_parity: block lengths differ");
                q.as_mut_ptr()
            }
            None => std::ptr::null_mut(),
        };
        self.assert_available();
        let job = Job {
            sources: &[old_data.as_ptr(), new_data.as_ptr()],
            // Gap 0: q = old ⊕ new before the final g^exponent.
            gaps: &[0, 0],
            tail: exponent_mod_order(exponent),
            len_bytes,
            finish: Finish::Accumulate { p: p.as_mut_ptr(), q: q_ptr },
        };
        // SAFETY: available (asserted); all four blocks are valid for len_bytes; p and q are
        // &mut borrows, so they overlap neither each other nor the & sources.
        unsafe { syndrome::run(self, &job) };
    }

    /// Linux `gen_syndrome`: `p = ⊕ data[i]`, `q = ⊕ g^i·data[i]` for data in md slot order.
    ///
    /// # Panics
    /// If lengths differ, `data.len() > MAX_DATA_BLOCKS`, or the implementation is not available.
    pub fn gen_syndrome(self, data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
        let len_bytes = p.len();
        assert_eq!(q.len(), len_bytes, "gen_syndrome: block lengths differ");
        assert!(data.iter().all(|block| block.len() == len_bytes), "gen_syndrome: block lengths differ");
        assert!(data.len() <= MAX_DATA_BLOCKS, "gen_syndrome: more than {MAX_DATA_BLOCKS} data blocks");
        self.assert_available();
        let mut sources = [std::ptr::null(); MAX_DATA_BLOCKS];
        for (source, block) in sources.iter_mut().zip(data.iter().rev()) {
            *source = block.as_ptr();
        }
        let gaps = [1; MAX_DATA_BLOCKS];
        let job = Job {
            sources: &sources[..data.len()],
            gaps: &gaps[..data.len()],
            tail: 0,
            len_bytes,
            finish: Finish::Store { p: p.as_mut_ptr(), q: q.as_mut_ptr() },
        };
        // SAFETY: available (asserted); every block is valid for len_bytes (asserted); p and q
        // are &mut borrows, disjoint from each other and from the & data.
        unsafe { syndrome::run(self, &job) };
    }
}
