//! The v1.x superblock checksum, `calc_sb_1_csum` (kernel `md.c`, mdadm `super1.c`; `md-format.md` §1.6).
//!
//! Sum of every little-endian u32 word of the first `256 + 2·max_dev` bytes (with the `sb_csum`
//! field taken as zero) into a 64-bit accumulator, plus the trailing LE u16 when `max_dev` is odd,
//! then folded once: `(acc & 0xffff_ffff) + (acc >> 32)`, truncated to 32 bits. There is no second
//! end-around carry: a fold that itself carries loses the carry, exactly like the C code.

/// Byte offset of `sb_csum` inside the superblock.
pub const SB_CSUM_OFFSET: usize = 216;

/// Computes the checksum md stores at byte 216 for a superblock with `max_dev` role entries.
///
/// # Panics
/// If `sb_bytes` is shorter than `256 + 2·max_dev` bytes (callers check lengths first).
pub fn sb_checksum(sb_bytes: &[u8], max_dev: u32) -> u32 {
    let len_bytes = 256 + 2 * max_dev as usize;
    assert!(sb_bytes.len() >= len_bytes, "superblock buffer of {} bytes, checksum needs {len_bytes}", sb_bytes.len());
    let covered = &sb_bytes[..len_bytes];
    let mut acc: u64 = 0;
    let mut words = covered.chunks_exact(4);
    for (i, word) in words.by_ref().enumerate() {
        if i * 4 == SB_CSUM_OFFSET {
            continue; // sb_csum counts as zero
        }
        acc += u64::from(u32::from_le_bytes([word[0], word[1], word[2], word[3]]));
    }
    let tail = words.remainder();
    debug_assert!(tail.is_empty() || tail.len() == 2);
    if tail.len() == 2 {
        acc += u64::from(u16::from_le_bytes([tail[0], tail[1]]));
    }
    // One fold, truncated: `csum = (newcsum & 0xffffffff) + (newcsum >> 32)` into a u32.
    ((acc & 0xffff_ffff) + (acc >> 32)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A direct transcription of the C loop, as an oracle.
    fn reference(sb: &[u8], max_dev: u32) -> u32 {
        let mut copy = sb.to_vec();
        copy[SB_CSUM_OFFSET..SB_CSUM_OFFSET + 4].fill(0);
        let mut size = 256 + max_dev as i64 * 2;
        let mut pos = 0usize;
        let mut newcsum: u64 = 0;
        while size >= 4 {
            newcsum += u64::from(u32::from_le_bytes(copy[pos..pos + 4].try_into().unwrap()));
            pos += 4;
            size -= 4;
        }
        if size == 2 {
            newcsum += u64::from(u16::from_le_bytes(copy[pos..pos + 2].try_into().unwrap()));
        }
        ((newcsum & 0xffffffff) + (newcsum >> 32)) as u32
    }

    #[test]
    fn ignores_the_stored_checksum_and_bytes_beyond_max_dev() {
        let mut sb = vec![0x5au8; 4096];
        let before = sb_checksum(&sb, 128);
        sb[SB_CSUM_OFFSET..SB_CSUM_OFFSET + 4].copy_from_slice(&0xdead_beefu32.to_le_bytes());
        sb[256 + 256..].fill(0x77);
        assert_eq!(sb_checksum(&sb, 128), before);
        assert_eq!(before, reference(&sb, 128));
    }

    #[test]
    fn odd_max_dev_adds_the_trailing_u16() {
        let mut sb = vec![0u8; 4096];
        // Only the last role entry of an odd table is non-zero: it must count as a u16.
        sb[256 + 2 * 4..256 + 2 * 5].copy_from_slice(&0xabcdu16.to_le_bytes());
        assert_eq!(sb_checksum(&sb, 5), 0xabcd);
        // With max_dev 4 the entry is outside the covered area.
        assert_eq!(sb_checksum(&sb, 4), 0);
    }

    #[test]
    fn single_fold_drops_the_second_carry() {
        // All ones: 64 words of 0xffffffff minus the csum word, then the fold itself carries.
        let sb = vec![0xffu8; 4096];
        assert_eq!(sb_checksum(&sb, 0), reference(&sb, 0));
        assert_eq!(sb_checksum(&sb, 1919), reference(&sb, 1919));
        assert_eq!(sb_checksum(&sb, 1920), reference(&sb, 1920));
    }

    #[test]
    fn matches_reference_on_pseudo_random_buffers() {
        let mut state = 0x1234_5678_9abc_def0u64;
        for max_dev in [0u32, 1, 2, 3, 127, 128, 129, 384, 1919, 1920] {
            let sb: Vec<u8> = (0..4096)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            assert_eq!(sb_checksum(&sb, max_dev), reference(&sb, max_dev), "max_dev {max_dev}");
        }
    }
}
