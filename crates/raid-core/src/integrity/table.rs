//! The checksum table in memory: one stamp per covered block, and which 4 KiB pages of it
//! changed since they were last written.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::area::BLOCK_BYTES;

/// Stamps per table page.
const STAMPS_PER_PAGE: u64 = BLOCK_BYTES / 4;

static ZERO_BLOCK_CRC: LazyLock<u32> = LazyLock::new(|| crc32c::crc32c(&[0u8; BLOCK_BYTES as usize]));

/// The stamp of one 4 KiB block: its CRC-32C, XORed with that of a zero block (so zeros
/// stamp 0 and a sparse table matches sparse data).
pub fn stamp(block: &[u8]) -> u32 {
    debug_assert_eq!(block.len() as u64, BLOCK_BYTES);
    crc32c::crc32c(block) ^ *ZERO_BLOCK_CRC
}

const _: () = assert!(STAMPS_PER_PAGE * 4 == BLOCK_BYTES);

pub(super) struct ChecksumTable {
    stamps: Vec<AtomicU32>,
    /// One bit per page: changed since written.
    dirty: Vec<AtomicU64>,
}

impl ChecksumTable {
    /// A table of `blocks` zero stamps (blocks of zeros), none of it changed.
    pub fn zeroed(blocks: u64) -> Self {
        let pages = blocks.div_ceil(STAMPS_PER_PAGE);
        ChecksumTable {
            stamps: (0..blocks).map(|_| AtomicU32::new(0)).collect(),
            dirty: (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Takes the stamps stored in `bytes` (little-endian, as on the member) from `first_block`
    /// on, as they are (not marked changed); stamps past the table's end are ignored.
    pub fn load(&self, first_block: u64, bytes: &[u8]) {
        for (stamp, cell) in bytes.chunks_exact(4).zip(self.stamps.iter().skip(first_block as usize)) {
            cell.store(u32::from_le_bytes(stamp.try_into().expect("4 bytes")), Ordering::Relaxed);
        }
    }

    pub fn blocks(&self) -> u64 {
        self.stamps.len() as u64
    }

    pub fn get(&self, block: u64) -> u32 {
        self.stamps[block as usize].load(Ordering::Acquire)
    }

    /// Sets a stamp; its page is written at the next [`take_dirty`](Self::take_dirty).
    pub fn set(&self, block: u64, stamp: u32) {
        if self.stamps[block as usize].swap(stamp, Ordering::AcqRel) != stamp {
            let page = block / STAMPS_PER_PAGE;
            self.dirty[(page / 64) as usize].fetch_or(1 << (page % 64), Ordering::AcqRel);
        }
    }

    /// The pages changed since the last call, ascending; they count as clean from here on
    /// (a stamp set later marks its page again).
    pub fn take_dirty(&self) -> Vec<u64> {
        let mut pages = Vec::new();
        for (word, bits) in self.dirty.iter().enumerate() {
            let mut taken = bits.swap(0, Ordering::AcqRel);
            while taken != 0 {
                pages.push(word as u64 * 64 + u64::from(taken.trailing_zeros()));
                taken &= taken - 1;
            }
        }
        pages
    }

    /// Marks `pages` changed again (their write failed).
    pub fn mark_dirty(&self, pages: &[u64]) {
        for &page in pages {
            self.dirty[(page / 64) as usize].fetch_or(1 << (page % 64), Ordering::AcqRel);
        }
    }

    /// Page `page` as stored.
    pub fn page_bytes(&self, page: u64, out: &mut [u8]) {
        debug_assert_eq!(out.len() as u64, BLOCK_BYTES);
        out.fill(0);
        let first = page * STAMPS_PER_PAGE;
        let last = (first + STAMPS_PER_PAGE).min(self.blocks());
        for (i, block) in (first..last).enumerate() {
            out[i * 4..i * 4 + 4].copy_from_slice(&self.get(block).to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeros_stamp_zero_and_changed_pages_are_taken_once() {
        assert_eq!(stamp(&[0u8; 4096]), 0);
        assert_ne!(stamp(&[1u8; 4096]), 0);
        let table = ChecksumTable::zeroed(2000);
        table.set(5, 0); // unchanged: not dirty
        table.set(1500, 9);
        table.set(1501, 10);
        assert_eq!(table.take_dirty(), vec![1]);
        assert!(table.take_dirty().is_empty());
        let mut page = vec![0u8; 4096];
        table.page_bytes(1, &mut page);
        assert_eq!(&page[(1500 - 1024) * 4..][..4], &9u32.to_le_bytes());
        let loaded = ChecksumTable::zeroed(2000);
        loaded.load(1024, &page);
        assert_eq!((loaded.get(1500), loaded.get(1501), loaded.get(5)), (9, 10, 0));
        assert!(loaded.take_dirty().is_empty(), "loading changes nothing to write");
    }
}
