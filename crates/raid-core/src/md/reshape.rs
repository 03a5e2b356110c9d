//! md's reshape in the metadata (`doc/md-reshape.md` has the kernel's rules, cited): the
//! fields while one runs, the checks on an array found mid-reshape, and what starting,
//! advancing and finishing one writes.
//!
//! While a reshape runs (feature `RESHAPE_ACTIVE`): `raid_disks` is the new count and
//! `delta_disks` new minus old; `level`, `layout`, `chunksize` and each device's `data_offset`
//! are the old ones until the end; `new_layout`, `new_chunk` and each device's `new_offset`
//! (with its `NEW_OFFSET` bit: the data start moves, no backup file) give the new layout;
//! `reshape_position` is the array sector the new layout reaches, always a multiple of
//! `max(old chunk, new chunk) × new data disks`. At the end `data_offset` moves by
//! `new_offset`, `data_size` the other way, and layout and chunk become the new ones.
//!
//! raidnbd starts and continues md's no-backup reshapes of raid4/5/6 and of raid10's near
//! layouts (whose `reshape_position` may be any sector): those that add members or change the
//! layout or chunk go forward, moving the data start into the headroom before
//! the data; those that remove members go backwards (md's `reshape_backwards`), moving the
//! data start into the room after the data. That is what mdadm does without `--backup-file`
//! when there is room. Anything else found on disk is refused naming the mdadm command that
//! continues it.

use crate::error::{ErrorKind, RaidError};
use crate::geometry::{Level, Raid10Geometry, Raid10Layout};

use super::dev_role::DevRole;
use super::feature::FeatureMap;
use super::metadata::{ArrayMetadata, MemberMetadata};
use super::superblock::{Superblock, superblock_sectors};

/// md puts a moved data start at least this far past the superblock (36 KiB:
/// `super_1_allow_new_offset`).
const NEW_OFFSET_GAP_SECTORS: u64 = (32 + 4) * 2;

/// A reshape in progress, as the metadata describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReshapeState {
    /// Roles before (the old layout's count).
    pub previous_raid_disks: usize,
    pub new_layout: u32,
    pub new_chunk_sectors: u32,
    /// md's `reshape_position` (array sectors).
    pub position_sectors: u64,
    /// Where the new layout ends (md's `raid5_size`: the used size rounded down to both
    /// chunks, times the smaller count of data disks): a backwards reshape starts there.
    pub end_sectors: u64,
    /// How far every device's data start moves (md's `new_offset`; negative: into the headroom
    /// before the data, a forward reshape; positive: into the room after it, backwards).
    pub offset_delta_sectors: i64,
}

impl ReshapeState {
    /// Whether it runs from the end down (md: `delta_disks < 0`; raidnbd starts no backwards
    /// reshape that keeps the member count).
    pub fn is_backwards(&self) -> bool {
        self.offset_delta_sectors > 0
    }

    /// Array sectors already in the new layout.
    pub fn done_sectors(&self) -> u64 {
        if self.is_backwards() { self.end_sectors.saturating_sub(self.position_sectors) } else { self.position_sectors }
    }
}

fn cannot(message: String) -> RaidError {
    RaidError::new(ErrorKind::CannotAssemble, message)
}

/// Whether a device's own superblock `own` says a forward reshape runs that the freshest,
/// `fresh`, says has ended: a member it was recovering is whole (every row was written
/// before the end was recorded).
pub(crate) fn missed_forward_reshape_end(own: &Superblock, fresh: &Superblock) -> bool {
    own.feature_map.contains(FeatureMap::RESHAPE_ACTIVE)
        && !fresh.feature_map.contains(FeatureMap::RESHAPE_ACTIVE)
        && own.delta_disks >= 0
}

impl MemberMetadata {
    /// A device whose own superblock `own` missed the update that started or ended a reshape
    /// (md assembles a device one event behind the freshest, `fresh`): its data offsets as
    /// they are now. Started: it moves its data start with the others (the freshest's
    /// `new_offset`); ended: its data start has moved. One that missed a checkpoint of a
    /// forward reshape while it fills a missing role: recovered up to the freshest's front.
    /// One that missed a takeover to raid0: its data area is the component size.
    pub fn catch_up_with_reshape(&mut self, own: &Superblock, fresh: &Superblock) {
        let reshaping = |sb: &Superblock| sb.feature_map.contains(FeatureMap::RESHAPE_ACTIVE);
        let moving = |sb: &Superblock| reshaping(sb) && sb.feature_map.contains(FeatureMap::NEW_OFFSET);
        if moving(fresh) && !reshaping(own) && own.data_offset == fresh.data_offset {
            self.new_offset = fresh.new_offset;
            self.features.insert(FeatureMap::NEW_OFFSET);
        }
        let forward =
            reshaping(fresh) && fresh.delta_disks >= 0 && !fresh.feature_map.contains(FeatureMap::RESHAPE_BACKWARDS);
        if let (true, Some(_)) = (forward, self.recovery_offset) {
            // Filling a missing role: recovered exactly up to the front, which the freshest
            // superblock may record further on than this device's own (a crash while they were
            // written; the rows were flushed before either).
            let data_disks = u64::from(fresh.raid_disks).saturating_sub(fresh.level.parity_blocks() as u64).max(1);
            self.recovery_offset = Some(fresh.reshape_position / data_disks);
        } else if missed_forward_reshape_end(own, fresh) {
            self.recovery_offset = None;
        }
        if !reshaping(fresh) && moving(own) {
            let delta = i64::from(own.new_offset);
            self.data_offset = self.data_offset.saturating_add_signed(delta);
            self.data_size = self.data_size.saturating_add_signed(-delta);
            self.features.remove(FeatureMap::NEW_OFFSET);
        }
        if fresh.level == Level::Raid0 && own.level != Level::Raid0 && fresh.size != 0 {
            // It missed a takeover to raid0 (md's `raid0_takeover_raid45`): its data area is
            // the component size, as every other member's (one zone).
            self.data_size = fresh.size;
        }
    }
}

impl ArrayMetadata {
    pub fn is_reshaping(&self) -> bool {
        self.features.contains(FeatureMap::RESHAPE_ACTIVE)
    }

    /// The reshape in progress, checked to be one raidnbd continues (see the module docs);
    /// `None` when none runs.
    pub fn reshape_state(&self) -> Result<Option<ReshapeState>, RaidError> {
        if !self.is_reshaping() {
            return Ok(None);
        }
        let name = self.name();
        let with_mdadm = format!(
            "continue it with mdadm (mdadm --assemble /dev/md/{} MEMBERS..., with --backup-file=FILE if it asks for \
             one), then serve the array here",
            self.short_name()
        );
        let near = |layout: u32| Raid10Layout::from_md(layout).is_some_and(Raid10Layout::is_near);
        match self.level {
            Level::Raid4 | Level::Raid5 | Level::Raid6 => {}
            Level::Raid10 if near(self.layout) && near(self.new_layout) => {}
            Level::Raid10 => {
                return Err(cannot(format!(
                    "array {name}: a reshape of raid10 layout {:#x} to {:#x} is in progress; raidnbd continues those \
                     of near layouts; {with_mdadm}",
                    self.layout, self.new_layout
                )));
            }
            level => return Err(cannot(format!("array {name}: a reshape of {level} is in progress; {with_mdadm}"))),
        }
        if self.new_level != self.level.to_md() {
            return Err(cannot(format!(
                "array {name}: a reshape from level {} to level {} is in progress; {with_mdadm}",
                self.level.to_md(),
                self.new_level
            )));
        }
        if self.has_journal() || self.features.intersects(FeatureMap::ANY_PPL) {
            return Err(cannot(format!(
                "array {name}: a reshape is in progress on an array with a write journal or a partial parity log, \
                 which md does not allow; {with_mdadm}"
            )));
        }
        if self.delta_disks >= 0 && self.features.contains(FeatureMap::RESHAPE_BACKWARDS) {
            return Err(cannot(format!(
                "array {name}: a layout or chunk change that runs backwards is in progress; raidnbd continues \
                 reshapes that add members, remove members, or change the layout or chunk going forward; {with_mdadm}"
            )));
        }
        let previous_raid_disks = (self.raid_disks as i64 - i64::from(self.delta_disks)) as usize;
        // Every active device moves its data start by the same amount, into the headroom (md's
        // no-backup grow; a reshape without it needs mdadm's backup file).
        let deltas: Vec<i64> = self
            .members
            .iter()
            .filter(|m| matches!(self.role(m.dev_number), DevRole::Active(_)))
            .map(|m| if m.features.contains(FeatureMap::NEW_OFFSET) { i64::from(m.new_offset) } else { 0 })
            .collect();
        let delta = deltas.first().copied().unwrap_or(0);
        // md's direction rule: members removed, backwards, the data start moving up; else forward, down.
        let backwards = self.delta_disks < 0;
        if delta == 0 || (delta > 0) != backwards || deltas.iter().any(|&d| d != delta) {
            return Err(cannot(format!(
                "array {name}: a reshape that does not move the data start of every member alike (new_offset {deltas:?}) \
                 is in progress; it needs mdadm's backup file: {with_mdadm}"
            )));
        }
        if self.level == Level::Raid10 {
            // md records any sector of a raid10 reshape (`reshape_request` pauses mid-chunk); the
            // new layout ends at its own size (a grow goes on past the old end, a shrink starts there).
            let to = Raid10Geometry::new(self.new_layout, self.new_chunk, self.raid_disks as usize, self.size)
                .map_or(0, |g| g.array_sectors());
            if self.reshape_position > to {
                return Err(cannot(format!(
                    "array {name}: reshape_position {} lies past the reshaped array's end ({to} sectors)",
                    self.reshape_position
                )));
            }
            return Ok(Some(ReshapeState {
                end_sectors: to,
                previous_raid_disks,
                new_layout: self.new_layout,
                new_chunk_sectors: self.new_chunk,
                position_sectors: self.reshape_position,
                offset_delta_sectors: delta,
            }));
        }
        let parity = self.level.parity_blocks();
        let new_data_disks = self.raid_disks as u64 - parity as u64;
        let unit = u64::from(self.chunk_sectors.max(self.new_chunk)) * new_data_disks;
        if unit == 0 || !self.reshape_position.is_multiple_of(unit) {
            return Err(cannot(format!(
                "array {name}: reshape_position {} is not on a stripe boundary of the new layout ({unit} sectors), as \
                 md refuses too",
                self.reshape_position
            )));
        }
        let rows = u64::from(self.chunk_sectors.max(self.new_chunk));
        let data_disks = new_data_disks.min(previous_raid_disks as u64 - parity as u64);
        Ok(Some(ReshapeState {
            end_sectors: self.size / rows * rows * data_disks,
            previous_raid_disks,
            new_layout: self.new_layout,
            new_chunk_sectors: self.new_chunk,
            position_sectors: self.reshape_position,
            offset_delta_sectors: delta,
        }))
    }

    /// Sectors free before the data on every device that is in the array, where a reshape may
    /// move the data start: from past the superblock (36 KiB, as md), the bitmap, the PPL area
    /// and the bad-block log, to `data_offset`.
    pub fn headroom_sectors(&self) -> u64 {
        let bitmap_end = self.bitmap_offset().map_or(0, |o| i64::from(o).max(0) as u64 + 256);
        let ppl_end = self.ppl_area().map_or(0, |(o, s)| i64::from(o).max(0) as u64 + u64::from(s));
        self.members
            .iter()
            .filter(|m| self.role(m.dev_number) != DevRole::Faulty)
            .map(|m| {
                let sb_end =
                    m.super_offset + superblock_sectors(self.dev_roles.len() as u32).max(NEW_OFFSET_GAP_SECTORS);
                let bbl_end = if m.bblog_size == 0 {
                    0
                } else {
                    m.super_offset + i64::from(m.bblog_offset).max(0) as u64 + u64::from(m.bblog_size)
                };
                let earliest = sb_end.max(m.super_offset + bitmap_end).max(m.super_offset + ppl_end).max(bbl_end);
                m.data_offset.saturating_sub(earliest)
            })
            .min()
            .unwrap_or(0)
    }

    /// The smallest data area (md's `data_size`) of the devices in the array: a reshape that
    /// removes members moves the data start up into what lies past the used part (`size`).
    pub fn data_area_sectors(&self) -> u64 {
        self.members
            .iter()
            .filter(|m| !matches!(self.role(m.dev_number), DevRole::Faulty | DevRole::Journal))
            .map(|m| m.data_size)
            .min()
            .unwrap_or(0)
    }

    /// Starts a reshape to `raid_disks` roles with `new_layout` and `new_chunk_sectors`,
    /// moving every device's data start by `offset_delta_sectors`, its front at
    /// `position_sectors`. The devices of the added roles already have their records.
    pub fn start_reshape(
        &mut self,
        raid_disks: usize,
        new_layout: u32,
        new_chunk_sectors: u32,
        offset_delta_sectors: i64,
        position_sectors: u64,
    ) {
        self.delta_disks = (raid_disks as i64 - i64::from(self.raid_disks)) as i32;
        self.raid_disks = raid_disks as u32;
        self.new_level = self.level.to_md();
        self.new_layout = new_layout;
        self.new_chunk = new_chunk_sectors;
        self.reshape_position = position_sectors;
        self.features.insert(FeatureMap::RESHAPE_ACTIVE);
        for m in &mut self.members {
            m.new_offset = offset_delta_sectors as i32;
            if offset_delta_sectors != 0 {
                m.features.insert(FeatureMap::NEW_OFFSET);
            }
        }
    }

    /// A level change that moves no data (md's takeover): the new level's fields; the
    /// reshape fields say the same (md writes them only while reshaping).
    pub fn take_over(
        &mut self,
        level: Level,
        layout: u32,
        chunk_sectors: u32,
        raid_disks: usize,
        size_sectors: u64,
        data_size_is_size: bool,
    ) {
        debug_assert!(!self.is_reshaping(), "a takeover while reshaping");
        self.level = level;
        self.layout = layout;
        self.chunk_sectors = chunk_sectors;
        self.raid_disks = raid_disks as u32;
        self.size = size_sectors;
        self.new_level = level.to_md();
        self.new_layout = layout;
        self.new_chunk = chunk_sectors;
        self.delta_disks = 0;
        if level != Level::Raid0 {
            self.features.remove(FeatureMap::RAID0_LAYOUT);
        }
        if data_size_is_size {
            for m in &mut self.members {
                m.data_size = size_sectors;
            }
        }
    }

    /// The reshape's front, durably. Going forward, a member filling a missing role is
    /// recovered up to the new layout's rows below the front (md raises `recovery_offset` of
    /// members not in sync at each checkpoint).
    pub fn set_reshape_position(&mut self, position_sectors: u64) {
        debug_assert!(self.is_reshaping(), "reshape progress without a reshape");
        self.reshape_position = position_sectors;
        if self.delta_disks >= 0 && !self.features.contains(FeatureMap::RESHAPE_BACKWARDS) {
            let data_disks = u64::from(self.raid_disks).saturating_sub(self.level.parity_blocks() as u64).max(1);
            let reached = position_sectors / data_disks;
            for m in &mut self.members {
                if m.recovery_offset.is_some()
                    && matches!(self.dev_roles.get(m.dev_number as usize), Some(DevRole::Active(_)))
                {
                    m.recovery_offset = Some(reached);
                }
            }
        }
    }

    /// Ends the reshape (md's `md_finish_reshape` and `raid5_finish_reshape`): the new layout
    /// and chunk become the array's, each device's data start moves by its `new_offset` and
    /// its data size the other way. The reshape fields keep their last values, as the kernel
    /// leaves them (nothing reads them without `RESHAPE_ACTIVE`).
    pub fn finish_reshape(&mut self) {
        debug_assert!(self.is_reshaping(), "finishing a reshape that is not running");
        for m in &mut self.members {
            if m.features.contains(FeatureMap::NEW_OFFSET) {
                let delta = i64::from(m.new_offset);
                m.data_offset = m.data_offset.saturating_add_signed(delta);
                m.data_size = m.data_size.saturating_add_signed(-delta);
                m.features.remove(FeatureMap::NEW_OFFSET);
            }
        }
        // Members recovered by the reshape hold their whole role now (md's `end_reshape`).
        for m in &mut self.members {
            if matches!(self.dev_roles.get(m.dev_number as usize), Some(DevRole::Active(r)) if u32::from(*r) < self.raid_disks)
            {
                m.recovery_offset = None;
            }
        }
        self.layout = self.new_layout;
        self.chunk_sectors = self.new_chunk;
        self.features.remove(FeatureMap::RESHAPE_ACTIVE | FeatureMap::RESHAPE_BACKWARDS);
        // Members removed: their devices are spares now (`raid5_finish_reshape`, then
        // `raid5_remove_disk`).
        for role in self.dev_roles.iter_mut() {
            if matches!(*role, DevRole::Active(r) if u32::from(r) >= self.raid_disks) {
                *role = DevRole::Spare;
            }
        }
    }
}
