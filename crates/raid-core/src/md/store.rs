//! `MdStore`: the engine's [`MetadataStore`] for md v1.2 arrays.
//!
//! It owns the array's [`ArrayMetadata`], applies each [`StateChange`] as the kernel's
//! `md_update_sb` would (new event count, update time), and renders one superblock per
//! device that belongs to the array. Engine device ids are indexes into
//! `metadata.members`; devices that leave the array keep their record (so ids stay
//! stable) but get no more superblock writes.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::bad_ranges::BadRanges;
use crate::buf::AlignedBuf;
use crate::engine::{MetadataStore, MetadataSummary, StateChange, SuperblockWrite};
use crate::error::{ErrorKind, RaidError};
use crate::geometry::Level;
use crate::md::{
    ArrayMetadata, Bitmap, DevRole, FeatureMap, MAX_DEV, MdUuid, MemberMetadata, SUPERBLOCK_BYTE_OFFSET,
    encode_bad_blocks,
};

pub struct MdStore {
    metadata: ArrayMetadata,
    /// Per member record: still part of the array (gets superblock writes).
    present: Vec<bool>,
    /// The internal write-intent bitmap, when the array has one.
    bitmap: Option<Bitmap>,
    /// md's `MD_JOURNAL_CLEAN`: the array has a journal and was clean when assembled, so
    /// `resync_offset` stays "clean" while it is dirty (the journal replay replaces the
    /// resync after a crash).
    journal_clean: bool,
}

impl MdStore {
    /// `present[i]` says whether `metadata.members[i]` is in the array now.
    pub fn new(metadata: ArrayMetadata, present: Vec<bool>) -> Self {
        assert_eq!(present.len(), metadata.members.len(), "one flag per member record");
        let journal_clean = metadata.has_journal() && metadata.is_clean();
        Self { metadata, present, bitmap: None, journal_clean }
    }

    /// Keeps `bitmap` (the array's internal bitmap) up to date with the superblocks.
    pub fn with_bitmap(mut self, bitmap: Bitmap) -> Self {
        self.bitmap = Some(bitmap);
        self
    }

    /// Byte offset of the internal bitmap on every member.
    fn bitmap_offset_bytes(&self) -> u64 {
        (SUPERBLOCK_BYTE_OFFSET as i64 + i64::from(self.metadata.bitmap_offset) * 512) as u64
    }

    /// Bytes the bitmap may take: what its header reserves (mdadm and raidnbd write it; the
    /// size it has now when it says nothing), never into the bad-block log or the data.
    fn bitmap_room_bytes(&self, bitmap: &Bitmap) -> u64 {
        let reserved = match u64::from(bitmap.sectors_reserved) {
            0 => bitmap.encode().len() as u64 / 512,
            sectors => sectors,
        };
        let at = i64::from(self.metadata.bitmap_offset);
        let mut room = reserved as i64;
        let Some(first) = self.metadata.members.first() else { return 0 };
        if first.bblog_offset > at as i32 && first.bblog_size > 0 {
            room = room.min(i64::from(first.bblog_offset) - at);
        }
        let data_from_sb = first.data_offset as i64 - (SUPERBLOCK_BYTE_OFFSET / 512) as i64;
        room = room.min(data_from_sb - at);
        room.max(0) as u64 * 512
    }

    fn bitmap_writes(&self) -> Vec<SuperblockWrite> {
        let Some(bitmap) = &self.bitmap else { return Vec::new() };
        let image = bitmap.encode();
        (0..self.metadata.members.len())
            .filter(|&i| self.present[i])
            .map(|device| SuperblockWrite {
                device,
                offset_bytes: self.bitmap_offset_bytes(),
                image: AlignedBuf::from_slice(&image),
            })
            .collect()
    }

    pub fn metadata(&self) -> &ArrayMetadata {
        &self.metadata
    }

    fn dev_number(&self, device: usize) -> Result<u32, RaidError> {
        self.metadata
            .members
            .get(device)
            .map(|m| m.dev_number)
            .ok_or_else(|| RaidError::new(ErrorKind::BadMetadata, format!("no device {device} in the array metadata")))
    }

    /// First `dev_number` no member record uses and no role claims (mdadm --add picks the
    /// first free slot). Records of devices that left keep their number for this run, so
    /// every record's number stays unique.
    fn free_dev_number(&self) -> Result<u32, RaidError> {
        (0..MAX_DEV)
            .find(|n| {
                !self.metadata.members.iter().any(|m| m.dev_number == *n)
                    && self.metadata.dev_roles.get(*n as usize).is_none_or(|r| r.active().is_none())
            })
            .ok_or_else(|| RaidError::new(ErrorKind::Refused, "no free slot in md's device table"))
    }

    fn add_member(&mut self, device: usize, device_bytes: u64) -> Result<(), RaidError> {
        if device != self.metadata.members.len() {
            return Err(RaidError::new(ErrorKind::BadMetadata, format!("device id {device} is not the next one")));
        }
        let template = self.metadata.members.first().cloned().ok_or_else(|| {
            RaidError::new(ErrorKind::BadMetadata, "array has no member record to copy the layout from")
        })?;
        let dev_number = self.free_dev_number()?;
        let data_size = (device_bytes / 512).saturating_sub(template.data_offset);
        let member = MemberMetadata {
            dev_number,
            device_uuid: random_uuid(),
            data_size,
            recovery_offset: None,
            features: FeatureMap(0),
            devflags: 0,
            cnt_corrected_read: 0,
            new_offset: 0,
            ..template
        };
        self.metadata.members.push(member);
        self.present.push(true);
        self.metadata.set_role(dev_number, DevRole::Spare)
    }
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A random device UUID (std's randomly seeded hasher; no RNG dependency needed).
fn random_uuid() -> MdUuid {
    let mut bytes = [0u8; 16];
    for half in bytes.chunks_mut(8) {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(now_secs());
        half.copy_from_slice(&h.finish().to_le_bytes());
    }
    MdUuid(bytes)
}

impl MetadataStore for MdStore {
    fn summary(&self) -> MetadataSummary {
        MetadataSummary {
            uuid: self.metadata.uuid.0,
            events: self.metadata.events,
            bitmap_events_cleared: self.bitmap.as_ref().map(|b| b.events_cleared),
            headroom_sectors: Some(self.metadata.headroom_sectors()),
            data_area_sectors: Some(self.metadata.data_area_sectors()),
            bitmap_room_chunks: self.bitmap.as_ref().map(|b| b.room_chunks(self.bitmap_room_bytes(b))),
        }
    }

    fn apply(&mut self, change: &StateChange) -> Result<Vec<SuperblockWrite>, RaidError> {
        // A new bad-block log image goes before the superblock that says it is not empty.
        let mut bbl = None;
        match *change {
            StateChange::Dirty if self.journal_clean => {}
            StateChange::Dirty => self.metadata.set_dirty(),
            StateChange::JournalTail { sectors } => self.metadata.journal_tail = sectors,
            StateChange::Clean => self.metadata.set_clean(),
            StateChange::ResyncProgress { sectors } => self.metadata.set_resync_offset(sectors),
            StateChange::Faulty { device } => {
                let dev = self.dev_number(device)?;
                self.metadata.mark_faulty(dev)?;
            }
            StateChange::AddSpare { device, device_bytes } => self.add_member(device, device_bytes)?,
            StateChange::Assign { device, role, replacement } => {
                let dev = self.dev_number(device)?;
                self.metadata.set_role(dev, DevRole::Active(role as u16))?;
                self.metadata.set_recovery_offset(dev, Some(0))?;
                let features = &mut self.metadata.members[device].features;
                // Rebuilt from sector 0: what its old bad-block log said no longer holds.
                features.remove(FeatureMap::BAD_BLOCKS);
                if replacement {
                    features.insert(FeatureMap::REPLACEMENT)
                } else {
                    features.remove(FeatureMap::REPLACEMENT)
                }
            }
            StateChange::RecoveryProgress { device, sectors } => {
                let dev = self.dev_number(device)?;
                self.metadata.set_recovery_offset(dev, Some(sectors))?;
            }
            StateChange::InSync { device } => {
                let dev = self.dev_number(device)?;
                self.metadata.set_recovery_offset(dev, None)?;
            }
            StateChange::Replaced { old, new } => {
                let (old_dev, new_dev) = (self.dev_number(old)?, self.dev_number(new)?);
                self.metadata.set_recovery_offset(new_dev, None)?;
                self.metadata.members[new].features.remove(FeatureMap::REPLACEMENT);
                self.metadata.set_role(old_dev, DevRole::Faulty)?;
                self.present[old] = false;
            }
            StateChange::Remove { device } => {
                let dev = self.dev_number(device)?;
                self.metadata.set_role(dev, DevRole::Faulty)?;
                self.present[device] = false;
            }
            StateChange::BadBlocks { device, ref ranges } => {
                let member = self.metadata.members.get(device).ok_or_else(|| {
                    RaidError::new(ErrorKind::BadMetadata, format!("no device {device} in the array metadata"))
                })?;
                if member.bblog_size == 0 || member.bblog_offset == 0 {
                    return Err(RaidError::new(ErrorKind::Refused, format!("device {device} has no bad-block log")));
                }
                let ranges = BadRanges::from_ranges(ranges.iter().map(|&(s, l)| (s + member.data_offset, l)));
                let image = encode_bad_blocks(&ranges, member.bblog_shift, member.bblog_size)?;
                let offset_bytes = (SUPERBLOCK_BYTE_OFFSET as i64 + i64::from(member.bblog_offset) * 512) as u64;
                bbl = Some(SuperblockWrite { device, offset_bytes, image: AlignedBuf::from_slice(&image) });
                let features = &mut self.metadata.members[device].features;
                if ranges.is_empty() {
                    features.remove(FeatureMap::BAD_BLOCKS);
                } else {
                    features.insert(FeatureMap::BAD_BLOCKS);
                }
            }
            StateChange::ReshapeStart {
                raid_disks,
                ref new_roles,
                new_layout,
                new_chunk_sectors,
                offset_delta_sectors,
                position_sectors,
            } => {
                let previous_raid_disks = self.metadata.raid_disks as usize;
                self.metadata.start_reshape(
                    raid_disks,
                    new_layout,
                    new_chunk_sectors,
                    offset_delta_sectors,
                    position_sectors,
                );
                for &(device, role) in new_roles {
                    // A role the old layout never had: in sync from the start (md's
                    // raid5_start_reshape), as the new layout reaches only what it wrote. One
                    // the old layout had (a missing one filled): recovered by the reshape, its
                    // recovery offset following the front.
                    let dev = self.dev_number(device)?;
                    self.metadata.set_role(dev, DevRole::Active(role as u16))?;
                    let recovery = (role < previous_raid_disks).then_some(0);
                    self.metadata.set_recovery_offset(dev, recovery)?;
                }
            }
            StateChange::ReshapeProgress { position_sectors } => self.metadata.set_reshape_position(position_sectors),
            StateChange::ReshapeEnd { then_raid0, resync_sectors, bitmap_chunk } => {
                self.metadata.finish_reshape();
                if let (Some(bitmap), Some(chunk_sectors)) = (self.bitmap.as_mut(), bitmap_chunk) {
                    bitmap.resize(resync_sectors, chunk_sectors * 512, 0..0)?;
                }
                if then_raid0 {
                    let m = &self.metadata;
                    let (chunk, raid_disks, size) = (m.chunk_sectors, m.raid_disks as usize - 1, m.size);
                    // The parity role's device, if any (a shrink's), is a spare (as md's
                    // `level_store`: slots past raid_disks lose their role).
                    if let Some(dev) = m.dev_number_for_role(raid_disks) {
                        self.metadata.set_role(dev, DevRole::Spare)?;
                    }
                    self.metadata.take_over(Level::Raid0, 0, chunk, raid_disks, size, true);
                }
            }
            StateChange::Append { raid_disks, ref new_roles } => {
                let devs =
                    new_roles.iter().map(|&(device, _)| self.dev_number(device)).collect::<Result<Vec<_>, _>>()?;
                self.metadata.raid_disks = raid_disks as u32;
                for (dev, &(_, role)) in devs.into_iter().zip(new_roles) {
                    self.metadata.set_role(dev, DevRole::Active(role as u16))?;
                    self.metadata.set_recovery_offset(dev, None)?;
                }
            }
            StateChange::Takeover {
                level,
                layout,
                chunk_sectors,
                raid_disks,
                size_sectors,
                data_size_is_size,
                dropped_device,
            } => {
                if let Some(device) = dropped_device {
                    let dev = self.dev_number(device)?;
                    self.metadata.set_role(dev, DevRole::Spare)?;
                }
                let from_raid0 = self.metadata.level == Level::Raid0;
                self.metadata.take_over(level, layout, chunk_sectors, raid_disks, size_sectors, data_size_is_size);
                if from_raid0 {
                    // Its parity role is missing: nothing to resync (md's
                    // `raid45_takeover_raid0` sets `recovery_cp = MaxSector`).
                    self.metadata.set_clean();
                }
            }
            StateChange::Resize {
                used_sectors,
                ref data_sectors,
                resync_sectors,
                bitmap_chunk_sectors,
                ref bitmap_dirty,
                resync_offset,
            } => {
                self.metadata.size = used_sectors;
                for &(device, sectors) in data_sectors {
                    let member = self.metadata.members.get_mut(device).ok_or_else(|| {
                        RaidError::new(ErrorKind::BadMetadata, format!("no device {device} in the array metadata"))
                    })?;
                    member.data_size = sectors;
                }
                if let Some(offset) = resync_offset {
                    self.metadata.set_resync_offset(offset);
                }
                if let (Some(bitmap), Some(chunk_sectors)) = (self.bitmap.as_mut(), bitmap_chunk_sectors) {
                    bitmap.resize(resync_sectors, chunk_sectors * 512, bitmap_dirty.clone())?;
                }
            }
            StateChange::Bitmap { ref set, ref clear } => {
                // Bit changes rewrite only the bitmap: no new event count (as md).
                let events = self.metadata.events;
                let Some(bitmap) = self.bitmap.as_mut() else { return Ok(Vec::new()) };
                for &c in set {
                    bitmap.set(c, true);
                }
                for &c in clear {
                    bitmap.set(c, false);
                }
                if !clear.is_empty() {
                    bitmap.events_cleared = events;
                }
                return Ok(self.bitmap_writes());
            }
        }
        self.metadata.bump_events();
        self.metadata.touch_utime(now_secs());
        // md writes the bitmap header with the superblock's event count first: a bitmap
        // behind the superblocks is stale and means a full resync.
        if let Some(bitmap) = self.bitmap.as_mut() {
            bitmap.events = self.metadata.events;
        }
        let mut writes = self.bitmap_writes();
        writes.extend(bbl);
        writes.extend((0..self.metadata.members.len()).filter(|&i| self.present[i]).map(|device| {
            let image = self.metadata.superblock_for(device).encode();
            SuperblockWrite { device, offset_bytes: SUPERBLOCK_BYTE_OFFSET, image: AlignedBuf::from_slice(&image) }
        }));
        Ok(writes)
    }
}
