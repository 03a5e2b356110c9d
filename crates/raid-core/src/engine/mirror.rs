//! Levels without parity: linear, raid0, raid1, raid10.
//!
//! Reads take one readable copy of each piece (the least loaded one, so mirrors share
//! the read work; write-mostly and much slower copies only when needed: read_balance.rs)
//! and fall back to another copy when a member fails. Writes go to every
//! writable copy; a write succeeds when every piece reached at least one copy.
//! raid1/raid10 writes lock their range so two overlapping writes cannot leave the
//! copies different (md leaves that to the filesystem; a scrub would flag it).

use std::fs::File;
use std::sync::Arc;

use futures::future::join_all;

use super::io::{Piece, coalesce};
use super::read_assembler::ReadAssembler;
use super::slot::{Device, Slot};
use super::{Array, DataPath, Layout, LockGuard, MIRROR_LOCK_SECTORS, MIRROR_READ_SPLIT_SECTORS};
use crate::SECTOR_BYTES;
use crate::error::{ErrorKind, RaidError, Result};
use crate::geometry::{Extent, Level};
use crate::member::Member;
use crate::payload::Payload;
use crate::read_data::{FileExtent, ReadData};

/// Reads of raid10 prefer one copy per region of this many array sectors (1 MiB).
const MIRROR_READ_REGION_SECTORS: u64 = 2048;

/// A region's preferred copy is skipped when its member has this many more bytes of reads
/// in flight than the least busy copy.
const MIRROR_READ_IMBALANCE_BYTES: u64 = 2 << 20;

/// Array sectors handled per batch by trim/write-zeroes, bounding their memory.
const ZERO_BATCH_SECTORS: u64 = 1 << 21; // 1 GiB

impl<M: Member + ?Sized> Array<M> {
    pub(super) async fn read_mirrored(&self, layout: &Layout, start_sector: u64, len_bytes: usize) -> Result<ReadData> {
        let mut out = ReadAssembler::new(len_bytes);
        // (array sector, sectors, offset in request)
        let mut todo = vec![(start_sector, len_bytes as u64 / SECTOR_BYTES, 0usize)];
        for _attempt in 0..=self.members.slots().len() {
            if todo.is_empty() {
                return Ok(out.finish());
            }
            let mut planned = vec![0u64; self.members.slots().len()];
            let mut pieces = Vec::new();
            for (sector, sectors, req_offset) in todo.drain(..) {
                self.plan_mirror_reads(layout, sector, sectors, req_offset, &mut planned, &mut pieces)?;
            }
            let failed = self.read_pieces(pieces, &mut out).await?;
            todo = failed
                .into_iter()
                .map(|p| (start_sector + p.req_offset_bytes as u64 / SECTOR_BYTES, p.sectors, p.req_offset_bytes))
                .collect();
        }
        Err(RaidError::new(ErrorKind::Io, "read failed on every copy"))
    }

    /// Where the bytes `[offset_bytes, offset_bytes + len_bytes)` lie in member files held
    /// in memory ([`Member::memory_file`]), in request order, when all of them do on
    /// readable copies of a linear/raid0/raid1/raid10 array: the caller may send them
    /// straight from those files (`sendfile`) instead of reading them. `Ok(None)` means
    /// "read normally": a parity level, a copy not in memory, or a range no readable copy
    /// holds (where `read` reports the error). The extents name the bytes at the time of
    /// the call; a write racing the caller's use of them may or may not be seen, as for
    /// any two requests in flight together. Only a settled array answers (a reshape moves
    /// the bytes such extents name).
    pub fn read_in_place(&self, offset_bytes: u64, len_bytes: usize) -> Result<Option<Vec<FileExtent>>> {
        self.check_io(offset_bytes, len_bytes as u64, true)?;
        let shape = self.shape.load();
        let layout = shape.layout();
        if shape.reshape().is_some() || DataPath::of(layout) == DataPath::Striped {
            return Ok(None);
        }
        let mut pieces = Vec::new();
        let mut planned = vec![0u64; self.members.slots().len()];
        let start_sector = offset_bytes / SECTOR_BYTES;
        let sectors = len_bytes as u64 / SECTOR_BYTES;
        if self.plan_mirror_reads(layout, start_sector, sectors, 0, &mut planned, &mut pieces).is_err() {
            return Ok(None);
        }
        let extents = self.file_extents(pieces, len_bytes, |_, device, at, len| device.member.memory_file(at, len));
        if extents.is_some() {
            self.client_io_bytes.fetch_add(len_bytes as u64, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(extents)
    }

    /// Where a write of `len_bytes` at `offset_bytes` may be put straight into member files
    /// held in memory ([`Member::memory_file_for_write`]), in request order: for linear and
    /// raid0 arrays (one copy, no parity, no write-intent bitmap) whose members are all such
    /// files. The caller then puts the bytes there itself and calls [`flush`](Self::flush)
    /// for FUA. What a write needs before its bytes land (the superblocks marked dirty) is
    /// done before this returns. `Ok(None)` means "write normally"; errors are those of
    /// `write` (read-only, out of range, a failed array). Only a settled array answers.
    pub async fn write_in_place(&self, offset_bytes: u64, len_bytes: usize) -> Result<Option<Vec<FileExtent>>> {
        self.check_writable("write")?;
        self.check_io(offset_bytes, len_bytes as u64, true)?;
        let shape = self.shape.load();
        let layout = shape.layout();
        let one_copy = matches!(layout.geometry().level(), Level::Linear | Level::Raid0);
        if shape.reshape().is_some() || !one_copy || self.intent.is_some() {
            return Ok(None);
        }
        let pieces = self.writable_copies(layout, offset_bytes / SECTOR_BYTES, len_bytes as u64 / SECTOR_BYTES)?;
        let Some(extents) = self.file_extents(pieces, len_bytes, |slot, device, at, len| {
            slot.replacement().is_none().then(|| device.member.memory_file_for_write(at, len)).flatten()
        }) else {
            return Ok(None);
        };
        self.ensure_dirty().await?;
        self.client_io_bytes.fetch_add(len_bytes as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(Some(extents))
    }

    /// The member-file extents holding `pieces` (`len_bytes` in all), in order, merged where
    /// they follow each other in one file, if `file_of` offers a file for every piece (given
    /// its slot, its device, and the member offset and length).
    fn file_extents(
        &self,
        pieces: Vec<Piece>,
        len_bytes: usize,
        file_of: impl Fn(&Slot<M>, &Device<M>, u64, u64) -> Option<Arc<File>>,
    ) -> Option<Vec<FileExtent>> {
        let mut extents: Vec<FileExtent> = Vec::with_capacity(pieces.len());
        for piece in pieces {
            let slot = &self.members.slots()[piece.role];
            let device = slot.device()?;
            let at = device.offset_bytes(piece.member_sector);
            let len = piece.sectors * SECTOR_BYTES;
            let file = file_of(slot, &device, at, len)?;
            match extents.last_mut() {
                Some(last) if Arc::ptr_eq(&last.file, &file) && last.offset_bytes + last.len_bytes == at => {
                    last.len_bytes += len;
                }
                _ => extents.push(FileExtent { file, offset_bytes: at, len_bytes: len }),
            }
        }
        debug_assert_eq!(extents.iter().map(|e| e.len_bytes).sum::<u64>(), len_bytes as u64, "extents cover it");
        Some(extents)
    }

    /// Picks, for each piece of `[sector, sector + sectors)`, a readable copy: the one the
    /// piece's read region prefers, unless that member is much busier than another copy.
    ///
    /// Why regions: consecutive chunks of one mirror set are then read from the same member
    /// (so they merge into one large member read: a cloud volume counts I/Os), and the
    /// regions alternate between the copies (so every member works, also at queue depth 1,
    /// where "least loaded" would always pick the first copy).
    fn plan_mirror_reads(
        &self,
        layout: &Layout,
        mut sector: u64,
        sectors: u64,
        mut req_offset: usize,
        planned: &mut [u64],
        pieces: &mut Vec<Piece>,
    ) -> Result<()> {
        let end = sector + sectors;
        let level = layout.geometry().level();
        while sector < end {
            let mapped = layout.map(sector);
            let mut run = mapped.len_sectors.min(end - sector);
            if level == Level::Raid1 {
                run = run.min(MIRROR_READ_SPLIT_SECTORS - sector % MIRROR_READ_SPLIT_SECTORS);
            }
            let readable: Vec<&Extent> = self.read_candidates(
                mapped
                    .copies
                    .iter()
                    .filter(|c| self.members.slots()[c.role].is_readable(c.member_sector, run))
                    .collect(),
            );
            let load = |c: &Extent| self.read_load(c.role) + planned[c.role];
            let region = match level {
                Level::Raid1 => MIRROR_READ_SPLIT_SECTORS,
                _ => MIRROR_READ_REGION_SECTORS,
            };
            let best = readable.get((sector / region) as usize % readable.len().max(1)).map(|&preferred| {
                let least = readable.iter().copied().min_by_key(|c| load(c)).expect("non-empty");
                if load(preferred) > load(least) + MIRROR_READ_IMBALANCE_BYTES { least } else { preferred }
            });
            let Some(copy) = best else {
                return Err(RaidError::new(
                    ErrorKind::Io,
                    format!(
                        "no readable copy of array sectors {sector}..{} (failed roles {:?})",
                        sector + run,
                        self.members.failed_roles()
                    ),
                ));
            };
            planned[copy.role] += run * SECTOR_BYTES;
            pieces.push(Piece {
                role: copy.role,
                member_sector: copy.member_sector,
                sectors: run,
                req_offset_bytes: req_offset,
            });
            sector += run;
            req_offset += (run * SECTOR_BYTES) as usize;
        }
        Ok(())
    }

    /// Locks the lock units covering `[sector, sector + sectors)` of a linear, raid0, raid1 or
    /// raid10 array. (Linear and raid0 writes lock too, so that a byte-granular write's
    /// read-modify-write of a sector is not interleaved with another write to it.)
    pub(super) async fn lock_mirror_range(&self, layout: &Layout, sector: u64, sectors: u64) -> Vec<LockGuard<'_>> {
        let unit = match layout.geometry().level() {
            Level::Linear | Level::Raid0 | Level::Raid1 => MIRROR_LOCK_SECTORS,
            Level::Raid10 => u64::from(layout.geometry().chunk_sectors()),
            _ => return Vec::new(),
        };
        let (first, last) = (sector / unit, (sector + sectors - 1) / unit);
        self.locks.lock_all(first..=last).await
    }

    pub(super) async fn write_mirrored(
        &self,
        layout: &Layout,
        start_sector: u64,
        data: Payload<'_>,
        fua: bool,
    ) -> Result<()> {
        let sectors = data.len() as u64 / SECTOR_BYTES;
        if sectors == 0 {
            return Ok(());
        }
        let _guards = self.lock_mirror_range(layout, start_sector, sectors).await;
        self.write_mirrored_locked(layout, start_sector, data, fua).await
    }

    /// [`write_mirrored`](Self::write_mirrored) with the lock units already held.
    pub(super) async fn write_mirrored_locked(
        &self,
        layout: &Layout,
        start_sector: u64,
        data: Payload<'_>,
        fua: bool,
    ) -> Result<()> {
        let sectors = data.len() as u64 / SECTOR_BYTES;
        let _intent = self.intent_begin(start_sector..start_sector + sectors).await?;
        let pieces = self.writable_copies(layout, start_sector, sectors)?;
        let runs = coalesce(pieces);
        let data = &data;
        let results = join_all(runs.iter().map(|run| async move {
            // The run's pieces tile it (coalesce): the request's bytes for each, in order.
            let pieces = run
                .pieces
                .iter()
                .map(|(p, _)| data.slice(p.req_offset_bytes..p.req_offset_bytes + (p.sectors * SECTOR_BYTES) as usize))
                .collect();
            self.write_member_pieces(run.role, run.member_sector, pieces, fua).await
        }))
        .await;
        self.finish_mirror_writes(layout, start_sector, sectors, runs.iter().map(|r| r.role).zip(results), "write")
            .await
    }

    /// Every writable copy of every piece of the range, as pieces (offsets in the request).
    fn writable_copies(&self, layout: &Layout, start_sector: u64, sectors: u64) -> Result<Vec<Piece>> {
        let mut pieces = Vec::new();
        let (mut sector, end) = (start_sector, start_sector + sectors);
        while sector < end {
            let mapped = layout.map(sector);
            let run = mapped.len_sectors.min(end - sector);
            let req_offset_bytes = ((sector - start_sector) * SECTOR_BYTES) as usize;
            let before = pieces.len();
            for c in mapped.copies.iter().filter(|c| self.members.slots()[c.role].is_writable()) {
                pieces.push(Piece { role: c.role, member_sector: c.member_sector, sectors: run, req_offset_bytes });
            }
            if pieces.len() == before {
                return Err(RaidError::new(
                    ErrorKind::Io,
                    format!(
                        "no live copy of array sectors {sector}..{} (failed roles {:?})",
                        sector + run,
                        self.members.failed_roles()
                    ),
                ));
            }
            sector += run;
        }
        Ok(pieces)
    }

    /// Marks members whose write failed; succeeds if every piece kept a copy.
    async fn finish_mirror_writes(
        &self,
        layout: &Layout,
        start_sector: u64,
        sectors: u64,
        results: impl Iterator<Item = (usize, std::io::Result<()>)>,
        what: &str,
    ) -> Result<()> {
        let mut first_error = None;
        for (role, res) in results {
            if let Err(e) = res {
                self.member_failed(role, &e, what).await;
                first_error.get_or_insert((role, e));
            }
        }
        let Some((role, e)) = first_error else { return Ok(()) };
        if !self.has_redundancy() {
            return Err(RaidError::io(format!("{what} to role {role} failed"), e));
        }
        // Failed members are now faulty: a piece is safe iff it still has a writable copy.
        self.writable_copies(layout, start_sector, sectors).map(|_| ())
    }

    /// Zeroes (or discards) whole copies of a range on linear/raid0/raid1/raid10.
    pub(super) async fn zero_mirrored(
        &self,
        layout: &Layout,
        start_sector: u64,
        sectors: u64,
        deallocate: bool,
    ) -> Result<()> {
        let end = start_sector + sectors;
        let mut batch_start = start_sector;
        while batch_start < end {
            let batch = (end - batch_start).min(ZERO_BATCH_SECTORS);
            let _guards = self.lock_mirror_range(layout, batch_start, batch).await;
            let _intent = self.intent_begin(batch_start..batch_start + batch).await?;
            let runs = coalesce(self.writable_copies(layout, batch_start, batch)?);
            let results =
                join_all(runs.iter().map(|r| self.zero_member(r.role, r.member_sector, r.sectors, deallocate))).await;
            let roles = runs.iter().map(|r| r.role).zip(results);
            self.finish_mirror_writes(layout, batch_start, batch, roles, "zero").await?;
            batch_start += batch;
        }
        Ok(())
    }
}
