//! md's raid4/5/6 journal (raid5-cache, `mdadm --write-journal`) on disk: the 4 KiB meta
//! block and its payloads (`md-format.md` §4.4; Linux `md_p.h` `r5l_meta_block`,
//! `drivers/md/raid5-cache.c`).
//!
//! ```text
//!  journal device, from its data offset: a ring of io units
//!  ┌ meta block (4 KiB) ┬ page of payload 0 ┬ page(s) of payload 1 ┬ ... ┐ next meta block ...
//!  └ magic 0x6433c509, crc, version 1, meta_size, seq, position, payloads
//!     data:   type 0, size 8 sectors, location = array sector of the page, 1 crc
//!     parity: type 1, size 8 (P) or 16 (P, Q) sectors, location = member sector, 1-2 crcs
//!     flush:  type 2, size in bytes, stripe sectors (write-back mode only)
//! ```
//!
//! An io unit is a meta block followed by the pages its payloads describe, in payload order;
//! consecutive units carry consecutive `seq` numbers and each unit's `position` is where it
//! starts (sectors from the device's data offset; the ring wraps at its size rounded down
//! to 4 KiB). The superblock of the journal device records the tail (`journal_tail`): the
//! unit replay starts from. Checksums are the kernel's `crc32c_le` (CRC-32C without the
//! final inversion) seeded with that of the array UUID; the meta block's covers its whole
//! 4 KiB with the checksum field zeroed, a page's covers its 4 KiB.
//!
//! Pure: bytes in, values out. The engine writes and replays this format
//! (`engine/journal.rs`); `md` places the area and re-exports this module as `md::journal`.

/// A meta block and every page: 4 KiB.
pub const JOURNAL_PAGE_BYTES: usize = 4096;
/// Sectors of one page (md's `BLOCK_SECTORS`).
pub const JOURNAL_PAGE_SECTORS: u64 = 8;
pub const JOURNAL_MAGIC: u32 = 0x6433_c509;
pub const JOURNAL_VERSION: u8 = 1;
/// Bytes of the meta block before its payloads.
pub const META_HEADER_BYTES: usize = 32;
/// How far md moves `seq` on after a recovery (so a stale unit can never follow).
pub const RECOVERY_SEQ_STEP: u64 = 10_000;

const TYPE_DATA: u16 = 0;
const TYPE_PARITY: u16 = 1;
const TYPE_FLUSH: u16 = 2;

/// One payload of a meta block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// One page of new data at array sector `array_sector`.
    Data { array_sector: u64, checksum: u32, flags: u16 },
    /// The parity pages (P, and Q on raid6) of the stripe at member sector `member_sector`.
    Parity { member_sector: u64, checksums: Vec<u32>, flags: u16 },
    /// Write-back mode: stripes whose cached data reached the members.
    Flush { member_sectors: Vec<u64> },
}

impl Payload {
    /// Pages of the payload that follow the meta block.
    pub fn pages(&self) -> usize {
        match self {
            Payload::Data { .. } => 1,
            Payload::Parity { checksums, .. } => checksums.len(),
            Payload::Flush { .. } => 0,
        }
    }

    /// Bytes it takes in the meta block.
    pub fn encoded_bytes(&self) -> usize {
        match self {
            Payload::Data { .. } => 16 + 4,
            Payload::Parity { checksums, .. } => 16 + 4 * checksums.len(),
            Payload::Flush { member_sectors } => 8 + 8 * member_sectors.len(),
        }
    }
}

/// A decoded meta block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaBlock {
    pub seq: u64,
    /// Sectors from the journal device's data offset.
    pub position: u64,
    pub payloads: Vec<Payload>,
}

/// Why bytes are not a valid meta block (replay ends there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaError {
    Magic,
    Version,
    Checksum,
    /// `meta_size` or a payload overruns the block, or a payload type is unknown.
    Malformed,
}

/// The kernel's `crc32c_le(seed, bytes)`: CRC-32C without the inversions of the standard one.
pub fn crc32c_le(seed: u32, bytes: &[u8]) -> u32 {
    !crc32c::crc32c_append(!seed, bytes)
}

/// The seed of every journal checksum of an array (`log->uuid_checksum`).
pub fn journal_seed(uuid: [u8; 16]) -> u32 {
    crc32c_le(!0, &uuid)
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl MetaBlock {
    /// Bytes its payloads take.
    pub fn meta_size(&self) -> usize {
        META_HEADER_BYTES + self.payloads.iter().map(Payload::encoded_bytes).sum::<usize>()
    }

    /// Pages that follow the meta block.
    pub fn pages(&self) -> usize {
        self.payloads.iter().map(Payload::pages).sum()
    }

    /// Sectors the whole unit takes in the ring.
    pub fn unit_sectors(&self) -> u64 {
        (1 + self.pages() as u64) * JOURNAL_PAGE_SECTORS
    }

    /// The 4 KiB image, checksummed with `seed`.
    pub fn encode(&self, seed: u32) -> Vec<u8> {
        let size = self.meta_size();
        assert!(size <= JOURNAL_PAGE_BYTES, "payloads of {size} bytes exceed one meta block");
        let mut b = vec![0u8; JOURNAL_PAGE_BYTES];
        b[0..4].copy_from_slice(&JOURNAL_MAGIC.to_le_bytes());
        b[8] = JOURNAL_VERSION;
        b[12..16].copy_from_slice(&(size as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.position.to_le_bytes());
        let mut at = META_HEADER_BYTES;
        for p in &self.payloads {
            match p {
                Payload::Data { array_sector, checksum, flags } => {
                    b[at..at + 2].copy_from_slice(&TYPE_DATA.to_le_bytes());
                    b[at + 2..at + 4].copy_from_slice(&flags.to_le_bytes());
                    b[at + 4..at + 8].copy_from_slice(&(JOURNAL_PAGE_SECTORS as u32).to_le_bytes());
                    b[at + 8..at + 16].copy_from_slice(&array_sector.to_le_bytes());
                    b[at + 16..at + 20].copy_from_slice(&checksum.to_le_bytes());
                }
                Payload::Parity { member_sector, checksums, flags } => {
                    b[at..at + 2].copy_from_slice(&TYPE_PARITY.to_le_bytes());
                    b[at + 2..at + 4].copy_from_slice(&flags.to_le_bytes());
                    let sectors = checksums.len() as u32 * JOURNAL_PAGE_SECTORS as u32;
                    b[at + 4..at + 8].copy_from_slice(&sectors.to_le_bytes());
                    b[at + 8..at + 16].copy_from_slice(&member_sector.to_le_bytes());
                    for (i, c) in checksums.iter().enumerate() {
                        b[at + 16 + 4 * i..at + 20 + 4 * i].copy_from_slice(&c.to_le_bytes());
                    }
                }
                Payload::Flush { member_sectors } => {
                    b[at..at + 2].copy_from_slice(&TYPE_FLUSH.to_le_bytes());
                    b[at + 4..at + 8].copy_from_slice(&(8 * member_sectors.len() as u32).to_le_bytes());
                    for (i, s) in member_sectors.iter().enumerate() {
                        b[at + 8 + 8 * i..at + 16 + 8 * i].copy_from_slice(&s.to_le_bytes());
                    }
                }
            }
            at += p.encoded_bytes();
        }
        let crc = crc32c_le(seed, &b);
        b[4..8].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and verifies a 4 KiB meta block (not its pages).
    pub fn decode(b: &[u8], seed: u32) -> Result<MetaBlock, MetaError> {
        if b.len() < JOURNAL_PAGE_BYTES {
            return Err(MetaError::Malformed);
        }
        let b = &b[..JOURNAL_PAGE_BYTES];
        if u32_at(b, 0) != JOURNAL_MAGIC {
            return Err(MetaError::Magic);
        }
        if b[8] != JOURNAL_VERSION {
            return Err(MetaError::Version);
        }
        let mut zeroed = b.to_vec();
        zeroed[4..8].fill(0);
        if crc32c_le(seed, &zeroed) != u32_at(b, 4) {
            return Err(MetaError::Checksum);
        }
        let size = u32_at(b, 12) as usize;
        if !(META_HEADER_BYTES..=JOURNAL_PAGE_BYTES).contains(&size) {
            return Err(MetaError::Malformed);
        }
        let mut payloads = Vec::new();
        let mut at = META_HEADER_BYTES;
        while at < size {
            if at + 8 > size {
                return Err(MetaError::Malformed);
            }
            let (kind, flags, len) = (u16_at(b, at), u16_at(b, at + 2), u32_at(b, at + 4));
            let payload = match kind {
                TYPE_DATA | TYPE_PARITY => {
                    let pages = len as u64 / JOURNAL_PAGE_SECTORS;
                    let pages_ok = match kind {
                        TYPE_DATA => pages == 1,
                        _ => pages == 1 || pages == 2,
                    };
                    if !pages_ok || !u64::from(len).is_multiple_of(JOURNAL_PAGE_SECTORS) {
                        return Err(MetaError::Malformed);
                    }
                    let end = at + 16 + 4 * pages as usize;
                    if end > size {
                        return Err(MetaError::Malformed);
                    }
                    let location = u64_at(b, at + 8);
                    let checksums: Vec<u32> = (0..pages as usize).map(|i| u32_at(b, at + 16 + 4 * i)).collect();
                    match kind {
                        TYPE_DATA => Payload::Data { array_sector: location, checksum: checksums[0], flags },
                        _ => Payload::Parity { member_sector: location, checksums, flags },
                    }
                }
                TYPE_FLUSH => {
                    let n = len as usize / 8;
                    if !(len as usize).is_multiple_of(8) || at + 8 + 8 * n > size {
                        return Err(MetaError::Malformed);
                    }
                    Payload::Flush { member_sectors: (0..n).map(|i| u64_at(b, at + 8 + 8 * i)).collect() }
                }
                _ => return Err(MetaError::Malformed),
            };
            at += payload.encoded_bytes();
            payloads.push(payload);
        }
        Ok(MetaBlock { seq: u64_at(b, 16), position: u64_at(b, 24), payloads })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_le_is_the_kernels() {
        // Standard CRC-32C of "123456789" is 0xE3069283; the kernel's crc32c_le(~0, ..) is
        // its inversion.
        assert_eq!(crc32c_le(!0, b"123456789"), !0xE306_9283);
        assert_eq!(crc32c_le(crc32c_le(!0, b"1234"), b"56789"), crc32c_le(!0, b"123456789"));
    }

    #[test]
    fn meta_blocks_round_trip_and_reject_damage() {
        let seed = journal_seed([7; 16]);
        let mb = MetaBlock {
            seq: 42,
            position: 1024,
            payloads: vec![
                Payload::Data { array_sector: 16, checksum: 1, flags: 0 },
                Payload::Data { array_sector: 144, checksum: 2, flags: 0 },
                Payload::Parity { member_sector: 8, checksums: vec![3, 4], flags: 0 },
                Payload::Flush { member_sectors: vec![8, 16] },
            ],
        };
        let b = mb.encode(seed);
        assert_eq!(u32_at(&b, 12) as usize, 32 + 20 + 20 + 24 + 24);
        assert_eq!(MetaBlock::decode(&b, seed), Ok(mb.clone()));
        assert_eq!(mb.pages(), 4);
        assert_eq!(mb.unit_sectors(), 40);
        assert_eq!(MetaBlock::decode(&b, seed ^ 1), Err(MetaError::Checksum));
        let mut torn = b.clone();
        torn[100] ^= 1;
        assert_eq!(MetaBlock::decode(&torn, seed), Err(MetaError::Checksum));
        let mut bad = b.clone();
        bad[0] ^= 1;
        assert_eq!(MetaBlock::decode(&bad, seed), Err(MetaError::Magic));
        assert_eq!(MetaBlock::decode(&[0u8; 4096], seed), Err(MetaError::Magic));
    }

    #[test]
    fn hostile_meta_blocks_are_errors_not_panics() {
        let seed = journal_seed([1; 16]);
        let reseal = |mut b: Vec<u8>| {
            b[4..8].fill(0);
            let crc = crc32c_le(seed, &b);
            b[4..8].copy_from_slice(&crc.to_le_bytes());
            b
        };
        let base =
            MetaBlock { seq: 1, position: 0, payloads: vec![Payload::Data { array_sector: 0, checksum: 0, flags: 0 }] }
                .encode(seed);
        for (at, value) in [(12usize, 5000u32), (12, 31), (12, 33), (36, 24), (36, 7), (32, 9)] {
            let mut b = base.clone();
            b[at..at + 4].copy_from_slice(&value.to_le_bytes());
            if at == 32 {
                b[32..34].copy_from_slice(&(value as u16).to_le_bytes());
            }
            assert_eq!(MetaBlock::decode(&reseal(b), seed), Err(MetaError::Malformed), "field at {at} = {value}");
        }
    }
}
