//! The array engine: `Array<M>` turns block requests on the array into member I/O.
//!
//! ```text
//!  read/write/flush/trim/write_zeroes (bytes, 512-aligned, <= 32 MiB per read/write)
//!      │
//!      ├── shape.rs: the request enters the array's Shape: one part, or two split at a
//!      │             reshape front, each with its Layout (a geometry at a member offset)
//!      │    per part, by DataPath::of(layout) (the one place a level picks its path):
//!      ├── linear, raid0, raid1, raid10 ── mirror.rs: map pieces, pick a readable copy
//!      │                                   (least loaded), write every writable copy
//!      └── raid4/5/6 ─ stripe_read.rs: data chunks, degraded reconstruct under the lock
//!                      stripe_write.rs: per-stripe locks, a plan per segment (full stripe,
//!                        RMW or reconstruct-write by fewest reads, degraded) handed to
//!                        the WriteHole policy (write_hole/: none, md's PPL, md's journal),
//!                        which computes (stripe_compute.rs), protects, and writes
//!      member I/O: coalesced per member (io.rs: read_member, read_pieces, write_member)
//!      membership.rs: roles, spares, device ids; a failure marks the member faulty,
//!                     recorded before the write that skipped it is acknowledged
//!      handles: ArrayBuilder (builder.rs), Admin (admin.rs: fail/add/replace/remove/
//!               re-add), Maintenance (maintenance/: rebuild, resync, check/repair)
//!      state changes: metadata.rs (md superblocks through a MetadataStore)
//!      bad_blocks.rs: member sectors a device does not hold right (md's bad-block log)
//! ```
//!
//! Guarantees:
//! - A read returns the bytes last written, or an error; never other bytes. When a copy
//!   or a data block cannot be read, the engine reconstructs it (redundancy permitting)
//!   and marks the member faulty; when redundancy is exhausted the affected range fails
//!   with [`ErrorKind::Io`].
//! - Writes keep parity/mirrors consistent with the data, also in degraded mode, so a
//!   later rebuild is correct. Writes to one stripe are serialised by a per-stripe lock;
//!   different stripes proceed in parallel.
//! - `flush` makes every completed write durable on every live member; a write with
//!   `fua` is durable (data and parity) when it completes.

mod admin;
mod append;
mod away;
mod bad_blocks;
mod block_buf;
mod block_status;
mod builder;
mod gather;
mod heal;
mod intent;
mod io;
mod lock_table;
mod maintenance;
mod membership;
mod metadata;
mod mirror;
mod quiesce;
mod read_assembler;
mod read_balance;
mod reshape;
mod reshape_window;
mod resize;
mod shape;
mod slot;
mod stripe_compute;
mod stripe_plan;
mod stripe_read;
mod stripe_write;
mod stripe_zero;
mod sync_status;
mod takeover;
mod unaligned;
mod write_hole;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use futures::future::join_all;

pub use admin::Admin;
pub use away::{AwayImage, AwayStart, AwayStatus, AwayStore};
pub use builder::ArrayBuilder;
pub use gather::Timer;
pub use heal::{CorruptionCounts, MAX_CORRUPTIONS};
pub use lock_table::{LockGuard, LockTable};
pub use maintenance::{
    MISMATCH_LOG_LIMIT, Maintenance, MaintenanceStatus, MaintenanceWork, Mismatch, RecoveryTally, ScrubCounts, Step,
};
pub use metadata::{MetadataStore, MetadataSummary, StateChange, SuperblockWrite};
pub use resize::{Resized, SizeTarget};
pub use shape::{Direction, Layout, Reshape, Shape};
pub use slot::{Device, RoleMember, SlotState};
pub use sync_status::{BITMAP_DIRTY, NOT_IN_SYNC};
pub use takeover::LevelChanged;
pub use write_hole::{
    JournalConfig, JournalReport, JournalStats, MIN_JOURNAL_BYTES, MIN_PARITY_LOG_AREA_BYTES, ParityLogConfig,
    ParityLogStats, ReplayReport, WriteHoleReport, WriteHoleStart, WriteHoleStats,
};

// The read result, defined with the Volume contract it is part of (crate::read_data).
pub use crate::read_data::{FileExtent, ReadData, Segment};

use crate::SECTOR_BYTES;
use crate::allocation::Allocation;
use crate::error::{ErrorKind, RaidError, Result};
use crate::geometry::Geometry;
use crate::member::Member;
use crate::payload::Payload;
use crate::volume::{Volume, VolumeFuture};
use membership::Membership;
use shape::{Part, Parts, ShapeCell};

/// Largest READ/WRITE the engine accepts in one call (the NBD kernel client's maximum).
pub const MAX_IO_BYTES: usize = 32 << 20;

/// Array bytes one CACHE hint reads ahead at most (a hint: the rest is not worth a wait).
pub const MAX_CACHE_BYTES: u64 = 256 << 20;

/// Lock key reserved for serialising superblock updates (never a stripe number).
const META_LOCK_KEY: u64 = u64::MAX;

/// Reads of raid1 larger than this are split across mirrors.
const MIRROR_READ_SPLIT_SECTORS: u64 = 512; // 256 KiB

/// Lock unit for raid1 writes, in array sectors.
const MIRROR_LOCK_SECTORS: u64 = 128; // 64 KiB

/// Trim and write-zeroes enter the shape for at most this many array sectors at a time.
const ZERO_ROUTE_SECTORS: u64 = 1 << 21; // 1 GiB

/// How a level's data lies on the members. [`DataPath::of`] is the one place a level picks
/// its path; read, write, zeroing, in-place reads and scrub dispatch on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DataPath {
    /// linear, raid0, raid1, raid10: every byte on one member, or copied (mirror.rs).
    Mirrored,
    /// raid4/5/6: data and parity in stripes, under stripe locks (stripe_*.rs).
    Striped,
}

impl DataPath {
    pub(crate) fn of(layout: &Layout) -> DataPath {
        if layout.parity().is_some() { DataPath::Striped } else { DataPath::Mirrored }
    }
}

/// Snapshot of one role for status displays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleStatus {
    pub role: usize,
    pub name: Option<String>,
    pub device_id: Option<usize>,
    pub state: SlotState,
    /// Member sectors rebuilt so far when recovering.
    pub recovery_offset_sectors: Option<u64>,
    /// A replacement being built for this role: (name, device id, sectors copied).
    pub replacement: Option<(String, usize, u64)>,
    /// Devices of this role that failed so far, and the name of the last one.
    pub failures: u64,
    pub last_failed: Option<String>,
    /// What the device's checksums found, if it has them.
    pub integrity: Option<crate::integrity::IntegrityReport>,
    /// Where the device's data starts (md's data offset, moved by a reshape).
    pub data_offset_bytes: Option<u64>,
}

/// A running RAID array over members of type `M` (often `dyn Member`).
pub struct Array<M: Member + ?Sized> {
    /// The geometry each array sector lies in, versioned, and the requests in flight on it
    /// (shape.rs).
    shape: ShapeCell,
    /// Roles, spares and device ids (membership.rs).
    members: Membership<M>,
    locks: LockTable,
    metadata: Option<Mutex<Box<dyn MetadataStore>>>,
    /// The superblocks currently say "dirty" (resync_offset = 0).
    dirty: AtomicBool,
    /// Background work state (rebuild, resync, scrub).
    maintenance: maintenance::MaintenanceState,
    /// Bytes of client I/O so far (rebuild throttling backs off when this moves).
    client_io_bytes: AtomicU64,
    /// The write-intent bitmap, when the array has one.
    intent: Option<intent::WriteIntent>,
    /// What was written while a member was away, without a bitmap (away/).
    away: std::sync::OnceLock<away::AwayRecord>,
    /// Nothing is written to the members: no data, no metadata, no background work.
    read_only: AtomicBool,
    /// Writes in flight, and the stop that waits for them (quiesce.rs).
    quiesce: quiesce::Quiesce,
    /// Full-stripe gathering of sequential writes (raid4/5/6, when enabled: gather.rs).
    gather: std::sync::OnceLock<gather::Gather>,
    /// How striped writes close the write hole: none, md's PPL, or md's journal (write_hole/).
    write_hole: Box<dyn write_hole::WriteHole<M>>,
}

impl<M: Member + ?Sized> Array<M> {
    /// The layout the array is in (or is being reshaped to).
    pub(crate) fn layout(&self) -> std::sync::Arc<Layout> {
        self.shape.load().layout().clone()
    }

    /// The geometry the array is in (or is being reshaped to).
    pub fn geometry(&self) -> Geometry {
        self.layout().geometry().clone()
    }

    /// The array's layouts now: one, or two and the front during a reshape.
    pub fn shape(&self) -> std::sync::Arc<Shape> {
        self.shape.load()
    }

    pub fn size_bytes(&self) -> u64 {
        self.shape.load().export_sectors() * SECTOR_BYTES
    }

    /// Makes the array read-only: client writes and admin changes are refused, no metadata
    /// is written and no background work runs (md's read-only arrays write nothing either).
    /// Used for `--read-only`, offline checks and dirty degraded parity arrays.
    pub fn set_read_only(&self, read_only: bool) {
        self.read_only.store(read_only, Ordering::Release);
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::Acquire)
    }

    /// Error if the array is read-only.
    fn check_writable(&self, what: &str) -> Result<()> {
        if self.is_read_only() {
            return Err(RaidError::new(ErrorKind::Refused, format!("{what}: the array is read-only")));
        }
        Ok(())
    }

    /// Counts a client write in for the shutdown's drain (see quiesce.rs), or refuses it when
    /// the array is stopping.
    fn enter_write(&self, what: &str) -> Result<quiesce::WriteGuard<'_>> {
        self.check_writable(what)?;
        self.quiesce
            .enter()
            .ok_or_else(|| RaidError::new(ErrorKind::Refused, format!("{what}: the array is shutting down")))
    }

    /// The metadata store's summary (`None` without metadata).
    pub(crate) fn metadata_summary(&self) -> Option<MetadataSummary> {
        self.metadata.as_ref().map(|m| m.lock().expect("metadata lock").summary())
    }

    /// Reads `len_bytes` at `offset_bytes`.
    pub async fn read(&self, offset_bytes: u64, len_bytes: usize) -> Result<ReadData> {
        self.check_io(offset_bytes, len_bytes as u64, true)?;
        self.client_io_bytes.fetch_add(len_bytes as u64, Ordering::Relaxed);
        let entered = self.shape.enter(offset_bytes / SECTOR_BYTES, len_bytes as u64 / SECTOR_BYTES).await?;
        match &entered.parts {
            Parts::One(part) => self.read_part(part).await,
            Parts::Two(a, b) => {
                let (a, b) = futures::join!(self.read_part(a), self.read_part(b));
                Ok(a?.append(b?))
            }
        }
    }

    /// Reads one part of a request, in its layout.
    pub(super) async fn read_part(&self, part: &Part) -> Result<ReadData> {
        let len_bytes = (part.sectors * SECTOR_BYTES) as usize;
        match DataPath::of(&part.layout) {
            DataPath::Striped => self.read_striped(&part.layout, part.start, len_bytes).await,
            DataPath::Mirrored => self.read_mirrored(&part.layout, part.start, len_bytes).await,
        }
    }

    /// Writes `data` at `offset_bytes`; with `fua` it is durable on return.
    pub async fn write(&self, offset_bytes: u64, data: &[u8], fua: bool) -> Result<()> {
        self.write_payload(offset_bytes, Payload::Borrowed(data), fua).await
    }

    /// [`write`](Self::write) of shared bytes: every member write of it shares `data`
    /// (a mirror's copies, a raid0's chunks), none copies it where the members can write
    /// shared bytes in place (`Member::write_shared_at`).
    pub async fn write_shared(&self, offset_bytes: u64, data: Bytes, fua: bool) -> Result<()> {
        // A page-aligned payload suits every member (memory alignment is at most a page):
        // the members are asked only about others.
        let address = data.as_ptr() as usize;
        let aligned =
            address.is_multiple_of(crate::buf::BUF_ALIGN) || address.is_multiple_of(self.members_memory_alignment());
        let data = match aligned {
            true => data,
            // Copied once here, not once per member leg.
            false => {
                crate::copy_count::copied(data.len());
                Bytes::from_owner(crate::buf::AlignedBuf::from_slice(&data))
            }
        };
        self.write_payload(offset_bytes, Payload::Shared(data), fua).await
    }

    async fn write_payload(&self, offset_bytes: u64, data: Payload<'_>, fua: bool) -> Result<()> {
        let _in_flight = self.enter_write("write")?;
        self.check_io(offset_bytes, data.len() as u64, true)?;
        self.client_io_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.ensure_dirty().await?;
        let start = offset_bytes / SECTOR_BYTES;
        let stripe_sectors = self.gather.get().and_then(|_| self.layout().parity().map(|pg| pg.stripe_data_sectors()));
        if let (Some(gather), Some(stripe_sectors)) = (self.gather.get(), stripe_sectors) {
            let end = start + data.len() as u64 / SECTOR_BYTES;
            match gather.arrive(start, end, &data, fua, stripe_sectors) {
                gather::Role::Alone => {
                    let _executing = gather.executing();
                    return self.write_sectors(start, data, fua).await;
                }
                gather::Role::Joined(result) => {
                    if let Some(result) = gather::leaders_result(result).await {
                        return result;
                    }
                    // The leader went away before writing: write it here.
                }
                gather::Role::Lead(mut leader) => match leader.wait().await {
                    gather::Outcome::Go { first, data: all, fua: any_fua } => {
                        let _executing = gather.executing();
                        let result = self.write_sectors(first, all, any_fua).await;
                        leader.finish(&result);
                        return result;
                    }
                    // Merged into the group before it: that group's leader writes this too.
                    gather::Outcome::Merged(result) => {
                        if let Some(result) = gather::leaders_result(result).await {
                            return result;
                        }
                    }
                },
            }
        }
        self.write_sectors(start, data, fua).await
    }

    /// Lets sequential partial-stripe writes of a raid4/5/6 wait up to `window` for the
    /// writes that complete their stripe (gather.rs). No effect on other levels.
    pub fn enable_write_gathering(&self, window: std::time::Duration, timer: std::sync::Arc<dyn Timer>) {
        if self.layout().parity().is_some() && !window.is_zero() {
            let _ = self.gather.set(gather::Gather::new(window, timer));
        }
    }

    /// Writes that joined another's full-stripe write so far.
    pub fn gathered_writes(&self) -> u64 {
        self.gather.get().map_or(0, |g| g.joined.load(Ordering::Relaxed))
    }

    /// Zeroes a range (any length). Whole stripes/chunks are zeroed on the members
    /// (deallocating when `may_deallocate`); partial stripes are written with zeros so
    /// parity stays consistent.
    pub async fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64, may_deallocate: bool, fua: bool) -> Result<()> {
        let _in_flight = self.enter_write("write zeroes")?;
        self.check_io(offset_bytes, len_bytes, false)?;
        self.ensure_dirty().await?;
        self.zero_range(offset_bytes / SECTOR_BYTES, len_bytes / SECTOR_BYTES, may_deallocate, fua, false).await
    }

    /// A hint that `[offset_bytes, +len_bytes)` will be read soon (NBD's CACHE): passed to
    /// the member holding each piece a read would read (one readable copy; a raid4/5/6 data
    /// chunk's member, or, where that one cannot be read, the rest of its stripe is left to
    /// the read). Bounded by [`MAX_CACHE_BYTES`] per call; hints never fail a member.
    pub async fn cache(&self, offset_bytes: u64, len_bytes: u64) -> Result<()> {
        self.check_io(offset_bytes, len_bytes, false)?;
        let shape = self.shape.load();
        if shape.reshape().is_some() {
            return Ok(());
        }
        let layout = shape.layout();
        let (mut sector, end) =
            (offset_bytes / SECTOR_BYTES, (offset_bytes + len_bytes.min(MAX_CACHE_BYTES)) / SECTOR_BYTES);
        let mut hints: Vec<(usize, u64, u64)> = Vec::new();
        while sector < end {
            let mapped = layout.map(sector);
            let run = mapped.len_sectors.min(end - sector);
            let copy = mapped.copies.iter().find(|c| self.members.slots()[c.role].is_readable(c.member_sector, run));
            if let Some(c) = copy {
                match hints.last_mut() {
                    Some((role, at, n)) if *role == c.role && *at + *n == c.member_sector => *n += run,
                    _ => hints.push((c.role, c.member_sector, run)),
                }
            }
            sector += run;
        }
        let calls = hints.into_iter().filter_map(|(role, at, n)| {
            let device = self.members.slots()[role].device()?;
            Some(async move {
                let from = device.offset_bytes(at);
                if let Err(e) = device.member.cache(from, n * SECTOR_BYTES).await {
                    tracing::debug!(member = device.member.name(), error = %e, "cache hint not taken");
                }
            })
        });
        join_all(calls).await;
        Ok(())
    }

    /// Whether [`write_zeroes`](Self::write_zeroes) of the range writes no data: every
    /// member zeroes in place ([`Member::zeroes_fast`]) and, on raid4/5/6, the range is whole
    /// stripes under a policy that zeroes them on every member (partial stripes are written
    /// like data; the journal logs zeros as data). A settled array only.
    pub fn zeroes_fast(&self, offset_bytes: u64, len_bytes: u64) -> bool {
        let shape = self.shape.load();
        if shape.reshape().is_some() || self.check_io(offset_bytes, len_bytes, false).is_err() {
            return false;
        }
        if let Some(pg) = shape.layout().parity() {
            let stripe_bytes = pg.stripe_data_sectors() * SECTOR_BYTES;
            let whole = offset_bytes.is_multiple_of(stripe_bytes) && len_bytes.is_multiple_of(stripe_bytes);
            if !whole || !self.write_rules().zeroes_whole_stripes {
                return false;
            }
        }
        self.members
            .slots()
            .iter()
            .filter(|slot| slot.is_writable())
            .all(|slot| slot.device().is_some_and(|d| d.member.zeroes_fast()))
    }

    /// Discards a range (any length). Only whole stripes (raid4/5/6) are discarded, on
    /// every member so parity stays consistent; the rest is left alone (TRIM is a hint).
    /// Discarded ranges read back as zeros.
    pub async fn trim(&self, offset_bytes: u64, len_bytes: u64, fua: bool) -> Result<()> {
        let _in_flight = self.enter_write("trim")?;
        self.check_io(offset_bytes, len_bytes, false)?;
        self.ensure_dirty().await?;
        self.zero_range(offset_bytes / SECTOR_BYTES, len_bytes / SECTOR_BYTES, true, fua, true).await
    }

    /// Makes every completed write durable on every live member (and tells the write-hole
    /// policy, which may then stop logging them: a parity log's newest headers).
    pub async fn flush(&self) -> Result<()> {
        self.flush_members().await?;
        self.write_hole.after_flush(self).await
    }

    /// Flushes every live member and replacement.
    pub(crate) async fn flush_members(&self) -> Result<()> {
        let flush_number = self.write_hole.member_flush_started();
        let away_epoch = self.away.get().map(away::AwayRecord::flush_started);
        let live: Vec<usize> =
            (0..self.members.slots().len()).filter(|&r| self.members.slots()[r].is_writable()).collect();
        let replacements: Vec<(usize, std::sync::Arc<slot::Replacement<M>>)> = (0..self.members.slots().len())
            .filter_map(|r| self.members.slots()[r].replacement().map(|x| (r, x)))
            .collect();
        let (results, replacement_results) = futures::join!(
            join_all(live.iter().map(|&r| async move { self.members.slots()[r].member().flush().await })),
            join_all(replacements.iter().map(|(_, x)| x.device.member.flush()))
        );
        for (&role, res) in live.iter().zip(results) {
            if let Err(e) = res {
                self.member_failed(role, &e, "flush").await;
            }
        }
        for ((role, x), res) in replacements.iter().zip(replacement_results) {
            if let Err(e) = res {
                self.replacement_failed(*role, x, &e).await;
            }
        }
        self.check_survives("flush")?;
        self.write_hole.member_flush_done(flush_number);
        if let (Some(away), Some(epoch)) = (self.away.get(), away_epoch) {
            away.flush_done(epoch);
        }
        Ok(())
    }

    /// Orderly stop: flush, then record "clean" in the superblocks (or, when a resync
    /// after an unclean stop has not finished, how far it got, as md does).
    ///
    /// Writes still in flight (client writes, a background step) are waited for first, and
    /// new ones are refused from then on: the clean mark never precedes a write.
    pub async fn shutdown(&self) -> Result<()> {
        if self.is_read_only() {
            return Ok(());
        }
        self.quiesce.stop_and_drain().await;
        self.flush().await?;
        self.write_hole.shutdown(self).await?;
        if self.dirty.load(Ordering::Acquire) {
            let _g = self.locks.lock(META_LOCK_KEY).await;
            let change = match self.resync_checkpoint() {
                Some(sectors) => StateChange::ResyncProgress { sectors },
                None => {
                    if self.members.is_optimal() {
                        self.intent_clear_all_locked().await;
                    }
                    StateChange::Clean
                }
            };
            self.persist_locked(change).await;
            self.dirty.store(false, Ordering::Release);
        }
        Ok(())
    }

    /// Checks a request's alignment and range (and, with `limit`, its size); the write
    /// cache applies the same checks.
    pub(crate) fn check_io(&self, offset_bytes: u64, len_bytes: u64, limit: bool) -> Result<()> {
        let end = offset_bytes.checked_add(len_bytes);
        if !offset_bytes.is_multiple_of(SECTOR_BYTES) || !len_bytes.is_multiple_of(SECTOR_BYTES) {
            return Err(RaidError::new(
                ErrorKind::OutOfRange,
                format!("request {offset_bytes}+{len_bytes} is not 512-byte aligned"),
            ));
        }
        if end.is_none_or(|e| e > self.size_bytes()) {
            return Err(RaidError::new(
                ErrorKind::OutOfRange,
                format!("request {offset_bytes}+{len_bytes} beyond array end {}", self.size_bytes()),
            ));
        }
        if limit && len_bytes > MAX_IO_BYTES as u64 {
            return Err(RaidError::new(ErrorKind::Refused, format!("request of {len_bytes} bytes exceeds 32 MiB")));
        }
        Ok(())
    }

    pub(crate) fn has_redundancy(&self) -> bool {
        self.shape.load().max_failures() > 0
    }

    /// Whether every parity the layout has lies on roles that hold nothing else and are all
    /// missing (a raid4 without its parity member: md's raid0 in disguise).
    fn parity_all_missing(&self) -> bool {
        let shape = self.shape.load();
        let g = shape.layout().geometry();
        let Some(pg) = g.parity() else { return false };
        let parity_only = pg.layout().parity_only_roles(g.level(), g.raid_disks());
        let slots = self.members.slots();
        parity_only.len() == g.level().parity_blocks()
            && parity_only.iter().all(|&r| slots.get(r).is_some_and(|s| s.state() == SlotState::Missing))
    }

    /// Error unless the array still holds all its data.
    pub(crate) fn check_survives(&self, what: &str) -> Result<()> {
        let failed = self.members.failed_roles();
        let shape = self.shape.load();
        if shape.survives(&failed) {
            Ok(())
        } else {
            Err(RaidError::new(
                ErrorKind::ArrayFailed,
                format!(
                    "{what}: {} has lost roles {failed:?}, more than its redundancy",
                    shape.layout().geometry().level()
                ),
            ))
        }
    }

    /// Zeroes (or trims) a range, a batch of at most [`ZERO_ROUTE_SECTORS`] at a time, each
    /// routed by the shape on its own (a long zeroing never holds a reshape up for long).
    async fn zero_range(&self, start: u64, sectors: u64, deallocate: bool, fua: bool, trim_only: bool) -> Result<()> {
        let end = start + sectors;
        let mut at = start;
        while at < end {
            let n = (end - at).min(ZERO_ROUTE_SECTORS - at % ZERO_ROUTE_SECTORS);
            let entered = self.shape.enter(at, n).await?;
            for part in entered.parts.iter() {
                match DataPath::of(&part.layout) {
                    DataPath::Striped => {
                        self.zero_striped(&part.layout, part.start, part.sectors, deallocate, trim_only).await?
                    }
                    DataPath::Mirrored => {
                        self.zero_mirrored(&part.layout, part.start, part.sectors, deallocate).await?
                    }
                }
            }
            at += n;
        }
        if fua && sectors > 0 { self.flush().await } else { Ok(()) }
    }

    async fn ensure_dirty(&self) -> Result<()> {
        if self.metadata.is_none() || self.dirty.load(Ordering::Acquire) {
            return Ok(());
        }
        if self.parity_all_missing() {
            // No parity can go stale: the superblocks stay clean, as md's raid0 -> raid4
            // takeover leaves them, so the kernel starts such an array after a crash (md
            // refuses a dirty degraded one).
            return self.check_survives("write");
        }
        let _g = self.locks.lock(META_LOCK_KEY).await;
        if !self.dirty.load(Ordering::Acquire) {
            // With a log that replaces the crash's resync, the mark says where a resync of
            // new space (resize.rs) begins, so that the replay does not declare it in sync.
            let change = match self.resync_checkpoint() {
                Some(sectors) if sectors > 0 && self.write_hole.replaces_resync() => {
                    StateChange::ResyncProgress { sectors }
                }
                _ => StateChange::Dirty,
            };
            self.persist_locked(change).await;
            self.dirty.store(true, Ordering::Release);
        }
        self.check_survives("mark dirty")
    }
}

/// The array as a volume: its own methods, including the in-place paths.
impl<M: Member + ?Sized + 'static> Volume for Array<M> {
    fn size_bytes(&self) -> u64 {
        Array::size_bytes(self)
    }
    fn read(&self, offset_bytes: u64, len_bytes: usize) -> VolumeFuture<'_, ReadData> {
        Box::pin(Array::read(self, offset_bytes, len_bytes))
    }
    fn write<'a>(&'a self, offset_bytes: u64, data: &'a [u8], fua: bool) -> VolumeFuture<'a, ()> {
        Box::pin(Array::write(self, offset_bytes, data, fua))
    }
    fn write_shared(&self, offset_bytes: u64, data: Bytes, fua: bool) -> VolumeFuture<'_, ()> {
        Box::pin(Array::write_shared(self, offset_bytes, data, fua))
    }
    fn payload_alignment(&self) -> usize {
        self.members_memory_alignment()
    }
    fn flush(&self) -> VolumeFuture<'_, ()> {
        self.write_hole.client_flush(self)
    }
    fn can_trim(&self) -> bool {
        self.write_hole.can_trim()
    }
    fn trim(&self, offset_bytes: u64, len_bytes: u64, fua: bool) -> VolumeFuture<'_, ()> {
        Box::pin(Array::trim(self, offset_bytes, len_bytes, fua))
    }
    fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64, may_deallocate: bool, fua: bool) -> VolumeFuture<'_, ()> {
        Box::pin(Array::write_zeroes(self, offset_bytes, len_bytes, may_deallocate, fua))
    }
    fn read_in_place(&self, offset_bytes: u64, len_bytes: usize) -> Result<Option<Vec<FileExtent>>> {
        Array::read_in_place(self, offset_bytes, len_bytes)
    }
    fn write_in_place(&self, offset_bytes: u64, len_bytes: usize) -> VolumeFuture<'_, Option<Vec<FileExtent>>> {
        Box::pin(Array::write_in_place(self, offset_bytes, len_bytes))
    }
    fn writes_bytes(&self) -> bool {
        true
    }
    fn write_bytes<'a>(&'a self, offset_bytes: u64, data: &'a [u8], fua: bool) -> VolumeFuture<'a, ()> {
        Box::pin(Array::write_bytes(self, offset_bytes, data, fua))
    }
    fn block_status(&self, offset_bytes: u64, len_bytes: u64) -> VolumeFuture<'_, Vec<Allocation>> {
        Box::pin(Array::block_status(self, offset_bytes, len_bytes))
    }
    fn zeroes_fast(&self, offset_bytes: u64, len_bytes: u64) -> bool {
        Array::zeroes_fast(self, offset_bytes, len_bytes)
    }
    fn cache(&self, offset_bytes: u64, len_bytes: u64) -> VolumeFuture<'_, ()> {
        Box::pin(Array::cache(self, offset_bytes, len_bytes))
    }
    fn sync_status(&self, offset_bytes: u64, len_bytes: u64) -> Result<Vec<(u64, u32)>> {
        Array::sync_status(self, offset_bytes, len_bytes)
    }
}

/// The write-hole policy's counters, and what its journal asks of the array.
impl<M: Member + ?Sized> Array<M> {
    /// Counters of the write-hole policy (PPL or journal).
    pub fn write_hole_stats(&self) -> WriteHoleStats {
        self.write_hole.stats()
    }

    /// Records the journal's tail in the superblocks.
    pub(crate) async fn record_journal_tail(&self, sectors: u64) -> Result<()> {
        let _g = self.locks.lock(META_LOCK_KEY).await;
        self.try_persist_locked(StateChange::JournalTail { sectors }).await
    }
}
