//! md's bad-block log (BBL): the on-disk list of a device's bad sectors (`md-format.md` §4.2;
//! the kernel's `super_1_load` / `super_1_sync`).
//!
//! At `super_offset + bblog_offset` (signed sectors), `bblog_size` sectors of little-endian
//! u64 entries: bits 63..10 the first bad unit, bits 9..0 the count (1..=512 units), a unit
//! being `2^bblog_shift` sectors from the start of the device (not from the data offset).
//! An all-ones entry ends the list and fills the rest. The device's `BAD_BLOCKS` feature bit
//! says the list is not empty; without it the kernel does not read the log at all.

use crate::bad_ranges::BadRanges;
use crate::error::{ErrorKind, RaidError};

/// Units one entry can hold (the 10-bit count field holds 1..=512, as the kernel writes).
const MAX_ENTRY_UNITS: u64 = 512;
/// The count field.
const COUNT_MASK: u64 = 0x3ff;

/// Decodes a log image (`bblog_size` sectors) into device sectors.
pub fn decode_bad_blocks(image: &[u8], shift: u8) -> Result<BadRanges, RaidError> {
    let bad = |why: String| RaidError::new(ErrorKind::BadMetadata, format!("bad-block log: {why}"));
    if shift >= 54 {
        return Err(bad(format!("unit shift {shift} is out of range")));
    }
    let mut ranges = BadRanges::default();
    for entry in image.chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes"))) {
        if entry == u64::MAX {
            break;
        }
        let count = entry & COUNT_MASK;
        if count == 0 || count > MAX_ENTRY_UNITS {
            return Err(bad(format!("entry {entry:#x} has a count of {count} units")));
        }
        ranges.add((entry >> 10) << shift, count << shift);
    }
    Ok(ranges)
}

/// Encodes device sectors into a log image of `size_sectors` sectors, rounding each range
/// out to whole units. Fails when the entries do not fit (the kernel then fails the device).
pub fn encode_bad_blocks(ranges: &BadRanges, shift: u8, size_sectors: u16) -> Result<Vec<u8>, RaidError> {
    let len = usize::from(size_sectors) * crate::SECTOR_BYTES as usize;
    let mut image = vec![0xffu8; len];
    let capacity = len / 8;
    let unit = 1u64 << shift;
    let mut n = 0;
    // Rounded out, neighbouring ranges may share a unit: merge them first.
    let units = BadRanges::from_ranges(ranges.ranges().iter().map(|&(s, l)| {
        let first = s >> shift;
        (first, (s + l).div_ceil(unit) - first)
    }));
    for &(first, count) in units.ranges() {
        let mut at = first;
        while at < first + count {
            let c = (first + count - at).min(MAX_ENTRY_UNITS);
            if n == capacity || at >= 1 << 54 {
                return Err(RaidError::new(
                    ErrorKind::Refused,
                    format!("bad-block log full: {capacity} entries of {size_sectors} sectors are not enough"),
                ));
            }
            image[n * 8..n * 8 + 8].copy_from_slice(&(at << 10 | c).to_le_bytes());
            n += 1;
            at += c;
        }
    }
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_in_the_kernels_format() {
        // One entry: 8 sectors from sector 264200 (what `mdadm --examine-badblocks` lists as
        // "264200 for 8 sectors").
        let ranges = BadRanges::from_ranges([(264_200, 8)]);
        let image = encode_bad_blocks(&ranges, 0, 8).unwrap();
        assert_eq!(image.len(), 4096);
        assert_eq!(u64::from_le_bytes(image[..8].try_into().unwrap()), 264_200 << 10 | 8);
        assert!(image[8..].iter().all(|&b| b == 0xff));
        assert_eq!(decode_bad_blocks(&image, 0).unwrap(), ranges);
    }

    #[test]
    fn long_ranges_split_and_units_round_out() {
        let ranges = BadRanges::from_ranges([(1000, 1300), (5000, 1)]);
        let image = encode_bad_blocks(&ranges, 0, 8).unwrap();
        let entries: Vec<u64> = image.chunks(8).map(|b| u64::from_le_bytes(b.try_into().unwrap())).take(4).collect();
        assert_eq!(entries, vec![1000 << 10 | 512, 1512 << 10 | 512, 2024 << 10 | 276, 5000 << 10 | 1]);
        assert_eq!(decode_bad_blocks(&image, 0).unwrap(), ranges);
        // 8-sector units: sectors 5000 and 5001..5003 share unit 625, 1003 rounds to 1000..1008.
        let coarse = encode_bad_blocks(&BadRanges::from_ranges([(1003, 2), (5000, 1), (5001, 2)]), 3, 8).unwrap();
        assert_eq!(decode_bad_blocks(&coarse, 3).unwrap().ranges(), &[(1000, 8), (5000, 8)]);
    }

    #[test]
    fn a_full_log_and_bad_entries_are_refused() {
        let many = BadRanges::from_ranges((0..513).map(|i| (i * 10, 1)));
        assert_eq!(encode_bad_blocks(&many, 0, 8).unwrap_err().kind, ErrorKind::Refused);
        let fits = BadRanges::from_ranges((0..512).map(|i| (i * 10, 1)));
        assert_eq!(decode_bad_blocks(&encode_bad_blocks(&fits, 0, 8).unwrap(), 0).unwrap(), fits);
        let mut zero_count = vec![0xffu8; 512];
        zero_count[..8].copy_from_slice(&(7u64 << 10).to_le_bytes());
        assert!(decode_bad_blocks(&zero_count, 0).is_err());
        assert!(decode_bad_blocks(&[0xff; 512], 0).unwrap().is_empty());
    }
}
