//! [`ParityImpl`]: which instruction set the parity kernels run on.
//!
//! The free functions of [`crate::parity`] use [`ParityImpl::best`], detected once at run
//! time. Tests and benchmarks call the same operations on an explicit implementation (the
//! methods in `ops.rs`/`stripe.rs`) to compare them against each other.

use std::sync::atomic::{AtomicU8, Ordering};

/// A parity kernel implementation. All produce identical bytes; they differ in speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ParityImpl {
    /// Portable Rust: u64 SWAR after Linux `lib/raid6/int.uc` (×4 unrolled), byte loop tails.
    Scalar,
    /// x86-64 AVX2: Linux `avx2.c` doubling, PSHUFB nibble tables for other constants.
    Avx2,
    /// x86-64 AVX-512F/BW: as `Avx2` on 64-byte registers (mask-register reduction).
    Avx512Bw,
    /// x86-64 AVX-512F/BW + GFNI: every constant multiplication is one `vgf2p8affineqb`.
    Avx512Gfni,
}

impl ParityImpl {
    /// Every implementation, available or not.
    pub const ALL: [ParityImpl; 4] =
        [ParityImpl::Scalar, ParityImpl::Avx2, ParityImpl::Avx512Bw, ParityImpl::Avx512Gfni];

    /// Order of preference of [`ParityImpl::best`], fastest first (measured with
    /// `benches/parity.rs`, see the crate README "Parity performance").
    const PREFERENCE: [ParityImpl; 4] =
        [ParityImpl::Avx512Gfni, ParityImpl::Avx512Bw, ParityImpl::Avx2, ParityImpl::Scalar];

    /// Whether this CPU can run the implementation.
    pub fn is_available(self) -> bool {
        match self {
            ParityImpl::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            ParityImpl::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            ParityImpl::Avx512Bw => {
                std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bw")
            }
            #[cfg(target_arch = "x86_64")]
            ParityImpl::Avx512Gfni => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("gfni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The implementations this CPU can run, fastest first.
    pub fn available() -> impl Iterator<Item = ParityImpl> {
        Self::PREFERENCE.into_iter().filter(|imp| imp.is_available())
    }

    /// The fastest available implementation, detected on first use.
    pub fn best() -> ParityImpl {
        static BEST: AtomicU8 = AtomicU8::new(u8::MAX);
        let cached = BEST.load(Ordering::Relaxed);
        if let Some(&imp) = Self::ALL.get(usize::from(cached)) {
            return imp;
        }
        let best = Self::available().next().unwrap_or(ParityImpl::Scalar);
        let index = Self::ALL.iter().position(|&imp| imp == best).unwrap_or(0);
        BEST.store(u8::try_from(index).unwrap_or(0), Ordering::Relaxed);
        best
    }

    /// A short lowercase name ("scalar", "avx2", "avx512bw", "avx512gfni").
    pub fn name(self) -> &'static str {
        match self {
            ParityImpl::Scalar => "scalar",
            ParityImpl::Avx2 => "avx2",
            ParityImpl::Avx512Bw => "avx512bw",
            ParityImpl::Avx512Gfni => "avx512gfni",
        }
    }

    /// Panics unless available: running vector code on a CPU without it would be undefined.
    pub(crate) fn assert_available(self) {
        assert!(self.is_available(), "parity implementation {} is not available on this CPU", self.name());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalar_is_always_available_and_best_is_available() {
        assert!(ParityImpl::Scalar.is_available());
        assert!(ParityImpl::best().is_available());
        assert_eq!(ParityImpl::best(), ParityImpl::best());
        assert_eq!(ParityImpl::available().next(), Some(ParityImpl::best()));
    }

    /// On x86-64 the vector paths must actually be exercised by the tests, or the comparisons
    /// against the scalar path prove nothing. The project's machines have all of them.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_paths_are_available_on_x86_64_with_avx2() {
        if std::arch::is_x86_feature_detected!("avx2") {
            assert!(ParityImpl::available().count() >= 2);
            assert_ne!(ParityImpl::best(), ParityImpl::Scalar);
        }
    }
}
