//! Background maintenance, one step at a time: rebuilding a role onto a spare (md
//! "recovery"), filling a replacement (`rebuild.rs`), resyncing after an unclean stop, and
//! scrubbing (check/repair: `scrub.rs`). The caller (a task in the binary) takes the
//! [`Maintenance`] handle ([`Array::maintenance`]), calls [`Maintenance::step`] in a loop,
//! paces it between speed limits, and waits for the waker it registered
//! ([`Maintenance::set_waker`]) when there is nothing to do.
//!
//! Priorities, as md's `md_check_recovery`: put spares into failed roles, rebuild,
//! replace, resync, then scrub. Nothing runs beside a reshape, nor on a read-only array.
//!
//! Progress is checkpointed in the superblocks (`recovery_offset`, `resync_offset`), never
//! ahead of what is done, so a restart resumes where the last checkpoint says.
//!
//! Every unit of work holds the lock of the stripe (or mirror range) it copies, so client
//! writes and maintenance never interleave on the same blocks.

mod rebuild;
mod scrub;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

pub(crate) use scrub::MIRROR_UNIT_SECTORS;
pub use scrub::{MISMATCH_LOG_LIMIT, Mismatch, ScrubCounts};

use super::slot::SlotState;
use super::{Array, META_LOCK_KEY, StateChange};
use crate::SECTOR_BYTES;
use crate::error::{ErrorKind, RaidError, Result};
use crate::geometry::Geometry;
use crate::member::Member;

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
    /// Moving the data into a new geometry (reshape.rs).
    Reshape,
    /// Rewriting blocks a member returned wrong from redundancy (heal.rs).
    Heal,
}

impl MaintenanceWork {
    pub fn name(self) -> &'static str {
        match self {
            MaintenanceWork::Recovery { .. } => "recovery",
            MaintenanceWork::Replace { .. } => "replace",
            MaintenanceWork::Resync => "resync",
            MaintenanceWork::Check => "check",
            MaintenanceWork::Repair => "repair",
            MaintenanceWork::Reshape => "reshape",
            MaintenanceWork::Heal => "heal",
        }
    }
}

/// What one call of [`Maintenance::step`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do.
    Idle,
    /// Some work, `bytes` of member data read or written (holes skipped are not counted:
    /// the worker's speed limits pace I/O, not lseeks).
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
    /// Member bytes that were holes on every block they are rebuilt from, so the device was
    /// left a hole there (punched if it held anything): not read, not copied.
    pub hole_bytes: u64,
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

pub(super) struct ScrubJob {
    pub(super) repair: bool,
    pub(super) next_unit: u64,
    pub(super) counts: ScrubCounts,
}

pub(super) struct Inner {
    /// Units resynced so far; `None` = no resync needed.
    pub(super) resync_next_unit: Option<u64>,
    pub(super) scrub: Option<ScrubJob>,
    pub(super) last_scrub: Option<(MaintenanceWork, ScrubCounts)>,
    pub(super) current: Option<MaintenanceWork>,
    /// Recovery sectors done since the last checkpoint.
    pub(super) since_checkpoint: u64,
    pub(super) recovery: Option<RecoveryTally>,
    pub(super) last_recovery: Option<RecoveryTally>,
    /// What the current (or last) scrub found, bounded (scrub.rs).
    pub(super) mismatches: Vec<Mismatch>,
    pub(super) waker: Option<Arc<dyn Fn() + Send + Sync>>,
    /// Silent corruption met: ranges to heal, counts (heal.rs).
    pub(super) heal: super::heal::HealState,
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
                mismatches: Vec::new(),
                waker: None,
                heal: Default::default(),
            }),
        }
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
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

/// The maintenance handle of an array (see the module docs).
pub struct Maintenance<'a, M: Member + ?Sized> {
    array: &'a Array<M>,
}

impl<M: Member + ?Sized> Array<M> {
    /// Background work: rebuild, replace, resync, check and repair, one step at a time.
    pub fn maintenance(&self) -> Maintenance<'_, M> {
        Maintenance { array: self }
    }
}

impl<M: Member + ?Sized> Maintenance<'_, M> {
    /// Registers a callback called whenever background work may have appeared.
    pub fn set_waker(&self, waker: Arc<dyn Fn() + Send + Sync>) {
        self.array.maintenance.lock().waker = Some(waker);
    }

    pub fn status(&self) -> MaintenanceStatus {
        let m = self.array.maintenance.lock();
        let layout = self.array.layout();
        let (done, total) = match m.current {
            Some(MaintenanceWork::Recovery { role }) => (
                self.array.members.slots()[role].recovery_offset_sectors().min(layout.geometry().member_sectors(role)),
                layout.geometry().member_sectors(role),
            ),
            Some(MaintenanceWork::Replace { role }) => (
                self.array.members.slots()[role].replacement().map_or(0, |r| r.done_sectors.load(Ordering::Acquire)),
                layout.geometry().member_sectors(role),
            ),
            Some(MaintenanceWork::Resync) => (m.resync_next_unit.unwrap_or(0), self.scrub_units()),
            Some(MaintenanceWork::Reshape) => self.array.reshape_progress().unwrap_or((0, 0)),
            Some(MaintenanceWork::Check | MaintenanceWork::Repair) => {
                (m.scrub.as_ref().map_or(0, |s| s.next_unit), self.scrub_units())
            }
            Some(MaintenanceWork::Heal) | None => (0, 0),
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
        self.array.check_writable("check")?;
        if !self.array.has_redundancy() {
            return Err(RaidError::new(
                ErrorKind::Refused,
                format!("{} has no redundancy to check", self.array.layout().geometry().level()),
            ));
        }
        if !self.array.members.is_optimal() {
            return Err(RaidError::new(ErrorKind::Refused, "cannot check a degraded or rebuilding array"));
        }
        let mut m = self.array.maintenance.lock();
        if m.scrub.is_some() {
            return Err(RaidError::new(ErrorKind::Refused, "a check is already running"));
        }
        m.scrub = Some(ScrubJob { repair, next_unit: 0, counts: ScrubCounts::default() });
        drop(m);
        self.array.maintenance.wake();
        Ok(())
    }

    /// Stops a running check/repair.
    pub fn stop_scrub(&self) -> bool {
        self.array.maintenance.lock().scrub.take().is_some()
    }

    /// Client I/O bytes so far (for pacing background work).
    pub fn client_io_bytes(&self) -> u64 {
        self.array.client_io_bytes.load(Ordering::Relaxed)
    }

    /// Does one unit of background work of at most about `max_bytes`.
    pub async fn step(&self, max_bytes: u64) -> Result<Step> {
        if self.array.is_read_only() {
            return Ok(Step::Idle);
        }
        // Counted like a write for the shutdown's drain; nothing runs once it has begun.
        let Some(_in_flight) = self.array.quiesce.enter() else { return Ok(Step::Idle) };
        // A reshape comes first; rebuild, resync and scrub work on a settled array (as md,
        // never beside a reshape).
        if let Some(step) = self.array.reshape_step(max_bytes).await? {
            return Ok(step);
        }
        // Counted in the shape while it runs: a reshape starting waits for it.
        let _entered = self.array.shape.enter(0, 0).await?;
        if let Some(step) = self.array.heal_step().await? {
            return Ok(step);
        }
        if let Some(step) = self.array.assign_spare().await? {
            return Ok(step);
        }
        if let Some(role) = (0..self.array.members.slots().len())
            .find(|&r| self.array.members.slots()[r].state() == SlotState::Recovering)
        {
            return self.array.recovery_step(role, max_bytes).await;
        }
        if let Some(role) =
            (0..self.array.members.slots().len()).find(|&r| self.array.members.slots()[r].replacement().is_some())
        {
            return self.array.replace_step(role, max_bytes).await;
        }
        let (resync, scrub) = {
            let m = self.array.maintenance.lock();
            (m.resync_next_unit, m.scrub.as_ref().map(|s| (s.repair, s.next_unit)))
        };
        if let Some(next) = resync {
            if self.array.has_redundancy() && self.array.members.is_optimal() {
                return self.array.resync_step(next, max_bytes).await;
            }
            // Degraded (and nothing rebuilding, see above): redundancy cannot be made
            // consistent without the missing member. md declares the resync done
            // (raid5 sync_request) so the array can be recorded clean; so do we.
            self.array.maintenance.lock().resync_next_unit = None;
            tracing::warn!(
                "skipping the resync of a degraded array after an unclean stop: stripes written at the crash \
                 may have stale redundancy (the write hole)"
            );
            return Ok(Step::Finished(MaintenanceWork::Resync));
        }
        if let Some((repair, next)) = scrub {
            return self.array.scrub_step(repair, next, max_bytes).await;
        }
        self.array.maintenance.lock().current = None;
        Ok(Step::Idle)
    }

    /// Number of scrub units (stripes of raid4/5/6, 1 MiB ranges of mirrored levels).
    pub fn scrub_units(&self) -> u64 {
        self.array.scrub_units()
    }

    /// Scrubs `count` units from `first` now (offline checks, tests); see `scrub.rs`.
    pub async fn scrub(&self, first: u64, count: u64, repair: bool) -> Result<ScrubCounts> {
        self.array.scrub(first, count, repair).await
    }

    /// One sweep of the write-intent bitmap: clears the bits of chunks not written since the
    /// last one (after a member flush). Returns how many were cleared.
    pub async fn intent_sweep(&self) -> Result<u64> {
        self.array.intent_sweep().await
    }

    /// Bitmap chunks currently marked dirty (`None` without a bitmap).
    /// The mismatches the current or last scrub found (the first [`MISMATCH_LOG_LIMIT`]), with
    /// the member that is wrong where redundancy could tell.
    /// Silent corruption met per role so far (heal.rs): reports, sectors found, sectors healed.
    pub fn corruption(&self) -> Vec<super::heal::CorruptionCounts> {
        self.array.maintenance.lock().heal.counts()
    }

    pub fn mismatches(&self) -> Vec<Mismatch> {
        self.array.maintenance.lock().mismatches.clone()
    }

    pub fn dirty_bitmap_chunks(&self) -> Option<u64> {
        self.array.dirty_bitmap_chunks()
    }
}

impl<M: Member + ?Sized> Array<M> {
    /// The superblocks say a resync stopped cleanly at `sectors` (md's resync_offset):
    /// resume there. Unlike a crash (resync_offset 0), the superblocks do not say
    /// "active", so the first write records that again.
    pub(crate) fn resume_resync_from(&self, sectors: u64) {
        let unit = sectors / self.resync_unit_sectors();
        self.maintenance.lock().resync_next_unit = Some(unit.min(self.scrub_units()));
        self.dirty.store(false, Ordering::Release);
    }

    /// The geometry of an array that may change shape now, or why `what` (a change of
    /// shape: "grow", "change the size", ...) must wait: a reshape runs, or background work
    /// runs or is due.
    pub(crate) fn settled_and_idle(&self, what: &str) -> Result<Geometry> {
        let shape = self.shape.load();
        if shape.reshape().is_some() {
            return Err(RaidError::new(
                ErrorKind::Refused,
                format!("a reshape is running: {what} when it ends (raidnbd ctl wait)"),
            ));
        }
        if self.members.slots().iter().any(|s| s.device().is_some_and(|d| d.member.integrity().is_some())) {
            // Checksum areas start where md's data area ends, and stamp blocks where they lie.
            return Err(RaidError::new(
                ErrorKind::Refused,
                format!("{what} is not supported on an array with checksums (create --integrity) yet"),
            ));
        }
        let status = self.maintenance().status();
        if status.resync_pending || status.current.is_some() {
            return Err(RaidError::new(
                ErrorKind::Refused,
                format!(
                    "background work is running or due (resync, check or rebuild): {what} when it is done (an array \
                     at rest: serve it until ctl status shows none)"
                ),
            ));
        }
        Ok(shape.layout().geometry().clone())
    }

    /// The crash's resync is needless after all (a parity log replay made every stripe
    /// written around it consistent). A resync that begins further on (new space of a resize,
    /// which no log covers) still runs.
    pub(crate) fn mark_resynced(&self) {
        let mut m = self.maintenance.lock();
        if m.resync_next_unit == Some(0) {
            m.resync_next_unit = None;
        }
    }

    /// Where a pending resync stands, in md's resync sectors (`None`: nothing pending).
    pub(crate) fn resync_checkpoint(&self) -> Option<u64> {
        self.maintenance.lock().resync_next_unit.map(|u| u * self.resync_unit_sectors())
    }

    /// Resync sectors (md resync address space) per scrub unit.
    pub(super) fn resync_unit_sectors(&self) -> u64 {
        match self.layout().parity() {
            Some(pg) => u64::from(pg.chunk_sectors()),
            None => MIRROR_UNIT_SECTORS,
        }
    }

    /// Whether parity of `stripe` can be trusted for read-modify-write (it can, unless an
    /// unclean stop left it unsynced).
    pub(crate) fn stripe_synced(&self, stripe: u64) -> bool {
        self.maintenance.lock().resync_next_unit.is_none_or(|next| stripe < next)
    }

    pub(super) fn units_for(&self, max_bytes: u64, unit_sectors: u64) -> u64 {
        (max_bytes / (unit_sectors * SECTOR_BYTES)).max(1)
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
            // A resync resumed after an orderly stop runs on a clean array: its end is
            // recorded now (md: recovery_cp = MaxSector), or the next start would resume it.
            if !self.dirty.load(Ordering::Acquire) {
                let _g = self.locks.lock(META_LOCK_KEY).await;
                if !self.dirty.load(Ordering::Acquire) {
                    self.persist_locked(StateChange::Clean).await;
                }
            }
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
        let counts = self.resync_units(next, count).await?;
        if counts.mismatch_sectors > 0 {
            tracing::info!(sectors = counts.mismatch_sectors, "resync rewrote inconsistent redundancy");
        }
        // No checkpoint while running: md keeps resync_offset at 0 while the array is
        // active; the point reached is recorded at an orderly stop (see `shutdown`).
        self.maintenance.lock().resync_next_unit = Some(next + count);
        Ok(Step::Worked { work, bytes: counts.scrubbed_bytes - counts.hole_bytes })
    }

    async fn scrub_step(&self, repair: bool, next: u64, max_bytes: u64) -> Result<Step> {
        let work = if repair { MaintenanceWork::Repair } else { MaintenanceWork::Check };
        self.maintenance.lock().current = Some(work);
        let units = self.scrub_units();
        if next >= units || !self.members.is_optimal() {
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
        Ok(Step::Worked { work, bytes: counts.scrubbed_bytes - counts.hole_bytes })
    }
}
