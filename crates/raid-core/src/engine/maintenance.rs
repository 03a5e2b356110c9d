//! Background maintenance, one step at a time: rebuilding a role onto a spare (md
//! "recovery"), filling a replacement, resyncing after an unclean stop, and scrubbing
//! (check/repair). The caller (a task in the binary) calls [`Array::maintenance_step`] in
//! a loop, paces it between speed limits, and waits for [`MaintenanceState`]'s waker when
//! there is nothing to do.
//!
//! Priorities, as md's `md_check_recovery`: put spares into failed roles, rebuild,
//! replace, resync, then scrub.
//!
//! Progress is checkpointed in the superblocks (`recovery_offset`, `resync_offset`), never
//! ahead of what is done, so a restart resumes where the last checkpoint says.
//!
//! Every unit of work holds the lock of the stripe (or mirror range) it copies, so client
//! writes and maintenance never interleave on the same blocks.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use super::io::{read_device, write_device};
use super::scrub::ScrubCounts;
use super::slot::{Replacement, SlotState};
use super::{Array, Device, Layout, META_LOCK_KEY, StateChange};
use crate::SECTOR_BYTES;
use crate::buf::AlignedBuf;
use crate::error::{ErrorKind, RaidError, Result};
use crate::member::Member;

/// Rebuild progress is written to the superblocks at least this often (member sectors).
const CHECKPOINT_SECTORS: u64 = 128 << 11; // 128 MiB

/// What background work is (or was last) running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaintenanceWork {
    /// Rebuilding a role onto a spare.
    Recovery { role: usize },
    /// Filling a replacement for a role.
    Replace { role: usize },
    /// Making parity/mirrors consistent after an unclean stop.
    Resync,
    /// Scrub without changes (mismatch count only).
    Check,
    /// Scrub that rewrites mismatches.
    Repair,
}

impl MaintenanceWork {
    pub fn name(self) -> &'static str {
        match self {
            MaintenanceWork::Recovery { .. } => "recovery",
            MaintenanceWork::Replace { .. } => "replace",
            MaintenanceWork::Resync => "resync",
            MaintenanceWork::Check => "check",
            MaintenanceWork::Repair => "repair",
        }
    }
}

/// What one call of [`Array::maintenance_step`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do.
    Idle,
    /// Some work, `bytes` of member data read or written.
    Worked { work: MaintenanceWork, bytes: u64 },
    /// A job finished.
    Finished(MaintenanceWork),
}

/// What a recovery copied onto its role: a full rebuild copies everything, a bitmap re-add
/// only what was written while the member was away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryTally {
    pub role: usize,
    /// A re-add driven by the write-intent bitmap.
    pub from_bitmap: bool,
    /// Dirty bitmap chunks when it began (re-add).
    pub dirty_chunks: u64,
    /// Member bytes rebuilt and written so far.
    pub copied_bytes: u64,
}

/// A snapshot for status displays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaintenanceStatus {
    pub current: Option<MaintenanceWork>,
    /// Progress of `current`, in its own units (member sectors for recovery/replace,
    /// resync sectors, scrub units).
    pub done: u64,
    pub total: u64,
    /// The resync after an unclean stop has not finished.
    pub resync_pending: bool,
    /// Result of the last finished check/repair.
    pub last_scrub: Option<(MaintenanceWork, ScrubCounts)>,
    /// Mismatches counted so far by the running check/repair (md's mismatch_cnt).
    pub mismatch_sectors: u64,
    /// The recovery running, and the last one finished.
    pub recovery: Option<RecoveryTally>,
    pub last_recovery: Option<RecoveryTally>,
}

struct ScrubJob {
    repair: bool,
    next_unit: u64,
    counts: ScrubCounts,
}

struct Inner {
    /// Units resynced so far; `None` = no resync needed.
    resync_next_unit: Option<u64>,
    scrub: Option<ScrubJob>,
    last_scrub: Option<(MaintenanceWork, ScrubCounts)>,
    current: Option<MaintenanceWork>,
    /// Recovery sectors done since the last checkpoint.
    since_checkpoint: u64,
    recovery: Option<RecoveryTally>,
    last_recovery: Option<RecoveryTally>,
    waker: Option<Arc<dyn Fn() + Send + Sync>>,
}

pub(crate) struct MaintenanceState {
    inner: Mutex<Inner>,
}

impl MaintenanceState {
    pub fn new(dirty: bool) -> Self {
        Self {
            inner: Mutex::new(Inner {
                resync_next_unit: dirty.then_some(0),
                scrub: None,
                last_scrub: None,
                current: None,
                since_checkpoint: 0,
                recovery: None,
                last_recovery: None,
                waker: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("maintenance lock")
    }

    /// Signals the driving task that there may be work.
    pub fn wake(&self) {
        let waker = self.lock().waker.clone();
        if let Some(w) = waker {
            w();
        }
    }
}

impl<M: Member + ?Sized> Array<M> {
    /// Registers a callback called whenever background work may have appeared.
    pub fn set_maintenance_waker(&self, waker: Arc<dyn Fn() + Send + Sync>) {
        self.maintenance.lock().waker = Some(waker);
    }

    /// The superblocks say a resync stopped cleanly at `sectors` (md's resync_offset):
    /// resume there. Unlike a crash (resync_offset 0), the superblocks do not say
    /// "active", so the first write records that again.
    pub fn resume_resync_from(&self, sectors: u64) {
        let unit = sectors / self.resync_unit_sectors();
        self.maintenance.lock().resync_next_unit = Some(unit.min(self.scrub_units()));
        self.dirty.store(false, Ordering::Release);
    }

    /// Nothing needs a resync after all (a parity log replay made every stripe consistent).
    pub(crate) fn mark_resynced(&self) {
        self.maintenance.lock().resync_next_unit = None;
    }

    /// Where a pending resync stands, in md's resync sectors (`None`: nothing pending).
    pub(crate) fn resync_checkpoint(&self) -> Option<u64> {
        self.maintenance.lock().resync_next_unit.map(|u| u * self.resync_unit_sectors())
    }

    /// Resync sectors (md resync address space) per scrub unit.
    fn resync_unit_sectors(&self) -> u64 {
        match self.layout().parity() {
            Some(pg) => u64::from(pg.chunk_sectors()),
            None => super::scrub::MIRROR_UNIT_SECTORS,
        }
    }

    /// Whether parity of `stripe` can be trusted for read-modify-write (it can, unless an
    /// unclean stop left it unsynced).
    pub(crate) fn stripe_synced(&self, stripe: u64) -> bool {
        self.maintenance.lock().resync_next_unit.is_none_or(|next| stripe < next)
    }

    pub fn maintenance_status(&self) -> MaintenanceStatus {
        let m = self.maintenance.lock();
        let (done, total) = match m.current {
            Some(MaintenanceWork::Recovery { role }) => (
                self.members.slots[role].recovery_offset_sectors().min(self.layout().geometry().member_sectors(role)),
                self.layout().geometry().member_sectors(role),
            ),
            Some(MaintenanceWork::Replace { role }) => (
                self.members.slots[role].replacement().map_or(0, |r| r.done_sectors.load(Ordering::Acquire)),
                self.layout().geometry().member_sectors(role),
            ),
            Some(MaintenanceWork::Resync) => (m.resync_next_unit.unwrap_or(0), self.scrub_units()),
            Some(MaintenanceWork::Check | MaintenanceWork::Repair) => {
                (m.scrub.as_ref().map_or(0, |s| s.next_unit), self.scrub_units())
            }
            None => (0, 0),
        };
        MaintenanceStatus {
            current: m.current,
            done,
            total,
            resync_pending: m.resync_next_unit.is_some(),
            last_scrub: m.last_scrub,
            mismatch_sectors: m.scrub.as_ref().map_or(0, |s| s.counts.mismatch_sectors),
            recovery: m.recovery,
            last_recovery: m.last_recovery,
        }
    }

    /// Starts a check (or repair) of the whole array in the background.
    pub fn start_scrub(&self, repair: bool) -> Result<()> {
        self.check_writable("check")?;
        if !self.has_redundancy() {
            return Err(RaidError::new(
                ErrorKind::Refused,
                format!("{} has no redundancy to check", self.layout().geometry().level()),
            ));
        }
        if !self.is_optimal() {
            return Err(RaidError::new(ErrorKind::Refused, "cannot check a degraded or rebuilding array"));
        }
        let mut m = self.maintenance.lock();
        if m.scrub.is_some() {
            return Err(RaidError::new(ErrorKind::Refused, "a check is already running"));
        }
        m.scrub = Some(ScrubJob { repair, next_unit: 0, counts: ScrubCounts::default() });
        drop(m);
        self.maintenance.wake();
        Ok(())
    }

    /// Stops a running check/repair.
    pub fn stop_scrub(&self) -> bool {
        self.maintenance.lock().scrub.take().is_some()
    }

    /// Client I/O bytes so far (for pacing background work).
    pub fn client_io_bytes(&self) -> u64 {
        self.client_io_bytes.load(Ordering::Relaxed)
    }

    /// Does one unit of background work of at most about `max_bytes`.
    pub async fn maintenance_step(&self, max_bytes: u64) -> Result<Step> {
        if self.is_read_only() {
            return Ok(Step::Idle);
        }
        // Counted like a write for the shutdown's drain; nothing runs once it has begun.
        let Some(_in_flight) = self.quiesce.enter() else { return Ok(Step::Idle) };
        // Rebuild, resync and scrub work on a settled array (as md, never beside a reshape).
        if self.shape.load().reshape().is_some() {
            return Ok(Step::Idle);
        }
        if let Some(step) = self.assign_spare().await? {
            return Ok(step);
        }
        if let Some(role) =
            (0..self.members.slots.len()).find(|&r| self.members.slots[r].state() == SlotState::Recovering)
        {
            return self.recovery_step(role, max_bytes).await;
        }
        if let Some(role) = (0..self.members.slots.len()).find(|&r| self.members.slots[r].replacement().is_some()) {
            return self.replace_step(role, max_bytes).await;
        }
        let (resync, scrub) = {
            let m = self.maintenance.lock();
            (m.resync_next_unit, m.scrub.as_ref().map(|s| (s.repair, s.next_unit)))
        };
        if let Some(next) = resync {
            if self.has_redundancy() && self.is_optimal() {
                return self.resync_step(next, max_bytes).await;
            }
            // Degraded (and nothing rebuilding, see above): redundancy cannot be made
            // consistent without the missing member. md declares the resync done
            // (raid5 sync_request) so the array can be recorded clean; so do we.
            self.maintenance.lock().resync_next_unit = None;
            tracing::warn!(
                "skipping the resync of a degraded array after an unclean stop: stripes written at the crash \
                 may have stale redundancy (the write hole)"
            );
            return Ok(Step::Finished(MaintenanceWork::Resync));
        }
        if let Some((repair, next)) = scrub {
            return self.scrub_step(repair, next, max_bytes).await;
        }
        self.maintenance.lock().current = None;
        Ok(Step::Idle)
    }

    fn units_for(&self, max_bytes: u64, unit_sectors: u64) -> u64 {
        (max_bytes / (unit_sectors * SECTOR_BYTES)).max(1)
    }

    /// Puts a spare into the first failed role (md's remove_and_add_spares).
    async fn assign_spare(&self) -> Result<Option<Step>> {
        if self.failed_roles().is_empty() || self.members.spares.lock().expect("spares lock").is_empty() {
            return Ok(None);
        }
        if !self.has_redundancy() {
            return Ok(None);
        }
        // Role and spare are chosen under the metadata lock: a re-add or an add holding it may
        // list its device among the spares for a moment (its superblock write needs it there)
        // and put it into the failed role; seen before the lock, that device would be taken
        // out of the role it was just given (a race the remote-members test caught).
        let _g = self.locks.lock(META_LOCK_KEY).await;
        let Some(role) = self.failed_roles().into_iter().next() else { return Ok(None) };
        // The spare stays listed until it is in its role: a status taken meanwhile (the metadata
        // writes take a while) must show it one way or the other, never neither (`ctl wait`
        // would read that as idle). If the assignment cannot be recorded it stays a spare.
        let Some(spare) = self.members.spares.lock().expect("spares lock").last().cloned() else { return Ok(None) };
        if let Err(e) = self.write_hole.device_joins(&spare).await {
            tracing::error!(member = spare.member.name(), error = %e, "spare marked faulty");
            self.members.spares.lock().expect("spares lock").retain(|d| d.id != spare.id);
            self.persist_locked(StateChange::Faulty { device: spare.id }).await;
            return Ok(None);
        }
        let slot = &self.members.slots[role];
        if let Some(old) = slot.take_device() {
            self.persist_locked(StateChange::Remove { device: old.id }).await;
        }
        self.try_persist_locked(StateChange::Assign { device: spare.id, role, replacement: false }).await?;
        let id = spare.id;
        if !self.members.spares.lock().expect("spares lock").iter().any(|d| d.id == id) {
            // Its own superblock write failed: the spare was dropped as faulty meanwhile.
            tracing::warn!(role, member = spare.member.name(), "the spare failed while taking the role");
            return Ok(None);
        }
        tracing::info!(role, member = spare.member.name(), "spare takes the failed role: recovery starts");
        // Installed before it leaves the list (`Array::membership_status` reads spares first).
        slot.install(spare, Some(0));
        self.members.spares.lock().expect("spares lock").retain(|d| d.id != id);
        self.begin_recovery(role, false);
        Ok(Some(Step::Worked { work: MaintenanceWork::Recovery { role }, bytes: 0 }))
    }

    /// Starts the tally of a recovery of `role` (and shows it as the current work).
    pub(super) fn begin_recovery(&self, role: usize, from_bitmap: bool) {
        let dirty_chunks = if from_bitmap {
            self.dirty_bitmap_chunks().or(self.away_status().map(|a| a.chunks_written)).unwrap_or(0)
        } else {
            0
        };
        let mut m = self.maintenance.lock();
        m.current = Some(MaintenanceWork::Recovery { role });
        m.recovery = Some(RecoveryTally { role, from_bitmap, dirty_chunks, copied_bytes: 0 });
    }

    fn count_recovered(&self, role: usize, sectors: u64) {
        if let Some(t) = self.maintenance.lock().recovery.as_mut().filter(|t| t.role == role) {
            t.copied_bytes += sectors * SECTOR_BYTES;
        }
    }

    /// Records rebuild progress on `device` when enough was done since the last record (every
    /// 128 MiB or 1/16 of the member, whichever comes first; md checkpoints every 1/16) or
    /// when `force`d. The device is flushed first: as md's superblock writes (preflush), the
    /// superblocks never claim rebuilt data that a crash could still take from its write cache.
    async fn checkpoint(&self, device: &Device<M>, change: StateChange, sectors: u64, force: bool) {
        let every = CHECKPOINT_SECTORS.min(self.layout().geometry().member_sectors(0) / 16).max(1);
        let due = {
            let mut m = self.maintenance.lock();
            m.since_checkpoint += sectors;
            let due = force || m.since_checkpoint >= every;
            if due {
                m.since_checkpoint = 0;
            }
            due
        };
        if due {
            if let Err(e) = device.member.flush().await {
                tracing::warn!(member = device.member.name(), error = %e, "flush failed: rebuild progress not recorded");
                return;
            }
            let _g = self.locks.lock(META_LOCK_KEY).await;
            self.persist_locked(change).await;
        }
    }

    async fn recovery_step(&self, role: usize, max_bytes: u64) -> Result<Step> {
        let work = MaintenanceWork::Recovery { role };
        {
            let mut m = self.maintenance.lock();
            m.current = Some(work);
            if m.recovery.is_none_or(|t| t.role != role) {
                // Resumed from a checkpoint at start-up.
                m.recovery = Some(RecoveryTally { role, from_bitmap: false, dirty_chunks: 0, copied_bytes: 0 });
            }
        }
        let slot = &self.members.slots[role];
        let device = slot.device().expect("recovering role has a device");
        let total = self.layout().geometry().member_sectors(role);
        let start = slot.recovery_offset_sectors();
        if start >= total {
            if let Err(e) = device.member.flush().await {
                self.member_failed(role, &e, "flush of the rebuilt member").await;
                return Ok(Step::Worked { work, bytes: 0 });
            }
            slot.set_in_sync();
            let _g = self.locks.lock(META_LOCK_KEY).await;
            self.persist_locked(StateChange::InSync { device: device.id }).await;
            let mut m = self.maintenance.lock();
            m.since_checkpoint = 0;
            let tally = m.recovery.take().filter(|t| t.role == role);
            m.last_recovery = tally.or(m.last_recovery);
            drop(m);
            match tally {
                Some(t) if t.from_bitmap => tracing::info!(
                    role,
                    member = device.member.name(),
                    copied_bytes = t.copied_bytes,
                    dirty_chunks = t.dirty_chunks,
                    "re-add finished: copied only the chunks written while the member was away"
                ),
                _ => tracing::info!(role, member = device.member.name(), "recovery finished"),
            }
            return Ok(Step::Finished(work));
        }
        let (next, bytes) = self.copy_role_range(role, start, max_bytes, None).await?;
        if slot.state() != SlotState::Recovering || slot.device().map(|d| d.id) != Some(device.id) {
            return Ok(Step::Worked { work, bytes }); // failed or replaced meanwhile
        }
        slot.set_recovery_offset(next);
        self.checkpoint(
            &device,
            StateChange::RecoveryProgress { device: device.id, sectors: next },
            next - start,
            next >= total,
        )
        .await;
        Ok(Step::Worked { work, bytes })
    }

    async fn replace_step(&self, role: usize, max_bytes: u64) -> Result<Step> {
        let work = MaintenanceWork::Replace { role };
        self.maintenance.lock().current = Some(work);
        let slot = &self.members.slots[role];
        let replacement = slot.replacement().expect("replacement present");
        let total = self.layout().geometry().member_sectors(role);
        let start = replacement.done_sectors.load(Ordering::Acquire);
        if start >= total {
            let flushed = replacement.device.member.flush().await;
            let _g = self.locks.lock(META_LOCK_KEY).await;
            slot.set_replacement(None);
            if let Err(e) = flushed {
                tracing::error!(role, member = replacement.device.member.name(), error = %e, "replacement failed");
                self.persist_locked(StateChange::Faulty { device: replacement.device.id }).await;
                return Ok(Step::Worked { work, bytes: 0 });
            }
            let old_bad = slot.bad();
            let old = slot.take_device();
            slot.install(replacement.device.clone(), None);
            if let Some(old) = old {
                self.persist_locked(StateChange::Replaced { old: old.id, new: replacement.device.id }).await;
            }
            self.inherit_bad_locked(role, old_bad).await;
            tracing::info!(role, member = replacement.device.member.name(), "replacement finished and took over");
            return Ok(Step::Finished(work));
        }
        let (next, bytes) = self.copy_role_range(role, start, max_bytes, Some(&replacement)).await?;
        replacement.done_sectors.store(next, Ordering::Release);
        self.checkpoint(
            &replacement.device,
            StateChange::RecoveryProgress { device: replacement.device.id, sectors: next },
            next - start,
            false,
        )
        .await;
        Ok(Step::Worked { work, bytes })
    }

    /// Rebuilds member sectors of `role` from `start`, about `max_bytes` worth, onto the
    /// role's device (recovery) or onto `replacement`. Returns the new offset.
    async fn copy_role_range(
        &self,
        role: usize,
        start: u64,
        max_bytes: u64,
        replacement: Option<&Arc<Replacement<M>>>,
    ) -> Result<(u64, u64)> {
        let layout = self.layout();
        let total = layout.geometry().member_sectors(role);
        if let Some(pg) = layout.parity() {
            let chunk = u64::from(pg.chunk_sectors());
            debug_assert_eq!(start % chunk, 0, "recovery advances by whole stripes");
            let first = start / chunk;
            let count = self.units_for(max_bytes, chunk).min(pg.stripes() - first);
            for stripe in first..first + count {
                if replacement.is_none() && self.clean_in_bitmap(role, stripe * chunk..(stripe + 1) * chunk) {
                    continue;
                }
                self.rebuild_stripe(&layout, stripe, role, replacement).await?;
                if replacement.is_none() {
                    self.count_recovered(role, chunk);
                }
            }
            return Ok(((first + count) * chunk, count * chunk * SECTOR_BYTES));
        }
        // Mirrors: walk member space of the role, chunk by chunk (raid1: 256 KiB pieces).
        let piece = match self.layout().geometry().level() {
            crate::geometry::Level::Raid10 => u64::from(self.layout().geometry().chunk_sectors()),
            _ => super::MIRROR_READ_SPLIT_SECTORS,
        };
        let end = (start + self.units_for(max_bytes, piece) * piece).min(total);
        let mut member_sector = start;
        // A bitmap re-add copies whole bitmap chunks only: do not cross their boundaries.
        let bitmap_chunk = if self.members.slots[role].bitmap_recovery.load(Ordering::Acquire) {
            self.intent.as_ref().map(|i| i.chunk_sectors).or(self.away.get().map(|a| a.chunk_sectors))
        } else {
            None
        };
        while member_sector < end {
            let mut run = (piece - member_sector % piece).min(end - member_sector);
            if let Some(c) = bitmap_chunk
                && self.layout().geometry().level() == crate::geometry::Level::Raid1
            {
                run = run.min(c - member_sector % c);
            }
            if let Some(array_sector) = self.layout().geometry().array_sector_of(role, member_sector)
                && (replacement.is_some() || !self.clean_in_bitmap(role, array_sector..array_sector + run))
            {
                self.rebuild_mirror_piece(role, member_sector, array_sector, run, replacement).await?;
                if replacement.is_none() {
                    self.count_recovered(role, run);
                }
            }
            member_sector += run;
        }
        Ok((end, (end - start) * SECTOR_BYTES))
    }

    async fn rebuild_stripe(
        &self,
        array_layout: &Layout,
        stripe: u64,
        role: usize,
        replacement: Option<&Arc<Replacement<M>>>,
    ) -> Result<()> {
        let pg = array_layout.parity().expect("parity level");
        let _guard = self.locks.lock(stripe).await;
        let layout = pg.stripe(stripe);
        let block = layout
            .data_roles
            .iter()
            .position(|&r| r == role)
            .or_else(|| (layout.p_role == role).then_some(layout.data_roles.len()))
            .unwrap_or(layout.data_roles.len() + 1);
        let chunk = pg.chunk_sectors();
        let member_sector = array_layout.stripe_member_sector(stripe);
        // Runs of rows in which every block is uniformly good or bad; most stripes are one.
        let mut bounds = vec![0];
        if self.any_bad() {
            bounds.extend(self.bad_cuts(&layout, member_sector, u64::from(chunk)));
        }
        bounds.push(chunk);
        for run in bounds.windows(2) {
            let (lo, hi) = (run[0], run[1]);
            let (at, sectors) = (member_sector + u64::from(lo), u64::from(hi - lo));
            let blocks = layout.data_roles.len() + pg.parity_disks();
            let lost = (0..blocks)
                .filter(|&b| {
                    let r = super::stripe_read::block_role(&layout, b);
                    (r == role && replacement.is_none()) || !self.members.slots[r].is_readable(at, sectors)
                })
                .count();
            if lost > pg.parity_disks() {
                // Bad blocks elsewhere leave nothing to rebuild these rows from. A replacement
                // inherits the role's bad ranges when it takes over (these rows are among them).
                if replacement.is_none() {
                    self.mark_bad(role, at, sectors).await?;
                }
                continue;
            }
            let mut blocks = self.load_stripe_rows(array_layout, stripe, (lo, hi)).await?;
            let buf = blocks[block].take().expect("every block loaded");
            self.rebuild_write(role, replacement, at, buf).await?;
        }
        Ok(())
    }

    async fn rebuild_mirror_piece(
        &self,
        role: usize,
        member_sector: u64,
        array_sector: u64,
        sectors: u64,
        replacement: Option<&Arc<Replacement<M>>>,
    ) -> Result<()> {
        let layout = self.layout();
        let _guards = self.lock_mirror_range(&layout, array_sector, sectors).await;
        let mapped = layout.map(array_sector);
        debug_assert!(mapped.copies.iter().any(|c| c.role == role && c.member_sector == member_sector));
        for _attempt in 0..=self.members.slots.len() {
            let source = mapped
                .copies
                .iter()
                .filter(|c| {
                    (c.role != role || replacement.is_some())
                        && self.members.slots[c.role].is_readable(c.member_sector, sectors)
                })
                .min_by_key(|c| self.read_load(c.role));
            let Some(source) = source else {
                return Err(RaidError::new(
                    ErrorKind::Io,
                    format!(
                        "rebuild of role {role}: no readable copy of array sectors {array_sector}..{}",
                        array_sector + sectors
                    ),
                ));
            };
            let Some(device) = self.members.slots[source.role].device() else { continue };
            match read_device(
                &device,
                source.member_sector,
                sectors,
                &self.members.slots[source.role].inflight_read_bytes,
            )
            .await
            {
                Ok(buf) => return self.rebuild_write(role, replacement, member_sector, buf).await,
                Err(e) => self.member_failed(source.role, &e, "rebuild read").await,
            }
        }
        Err(RaidError::new(ErrorKind::Io, format!("rebuild of role {role}: sources kept failing")))
    }

    /// Writes rebuilt sectors onto the role's device (recovery) or onto `replacement`; a
    /// failure marks the role faulty, or drops the replacement.
    async fn rebuild_write(
        &self,
        role: usize,
        replacement: Option<&Arc<Replacement<M>>>,
        member_sector: u64,
        buf: AlignedBuf,
    ) -> Result<()> {
        let res = match replacement {
            Some(r) => write_device(&r.device, member_sector, buf, false).await,
            None => self.write_member(role, member_sector, buf, false).await,
        };
        let Err(e) = res else { return Ok(()) };
        match replacement {
            Some(r) => self.replacement_failed(role, r, &e).await,
            None => self.member_failed(role, &e, "rebuild write").await,
        }
        Err(RaidError::io(format!("rebuild write to role {role} failed"), e))
    }

    async fn resync_step(&self, mut next: u64, max_bytes: u64) -> Result<Step> {
        let work = MaintenanceWork::Resync;
        self.maintenance.lock().current = Some(work);
        let units = self.scrub_units();
        if let Some(intent) = &self.intent {
            // With a bitmap, only chunks written around the crash need a resync.
            let unit_sectors = self.resync_unit_sectors();
            while next < units && !intent.any_set(next * unit_sectors..(next + 1) * unit_sectors) {
                next += 1;
            }
            self.maintenance.lock().resync_next_unit = Some(next);
        }
        if next >= units {
            self.maintenance.lock().resync_next_unit = None;
            tracing::info!("resync finished");
            return Ok(Step::Finished(work));
        }
        let mut count = self.units_for(max_bytes, self.resync_unit_sectors()).min(units - next);
        if let Some(intent) = &self.intent {
            let unit_sectors = self.resync_unit_sectors();
            count = (next..next + count)
                .take_while(|u| intent.any_set(u * unit_sectors..(u + 1) * unit_sectors))
                .count()
                .max(1) as u64;
        }
        let counts = self.scrub(next, count, true).await?;
        if counts.mismatch_sectors > 0 {
            tracing::info!(sectors = counts.mismatch_sectors, "resync rewrote inconsistent redundancy");
        }
        // No checkpoint while running: md keeps resync_offset at 0 while the array is
        // active; the point reached is recorded at an orderly stop (see `shutdown`).
        self.maintenance.lock().resync_next_unit = Some(next + count);
        Ok(Step::Worked { work, bytes: counts.scrubbed_bytes })
    }

    async fn scrub_step(&self, repair: bool, next: u64, max_bytes: u64) -> Result<Step> {
        let work = if repair { MaintenanceWork::Repair } else { MaintenanceWork::Check };
        self.maintenance.lock().current = Some(work);
        let units = self.scrub_units();
        if next >= units || !self.is_optimal() {
            let mut m = self.maintenance.lock();
            if let Some(job) = m.scrub.take() {
                m.last_scrub = Some((work, job.counts));
                tracing::info!(mismatch_cnt = job.counts.mismatch_sectors, "{} finished", work.name());
            }
            return Ok(Step::Finished(work));
        }
        let count = self.units_for(max_bytes, self.resync_unit_sectors()).min(units - next);
        let counts = self.scrub(next, count, repair).await?;
        let mut m = self.maintenance.lock();
        if let Some(job) = m.scrub.as_mut().filter(|j| j.next_unit == next) {
            job.next_unit = next + count;
            job.counts += counts;
        }
        Ok(Step::Worked { work, bytes: counts.scrubbed_bytes })
    }

    /// During a bitmap-based re-add: whether resync sectors `range` were not written while
    /// the member was away (so it already holds them).
    fn clean_in_bitmap(&self, role: usize, range: std::ops::Range<u64>) -> bool {
        self.members.slots[role].bitmap_recovery.load(Ordering::Acquire)
            && match (&self.intent, self.away.get()) {
                (Some(intent), _) => !intent.any_set(range),
                (None, Some(away)) => away.since_events().is_some() && !away.any_written(range),
                (None, None) => false,
            }
    }
}
