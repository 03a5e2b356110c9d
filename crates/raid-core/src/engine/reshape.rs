//! Reshape: the array changes shape while it serves, in md's format (the superblock side:
//! `md/reshape.rs`; the kernel's rules, cited: `doc/md-reshape.md`).
//!
//! The kinds raidnbd does are md's no-backup reshapes of raid4/5/6 and of raid10 in a near
//! layout (`doc/md-reshape-raid10.md`: the copies keep their number, a window is read from
//! one copy and written to every copy): a grow by members, a layout change, a chunk change,
//! or several at once go *forward*: the data start of every device moves `headroom`
//! sectors into the free space before the data, and the new layout
//! (wider by the new members, in the new rotation or chunk) is written there from the start
//! of the array up, ahead of the old one. Removing members goes *backwards* (md's
//! `reshape_backwards`): the new, narrower layout needs more rows per device, so it is
//! written `headroom` sectors after the old one, from the end of the array down. Either way
//! no new row is ever written over an old row still in use.
//!
//! - Start ([`Array::begin_reshape`] / [`Array::begin_shrink`], from `Admin`): checked
//!   (raid4/5/6 or near raid10, no log, every role in sync, nothing else running, room
//!   before the data, or after it); the new devices are recorded and the start is written to every
//!   superblock (`StateChange::ReshapeStart`, the front at 0, or at the new end going
//!   backwards); then, with every request paused, the shape becomes two layouts (going
//!   forward the devices' data origin moves to the new data start first and the new roles
//!   come into use). Removing members shrinks the export at once, as md's `--array-size`
//!   must before such a reshape; the user confirms the new size.
//! - Steps ([`Array::reshape_step`], from `Maintenance::step`): a window at the front (whole new
//!   stripes; raid10: whole chunks, the first from wherever md left the front) is closed to
//!   requests, read from the previous layout (zeros beyond its end), written in the new
//!   layout (full stripes: parity from the data alone; raid10: every copy), the members
//!   flushed, the new front recorded (`ReshapeProgress`), the shape's front moved and the
//!   window opened. A window ends where the new rows it writes reach the previous layout's
//!   rows still in use (md's invariant, `reshape_window.rs`: a restart from the recorded front
//!   reads only intact rows); recording every window before it opens means no request ever
//!   writes the new layout where a restart would copy the old one over it.
//! - End: past the new layout's last stripe (or at 0 going backwards) the superblocks take the
//!   new geometry (`ReshapeEnd`; removed members become spares), the shape settles on it
//!   (going backwards the data origin moves to the new data start and the removed roles go),
//!   and the export has its new size.
//!
//! A write-intent bitmap stays on through a reshape, as md keeps it: a write marks the rows
//! of the layout it goes to (md's resync space is the device's rows in either), so after a
//! crash the rows written in the new layout are resynced once the reshape has ended, and
//! stripes of the old layout are rewritten whole, parity from data, as the front passes.
//!
//! A crash at any point restarts from the recorded front (md's `reshape_position`): the window
//! after it is moved again from rows nothing has overwritten. The kernel continues such a
//! reshape, and raidnbd continues one the kernel started (`md::start`).

use std::sync::Arc;

use super::maintenance::{MaintenanceWork, Step};
use super::reshape_window::{least_headroom, next_window, reshape_end, unit_sectors};
use super::resize::SizeTarget;
use super::shape::{Direction, Layout, Part, Reshape, Shape};
use super::slot::{Device, SlotState};
use super::{Array, META_LOCK_KEY, StateChange};
use crate::SECTOR_BYTES;
use crate::buf::AlignedBuf;
use crate::error::{ErrorKind, RaidError, Result};
use crate::geometry::{Geometry, Level, MAX_RAID_DISKS, ParityLayout};
use crate::member::Member;

/// The data start moves at most this far (more headroom only makes the first windows larger).
const MAX_HEADROOM_SECTORS: u64 = 64 << 11; // 64 MiB
/// A window moves at most this much array data (one checkpoint per window).
const MAX_WINDOW_SECTORS: u64 = 16 << 11; // 16 MiB

/// What removing members takes (`Array::shrink_plan`).
pub(crate) struct ShrinkPlan {
    /// md's `size` afterwards (it shrinks first when the room after the data is short).
    size_sectors: u64,
    from_size_sectors: u64,
    /// How far the data start moves up.
    headroom_sectors: u64,
    new_geometry: Geometry,
}

fn refused(message: String) -> RaidError {
    RaidError::new(ErrorKind::Refused, message)
}

impl<M: Member + ?Sized> Array<M> {
    /// Why the array cannot start a grow now, if it cannot.
    fn check_growable(&self) -> Result<Geometry> {
        self.check_writable("grow")?;
        let geometry = self.settled_and_idle("grow")?;
        match geometry.level() {
            Level::Raid4 | Level::Raid5 | Level::Raid6 => {}
            Level::Raid10 => check_near(&geometry)?,
            Level::Linear => {
                return Err(refused(
                    "a linear array only grows by appending members (md's linear has no removal): copy it to a new \
                     array to drop one"
                        .into(),
                ));
            }
            Level::Raid1 => {
                return Err(refused(
                    "a mirror changes its member count without a reshape: add a member (ctl add) or fail and remove \
                     one (ctl fail, ctl remove)"
                        .into(),
                ));
            }
            level => return Err(refused(format!("{level} does not reshape"))),
        }
        if !self.write_hole.reshapes() {
            return Err(refused(
                "md reshapes no array with a partial parity log or a write journal: serve it with --consistency-policy \
                 resync (mdadm --grow --consistency-policy=resync) to grow it"
                    .into(),
            ));
        }
        // Every member in sync, but for missing roles that hold only parity (md grows a raid0
        // as a raid4 without its parity member): the first new members fill them.
        let slots = self.members.slots();
        let parity_only =
            geometry.parity().map_or(Vec::new(), |pg| pg.layout().parity_only_roles(geometry.level(), slots.len()));
        let unusable = |(role, s): (usize, &super::slot::Slot<M>)| match s.state() {
            SlotState::InSync => false,
            SlotState::Missing => !parity_only.contains(&role),
            _ => true,
        };
        if slots.iter().enumerate().any(unusable) || slots.iter().any(|s| s.replacement().is_some()) {
            return Err(refused("every member must be in sync, and no replacement built, to grow".into()));
        }
        if self.any_bad() {
            return Err(refused("a member has bad blocks: replace it before growing".into()));
        }
        Ok(geometry)
    }

    /// Starts a reshape onto `devices` (new devices of the array; none for a layout or chunk
    /// change) to `new_layout` and `new_chunk_sectors` (`None`: as now). See the module docs.
    pub(crate) async fn begin_reshape(
        &self,
        devices: Vec<Device<M>>,
        new_layout: Option<u32>,
        new_chunk_sectors: Option<u32>,
    ) -> Result<()> {
        let geometry = self.check_growable()?;
        let (old_disks, new_disks) = (geometry.raid_disks(), geometry.raid_disks() + devices.len());
        // Missing roles (parity only) are filled by the first devices, recovered by the reshape
        // as it writes the new layout; as many roles at the end of the new layout stay missing.
        let holes: Vec<usize> =
            (0..old_disks).filter(|&r| self.members.slots()[r].state() == SlotState::Missing).collect();
        if holes.len() > devices.len() {
            return Err(refused(format!(
                "roles {holes:?} are missing: add at least {} members (the first fill them as the data moves)",
                holes.len()
            )));
        }
        let layout = new_layout.unwrap_or(geometry.layout());
        let new_chunk = new_chunk_sectors.unwrap_or(geometry.chunk_sectors());
        if geometry.level() == Level::Raid4 && layout != geometry.layout() {
            return Err(refused("raid4 has one layout (parity on the last member)".into()));
        }
        let changes_placement = layout != geometry.layout() || new_chunk != geometry.chunk_sectors();
        if (devices.is_empty() && !changes_placement) || new_disks > MAX_RAID_DISKS {
            return Err(refused(format!(
                "{new_disks} members: a grow adds 1 to {} members, or changes the layout or chunk",
                MAX_RAID_DISKS - old_disks
            )));
        }
        let size = geometry.component_sectors();
        if !size.is_multiple_of(u64::from(new_chunk)) {
            return Err(refused(format!(
                "every member holds {} KiB of data, not a multiple of the new chunk ({} KiB): the array would shrink; \
                 change the size first (grow --size)",
                size / 2,
                new_chunk / 2
            )));
        }
        let chunk = u64::from(geometry.chunk_sectors().max(new_chunk));
        let new_geometry = Geometry::new(geometry.level(), layout, new_chunk, &vec![size; new_disks])
            .map_err(|e| refused(format!("the reshaped array: {e}")))?;
        check_same_copies(&geometry, &new_geometry)?;
        let need = least_headroom(&geometry, &new_geometry);
        let have = match self.metadata_summary().and_then(|s| s.headroom_sectors) {
            Some(h) => h,
            None => self
                .members
                .slots()
                .iter()
                .filter_map(|s| s.device())
                .map(|d| d.data_offset_bytes / SECTOR_BYTES)
                .min()
                .unwrap_or(0),
        };
        if have < need {
            let with_mdadm = match geometry.parity() {
                Some(_) => format!(
                    "mdadm can do it with a backup file: mdadm --grow /dev/mdX --raid-devices={new_disks} \
                     --layout=... --chunk=... --backup-file=FILE"
                ),
                None => "md needs that room too (raid10 has no backup-file mode): copy the array to a new one".into(),
            };
            return Err(refused(format!(
                "reshaping to {new_disks} members, layout {}, chunk {} KiB moves the data start {need} sectors \
                 into the free space before the data, but a member has only {have}; {with_mdadm}",
                layout_name(&new_geometry),
                new_chunk / 2
            )));
        }
        let headroom = have.min(MAX_HEADROOM_SECTORS).max(need) / chunk * chunk;
        let _g = self.locks.lock(META_LOCK_KEY).await;
        let roles: Vec<usize> = holes.iter().copied().chain(old_disks..new_disks - holes.len()).collect();
        let new_roles = devices.iter().zip(&roles).map(|(d, &role)| (d.id, role)).collect();
        let start = StateChange::ReshapeStart {
            raid_disks: new_disks,
            new_roles,
            new_layout: layout,
            new_chunk_sectors: new_chunk,
            offset_delta_sectors: -(headroom as i64),
            position_sectors: 0,
        };
        self.record_new_devices_locked(&devices, Some(start)).await?;
        // Out of the spares before the lock goes: no spare assignment (or rebuild) may take
        // them into a missing role meanwhile.
        let mut added = self.members.take_spares(&devices);
        drop(_g);
        tracing::info!(
            from = old_disks,
            to = new_disks,
            headroom_sectors = headroom,
            layout,
            chunk_sectors = new_chunk,
            "reshape recorded (the data start moves into the headroom)"
        );
        // Every request waits while the devices' data origin moves to the new data start.
        let paused = self.shape.pause().await;
        let delta_bytes = -((headroom * SECTOR_BYTES) as i64);
        self.members.move_origins(delta_bytes);
        added.iter_mut().for_each(|d| d.move_origin(delta_bytes));
        // Those filling missing roles are recovered by the front: the old layout reads nothing
        // from them (they stood for parity-only roles), the new one only below the front.
        let others = added.split_off(holes.len());
        for (&role, device) in holes.iter().zip(added) {
            self.members.slots()[role].install(device, Some(0));
        }
        self.members.add_roles(others);
        for _ in &holes {
            self.members.add_missing_role();
        }
        let reshape = Reshape {
            previous: Arc::new(Layout::new(geometry, headroom)),
            front_sectors: 0,
            direction: Direction::Forward,
        };
        self.shape.install(self.shape.next_shape(Arc::new(Layout::settled(new_geometry)), Some(reshape)));
        drop(paused);
        self.maintenance.wake();
        Ok(())
    }

    /// What removing members from an array of `geometry` (raid4/5/6/10) to `raid_disks` roles,
    /// `layout` and `chunk_sectors` takes: the new layout (of the used part that leaves room
    /// after it for the move), the move, and the size to confirm.
    pub(crate) async fn shrink_plan(
        &self,
        geometry: &Geometry,
        raid_disks: usize,
        new_layout: Option<u32>,
        new_chunk_sectors: Option<u32>,
    ) -> Result<ShrinkPlan> {
        let old_disks = geometry.raid_disks();
        if raid_disks >= old_disks {
            return Err(refused(format!(
                "{raid_disks} members: removing members leaves fewer than the {old_disks} there are"
            )));
        }
        if let Some(g) = geometry.raid10().filter(|g| raid_disks < g.layout().copies() as usize) {
            return Err(refused(format!(
                "a raid10 of {} copies needs at least {} members",
                g.layout().copies(),
                g.layout().copies()
            )));
        }
        let from_size = geometry.component_sectors();
        let layout = new_layout.unwrap_or(geometry.layout());
        let new_chunk = new_chunk_sectors.unwrap_or(geometry.chunk_sectors());
        if geometry.level() == Level::Raid4 && layout != geometry.layout() {
            return Err(refused("raid4 has one layout (parity on the last member)".into()));
        }
        let chunk = u64::from(geometry.chunk_sectors().max(new_chunk));
        let shaped = |size: u64| {
            Geometry::new(geometry.level(), layout, new_chunk, &vec![size; raid_disks])
                .map_err(|e| refused(format!("the reshaped array: {e}")))
        };
        let shaped_now = shaped(from_size)?;
        check_same_copies(geometry, &shaped_now)?;
        let need = least_headroom(geometry, &shaped_now);
        // The new layout lies `headroom` after the old one inside every device's data area
        // (md's `data_size`); the used part shrinks where the area has too little room left.
        let area = match self.metadata_summary().and_then(|s| s.data_area_sectors) {
            Some(sectors) => sectors,
            None => self.device_room().await?.0.sectors,
        };
        let size = from_size.min(area.saturating_sub(need)) / chunk * chunk;
        if size == 0 {
            return Err(refused(format!(
                "removing members moves the data start {need} sectors up, but a member's data area holds only {area} \
                 sectors"
            )));
        }
        let headroom = (area - size).min(MAX_HEADROOM_SECTORS.max(need)) / chunk * chunk;
        let new_geometry = shaped(size)?;
        if let Some(npg) = new_geometry.parity() {
            let n = npg.data_disks() as u64;
            debug_assert_eq!(new_geometry.array_sectors(), size * n, "md's raid5_size: both chunks divide the size");
        }
        Ok(ShrinkPlan { size_sectors: size, headroom_sectors: headroom, new_geometry, from_size_sectors: from_size })
    }

    /// Refuses to shrink the export to what `plan` gives unless `confirmed_bytes` names it.
    pub(crate) fn confirm_shrink(&self, plan: &ShrinkPlan, removed: usize, confirmed_bytes: Option<u64>) -> Result<()> {
        let to_bytes = plan.new_geometry.array_sectors() * SECTOR_BYTES;
        if confirmed_bytes == Some(to_bytes) {
            return Ok(());
        }
        let used = if plan.size_sectors < plan.from_size_sectors {
            format!(
                "; each member's used part shrinks from {} to {} sectors, to leave room for the data start to move {} \
                 sectors up",
                plan.from_size_sectors, plan.size_sectors, plan.headroom_sectors
            )
        } else {
            String::new()
        };
        Err(refused(format!(
            "removing {removed} member{} shrinks the array from {} to {to_bytes} bytes{used}: what lies past that is \
             lost, so shrink what the array holds first (resize2fs), then confirm the new size: --array-size {to_bytes}",
            if removed == 1 { "" } else { "s" },
            self.size_bytes()
        )))
    }

    /// Starts a reshape that removes members (md's backwards reshape): to `raid_disks` roles
    /// (fewer than now), `new_layout` and `new_chunk_sectors` (`None`: as now). The export
    /// shrinks at once to what the new layout holds, which `confirmed_bytes` must name (md
    /// wants `--array-size` first); where the members' data areas have too little room after
    /// the used part for the move, the used part shrinks first (md's `size`). The removed
    /// members become spares when it ends. See the module docs.
    pub(crate) async fn begin_shrink(
        &self,
        raid_disks: usize,
        new_layout: Option<u32>,
        new_chunk_sectors: Option<u32>,
        confirmed_bytes: Option<u64>,
    ) -> Result<()> {
        let geometry = self.check_growable()?;
        let old_disks = geometry.raid_disks();
        let plan = self.shrink_plan(&geometry, raid_disks, new_layout, new_chunk_sectors).await?;
        self.confirm_shrink(&plan, old_disks - raid_disks, confirmed_bytes)?;
        let ShrinkPlan { size_sectors: size, headroom_sectors: headroom, new_geometry, .. } = plan;
        let to_bytes = new_geometry.array_sectors() * SECTOR_BYTES;
        let (layout, new_chunk) = (new_geometry.layout(), new_geometry.chunk_sectors());
        if size < geometry.component_sectors() {
            self.resize(SizeTarget::Sectors(size)).await?;
        }
        let geometry = self.check_growable()?;
        // md starts a backwards reshape at `raid5_size`: the used part rounded to both chunks,
        // times the smaller count of data disks.
        let front = new_geometry.array_sectors();
        let _g = self.locks.lock(META_LOCK_KEY).await;
        let start = StateChange::ReshapeStart {
            raid_disks,
            new_roles: Vec::new(),
            new_layout: layout,
            new_chunk_sectors: new_chunk,
            offset_delta_sectors: headroom as i64,
            position_sectors: front,
        };
        self.record_new_devices_locked(&[], Some(start)).await?;
        drop(_g);
        tracing::info!(
            from = old_disks,
            to = raid_disks,
            headroom_sectors = headroom,
            size_bytes = to_bytes,
            "reshape recorded (members removed: the data start moves up, from the end of the array down)"
        );
        let paused = self.shape.pause().await;
        let reshape = Reshape {
            previous: Arc::new(Layout::settled(geometry)),
            front_sectors: front,
            direction: Direction::Backward,
        };
        self.shape.install(self.shape.next_shape(Arc::new(Layout::new(new_geometry, headroom)), Some(reshape)));
        drop(paused);
        self.maintenance.wake();
        Ok(())
    }

    /// One window of the running reshape (`None` when none runs).
    pub(crate) async fn reshape_step(&self, max_bytes: u64) -> Result<Option<Step>> {
        let shape = self.shape.load();
        let Some(reshape) = shape.reshape().cloned() else { return Ok(None) };
        self.maintenance.lock().current = Some(MaintenanceWork::Reshape);
        let (new, previous) = (shape.layout().clone(), reshape.previous.clone());
        let unit = unit_sectors(&previous, &new);
        let end = reshape_end(&new, &previous);
        let front = reshape.front_sectors;
        let done = match reshape.direction {
            Direction::Forward => front >= end,
            Direction::Backward => front == 0,
        };
        if done {
            return self.finish_reshape(&shape).await.map(Some);
        }
        // At least one unit, even where one unit (a wide stripe of large chunks) is past the cap.
        let wanted = (max_bytes / SECTOR_BYTES).clamp(unit, MAX_WINDOW_SECTORS.max(unit)) / unit * unit;
        let window = next_window(&previous, &new, reshape.direction, front, end, wanted);
        let next_front = match reshape.direction {
            Direction::Forward => window.end,
            Direction::Backward => window.start,
        };
        if window.is_empty() {
            return Err(RaidError::new(
                ErrorKind::Io,
                format!("reshape at {front}: the headroom leaves no room for the next new stripe"),
            ));
        }
        let sectors = window.end - window.start;
        self.shape.close_window(window.clone()).await;
        let moved = self.move_window(&previous, &new, window.start, sectors, next_front).await;
        if let Err(e) = moved {
            self.shape.open_window();
            return Err(e);
        }
        if let (Direction::Forward, Some(npg)) = (reshape.direction, new.parity()) {
            // Members filling missing roles hold the new layout's rows below the front now.
            let rows = new.shift_sectors() + next_front / npg.data_disks() as u64;
            for slot in self.members.slots().iter().filter(|s| s.state() == SlotState::Recovering) {
                slot.set_recovery_offset(rows);
            }
        }
        let next = Reshape { front_sectors: next_front, ..reshape };
        self.shape.install(self.shape.next_shape(new, Some(next)));
        self.shape.open_window();
        Ok(Some(Step::Worked { work: MaintenanceWork::Reshape, bytes: sectors * SECTOR_BYTES }))
    }

    /// Copies array sectors `[start, start + sectors)` (closed to requests) from `previous`
    /// into `new`, makes them durable, and records the front at `next_front`.
    async fn move_window(
        &self,
        previous: &Arc<Layout>,
        new: &Arc<Layout>,
        start: u64,
        sectors: u64,
        next_front: u64,
    ) -> Result<()> {
        let mut data = AlignedBuf::zeroed((sectors * SECTOR_BYTES) as usize);
        let old_end = previous.geometry().array_sectors();
        if start < old_end {
            let old_part = Part { layout: previous.clone(), start, sectors: old_end.min(start + sectors) - start };
            let old = self.read_part(&old_part).await?;
            let mut at = 0;
            for slice in old.slices() {
                data.as_mut_slice()[at..at + slice.len()].copy_from_slice(slice);
                at += slice.len();
            }
        }
        // Full stripes (parity from the data alone), or every copy from the one copy read.
        self.write_part(&Part { layout: new.clone(), start, sectors }, data.as_slice().into(), false).await?;
        self.flush().await?;
        let _g = self.locks.lock(META_LOCK_KEY).await;
        self.try_persist_locked(StateChange::ReshapeProgress { position_sectors: next_front }).await
    }

    /// Past the new layout's end: the new geometry becomes the array's.
    async fn finish_reshape(&self, shape: &Arc<Shape>) -> Result<Step> {
        self.flush().await?;
        // A raid4 whose one missing role is its parity: md's way of growing a raid0, which
        // mdadm takes back to raid0 when the reshape ends (Grow.c); raidnbd does it in the
        // same superblock update, so a crash never leaves it half way.
        let raid0 = match self.is_raid0_through_raid4(shape) {
            true => Some(self.takeover_plan(shape.layout().geometry(), Level::Raid0)?),
            false => None,
        };
        let new = shape.layout().clone();
        // md's resync space of raid10 is the array's sectors: its bitmap covers the new size
        // from the end on (`raid10_finish_reshape`; bits of a larger chunk where it must).
        let resync_sectors = new.geometry().resync_sectors();
        let previous_resync = shape.reshape().map_or(resync_sectors, |r| r.previous.geometry().resync_sectors());
        let bitmap_chunk = match resync_sectors != previous_resync {
            true => self.intent.as_ref().map(|intent| self.bitmap_chunk_for(intent, resync_sectors)),
            false => None,
        };
        {
            let _g = self.locks.lock(META_LOCK_KEY).await;
            let end = StateChange::ReshapeEnd { then_raid0: raid0.is_some(), resync_sectors, bitmap_chunk };
            self.try_persist_locked(end).await?;
        }
        let layout = Arc::new(Layout::settled(new.geometry().clone()));
        for slot in self.members.slots().iter().filter(|s| s.state() == SlotState::Recovering) {
            slot.set_in_sync();
        }
        // Nothing runs while the shape settles: a grown export's first writes find their bits.
        let paused = self.shape.pause().await;
        if let (Some(intent), Some(chunk)) = (&self.intent, bitmap_chunk) {
            intent.resize(chunk, resync_sectors.div_ceil(chunk), 0..0);
        }
        if new.shift_sectors() != 0 {
            // Backwards: every device's data origin moves up to the new layout, and the roles
            // removed go (a working device stays as a spare, as md).
            self.members.move_origins((new.shift_sectors() * SECTOR_BYTES) as i64);
            let previous_roles = shape.reshape().map_or(0, |r| r.previous.geometry().raid_disks());
            for role in (new.geometry().raid_disks()..previous_roles).rev() {
                let in_sync = self.members.slots()[role].state() == SlotState::InSync;
                if let Some(device) = self.members.drop_last_role().filter(|_| in_sync) {
                    self.members.add_spares(vec![device]);
                }
            }
        }
        self.shape.install(self.shape.next_shape(layout.clone(), None));
        drop(paused);
        if let Some(plan) = raid0 {
            // The parity role goes (missing after a grow; after a shrink its device, which
            // held the new layout's parity, is a spare).
            let paused = self.shape.pause().await;
            let last = self.members.slots().len() - 1;
            let in_sync = self.members.slots()[last].state() == SlotState::InSync;
            if let Some(device) = self.members.drop_last_role().filter(|_| in_sync) {
                self.members.add_spares(vec![device]);
            }
            let sizes = vec![plan.size_sectors; plan.raid_disks];
            let geometry = Geometry::new(plan.level, plan.layout, plan.chunk_sectors, &sizes)
                .map_err(|e| refused(format!("raid0: {e}")))?;
            self.shape.install(self.shape.next_shape(Arc::new(Layout::settled(geometry)), None));
            // A resync left pending by a crash means nothing without redundancy.
            self.maintenance.lock().resync_next_unit = None;
            drop(paused);
            tracing::info!(members = plan.raid_disks, "the raid4 reshaped without its parity member is a raid0 again");
        }
        if let Some(away) = self.away.get() {
            // What it recorded was in the previous layout's terms: a returning member is
            // rebuilt whole.
            away.end().await;
        }
        let roles = self.members.slots().iter().filter(|s| s.state() == SlotState::InSync).count();
        tracing::info!(
            members = self.members.slots().len(),
            in_sync = roles,
            size_bytes = self.size_bytes(),
            "reshape finished"
        );
        self.maintenance.lock().current = None;
        Ok(Step::Finished(MaintenanceWork::Reshape))
    }

    /// Whether the reshape of `shape` is md's way of changing a raid0's members: a raid4
    /// whose parity role is missing, in the new layout (grown: the first new member took the
    /// old parity role's place) or in the previous one (members removed).
    fn is_raid0_through_raid4(&self, shape: &Shape) -> bool {
        let slots = self.members.slots();
        let missing: Vec<usize> = (0..slots.len()).filter(|&r| slots[r].state() == SlotState::Missing).collect();
        let parity_missing = |g: &Geometry| {
            g.level() == Level::Raid4 && slots.len() == g.raid_disks() && missing == [g.raid_disks() - 1]
        };
        shape.layout().geometry().level() == Level::Raid4
            && (parity_missing(shape.layout().geometry())
                || shape.reshape().is_some_and(|r| parity_missing(r.previous.geometry())))
    }

    /// How far the running reshape is: (array sectors moved, array sectors to move).
    pub(crate) fn reshape_progress(&self) -> Option<(u64, u64)> {
        let shape = self.shape.load();
        let r = shape.reshape()?;
        let end = reshape_end(shape.layout(), &r.previous);
        Some(match r.direction {
            Direction::Forward => (r.front_sectors, end),
            Direction::Backward => (end.saturating_sub(r.front_sectors), end),
        })
    }
}

/// raid10 reshapes in its near layouts only (md's raid10.c reshapes near and offset layouts,
/// never far ones; mdadm's `--grow` does offset layouts too).
fn check_near(geometry: &Geometry) -> Result<()> {
    match geometry.raid10().map(|g| g.layout()) {
        Some(l) if l.is_near() => Ok(()),
        Some(l) if l.far_copies > 1 && !l.offset => {
            Err(refused(format!("{} (far copies) cannot be reshaped, by md either: copy it to a new array", l.name())))
        }
        Some(l) => Err(refused(format!(
            "raidnbd reshapes raid10 near layouts (n2, n3, ...), not {}: mdadm --grow does offset layouts",
            l.name()
        ))),
        None => Ok(()),
    }
}

/// A raid10 keeps its number of copies and stays near (md's `raid10_check_reshape`).
fn check_same_copies(previous: &Geometry, new: &Geometry) -> Result<()> {
    let (Some(p), Some(n)) = (previous.raid10(), new.raid10()) else { return Ok(()) };
    check_near(new)?;
    if p.layout().copies() != n.layout().copies() {
        return Err(refused(format!(
            "a reshape keeps the number of copies ({} to {}): md cannot change it either",
            p.layout().name(),
            n.layout().name()
        )));
    }
    Ok(())
}

/// A layout's name for people (md's number where it has none).
fn layout_name(geometry: &Geometry) -> String {
    match geometry.raid10() {
        Some(g) => g.layout().name(),
        None => {
            ParityLayout::from_md(geometry.layout()).map_or(geometry.layout().to_string(), |l| l.name().to_string())
        }
    }
}
