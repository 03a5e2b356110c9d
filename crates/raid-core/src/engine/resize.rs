//! A size change: every member of a raid1/4/5/6/10 uses more (or less) of its device from
//! now (md's `mdadm --grow --size max|SIZE`, the kernel's `update_size`).
//!
//! - Growing: the devices are asked their size again ([`Member::refresh_len`]: a volume
//!   resized in the cloud, a file extended, an NBD export that grew). `max` takes the most
//!   that every device, spares included, has room for, rounded down to the chunk (64 KiB for
//!   raid1, as arrays are created); a given size must fit every device. The new space holds
//!   whatever the devices held there, so it is resynced before its redundancy is trusted (md's
//!   `raid5_resize`: `recovery_cp` at the old size): writes there reconstruct, never
//!   read-modify-write, until the resync passed; with a bitmap the new space's bits are set
//!   (in larger bitmap chunks when the space reserved for the bitmap is outgrown, as md's
//!   `md_bitmap_resize`).
//! - Shrinking: the clients' size falls at once, and requests past the new end are refused,
//!   also ones checked against the old size that still wait to enter. What lies past it stays
//!   on the devices (md does the same); growing again resyncs it.
//! - Crash safety: one superblock update (the bitmap first), made while every request is
//!   paused, then the new shape: a crash before it leaves the old size, after it the new one
//!   with the resync pending. An array whose write-hole policy replays instead of resyncing
//!   (a parity log, a journal) records where that resync begins also in its dirty mark
//!   (`ensure_dirty`), so that the replay after a crash does not declare the new space in
//!   sync.
//!
//! Refused as md refuses: linear and raid0 (they use whole members and grow by members),
//! raid10 far layouts (their copies' places depend on the size), a read-only array, while a
//! reshape or any background work runs; and, unlike md, while degraded (the new space could
//! not be resynced) or building a replacement.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::maintenance::MIRROR_UNIT_SECTORS;
use super::shape::Layout;
use super::slot::SlotState;
use super::{Array, META_LOCK_KEY, StateChange};
use crate::SECTOR_BYTES;
use crate::error::{ErrorKind, RaidError, Result};
use crate::geometry::{Geometry, Level};
use crate::member::Member;

/// What size a resize asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeTarget {
    /// The most every device has room for (md's `--size max`).
    Max,
    /// This many sectors of every member (md's `--size`, a multiple of the chunk).
    Sectors(u64),
}

/// What a resize did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resized {
    /// md's `size` (sectors of every member) before and after.
    pub from_component_sectors: u64,
    pub to_component_sectors: u64,
    /// The export's size before and after.
    pub from_bytes: u64,
    pub to_bytes: u64,
}

fn refused(message: String) -> RaidError {
    RaidError::new(ErrorKind::Refused, message)
}

impl<M: Member + ?Sized> Array<M> {
    /// Why the array cannot change its size now, if it cannot.
    fn check_resizable(&self) -> Result<Geometry> {
        self.check_writable("resize")?;
        let geometry = self.settled_and_idle("change the size")?;
        if matches!(geometry.level(), Level::Linear | Level::Raid0) {
            return Err(refused(format!(
                "{} uses whole members and has no size of its own to change (as in md): grow it by members",
                geometry.level()
            )));
        }
        if let Some(layout) = geometry.raid10().map(|g| g.layout()).filter(|l| l.far_copies > 1 && !l.offset) {
            return Err(refused(format!(
                "raid10 layout f{} places its far copies by the member size, so a size change would move them \
                 (md refuses it too)",
                layout.far_copies
            )));
        }
        if self.members.slots().iter().any(|s| s.replacement().is_some() || s.state() == SlotState::Recovering) {
            return Err(refused("no member may be rebuilt or replaced while the size changes".into()));
        }
        Ok(geometry)
    }

    /// Changes md's `size` of the array to `target` (see the module docs); the new space, if
    /// any, is resynced in the background (`Maintenance`).
    pub(crate) async fn resize(&self, target: SizeTarget) -> Result<Resized> {
        self.check_resizable()?;
        // Every request waits from here to the new shape: sizes are asked, the superblocks and
        // bitmap written and the write intent remapped with nothing in flight.
        let paused = self.shape.pause().await;
        let _g = self.locks.lock(META_LOCK_KEY).await;
        let geometry = self.check_resizable()?;
        let from = geometry.component_sectors();
        let rounding = Geometry::component_rounding_sectors(geometry.level(), geometry.chunk_sectors());
        let (room, data_sectors) = self.device_room().await?;
        let to = match target {
            SizeTarget::Max if room.sectors < from => {
                return Err(refused(format!(
                    "{} has room for {} sectors after its data offset, less than the {from} every member holds now \
                     (did it shrink?): a smaller size must be given as such",
                    room.device_name, room.sectors
                )));
            }
            SizeTarget::Max => room.sectors / rounding * rounding,
            SizeTarget::Sectors(sectors) if !sectors.is_multiple_of(rounding) => {
                return Err(refused(format!(
                    "a size of {sectors} sectors is not a multiple of {} KiB (the chunk)",
                    rounding / 2
                )));
            }
            SizeTarget::Sectors(sectors) if sectors > room.sectors => {
                return Err(refused(format!(
                    "{} has room for {} sectors after its data offset, not {sectors}",
                    room.device_name, room.sectors
                )));
            }
            SizeTarget::Sectors(sectors) => sectors,
        };
        if (to > from || matches!(target, SizeTarget::Max)) && !self.members.is_optimal() {
            return Err(refused(
                "every member must be in sync to grow the size (the new space is resynced from all of them)".into(),
            ));
        }
        let from_bytes = self.size_bytes();
        if to == from {
            return Ok(Resized {
                from_component_sectors: from,
                to_component_sectors: to,
                from_bytes,
                to_bytes: from_bytes,
            });
        }
        let roles = geometry.raid_disks();
        let grown = Geometry::new(geometry.level(), geometry.layout(), geometry.chunk_sectors(), &vec![to; roles])
            .map_err(|e| refused(format!("{to} sectors per member: {e}")))?;
        let growing = to > from;
        // The resync of new space starts at the old end (or where one pending already is).
        let unit_sectors = self.resync_unit_sectors();
        let old_units = match geometry.parity() {
            Some(pg) => pg.stripes(),
            None => geometry.array_sectors() / MIRROR_UNIT_SECTORS,
        };
        let new_units = match grown.parity() {
            Some(pg) => pg.stripes(),
            None => grown.array_sectors().div_ceil(MIRROR_UNIT_SECTORS),
        };
        let pending = self.maintenance.lock().resync_next_unit;
        let resync_unit = match (growing, pending) {
            (true, p) => Some(p.map_or(old_units, |u| u.min(old_units))),
            (false, p) => p.filter(|&u| u < new_units),
        };
        // The superblocks say so unless a dirty array resyncs everything after a crash anyway.
        let marks_resync = !self.dirty.load(Ordering::Acquire) || self.write_hole.replaces_resync();
        let resync_offset = resync_unit.filter(|_| growing && marks_resync).map(|u| u * unit_sectors);
        let (old_resync, new_resync) = (geometry.resync_sectors(), grown.resync_sectors());
        let bitmap = self.intent.as_ref().map(|intent| {
            let chunk = self.bitmap_chunk_for(intent, new_resync);
            let dirty = if growing { old_resync / chunk..new_resync.div_ceil(chunk) } else { 0..0 };
            (chunk, dirty)
        });
        self.try_persist_locked(StateChange::Resize {
            used_sectors: to,
            // A shrink leaves each device's data area as it was (as md).
            data_sectors: if growing { data_sectors } else { Vec::new() },
            resync_sectors: new_resync,
            bitmap_chunk_sectors: bitmap.as_ref().map(|b| b.0),
            bitmap_dirty: bitmap.as_ref().map_or(0..0, |b| b.1.clone()),
            resync_offset,
        })
        .await?;
        if let (Some(intent), Some((chunk, dirty))) = (&self.intent, bitmap) {
            intent.resize(chunk, new_resync.div_ceil(chunk), dirty);
        }
        if let Some(away) = self.away.get() {
            away.resize(new_resync);
        }
        self.maintenance.lock().resync_next_unit = resync_unit;
        self.shape.install(self.shape.next_shape(Arc::new(Layout::settled(grown)), None));
        drop(_g);
        drop(paused);
        let to_bytes = self.size_bytes();
        tracing::info!(
            from_sectors = from,
            to_sectors = to,
            from_bytes,
            to_bytes,
            resync_from_sectors = resync_unit.map(|u| u * unit_sectors),
            "array size changed"
        );
        self.maintenance.wake();
        Ok(Resized { from_component_sectors: from, to_component_sectors: to, from_bytes, to_bytes })
    }

    /// The bitmap chunk (resync sectors per bit) for `resync_sectors`: the present one, doubled
    /// until the bits fit in the room the bitmap has (md's `md_bitmap_resize`).
    pub(super) fn bitmap_chunk_for(&self, intent: &super::intent::WriteIntent, resync_sectors: u64) -> u64 {
        let room = self.metadata_summary().and_then(|s| s.bitmap_room_chunks).unwrap_or(intent.chunks());
        let mut chunk = intent.chunk_sectors();
        while resync_sectors.div_ceil(chunk) > room.max(1) {
            chunk *= 2;
        }
        chunk
    }

    /// The room every device has for data now (asked again), the device with the least, and
    /// each device's data area for the superblocks.
    pub(super) async fn device_room(&self) -> Result<(Room, Vec<(usize, u64)>)> {
        let mut devices: Vec<_> = self.members.slots().iter().filter_map(|s| s.device()).collect();
        devices.extend(self.members.spares.lock().expect("spares lock").iter().cloned());
        let mut room = Room { sectors: u64::MAX, device_name: String::new() };
        let mut data_sectors = Vec::with_capacity(devices.len());
        for device in devices {
            let name = device.member.name().to_string();
            let now = device
                .member
                .refresh_len()
                .await
                .map_err(|e| RaidError::new(ErrorKind::Io, format!("{name}: cannot tell its size: {e}")))?;
            // A device that shrank under the array has only what it has now.
            let len = now.min(device.member.len_bytes());
            let sectors = len.saturating_sub(device.data_offset_bytes) / SECTOR_BYTES;
            if sectors < room.sectors {
                room = Room { sectors, device_name: name };
            }
            data_sectors.push((device.id, sectors));
        }
        Ok((room, data_sectors))
    }
}

/// The least room for data of any device, and which device that is.
pub(super) struct Room {
    pub(super) sectors: u64,
    device_name: String,
}
