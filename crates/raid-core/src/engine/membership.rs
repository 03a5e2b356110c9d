//! Membership: which device serves each role, the spares, and every change to them —
//! failures (I/O errors, admin "fail"), spares added, replacements built, re-adds, removals —
//! with the superblock writes that record each change before it takes effect
//! (`persist_locked`). The data path and the background work only ask it (`slots`,
//! `device_by_id`) and report failures to it (`member_failed`).

use std::io as stdio;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::future::join_all;

use super::slot::{self, Device, RoleMember, Slot, SlotState};
use super::{Array, META_LOCK_KEY, RoleStatus, StateChange, SuperblockWrite};
use crate::error::{ErrorKind, RaidError, Result};
use crate::geometry::MAX_RAID_DISKS;
use crate::member::Member;

/// The roles and the devices without one.
///
/// Slots exist for [`MAX_RAID_DISKS`] roles from the start, so that a reshape can give the
/// array more roles while requests run; `roles` says how many are in use (the most any
/// layout of the shape has), and [`Membership::slots`] hands out only those.
pub(super) struct Membership<M: Member + ?Sized> {
    slots: Box<[Slot<M>]>,
    roles: AtomicUsize,
    /// Devices that belong to the array without a role.
    pub(super) spares: Mutex<Vec<Device<M>>>,
    pub(super) next_device_id: AtomicUsize,
}

impl<M: Member + ?Sized> Membership<M> {
    /// The roles from the members serving them (`None` = missing); device ids continue after
    /// the highest one in use.
    pub(super) fn new(members: Vec<Option<RoleMember<M>>>) -> Self {
        let roles = members.len();
        assert!(roles <= MAX_RAID_DISKS, "{roles} roles, at most {MAX_RAID_DISKS}");
        let mut members = members.into_iter();
        let slots: Box<[Slot<M>]> = (0..MAX_RAID_DISKS).map(|_| Slot::new(members.next().flatten())).collect();
        let next = slots.iter().filter_map(|s| s.device().map(|d| d.id + 1)).max().unwrap_or(0);
        Self {
            slots,
            roles: AtomicUsize::new(roles),
            spares: Mutex::new(Vec::new()),
            next_device_id: AtomicUsize::new(next),
        }
    }

    /// The slots of the roles in use.
    pub(super) fn slots(&self) -> &[Slot<M>] {
        &self.slots[..self.roles.load(Ordering::Acquire)]
    }

    /// A reshape that adds roles: `devices` take the roles from the ones in use on, in sync
    /// (the new layout addresses them only where it has written them), then the array has
    /// that many more roles. Requests of a shape with fewer roles never address them.
    pub(super) fn add_roles(&self, devices: Vec<Device<M>>) {
        let first = self.roles.load(Ordering::Acquire);
        let roles = first + devices.len();
        assert!(roles <= MAX_RAID_DISKS, "{roles} roles, at most {MAX_RAID_DISKS}");
        for (slot, device) in self.slots[first..roles].iter().zip(devices) {
            slot.install(device, None);
        }
        self.roles.store(roles, Ordering::Release);
    }

    /// A level change adds a role no device serves yet (missing: a spare is rebuilt into it).
    /// Only while no request runs (a paused shape). Returns the role.
    pub(super) fn add_missing_role(&self) -> usize {
        let role = self.roles.load(Ordering::Acquire);
        assert!(role < MAX_RAID_DISKS, "{} roles, at most {MAX_RAID_DISKS}", role + 1);
        assert!(self.slots[role].take_device().is_none(), "an unused slot holds no device");
        self.roles.store(role + 1, Ordering::Release);
        role
    }

    /// A level change drops the last role; its device, if any, is returned. Only while no
    /// request runs (a paused shape).
    pub(super) fn drop_last_role(&self) -> Option<Device<M>> {
        let roles = self.roles.load(Ordering::Acquire);
        assert!(roles > 1, "an array keeps a role");
        let device = self.slots[roles - 1].take_device();
        self.roles.store(roles - 1, Ordering::Release);
        device
    }

    /// Takes `devices` out of the spares (to give them roles, or because they were not
    /// recorded); the ones that were there.
    pub(super) fn take_spares(&self, devices: &[Device<M>]) -> Vec<Device<M>> {
        let mut spares = self.spares.lock().expect("spares lock");
        let taken = devices.iter().filter_map(|d| spares.iter().find(|s| s.id == d.id).cloned()).collect();
        spares.retain(|s| !devices.iter().any(|d| d.id == s.id));
        taken
    }

    /// Moves the data origin of every device (roles and spares) by `delta_bytes`. Only while no
    /// request runs (a paused shape): requests add it to every member address.
    pub(super) fn move_origins(&self, delta_bytes: i64) {
        for slot in self.slots() {
            slot.move_origin(delta_bytes);
        }
        for spare in self.spares.lock().expect("spares lock").iter_mut() {
            spare.move_origin(delta_bytes);
        }
    }

    /// The slot of `role`, or a refusal naming it.
    pub(super) fn role(&self, role: usize) -> Result<&Slot<M>> {
        self.slots().get(role).ok_or_else(|| RaidError::new(ErrorKind::Refused, format!("no role {role}")))
    }

    /// Adds devices that are already spares (found at assembly).
    pub(super) fn add_spares(&self, spares: Vec<Device<M>>) {
        let next = spares.iter().map(|d| d.id + 1).max().unwrap_or(0);
        self.next_device_id.fetch_max(next, Ordering::AcqRel);
        self.spares.lock().expect("spares lock").extend(spares);
    }

    /// Whether every role is in sync.
    pub(super) fn is_optimal(&self) -> bool {
        self.slots().iter().all(|s| s.state() == SlotState::InSync)
    }

    /// Roles that are faulty or missing.
    pub(super) fn failed_roles(&self) -> Vec<usize> {
        (0..self.slots().len())
            .filter(|&r| matches!(self.slots()[r].state(), SlotState::Faulty | SlotState::Missing))
            .collect()
    }

    pub(super) fn role_status(&self) -> Vec<RoleStatus> {
        self.slots()
            .iter()
            .enumerate()
            .map(|(role, s)| {
                let (failures, last_failed) = s.failures();
                RoleStatus {
                    role,
                    name: s.name(),
                    device_id: s.device().map(|d| d.id),
                    state: s.state(),
                    recovery_offset_sectors: (s.state() == SlotState::Recovering).then(|| s.recovery_offset_sectors()),
                    replacement: s.replacement().map(|r| {
                        (r.device.member.name().to_string(), r.device.id, r.done_sectors.load(Ordering::Acquire))
                    }),
                    failures,
                    last_failed,
                    integrity: s.device().and_then(|d| d.member.integrity()),
                    data_offset_bytes: s.device().map(|d| d.data_offset_bytes),
                }
            })
            .collect()
    }

    /// Names and device ids of the spares.
    pub(super) fn spare_status(&self) -> Vec<(String, usize)> {
        self.spares.lock().expect("spares lock").iter().map(|d| (d.member.name().to_string(), d.id)).collect()
    }

    /// The live device with `id`: a role's device (unless faulty), a replacement, or a spare.
    pub(super) fn device_by_id(&self, id: usize) -> Option<Device<M>> {
        for slot in self.slots() {
            if let Some(d) = slot.device().filter(|d| d.id == id) {
                return slot.is_writable().then_some(d);
            }
            if let Some(r) = slot.replacement().filter(|r| r.device.id == id) {
                return Some(r.device.clone());
            }
        }
        self.spares.lock().expect("spares lock").iter().find(|d| d.id == id).cloned()
    }

    /// Whether `id` is the device of some role (for mapping superblock write failures).
    pub(super) fn role_of_device(&self, id: usize) -> Option<usize> {
        self.slots().iter().position(|s| s.device().is_some_and(|d| d.id == id))
    }
}

impl<M: Member + ?Sized> Array<M> {
    /// Records that a member I/O failed: marks it faulty (redundant levels) and makes
    /// that durable before returning.
    pub(super) async fn member_failed(&self, role: usize, error: &stdio::Error, what: &str) {
        if let Some(corruption) = crate::integrity::corruption_of(error) {
            // Wrong bytes, not a failure: read around them and heal (heal.rs).
            return self.member_corrupt(role, &corruption.clone()).await;
        }
        self.member_faulted(role, error, what).await
    }

    /// [`member_failed`](Self::member_failed) for an error that is a failure.
    pub(super) async fn member_faulted(&self, role: usize, error: &stdio::Error, what: &str) {
        let name = self.members.slots()[role].name().unwrap_or_else(|| "?".into());
        if !self.has_redundancy() {
            tracing::error!(member = name, role, %error, "{what} failed");
            return;
        }
        tracing::error!(member = name, role, %error, "{what} failed: member marked faulty, array degraded");
        self.mark_faulty(role, &format!("{what} failed: {error}")).await;
        self.maintenance.wake();
    }

    /// Marks the device of `role` faulty (`why`) and records it durably. If a replacement
    /// was being built for the role, it takes over as a recovering member.
    pub(super) async fn mark_faulty(&self, role: usize, why: &str) {
        let slot = &self.members.slots()[role];
        if !slot.set_faulty() {
            return;
        }
        // Writes that skip the device from now on are recorded (arrays without a bitmap).
        self.away_begin(None);
        let _g = self.locks.lock(META_LOCK_KEY).await;
        if let Some(device) = slot.device() {
            device.member.retire(why);
            self.persist_locked(StateChange::Faulty { device: device.id }).await;
        }
        if let Some(replacement) = slot.replacement() {
            slot.set_replacement(None);
            let done = replacement.done_sectors.load(Ordering::Acquire);
            let old_bad = slot.bad();
            slot.take_device();
            slot.install(replacement.device.clone(), Some(done));
            tracing::warn!(role, member = replacement.device.member.name(), "replacement takes over the failed role");
            self.persist_locked(StateChange::Assign { device: replacement.device.id, role, replacement: false }).await;
            self.persist_locked(StateChange::RecoveryProgress { device: replacement.device.id, sectors: done }).await;
            self.inherit_bad_locked(role, old_bad).await;
        }
    }

    /// A replacement's write failed: drop it (the role itself is unaffected).
    pub(super) async fn replacement_failed(
        &self,
        role: usize,
        replacement: &slot::Replacement<M>,
        error: &stdio::Error,
    ) {
        let slot = &self.members.slots()[role];
        let still = slot.replacement().is_some_and(|r| r.device.id == replacement.device.id);
        if !still {
            return;
        }
        slot.set_replacement(None);
        tracing::error!(role, member = replacement.device.member.name(), %error, "replacement failed and was dropped");
        replacement.device.member.retire(&format!("failed as a replacement: {error}"));
        let _g = self.locks.lock(META_LOCK_KEY).await;
        self.persist_locked(StateChange::Faulty { device: replacement.device.id }).await;
    }

    /// Writes the superblocks for `change` (and for members that fail while doing so).
    /// The caller holds the metadata lock.
    pub(super) async fn persist_locked(&self, change: StateChange) {
        if let Err(e) = self.try_persist_locked(change).await {
            tracing::error!(error = %e, "cannot record an array state change");
        }
    }

    /// Like `persist_locked`, but reports a change the store refuses.
    pub(super) async fn try_persist_locked(&self, change: StateChange) -> Result<()> {
        let bumps_events = !matches!(change, StateChange::Bitmap { .. });
        self.persist_changes_locked(change).await?;
        if bumps_events {
            self.away_after_persist_locked().await;
        }
        Ok(())
    }

    /// Records `devices` (new to the array) in the superblocks, then `change` (which may give
    /// them roles). Each is listed among the spares while recorded, so that its superblock
    /// writes find it there, and stays there for the caller; after an error none stays.
    /// The caller holds the metadata lock.
    pub(super) async fn record_new_devices_locked(
        &self,
        devices: &[Device<M>],
        change: Option<StateChange>,
    ) -> Result<()> {
        self.members.spares.lock().expect("spares lock").extend(devices.iter().cloned());
        let mut recorded = Ok(());
        for d in devices {
            recorded = self
                .try_persist_locked(StateChange::AddSpare { device: d.id, device_bytes: d.member.len_bytes() })
                .await;
            if recorded.is_err() {
                break;
            }
        }
        if let (Ok(()), Some(change)) = (&recorded, change) {
            recorded = self.try_persist_locked(change).await;
        }
        if recorded.is_err() {
            self.members.take_spares(devices);
        }
        recorded
    }

    /// Applies `change` to the store and writes the images (and, for members that fail
    /// while doing so, their `Faulty` changes).
    pub(super) async fn persist_changes_locked(&self, change: StateChange) -> Result<()> {
        let Some(store) = &self.metadata else { return Ok(()) };
        if self.is_read_only() {
            tracing::debug!(?change, "read-only array: state change not recorded");
            return Ok(());
        }
        let mut pending = vec![change];
        let mut first = true;
        while let Some(change) = pending.pop() {
            let (events_before, applied) = {
                let mut store = store.lock().expect("metadata lock");
                (store.summary().events, store.apply(&change))
            };
            let writes = match applied {
                Ok(w) => w,
                Err(e) if first => return Err(e),
                Err(e) => {
                    tracing::error!(error = %e, "cannot record a member failure");
                    continue;
                }
            };
            first = false;
            // Per device, its images in order (a log before the superblock naming it);
            // devices in parallel.
            let mut targets: Vec<(Device<M>, Vec<SuperblockWrite>)> = Vec::new();
            for w in writes {
                match targets.iter_mut().find(|(d, _)| d.id == w.device) {
                    Some((_, list)) => list.push(w),
                    None => {
                        let device = self.members.device_by_id(w.device).or_else(|| self.write_hole.device(w.device));
                        targets.extend(device.map(|d| (d, vec![w])));
                    }
                }
            }
            let results = join_all(targets.into_iter().map(|(d, list)| async move {
                let mut res = Ok(());
                for w in list {
                    res = d.member.write_at(w.offset_bytes, w.image, true).await.0;
                    if res.is_err() {
                        break;
                    }
                }
                (d.id, res)
            }))
            .await;
            for (device, res) in results {
                if let Err(e) = res {
                    if self.write_hole.device(device).is_some() {
                        self.write_hole.device_failed(self, &e, "superblock write");
                        continue;
                    }
                    tracing::error!(device, error = %e, "superblock write failed: device marked faulty");
                    if let Some(d) = self.members.device_by_id(device) {
                        d.member.retire(&format!("superblock write failed: {e}"));
                    }
                    match self.members.role_of_device(device) {
                        Some(role) if self.members.slots()[role].set_faulty() => {
                            self.away_begin(Some(events_before));
                            pending.push(StateChange::Faulty { device })
                        }
                        Some(_) => {}
                        None => {
                            self.members.spares.lock().expect("spares lock").retain(|d| d.id != device);
                            for slot in self.members.slots() {
                                if slot.replacement().is_some_and(|r| r.device.id == device) {
                                    slot.set_replacement(None);
                                }
                            }
                            pending.push(StateChange::Faulty { device });
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
