//! md's internal write-intent bitmap, version 4 (`md-bitmap.h` `bitmap_super_t`;
//! `md-format.md` §4.1): a 256-byte header followed by one bit per bitmap chunk,
//! little-endian bit order, at `super_offset + bitmap_offset` (4 KiB after the superblock
//! for 1.2). Every member holds the same bitmap. Version 3 (host-endian, from old kernels)
//! is the same on a little-endian host and is read as such; version 5 (md-cluster) and 6
//! (md's lockless bitmap, Linux 6.18+: one byte per chunk from byte 1024, chunk size in
//! sectors) are refused by name: a bitmap raidnbd cannot keep must not be run without.
//!
//! A set bit says "writes may have been in flight in this chunk": after an unclean stop
//! only those chunks are resynced, and a member that was briefly absent only needs those
//! chunks copied. `sync_size` is in md's resync space: member sectors for raid1/4/5/6,
//! array sectors for raid10.
//!
//! | off | size | field |
//! |---:|---:|---|
//! | 0 | 4 | magic `0x6d746962` ("bitm") |
//! | 4 | 4 | version (4) |
//! | 8 | 16 | uuid (= array uuid) |
//! | 24 | 8 | events (= superblock events when written) |
//! | 32 | 8 | events_cleared |
//! | 40 | 8 | sync_size (sectors) |
//! | 48 | 4 | state (bit 1 STALE, bit 2 WRITE_ERROR) |
//! | 52 | 4 | chunksize (bytes) |
//! | 56 | 4 | daemon_sleep (seconds) |
//! | 60 | 4 | write_behind |
//! | 64 | 4 | sectors_reserved |
//! | 68 | 4 | nodes |
//! | 72 | 64 | cluster_name |

use crate::error::{ErrorKind, RaidError};

use super::uuid::MdUuid;

pub const BITMAP_MAGIC: u32 = 0x6d74_6962;
pub const BITMAP_VERSION: u32 = 4;
/// Host-endian bitmaps of old kernels (little-endian here: read as version 4).
pub const BITMAP_VERSION_HOSTENDIAN: u32 = 3;
/// md-cluster's bitmap.
pub const BITMAP_VERSION_CLUSTERED: u32 = 5;
/// md's lockless bitmap (`md-llbitmap.c`, Linux 6.18+, `mdadm --bitmap=lockless`).
pub const BITMAP_VERSION_LOCKLESS: u32 = 6;
/// The kernel refuses a larger `write_behind` (md's `COUNTER_MAX`).
const MAX_WRITE_BEHIND: u32 = 16383;
pub const BITMAP_HEADER_BYTES: usize = 256;
/// Bitmap state bit: the bitmap is out of date (a full resync is needed).
pub const BITMAP_STALE: u32 = 1 << 1;
/// mdadm's default bitmap chunk: 64 MiB.
pub const DEFAULT_BITMAP_CHUNK_BYTES: u64 = 64 << 20;
/// mdadm's default daemon sleep, seconds.
pub const DEFAULT_DAEMON_SLEEP_SECS: u32 = 5;

/// A decoded bitmap: header fields plus the bits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bitmap {
    /// 4, or 3 (written back as read).
    pub version: u32,
    pub uuid: MdUuid,
    pub events: u64,
    pub events_cleared: u64,
    pub sync_size_sectors: u64,
    pub state: u32,
    pub chunk_bytes: u32,
    pub daemon_sleep_secs: u32,
    pub sectors_reserved: u32,
    /// mdadm `--write-behind` (raid1 with write-mostly members), kept as read.
    pub write_behind: u32,
    /// One bit per chunk (bit i = byte i/8, bit i%8), `chunks()` bits long.
    pub bits: Vec<u8>,
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Bitmap {
    /// A clean bitmap for an array: chunk chosen like mdadm (`chunk_bytes`, default 64 MiB,
    /// doubled until the bits fit in `space_bytes`).
    pub fn new(
        uuid: MdUuid,
        sync_size_sectors: u64,
        space_bytes: u64,
        events: u64,
        chunk_bytes: Option<u64>,
    ) -> Result<Bitmap, RaidError> {
        let room_bits = space_bytes.saturating_sub(BITMAP_HEADER_BYTES as u64) * 8;
        if room_bits == 0 {
            return Err(RaidError::new(ErrorKind::Refused, "no room for a bitmap before the data"));
        }
        let mut chunk = chunk_bytes.unwrap_or(DEFAULT_BITMAP_CHUNK_BYTES);
        if !chunk.is_power_of_two() || chunk < 4096 {
            return Err(RaidError::new(ErrorKind::Refused, "a bitmap chunk is a power of two of at least 4 KiB"));
        }
        while (sync_size_sectors * 512).div_ceil(chunk) > room_bits {
            chunk *= 2;
        }
        let chunk_bytes =
            u32::try_from(chunk).map_err(|_| RaidError::new(ErrorKind::Refused, "array too large for a bitmap"))?;
        let mut bitmap = Bitmap {
            version: BITMAP_VERSION,
            uuid,
            events,
            events_cleared: events,
            sync_size_sectors,
            state: 0,
            chunk_bytes,
            daemon_sleep_secs: DEFAULT_DAEMON_SLEEP_SECS,
            sectors_reserved: (space_bytes / 512) as u32,
            write_behind: 0,
            bits: Vec::new(),
        };
        bitmap.bits = vec![0; bitmap.chunks().div_ceil(8) as usize];
        Ok(bitmap)
    }

    /// Chunks covered.
    pub fn chunks(&self) -> u64 {
        (self.sync_size_sectors * 512).div_ceil(u64::from(self.chunk_bytes))
    }

    pub fn chunk_sectors(&self) -> u64 {
        u64::from(self.chunk_bytes) / 512
    }

    pub fn is_set(&self, chunk: u64) -> bool {
        self.bits.get((chunk / 8) as usize).is_some_and(|b| b & (1 << (chunk % 8)) != 0)
    }

    pub fn set(&mut self, chunk: u64, on: bool) {
        assert!(chunk < self.chunks(), "bitmap chunk {chunk} of {}", self.chunks());
        let byte = &mut self.bits[(chunk / 8) as usize];
        if on { *byte |= 1 << (chunk % 8) } else { *byte &= !(1 << (chunk % 8)) }
    }

    /// Number of set bits.
    /// Bits that `room_bytes` of bitmap space hold.
    pub fn room_chunks(&self, room_bytes: u64) -> u64 {
        room_bytes.saturating_sub(BITMAP_HEADER_BYTES as u64) * 8
    }

    /// md's `md_bitmap_resize`: the bitmap covers `sync_size_sectors` with bits of
    /// `chunk_bytes` (a multiple of the chunk now); a set bit sets the bit covering it, bits
    /// past the end go, and the bits `dirty` (new space, in the new chunks) are set.
    pub fn resize(
        &mut self,
        sync_size_sectors: u64,
        chunk_bytes: u64,
        dirty: std::ops::Range<u64>,
    ) -> Result<(), RaidError> {
        let old = u64::from(self.chunk_bytes);
        let chunk_bytes = u32::try_from(chunk_bytes)
            .ok()
            .filter(|&c| u64::from(c) >= old && u64::from(c).is_multiple_of(old))
            .ok_or_else(|| {
                RaidError::new(ErrorKind::Refused, format!("bitmap chunk {old} cannot become {chunk_bytes}"))
            })?;
        let factor = u64::from(chunk_bytes) / old;
        let set: Vec<u64> = (0..self.chunks()).filter(|&c| self.is_set(c)).map(|c| c / factor).collect();
        self.sync_size_sectors = sync_size_sectors;
        self.chunk_bytes = chunk_bytes;
        self.bits = vec![0; self.chunks().div_ceil(8) as usize];
        let chunks = self.chunks();
        for c in set.into_iter().chain(dirty).filter(|&c| c < chunks) {
            self.set(c, true);
        }
        Ok(())
    }

    pub fn dirty_chunks(&self) -> u64 {
        self.bits.iter().map(|b| u64::from(b.count_ones())).sum()
    }

    /// On-disk bytes, padded to whole 512-byte sectors.
    pub fn encode(&self) -> Vec<u8> {
        let len = (BITMAP_HEADER_BYTES + self.bits.len()).next_multiple_of(512);
        let mut b = vec![0u8; len];
        b[0..4].copy_from_slice(&BITMAP_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.version.to_le_bytes());
        b[8..24].copy_from_slice(&self.uuid.0);
        b[24..32].copy_from_slice(&self.events.to_le_bytes());
        b[32..40].copy_from_slice(&self.events_cleared.to_le_bytes());
        b[40..48].copy_from_slice(&self.sync_size_sectors.to_le_bytes());
        b[48..52].copy_from_slice(&self.state.to_le_bytes());
        b[52..56].copy_from_slice(&self.chunk_bytes.to_le_bytes());
        b[56..60].copy_from_slice(&self.daemon_sleep_secs.to_le_bytes());
        b[60..64].copy_from_slice(&self.write_behind.to_le_bytes());
        b[64..68].copy_from_slice(&self.sectors_reserved.to_le_bytes());
        b[BITMAP_HEADER_BYTES..BITMAP_HEADER_BYTES + self.bits.len()].copy_from_slice(&self.bits);
        b
    }

    /// Decodes a bitmap read from a member (`bytes` from the bitmap's start; at least the
    /// header plus the bits). Checks magic, version, uuid and sizes, and what the kernel
    /// checks (`md_bitmap_read_sb`: daemon_sleep, write_behind). A bitmap of a kind raidnbd
    /// does not keep (versions 5 and 6) is an [`ErrorKind::CannotAssemble`] naming it; other
    /// errors are [`ErrorKind::BadMetadata`] (this member's copy is unusable).
    pub fn decode(bytes: &[u8], uuid: MdUuid) -> Result<Bitmap, RaidError> {
        let bad = |why: String| RaidError::new(ErrorKind::BadMetadata, format!("internal bitmap: {why}"));
        if bytes.len() < BITMAP_HEADER_BYTES {
            return Err(bad("truncated".into()));
        }
        if le32(bytes, 0) != BITMAP_MAGIC {
            return Err(bad(format!("bad magic {:#x}", le32(bytes, 0))));
        }
        let version = le32(bytes, 4);
        let unsupported = |what: &str| {
            RaidError::new(
                ErrorKind::CannotAssemble,
                format!("internal bitmap: version {version} is {what}, which raidnbd does not keep"),
            )
        };
        match version {
            BITMAP_VERSION => {}
            BITMAP_VERSION_HOSTENDIAN if cfg!(target_endian = "little") => {}
            BITMAP_VERSION_CLUSTERED => return Err(unsupported("md-cluster's clustered bitmap")),
            BITMAP_VERSION_LOCKLESS => {
                return Err(unsupported(
                    "md's lockless bitmap (mdadm --bitmap=lockless, Linux 6.18 and newer: one byte per chunk); \
                     assemble this array with mdadm, or remove the bitmap there (mdadm --grow --bitmap=none) to \
                     serve it here",
                ));
            }
            _ => return Err(bad(format!("version {version} is unknown (md writes 3 to 6)"))),
        }
        let found = MdUuid(bytes[8..24].try_into().expect("16 bytes"));
        if found != uuid {
            return Err(bad(format!("uuid {found} is not the array's {uuid}")));
        }
        let chunk_bytes = le32(bytes, 52);
        if chunk_bytes < 512 || !chunk_bytes.is_power_of_two() {
            return Err(bad(format!("chunk size {chunk_bytes} is not a power of two >= 512")));
        }
        let daemon_sleep_secs = le32(bytes, 56);
        let write_behind = le32(bytes, 60);
        if daemon_sleep_secs == 0 || write_behind > MAX_WRITE_BEHIND {
            return Err(bad(format!(
                "daemon sleep {daemon_sleep_secs} s or write-behind {write_behind} out of range (md refuses it too)"
            )));
        }
        let mut bitmap = Bitmap {
            version,
            uuid,
            events: le64(bytes, 24),
            events_cleared: le64(bytes, 32),
            sync_size_sectors: le64(bytes, 40),
            state: le32(bytes, 48),
            chunk_bytes,
            daemon_sleep_secs,
            sectors_reserved: le32(bytes, 64),
            write_behind,
            bits: Vec::new(),
        };
        let bit_bytes = bitmap.chunks().div_ceil(8) as usize;
        if bytes.len() < BITMAP_HEADER_BYTES + bit_bytes {
            return Err(bad(format!("{bit_bytes} bytes of bits do not fit in what was read")));
        }
        bitmap.bits = bytes[BITMAP_HEADER_BYTES..BITMAP_HEADER_BYTES + bit_bytes].to_vec();
        Ok(bitmap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_chunk_choice() {
        let uuid = MdUuid([7; 16]);
        // 16 GiB of resync space in 4 KiB of room: 64 MiB chunks, 256 bits.
        let mut b = Bitmap::new(uuid, 32 << 20, 4096, 5, None).unwrap();
        assert_eq!(b.chunk_bytes, 64 << 20);
        assert_eq!(b.chunks(), 256);
        b.set(3, true);
        b.set(255, true);
        let bytes = b.encode();
        assert_eq!(&bytes[0..4], b"bitm");
        let d = Bitmap::decode(&bytes, uuid).unwrap();
        assert_eq!(d, b);
        assert_eq!(d.dirty_chunks(), 2);
        assert!(d.is_set(3) && d.is_set(255) && !d.is_set(4));
        // 4 TiB in 4 KiB: 30720 bits of room -> the chunk doubles to 256 MiB.
        let big = Bitmap::new(uuid, 8 << 30, 4096, 1, None).unwrap();
        assert_eq!(big.chunk_bytes, 256 << 20);
        assert!(Bitmap::decode(&bytes, MdUuid([8; 16])).is_err());
        let mut corrupt = bytes.clone();
        corrupt[0] ^= 1;
        assert!(Bitmap::decode(&corrupt, uuid).is_err());
    }
}
