//! The write journal (md's raid5-cache in write-through mode, raid4/5/6): what closes the
//! write hole where md's PPL cannot (raid4, raid6).
//!
//! Before the member writes of a stripe start, the new data pages and the new parity pages
//! (P, and Q) go, FUA, into a ring on the journal device, in md's format ([`crate::journal`]).
//! After a crash, replay from the ring's tail rewrites every logged stripe from its pages, so
//! every stripe holds the data of a whole logged write (or an older one) with matching parity,
//! whatever part of its member writes landed, and a member lost afterwards is rebuilt right.
//!
//! Contract:
//! - The log works in 4 KiB pages: writes are widened to whole pages first (`stripe.rs`
//!   reads the rest of a partly written page under the stripe lock).
//! - Units are numbered in ring order; a unit's member writes start only when it and every
//!   earlier unit are durable, so replay (which stops at the first unit that is not whole)
//!   never leaves behind a stripe whose member writes started.
//! - The tail (the superblock's `journal_tail`) moves only to the start of a unit whose
//!   member writes, and those of every earlier unit, completed before a member flush that
//!   then completed; replaying from there again is harmless (pages are idempotent).
//! - Bounded: a wave of a write logs at most [`MAX_WAVE_PAGES`] pages (a quarter of a small
//!   ring); a unit holds at most [`MAX_UNIT_PAGES`]. A writer waits for room only before
//!   its units exist, so waits for room cannot block a unit that is already in the ring.
//! - A failed journal write makes the array read-only (as md does): a write that cannot be
//!   logged is never written to the members.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use event_listener::{Event, listener};

use super::{Array, Device, StateChange};
use crate::SECTOR_BYTES;
use crate::buf::AlignedBuf;
use crate::error::{ErrorKind, RaidError, Result};
use crate::journal::{
    JOURNAL_PAGE_BYTES, JOURNAL_PAGE_SECTORS, META_HEADER_BYTES, MetaBlock, Payload, RECOVERY_SEQ_STEP, crc32c_le,
};
use crate::member::Member;

/// Pages one unit carries at most (1 MiB), besides its meta block.
pub(crate) const MAX_UNIT_PAGES: usize = 256;
/// Pages one wave of a write logs at most (4 MiB).
pub(crate) const MAX_WAVE_PAGES: usize = 1024;
/// The smallest ring raidnbd runs a journal on.
pub const MIN_JOURNAL_BYTES: u64 = 256 << 10;
/// Member sectors (rows) of one job at most: 128 KiB of a chunk per member (fewer on a
/// small ring: a job fits in one wave).
const MAX_JOB_ROWS: u64 = 256;

/// Where the ring is and where replay starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalConfig {
    /// Byte offset of the ring on the journal device (md: its data offset).
    pub area_offset_bytes: u64,
    /// Ring size, a multiple of 4 KiB (md: data_size rounded down).
    pub area_sectors: u64,
    /// md: `crc32c_le(~0, uuid)`.
    pub seed: u32,
    /// The superblock's `journal_tail`: sectors from the ring's start.
    pub tail_sectors: u64,
}

/// What the start found and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JournalReport {
    /// No valid unit at the tail: a new log was started (md does the same).
    pub created: bool,
    /// Whole units replayed.
    pub units: u64,
    /// Stripes (4 KiB rows) rewritten from their pages.
    pub stripes: u64,
    /// Stripes with data but no parity in a unit (md's data-only stripes, from its
    /// write-back mode: the start fails rather than lose them).
    pub data_only_stripes: u64,
    /// Pages not written because their member is missing.
    pub pages_skipped: u64,
    /// Payloads no writer makes (outside the array, wrong parity sector): replay stopped there.
    pub invalid: u64,
}

/// Counters for status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JournalStats {
    pub units_written: u64,
    pub pages_logged: u64,
    /// Tail moves (each after a member flush and a superblock write).
    pub reclaims: u64,
    /// Writers that waited for room.
    pub waits_for_room: u64,
    pub ring_sectors: u64,
    pub used_sectors: u64,
}

/// A unit in the ring after the tail.
#[derive(Debug)]
struct Unit {
    seq: u64,
    position: u64,
    durable: bool,
    /// Its member writes completed.
    done: bool,
}

#[derive(Debug)]
struct State {
    /// Where the next unit goes, and its seq.
    head: u64,
    next_seq: u64,
    /// Replay starts here (the persisted `journal_tail`).
    tail: u64,
    units: VecDeque<Unit>,
    failed: bool,
}

pub(super) struct Journal<M: ?Sized> {
    pub(super) device: Device<M>,
    config: JournalConfig,
    state: Mutex<State>,
    /// A unit became durable or done, the tail moved, or the journal failed.
    changed: Event,
    reclaiming: AtomicBool,
    units_written: AtomicU64,
    pages_logged: AtomicU64,
    reclaims: AtomicU64,
    waits_for_room: AtomicU64,
}

/// One 4 KiB stripe row of a write, as it goes into the log.
pub(super) struct LoggedRow<'a> {
    pub(super) payloads: Vec<Payload>,
    pub(super) pages: Vec<&'a [u8]>,
}

/// A wave's units are in the ring and durable; dropping it (after the member writes) marks
/// them done.
pub(super) struct JournalTicket<'a, M: ?Sized> {
    journal: &'a Journal<M>,
    seqs: std::ops::Range<u64>,
}

impl<M: ?Sized> Drop for JournalTicket<'_, M> {
    fn drop(&mut self) {
        let mut st = self.journal.lock();
        let mut lost = false;
        for u in st.units.iter_mut().filter(|u| self.seqs.contains(&u.seq)) {
            u.done = true;
            lost |= !u.durable;
        }
        if lost {
            // A writer dropped between reserving its units and writing them: later units
            // would wait for them forever, and the tail must not move onto them.
            st.failed = true;
        }
        drop(st);
        self.journal.changed.notify(usize::MAX);
    }
}

impl<M: ?Sized> Journal<M> {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("journal lock")
    }

    fn ring(&self) -> u64 {
        self.config.area_sectors
    }

    fn used(st: &State, ring: u64) -> u64 {
        let d = (st.head + ring - st.tail) % ring;
        if d == 0 && !st.units.is_empty() { ring } else { d }
    }

    /// Rows (member sectors, whole pages) of one job, so that its pages, at most one per
    /// device and row and twice parity, fit in one wave.
    pub(super) fn max_job_rows(&self, devices: usize) -> u64 {
        let page_rows = (self.max_wave_pages() / (2 * devices + 2)).max(1) as u64;
        (page_rows * JOURNAL_PAGE_SECTORS).min(MAX_JOB_ROWS)
    }

    pub(super) fn seed(&self) -> u32 {
        self.config.seed
    }

    /// Pages a wave may log on this ring.
    pub(super) fn max_wave_pages(&self) -> usize {
        MAX_WAVE_PAGES.min((self.ring() / JOURNAL_PAGE_SECTORS / 4) as usize)
    }

    pub(super) fn stats(&self) -> JournalStats {
        let st = self.lock();
        JournalStats {
            units_written: self.units_written.load(Ordering::Relaxed),
            pages_logged: self.pages_logged.load(Ordering::Relaxed),
            reclaims: self.reclaims.load(Ordering::Relaxed),
            waits_for_room: self.waits_for_room.load(Ordering::Relaxed),
            ring_sectors: self.ring(),
            used_sectors: Self::used(&st, self.ring()),
        }
    }

    pub(super) fn check_not_failed(&self) -> Result<()> {
        if self.lock().failed { Err(Self::failed_error()) } else { Ok(()) }
    }

    fn failed_error() -> RaidError {
        RaidError::new(ErrorKind::Refused, "the write journal failed: the array is read-only")
    }
}

/// Packs rows into units (meta block room, [`MAX_UNIT_PAGES`]).
fn pack_units<'r, 'a>(rows: &'r [LoggedRow<'a>]) -> Vec<&'r [LoggedRow<'a>]> {
    let mut units = Vec::new();
    let (mut start, mut meta, mut pages) = (0, META_HEADER_BYTES, 0);
    for (i, row) in rows.iter().enumerate() {
        let m: usize = row.payloads.iter().map(Payload::encoded_bytes).sum();
        if i > start && (meta + m > JOURNAL_PAGE_BYTES || pages + row.pages.len() > MAX_UNIT_PAGES) {
            units.push(&rows[start..i]);
            (start, meta, pages) = (i, META_HEADER_BYTES, 0);
        }
        meta += m;
        pages += row.pages.len();
    }
    if start < rows.len() {
        units.push(&rows[start..]);
    }
    units
}

impl<M: Member + ?Sized> Array<M> {
    /// Adds the journal (raid4/5/6; md's `--write-journal`). The device is written to by the
    /// journal only, besides its superblock.
    pub fn with_journal(mut self, device: Device<M>, config: JournalConfig) -> Result<Self> {
        let bad = |why: String| RaidError::new(ErrorKind::CannotAssemble, format!("write journal: {why}"));
        if self.geometry.parity().is_none() {
            return Err(bad(format!("{} has no parity", self.geometry.level())));
        }
        if self.parity_log.is_some() {
            return Err(bad("the array has a partial parity log too".into()));
        }
        let ring_bytes = config.area_sectors * SECTOR_BYTES;
        if ring_bytes < MIN_JOURNAL_BYTES || !config.area_sectors.is_multiple_of(JOURNAL_PAGE_SECTORS) {
            return Err(bad(format!("a ring of {ring_bytes} bytes is too small (at least {MIN_JOURNAL_BYTES})")));
        }
        if device.member.len_bytes() < config.area_offset_bytes + ring_bytes {
            return Err(bad(format!("{} is smaller than its ring", device.member.name())));
        }
        if config.tail_sectors >= config.area_sectors || !config.tail_sectors.is_multiple_of(JOURNAL_PAGE_SECTORS) {
            return Err(bad(format!("tail at sector {} is outside the ring", config.tail_sectors)));
        }
        let wave_pages = MAX_WAVE_PAGES.min((config.area_sectors / JOURNAL_PAGE_SECTORS / 4) as usize) as u64;
        if wave_pages < 2 * self.members.slots.len() as u64 + 2 {
            return Err(bad("the ring is too small for one stripe row per wave".into()));
        }
        self.members.next_device_id.fetch_max(device.id + 1, Ordering::AcqRel);
        self.journal = Some(Journal {
            device,
            config,
            state: Mutex::new(State {
                head: config.tail_sectors,
                next_seq: 0,
                tail: config.tail_sectors,
                units: VecDeque::new(),
                failed: false,
            }),
            changed: Event::new(),
            reclaiming: AtomicBool::new(false),
            units_written: AtomicU64::new(0),
            pages_logged: AtomicU64::new(0),
            reclaims: AtomicU64::new(0),
            waits_for_room: AtomicU64::new(0),
        });
        Ok(self)
    }

    pub fn journal_stats(&self) -> Option<JournalStats> {
        self.journal.as_ref().map(Journal::stats)
    }

    /// The journal device, for superblock writes.
    pub(super) fn journal_device(&self, id: usize) -> Option<Device<M>> {
        self.journal.as_ref().filter(|j| j.device.id == id).map(|j| j.device.clone())
    }

    /// The journal failed: refuse writes from now on (md makes the array read-only).
    pub(super) fn journal_failed(&self, e: &std::io::Error, what: &str) {
        let Some(j) = &self.journal else { return };
        tracing::error!(device = j.device.member.name(), error = %e, "write journal {what} failed: the array is read-only now");
        j.lock().failed = true;
        self.set_read_only(true);
        j.changed.notify(usize::MAX);
    }

    /// Logs `rows` (one wave) and waits until they and every earlier unit are durable.
    pub(super) async fn journal_log(&self, rows: &[LoggedRow<'_>]) -> Result<JournalTicket<'_, M>> {
        let j = self.journal.as_ref().expect("journal_log needs a journal");
        let units = pack_units(rows);
        let sectors: u64 = units
            .iter()
            .map(|u| (1 + u.iter().map(|r| r.pages.len() as u64).sum::<u64>()) * JOURNAL_PAGE_SECTORS)
            .sum();
        // A wave fits a quarter of the ring (plus its meta blocks), so room always comes.
        assert!(sectors < j.ring() / 2, "a wave of {sectors} sectors on a ring of {}", j.ring());
        // Reserve room (units are placed and numbered in ring order).
        let (first_seq, mut position) = loop {
            {
                let mut st = j.lock();
                if st.failed {
                    return Err(Journal::<M>::failed_error());
                }
                let ring = j.ring();
                if Journal::<M>::used(&st, ring) + sectors < ring {
                    let first = st.next_seq;
                    let at = st.head;
                    let mut pos = at;
                    for (i, u) in units.iter().enumerate() {
                        st.units.push_back(Unit { seq: first + i as u64, position: pos, durable: false, done: false });
                        pos = (pos + (1 + u.iter().map(|r| r.pages.len() as u64).sum::<u64>()) * JOURNAL_PAGE_SECTORS)
                            % ring;
                    }
                    st.head = pos;
                    st.next_seq = first + units.len() as u64;
                    break (first, at);
                }
            }
            j.waits_for_room.fetch_add(1, Ordering::Relaxed);
            self.journal_reclaim(true).await?;
        };
        let seqs = first_seq..first_seq + units.len() as u64;
        let ticket = JournalTicket { journal: j, seqs: seqs.clone() };
        // Write every unit (FUA), concurrently.
        let mut writes = Vec::with_capacity(units.len());
        for (i, unit) in units.iter().enumerate() {
            let seq = first_seq + i as u64;
            let mut payloads = Vec::new();
            let mut pages: Vec<&[u8]> = Vec::new();
            for row in unit.iter() {
                payloads.extend(row.payloads.iter().cloned());
                pages.extend(row.pages.iter().copied());
            }
            let mb = MetaBlock { seq, position, payloads };
            let mut image = AlignedBuf::for_overwrite((1 + pages.len()) * JOURNAL_PAGE_BYTES);
            image.as_mut_slice()[..JOURNAL_PAGE_BYTES].copy_from_slice(&mb.encode(j.config.seed));
            for (k, p) in pages.iter().enumerate() {
                image.as_mut_slice()[(k + 1) * JOURNAL_PAGE_BYTES..(k + 2) * JOURNAL_PAGE_BYTES].copy_from_slice(p);
            }
            j.pages_logged.fetch_add(pages.len() as u64, Ordering::Relaxed);
            writes.push((seq, position, image));
            position = (position + mb.unit_sectors()) % j.ring();
        }
        let results = futures::future::join_all(
            writes
                .into_iter()
                .map(|(seq, position, image)| async move { (seq, self.journal_write_ring(position, image).await) }),
        )
        .await;
        for (seq, res) in results {
            if let Err(e) = res {
                self.journal_failed(&e, "write");
                return Err(RaidError::io("write journal", e));
            }
            j.units_written.fetch_add(1, Ordering::Relaxed);
            let mut st = j.lock();
            if let Some(u) = st.units.iter_mut().find(|u| u.seq == seq) {
                u.durable = true;
            }
        }
        j.changed.notify(usize::MAX);
        // Ordered: wait until every earlier unit is durable too.
        loop {
            listener!(j.changed => changed);
            {
                let st = j.lock();
                if st.failed {
                    return Err(Journal::<M>::failed_error());
                }
                if st.units.iter().take_while(|u| u.seq < seqs.end).all(|u| u.durable) {
                    break;
                }
            }
            changed.await;
        }
        // Past three quarters of the ring: move the tail now, before writers must wait.
        let over = {
            let st = j.lock();
            Journal::<M>::used(&st, j.ring()) > j.ring() / 4 * 3
        };
        if over {
            self.journal_reclaim(false).await?;
        }
        Ok(ticket)
    }

    /// Writes `image` at ring sector `position`, FUA (split where the ring wraps).
    async fn journal_write_ring(&self, position: u64, image: AlignedBuf) -> std::io::Result<()> {
        let j = self.journal.as_ref().expect("journal");
        let base = j.device.data_offset_bytes;
        let first = ((j.ring() - position) * SECTOR_BYTES).min(image.len() as u64) as usize;
        if first == image.len() {
            return j.device.member.write_at(base + position * SECTOR_BYTES, image, true).await.0;
        }
        let head = AlignedBuf::from_slice(&image.as_slice()[..first]);
        let rest = AlignedBuf::from_slice(&image.as_slice()[first..]);
        let (a, b) = futures::join!(
            j.device.member.write_at(base + position * SECTOR_BYTES, head, true),
            j.device.member.write_at(base, rest, true)
        );
        a.0.and(b.0)
    }

    /// Reads `len` bytes at ring sector `position` (wrapping).
    async fn journal_read_ring(&self, position: u64, len: usize) -> std::io::Result<AlignedBuf> {
        let j = self.journal.as_ref().expect("journal");
        let base = j.device.data_offset_bytes;
        let first = ((j.ring() - position) * SECTOR_BYTES).min(len as u64) as usize;
        let (res, buf) = j.device.member.read_at(base + position * SECTOR_BYTES, AlignedBuf::zeroed(first)).await;
        res?;
        if first == len {
            return Ok(buf);
        }
        let (res, rest) = j.device.member.read_at(base, AlignedBuf::zeroed(len - first)).await;
        res?;
        let mut joined = AlignedBuf::zeroed(len);
        joined.as_mut_slice()[..first].copy_from_slice(buf.as_slice());
        joined.as_mut_slice()[first..].copy_from_slice(rest.as_slice());
        Ok(joined)
    }

    /// Moves the tail as far as completed units allow: member flush, then `journal_tail` in
    /// the superblocks. With `need_room`, waits for units to complete when none has, and
    /// returns once the ring has changed.
    pub(super) async fn journal_reclaim(&self, need_room: bool) -> Result<()> {
        let j = self.journal.as_ref().expect("journal");
        loop {
            listener!(j.changed => changed);
            if j.lock().failed {
                return Err(Journal::<M>::failed_error());
            }
            if j.reclaiming.swap(true, Ordering::AcqRel) {
                if !need_room {
                    return Ok(()); // another writer is at it
                }
                changed.await;
                return Ok(());
            }
            let candidate = {
                let mut st = j.lock();
                let done = st.units.iter().take_while(|u| u.done).count();
                if done > 0 && st.units[done - 1].position == st.tail {
                    st.units.drain(..done); // the tail unit itself: nothing to move
                }
                let done = st.units.iter().take_while(|u| u.done).count();
                (done > 0).then(|| (done, st.units[done - 1].position))
            };
            let Some((done, position)) = candidate else {
                j.reclaiming.store(false, Ordering::Release);
                if !need_room {
                    return Ok(());
                }
                changed.await; // a unit in flight completes
                continue;
            };
            let result = self.journal_move_tail(done, position).await;
            j.reclaiming.store(false, Ordering::Release);
            j.changed.notify(usize::MAX);
            return result;
        }
    }

    /// Flushes the members, records the tail at `position` (the start of the last of the
    /// first `done` units), and frees the units before it.
    async fn journal_move_tail(&self, done: usize, position: u64) -> Result<()> {
        let j = self.journal.as_ref().expect("journal");
        self.flush().await?;
        {
            let _g = self.locks.lock(super::META_LOCK_KEY).await;
            self.try_persist_locked(StateChange::JournalTail { sectors: position }).await?;
        }
        let mut st = j.lock();
        st.tail = position;
        st.units.drain(..done);
        j.reclaims.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// At start (unless read-only): replays the ring from the tail, then writes an empty
    /// meta block where the log ended, flushes and records it as the new tail, as md does.
    /// Every logged write is then on the members, so nothing needs a resync.
    pub async fn start_journal(&self) -> Result<JournalReport> {
        self.walk_journal(true).await
    }

    /// What a start would replay, writing nothing (for read-only starts).
    pub async fn scan_journal(&self) -> Result<JournalReport> {
        self.walk_journal(false).await
    }

    async fn walk_journal(&self, replay: bool) -> Result<JournalReport> {
        let Some(j) = &self.journal else { return Ok(JournalReport::default()) };
        let mut report = JournalReport::default();
        let ring = j.ring();
        let io = |e: std::io::Error| RaidError::io(format!("{}: write journal", j.device.member.name()), e);
        let tail = j.config.tail_sectors;
        let first = self.journal_read_ring(tail, JOURNAL_PAGE_BYTES).await.map_err(io)?;
        let (mut position, mut seq) = match MetaBlock::decode(first.as_slice(), j.config.seed) {
            Ok(mb) if mb.position == tail => (tail, mb.seq),
            other => {
                tracing::info!(tail, found = ?other.err(), "no valid journal unit at the tail: starting a new log");
                report.created = true;
                (0, random_seq())
            }
        };
        if report.created && !replay {
            return Ok(report);
        }
        if !report.created {
            // Whole units, in seq order, until one is not (at most a ring's worth).
            for _ in 0..ring / JOURNAL_PAGE_SECTORS {
                let meta = self.journal_read_ring(position, JOURNAL_PAGE_BYTES).await.map_err(io)?;
                let Ok(mb) = MetaBlock::decode(meta.as_slice(), j.config.seed) else { break };
                if mb.seq != seq || mb.position != position || mb.unit_sectors() >= ring {
                    break;
                }
                let pages_at = (position + JOURNAL_PAGE_SECTORS) % ring;
                let pages = self.journal_read_ring(pages_at, mb.pages() * JOURNAL_PAGE_BYTES).await.map_err(io)?;
                if !self.journal_unit_whole(&mb, pages.as_slice()) {
                    break;
                }
                if !self.journal_replay_unit(&mb, pages.as_slice(), replay, &mut report).await? {
                    break;
                }
                report.units += 1;
                position = (position + mb.unit_sectors()) % ring;
                seq += 1;
            }
            if !replay {
                return Ok(report);
            }
            if report.data_only_stripes > 0 {
                // Only md's write-back mode leaves those: their data is acknowledged and
                // lives only in the log. raidnbd does not rebuild them; md does.
                return Err(RaidError::new(
                    ErrorKind::CannotAssemble,
                    format!(
                        "the write journal holds {} stripes of data without parity (md's write-back mode): assemble \
                         the array with mdadm once to write them to the members",
                        report.data_only_stripes
                    ),
                ));
            }
            seq += RECOVERY_SEQ_STEP;
            self.flush().await?;
        }
        let empty = MetaBlock { seq, position, payloads: Vec::new() }.encode(j.config.seed);
        self.journal_write_ring(position, AlignedBuf::from_slice(&empty)).await.map_err(io)?;
        {
            let _g = self.locks.lock(super::META_LOCK_KEY).await;
            self.try_persist_locked(StateChange::JournalTail { sectors: position }).await?;
        }
        {
            let mut st = j.lock();
            st.tail = position;
            st.head = (position + JOURNAL_PAGE_SECTORS) % ring;
            st.next_seq = seq + 1;
            st.units.clear();
            // The empty unit occupies its block until the tail moves past it.
            st.units.push_back(Unit { seq, position, durable: true, done: true });
        }
        self.check_survives("journal start")?;
        self.mark_resynced();
        Ok(report)
    }

    /// Every page of the unit matches its checksum (else the unit was torn by the crash).
    fn journal_unit_whole(&self, mb: &MetaBlock, pages: &[u8]) -> bool {
        let seed = self.journal.as_ref().expect("journal").config.seed;
        let mut at = 0;
        for p in &mb.payloads {
            let sums: &[u32] = match p {
                Payload::Data { checksum, .. } => std::slice::from_ref(checksum),
                Payload::Parity { checksums, .. } => checksums,
                Payload::Flush { .. } => &[],
            };
            for &sum in sums {
                if crc32c_le(seed, &pages[at..at + JOURNAL_PAGE_BYTES]) != sum {
                    return false;
                }
                at += JOURNAL_PAGE_BYTES;
            }
        }
        true
    }

    /// Writes (with `write`) the stripes of one whole unit that have parity in it. `false` when a payload
    /// is one no writer makes (replay stops there, as at a torn unit).
    async fn journal_replay_unit(
        &self,
        mb: &MetaBlock,
        pages: &[u8],
        write: bool,
        report: &mut JournalReport,
    ) -> Result<bool> {
        let pg = self.geometry.parity().expect("journal arrays have parity");
        let chunk = u64::from(pg.chunk_sectors());
        let dd = pg.data_disks() as u64;
        let member_sectors = self.geometry.member_sectors(0);
        let mut rows: Vec<ReplayRow> = Vec::new();
        let mut page = 0usize;
        for p in &mb.payloads {
            let (row, writes, parity) = match p {
                Payload::Data { array_sector, .. } => {
                    if array_sector.saturating_add(JOURNAL_PAGE_SECTORS) > self.geometry.array_sectors()
                        || !array_sector.is_multiple_of(JOURNAL_PAGE_SECTORS)
                    {
                        report.invalid += 1;
                        return Ok(false);
                    }
                    let stripe = array_sector / (dd * chunk);
                    let k = ((array_sector % (dd * chunk)) / chunk) as usize;
                    let row = pg.stripe_member_sector(stripe) + array_sector % chunk;
                    (row, vec![(pg.stripe(stripe).data_roles[k], page)], false)
                }
                Payload::Parity { member_sector, checksums, .. } => {
                    let expected = 1 + usize::from(pg.stripe(0).q_role.is_some());
                    if member_sector.saturating_add(JOURNAL_PAGE_SECTORS) > member_sectors
                        || !member_sector.is_multiple_of(JOURNAL_PAGE_SECTORS)
                        || checksums.len() != expected
                    {
                        report.invalid += 1;
                        return Ok(false);
                    }
                    let layout = pg.stripe(member_sector / chunk);
                    let mut w = vec![(layout.p_role, page)];
                    if let Some(q) = layout.q_role {
                        w.push((q, page + 1));
                    }
                    (*member_sector, w, true)
                }
                Payload::Flush { .. } => continue,
            };
            page += p.pages();
            match rows.iter_mut().find(|r| r.member_sector == row) {
                Some(r) => {
                    r.pages.extend(writes);
                    r.has_parity |= parity;
                }
                None => rows.push(ReplayRow { member_sector: row, pages: writes, has_parity: parity }),
            }
        }
        for ReplayRow { member_sector: row, pages: writes, has_parity } in rows {
            if !has_parity {
                report.data_only_stripes += 1;
                continue;
            }
            report.stripes += 1;
            if !write {
                continue;
            }
            for (role, page) in writes {
                if !self.members.slots[role].is_writable() {
                    report.pages_skipped += 1;
                    continue;
                }
                let bytes = &pages[page * JOURNAL_PAGE_BYTES..(page + 1) * JOURNAL_PAGE_BYTES];
                if let Err(e) = self.write_member(role, row, AlignedBuf::from_slice(bytes), false).await {
                    self.member_failed(role, &e, "journal replay").await;
                }
            }
        }
        Ok(true)
    }
}

/// One stripe row of a unit being replayed.
struct ReplayRow {
    member_sector: u64,
    /// (role, page index in the unit) to write.
    pages: Vec<(usize, usize)>,
    /// The unit has the row's parity (else md's data-only stripe: not written).
    has_parity: bool,
}

/// A random first seq for a new log (md: `get_random_u32()`).
fn random_seq() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x6433_c509);
    u64::from(h.finish() as u32)
}
