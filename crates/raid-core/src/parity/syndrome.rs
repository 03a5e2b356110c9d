//! The one parity kernel: P and Q syndromes of a list of sources by Horner's rule, in a
//! single pass over memory, with the result handed to a [`Sink`] still in registers.
//!
//! ```text
//!  sources, by descending exponent     per column of 4 registers    Finish (what the caller wants)
//!  S0 ──┐                              p = ⊕ S_k                    Store       P = p, Q = q
//!  S1 ──┼────────────────────────────▶ q = g^gap·q ⊕ S_k ─────────▶ Accumulate  P ^= p, Q ^= q
//!  …  ──┘                              q = g^tail·q                 Check       P == p, Q == q
//!                                                                   Recover*    lost blocks from p, q, P, Q
//! ```
//!
//! With exponents 0..m−1 the gaps are all 1 and this is exactly Linux `lib/raid6/int.uc`
//! (`q = 2·q ⊕ D` from the highest slot down). Gaps > 1 (DDF layouts, missing sources) cost
//! one multiplication by g^gap; exponents are taken modulo 255.
//!
//! Every instruction set compiles the same generic code: [`run`] picks the entry point with
//! the right `#[target_feature]`, which processes the bulk with unrolled vectors and the tail
//! with narrower lanes (vector, u64, byte), so any length works and nothing is allocated.

use super::ParityImpl;
use super::gf256::gf_exp;
use super::lanes::Lanes;

/// What to do with the syndromes `p`, `q` of the sources, per byte.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Finish {
    /// `P = p`, `Q = q`; a null pointer means "not wanted".
    Store { p: *mut u8, q: *mut u8 },
    /// `P ^= p`, `Q ^= q`; a null pointer means "not wanted".
    Accumulate { p: *mut u8, q: *mut u8 },
    /// Whether `P == p` (and `Q == q` unless `q` is null).
    Check { p: *const u8, q: *const u8 },
    /// Two data blocks a, b lost: with Δp = P ⊕ p, Δq = Q ⊕ q,
    /// `D_b = coef_p·Δp ⊕ coef_q·Δq`, `D_a = Δp ⊕ D_b` (Linux `raid6_2data_recov`).
    RecoverTwoData { p: *const u8, q: *const u8, out_a: *mut u8, out_b: *mut u8, coef_p: u8, coef_q: u8 },
    /// Data block a and P lost: `D_a = coef_q·(Q ⊕ q)`, `P = p ⊕ D_a` (Linux `raid6_datap_recov`).
    RecoverDataAndP { q: *const u8, out_data: *mut u8, out_p: *mut u8, coef_q: u8 },
    /// Data block a and Q lost: `D_a = P ⊕ p`, `Q = q ⊕ coef_data·D_a`.
    RecoverDataAndQ { p: *const u8, out_data: *mut u8, out_q: *mut u8, coef_data: u8 },
}

/// One pass of the kernel over `len_bytes` bytes.
#[derive(Debug)]
pub(crate) struct Job<'a> {
    /// Source blocks in Horner order: descending exponent (any order if Q is not needed).
    pub sources: &'a [*const u8],
    /// `gaps[k]` = exponent of `sources[k-1]` − exponent of `sources[k]`, in 0..255;
    /// `gaps[0]` is unused. Same length as `sources`.
    pub gaps: &'a [u8],
    /// Exponent of the last source (the final multiplier of q), in 0..255.
    pub tail: u8,
    pub len_bytes: usize,
    pub finish: Finish,
}

/// Runs `job` with the implementation `imp`; returns false only for a failed `Check`.
///
/// # Safety
/// - `imp.is_available()`.
/// - Every source pointer is valid for reading `len_bytes` bytes; every output pointer of
///   `finish` (non-null) is valid for writing `len_bytes` bytes and overlaps neither a source
///   nor another pointer of `finish`; input pointers of `finish` are valid for reading.
pub(crate) unsafe fn run(imp: ParityImpl, job: &Job<'_>) -> bool {
    debug_assert!(imp.is_available());
    // The kernel indexes gaps by source index without bounds checks.
    assert_eq!(job.sources.len(), job.gaps.len());
    debug_assert!(job.tail < 255 && job.gaps.iter().all(|&gap| gap < 255));
    match imp {
        // SAFETY: u64 needs no CPU features; pointers per caller contract.
        ParityImpl::Scalar => unsafe { run_lanes::<u64, 4>(job) },
        // SAFETY: avx2 was detected (is_available, caller contract); pointers per caller contract.
        #[cfg(target_arch = "x86_64")]
        ParityImpl::Avx2 => unsafe { x86::run_avx2(job) },
        // SAFETY: avx512f/bw were detected (is_available, caller contract); pointers per caller contract.
        #[cfg(target_arch = "x86_64")]
        ParityImpl::Avx512Bw => unsafe { x86::run_avx512bw(job) },
        // SAFETY: avx512f/bw and gfni were detected (is_available); pointers per caller contract.
        #[cfg(target_arch = "x86_64")]
        ParityImpl::Avx512Gfni => unsafe { x86::run_avx512gfni(job) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("{imp:?} is not available on this architecture"),
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::simd_x86::{Avx2, Avx512Bw, Avx512Gfni};
    use super::{Job, run_lanes};

    /// # Safety
    /// avx2 present; pointers as for [`super::run`].
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn run_avx2(job: &Job<'_>) -> bool {
        // SAFETY: this function's features are those of Avx2; pointers per this function's contract.
        unsafe { run_lanes::<Avx2, 4>(job) }
    }

    /// # Safety
    /// avx512f + avx512bw present; pointers as for [`super::run`].
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn run_avx512bw(job: &Job<'_>) -> bool {
        // SAFETY: this function's features are those of Avx512Bw; pointers per this function's contract.
        unsafe { run_lanes::<Avx512Bw, 4>(job) }
    }

    /// # Safety
    /// avx512f + avx512bw + gfni present; pointers as for [`super::run`].
    #[target_feature(enable = "avx512f,avx512bw,gfni")]
    pub(super) unsafe fn run_avx512gfni(job: &Job<'_>) -> bool {
        // SAFETY: this function's features are those of Avx512Gfni; pointers per this function's contract.
        unsafe { run_lanes::<Avx512Gfni, 4>(job) }
    }
}

/// The whole job with lanes `L`: unrolled ×`U` for the bulk, then one `L`, then u64, then
/// bytes for the tail. Inlined into each `#[target_feature]` entry point.
///
/// # Safety
/// As for [`run`], plus the [`Lanes`] contract for `L` (the CPU has its features).
#[inline(always)]
unsafe fn run_lanes<L: Lanes, const U: usize>(job: &Job<'_>) -> bool {
    let unit_gaps = job.gaps.iter().skip(1).all(|&gap| gap == 1);
    let mut offset = 0;
    let mut ok = true;
    // SAFETY: run()'s contract (pointers valid for len_bytes, CPU features of L) is passed on;
    // each pass only touches [offset, len_bytes).
    unsafe {
        if unit_gaps {
            ok &= pass::<L, U, true>(job, &mut offset);
        } else {
            ok &= pass::<L, U, false>(job, &mut offset);
        }
        ok &= pass::<L, 1, false>(job, &mut offset);
        ok &= pass::<u64, 1, false>(job, &mut offset);
        ok &= pass::<u8, 1, false>(job, &mut offset);
    }
    debug_assert_eq!(offset, job.len_bytes);
    ok
}

/// Processes columns of `U * L::BYTES` bytes from `*offset` while they fit, advancing it.
///
/// # Safety
/// As for [`run`], plus the [`Lanes`] contract for `L`.
#[inline(always)]
unsafe fn pass<L: Lanes, const U: usize, const UNIT_GAPS: bool>(job: &Job<'_>, offset: &mut usize) -> bool {
    // SAFETY: the caller guarantees L's CPU features and the pointer contract;
    // every access is at byte offset < len_bytes (the loop condition), within each block.
    unsafe {
        match job.finish {
            Finish::Store { p, q } => match (p.is_null(), q.is_null()) {
                (false, false) => horner::<L, _, U, UNIT_GAPS>(job, offset, &mut Store::<true, true> { p, q }),
                (false, true) => horner::<L, _, U, UNIT_GAPS>(job, offset, &mut Store::<true, false> { p, q }),
                (true, false) => horner::<L, _, U, UNIT_GAPS>(job, offset, &mut Store::<false, true> { p, q }),
                (true, true) => unreachable!("Store with nothing to store"),
            },
            Finish::Accumulate { p, q } => match (p.is_null(), q.is_null()) {
                (false, false) => horner::<L, _, U, UNIT_GAPS>(job, offset, &mut Accumulate::<true, true> { p, q }),
                (false, true) => horner::<L, _, U, UNIT_GAPS>(job, offset, &mut Accumulate::<true, false> { p, q }),
                (true, false) => horner::<L, _, U, UNIT_GAPS>(job, offset, &mut Accumulate::<false, true> { p, q }),
                (true, true) => unreachable!("Accumulate with nothing to accumulate"),
            },
            Finish::Check { p, q } => {
                if q.is_null() {
                    let mut sink = Check::<L, false> { p, q, diff: L::zero() };
                    horner::<L, _, U, UNIT_GAPS>(job, offset, &mut sink);
                    sink.diff.is_zero()
                } else {
                    let mut sink = Check::<L, true> { p, q, diff: L::zero() };
                    horner::<L, _, U, UNIT_GAPS>(job, offset, &mut sink);
                    sink.diff.is_zero()
                }
            }
            Finish::RecoverTwoData { p, q, out_a, out_b, coef_p, coef_q } => {
                let mut sink =
                    RecoverTwoData::<L> { p, q, out_a, out_b, coef_p: L::coef(coef_p), coef_q: L::coef(coef_q) };
                horner::<L, _, U, UNIT_GAPS>(job, offset, &mut sink)
            }
            Finish::RecoverDataAndP { q, out_data, out_p, coef_q } => {
                let mut sink = RecoverDataAndP::<L> { q, out_data, out_p, coef_q: L::coef(coef_q) };
                horner::<L, _, U, UNIT_GAPS>(job, offset, &mut sink)
            }
            Finish::RecoverDataAndQ { p, out_data, out_q, coef_data } => {
                let mut sink = RecoverDataAndQ::<L> { p, out_data, out_q, coef_data: L::coef(coef_data) };
                horner::<L, _, U, UNIT_GAPS>(job, offset, &mut sink)
            }
        }
    }
}

/// The Horner loop. Returns true (the `Check` result is read from the sink by the caller).
///
/// # Safety
/// As for [`pass`].
#[inline(always)]
unsafe fn horner<L: Lanes, S: Sink<L>, const U: usize, const UNIT_GAPS: bool>(
    job: &Job<'_>,
    offset: &mut usize,
    sink: &mut S,
) -> bool {
    let column_bytes = U * L::BYTES;
    let sources = job.sources;
    // SAFETY: L's CPU features per the caller; all loads/stores are at
    // off + u·BYTES with off + column_bytes <= len_bytes, inside blocks valid for len_bytes.
    unsafe {
        let tail_coef = L::coef(gf_exp(job.tail));
        let mut off = *offset;
        while off + column_bytes <= job.len_bytes {
            let mut p = [L::zero(); U];
            let mut q = [L::zero(); U];
            if let Some(first) = sources.first() {
                for u in 0..U {
                    p[u] = L::load(first.add(off + u * L::BYTES));
                    q[u] = p[u];
                }
            }
            for k in 1..sources.len() {
                let source = *sources.get_unchecked(k);
                let mut d = [L::zero(); U];
                for u in 0..U {
                    d[u] = L::load(source.add(off + u * L::BYTES));
                    p[u] = p[u].xor(d[u]);
                }
                if S::NEEDS_Q {
                    if UNIT_GAPS {
                        for u in 0..U {
                            q[u] = q[u].mul2().xor(d[u]);
                        }
                    } else {
                        match *job.gaps.get_unchecked(k) {
                            0 => {
                                for u in 0..U {
                                    q[u] = q[u].xor(d[u]);
                                }
                            }
                            1 => {
                                for u in 0..U {
                                    q[u] = q[u].mul2().xor(d[u]);
                                }
                            }
                            gap => {
                                let coef = L::coef(gf_exp(gap));
                                for u in 0..U {
                                    q[u] = q[u].mul(coef).xor(d[u]);
                                }
                            }
                        }
                    }
                }
            }
            if S::NEEDS_Q && job.tail != 0 {
                for lane in &mut q {
                    *lane = lane.mul(tail_coef);
                }
            }
            for u in 0..U {
                sink.put(off + u * L::BYTES, p[u], q[u]);
            }
            off += column_bytes;
        }
        *offset = off;
    }
    true
}

/// Consumes the syndromes of one register's worth of bytes at `off`.
///
/// # Safety (of `put`)
/// The [`Lanes`] contract for `L`; the sink's pointers are valid at `off..off + L::BYTES`.
trait Sink<L: Lanes> {
    /// Whether `q` is used; if not, the kernel skips computing it.
    const NEEDS_Q: bool;
    unsafe fn put(&mut self, off: usize, p: L, q: L);
}

struct Store<const P: bool, const Q: bool> {
    p: *mut u8,
    q: *mut u8,
}

impl<L: Lanes, const P: bool, const Q: bool> Sink<L> for Store<P, Q> {
    const NEEDS_Q: bool = Q;
    #[inline(always)]
    unsafe fn put(&mut self, off: usize, p: L, q: L) {
        // SAFETY: Sink contract (features, pointers valid at off).
        unsafe {
            if P {
                p.store(self.p.add(off));
            }
            if Q {
                q.store(self.q.add(off));
            }
        }
    }
}

struct Accumulate<const P: bool, const Q: bool> {
    p: *mut u8,
    q: *mut u8,
}

impl<L: Lanes, const P: bool, const Q: bool> Sink<L> for Accumulate<P, Q> {
    const NEEDS_Q: bool = Q;
    #[inline(always)]
    unsafe fn put(&mut self, off: usize, p: L, q: L) {
        // SAFETY: Sink contract (features, pointers valid at off).
        unsafe {
            if P {
                let at = self.p.add(off);
                L::load(at).xor(p).store(at);
            }
            if Q {
                let at = self.q.add(off);
                L::load(at).xor(q).store(at);
            }
        }
    }
}

struct Check<L, const Q: bool> {
    p: *const u8,
    q: *const u8,
    /// OR of all differences; zero while everything matches.
    diff: L,
}

impl<L: Lanes, const Q: bool> Sink<L> for Check<L, Q> {
    const NEEDS_Q: bool = Q;
    #[inline(always)]
    unsafe fn put(&mut self, off: usize, p: L, q: L) {
        // SAFETY: Sink contract (features, pointers valid at off).
        unsafe {
            self.diff = self.diff.or(L::load(self.p.add(off)).xor(p));
            if Q {
                self.diff = self.diff.or(L::load(self.q.add(off)).xor(q));
            }
        }
    }
}

struct RecoverTwoData<L: Lanes> {
    p: *const u8,
    q: *const u8,
    out_a: *mut u8,
    out_b: *mut u8,
    coef_p: L::Coef,
    coef_q: L::Coef,
}

impl<L: Lanes> Sink<L> for RecoverTwoData<L> {
    const NEEDS_Q: bool = true;
    #[inline(always)]
    unsafe fn put(&mut self, off: usize, p: L, q: L) {
        // SAFETY: Sink contract (features, pointers valid at off).
        unsafe {
            let delta_p = L::load(self.p.add(off)).xor(p);
            let delta_q = L::load(self.q.add(off)).xor(q);
            let data_b = delta_p.mul(self.coef_p).xor(delta_q.mul(self.coef_q));
            data_b.store(self.out_b.add(off));
            delta_p.xor(data_b).store(self.out_a.add(off));
        }
    }
}

struct RecoverDataAndP<L: Lanes> {
    q: *const u8,
    out_data: *mut u8,
    out_p: *mut u8,
    coef_q: L::Coef,
}

impl<L: Lanes> Sink<L> for RecoverDataAndP<L> {
    const NEEDS_Q: bool = true;
    #[inline(always)]
    unsafe fn put(&mut self, off: usize, p: L, q: L) {
        // SAFETY: Sink contract (features, pointers valid at off).
        unsafe {
            let data = L::load(self.q.add(off)).xor(q).mul(self.coef_q);
            data.store(self.out_data.add(off));
            p.xor(data).store(self.out_p.add(off));
        }
    }
}

struct RecoverDataAndQ<L: Lanes> {
    p: *const u8,
    out_data: *mut u8,
    out_q: *mut u8,
    coef_data: L::Coef,
}

impl<L: Lanes> Sink<L> for RecoverDataAndQ<L> {
    const NEEDS_Q: bool = true;
    #[inline(always)]
    unsafe fn put(&mut self, off: usize, p: L, q: L) {
        // SAFETY: Sink contract (features, pointers valid at off).
        unsafe {
            let data = L::load(self.p.add(off)).xor(p);
            data.store(self.out_data.add(off));
            q.xor(data.mul(self.coef_data)).store(self.out_q.add(off));
        }
    }
}
