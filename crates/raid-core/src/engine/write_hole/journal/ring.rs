//! The journal's ring: units (a meta block and its pages) appended at the head, FUA, in
//! seq order; the tail moves once the members hold what the units before it logged.
//!
//! Contract:
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
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use event_listener::{Event, listener};

use crate::SECTOR_BYTES;
use crate::buf::AlignedBuf;
use crate::engine::{Array, Device};
use crate::error::{ErrorKind, RaidError, Result};
use crate::journal::{JOURNAL_PAGE_BYTES, JOURNAL_PAGE_SECTORS, META_HEADER_BYTES, MetaBlock, Payload};
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
pub(super) struct Unit {
    pub(super) seq: u64,
    pub(super) position: u64,
    pub(super) durable: bool,
    /// Its member writes completed.
    pub(super) done: bool,
}

#[derive(Debug)]
pub(super) struct State {
    /// Where the next unit goes, and its seq.
    pub(super) head: u64,
    pub(super) next_seq: u64,
    /// Replay starts here (the persisted `journal_tail`).
    pub(super) tail: u64,
    pub(super) units: VecDeque<Unit>,
    pub(super) failed: bool,
}

pub(crate) struct Journal<M: ?Sized> {
    pub(super) device: Device<M>,
    pub(super) config: JournalConfig,
    pub(super) state: Mutex<State>,
    /// A unit became durable or done, the tail moved, or the journal failed.
    pub(super) changed: Event,
    pub(super) reclaiming: AtomicBool,
    units_written: AtomicU64,
    pages_logged: AtomicU64,
    reclaims: AtomicU64,
    waits_for_room: AtomicU64,
}

/// One 4 KiB stripe row of a write, as it goes into the log.
pub(crate) struct LoggedRow<'a> {
    pub payloads: Vec<Payload>,
    pub pages: Vec<&'a [u8]>,
}

/// A wave's units are in the ring and durable; dropping it (after the member writes) marks
/// them done.
pub(crate) struct JournalTicket<'a, M: ?Sized> {
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
    /// A journal whose ring starts at `config.tail_sectors` (checked by `for_array`).
    pub(super) fn new(device: Device<M>, config: JournalConfig) -> Self {
        Journal {
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
        }
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("journal lock")
    }

    pub(super) fn ring(&self) -> u64 {
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

impl<M: Member + ?Sized> Journal<M> {
    /// The journal failed: refuse writes from now on (md makes the array read-only).
    pub(super) fn fail(&self, array: &Array<M>, e: &std::io::Error, what: &str) {
        let j = self;
        tracing::error!(device = j.device.member.name(), error = %e, "write journal {what} failed: the array is read-only now");
        j.lock().failed = true;
        array.set_read_only(true);
        j.changed.notify(usize::MAX);
    }

    /// Logs `rows` (one wave) and waits until they and every earlier unit are durable.
    pub(super) async fn log<'a>(&'a self, array: &Array<M>, rows: &[LoggedRow<'_>]) -> Result<JournalTicket<'a, M>> {
        let j = self;
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
                    return Err(Self::failed_error());
                }
                let ring = j.ring();
                if Self::used(&st, ring) + sectors < ring {
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
            self.reclaim(array, true).await?;
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
                .map(|(seq, position, image)| async move { (seq, self.write_ring(position, image).await) }),
        )
        .await;
        for (seq, res) in results {
            if let Err(e) = res {
                self.fail(array, &e, "write");
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
                    return Err(Self::failed_error());
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
            Self::used(&st, j.ring()) > j.ring() / 4 * 3
        };
        if over {
            self.reclaim(array, false).await?;
        }
        Ok(ticket)
    }

    /// Writes `image` at ring sector `position`, FUA (split where the ring wraps).
    pub(super) async fn write_ring(&self, position: u64, image: AlignedBuf) -> std::io::Result<()> {
        let j = self;
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
    pub(super) async fn read_ring(&self, position: u64, len: usize) -> std::io::Result<AlignedBuf> {
        let j = self;
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
    pub(super) async fn reclaim(&self, array: &Array<M>, need_room: bool) -> Result<()> {
        let j = self;
        loop {
            listener!(j.changed => changed);
            if j.lock().failed {
                return Err(Self::failed_error());
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
            let result = self.move_tail(array, done, position).await;
            j.reclaiming.store(false, Ordering::Release);
            j.changed.notify(usize::MAX);
            return result;
        }
    }

    /// Flushes the members, records the tail at `position` (the start of the last of the
    /// first `done` units), and frees the units before it.
    async fn move_tail(&self, array: &Array<M>, done: usize, position: u64) -> Result<()> {
        let j = self;
        array.flush().await?;
        array.record_journal_tail(position).await?;
        let mut st = j.lock();
        st.tail = position;
        st.units.drain(..done);
        j.reclaims.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
