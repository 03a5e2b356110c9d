//! md's partial parity log (PPL) on disk: the 4 KiB header, its entries, and how a reader
//! finds the newest header (`md-format.md` §4.3; Linux `md_p.h` `ppl_header`,
//! `drivers/md/raid5-ppl.c`, Documentation/driver-api/md/raid5-ppl.rst).
//!
//! ```text
//!  member byte 4096 + ppl.offset·512 ─┬─ header (4 KiB) ─ pp of entry 0 ─ pp of entry 1 ... ─┬─ next header ...
//!                                     └ 512 B of 0xFF, signature, generation, count, checksum, 148 × 24-byte entries
//! ```
//!
//! A writer appends headers one after another (md's "multiple PPLs"); a reader starts at the
//! beginning of the area and follows the chain while checksums and signatures hold and the
//! generation grows: the last header of the chain is the newest, and only its entries are
//! replayed. Every checksum is the standard CRC-32C (md's `~crc32c_le(~0, ..)`); the signature
//! is the CRC-32C of the array UUID. Entry sectors are 512-byte array sectors.
//!
//! Pure: bytes in, values out. The engine writes and replays this format
//! (`engine/parity_log.rs`); `md` places the area and re-exports this module as `md::ppl`.

/// One header: 4 KiB.
pub const PPL_HEADER_BYTES: usize = 4096;
/// Leading bytes of a header filled with 0xFF.
const RESERVED_BYTES: usize = 512;
const ENTRY_BYTES: usize = 24;
const ENTRIES_AT: usize = RESERVED_BYTES + 24;
/// Entries one header holds (`PPL_HDR_MAX_ENTRIES`).
pub const PPL_MAX_ENTRIES: usize = (PPL_HEADER_BYTES - ENTRIES_AT) / ENTRY_BYTES;
/// Where mdadm puts the area: 8 sectors after a 1.2 superblock.
pub const PPL_OFFSET_SECTORS: i16 = 8;
/// The area mdadm reserves (`MULTIPLE_PPL_AREA_SIZE_SUPER1`): 1 MiB.
pub const PPL_AREA_SECTORS: u16 = 2048;

/// One logged write: `data_size` bytes of new data from `data_sector` on in one stripe,
/// with `pp_size` bytes of partial parity (0 for a full-stripe write) on `parity_disk`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PplEntry {
    pub data_sector: u64,
    pub pp_size: u32,
    pub data_size: u32,
    pub parity_disk: u32,
    /// CRC-32C of the entry's partial parity.
    pub checksum: u32,
}

/// A decoded header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PplHeader {
    pub signature: u32,
    pub generation: u64,
    pub entries: Vec<PplEntry>,
}

/// The signature every header of the array carries (from the array UUID's bytes).
pub fn ppl_signature(uuid: [u8; 16]) -> u32 {
    crc32c::crc32c(&uuid)
}

/// CRC-32C as md stores it for partial parity and headers.
pub fn ppl_checksum(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// [`ppl_checksum`] of `len` zero bytes (the new data of a zeroed block), without a buffer
/// of them.
pub fn zeros_checksum(len: usize) -> u32 {
    static ZEROS: [u8; 4096] = [0; 4096];
    let (mut crc, mut left) = (0, len);
    while left > 0 {
        let n = left.min(ZEROS.len());
        crc = crc32c::crc32c_append(crc, &ZEROS[..n]);
        left -= n;
    }
    crc
}

/// Whether an entry whose write modifies `blocks` data blocks carries data checksums: with
/// one, a degraded replay rebuilds the lost block as its old or its new data, so it never
/// needs them.
pub fn carries_data_crcs(blocks: u64) -> bool {
    blocks >= 2
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// raidnbd's addition in the header's reserved bytes (which md fills with 0xFF and never
/// reads): the CRC-32C of the new data of each block that the first `entries` entries write,
/// for those of them that write two or more data blocks. Replay with a data member missing
/// uses them to tell a write that landed whole (parity agrees with the new data: the lost
/// block rebuilds right) from one in flight. The header checksum covers them, so md accepts
/// such headers as its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DataChecksums {
    pub entries: usize,
    pub crcs: Vec<u32>,
}

/// CRCs that fit in the reserved bytes (after an 8-byte tag and counts).
pub const MAX_DATA_CRCS: usize = (RESERVED_BYTES - 8) / 4;
const DATA_CRC_TAG: &[u8; 4] = b"rnbd";

impl DataChecksums {
    fn decode(b: &[u8]) -> DataChecksums {
        let entries = u16::from_le_bytes([b[4], b[5]]) as usize;
        let count = u16::from_le_bytes([b[6], b[7]]) as usize;
        if &b[..4] != DATA_CRC_TAG || count > MAX_DATA_CRCS || entries > PPL_MAX_ENTRIES {
            return DataChecksums::default();
        }
        DataChecksums { entries, crcs: (0..count).map(|i| u32_at(b, 8 + 4 * i)).collect() }
    }
}

impl PplHeader {
    /// The 4 KiB image, checksummed (md's bytes: reserved area all 0xFF).
    pub fn encode(&self) -> Vec<u8> {
        self.encode_with(&DataChecksums::default())
    }

    /// The image with raidnbd's data checksums in the reserved bytes (md's bytes when there
    /// are none).
    pub fn encode_with(&self, data: &DataChecksums) -> Vec<u8> {
        assert!(self.entries.len() <= PPL_MAX_ENTRIES, "{} entries exceed one header", self.entries.len());
        assert!(data.crcs.len() <= MAX_DATA_CRCS && data.entries <= self.entries.len(), "data checksums fit");
        let mut b = vec![0u8; PPL_HEADER_BYTES];
        b[..RESERVED_BYTES].fill(0xFF);
        if !data.crcs.is_empty() {
            b[..4].copy_from_slice(DATA_CRC_TAG);
            b[4..6].copy_from_slice(&(data.entries as u16).to_le_bytes());
            b[6..8].copy_from_slice(&(data.crcs.len() as u16).to_le_bytes());
            for (i, c) in data.crcs.iter().enumerate() {
                b[8 + 4 * i..12 + 4 * i].copy_from_slice(&c.to_le_bytes());
            }
        }
        b[512..516].copy_from_slice(&self.signature.to_le_bytes());
        b[520..528].copy_from_slice(&self.generation.to_le_bytes());
        b[528..532].copy_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for (i, e) in self.entries.iter().enumerate() {
            let at = ENTRIES_AT + i * ENTRY_BYTES;
            b[at..at + 8].copy_from_slice(&e.data_sector.to_le_bytes());
            b[at + 8..at + 12].copy_from_slice(&e.pp_size.to_le_bytes());
            b[at + 12..at + 16].copy_from_slice(&e.data_size.to_le_bytes());
            b[at + 16..at + 20].copy_from_slice(&e.parity_disk.to_le_bytes());
            b[at + 20..at + 24].copy_from_slice(&e.checksum.to_le_bytes());
        }
        let crc = ppl_checksum(&b);
        b[532..536].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes a header of the array with `signature`; `Err` says why it is not one.
    pub fn decode(b: &[u8], signature: u32) -> Result<PplHeader, String> {
        if b.len() < PPL_HEADER_BYTES {
            return Err(format!("{} bytes, a header has {PPL_HEADER_BYTES}", b.len()));
        }
        let b = &b[..PPL_HEADER_BYTES];
        let stored = u32_at(b, 532);
        let mut copy = b.to_vec();
        copy[532..536].fill(0);
        let crc = ppl_checksum(&copy);
        if crc != stored {
            return Err(format!("header checksum {stored:#010x}, computed {crc:#010x}"));
        }
        let found = u32_at(b, 512);
        if found != signature {
            return Err(format!("signature {found:#010x} is not this array's {signature:#010x}"));
        }
        let count = u32_at(b, 528) as usize;
        if count > PPL_MAX_ENTRIES {
            return Err(format!("{count} entries, a header holds at most {PPL_MAX_ENTRIES}"));
        }
        let entries = (0..count)
            .map(|i| {
                let at = ENTRIES_AT + i * ENTRY_BYTES;
                PplEntry {
                    data_sector: u64_at(b, at),
                    pp_size: u32_at(b, at + 8),
                    data_size: u32_at(b, at + 12),
                    parity_disk: u32_at(b, at + 16),
                    checksum: u32_at(b, at + 20),
                }
            })
            .collect();
        Ok(PplHeader { signature: found, generation: u64_at(b, 520), entries })
    }

    /// raidnbd's data checksums of a header image `decode` accepted (none in md's headers).
    pub fn data_checksums(b: &[u8]) -> DataChecksums {
        DataChecksums::decode(&b[..RESERVED_BYTES])
    }

    /// Bytes of partial parity that follow the header.
    pub fn pp_bytes(&self) -> u64 {
        self.entries.iter().map(|e| u64::from(e.pp_size)).sum()
    }
}

/// The newest header of one member's area as md's reader finds it (`ppl_load_distributed`):
/// its byte offset in the area and the header. `None` when the first one is not valid.
pub fn newest_header(area: &[u8], signature: u32) -> Option<(usize, PplHeader)> {
    let mut newest: Option<(usize, PplHeader)> = None;
    let mut at = 0usize;
    while at + PPL_HEADER_BYTES <= area.len() {
        let Ok(header) = PplHeader::decode(&area[at..], signature) else { break };
        if newest.as_ref().is_some_and(|(_, prev)| prev.generation > header.generation) {
            break;
        }
        let next = at as u64 + PPL_HEADER_BYTES as u64 + header.pp_bytes();
        newest = Some((at, header));
        match usize::try_from(next) {
            Ok(n) => at = n,
            Err(_) => break,
        }
    }
    newest
}

/// Which array sectors an entry covers, as md's replay reads it (`ppl_recover_entry`):
/// `rows` sectors of each of `data_disks` consecutive chunks from `first_sector`, limited to
/// sectors below `end_sector`. The parity of each row is recomputed from those sectors and
/// (when `pp_size` > 0) the row's partial parity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntrySpan {
    pub first_sector: u64,
    pub end_sector: u64,
    pub data_disks: u64,
    pub rows: u64,
}

impl EntrySpan {
    /// Data blocks of the span with at least one row (the blocks the write modified).
    pub fn modified_disks(&self, chunk_sectors: u64) -> u64 {
        (0..self.data_disks).filter(|d| self.first_sector + d * chunk_sectors < self.end_sector).count() as u64
    }
}

impl PplEntry {
    /// The span md replays for this entry on an array with `data_disks` data chunks per
    /// stripe of `chunk_sectors`. `None` for an entry no writer makes (zero sizes, a
    /// partial parity that does not divide the data).
    pub fn span(&self, chunk_sectors: u64, data_disks: u64) -> Option<EntrySpan> {
        let pp_sectors = u64::from(self.pp_size) / 512;
        let data_sectors = u64::from(self.data_size) / 512;
        if data_sectors == 0 || !self.pp_size.is_multiple_of(512) || !self.data_size.is_multiple_of(512) {
            return None;
        }
        let first = self.data_sector;
        let (disks, rows, end) = if pp_sectors < chunk_sectors {
            let (disks, rows) = if pp_sectors > 0 {
                (u64::from(self.data_size / self.pp_size), pp_sectors)
            } else {
                (data_disks, data_sectors / data_disks)
            };
            if disks == 0 || disks > data_disks || rows == 0 {
                return None;
            }
            (disks, rows, first + (disks - 1) * chunk_sectors + rows)
        } else {
            (data_disks, chunk_sectors, first + data_sectors)
        };
        Some(EntrySpan { first_sector: first, end_sector: end, data_disks: disks, rows })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_checksums_ride_in_the_reserved_bytes() {
        let sig = ppl_signature([7; 16]);
        let e = PplEntry { data_sector: 0, pp_size: 0, data_size: 3 << 16, parity_disk: 3, checksum: 0 };
        let h = PplHeader { signature: sig, generation: 1, entries: vec![e, e] };
        let data = DataChecksums { entries: 1, crcs: vec![1, 2, 3] };
        let b = h.encode_with(&data);
        assert_eq!(PplHeader::decode(&b, sig), Ok(h.clone()), "md reads the header as before");
        assert_eq!(PplHeader::data_checksums(&b), data);
        assert_eq!(PplHeader::data_checksums(&h.encode()), DataChecksums::default(), "md's 0xFF: none");
        let full = DataChecksums { entries: 1, crcs: vec![7; MAX_DATA_CRCS] };
        assert_eq!(PplHeader::data_checksums(&h.encode_with(&full)), full);
        assert_eq!(zeros_checksum(10_000), ppl_checksum(&[0; 10_000]));
    }

    #[test]
    fn header_round_trips_and_rejects_damage() {
        let sig = ppl_signature([7; 16]);
        let h = PplHeader {
            signature: sig,
            generation: 42,
            entries: vec![
                PplEntry { data_sector: 8, pp_size: 4096, data_size: 8192, parity_disk: 3, checksum: 0xdead },
                PplEntry { data_sector: 1 << 33, pp_size: 0, data_size: 3 << 16, parity_disk: 0, checksum: 0 },
            ],
        };
        let b = h.encode();
        assert_eq!(PPL_MAX_ENTRIES, 148);
        assert!(b[..512].iter().all(|&x| x == 0xFF));
        assert_eq!(PplHeader::decode(&b, sig), Ok(h.clone()));
        assert!(PplHeader::decode(&b, sig ^ 1).unwrap_err().contains("signature"));
        let mut torn = b.clone();
        torn[600] ^= 1;
        assert!(PplHeader::decode(&torn, sig).unwrap_err().contains("checksum"));
    }

    #[test]
    fn the_reader_follows_the_chain_to_the_newest_header() {
        let sig = ppl_signature([1; 16]);
        let mut area = vec![0u8; 64 << 10];
        let put = |area: &mut Vec<u8>, at: usize, generation: u64, pp: u32| {
            let e = PplEntry { data_sector: 0, pp_size: pp, data_size: pp, parity_disk: 0, checksum: 0 };
            let h = PplHeader { signature: sig, generation, entries: vec![e] };
            area[at..at + PPL_HEADER_BYTES].copy_from_slice(&h.encode());
        };
        assert_eq!(newest_header(&area, sig), None);
        put(&mut area, 0, 5, 4096);
        put(&mut area, 8192, 6, 8192);
        assert_eq!(newest_header(&area, sig).map(|(at, h)| (at, h.generation)), Some((8192, 6)));
        // A wrapped writer: the newest at 0, an older one where the chain continues.
        put(&mut area, 0, 9, 4096);
        assert_eq!(newest_header(&area, sig).map(|(at, h)| (at, h.generation)), Some((0, 9)));
    }

    #[test]
    fn spans_follow_md_replay() {
        // 4 KiB into two chunks of a 4-disk raid5 with 64 KiB chunks (128 sectors).
        let e = PplEntry { data_sector: 8, pp_size: 4096, data_size: 8192, parity_disk: 3, checksum: 0 };
        assert_eq!(
            e.span(128, 3),
            Some(EntrySpan { first_sector: 8, end_sector: 8 + 128 + 8, data_disks: 2, rows: 8 })
        );
        // A full-stripe write of 16 rows.
        let full = PplEntry { data_sector: 384, pp_size: 0, data_size: 3 * 16 * 512, parity_disk: 0, checksum: 0 };
        assert_eq!(full.span(128, 3).map(|s| (s.data_disks, s.rows)), Some((3, 16)));
        // Partial parity of a whole chunk: every data disk, chunk rows.
        let whole = PplEntry { data_sector: 0, pp_size: 65536, data_size: 65536, parity_disk: 3, checksum: 0 };
        assert_eq!(whole.span(128, 3), Some(EntrySpan { first_sector: 0, end_sector: 128, data_disks: 3, rows: 128 }));
        assert_eq!(PplEntry { data_size: 0, ..e }.span(128, 3), None);
    }
}
