//! Where a member's checksum area lies, and its header.
//!
//! The area starts at the first 4 KiB boundary at or after the end of md's data area: one
//! header block, then the table (a little-endian `u32` stamp per 4 KiB block of the device
//! before the area). The header names the algorithm, the covered bytes, the device it
//! belongs to (md's device UUID) and the superblock event count it was last written with.

/// Bytes per checksummed block.
pub const BLOCK_BYTES: u64 = 4096;

/// The header's `algorithm`: CRC-32C (Castagnoli), as dm-integrity's default and ext4.
pub const ALGORITHM_CRC32C: u32 = 1;

const MAGIC: [u8; 8] = *b"RNBDINTG";
const VERSION: u32 = 1;
const STAMP_BYTES: u64 = 4;

/// Where the area of a member lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntegrityArea {
    /// Byte offset of the header; every byte before it is covered by the table.
    pub start_bytes: u64,
}

impl IntegrityArea {
    /// The area after a data area that ends at `data_end_bytes`.
    pub fn after(data_end_bytes: u64) -> Self {
        IntegrityArea { start_bytes: data_end_bytes.div_ceil(BLOCK_BYTES) * BLOCK_BYTES }
    }

    /// Blocks covered (those before the area).
    pub fn blocks(&self) -> u64 {
        self.start_bytes / BLOCK_BYTES
    }

    pub fn table_offset_bytes(&self) -> u64 {
        self.start_bytes + BLOCK_BYTES
    }

    /// The table's length, whole blocks.
    pub fn table_bytes(&self) -> u64 {
        (self.blocks() * STAMP_BYTES).div_ceil(BLOCK_BYTES) * BLOCK_BYTES
    }

    /// Whether the area fits a member of `member_bytes`.
    pub fn fits(&self, member_bytes: u64) -> bool {
        self.table_offset_bytes() + self.table_bytes() <= member_bytes
    }
}

/// Bytes to keep free at the end of a member of `member_bytes` for its area (what `create
/// --integrity` takes off each member's size before md places its data): about 1/1024.
pub fn reserve_bytes(member_bytes: u64) -> u64 {
    let usable = member_bytes / BLOCK_BYTES * BLOCK_BYTES;
    let mut covered = usable.saturating_sub(2 * BLOCK_BYTES) / 1025 * 1024 / BLOCK_BYTES * BLOCK_BYTES;
    while covered > 0 && !(IntegrityArea { start_bytes: covered }).fits(member_bytes) {
        covered -= BLOCK_BYTES;
    }
    member_bytes - covered
}

/// The area's first block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Bytes covered by the table (= the area's start).
    pub covered_bytes: u64,
    /// md's device UUID of the member the table describes.
    pub device_uuid: [u8; 16],
    /// The superblock event count last written through raidnbd.
    pub events: u64,
}

impl Header {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK_BYTES as usize];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&ALGORITHM_CRC32C.to_le_bytes());
        b[16..20].copy_from_slice(&(BLOCK_BYTES as u32).to_le_bytes());
        b[24..32].copy_from_slice(&self.covered_bytes.to_le_bytes());
        b[32..40].copy_from_slice(&self.events.to_le_bytes());
        b[40..56].copy_from_slice(&self.device_uuid);
        let end = b.len() - 4;
        let sum = crc32c::crc32c(&b[..end]);
        b[end..].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// `None` when `bytes` holds no header (no magic); an error naming what is wrong with one
    /// that is there.
    pub fn decode(bytes: &[u8]) -> Option<Result<Header, String>> {
        if bytes.len() < BLOCK_BYTES as usize || bytes[0..8] != MAGIC {
            return None;
        }
        let le32 = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let le64 = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let end = BLOCK_BYTES as usize - 4;
        Some(if crc32c::crc32c(&bytes[..end]) != le32(end) {
            Err("integrity header: checksum mismatch".into())
        } else if le32(8) != VERSION {
            Err(format!("integrity header: version {} (this raidnbd reads {VERSION})", le32(8)))
        } else if le32(12) != ALGORITHM_CRC32C || u64::from(le32(16)) != BLOCK_BYTES {
            Err(format!(
                "integrity header: algorithm {} over {}-byte blocks is not crc32c over 4 KiB",
                le32(12),
                le32(16)
            ))
        } else {
            Ok(Header {
                covered_bytes: le64(24),
                events: le64(32),
                device_uuid: bytes[40..56].try_into().expect("16 bytes"),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_leaves_room_for_the_table_and_little_more() {
        for member in [64 << 10, 1 << 20, (1 << 30) + 4096 * 7 + 512, 64 << 30] {
            let reserve = reserve_bytes(member);
            let area = IntegrityArea::after(member - reserve);
            assert!(area.fits(member), "{member}");
            assert!(reserve <= member / 1000 + 3 * BLOCK_BYTES, "{member}: reserve {reserve}");
        }
    }

    #[test]
    fn a_header_round_trips_and_damage_is_named() {
        let h = Header { covered_bytes: 1 << 30, device_uuid: [7; 16], events: 42 };
        let mut b = h.encode();
        assert_eq!(Header::decode(&b), Some(Ok(h)));
        b[33] ^= 1;
        assert!(Header::decode(&b).unwrap().unwrap_err().contains("checksum"));
        assert_eq!(Header::decode(&[0u8; 4096]), None);
    }
}
