//! raid4/5/6 I/O: stripe-locked writes with parity, and reads that rebuild data from
//! the rest of the stripe when a data block is unreadable.
//!
//! Block order inside a stripe, used for buffers and parity kinds: data indexes
//! `0..dd`, then P, then Q (raid6).
//!
//! Failure handling: a failed read marks the member faulty and the whole request is
//! planned again (nothing was written yet, and the stripe locks are still held). A failed
//! write marks the member faulty and is not retried: the other blocks of the stripe are
//! already consistent with the new data, so the lost block is reconstructable.

use futures::future::join_all;

use super::io::Piece;
use super::journal::LoggedRow;
use super::parity_log::{Footprint, LogRequest, MAX_ENTRY_PP_BYTES, MAX_WAVE_ENTRIES, MAX_WAVE_PP_BYTES};
use super::read_assembler::ReadAssembler;
use super::stripe_plan::{Mode, Segment, StripeWrite, choose_mode, segments, stripe_writes};
use super::{Array, MAX_IO_BYTES};
use crate::SECTOR_BYTES;
use crate::buf::AlignedBuf;
use crate::error::{ErrorKind, RaidError, Result};
use crate::geometry::{ParityGeometry, StripeLayout};
use crate::journal::{Payload, crc32c_le};
use crate::member::Member;
use crate::parity::{self, BlockKind};
use crate::ppl::PplEntry;
use crate::read_data::ReadData;

/// Where the new data of a write comes from.
#[derive(Clone, Copy)]
pub(crate) enum WriteSource<'a> {
    Data(&'a [u8]),
    Zeros,
}

/// Stripes zeroed per batch by trim/write-zeroes (bounds locks held and memory).
const ZERO_BATCH_STRIPES: u64 = 4096;

pub(super) fn block_role(layout: &StripeLayout, block: usize) -> usize {
    let dd = layout.data_roles.len();
    match block.checked_sub(dd) {
        None => layout.data_roles[block],
        Some(0) => layout.p_role,
        Some(_) => layout.q_role.expect("Q block only on raid6"),
    }
}

pub(super) fn block_kinds(layout: &StripeLayout, parity_disks: usize) -> Vec<BlockKind> {
    let dd = layout.data_roles.len();
    let mut kinds: Vec<BlockKind> =
        (0..dd).map(|k| BlockKind::Data { exponent: layout.q_exponents.get(k).copied().unwrap_or(0) }).collect();
    kinds.push(BlockKind::P);
    if parity_disks == 2 {
        kinds.push(BlockKind::Q);
    }
    kinds
}

/// Rebuilt block buffers, each with the (request offset, offset in buffer, length) of the
/// pieces a read wanted from it.
/// A data piece of one stripe that must be rebuilt for a degraded read.
struct WantedPiece {
    /// Index of the data block in the stripe.
    data_index: usize,
    /// First row (sector within the chunk) of the piece.
    row: u32,
    sectors: u64,
    /// Where the piece goes in the request.
    req_offset_bytes: usize,
}

/// Where a rebuilt piece lies in its block buffer and in the request.
struct PiecePlacement {
    req_offset_bytes: usize,
    buf_offset_bytes: usize,
    len_bytes: usize,
}

/// One block of a stripe to write to a member.
struct MemberWrite {
    role: usize,
    member_sector: u64,
    buf: AlignedBuf,
}

/// Rebuilt block buffers of one stripe with the pieces of the request they hold.
type RebuiltPieces = Vec<(AlignedBuf, Vec<PiecePlacement>)>;

/// One segment of one stripe being written.
struct Job {
    /// Index into the request's stripe writes.
    write: usize,
    member_sector: u64,
    rows: (u32, u32),
    written: u64,
    mode: Mode,
    /// Blocks to read before computing (decided with the plan, from the same states).
    reads: Vec<usize>,
    /// Block buffers (data.., P, Q), filled by reads then by computation.
    blocks: Vec<Option<AlignedBuf>>,
}

impl Job {
    fn sectors(&self) -> u64 {
        u64::from(self.rows.1 - self.rows.0)
    }
}

impl<M: Member + ?Sized> Array<M> {
    fn parity_geometry(&self) -> &ParityGeometry {
        self.geometry.parity().expect("striped I/O on a parity level")
    }

    pub(super) async fn read_striped(&self, start_sector: u64, len_bytes: usize) -> Result<ReadData> {
        self.read_striped_in(start_sector, len_bytes, false).await
    }

    /// Reads, with the stripes' locks already held by the caller when `stripes_locked`
    /// (a degraded read then rebuilds without taking them again).
    pub(super) async fn read_striped_in(
        &self,
        start_sector: u64,
        len_bytes: usize,
        stripes_locked: bool,
    ) -> Result<ReadData> {
        let end = start_sector + len_bytes as u64 / SECTOR_BYTES;
        let mut out = ReadAssembler::new(len_bytes);
        let (mut direct, mut degraded) = (Vec::new(), Vec::new());
        let mut sector = start_sector;
        while sector < end {
            let mapped = self.geometry.map(sector);
            let run = mapped.len_sectors.min(end - sector);
            let copy = mapped.copies[0];
            let piece = Piece {
                role: copy.role,
                member_sector: copy.member_sector,
                sectors: run,
                req_offset_bytes: ((sector - start_sector) * SECTOR_BYTES) as usize,
            };
            if self.members.slots[copy.role].is_readable(copy.member_sector, run) {
                direct.push(piece);
            } else {
                degraded.push(piece);
            }
            sector += run;
        }
        degraded.extend(self.read_pieces(direct, &mut out).await?);
        if degraded.is_empty() {
            return Ok(out.finish());
        }
        // Group what must be rebuilt by stripe.
        let pg = self.parity_geometry();
        let mut by_stripe: std::collections::BTreeMap<u64, Vec<WantedPiece>> = Default::default();
        for p in degraded {
            let (stripe, data_index, row) = pg.locate(start_sector + p.req_offset_bytes as u64 / SECTOR_BYTES);
            by_stripe.entry(stripe).or_default().push(WantedPiece {
                data_index,
                row,
                sectors: p.sectors,
                req_offset_bytes: p.req_offset_bytes,
            });
        }
        let rebuilt = join_all(
            by_stripe.into_iter().map(|(stripe, wanted)| self.read_degraded_stripe(stripe, wanted, stripes_locked)),
        )
        .await;
        for result in rebuilt {
            for (buf, pieces) in result? {
                let b = out.add_buf(buf);
                for p in pieces {
                    out.piece(p.req_offset_bytes, b, p.buf_offset_bytes, p.len_bytes);
                }
            }
        }
        Ok(out.finish())
    }

    /// Rebuilds the wanted data pieces of one stripe from its readable blocks.
    /// Returns block buffers with the placement of each piece.
    async fn read_degraded_stripe(&self, stripe: u64, wanted: Vec<WantedPiece>, locked: bool) -> Result<RebuiltPieces> {
        let _guard = if locked {
            debug_assert!(self.locks.is_locked(stripe), "the caller holds stripe {stripe}'s lock");
            None
        } else {
            Some(self.locks.lock(stripe).await)
        };
        let lo = wanted.iter().map(|w| w.row).min().expect("at least one piece");
        let hi = wanted.iter().map(|w| w.row + w.sectors as u32).max().expect("at least one piece");
        let mut blocks = self.load_stripe_rows(stripe, (lo, hi)).await?;
        let mut out: RebuiltPieces = Vec::new();
        let mut index_of_block = vec![usize::MAX; blocks.len()];
        for w in wanted {
            let k = w.data_index;
            if index_of_block[k] == usize::MAX {
                index_of_block[k] = out.len();
                out.push((blocks[k].take().expect("block loaded"), Vec::new()));
            }
            out[index_of_block[k]].1.push(PiecePlacement {
                req_offset_bytes: w.req_offset_bytes,
                buf_offset_bytes: ((w.row - lo) as u64 * SECTOR_BYTES) as usize,
                len_bytes: (w.sectors * SECTOR_BYTES) as usize,
            });
        }
        Ok(out)
    }

    /// Reads every readable block of `rows` of `stripe` and rebuilds the others.
    /// The caller holds the stripe lock. Retries (after marking the member faulty) when a
    /// read fails; fails when more blocks are unreadable than the level can rebuild.
    pub(super) async fn load_stripe_rows(&self, stripe: u64, rows: (u32, u32)) -> Result<Vec<Option<AlignedBuf>>> {
        let pg = self.parity_geometry();
        let layout = pg.stripe(stripe);
        let np = pg.parity_disks();
        let nblocks = layout.data_roles.len() + np;
        let member_sector = pg.stripe_member_sector(stripe) + u64::from(rows.0);
        let sectors = u64::from(rows.1 - rows.0);
        for _attempt in 0..=self.members.slots.len() {
            let readable: Vec<usize> = (0..nblocks)
                .filter(|&b| self.members.slots[block_role(&layout, b)].is_readable(member_sector, sectors))
                .collect();
            let missing: Vec<usize> = (0..nblocks).filter(|b| !readable.contains(b)).collect();
            if missing.len() > np {
                return Err(RaidError::new(
                    ErrorKind::Io,
                    format!(
                        "stripe {stripe}: roles {:?} unavailable, {} can rebuild at most {np}",
                        missing.iter().map(|&b| block_role(&layout, b)).collect::<Vec<_>>(),
                        pg.level()
                    ),
                ));
            }
            let results =
                join_all(readable.iter().map(|&b| self.read_member(block_role(&layout, b), member_sector, sectors)))
                    .await;
            let mut blocks: Vec<Option<AlignedBuf>> = (0..nblocks).map(|_| None).collect();
            let mut failed = false;
            for (&b, res) in readable.iter().zip(results) {
                match res {
                    Ok(buf) => blocks[b] = Some(buf),
                    Err(e) => {
                        self.member_failed(block_role(&layout, b), &e, "read").await;
                        failed = true;
                    }
                }
            }
            if failed {
                continue;
            }
            let len = (sectors * SECTOR_BYTES) as usize;
            for &b in &missing {
                blocks[b] = Some(AlignedBuf::for_overwrite(len)); // reconstruct ignores their contents
            }
            let kinds = block_kinds(&layout, np);
            let mut slices: Vec<&mut [u8]> =
                blocks.iter_mut().map(|b| b.as_mut().expect("filled").as_mut_slice()).collect();
            assert!(parity::reconstruct(&mut slices, &kinds, &missing), "reconstruct within redundancy");
            return Ok(blocks);
        }
        Err(RaidError::new(ErrorKind::Io, format!("stripe {stripe}: members kept failing")))
    }

    pub(super) async fn write_striped(
        &self,
        start_sector: u64,
        sectors: u64,
        src: WriteSource<'_>,
        fua: bool,
    ) -> Result<()> {
        let pg = self.parity_geometry();
        let writes = stripe_writes(start_sector, sectors, pg.chunk_sectors(), pg.data_disks());
        // Collected: an iterator borrowing `writes` held across the await would make this
        // future not Send (closure lifetimes).
        let stripes: Vec<u64> = writes.iter().map(|w| w.stripe).collect();
        let _guards = self.locks.lock_all(stripes).await;
        if let Some((start, buf)) = self.widen_to_pages(start_sector, sectors, src).await? {
            return self.write_striped_locked(start, buf.as_slice(), fua).await;
        }
        self.write_stripes_locked(&writes, src, fua).await
    }

    /// With a journal (which logs whole 4 KiB pages), a write that starts or ends inside a
    /// page becomes a write of whole pages: the rest of those pages is read first. A page
    /// lies in one chunk, so the widened write takes the same stripe locks (held).
    async fn widen_to_pages(
        &self,
        start: u64,
        sectors: u64,
        src: WriteSource<'_>,
    ) -> Result<Option<(u64, AlignedBuf)>> {
        const PAGE: u64 = crate::journal::JOURNAL_PAGE_SECTORS;
        let end = start + sectors;
        if self.journal.is_none() || (start.is_multiple_of(PAGE) && end.is_multiple_of(PAGE)) {
            return Ok(None);
        }
        let (first, last) = (start / PAGE * PAGE, end.div_ceil(PAGE) * PAGE);
        let mut buf = AlignedBuf::zeroed(((last - first) * SECTOR_BYTES) as usize);
        let page = PAGE as usize * SECTOR_BYTES as usize;
        // Only the pages the write covers in part are read, each once.
        let mut partial = Vec::with_capacity(2);
        if start != first {
            partial.push(first);
        }
        if end != last && partial.last() != Some(&(last - PAGE)) {
            partial.push(last - PAGE);
        }
        for at in partial {
            let old = self.read_striped_in(at, page, true).await?.to_vec();
            let off = ((at - first) * SECTOR_BYTES) as usize;
            buf.as_mut_slice()[off..off + page].copy_from_slice(&old);
        }
        let off = ((start - first) * SECTOR_BYTES) as usize;
        let len = (sectors * SECTOR_BYTES) as usize;
        match src {
            WriteSource::Data(data) => buf.as_mut_slice()[off..off + len].copy_from_slice(data),
            WriteSource::Zeros => buf.as_mut_slice()[off..off + len].fill(0),
        }
        Ok(Some((first, buf)))
    }

    /// The stripes `[start_sector, +sectors)` lies in, in ascending order (the keys its
    /// write locks).
    pub(super) fn stripes_of(&self, start_sector: u64, sectors: u64) -> Vec<u64> {
        let pg = self.parity_geometry();
        stripe_writes(start_sector, sectors, pg.chunk_sectors(), pg.data_disks()).iter().map(|w| w.stripe).collect()
    }

    /// Writes whole sectors with the stripes' locks already held.
    pub(super) async fn write_striped_locked(&self, start_sector: u64, data: &[u8], fua: bool) -> Result<()> {
        let pg = self.parity_geometry();
        let sectors = data.len() as u64 / SECTOR_BYTES;
        if let Some((start, buf)) = self.widen_to_pages(start_sector, sectors, WriteSource::Data(data)).await? {
            let writes = stripe_writes(start, buf.len() as u64 / SECTOR_BYTES, pg.chunk_sectors(), pg.data_disks());
            return self.write_stripes_locked(&writes, WriteSource::Data(buf.as_slice()), fua).await;
        }
        let writes = stripe_writes(start_sector, sectors, pg.chunk_sectors(), pg.data_disks());
        self.write_stripes_locked(&writes, WriteSource::Data(data), fua).await
    }

    async fn write_stripes_locked(&self, writes: &[StripeWrite], src: WriteSource<'_>, fua: bool) -> Result<()> {
        debug_assert!(
            writes.iter().all(|w| self.locks.is_locked(w.stripe)),
            "data and parity of a stripe are written only under its lock"
        );
        let pg = self.parity_geometry();
        let layouts: Vec<StripeLayout> = writes.iter().map(|w| pg.stripe(w.stripe)).collect();
        let (Some(first), Some(last)) = (writes.first(), writes.last()) else { return Ok(()) };
        let _intent =
            self.intent_begin(pg.stripe_member_sector(first.stripe)..pg.stripe_member_sector(last.stripe + 1)).await?;
        for _attempt in 0..=self.members.slots.len() {
            let mut jobs = self.plan_jobs(writes, &layouts)?;
            // Headers of the logs this write will use wait for its reads (bigger batches).
            let mut expected = self.parity_log.as_ref().map(|log| {
                let mut roles: Vec<usize> = jobs.iter().map(|j| layouts[j.write].p_role).collect();
                roles.sort_unstable();
                roles.dedup();
                roles.retain(|&r| self.members.slots[r].is_writable());
                log.expect(roles)
            });
            let layouts_ref = &layouts;
            let reads: Vec<(usize, usize, usize)> = jobs
                .iter()
                .enumerate()
                .flat_map(|(j, job)| job.reads.iter().map(move |&b| (j, b, block_role(&layouts_ref[job.write], b))))
                .collect();
            let results = join_all(
                reads.iter().map(|&(j, _, role)| self.read_member(role, jobs[j].member_sector, jobs[j].sectors())),
            )
            .await;
            let mut read_failed = false;
            for (&(j, b, role), res) in reads.iter().zip(results) {
                match res {
                    Ok(buf) => jobs[j].blocks[b] = Some(buf),
                    Err(e) => {
                        self.member_failed(role, &e, "read").await;
                        read_failed = true;
                    }
                }
            }
            if read_failed {
                continue;
            }
            // Bad ranges these writes make right (cleared once they are done).
            let clears: Vec<(usize, u64, u64)> = match self.any_bad() {
                true => jobs.iter().flat_map(|job| self.rewritten(job, &layouts[job.write])).collect(),
                false => Vec::new(),
            };
            if self.journal.is_some() {
                let mut computed = Vec::with_capacity(jobs.len());
                for job in jobs {
                    let write = &writes[job.write];
                    let (stripe, member_sector, sectors) = (write.stripe, job.member_sector, job.sectors());
                    let layout = &layouts[job.write];
                    let mut member_writes = Vec::new();
                    self.compute_job(job, write, &layouts, src, &mut member_writes, false);
                    computed.push(JournaledJob { stripe, layout, member_sector, sectors, writes: member_writes });
                }
                self.write_journaled(computed).await?; // FUA or not: durable in the journal
                self.check_survives("write")?;
                return self.clear_bad(&clears).await;
            }
            let logging = self.parity_log.is_some();
            // Per job: its member writes and, with a parity log, its entry.
            let mut computed: Vec<(Vec<MemberWrite>, Option<LogRequest>)> = Vec::with_capacity(jobs.len());
            for job in jobs {
                let write = &writes[job.write];
                let entry = logging.then(|| self.log_entry(&job, write.stripe, &layouts[job.write])).flatten();
                let footprint = Footprint { stripe: write.stripe, written: job.written, rows: job.rows };
                let data_crcs = match entry {
                    Some(_) => self.new_data_crcs(&job, write, src),
                    None => Vec::new(),
                };
                let mut member_writes = Vec::new();
                let pp = self.compute_job(job, write, &layouts, src, &mut member_writes, entry.is_some());
                debug_assert!(entry.is_none() || pp.is_some(), "a job writing P has its partial parity");
                let request = entry.zip(pp).map(|((role, mut entry), pp)| {
                    entry.checksum = crate::ppl::ppl_checksum(pp.as_slice());
                    LogRequest { role, entry, pp, footprint, data_crcs }
                });
                computed.push((member_writes, request));
            }
            for wave in log_waves(computed) {
                let ticket = match wave.requests.is_empty() {
                    true => None,
                    false => Some(self.log_partial_parity(wave.requests, &mut expected).await?),
                };
                let runs = concat_runs(wave.writes);
                let results =
                    join_all(runs.into_iter().map(|w| async move {
                        (w.role, self.write_member(w.role, w.member_sector, w.buf, fua).await)
                    }))
                    .await;
                for (role, res) in results {
                    if let Err(e) = res {
                        self.member_failed(role, &e, "write").await;
                    }
                }
                // The member writes are done; with FUA they are durable.
                match ticket {
                    Some(t) if fua => self.retire_logs(&t.complete_durable()).await?,
                    _ => drop(ticket),
                }
            }
            self.check_survives("write")?;
            return self.clear_bad(&clears).await;
        }
        Err(RaidError::new(ErrorKind::Io, "write: members kept failing"))
    }

    /// For a job writing two or more data blocks: the CRC-32C of each one's new data, in
    /// block order (a degraded replay tells a write that landed whole by them: `ppl.rs`
    /// `DataChecksums`). None for one block (replay never needs them then).
    fn new_data_crcs(&self, job: &Job, write: &StripeWrite, src: WriteSource<'_>) -> Vec<u32> {
        if !crate::ppl::carries_data_crcs(job.written.count_ones().into()) {
            return Vec::new();
        }
        let len = (job.sectors() * SECTOR_BYTES) as usize;
        let zeros_crc = matches!(src, WriteSource::Zeros).then(|| crate::ppl::zeros_checksum(len));
        (0..write.blocks.len())
            .filter(|&k| job.written & (1 << k) != 0)
            .map(|k| match src {
                WriteSource::Data(data) => {
                    let bw = write.blocks[k].expect("written block");
                    let at = bw.req_offset_bytes + ((job.rows.0 - bw.rows.0) as u64 * SECTOR_BYTES) as usize;
                    crate::ppl::ppl_checksum(&data[at..at + len])
                }
                WriteSource::Zeros => zeros_crc.expect("zeros"),
            })
            .collect()
    }

    /// The (role, member sector, sectors) a job rewrites with right contents: its data
    /// blocks, and its parity unless it leaves parity alone.
    fn rewritten(&self, job: &Job, layout: &StripeLayout) -> Vec<(usize, u64, u64)> {
        let (dd, np) = (layout.data_roles.len(), self.parity_geometry().parity_disks());
        let parity = (job.mode != Mode::DataOnly).then_some(dd..dd + np).into_iter().flatten();
        (0..dd)
            .filter(|&k| job.written & (1 << k) != 0)
            .chain(parity)
            .map(|b| (block_role(layout, b), job.member_sector, job.sectors()))
            .collect()
    }

    /// With a journal: logs the jobs' pages a wave at a time, and writes each wave's member
    /// writes once its units (and all earlier ones) are durable. The log makes them durable,
    /// so the member writes need no FUA.
    async fn write_journaled(&self, jobs: Vec<JournaledJob<'_>>) -> Result<()> {
        let journal = self.journal.as_ref().expect("a journal");
        let max_pages = journal.max_wave_pages();
        let mut jobs = jobs.into_iter().peekable();
        while jobs.peek().is_some() {
            let mut wave: Vec<JournaledJob<'_>> = Vec::new();
            let mut pages = 0;
            while let Some(job) = jobs.peek() {
                // At most: its rows times its member writes (data and parity) and P and Q.
                let n = (job.sectors / crate::journal::JOURNAL_PAGE_SECTORS) as usize
                    * (job.writes.len() + self.parity_geometry().parity_disks());
                if !wave.is_empty() && pages + n > max_pages {
                    break;
                }
                pages += n;
                wave.push(jobs.next().expect("peeked"));
            }
            let ticket = {
                let rows: Vec<LoggedRow<'_>> = wave.iter().flat_map(|job| self.logged_rows(job)).collect();
                self.journal_log(&rows).await?
            };
            let runs = concat_runs(wave.into_iter().flat_map(|j| j.writes).collect());
            let results = join_all(
                runs.into_iter()
                    .map(|w| async move { (w.role, self.write_member(w.role, w.member_sector, w.buf, false).await) }),
            )
            .await;
            for (role, res) in results {
                if let Err(e) = res {
                    self.member_failed(role, &e, "write").await;
                }
            }
            drop(ticket); // the member writes are done
        }
        Ok(())
    }

    /// The journal rows (4 KiB stripe rows: data pages, then P and Q) of one job.
    fn logged_rows<'a>(&self, job: &'a JournaledJob<'_>) -> Vec<LoggedRow<'a>> {
        static ZERO_PAGE: [u8; crate::journal::JOURNAL_PAGE_BYTES] = [0; crate::journal::JOURNAL_PAGE_BYTES];
        const PAGE: usize = crate::journal::JOURNAL_PAGE_BYTES;
        let pg = self.parity_geometry();
        let (dd, chunk) = (pg.data_disks() as u64, u64::from(pg.chunk_sectors()));
        let seed = self.journal.as_ref().expect("a journal").seed();
        let stripe_start = pg.stripe_member_sector(job.stripe);
        let layout = job.layout;
        let mut writes: Vec<&MemberWrite> = job.writes.iter().collect();
        writes.sort_unstable_by_key(|w| w.role);
        let parity_roles: Vec<usize> = std::iter::once(layout.p_role).chain(layout.q_role).collect();
        (0..job.sectors / crate::journal::JOURNAL_PAGE_SECTORS)
            .map(|i| {
                let row = job.member_sector + i * crate::journal::JOURNAL_PAGE_SECTORS;
                let page_of = |w: &'a MemberWrite| &w.buf.as_slice()[i as usize * PAGE..(i as usize + 1) * PAGE];
                let mut payloads = Vec::new();
                let mut pages = Vec::new();
                for w in writes.iter().filter(|w| !parity_roles.contains(&w.role)) {
                    let k = layout.data_roles.iter().position(|&r| r == w.role).expect("a data role") as u64;
                    let page = page_of(w);
                    payloads.push(Payload::Data {
                        array_sector: job.stripe * dd * chunk + k * chunk + (row - stripe_start),
                        checksum: crc32c_le(seed, page),
                        flags: 0,
                    });
                    pages.push(page);
                }
                let mut checksums = Vec::new();
                for &p in &parity_roles {
                    // A parity member that is not written gets a page of zeros in the log
                    // (replay skips members that are not there).
                    let page = writes.iter().find(|w| w.role == p).map_or(&ZERO_PAGE[..], |w| page_of(w));
                    checksums.push(crc32c_le(seed, page));
                    pages.push(page);
                }
                payloads.push(Payload::Parity { member_sector: row, checksums, flags: 0 });
                LoggedRow { payloads, pages }
            })
            .collect()
    }

    /// The parity log entry of a job (without its checksum), when the job writes P to a
    /// writable member: md's PPL fields for the rows and data blocks it writes.
    fn log_entry(&self, job: &Job, stripe: u64, layout: &StripeLayout) -> Option<(usize, PplEntry)> {
        let pg = self.parity_geometry();
        let (dd, chunk) = (pg.data_disks(), u64::from(pg.chunk_sectors()));
        if !self.members.slots[layout.p_role].is_writable() || job.mode == Mode::DataOnly {
            return None;
        }
        let first = job.written.trailing_zeros() as u64;
        let count = u64::from(job.written.count_ones());
        debug_assert_eq!(job.written >> first, (1u64 << count) - 1, "written data blocks are consecutive");
        let rows = job.sectors();
        let full = count == dd as u64;
        let entry = PplEntry {
            data_sector: stripe * dd as u64 * chunk + first * chunk + u64::from(job.rows.0),
            pp_size: if full { 0 } else { (rows * SECTOR_BYTES) as u32 },
            data_size: (count * rows * SECTOR_BYTES) as u32,
            parity_disk: layout.p_role as u32,
            checksum: 0,
        };
        Some((layout.p_role, entry))
    }

    /// Chooses a mode and the reads for every written segment of every stripe, from the
    /// current member states.
    fn plan_jobs(&self, writes: &[StripeWrite], layouts: &[StripeLayout]) -> Result<Vec<Job>> {
        let pg = self.parity_geometry();
        let (dd, np) = (pg.data_disks(), pg.parity_disks());
        let mut jobs = Vec::new();
        for (i, w) in writes.iter().enumerate() {
            let layout = &layouts[i];
            let dead = (0..dd + np).filter(|&b| !self.members.slots[block_role(layout, b)].is_writable()).count();
            if dead > np {
                return Err(RaidError::new(
                    ErrorKind::ArrayFailed,
                    format!("write: {} has lost roles {:?}", pg.level(), self.failed_roles()),
                ));
            }
            let full_mask = (1u64 << dd) - 1;
            let max_rows = match (&self.parity_log, &self.journal) {
                (Some(_), _) => MAX_ENTRY_PP_BYTES as u64 / SECTOR_BYTES,
                (None, Some(j)) => j.max_job_rows(self.members.slots.len()),
                (None, None) => u64::MAX,
            };
            // Rows where a block starts or stops being bad cut segments too, so each
            // segment's blocks are uniformly readable.
            let stripe_sector = pg.stripe_member_sector(w.stripe);
            let bad_cuts = if self.any_bad() {
                self.bad_cuts(layout, stripe_sector, u64::from(pg.chunk_sectors()))
            } else {
                Vec::new()
            };
            let pieces = segments(&w.blocks).into_iter().flat_map(|seg| {
                // A partial-parity entry holds at most MAX_ENTRY_PP_BYTES: longer rows split.
                let step = if seg.written == full_mask && self.journal.is_none() { u64::MAX } else { max_rows };
                let (lo, hi) = (u64::from(seg.rows.0), u64::from(seg.rows.1));
                let mut bounds: Vec<u64> = (lo..hi).step_by(step.min(hi - lo).max(1) as usize).collect();
                bounds.extend(bad_cuts.iter().map(|&c| u64::from(c)).filter(|&c| lo < c && c < hi));
                bounds.sort_unstable();
                bounds.dedup();
                bounds.push(hi);
                bounds
                    .windows(2)
                    .map(|b| Segment { rows: (b[0] as u32, b[1] as u32), written: seg.written })
                    .collect::<Vec<_>>()
            });
            for seg in pieces {
                let member_sector = pg.stripe_member_sector(w.stripe) + u64::from(seg.rows.0);
                let sectors = u64::from(seg.rows.1 - seg.rows.0);
                let readable = |b: usize| self.members.slots[block_role(layout, b)].is_readable(member_sector, sectors);
                let written = |k: usize| seg.written & (1 << k) != 0;
                let unreadable_data = (0..dd).filter(|&k| !readable(k)).fold(0u64, |m, k| m | 1 << k);
                let readable_parity: Vec<usize> = (dd..dd + np).filter(|&b| readable(b)).collect();
                // Parity on a writable member must be recomputed from all data when it was not
                // resynced since an unclean stop (as md), or when it is being rebuilt here: that
                // stripe may already be rebuilt, and must get the new parity.
                let writable = |b: usize| self.members.slots[block_role(layout, b)].is_writable();
                let recompute_parity = (dd..dd + np).any(writable)
                    && ((dd..dd + np).any(|b| writable(b) && !readable(b)) || !self.stripe_synced(w.stripe));
                let mut mode = choose_mode(dd, seg.written, unreadable_data, readable_parity.len(), recompute_parity);
                let mut reads: Vec<usize> = match mode {
                    Mode::Full | Mode::DataOnly => Vec::new(),
                    Mode::ReadModifyWrite if readable_parity.is_empty() => Vec::new(),
                    Mode::ReadModifyWrite => (0..dd).filter(|&k| written(k)).chain(readable_parity).collect(),
                    Mode::ReconstructWrite => (0..dd).filter(|&k| !written(k)).collect(),
                    Mode::Degraded => (0..dd + np).filter(|&b| readable(b)).collect(),
                };
                let parity_bad = (dd..dd + np)
                    .all(|b| !writable(b) || self.members.slots[block_role(layout, b)].all_bad(member_sector, sectors));
                if mode == Mode::Degraded && dd + np - reads.len() > np && parity_bad && self.journal.is_none() {
                    mode = Mode::DataOnly;
                    reads.clear();
                }
                if mode == Mode::Degraded && dd + np - reads.len() > np {
                    return Err(RaidError::new(
                        ErrorKind::Io,
                        format!(
                            "write: stripe {} cannot be rebuilt (failed roles {:?})",
                            w.stripe,
                            self.failed_roles()
                        ),
                    ));
                }
                jobs.push(Job {
                    write: i,
                    member_sector,
                    rows: seg.rows,
                    written: seg.written,
                    mode,
                    reads,
                    blocks: (0..dd + np).map(|_| None).collect(),
                });
            }
        }
        Ok(jobs)
    }

    /// Computes the new blocks of one job and queues the member writes. With `want_pp`,
    /// returns the job's partial parity (XOR of the data blocks it does not write) when it
    /// writes P.
    fn compute_job(
        &self,
        mut job: Job,
        write: &StripeWrite,
        layouts: &[StripeLayout],
        src: WriteSource<'_>,
        out: &mut Vec<MemberWrite>,
        want_pp: bool,
    ) -> Option<AlignedBuf> {
        let layout = &layouts[job.write];
        let np = self.parity_geometry().parity_disks();
        let dd = layout.data_roles.len();
        let len = (job.sectors() * SECTOR_BYTES) as usize;
        let kinds = block_kinds(layout, np);
        let written = |k: usize| job.written & (1 << k) != 0;
        let new_data = |k: usize| match src {
            WriteSource::Data(data) => {
                let bw = write.blocks[k].expect("written block");
                let at = bw.req_offset_bytes + ((job.rows.0 - bw.rows.0) as u64 * SECTOR_BYTES) as usize;
                AlignedBuf::from_slice(&data[at..at + len])
            }
            WriteSource::Zeros => AlignedBuf::zeroed(len),
        };
        let queue = |b: usize, buf: AlignedBuf, out: &mut Vec<MemberWrite>| {
            let role = block_role(layout, b);
            if self.members.slots[role].is_writable() {
                out.push(MemberWrite { role, member_sector: job.member_sector, buf });
            }
        };
        if job.mode == Mode::ReadModifyWrite {
            let parity_read: Vec<usize> = (dd..dd + np).filter(|&b| job.blocks[b].is_some()).collect();
            // Partial parity = new P XOR the new data.
            let mut new_xor = (want_pp && job.blocks[dd].is_some()).then(|| AlignedBuf::zeroed(len));
            for k in (0..dd).filter(|&k| written(k)) {
                let new = new_data(k);
                if let Some(x) = new_xor.as_mut() {
                    parity::xor_into(x.as_mut_slice(), new.as_slice());
                }
                if !parity_read.is_empty() {
                    let old = job.blocks[k].take().expect("old data was read");
                    let BlockKind::Data { exponent } = kinds[k] else { unreachable!("data kind") };
                    let (data_and_p, q) = job.blocks.split_at_mut(dd + 1);
                    let q = q.first_mut().and_then(Option::as_mut).map(AlignedBuf::as_mut_slice);
                    match data_and_p[dd].as_mut() {
                        // One pass over old, new, P and Q; no delta buffer.
                        Some(p) => parity::update_parity(p.as_mut_slice(), q, old.as_slice(), new.as_slice(), exponent),
                        None => {
                            // Only Q was read (P is lost).
                            let mut delta = old;
                            parity::xor_into(delta.as_mut_slice(), new.as_slice());
                            parity::mul_exp_xor_into(q.expect("Q was read"), delta.as_slice(), exponent);
                        }
                    }
                }
                queue(k, new, out);
            }
            let pp = new_xor.map(|mut x| {
                parity::xor_into(x.as_mut_slice(), job.blocks[dd].as_ref().expect("P was read").as_slice());
                x
            });
            for b in parity_read {
                queue(b, job.blocks[b].take().expect("parity was read"), out);
            }
            return pp;
        }
        if job.mode == Mode::DataOnly {
            for k in (0..dd).filter(|&k| written(k)) {
                queue(k, new_data(k), out);
            }
            return None;
        }
        if job.mode == Mode::Degraded {
            let missing: Vec<usize> = (0..dd + np).filter(|&b| job.blocks[b].is_none()).collect();
            for &b in &missing {
                job.blocks[b] = Some(AlignedBuf::for_overwrite(len)); // reconstruct ignores their contents
            }
            let mut slices: Vec<&mut [u8]> =
                job.blocks.iter_mut().map(|b| b.as_mut().expect("filled").as_mut_slice()).collect();
            assert!(parity::reconstruct(&mut slices, &kinds, &missing), "planned within redundancy");
        }
        for k in (0..dd).filter(|&k| written(k)) {
            job.blocks[k] = Some(new_data(k));
        }
        for b in dd..dd + np {
            job.blocks[b] = Some(AlignedBuf::for_overwrite(len)); // compute_parity stores P and Q
        }
        {
            let mut slices: Vec<&mut [u8]> =
                job.blocks.iter_mut().map(|b| b.as_mut().expect("every block present").as_mut_slice()).collect();
            parity::compute_parity(&mut slices, &kinds);
        }
        let pp = want_pp.then(|| {
            let unwritten: Vec<usize> = (0..dd).filter(|&k| !written(k)).collect();
            let mut pp = AlignedBuf::zeroed(if unwritten.is_empty() { 0 } else { len });
            for k in unwritten {
                parity::xor_into(pp.as_mut_slice(), job.blocks[k].as_ref().expect("computed").as_slice());
            }
            pp
        });
        for b in (0..dd).filter(|&k| written(k)).chain(dd..dd + np) {
            queue(b, job.blocks[b].take().expect("computed"), out);
        }
        pp
    }

    /// Zeroes `[start, start + sectors)`: whole stripes on every member (so parity, zero
    /// for zero data, stays right), partial stripes by writing zeros unless `trim_only`.
    pub(super) async fn zero_striped(&self, start: u64, sectors: u64, deallocate: bool, trim_only: bool) -> Result<()> {
        let pg = self.parity_geometry();
        let stripe_sectors = pg.stripe_data_sectors();
        let end = start + sectors;
        let first_full = start.div_ceil(stripe_sectors);
        let end_full = end / stripe_sectors;
        let zero_partial = |from: u64, to: u64| async move {
            let mut at = from;
            while at < to {
                let n = (to - at).min(MAX_IO_BYTES as u64 / SECTOR_BYTES);
                self.write_striped(at, n, WriteSource::Zeros, false).await?;
                at += n;
            }
            Ok::<(), RaidError>(())
        };
        if self.journal.is_some() {
            // Zeros go through the journal like any write (a discard not logged could be
            // undone by the replay of an older unit).
            return zero_partial(start, end).await;
        }
        if first_full >= end_full {
            return if trim_only { Ok(()) } else { zero_partial(start, end).await };
        }
        if !trim_only {
            zero_partial(start, first_full * stripe_sectors).await?;
            zero_partial(end_full * stripe_sectors, end).await?;
        }
        let chunk = u64::from(pg.chunk_sectors());
        let mut stripe = first_full;
        while stripe < end_full {
            let n = match &self.parity_log {
                None => (end_full - stripe).min(ZERO_BATCH_STRIPES),
                Some(_) => self.logged_zero_batch(stripe, end_full),
            };
            let _guards = self.locks.lock_all(stripe..stripe + n).await;
            let _intent = self.intent_begin(stripe * chunk..(stripe + n) * chunk).await?;
            // With a parity log, whole stripes being zeroed are logged as full-stripe writes
            // (parity is recomputed at a replay, whatever part of the zeroing landed).
            let _ticket = match &self.parity_log {
                Some(_) => Some(self.log_partial_parity(self.zero_log_requests(stripe, n), &mut None).await?),
                None => None,
            };
            let roles: Vec<usize> =
                (0..self.members.slots.len()).filter(|&r| self.members.slots[r].is_writable()).collect();
            let results =
                join_all(roles.iter().map(|&r| self.zero_member(r, stripe * chunk, n * chunk, deallocate))).await;
            for (&role, res) in roles.iter().zip(results) {
                if let Err(e) = res {
                    self.member_failed(role, &e, "zero").await;
                }
            }
            self.check_survives("zero")?;
            stripe += n;
        }
        Ok(())
    }
}

impl<M: Member + ?Sized> Array<M> {
    /// How many whole stripes from `stripe` one logged zeroing takes: at most
    /// [`MAX_WAVE_ENTRIES`] per parity member (a layout may put every parity on one).
    fn logged_zero_batch(&self, stripe: u64, end: u64) -> u64 {
        let pg = self.parity_geometry();
        let mut per_role = vec![0usize; self.members.slots.len()];
        let mut n = 0;
        while stripe + n < end {
            let p = pg.stripe(stripe + n).p_role;
            if per_role[p] == MAX_WAVE_ENTRIES {
                break;
            }
            per_role[p] += 1;
            n += 1;
        }
        n
    }

    /// Full-stripe entries (no partial parity) for zeroing `n` whole stripes from `stripe`.
    fn zero_log_requests(&self, stripe: u64, n: u64) -> Vec<LogRequest> {
        let pg = self.parity_geometry();
        let (dd, chunk) = (pg.data_disks() as u64, u64::from(pg.chunk_sectors()));
        let zeros_crc = crate::ppl::zeros_checksum((chunk * SECTOR_BYTES) as usize);
        (stripe..stripe + n)
            .filter_map(|s| {
                let p = pg.stripe(s).p_role;
                self.members.slots[p].is_writable().then(|| LogRequest {
                    role: p,
                    entry: PplEntry {
                        data_sector: s * dd * chunk,
                        pp_size: 0,
                        data_size: (dd * chunk * SECTOR_BYTES) as u32,
                        parity_disk: p as u32,
                        checksum: 0,
                    },
                    pp: AlignedBuf::zeroed(0),
                    footprint: Footprint { stripe: s, written: (1u64 << dd) - 1, rows: (0, chunk as u32) },
                    data_crcs: match crate::ppl::carries_data_crcs(dd) {
                        true => vec![zeros_crc; dd as usize],
                        false => Vec::new(),
                    },
                })
            })
            .collect()
    }
}

/// One computed job of a journaled write: its stripe, rows and member writes.
struct JournaledJob<'a> {
    stripe: u64,
    layout: &'a StripeLayout,
    member_sector: u64,
    sectors: u64,
    writes: Vec<MemberWrite>,
}

/// Merges writes that are contiguous on one member into one buffer each.
fn concat_runs(mut writes: Vec<MemberWrite>) -> Vec<MemberWrite> {
    /// Adjacent writes to one member, joined.
    struct Run {
        role: usize,
        member_sector: u64,
        len_bytes: usize,
        bufs: Vec<AlignedBuf>,
    }
    writes.sort_unstable_by_key(|w| (w.role, w.member_sector));
    let mut out: Vec<Run> = Vec::new();
    for w in writes {
        if let Some(last) = out.last_mut() {
            let end = last.member_sector + last.len_bytes as u64 / SECTOR_BYTES;
            if last.role == w.role && end == w.member_sector && last.len_bytes + w.buf.len() <= MAX_IO_BYTES {
                last.len_bytes += w.buf.len();
                last.bufs.push(w.buf);
                continue;
            }
            debug_assert!(last.role != w.role || end <= w.member_sector, "overlapping member writes");
        }
        out.push(Run { role: w.role, member_sector: w.member_sector, len_bytes: w.buf.len(), bufs: vec![w.buf] });
    }
    out.into_iter()
        .map(|mut run| {
            if run.bufs.len() == 1 {
                let buf = run.bufs.pop().expect("one buffer");
                return MemberWrite { role: run.role, member_sector: run.member_sector, buf };
            }
            let mut joined = AlignedBuf::for_overwrite(run.len_bytes);
            let mut at = 0;
            for b in &run.bufs {
                joined.as_mut_slice()[at..at + b.len()].copy_from_slice(b.as_slice());
                at += b.len();
            }
            MemberWrite { role: run.role, member_sector: run.member_sector, buf: joined }
        })
        .collect()
}

/// Member writes that may go once their entries are durable.
struct Wave {
    requests: Vec<LogRequest>,
    writes: Vec<MemberWrite>,
}

/// Groups jobs, in order, into waves whose entries fit one log write per log (a write larger
/// than that logs and writes its stripes a wave at a time).
fn log_waves(jobs: Vec<(Vec<MemberWrite>, Option<LogRequest>)>) -> Vec<Wave> {
    let mut waves: Vec<Wave> = Vec::new();
    // Per role in the current wave: (entries, partial parity bytes).
    let mut used: std::collections::HashMap<usize, (usize, usize)> = Default::default();
    for (writes, request) in jobs {
        let fits = request.as_ref().is_none_or(|r| {
            let (n, bytes) = used.get(&r.role).copied().unwrap_or((0, 0));
            n < MAX_WAVE_ENTRIES && bytes + r.pp.len() <= MAX_WAVE_PP_BYTES
        });
        if waves.is_empty() || !fits {
            waves.push(Wave { requests: Vec::new(), writes: Vec::new() });
            used.clear();
        }
        let wave = waves.last_mut().expect("a wave");
        if let Some(r) = request {
            let u = used.entry(r.role).or_insert((0, 0));
            *u = (u.0 + 1, u.1 + r.pp.len());
            wave.requests.push(r);
        }
        wave.writes.extend(writes);
    }
    waves
}
