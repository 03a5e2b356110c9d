//! `ArrayMetadata`: the in-memory model of one array's md metadata, which the engine keeps,
//! mutates on state changes, and turns back into one superblock per member.
//!
//! ```text
//!   create(...) ──┐                      ┌── superblock_for(member_index) ─► Superblock::encode()
//!                 ├─► ArrayMetadata ─────┤                                   written by the engine
//!   assemble(...) ┘    array fields      └── mark_faulty / set_role / bump_events / set_dirty ...
//!                      + members[]
//! ```
//!
//! Array-wide fields (uuid, name, geometry, events, clean/dirty, the `dev_roles` table) are the
//! same on every member; per-member records hold what differs per device (dev_number, device
//! uuid, offsets, recovery checkpoint, per-device feature bits, devflags, bad-block log).
//! This mirrors the kernel's `super_1_sync`, which rewrites each member's superblock from the
//! array state plus that member's own fields. Pure data: no I/O, no clock (callers pass times).
//!
//! Invariants (asserted): `dev_roles.len() <= 1920`; every member's `dev_number` is unique.
//! A `dev_number` beyond the table means "spare", as md reads it.

use crate::error::{ErrorKind, RaidError};
use crate::geometry::Level;

use super::dev_role::DevRole;
use super::feature::FeatureMap;
use super::superblock::{MAX_DEV, RESYNC_CLEAN, Superblock, TIME_SECS_MASK, name_from_bytes};
use super::uuid::MdUuid;

/// What differs per member device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberMetadata {
    /// Permanent slot in `dev_roles` (not the role).
    pub dev_number: u32,
    pub device_uuid: MdUuid,
    /// Sector where this member's data starts.
    pub data_offset: u64,
    /// Sectors available for data from `data_offset`.
    pub data_size: u64,
    /// Sector of the superblock (8 for 1.2).
    pub super_offset: u64,
    /// `Some(sectors rebuilt from data_offset)` while the member is partly rebuilt
    /// (feature `RECOVERY_OFFSET`); `None` when it is in sync.
    pub recovery_offset: Option<u64>,
    /// Per-device feature bits other than `RECOVERY_OFFSET` (BAD_BLOCKS, REPLACEMENT, ...),
    /// preserved as read.
    pub features: FeatureMap,
    /// `DEVFLAG_WRITE_MOSTLY` / `DEVFLAG_FAILFAST`.
    pub devflags: u8,
    pub bblog_shift: u8,
    pub bblog_size: u16,
    pub bblog_offset: i32,
    pub cnt_corrected_read: u32,
    /// Raw `new_offset` (only meaningful with reshape, which raidnbd refuses); preserved.
    pub new_offset: i32,
}

/// One array's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArrayMetadata {
    pub uuid: MdUuid,
    /// Raw `set_name` (NUL-padded `homehost:name`).
    pub set_name: [u8; 32],
    /// Raw creation time (low 40 bits seconds).
    pub ctime: u64,
    pub level: Level,
    pub layout: u32,
    pub chunk_sectors: u32,
    pub raid_disks: u32,
    /// Component size in sectors (md `size`); 0 for linear/raid0 made by mdadm.
    pub size: u64,
    pub events: u64,
    /// `u64::MAX` = clean; otherwise the resync checkpoint (0 = dirty from the start).
    pub resync_offset: u64,
    /// Raw update time (low 40 bits seconds).
    pub utime: u64,
    /// Array-wide feature bits (`BITMAP_OFFSET`, `RAID0_LAYOUT`); per-device bits live in members.
    pub features: FeatureMap,
    /// Sectors from the superblock to the internal bitmap, when `features` has `BITMAP_OFFSET`;
    /// otherwise the raw union value, preserved.
    pub bitmap_offset: i32,
    /// Reshape fields, preserved as read (raidnbd refuses active reshapes).
    pub new_level: i32,
    pub reshape_position: u64,
    pub delta_disks: i32,
    pub new_layout: u32,
    pub new_chunk: u32,
    /// The array's logical block size as Linux 6.19+ records it (0: not recorded): kept as read,
    /// written back to every member.
    pub logical_block_size: u32,
    /// `max_dev` entries indexed by `dev_number`.
    pub dev_roles: Vec<DevRole>,
    /// The write journal's tail (sectors from its data offset), kept in the `recovery_offset`
    /// slot of the journal device's superblock only (feature `JOURNAL`).
    pub journal_tail: u64,
    /// The member devices this metadata describes (see [`super::Assembly`] for which candidate each
    /// came from; [`super::create()`] lists present slots in slot order).
    pub members: Vec<MemberMetadata>,
}

fn no_member(dev_number: u32) -> RaidError {
    RaidError::new(ErrorKind::BadMetadata, format!("no member with dev_number {dev_number} in this array"))
}

impl ArrayMetadata {
    /// Array-wide fields taken from `sb`, with no members yet.
    pub fn from_superblock(sb: &Superblock) -> ArrayMetadata {
        ArrayMetadata {
            uuid: sb.set_uuid,
            set_name: sb.set_name,
            ctime: sb.ctime,
            level: sb.level,
            layout: sb.layout,
            chunk_sectors: sb.chunksize,
            raid_disks: sb.raid_disks,
            size: sb.size,
            events: sb.events,
            resync_offset: sb.resync_offset,
            utime: sb.utime,
            features: sb.feature_map.array_bits(),
            bitmap_offset: sb.bitmap_offset,
            new_level: sb.new_level,
            reshape_position: sb.reshape_position,
            delta_disks: sb.delta_disks,
            new_layout: sb.new_layout,
            new_chunk: sb.new_chunk,
            logical_block_size: sb.logical_block_size,
            dev_roles: sb.dev_roles.clone(),
            journal_tail: 0,
            members: Vec::new(),
        }
    }

    /// The per-device fields of `sb` as a member record.
    pub fn member_from_superblock(sb: &Superblock) -> MemberMetadata {
        let device_bits = sb.feature_map.device_bits();
        MemberMetadata {
            dev_number: sb.dev_number,
            device_uuid: sb.device_uuid,
            data_offset: sb.data_offset,
            data_size: sb.data_size,
            super_offset: sb.super_offset,
            recovery_offset: sb.recovery_offset(),
            features: device_bits.without(FeatureMap::RECOVERY_OFFSET),
            devflags: sb.devflags,
            bblog_shift: sb.bblog_shift,
            bblog_size: sb.bblog_size,
            bblog_offset: sb.bblog_offset,
            cnt_corrected_read: sb.cnt_corrected_read,
            new_offset: sb.new_offset,
        }
    }

    /// The superblock to write on `members[member_index]`: array fields + that member's fields.
    ///
    /// # Panics
    /// If `member_index` is out of range.
    pub fn superblock_for(&self, member_index: usize) -> Superblock {
        self.check_invariants();
        let member = &self.members[member_index];
        let mut feature_map = self.features.array_bits() | member.features.device_bits();
        let journal = self.role(member.dev_number) == DevRole::Journal;
        if member.recovery_offset.is_some() && !journal {
            feature_map |= FeatureMap::RECOVERY_OFFSET;
        } else {
            feature_map.remove(FeatureMap::RECOVERY_OFFSET);
        }
        Superblock {
            feature_map,
            set_uuid: self.uuid,
            set_name: self.set_name,
            ctime: self.ctime,
            level: self.level,
            layout: self.layout,
            size: self.size,
            chunksize: self.chunk_sectors,
            raid_disks: self.raid_disks,
            bitmap_offset: self.bitmap_offset,
            new_level: self.new_level,
            reshape_position: self.reshape_position,
            delta_disks: self.delta_disks,
            new_layout: self.new_layout,
            new_chunk: self.new_chunk,
            new_offset: member.new_offset,
            data_offset: member.data_offset,
            data_size: member.data_size,
            super_offset: member.super_offset,
            recovery_offset: if journal { self.journal_tail } else { member.recovery_offset.unwrap_or(0) },
            dev_number: member.dev_number,
            cnt_corrected_read: member.cnt_corrected_read,
            device_uuid: member.device_uuid,
            devflags: member.devflags,
            bblog_shift: member.bblog_shift,
            bblog_size: member.bblog_size,
            bblog_offset: member.bblog_offset,
            utime: self.utime,
            events: self.events,
            resync_offset: self.resync_offset,
            logical_block_size: self.logical_block_size,
            dev_roles: self.dev_roles.clone(),
        }
    }

    /// The block size clients must address the array in: the one Linux 6.19+ recorded, else
    /// 512 (as md: members of raidnbd arrays take 512-byte I/O).
    pub fn logical_block_bytes(&self) -> u32 {
        self.logical_block_size.max(512)
    }

    /// Index into `members` of the device with `dev_number`.
    pub fn member_index(&self, dev_number: u32) -> Option<usize> {
        self.members.iter().position(|m| m.dev_number == dev_number)
    }

    /// The role recorded for `dev_number` (spare when beyond the table, as md reads it).
    pub fn role(&self, dev_number: u32) -> DevRole {
        self.dev_roles.get(dev_number as usize).copied().unwrap_or(DevRole::Spare)
    }

    /// The `dev_number` recorded active at `role`, if any.
    pub fn dev_number_for_role(&self, role: usize) -> Option<u32> {
        self.dev_roles.iter().position(|r| r.active() == Some(role)).map(|slot| slot as u32)
    }

    /// `set_name` as text, e.g. `myhost:data`.
    pub fn name(&self) -> String {
        name_from_bytes(&self.set_name)
    }

    /// The name without the `homehost:` prefix, as mdadm shows under `/dev/md/`.
    pub fn short_name(&self) -> String {
        let name = self.name();
        match name.split_once(':') {
            Some((_, short)) => short.to_string(),
            None => name,
        }
    }

    /// Records `dev_number` as failed (`0xFFFE`). Call [`Self::bump_events`] before writing.
    pub fn mark_faulty(&mut self, dev_number: u32) -> Result<(), RaidError> {
        self.set_role(dev_number, DevRole::Faulty)
    }

    /// Sets the role of `dev_number`, growing `dev_roles` (with spare entries) when the number is
    /// beyond the table, as the kernel grows `max_dev`.
    pub fn set_role(&mut self, dev_number: u32, role: DevRole) -> Result<(), RaidError> {
        if dev_number >= MAX_DEV {
            return Err(RaidError::new(
                ErrorKind::BadMetadata,
                format!("dev_number {dev_number} does not fit md's {MAX_DEV}-entry role table"),
            ));
        }
        if let DevRole::Active(r) = role
            && u32::from(r) >= self.raid_disks
        {
            return Err(RaidError::new(
                ErrorKind::BadMetadata,
                format!("role {r} is out of range for a {}-member array", self.raid_disks),
            ));
        }
        let slot = dev_number as usize;
        if slot >= self.dev_roles.len() {
            self.dev_roles.resize(slot + 1, DevRole::Spare);
        }
        self.dev_roles[slot] = role;
        Ok(())
    }

    /// Every metadata change is committed with a new event count (md_update_sb).
    pub fn bump_events(&mut self) {
        self.events = self.events.wrapping_add(1);
    }

    /// Marks the array dirty (`resync_offset = 0`): do it, and write it, before the first data
    /// write after a clean period.
    pub fn set_dirty(&mut self) {
        self.resync_offset = 0;
    }

    /// Marks the array clean (`resync_offset = MaxSector`) once writes are quiet and in sync.
    pub fn set_clean(&mut self) {
        self.resync_offset = RESYNC_CLEAN;
    }

    pub fn is_clean(&self) -> bool {
        self.resync_offset == RESYNC_CLEAN
    }

    /// Records a resync checkpoint (resync address space, see `md-format.md` §1.9).
    pub fn set_resync_offset(&mut self, resync_offset: u64) {
        self.resync_offset = resync_offset;
    }

    /// Sets (`Some`) or clears (`None` = fully in sync) the rebuild checkpoint of `dev_number`.
    pub fn set_recovery_offset(&mut self, dev_number: u32, recovery_offset: Option<u64>) -> Result<(), RaidError> {
        let index = self.member_index(dev_number).ok_or_else(|| no_member(dev_number))?;
        self.members[index].recovery_offset = recovery_offset;
        Ok(())
    }

    /// Sets the update time (seconds; the microsecond bits are left zero, as the kernel writes it).
    pub fn touch_utime(&mut self, now_secs: u64) {
        self.utime = now_secs & TIME_SECS_MASK;
    }

    /// Creation time in seconds.
    pub fn ctime_secs(&self) -> u64 {
        self.ctime & TIME_SECS_MASK
    }

    /// Update time in seconds.
    pub fn utime_secs(&self) -> u64 {
        self.utime & TIME_SECS_MASK
    }

    /// The internal bitmap's offset from the superblock, if there is one.
    pub fn bitmap_offset(&self) -> Option<i32> {
        self.features.contains(FeatureMap::BITMAP_OFFSET).then_some(self.bitmap_offset)
    }

    /// md's PPL area: (sectors from the superblock, size in sectors), when the array has one.
    /// It shares the superblock field of `bitmap_offset` (`ppl.offset`, `ppl.size`).
    pub fn has_journal(&self) -> bool {
        self.features.contains(FeatureMap::JOURNAL)
    }

    /// The record of the journal device, if the array has one among its members.
    pub fn journal_member(&self) -> Option<usize> {
        self.members.iter().position(|m| self.role(m.dev_number) == DevRole::Journal)
    }

    pub fn ppl_area(&self) -> Option<(i16, u16)> {
        let raw = self.bitmap_offset as u32;
        self.features.intersects(FeatureMap::ANY_PPL).then_some((raw as u16 as i16, (raw >> 16) as u16))
    }

    /// Gives the array a PPL area (mdadm `--consistency-policy=ppl`).
    pub fn set_ppl_area(&mut self, offset_sectors: i16, size_sectors: u16) {
        self.bitmap_offset = ((u32::from(size_sectors) << 16) | u32::from(offset_sectors as u16)) as i32;
        self.features.remove(FeatureMap::BITMAP_OFFSET | FeatureMap::MULTIPLE_PPLS);
        self.features.insert(FeatureMap::PPL);
    }

    fn check_invariants(&self) {
        assert!(self.dev_roles.len() <= MAX_DEV as usize, "dev_roles has {} entries", self.dev_roles.len());
        debug_assert!(
            self.members
                .iter()
                .enumerate()
                .all(|(i, m)| self.members[..i].iter().all(|o| o.dev_number != m.dev_number)),
            "two members share a dev_number"
        );
    }
}
