//! `struct mdp_superblock_1`: byte-exact decode and encode of the md v1.2 superblock
//! (`md_p.h`; `md-format.md` §1.2, §1.3, §1.6).
//!
//! ```text
//!  member device
//!  ┌──────────┬───────────────────────────────┬── ... ──┬──────────────
//!  │ 4 KiB    │ superblock at sector 8 (1.2)  │ bitmap, │ data from
//!  │ (unused) │ 256-byte header + 2·max_dev   │ BBL     │ data_offset
//!  └──────────┴───────────────────────────────┴── ... ──┴──────────────
//!             decode(&bytes[4096..8192]) / encode() -> 4096 bytes
//! ```
//!
//! [`Superblock::decode`] is as strict as the kernel's `super_1_load` (every check of §1.3) and
//! additionally refuses what raidnbd does not implement (reshape, journal, clustering,
//! levels other than linear/0/1/4/5/6/10, metadata 1.0/1.1). A bitmap or a non-empty bad-block
//! list is accepted (start reads both); what is accepted but not acted on is reported by
//! [`Superblock::notices`]. [`Superblock::encode`] writes every
//! field little-endian, zero padding, and computes the checksum last.
//!
//! All sector fields are 512-byte sectors, as on disk. Pure: bytes in, bytes out.

use crate::error::{ErrorKind, RaidError};
use crate::geometry::Level;

use super::checksum::{SB_CSUM_OFFSET, sb_checksum};
use super::dev_role::DevRole;
use super::feature::FeatureMap;
use super::uuid::MdUuid;

/// `MD_SB_MAGIC`; bytes on disk `fc 4e 2b a9`.
pub const MD_SB_MAGIC: u32 = 0xa92b_4efc;
/// The fixed header; `dev_roles[]` starts here.
pub const HEADER_BYTES: usize = 256;
/// What the kernel reads and what [`Superblock::encode`] returns.
pub const SUPERBLOCK_BYTES: usize = 4096;
/// Largest `max_dev` that fits in 4 KiB: `(4096 − 256) / 2`.
pub const MAX_DEV: u32 = 1920;
/// `super_offset` of metadata 1.2, in sectors (4 KiB into the device).
pub const SUPER_OFFSET_1_2: u64 = 8;
/// Byte offset of the superblock on a 1.2 member.
pub const SUPERBLOCK_BYTE_OFFSET: u64 = SUPER_OFFSET_1_2 * 512;
/// The low 40 bits of `ctime`/`utime` are seconds (the high 24 microseconds, or 0).
pub const TIME_SECS_MASK: u64 = (1 << 40) - 1;
/// The kernel refuses smaller `data_size` values.
pub const MIN_DATA_SIZE: u64 = 10;
/// `resync_offset` of a clean array (`MaxSector`).
pub const RESYNC_CLEAN: u64 = u64::MAX;

// Byte offsets of the fields (`offsetof` on the system md_p.h, md-format.md §1.2).
mod off {
    pub const MAGIC: usize = 0;
    pub const MAJOR_VERSION: usize = 4;
    pub const FEATURE_MAP: usize = 8;
    pub const PAD0: usize = 12;
    pub const SET_UUID: usize = 16;
    pub const SET_NAME: usize = 32;
    pub const CTIME: usize = 64;
    pub const LEVEL: usize = 72;
    pub const LAYOUT: usize = 76;
    pub const SIZE: usize = 80;
    pub const CHUNKSIZE: usize = 88;
    pub const RAID_DISKS: usize = 92;
    pub const BITMAP_OFFSET: usize = 96;
    pub const NEW_LEVEL: usize = 100;
    pub const RESHAPE_POSITION: usize = 104;
    pub const DELTA_DISKS: usize = 112;
    pub const NEW_LAYOUT: usize = 116;
    pub const NEW_CHUNK: usize = 120;
    pub const NEW_OFFSET: usize = 124;
    pub const DATA_OFFSET: usize = 128;
    pub const DATA_SIZE: usize = 136;
    pub const SUPER_OFFSET: usize = 144;
    pub const RECOVERY_OFFSET: usize = 152;
    pub const DEV_NUMBER: usize = 160;
    pub const CNT_CORRECTED_READ: usize = 164;
    pub const DEVICE_UUID: usize = 168;
    pub const DEVFLAGS: usize = 184;
    pub const BBLOG_SHIFT: usize = 185;
    pub const BBLOG_SIZE: usize = 186;
    pub const BBLOG_OFFSET: usize = 188;
    pub const UTIME: usize = 192;
    pub const EVENTS: usize = 200;
    pub const RESYNC_OFFSET: usize = 208;
    pub const SB_CSUM: usize = 216;
    pub const MAX_DEV: usize = 220;
    /// Linux 6.19+: the array's logical block size (formerly the first 4 bytes of `pad3`).
    pub const LOGICAL_BLOCK_SIZE: usize = 224;
    pub const PAD3: usize = 228;
    pub const DEV_ROLES: usize = 256;
}
const _: () = assert!(off::SB_CSUM == SB_CSUM_OFFSET && off::DEV_ROLES == HEADER_BYTES && off::PAD3 + 28 == 256);

/// `devflags` bit 0: prefer other members for reads.
pub const DEVFLAG_WRITE_MOSTLY: u8 = 1;
/// `devflags` bit 1: fail fast on I/O errors.
pub const DEVFLAG_FAILFAST: u8 = 2;

/// One decoded md v1.2 superblock. Field names are md's; sector fields are 512-byte sectors.
///
/// Not stored: `magic`, `major_version`, `pad0`, `pad3` (fixed values, checked by decode, written
/// by encode) and `sb_csum` (verified by decode, computed by encode). `max_dev` is
/// `dev_roles.len()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub feature_map: FeatureMap,
    pub set_uuid: MdUuid,
    /// NUL-padded, normally `homehost:name` (see [`Superblock::name`]).
    pub set_name: [u8; 32],
    /// Creation time: low 40 bits seconds, high 24 bits microseconds or 0.
    pub ctime: u64,
    pub level: Level,
    /// Level-specific layout code (`md-format.md` §1.10).
    pub layout: u32,
    /// Sectors of each member used by the array ("Used Dev Size"); 0 for linear/raid0 created by mdadm.
    pub size: u64,
    /// Chunk in sectors (linear: rounding).
    pub chunksize: u32,
    pub raid_disks: u32,
    /// Signed sectors from the superblock to the bitmap; only valid with `BITMAP_OFFSET`. Holds the
    /// raw union with `ppl.offset`/`ppl.size` otherwise (preserved as is).
    pub bitmap_offset: i32,
    pub new_level: i32,
    pub reshape_position: u64,
    pub delta_disks: i32,
    pub new_layout: u32,
    pub new_chunk: u32,
    pub new_offset: i32,
    pub data_offset: u64,
    pub data_size: u64,
    pub super_offset: u64,
    /// Sectors from `data_offset` already rebuilt; only valid with `RECOVERY_OFFSET`.
    pub recovery_offset: u64,
    pub dev_number: u32,
    pub cnt_corrected_read: u32,
    pub device_uuid: MdUuid,
    pub devflags: u8,
    pub bblog_shift: u8,
    pub bblog_size: u16,
    /// Signed sectors from the superblock to the bad-block log.
    pub bblog_offset: i32,
    /// Update time, same encoding as `ctime`.
    pub utime: u64,
    pub events: u64,
    /// `u64::MAX` = clean.
    pub resync_offset: u64,
    /// The array's logical block size in bytes, which Linux 6.19+ records at the array's
    /// first run (byte 224, formerly padding); 0: not recorded (older kernels, mdadm, raidnbd).
    pub logical_block_size: u32,
    /// `max_dev` entries, indexed by `dev_number`.
    pub dev_roles: Vec<DevRole>,
}

fn bad(message: String) -> RaidError {
    RaidError::new(ErrorKind::BadMetadata, message)
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn uuid_at(b: &[u8], at: usize) -> MdUuid {
    MdUuid(b[at..at + 16].try_into().expect("16 bytes"))
}

impl Superblock {
    /// Decodes and validates the superblock in `bytes` (the 4 KiB read at byte 4096 of a member;
    /// at least `256 + 2·max_dev` bytes are needed, anything past that is ignored).
    ///
    /// Errors (kind [`ErrorKind::BadMetadata`]) say what is wrong: no md magic, bad checksum,
    /// a failed kernel check, or a feature raidnbd does not implement.
    pub fn decode(bytes: &[u8]) -> Result<Superblock, RaidError> {
        if bytes.len() < HEADER_BYTES {
            return Err(bad(format!("superblock truncated: {} bytes, the header alone is 256", bytes.len())));
        }
        let magic = u32_at(bytes, off::MAGIC);
        if magic != MD_SB_MAGIC {
            return Err(bad(format!("no md superblock (magic {magic:#010x}, expected {MD_SB_MAGIC:#010x})")));
        }
        let major_version = u32_at(bytes, off::MAJOR_VERSION);
        if major_version != 1 {
            return Err(bad(format!("md superblock major_version {major_version}, only version 1 is supported")));
        }
        let max_dev = u32_at(bytes, off::MAX_DEV);
        if max_dev > MAX_DEV {
            return Err(bad(format!("max_dev {max_dev} exceeds {MAX_DEV} (does not fit in 4 KiB)")));
        }
        let super_offset = u64_at(bytes, off::SUPER_OFFSET);
        if super_offset != SUPER_OFFSET_1_2 {
            let version = match super_offset {
                0 => "1.1",
                _ => "1.0 or corrupt",
            };
            return Err(bad(format!(
                "super_offset is {super_offset}, expected {SUPER_OFFSET_1_2}: metadata {version} is not supported (only 1.2)"
            )));
        }
        let feature_map = FeatureMap(u32_at(bytes, off::FEATURE_MAP));
        let unknown = feature_map.without(FeatureMap::ALL);
        if unknown.bits() != 0 {
            return Err(bad(format!(
                "unknown feature_map bits {:#x} (feature_map {:#x})",
                unknown.bits(),
                feature_map.0
            )));
        }
        let roles_end = HEADER_BYTES + 2 * max_dev as usize;
        if bytes.len() < roles_end {
            return Err(bad(format!(
                "superblock truncated: {} bytes, max_dev {max_dev} needs {roles_end}",
                bytes.len()
            )));
        }
        let stored_csum = u32_at(bytes, off::SB_CSUM);
        let computed_csum = sb_checksum(bytes, max_dev);
        if stored_csum != computed_csum {
            return Err(bad(format!(
                "bad superblock checksum: stored {stored_csum:#010x}, computed {computed_csum:#010x}"
            )));
        }
        let data_size = u64_at(bytes, off::DATA_SIZE);
        if data_size < MIN_DATA_SIZE {
            return Err(bad(format!("data_size {data_size} is below the minimum of {MIN_DATA_SIZE} sectors")));
        }
        if u32_at(bytes, off::PAD0) != 0 || bytes[off::PAD3..off::PAD3 + 28].iter().any(|&b| b != 0) {
            return Err(bad(
                "non-zero padding (pad0 at byte 12, pad3 at bytes 228..256): written by an md newer than Linux \
                 6.19 with features raidnbd does not know"
                    .into(),
            ));
        }
        let logical_block_size = u32_at(bytes, off::LOGICAL_BLOCK_SIZE);
        if logical_block_size != 0 && !valid_logical_block_size(logical_block_size) {
            return Err(bad(format!(
                "logical_block_size {logical_block_size} (byte 224, written by Linux 6.19+) is not a power of two \
                 between 512 and {MAX_LOGICAL_BLOCK_SIZE} bytes"
            )));
        }
        let data_offset = u64_at(bytes, off::DATA_OFFSET);
        let sb_end = super_offset + superblock_sectors(max_dev);
        if data_offset < sb_end {
            return Err(bad(format!(
                "data_offset {data_offset} overlaps the superblock (which ends at sector {sb_end})"
            )));
        }
        let new_offset = u32_at(bytes, off::NEW_OFFSET) as i32;
        if feature_map.contains(FeatureMap::RESHAPE_ACTIVE | FeatureMap::NEW_OFFSET) {
            let new_data_offset = data_offset.checked_add_signed(i64::from(new_offset));
            if new_data_offset.is_none_or(|o| o < sb_end) {
                return Err(bad(format!("new_offset {new_offset} moves the data onto the superblock")));
            }
        }
        let bblog_shift = bytes[off::BBLOG_SHIFT];
        let bblog_size = u16_at(bytes, off::BBLOG_SIZE);
        let bblog_offset = u32_at(bytes, off::BBLOG_OFFSET) as i32;
        if feature_map.contains(FeatureMap::BAD_BLOCKS) {
            if bblog_size > 8 {
                return Err(bad(format!("bad-block log of {bblog_size} sectors exceeds one page (8 sectors)")));
            }
            if bblog_offset == 0 {
                return Err(bad("BAD_BLOCKS set but bblog_offset is 0".into()));
            }
            if bblog_shift >= 64 {
                return Err(bad(format!("bblog_shift {bblog_shift} out of range")));
            }
        }
        let level_raw = u32_at(bytes, off::LEVEL) as i32;
        if feature_map.contains(FeatureMap::RAID0_LAYOUT) && level_raw != 0 {
            return Err(bad(format!("RAID0_LAYOUT feature set on a level {level_raw} array")));
        }
        let ppl = FeatureMap::PPL | FeatureMap::MULTIPLE_PPLS;
        if feature_map.intersects(ppl)
            && (feature_map.contains(ppl) || feature_map.intersects(FeatureMap::BITMAP_OFFSET | FeatureMap::JOURNAL))
        {
            return Err(bad(format!("contradictory PPL feature bits ({})", feature_map)));
        }

        // Beyond the kernel: what raidnbd cannot serve.
        let unsupported = feature_map & FeatureMap::UNSUPPORTED;
        if unsupported.bits() != 0 {
            return Err(bad(format!(
                "uses md features raidnbd does not implement: {}",
                unsupported.names().join(", ")
            )));
        }
        let Some(level) = Level::from_md(level_raw) else {
            return Err(bad(format!("raid level {level_raw} is not supported (linear, 0, 1, 4, 5, 6, 10 are)")));
        };
        let raid_disks = u32_at(bytes, off::RAID_DISKS);
        if raid_disks == 0 || raid_disks > MAX_DEV {
            return Err(bad(format!("raid_disks {raid_disks} out of range 1..={MAX_DEV}")));
        }
        if data_offset.checked_add(data_size).is_none() {
            return Err(bad(format!("data_offset {data_offset} + data_size {data_size} overflows")));
        }
        let mut dev_roles = Vec::with_capacity(max_dev as usize);
        for slot in 0..max_dev as usize {
            let raw = u16_at(bytes, off::DEV_ROLES + 2 * slot);
            let Some(role) = DevRole::from_raw(raw) else {
                return Err(bad(format!("dev_roles[{slot}] = {raw:#06x} is not a valid role")));
            };
            dev_roles.push(role);
        }

        Ok(Superblock {
            feature_map,
            set_uuid: uuid_at(bytes, off::SET_UUID),
            set_name: bytes[off::SET_NAME..off::SET_NAME + 32].try_into().expect("32 bytes"),
            ctime: u64_at(bytes, off::CTIME),
            level,
            layout: u32_at(bytes, off::LAYOUT),
            size: u64_at(bytes, off::SIZE),
            chunksize: u32_at(bytes, off::CHUNKSIZE),
            raid_disks,
            bitmap_offset: u32_at(bytes, off::BITMAP_OFFSET) as i32,
            new_level: u32_at(bytes, off::NEW_LEVEL) as i32,
            reshape_position: u64_at(bytes, off::RESHAPE_POSITION),
            delta_disks: u32_at(bytes, off::DELTA_DISKS) as i32,
            new_layout: u32_at(bytes, off::NEW_LAYOUT),
            new_chunk: u32_at(bytes, off::NEW_CHUNK),
            new_offset,
            data_offset,
            data_size,
            super_offset,
            recovery_offset: u64_at(bytes, off::RECOVERY_OFFSET),
            dev_number: u32_at(bytes, off::DEV_NUMBER),
            cnt_corrected_read: u32_at(bytes, off::CNT_CORRECTED_READ),
            device_uuid: uuid_at(bytes, off::DEVICE_UUID),
            devflags: bytes[off::DEVFLAGS],
            bblog_shift,
            bblog_size,
            bblog_offset,
            utime: u64_at(bytes, off::UTIME),
            events: u64_at(bytes, off::EVENTS),
            resync_offset: u64_at(bytes, off::RESYNC_OFFSET),
            logical_block_size,
            dev_roles,
        })
    }

    /// The 4096-byte superblock area: every field little-endian, zero padding, unused bytes zero,
    /// checksum over `256 + 2·max_dev` bytes computed last. Write it at byte 4096 of the member
    /// (md itself writes only the first [`Superblock::write_len_bytes`] bytes; the rest is zero).
    ///
    /// # Panics
    /// If `dev_roles` has more than [`MAX_DEV`] entries or holds an active role in md's reserved
    /// range (neither can come from decode or [`super::ArrayMetadata`]).
    pub fn encode(&self) -> Vec<u8> {
        let max_dev = self.max_dev();
        assert!(max_dev <= MAX_DEV, "{} dev_roles entries exceed md's {MAX_DEV}", self.dev_roles.len());
        let mut b = vec![0u8; SUPERBLOCK_BYTES];
        let mut put = |at: usize, bytes: &[u8]| b[at..at + bytes.len()].copy_from_slice(bytes);
        put(off::MAGIC, &MD_SB_MAGIC.to_le_bytes());
        put(off::MAJOR_VERSION, &1u32.to_le_bytes());
        put(off::FEATURE_MAP, &self.feature_map.0.to_le_bytes());
        put(off::SET_UUID, &self.set_uuid.0);
        put(off::SET_NAME, &self.set_name);
        put(off::CTIME, &self.ctime.to_le_bytes());
        put(off::LEVEL, &self.level.to_md().to_le_bytes());
        put(off::LAYOUT, &self.layout.to_le_bytes());
        put(off::SIZE, &self.size.to_le_bytes());
        put(off::CHUNKSIZE, &self.chunksize.to_le_bytes());
        put(off::RAID_DISKS, &self.raid_disks.to_le_bytes());
        put(off::BITMAP_OFFSET, &self.bitmap_offset.to_le_bytes());
        put(off::NEW_LEVEL, &self.new_level.to_le_bytes());
        put(off::RESHAPE_POSITION, &self.reshape_position.to_le_bytes());
        put(off::DELTA_DISKS, &self.delta_disks.to_le_bytes());
        put(off::NEW_LAYOUT, &self.new_layout.to_le_bytes());
        put(off::NEW_CHUNK, &self.new_chunk.to_le_bytes());
        put(off::NEW_OFFSET, &self.new_offset.to_le_bytes());
        put(off::DATA_OFFSET, &self.data_offset.to_le_bytes());
        put(off::DATA_SIZE, &self.data_size.to_le_bytes());
        put(off::SUPER_OFFSET, &self.super_offset.to_le_bytes());
        put(off::RECOVERY_OFFSET, &self.recovery_offset.to_le_bytes());
        put(off::DEV_NUMBER, &self.dev_number.to_le_bytes());
        put(off::CNT_CORRECTED_READ, &self.cnt_corrected_read.to_le_bytes());
        put(off::DEVICE_UUID, &self.device_uuid.0);
        put(off::DEVFLAGS, &[self.devflags]);
        put(off::BBLOG_SHIFT, &[self.bblog_shift]);
        put(off::BBLOG_SIZE, &self.bblog_size.to_le_bytes());
        put(off::BBLOG_OFFSET, &self.bblog_offset.to_le_bytes());
        put(off::UTIME, &self.utime.to_le_bytes());
        put(off::EVENTS, &self.events.to_le_bytes());
        put(off::RESYNC_OFFSET, &self.resync_offset.to_le_bytes());
        put(off::MAX_DEV, &max_dev.to_le_bytes());
        put(off::LOGICAL_BLOCK_SIZE, &self.logical_block_size.to_le_bytes());
        for (slot, role) in self.dev_roles.iter().enumerate() {
            put(off::DEV_ROLES + 2 * slot, &role.to_raw().to_le_bytes());
        }
        let csum = sb_checksum(&b, max_dev);
        b[off::SB_CSUM..off::SB_CSUM + 4].copy_from_slice(&csum.to_le_bytes());
        b
    }

    /// `max_dev`: the number of `dev_roles` entries.
    pub fn max_dev(&self) -> u32 {
        u32::try_from(self.dev_roles.len()).unwrap_or(u32::MAX)
    }

    /// Bytes md writes: `256 + 2·max_dev` rounded up to 512 (mdadm; the kernel rounds to the
    /// logical block size).
    pub fn write_len_bytes(&self) -> usize {
        superblock_sectors(self.max_dev()) as usize * 512
    }

    /// This device's own role per its own table (`dev_roles[dev_number]`; spare when the number
    /// is beyond the table, as md treats it).
    pub fn role(&self) -> DevRole {
        self.dev_roles.get(self.dev_number as usize).copied().unwrap_or(DevRole::Spare)
    }

    /// `set_name` up to the first NUL (lossy UTF-8), e.g. `myhost:data`.
    pub fn name(&self) -> String {
        name_from_bytes(&self.set_name)
    }

    /// Creation time in seconds since the epoch (low 40 bits).
    pub fn ctime_secs(&self) -> u64 {
        self.ctime & TIME_SECS_MASK
    }

    /// Update time in seconds since the epoch (low 40 bits).
    pub fn utime_secs(&self) -> u64 {
        self.utime & TIME_SECS_MASK
    }

    /// Whether the array is recorded clean (`resync_offset == MaxSector`).
    pub fn is_clean(&self) -> bool {
        self.resync_offset == RESYNC_CLEAN
    }

    /// The bitmap location relative to the superblock, when an internal bitmap is present.
    pub fn bitmap_offset(&self) -> Option<i32> {
        self.feature_map.contains(FeatureMap::BITMAP_OFFSET).then_some(self.bitmap_offset)
    }

    /// The rebuild checkpoint, when this device is only partly rebuilt.
    pub fn recovery_offset(&self) -> Option<u64> {
        self.feature_map.contains(FeatureMap::RECOVERY_OFFSET).then_some(self.recovery_offset)
    }

    /// Things decode accepted that the operator should know, for the log.
    pub fn notices(&self) -> Vec<String> {
        let mut notices = Vec::new();
        if self.feature_map.contains(FeatureMap::REPLACEMENT) {
            notices.push("device is an unfinished replacement; raidnbd treats it as a spare".into());
        }
        if self.logical_block_size != 0 {
            notices.push(format!(
                "the array's logical block size is {} bytes (recorded by Linux 6.19+): Linux 6.18 and older refuse \
                 this array (\"Some padding is non-zero\") unless md_mod.check_new_feature=0",
                self.logical_block_size
            ));
        }
        notices
    }
}

/// Largest array logical block size accepted (the largest minimum block size NBD allows).
pub const MAX_LOGICAL_BLOCK_SIZE: u32 = 64 << 10;

/// Whether `bytes` is a logical block size an array may have: a power of two from 512 to
/// [`MAX_LOGICAL_BLOCK_SIZE`].
pub fn valid_logical_block_size(bytes: u32) -> bool {
    bytes.is_power_of_two() && (512..=MAX_LOGICAL_BLOCK_SIZE).contains(&bytes)
}

/// Sectors covered by a superblock with `max_dev` roles: `⌈(256 + 2·max_dev) / 512⌉`.
pub fn superblock_sectors(max_dev: u32) -> u64 {
    (HEADER_BYTES as u64 + 2 * u64::from(max_dev)).div_ceil(512)
}

/// `set_name` bytes up to the first NUL, lossy UTF-8.
pub fn name_from_bytes(set_name: &[u8; 32]) -> String {
    let len = set_name.iter().position(|&b| b == 0).unwrap_or(set_name.len());
    String::from_utf8_lossy(&set_name[..len]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_sectors_rounds_up() {
        assert_eq!(superblock_sectors(0), 1);
        assert_eq!(superblock_sectors(128), 1);
        assert_eq!(superblock_sectors(129), 2);
        assert_eq!(superblock_sectors(384), 2);
        assert_eq!(superblock_sectors(1920), 8);
    }
}
