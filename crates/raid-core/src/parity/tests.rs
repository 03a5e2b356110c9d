//! Parity tests: every available implementation against independent oracles (the `gf256`
//! crate's raid6, whose P/Q match Linux md, and a bitwise shift-and-add multiply) and
//! against each other, on odd lengths and misaligned slices.

use proptest::prelude::*;

use super::*;

/// Small deterministic generator for test data (splitmix64).
struct TestRng(u64);

impl TestRng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, bound: usize) -> usize {
        (self.next_u64() % bound as u64) as usize
    }
    fn fill(&mut self, bytes: &mut [u8]) {
        for byte in bytes {
            *byte = self.next_u64() as u8;
        }
    }
}

/// g^exponent by repeated doubling, independent of the exp/log tables.
fn reference_power(exponent: u8) -> u8 {
    (0..exponent).fold(1u8, |x, _| gf_mul2(x))
}

/// (P, Q) by the definition, byte by byte with the bitwise multiply.
fn reference_parity(data: &[&[u8]], exponents: &[u8], len: usize) -> (Vec<u8>, Vec<u8>) {
    let mut p = vec![0u8; len];
    let mut q = vec![0u8; len];
    for (block, &exponent) in data.iter().zip(exponents) {
        let coefficient = reference_power(exponent);
        for i in 0..len {
            p[i] ^= block[i];
            q[i] ^= gf_mul_bitwise(coefficient, block[i]);
        }
    }
    (p, q)
}

/// A stripe whose blocks start `offset` bytes into their own allocation (misaligned).
#[derive(Debug, Clone)]
struct Stripe {
    storage: Vec<Vec<u8>>,
    kinds: Vec<BlockKind>,
    offset: usize,
}

impl Stripe {
    /// `exponents.len()` data blocks of `len` random bytes, P and (if `with_q`) Q, all at
    /// random positions; parity blocks hold garbage until computed.
    fn random(exponents: &[u8], with_q: bool, len: usize, offset: usize, rng: &mut TestRng) -> Stripe {
        let mut kinds: Vec<BlockKind> = exponents.iter().map(|&exponent| BlockKind::Data { exponent }).collect();
        let p_at = rng.below(kinds.len() + 1);
        kinds.insert(p_at, BlockKind::P);
        if with_q {
            let q_at = rng.below(kinds.len() + 1);
            kinds.insert(q_at, BlockKind::Q);
        }
        let storage = kinds
            .iter()
            .map(|_| {
                let mut block = vec![0u8; offset + len];
                rng.fill(&mut block);
                block
            })
            .collect();
        Stripe { storage, kinds, offset }
    }

    fn blocks_mut(&mut self) -> Vec<&mut [u8]> {
        let offset = self.offset;
        self.storage.iter_mut().map(|block| &mut block[offset..]).collect()
    }

    fn compute(&mut self, imp: ParityImpl) {
        let offset = self.offset;
        let mut blocks: Vec<&mut [u8]> = self.storage.iter_mut().map(|block| &mut block[offset..]).collect();
        imp.compute_parity(&mut blocks, &self.kinds);
    }

    fn reconstruct(&mut self, imp: ParityImpl, missing: &[usize]) -> bool {
        let offset = self.offset;
        let mut blocks: Vec<&mut [u8]> = self.storage.iter_mut().map(|block| &mut block[offset..]).collect();
        imp.reconstruct(&mut blocks, &self.kinds, missing)
    }

    fn blocks(&self) -> Vec<&[u8]> {
        self.storage.iter().map(|block| &block[self.offset..]).collect()
    }

    fn index_of(&self, wanted: BlockKind) -> Option<usize> {
        self.kinds.iter().position(|&kind| kind == wanted)
    }

    fn data_and_exponents(&self) -> (Vec<&[u8]>, Vec<u8>) {
        let blocks = self.blocks();
        let mut data = Vec::new();
        let mut exponents = Vec::new();
        for (block, kind) in blocks.into_iter().zip(&self.kinds) {
            if let BlockKind::Data { exponent } = *kind {
                data.push(block);
                exponents.push(exponent);
            }
        }
        (data, exponents)
    }

    /// Asserts P and Q equal the bitwise reference.
    fn assert_parity_is_reference(&self, context: &str) {
        let (data, exponents) = self.data_and_exponents();
        let len = self.storage[0].len() - self.offset;
        let (p, q) = reference_parity(&data, &exponents, len);
        let blocks = self.blocks();
        assert_eq!(blocks[self.index_of(BlockKind::P).unwrap()], &p[..], "P, {context}");
        if let Some(q_index) = self.index_of(BlockKind::Q) {
            assert_eq!(blocks[q_index], &q[..], "Q, {context}");
        }
    }
}

/// `count` distinct exponents mod 255, shuffled; 0 sometimes written as 255 (same element).
fn random_exponents(count: usize, rng: &mut TestRng) -> Vec<u8> {
    let mut pool: Vec<u8> = (0..255).collect();
    for i in (1..pool.len()).rev() {
        pool.swap(i, rng.below(i + 1));
    }
    pool.truncate(count);
    for exponent in &mut pool {
        if *exponent == 0 && rng.below(2) == 0 {
            *exponent = 255;
        }
    }
    pool
}

fn available() -> Vec<ParityImpl> {
    ParityImpl::available().collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// md slot order (exponents 0..m−1): P and Q equal gf256's raid6::format (= Linux md).
    #[test]
    fn compute_parity_matches_gf256_raid6(
        data_count in 2usize..=20, len in 0usize..700, offset in 0usize..8, seed in any::<u64>(),
    ) {
        let mut rng = TestRng(seed);
        let exponents: Vec<u8> = (0..data_count as u8).collect();
        let template = Stripe::random(&exponents, true, len, offset, &mut rng);
        let (data, _) = template.data_and_exponents();
        let mut oracle_p = vec![0u8; len];
        let mut oracle_q = vec![0u8; len];
        ::gf256::raid::raid6::format(&data, &mut oracle_p, &mut oracle_q);
        let p_index = template.index_of(BlockKind::P).unwrap();
        let q_index = template.index_of(BlockKind::Q).unwrap();
        for imp in available() {
            let mut stripe = template.clone();
            stripe.compute(imp);
            prop_assert_eq!(stripe.blocks()[p_index], &oracle_p[..], "P with {:?}", imp);
            prop_assert_eq!(stripe.blocks()[q_index], &oracle_q[..], "Q with {:?}", imp);

            let mut p = vec![0u8; len];
            let mut q = vec![0u8; len];
            imp.gen_syndrome(&data, &mut p, &mut q);
            prop_assert_eq!(&p, &oracle_p, "gen_syndrome P with {:?}", imp);
            prop_assert_eq!(&q, &oracle_q, "gen_syndrome Q with {:?}", imp);
        }
    }

    /// Arbitrary distinct exponents (gaps, any order, 255 ≡ 0), with and without Q.
    #[test]
    fn compute_parity_with_arbitrary_exponents_matches_bitwise_reference(
        data_count in 1usize..=20, len in 0usize..700, offset in 0usize..8, with_q in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let mut rng = TestRng(seed);
        let exponents = random_exponents(data_count, &mut rng);
        let template = Stripe::random(&exponents, with_q, len, offset, &mut rng);
        for imp in available() {
            let mut stripe = template.clone();
            stripe.compute(imp);
            stripe.assert_parity_is_reference(&format!("{imp:?}, exponents {exponents:?}"));
            prop_assert!(imp.parity_matches(&stripe.blocks(), &stripe.kinds));
        }
    }

    /// Every single and double loss the stripe admits is rebuilt exactly, by every
    /// implementation; losses beyond that are refused without touching anything.
    #[test]
    fn reconstruct_restores_every_combination(
        data_count in 2usize..=20, len in 0usize..300, offset in 0usize..8, with_q in any::<bool>(),
        md_exponents in any::<bool>(), seed in any::<u64>(),
    ) {
        let mut rng = TestRng(seed);
        let exponents = if md_exponents { (0..data_count as u8).collect() } else { random_exponents(data_count, &mut rng) };
        let mut original = Stripe::random(&exponents, with_q, len, offset, &mut rng);
        original.compute(ParityImpl::Scalar);
        original.assert_parity_is_reference("scalar");
        let block_count = original.kinds.len();
        let mut losses: Vec<Vec<usize>> = (0..block_count).map(|a| vec![a]).collect();
        for a in 0..block_count {
            for b in 0..block_count {
                if a != b {
                    losses.push(vec![a, b]);
                }
            }
        }
        let imps = available();
        for missing in &losses {
            // Spread the implementations over the losses to keep the run short; each
            // implementation still sees singles, pairs and every kind of loss over the cases.
            let imp = imps[rng.below(imps.len())];
            let mut damaged = original.clone();
            for &index in missing {
                rng.fill(&mut damaged.storage[index]);
                damaged.storage[index][..offset].copy_from_slice(&original.storage[index][..offset]);
            }
            let before = damaged.clone();
            let possible = missing.len() == 1 || with_q;
            let rebuilt = imp.reconstruct(&mut damaged.blocks_mut(), &original.kinds, missing);
            prop_assert_eq!(rebuilt, possible, "{:?} missing {:?} kinds {:?}", imp, missing, original.kinds);
            if possible {
                prop_assert!(damaged.storage == original.storage, "{:?} missing {:?} kinds {:?}", imp, missing, original.kinds);
            } else {
                prop_assert!(damaged.storage == before.storage, "refusal changed blocks: {:?} {:?}", imp, missing);
            }
        }
    }

    /// Flipping one bit anywhere in a consistent stripe is detected.
    #[test]
    fn parity_matches_detects_a_single_flipped_bit(
        data_count in 1usize..=20, len in 1usize..500, with_q in any::<bool>(), seed in any::<u64>(),
        flip_block in any::<prop::sample::Index>(), flip_byte in any::<prop::sample::Index>(), flip_bit in 0u8..8,
    ) {
        let mut rng = TestRng(seed);
        let exponents = random_exponents(data_count, &mut rng);
        let mut stripe = Stripe::random(&exponents, with_q, len, 0, &mut rng);
        stripe.compute(ParityImpl::Scalar);
        let block = flip_block.index(stripe.kinds.len());
        let byte = flip_byte.index(len);
        for imp in available() {
            prop_assert!(imp.parity_matches(&stripe.blocks(), &stripe.kinds), "{:?}", imp);
        }
        stripe.storage[block][byte] ^= 1 << flip_bit;
        for imp in available() {
            prop_assert!(!imp.parity_matches(&stripe.blocks(), &stripe.kinds), "{:?} block {} byte {}", imp, block, byte);
        }
    }
}

#[test]
fn every_bit_flip_of_a_small_stripe_is_detected() {
    let mut rng = TestRng(7);
    let mut stripe = Stripe::random(&[0, 1, 2], true, 67, 3, &mut rng);
    stripe.compute(ParityImpl::Scalar);
    for imp in available() {
        assert!(imp.parity_matches(&stripe.blocks(), &stripe.kinds));
        for block in 0..stripe.kinds.len() {
            for byte in stripe.offset..stripe.storage[block].len() {
                for bit in 0..8 {
                    stripe.storage[block][byte] ^= 1 << bit;
                    assert!(!imp.parity_matches(&stripe.blocks(), &stripe.kinds), "{imp:?} {block} {byte} {bit}");
                    stripe.storage[block][byte] ^= 1 << bit;
                }
            }
        }
    }
}

/// Lengths 0..=300 and a few long odd ones, every start offset 0..8: each implementation
/// gives the scalar path's bytes for every operation (bulk, single-vector, u64 and byte tails).
#[test]
fn implementations_agree_on_odd_lengths_and_misaligned_slices() {
    let mut rng = TestRng(11);
    let lengths: Vec<usize> = (0..=300).chain([511, 4096 + 37, 65536 + 255]).collect();
    for &len in &lengths {
        let offset = len % 8;
        let exponents = if len % 2 == 0 { vec![0, 1, 2, 3, 4] } else { random_exponents(5, &mut rng) };
        let template = Stripe::random(&exponents, true, len, offset, &mut rng);
        let mut scalar = template.clone();
        ParityImpl::Scalar.compute_parity(&mut scalar.blocks_mut(), &template.kinds);
        scalar.assert_parity_is_reference(&format!("len {len}"));
        let exponent = rng.next_u64() as u8;
        let (dst, src) = (&template.blocks()[0].to_vec(), &template.blocks()[1].to_vec());
        let mut scalar_xor = dst.clone();
        ParityImpl::Scalar.xor_into(&mut scalar_xor, src);
        let mut scalar_mul = dst.clone();
        ParityImpl::Scalar.mul_exp_xor_into(&mut scalar_mul, src, exponent);
        for imp in available() {
            let mut stripe = template.clone();
            imp.compute_parity(&mut stripe.blocks_mut(), &template.kinds);
            assert!(stripe.storage == scalar.storage, "{imp:?} compute_parity len {len}");
            let data_index = stripe.kinds.iter().position(|kind| matches!(kind, BlockKind::Data { .. })).unwrap();
            let missing = [data_index, stripe.index_of(BlockKind::Q).unwrap()];
            stripe.storage[missing[0]][offset..].fill(0xa5);
            stripe.storage[missing[1]][offset..].fill(0x5a);
            assert!(imp.reconstruct(&mut stripe.blocks_mut(), &template.kinds, &missing));
            assert!(stripe.storage == scalar.storage, "{imp:?} reconstruct len {len}");

            let mut xor = dst.clone();
            imp.xor_into(&mut xor, src);
            assert_eq!(xor, scalar_xor, "{imp:?} xor_into len {len}");
            let mut mul = dst.clone();
            imp.mul_exp_xor_into(&mut mul, src, exponent);
            assert_eq!(mul, scalar_mul, "{imp:?} mul_exp_xor_into len {len}");
        }
    }
}

/// All 256 exponents (hence every non-zero constant) on a buffer holding every byte value
/// several times over, long enough for the unrolled vector loop.
#[test]
fn mul_exp_xor_into_matches_bitwise_for_every_exponent() {
    let len = 1024 + 77;
    let src: Vec<u8> = (0..len).map(|i| (i * 7 + i / 256) as u8).collect();
    let dst: Vec<u8> = (0..len).map(|i| (i * 13) as u8).collect();
    for exponent in 0..=255u8 {
        let coefficient = reference_power(exponent);
        let expected: Vec<u8> = dst.iter().zip(&src).map(|(&d, &s)| d ^ gf_mul_bitwise(coefficient, s)).collect();
        for imp in available() {
            let mut out = dst.clone();
            imp.mul_exp_xor_into(&mut out, &src, exponent);
            assert_eq!(out, expected, "{imp:?} exponent {exponent}");
        }
    }
}

#[test]
fn xor_into_xors() {
    let src: Vec<u8> = (0..1000).map(|i| (i * 31) as u8).collect();
    let dst: Vec<u8> = (0..1000).map(|i| (i * 17 + 3) as u8).collect();
    let expected: Vec<u8> = dst.iter().zip(&src).map(|(a, b)| a ^ b).collect();
    for imp in available() {
        let mut out = dst.clone();
        imp.xor_into(&mut out, &src);
        assert_eq!(out, expected, "{imp:?}");
    }
    let mut out = dst.clone();
    xor_into(&mut out, &src);
    assert_eq!(out, expected);
}

#[test]
fn update_parity_equals_recomputing() {
    let mut rng = TestRng(5);
    for imp in available() {
        for with_q in [false, true] {
            let exponents = [3, 9, 200];
            let mut stripe = Stripe::random(&exponents, with_q, 777, 1, &mut rng);
            stripe.compute(imp);
            let changed = stripe.kinds.iter().position(|&kind| kind == BlockKind::Data { exponent: 200 }).unwrap();
            let old_data = stripe.blocks()[changed].to_vec();
            let mut new_data = vec![0u8; old_data.len()];
            rng.fill(&mut new_data);
            stripe.storage[changed][1..].copy_from_slice(&new_data);
            let p_index = stripe.index_of(BlockKind::P).unwrap();
            let q_index = stripe.index_of(BlockKind::Q);
            let mut p = stripe.blocks()[p_index].to_vec();
            let mut q = q_index.map(|q_index| stripe.blocks()[q_index].to_vec());
            imp.update_parity(&mut p, q.as_deref_mut(), &old_data, &new_data, 200);
            stripe.storage[p_index][1..].copy_from_slice(&p);
            if let (Some(q_index), Some(q)) = (q_index, q) {
                stripe.storage[q_index][1..].copy_from_slice(&q);
            }
            stripe.assert_parity_is_reference(&format!("{imp:?} with_q {with_q}"));
        }
    }
}

#[test]
fn stripe_without_data_has_zero_parity() {
    for imp in available() {
        let mut p = [0xffu8; 100];
        let mut q = [0xeeu8; 100];
        imp.compute_parity(&mut [&mut p[..], &mut q[..]], &[BlockKind::P, BlockKind::Q]);
        assert!(p.iter().chain(&q).all(|&byte| byte == 0), "{imp:?}");
    }
}

#[test]
fn empty_blocks_are_fine() {
    let mut d = [0u8; 0];
    let mut p = [0u8; 0];
    let mut q = [0u8; 0];
    let kinds = [BlockKind::Data { exponent: 0 }, BlockKind::P, BlockKind::Q];
    compute_parity(&mut [&mut d[..], &mut p[..], &mut q[..]], &kinds);
    assert!(parity_matches(&[&d[..], &p[..], &q[..]], &kinds));
    assert!(reconstruct(&mut [&mut d[..], &mut p[..], &mut q[..]], &kinds, &[0, 2]));
}

/// Returns false and leaves every byte alone for each kind of impossible request.
#[test]
fn reconstruct_refuses_impossible_requests_without_changing_anything() {
    let mut rng = TestRng(3);
    let cases: [(&[u8], bool, &[usize]); 7] = [
        (&[0, 1, 2], false, &[0, 1]),   // two lost without Q
        (&[0, 1, 2], true, &[0, 1, 2]), // three lost
        (&[0, 1, 2], true, &[5]),       // out of range (5 blocks: 0..5)
        (&[0, 1, 2], true, &[1, 9]),    // one of two out of range
        (&[0, 1, 2], true, &[1, 1]),    // duplicate
        (&[0, 255, 2], true, &[0, 1]),  // g^0 == g^255: cannot be told apart
        (&[7, 7, 2], true, &[0, 1]),    // equal exponents
    ];
    for (exponents, with_q, wanted) in cases {
        for imp in available() {
            let mut stripe = Stripe::random(exponents, with_q, 129, 0, &mut rng);
            stripe.compute(imp);
            // Map data positions 0, 1 to the blocks holding exponents[0], exponents[1].
            let data_positions: Vec<usize> = stripe
                .kinds
                .iter()
                .enumerate()
                .filter(|(_, kind)| matches!(kind, BlockKind::Data { .. }))
                .map(|(index, _)| index)
                .collect();
            let missing: Vec<usize> = wanted.iter().map(|&w| if w < 2 { data_positions[w] } else { w }).collect();
            let before = stripe.clone();
            assert!(!stripe.reconstruct(imp, &missing), "{imp:?} {exponents:?} with_q {with_q} missing {missing:?}");
            assert!(stripe.storage == before.storage);
        }
    }
    // Nothing missing is trivially fine.
    let mut stripe = Stripe::random(&[0, 1], true, 10, 0, &mut rng);
    assert!(stripe.reconstruct(ParityImpl::best(), &[]));
}

#[test]
#[should_panic(expected = "without a P block")]
fn stripe_without_p_panics() {
    let mut d = [1u8; 4];
    let mut q = [0u8; 4];
    compute_parity(&mut [&mut d[..], &mut q[..]], &[BlockKind::Data { exponent: 0 }, BlockKind::Q]);
}

#[test]
#[should_panic(expected = "more than one P")]
fn stripe_with_two_p_panics() {
    let mut d = [1u8; 4];
    let mut p = [0u8; 4];
    let mut p2 = [0u8; 4];
    compute_parity(
        &mut [&mut d[..], &mut p[..], &mut p2[..]],
        &[BlockKind::Data { exponent: 0 }, BlockKind::P, BlockKind::P],
    );
}

#[test]
#[should_panic(expected = "different lengths")]
fn blocks_of_different_lengths_panic() {
    let mut d = [1u8; 4];
    let mut p = [0u8; 5];
    compute_parity(&mut [&mut d[..], &mut p[..]], &[BlockKind::Data { exponent: 0 }, BlockKind::P]);
}

#[test]
#[should_panic(expected = "lengths differ")]
fn xor_into_different_lengths_panics() {
    xor_into(&mut [0u8; 3], &[0u8; 4]);
}

/// The largest stripe: 255 data blocks with every exponent, P and Q.
#[test]
fn maximal_stripe_round_trips() {
    let mut rng = TestRng(13);
    let exponents: Vec<u8> = (0..255).rev().collect();
    let mut stripe = Stripe::random(&exponents, true, 70, 0, &mut rng);
    for imp in available() {
        stripe.compute(imp);
        stripe.assert_parity_is_reference(&format!("{imp:?}"));
        let original = stripe.clone();
        let data_positions: Vec<usize> =
            (0..stripe.kinds.len()).filter(|&i| matches!(stripe.kinds[i], BlockKind::Data { .. })).collect();
        let missing = [data_positions[17], data_positions[200]];
        stripe.storage[missing[0]].fill(0);
        stripe.storage[missing[1]].fill(0);
        assert!(stripe.reconstruct(imp, &missing));
        assert!(stripe.storage == original.storage, "{imp:?}");
    }
}
