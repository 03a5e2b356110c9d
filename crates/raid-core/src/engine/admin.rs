//! Administration: the verbs of `mdadm --manage` on a running array, as one handle,
//! [`Admin`] (from [`Array::admin`]): fail, add (a spare), replace, remove, re-add, and the
//! write-mostly flag; and what an administrator reads: roles, spares, the metadata's
//! summary, bad blocks, read latencies, the away record.
//!
//! Every change is recorded in the superblocks before it takes effect (membership.rs,
//! `persist_locked`, under the metadata lock) and refused on a read-only array; a change
//! that would lose data (failing the last copy) is refused.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::away::{AwayStart, AwayStatus, AwayStore};
use super::resize::{Resized, SizeTarget};
use super::slot::{Device, Replacement, SlotState};
use super::takeover::LevelChanged;
use super::{Array, META_LOCK_KEY, MetadataSummary, RoleStatus, StateChange};
use crate::SECTOR_BYTES;
use crate::bad_ranges::BadRanges;
use crate::error::{ErrorKind, RaidError, Result};
use crate::geometry::{Geometry, Level};
use crate::member::Member;

/// The administration handle of an array (see the module docs).
pub struct Admin<'a, M: Member + ?Sized> {
    array: &'a Array<M>,
}

impl<M: Member + ?Sized> Array<M> {
    /// Administration: fail, add, replace, remove, re-add members; roles and spares.
    pub fn admin(&self) -> Admin<'_, M> {
        Admin { array: self }
    }
}

impl<M: Member + ?Sized> Admin<'_, M> {
    /// Marks the member in `role` faulty on request (admin "fail").
    pub async fn fail_role(&self, role: usize) -> Result<()> {
        self.array.check_writable("fail")?;
        self.array.members.role(role)?;
        let mut failed = self.array.members.failed_roles();
        failed.push(role);
        let shape = self.array.shape();
        if !shape.survives(&failed) {
            return Err(RaidError::new(
                ErrorKind::Refused,
                format!("failing role {role} would leave {} without its data", shape.layout().geometry().level()),
            ));
        }
        self.array.mark_faulty(role, "failed by the administrator").await;
        Ok(())
    }

    /// Grows the array onto `members` (new devices, as `add_spare` takes them): md's reshape
    /// that adds members to a raid4/5/6 (engine/reshape.rs). The reshape is recorded before
    /// this returns and moves the data in the background (`Maintenance`); the export has its
    /// new size when it ends.
    pub async fn grow(&self, members: Vec<Arc<M>>) -> Result<()> {
        self.reshape(members, None, None).await
    }

    /// md's reshape of a raid4/5/6 in general (`mdadm --grow --raid-devices N --add MEMBER
    /// --layout L --chunk C`): onto `members` (may be none), to `layout` and `chunk_sectors`
    /// (`None`: as now). Recorded before this returns, the data moved in the background.
    pub async fn reshape(&self, members: Vec<Arc<M>>, layout: Option<u32>, chunk_sectors: Option<u32>) -> Result<()> {
        self.array.check_writable("reshape")?;
        let mut devices = Vec::with_capacity(members.len());
        for member in members {
            if devices.iter().any(|d: &Device<M>| d.member.name() == member.name()) {
                return Err(RaidError::new(ErrorKind::Refused, format!("{} is named twice", member.name())));
            }
            devices.push(self.new_device(member).await?);
        }
        let level = self.array.layout().geometry().level();
        if level == Level::Linear && layout.is_none() && chunk_sectors.is_none() {
            return self.array.append(devices).await;
        }
        if level == Level::Raid0 && !devices.is_empty() && layout.is_none() {
            // md's way (mdadm Grow.c): a raid4 without its parity member, reshaped onto the
            // new members (the first fills the parity role's place), a raid0 again at the end.
            self.array.take_over(Level::Raid4).await?;
            let started = self.array.begin_reshape(devices, None, chunk_sectors).await;
            if started.is_err() {
                self.array.take_over(Level::Raid0).await?;
            }
            return started;
        }
        self.array.begin_reshape(devices, layout, chunk_sectors).await
    }

    /// Removes members from a raid0/4/5/6 (`mdadm --grow --array-size S` then `--raid-devices
    /// N`): md's backwards reshape to `raid_disks` roles, optionally to `layout` and
    /// `chunk_sectors` (engine/reshape.rs). The export shrinks to the new size on return,
    /// which `confirmed_bytes` must name (the refusal says it); the data moves in the
    /// background, and the members of the roles removed become spares when it ends.
    pub async fn remove_members(
        &self,
        raid_disks: usize,
        layout: Option<u32>,
        chunk_sectors: Option<u32>,
        confirmed_bytes: Option<u64>,
    ) -> Result<()> {
        let geometry = self.array.layout().geometry().clone();
        if geometry.level() == Level::Raid0 && layout.is_none() {
            // md's way, as a raid0 grows: a raid4 without its parity member, reshaped to one
            // role more than the members kept, a raid0 again at the end. The size is
            // confirmed before anything changes.
            let as_raid4 = Geometry::new(
                Level::Raid4,
                0,
                geometry.chunk_sectors(),
                &vec![geometry.member_sectors(0); geometry.raid_disks() + 1],
            )
            .map_err(|e| RaidError::new(ErrorKind::Refused, format!("raid0 as a raid4: {e}")))?;
            let plan = self.array.shrink_plan(&as_raid4, raid_disks + 1, None, chunk_sectors).await?;
            self.array.confirm_shrink(&plan, geometry.raid_disks().saturating_sub(raid_disks), confirmed_bytes)?;
            self.array.take_over(Level::Raid4).await?;
            let started = self.array.begin_shrink(raid_disks + 1, None, chunk_sectors, confirmed_bytes).await;
            if started.is_err() {
                self.array.take_over(Level::Raid0).await?;
            }
            return started;
        }
        self.array.begin_shrink(raid_disks, layout, chunk_sectors, confirmed_bytes).await
    }

    /// Changes how much of every member the array uses (md's `--grow --size`,
    /// engine/resize.rs): the devices are asked their size again, the export has its new
    /// size on return, and new space is resynced in the background (`Maintenance`).
    pub async fn resize(&self, target: SizeTarget) -> Result<Resized> {
        self.array.resize(target).await
    }

    /// Changes the level without moving data (md's takeover, engine/takeover.rs); `spare`, if
    /// given, is added afterwards and rebuilt into a role the new level adds (raid5 -> raid6,
    /// raid0 -> raid4/5), as `mdadm --grow --level L --add SPARE`.
    pub async fn change_level(&self, level: Level, spare: Option<Arc<M>>) -> Result<LevelChanged> {
        let spare = match spare {
            Some(member) => Some(self.new_device(member).await?),
            None => None,
        };
        let changed = self.array.take_over(level).await?;
        if let Some(device) = spare {
            let _g = self.array.locks.lock(META_LOCK_KEY).await;
            self.persist_new_device_locked(&device, true).await?;
            drop(_g);
            tracing::info!(member = device.member.name(), "spare added");
            self.array.maintenance.wake();
        }
        Ok(changed)
    }

    /// Marks the member called `name` faulty (admin "fail").
    pub async fn fail_member(&self, name: &str) -> Result<()> {
        let role = self
            .array
            .members
            .slots()
            .iter()
            .position(|s| s.name().as_deref() == Some(name))
            .ok_or_else(|| RaidError::new(ErrorKind::Refused, format!("{name} is not an active member")))?;
        self.fail_role(role).await
    }

    /// Brings a member that left `role` back (md's re-add). The caller checked it belongs to
    /// this array and that the bitmap (its events are at least the bitmap's events_cleared)
    /// or the away record (at least [`Admin::away_since_events`]) covers the time it was
    /// away: only chunks written meanwhile are copied.
    pub async fn re_add(&self, role: usize, member: Arc<M>) -> Result<()> {
        self.array.check_writable("re add")?;
        let slot = self.array.members.role(role)?;
        if !matches!(slot.state(), SlotState::Faulty | SlotState::Missing) {
            return Err(RaidError::new(ErrorKind::Refused, format!("role {role} is not failed")));
        }
        if self.array.shape().reshape().is_some() {
            // A forward reshape takes every recovering member to be recovered by its front.
            return Err(RaidError::new(
                ErrorKind::Refused,
                "a reshape is running: re-add the member when it ends (it is rebuilt then)",
            ));
        }
        if self.array.intent.is_none() && self.away_since_events().is_none() {
            return Err(RaidError::new(
                ErrorKind::Refused,
                "the array has no write-intent bitmap and no record of what was written while the member was \
                 away: add it as a spare",
            ));
        }
        let _g = self.array.locks.lock(META_LOCK_KEY).await;
        // The failed device (often this very member) leaves the role first.
        if let Some(old) = slot.take_device() {
            self.array.persist_locked(StateChange::Remove { device: old.id }).await;
        }
        let device = self.new_device(member).await?;
        self.array.write_hole.device_joins(&device).await?;
        self.persist_new_device_locked(&device, false).await?;
        self.array.try_persist_locked(StateChange::Assign { device: device.id, role, replacement: false }).await?;
        slot.bitmap_recovery.store(true, Ordering::Release);
        slot.install(device.clone(), Some(0));
        self.array.begin_recovery(role, true);
        tracing::info!(
            role,
            member = device.member.name(),
            "member re-added: copying only chunks written while it was away"
        );
        drop(_g);
        self.array.maintenance.wake();
        Ok(())
    }

    /// Adds a device as a spare; a degraded array starts rebuilding onto it. A failed
    /// member's own address leaves its role first and is rebuilt whole.
    pub async fn add_spare(&self, member: Arc<M>) -> Result<usize> {
        self.array.check_writable("add spare")?;
        let failed_slot = self
            .array
            .members
            .slots()
            .iter()
            .find(|s| s.state() == SlotState::Faulty && s.name().as_deref() == Some(member.name()));
        if let Some(slot) = failed_slot {
            let _g = self.array.locks.lock(META_LOCK_KEY).await;
            if let Some(old) = slot.take_device() {
                tracing::info!(member = member.name(), "a failed member added again: it is rebuilt as a new device");
                old.member.retire("added again: it is rebuilt as a new device");
                self.array.persist_locked(StateChange::Remove { device: old.id }).await;
            }
        }
        let device = self.new_device(member).await?;
        let id = device.id;
        {
            let _g = self.array.locks.lock(META_LOCK_KEY).await;
            self.persist_new_device_locked(&device, true).await?;
        }
        tracing::info!(member = device.member.name(), "spare added");
        self.array.maintenance.wake();
        Ok(id)
    }

    /// Builds `member` as a replacement for `role` while the current device stays in service.
    pub async fn replace(&self, role: usize, member: Arc<M>) -> Result<()> {
        self.array.check_writable("replace")?;
        let slot = self.array.members.role(role)?;
        if slot.state() != SlotState::InSync || slot.replacement().is_some() {
            return Err(RaidError::new(
                ErrorKind::Refused,
                format!("role {role} is not in sync or is already being replaced"),
            ));
        }
        if !self.array.has_redundancy() {
            return Err(RaidError::new(
                ErrorKind::Refused,
                format!("{} cannot replace members online", self.array.layout().geometry().level()),
            ));
        }
        let device = self.new_device(member).await?;
        self.array.write_hole.device_joins(&device).await?;
        let _g = self.array.locks.lock(META_LOCK_KEY).await;
        self.persist_new_device_locked(&device, false).await?;
        slot.set_replacement(Some(Arc::new(Replacement { device: device.clone(), done_sectors: 0.into() })));
        if let Err(e) =
            self.array.try_persist_locked(StateChange::Assign { device: device.id, role, replacement: true }).await
        {
            slot.set_replacement(None);
            return Err(e);
        }
        tracing::info!(role, member = device.member.name(), "replacement started");
        drop(_g);
        self.array.maintenance.wake();
        Ok(())
    }

    /// Removes a spare or a faulty member (by name), as `mdadm --remove`.
    pub async fn remove_device(&self, name: &str) -> Result<()> {
        self.array.check_writable("remove device")?;
        let _g = self.array.locks.lock(META_LOCK_KEY).await;
        let spare = {
            let mut spares = self.array.members.spares.lock().expect("spares lock");
            spares.iter().position(|d| d.member.name() == name).map(|i| spares.remove(i))
        };
        if let Some(spare) = spare {
            spare.member.retire("removed from the array");
            self.array.persist_locked(StateChange::Remove { device: spare.id }).await;
            return Ok(());
        }
        for slot in self.array.members.slots() {
            if slot.name().as_deref() != Some(name) {
                continue;
            }
            if slot.state() != SlotState::Faulty {
                return Err(RaidError::new(ErrorKind::Refused, format!("{name} is active: fail it first")));
            }
            if let Some(old) = slot.take_device() {
                old.member.retire("removed from the array");
                self.array.persist_locked(StateChange::Remove { device: old.id }).await;
            }
            return Ok(());
        }
        Err(RaidError::new(ErrorKind::Refused, format!("{name} is not a member of the array")))
    }

    /// Checks `member` can hold any role and records it as a new device.
    async fn new_device(&self, member: Arc<M>) -> Result<Device<M>> {
        let data_offset_bytes = self.data_offset_for_new_device();
        let geometry = self.array.layout().geometry().clone();
        // A linear array takes members of any size (at least its rounding); the others need
        // room for what every member holds.
        let needed = match geometry.level() {
            Level::Linear => u64::from(geometry.chunk_sectors().max(8)),
            _ => (0..geometry.raid_disks()).map(|r| geometry.member_sectors(r)).max().unwrap_or(0),
        } * SECTOR_BYTES;
        if member.len_bytes() < data_offset_bytes + needed {
            return Err(RaidError::new(
                ErrorKind::Refused,
                format!(
                    "{}: {} bytes is too small: members of this array need {} bytes",
                    member.name(),
                    member.len_bytes(),
                    data_offset_bytes + needed
                ),
            ));
        }
        let name = member.name().to_string();
        let already = self.array.members.slots().iter().any(|s| s.name().as_deref() == Some(&name))
            || self.array.members.spare_status().iter().any(|(n, _)| *n == name);
        if already {
            return Err(RaidError::new(ErrorKind::Refused, format!("{name} is already part of the array")));
        }
        let id = self.array.members.next_device_id.fetch_add(1, Ordering::AcqRel);
        Ok(Device { id, member, data_offset_bytes })
    }

    /// The data offset new devices get: the same as the array's current devices.
    fn data_offset_for_new_device(&self) -> u64 {
        self.array
            .members
            .slots()
            .iter()
            .filter_map(|s| s.device())
            .chain(self.array.members.spares.lock().expect("spares lock").iter().cloned())
            .map(|d| d.data_offset_bytes)
            .max()
            .unwrap_or(0)
    }

    /// Records a new device in the superblocks (as md does, first as a spare); it stays among
    /// the spares only if `keep_as_spare`. The caller holds the metadata lock.
    async fn persist_new_device_locked(&self, device: &Device<M>, keep_as_spare: bool) -> Result<()> {
        let devices = std::slice::from_ref(device);
        self.array.record_new_devices_locked(devices, None).await?;
        if !keep_as_spare {
            self.array.members.take_spares(devices);
        }
        Ok(())
    }

    /// Whether every role is in sync.
    pub fn is_optimal(&self) -> bool {
        self.array.members.is_optimal()
    }

    /// Roles that are faulty or missing.
    pub fn failed_roles(&self) -> Vec<usize> {
        self.array.members.failed_roles()
    }

    pub fn role_status(&self) -> Vec<RoleStatus> {
        self.array.members.role_status()
    }

    /// Names and device ids of the spares.
    pub fn spare_status(&self) -> Vec<(String, usize)> {
        self.array.members.spare_status()
    }

    /// Roles and spares in one reading that never misses a spare taking a role: the spares
    /// are read first, and `assign_spare` installs a spare before it leaves the list.
    pub fn membership_status(&self) -> (Vec<RoleStatus>, Vec<(String, usize)>) {
        let spares = self.array.members.spare_status();
        (self.array.members.role_status(), spares)
    }

    /// The metadata store's summary (`None` without metadata).
    pub fn metadata_summary(&self) -> Option<MetadataSummary> {
        self.array.metadata_summary()
    }

    /// The bad ranges of `role`'s device (member sectors from its data offset).
    pub fn bad_blocks(&self, role: usize) -> BadRanges {
        self.array.members.slots().get(role).map(|s| s.bad()).unwrap_or_default()
    }

    /// Marks `role` write-mostly (md's `WriteMostly1`) or not.
    pub fn set_write_mostly(&self, role: usize, on: bool) {
        if let Some(slot) = self.array.members.slots().get(role) {
            slot.read_balance.write_mostly.store(on, Ordering::Relaxed);
        }
    }

    /// Whether `role` is write-mostly.
    pub fn is_write_mostly(&self, role: usize) -> bool {
        self.array.members.slots().get(role).is_some_and(|s| s.read_balance.write_mostly.load(Ordering::Relaxed))
    }

    /// The mean read latency measured on `role` (`None` before its first read).
    pub fn read_latency(&self, role: usize) -> Option<Duration> {
        let ns = self.array.members.slots().get(role)?.read_balance.latency_ns();
        (ns > 0).then(|| Duration::from_nanos(ns))
    }

    /// Tracks what is written while a member is away, for arrays with redundancy and md
    /// metadata but no write-intent bitmap (call once, before serving): see `away.rs`.
    /// `stored`: the image `store` holds, if any; `assembled_events` / `assembled_clean`:
    /// the superblocks as assembled, before this run changed anything.
    pub async fn track_away(
        &self,
        store: Option<Arc<dyn AwayStore>>,
        stored: Option<&[u8]>,
        assembled_events: u64,
        assembled_clean: bool,
    ) -> AwayStart {
        self.array.track_away(store, stored, assembled_events, assembled_clean).await
    }

    /// The away record's state (`None`: no member away, or not tracked).
    pub fn away_status(&self) -> Option<AwayStatus> {
        self.array.away_status()
    }

    /// A returning member whose superblock events are at least this was up to date when the
    /// away record began: it may be re-added from the record.
    pub fn away_since_events(&self) -> Option<u64> {
        self.array.away_since_events()
    }
}
