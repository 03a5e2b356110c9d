//! Recovery and replacement: a spare put into a failed role and rebuilt there (md
//! "recovery", from sector 0, or only the chunks written while a returning member was away:
//! md's bitmap re-add), and a replacement filled beside the device it replaces (md
//! `--replace`), a stripe (or mirror piece) at a time under its lock, from the rest of the
//! stripe or another copy. A source that fails is marked faulty and another is taken; a
//! target that fails ends the work (its role fails, or the replacement is dropped).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{MaintenanceWork, RecoveryTally, Step};
use crate::SECTOR_BYTES;
use crate::buf::AlignedBuf;
use crate::engine::io::{read_device, write_device};
use crate::engine::slot::{Replacement, SlotState};
use crate::engine::{Array, Device, Layout, META_LOCK_KEY, StateChange};
use crate::error::{ErrorKind, RaidError, Result};
use crate::member::Member;

/// Rebuild progress is written to the superblocks at least this often (member sectors).
const CHECKPOINT_SECTORS: u64 = 128 << 11; // 128 MiB

/// A step goes on past what needs no copy (holes, chunks a re-add's bitmap calls clean) up to
/// this many times its copy budget: such ranges cost a few lseeks, not I/O.
const SKIP_FACTOR: u64 = 64;

impl<M: Member + ?Sized> Array<M> {
    /// Puts a spare into the first failed role (md's remove_and_add_spares).
    pub(super) async fn assign_spare(&self) -> Result<Option<Step>> {
        if self.members.failed_roles().is_empty() || self.members.spares.lock().expect("spares lock").is_empty() {
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
        let Some(role) = self.members.failed_roles().into_iter().next() else { return Ok(None) };
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
        let slot = &self.members.slots()[role];
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
        // Installed before it leaves the list (`Admin::membership_status` reads spares first).
        slot.install(spare, Some(0));
        self.members.spares.lock().expect("spares lock").retain(|d| d.id != id);
        self.begin_recovery(role, false);
        Ok(Some(Step::Worked { work: MaintenanceWork::Recovery { role }, bytes: 0 }))
    }

    /// Starts the tally of a recovery of `role` (and shows it as the current work).
    pub(crate) fn begin_recovery(&self, role: usize, from_bitmap: bool) {
        let dirty_chunks = if from_bitmap {
            self.dirty_bitmap_chunks().or(self.away_status().map(|a| a.chunks_written)).unwrap_or(0)
        } else {
            0
        };
        let mut m = self.maintenance.lock();
        m.current = Some(MaintenanceWork::Recovery { role });
        m.recovery = Some(RecoveryTally { role, from_bitmap, dirty_chunks, copied_bytes: 0, hole_bytes: 0 });
    }

    /// Counts `sectors` of a recovery of `role`: copied, or left holes (`copied` false).
    fn count_recovered(&self, role: usize, sectors: u64, copied: bool) {
        if let Some(t) = self.maintenance.lock().recovery.as_mut().filter(|t| t.role == role) {
            if copied {
                t.copied_bytes += sectors * SECTOR_BYTES;
            } else {
                t.hole_bytes += sectors * SECTOR_BYTES;
            }
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

    pub(super) async fn recovery_step(&self, role: usize, max_bytes: u64) -> Result<Step> {
        let work = MaintenanceWork::Recovery { role };
        {
            let mut m = self.maintenance.lock();
            m.current = Some(work);
            if m.recovery.is_none_or(|t| t.role != role) {
                // Resumed from a checkpoint at start-up.
                m.recovery =
                    Some(RecoveryTally { role, from_bitmap: false, dirty_chunks: 0, copied_bytes: 0, hole_bytes: 0 });
            }
        }
        let slot = &self.members.slots()[role];
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

    pub(super) async fn replace_step(&self, role: usize, max_bytes: u64) -> Result<Step> {
        let work = MaintenanceWork::Replace { role };
        self.maintenance.lock().current = Some(work);
        let slot = &self.members.slots()[role];
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

    /// Rebuilds member sectors of `role` from `start`, about `max_bytes` worth of copying
    /// (and up to [`SKIP_FACTOR`] times that where nothing needs copying), onto the role's
    /// device (recovery) or onto `replacement`. Returns the new offset and the bytes copied.
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
            let budget = self.units_for(max_bytes, chunk);
            let end = first + (budget * SKIP_FACTOR).min(pg.stripes() - first);
            let (mut stripe, mut copied) = (first, 0);
            while stripe < end && copied < budget {
                if replacement.is_some() || !self.clean_in_bitmap(role, stripe * chunk..(stripe + 1) * chunk) {
                    let did_copy = self.rebuild_stripe(&layout, stripe, role, replacement).await?;
                    if replacement.is_none() {
                        self.count_recovered(role, chunk, did_copy);
                    }
                    copied += u64::from(did_copy);
                }
                stripe += 1;
            }
            return Ok((stripe * chunk, copied * chunk * SECTOR_BYTES));
        }
        // Mirrors: walk member space of the role, chunk by chunk (raid1: 256 KiB pieces).
        let piece = match self.layout().geometry().level() {
            crate::geometry::Level::Raid10 => u64::from(self.layout().geometry().chunk_sectors()),
            _ => crate::engine::MIRROR_READ_SPLIT_SECTORS,
        };
        let budget_sectors = self.units_for(max_bytes, piece) * piece;
        let end = (start + budget_sectors * SKIP_FACTOR).min(total);
        let (mut member_sector, mut copied) = (start, 0);
        // A bitmap re-add copies whole bitmap chunks only: do not cross their boundaries.
        let bitmap_chunk = if self.members.slots()[role].bitmap_recovery.load(Ordering::Acquire) {
            self.intent.as_ref().map(|i| i.chunk_sectors()).or(self.away.get().map(|a| a.chunk_sectors()))
        } else {
            None
        };
        while member_sector < end && copied < budget_sectors {
            let mut run = (piece - member_sector % piece).min(end - member_sector);
            if let Some(c) = bitmap_chunk
                && self.layout().geometry().level() == crate::geometry::Level::Raid1
            {
                run = run.min(c - member_sector % c);
            }
            if let Some(array_sector) = self.layout().geometry().array_sector_of(role, member_sector)
                && (replacement.is_some() || !self.clean_in_bitmap(role, array_sector..array_sector + run))
            {
                let did_copy = self.rebuild_mirror_piece(role, member_sector, array_sector, run, replacement).await?;
                if replacement.is_none() {
                    self.count_recovered(role, run, did_copy);
                }
                if did_copy {
                    copied += run;
                }
            }
            member_sector += run;
        }
        Ok((member_sector, copied * SECTOR_BYTES))
    }

    /// Rebuilds `role`'s chunk of `stripe`; `Ok(false)` when it was left a hole instead
    /// (every block it is rebuilt from is one).
    async fn rebuild_stripe(
        &self,
        array_layout: &Layout,
        stripe: u64,
        role: usize,
        replacement: Option<&Arc<Replacement<M>>>,
    ) -> Result<bool> {
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
        let blocks = layout.data_roles.len() + pg.parity_disks();
        let sources: Vec<(usize, u64)> = (0..blocks)
            .map(|b| crate::engine::stripe_read::block_role(&layout, b))
            .filter(|&r| {
                (r != role || replacement.is_some())
                    && self.members.slots()[r].is_readable(member_sector, u64::from(chunk))
            })
            .map(|r| (r, member_sector))
            .collect();
        if sources.len() + pg.parity_disks() >= blocks
            && self.leave_hole(role, replacement, &sources, member_sector, u64::from(chunk)).await
        {
            return Ok(false);
        }
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
                    let r = crate::engine::stripe_read::block_role(&layout, b);
                    (r == role && replacement.is_none()) || !self.members.slots()[r].is_readable(at, sectors)
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
        Ok(true)
    }

    /// Where every source block (role, member sector) of a rebuild is a hole, the target
    /// reads as zeros too: it is left a hole, punched if it is not one yet (a discard reads
    /// back as zeros, as md's full copy would have written). Never with bad blocks (those
    /// are read around, not trusted as holes). Whether it was; if not, the caller copies.
    async fn leave_hole(
        &self,
        role: usize,
        replacement: Option<&Arc<Replacement<M>>>,
        sources: &[(usize, u64)],
        member_sector: u64,
        sectors: u64,
    ) -> bool {
        if self.any_bad() || sources.is_empty() {
            return false;
        }
        for &(source, at) in sources {
            let Some(device) = self.members.slots()[source].device() else { return false };
            if !self.device_hole(&device, at, sectors).await {
                return false;
            }
        }
        let target = match replacement {
            Some(r) => r.device.clone(),
            None => match self.members.slots()[role].device() {
                Some(device) => device,
                None => return false,
            },
        };
        if self.device_hole(&target, member_sector, sectors).await {
            return true;
        }
        let at = target.offset_bytes(member_sector);
        target.member.discard(at, sectors * SECTOR_BYTES).await.is_ok()
    }

    pub(in crate::engine) async fn rebuild_mirror_piece(
        &self,
        role: usize,
        member_sector: u64,
        array_sector: u64,
        sectors: u64,
        replacement: Option<&Arc<Replacement<M>>>,
    ) -> Result<bool> {
        let layout = self.layout();
        let _guards = self.lock_mirror_range(&layout, array_sector, sectors).await;
        let mapped = layout.map(array_sector);
        debug_assert!(mapped.copies.iter().any(|c| c.role == role && c.member_sector == member_sector));
        let sources: Vec<(usize, u64)> = mapped
            .copies
            .iter()
            .filter(|c| {
                (c.role != role || replacement.is_some())
                    && self.members.slots()[c.role].is_readable(c.member_sector, sectors)
            })
            .map(|c| (c.role, c.member_sector))
            .collect();
        if self.leave_hole(role, replacement, &sources, member_sector, sectors).await {
            return Ok(false);
        }
        for _attempt in 0..=self.members.slots().len() {
            let source = mapped
                .copies
                .iter()
                .filter(|c| {
                    (c.role != role || replacement.is_some())
                        && self.members.slots()[c.role].is_readable(c.member_sector, sectors)
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
            let Some(device) = self.members.slots()[source.role].device() else { continue };
            match read_device(
                &device,
                source.member_sector,
                sectors,
                &self.members.slots()[source.role].inflight_read_bytes,
            )
            .await
            {
                Ok(buf) => return self.rebuild_write(role, replacement, member_sector, buf).await.map(|()| true),
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

    /// During a bitmap-based re-add: whether resync sectors `range` were not written while
    /// the member was away (so it already holds them).
    fn clean_in_bitmap(&self, role: usize, range: std::ops::Range<u64>) -> bool {
        self.members.slots()[role].bitmap_recovery.load(Ordering::Acquire)
            && match (&self.intent, self.away.get()) {
                (Some(intent), _) => !intent.any_set(range),
                (None, Some(away)) => away.since_events().is_some() && !away.any_written(range),
                (None, None) => false,
            }
    }
}
