//! The partial parity log (md's PPL, raid5): what closes the write hole.
//!
//! Before the data and parity of a stripe are written, the stripe's *partial parity* (the
//! XOR of the data it does not modify) goes, FUA, to the log area of the stripe's parity
//! member. After a crash, replay recomputes each logged stripe's parity as partial parity
//! XOR the modified data now on the members, so parity agrees with the data whatever part
//! of the write landed, and a member lost afterwards is rebuilt right. Full-stripe writes
//! log an entry without partial parity (parity is then recomputed from all data), as md.
//! Format: [`crate::ppl`].
//!
//! Contract (one log per role, each a chain of headers in its area):
//! - A stripe's member writes start only after an entry covering it is durable.
//! - md replays only the newest header of a log, so every header repeats the entries still
//!   *pending*: in flight, or completed but not yet durable on the members (a member flush
//!   that starts after a write completed drops its entries). The newest header therefore
//!   covers every stripe whose members may disagree; no two of its entries cover the same
//!   rows of a stripe (see `check_room`).
//! - Replay with a data member missing marks the rows it cannot replay bad (bad_blocks.rs),
//!   unless the entry's data checksums (raidnbd's, in the header's reserved bytes) show its
//!   write landed whole. An entry of several data blocks whose checksums did not fit is
//!   retired instead: once its write is durable (a member flush after it, or its own FUA),
//!   a new header stops naming it before the FLUSH or FUA write is acknowledged
//!   (`retire_logs`). Either way acknowledged data on a lost member never reads as an error.
//! - Headers are appended; when the area is full the next one goes to its start, which is
//!   allowed only while no pending entry was ever logged (a torn header at the start would
//!   hide the older chain). Entries that wait for room make a member flush happen.
//! - Bounded: at most 64 pending entries and 256 KiB of partial parity per log (one header
//!   holds them all). A write enters the logs it needs in ascending role order and waits
//!   for room in one log at a time; once in, it waits only for header writes and member
//!   I/O. So waits cannot form a cycle: an entry waited for belongs to a write that waits
//!   only on higher logs, on a header write, or on member I/O.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use event_listener::Event;
use futures::future::join_all;

use super::{Array, Device};
use crate::SECTOR_BYTES;
use crate::buf::AlignedBuf;
use crate::error::{ErrorKind, RaidError, Result};
use crate::member::Member;
use crate::ppl::{DataChecksums, MAX_DATA_CRCS, PPL_HEADER_BYTES, PplEntry, PplHeader, newest_header, ppl_checksum};

/// Where each member's log lives and what its headers carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParityLogConfig {
    /// Byte offset of the area on every member (md: superblock + `ppl.offset` sectors).
    pub area_offset_bytes: u64,
    pub area_bytes: u64,
    /// md: CRC-32C of the array UUID.
    pub signature: u32,
    /// Data checksums one header carries at most (`ppl::MAX_DATA_CRCS`; fewer only in
    /// tests: entries without them are retired from the log once durable instead).
    pub max_data_crcs: usize,
}

/// What replay at start found and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Logs with a valid newest header.
    pub logs: usize,
    pub entries_replayed: u64,
    /// Entries whose partial parity does not match its checksum: a log write torn by the
    /// crash, whose member writes therefore never started.
    pub entries_torn: u64,
    /// Entries with rows not replayed because a modified data member is missing (its data
    /// was in flight: md does the same).
    pub entries_degraded: u64,
    /// Of those, entries whose data checksums (raidnbd's, in the header) show the write
    /// landed whole: the lost block rebuilds as its new data, nothing is marked.
    pub entries_landed: u64,
    /// Parity sectors of the other degraded rows marked bad: rows where another block was
    /// written too, so parity may match neither the old nor the new data and the lost chunk
    /// cannot be rebuilt there (reads of it fail instead of returning garbage).
    pub parity_sectors_bad: u64,
    /// Entries no writer makes (bad span, wrong parity member): the array then resyncs.
    pub entries_invalid: u64,
    /// Parity sectors rewritten.
    pub parity_sectors: u64,
}

/// Counters for status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ParityLogStats {
    /// Entries logged (each counted once, however many headers repeated it).
    pub entries_logged: u64,
    pub headers_written: u64,
    /// Member flushes started because a log was full.
    pub drains: u64,
    /// Headers written only so that the newest one stops naming durable writes (`retire_logs`).
    pub retires: u64,
}

/// Largest partial parity of one entry: longer segments are split (md logs 4 KiB rows).
pub(crate) const MAX_ENTRY_PP_BYTES: usize = 128 << 10;
/// Partial parity one write sends to one log in one wave (a write larger than that goes in
/// waves).
pub(crate) const MAX_WAVE_PP_BYTES: usize = 128 << 10;
/// Entries one write sends to one log in one wave.
pub(crate) const MAX_WAVE_ENTRIES: usize = 32;
/// Pending entries of one log, and their partial parity: a header repeats all of them, so
/// this bounds its size (and makes a member flush drop the completed ones when reached).
const MAX_PENDING_ENTRIES: usize = 64;
const MAX_PENDING_PP_BYTES: usize = 256 << 10;
/// The smallest area: one header with the most pending partial parity.
pub const MIN_PARITY_LOG_AREA_BYTES: u64 = (PPL_HEADER_BYTES + MAX_PENDING_PP_BYTES) as u64;

/// One entry a write asks to log.
pub(crate) struct LogRequest {
    pub role: usize,
    pub entry: PplEntry,
    pub pp: AlignedBuf,
    pub footprint: Footprint,
    /// CRC-32C of each written data block's new data, when two or more are written.
    pub data_crcs: Vec<u32>,
}

/// What an entry's write changes in its stripe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Footprint {
    pub stripe: u64,
    /// Bit k: data block k is written.
    pub written: u64,
    pub rows: (u32, u32),
}

impl Footprint {
    /// Whether both change rows of one stripe.
    fn overlaps(&self, other: &Footprint) -> bool {
        self.stripe == other.stripe && self.rows.0 < other.rows.1 && other.rows.0 < self.rows.1
    }
}

struct Pending {
    id: u64,
    entry: PplEntry,
    pp: AlignedBuf,
    footprint: Footprint,
    data_crcs: Vec<u32>,
    /// In a durable header.
    logged: bool,
    /// The write completed (member writes not yet flushed) when this many flushes had started.
    done_at_flush: Option<u64>,
}

struct ChildLog {
    entries: VecDeque<Pending>,
    /// Tickets of writes reading their stripes now that will log here next: a header waits
    /// for those that were reading when its writer came (their reads end on their own; later
    /// ones cannot hold it up), so one header carries more entries. Under load a header
    /// costs a member I/O per batch; without concurrent writes nobody waits.
    expected: std::collections::BTreeSet<u64>,
    next_ticket: u64,
    pp_bytes: usize,
    /// Where the next header goes (bytes into the area); advanced when a header is sent.
    next_offset: u64,
    writing: bool,
    next_id: u64,
    /// Device the area belongs to (a new device gets its area cleared first).
    device_id: Option<usize>,
    /// Entries named by the newest header written (or being written) that a degraded replay
    /// could take for writes in flight once they are durable: those of two or more data
    /// blocks (with one, parity rebuilds the lost block as its old or new data) whose data
    /// checksums did not fit in the header. They are retired once durable.
    header_ids: Vec<u64>,
}

pub(crate) struct ParityLog {
    config: ParityLogConfig,
    logs: Vec<Mutex<ChildLog>>,
    changed: Event,
    flushes_started: AtomicU64,
    generation: AtomicU64,
    entries_logged: AtomicU64,
    headers_written: AtomicU64,
    drains: AtomicU64,
    retires: AtomicU64,
}

impl ParityLog {
    pub fn new(config: ParityLogConfig, roles: usize) -> Self {
        assert!(config.area_bytes >= MIN_PARITY_LOG_AREA_BYTES, "PPL area too small");
        let logs = (0..roles)
            .map(|_| {
                Mutex::new(ChildLog {
                    entries: VecDeque::new(),
                    expected: Default::default(),
                    next_ticket: 0,
                    pp_bytes: 0,
                    next_offset: 0,
                    writing: false,
                    next_id: 0,
                    device_id: None,
                    header_ids: Vec::new(),
                })
            })
            .collect();
        Self {
            config,
            logs,
            changed: Event::new(),
            flushes_started: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            entries_logged: AtomicU64::new(0),
            headers_written: AtomicU64::new(0),
            drains: AtomicU64::new(0),
            retires: AtomicU64::new(0),
        }
    }

    /// Writes an empty header over `member`'s cleared area (FUA).
    async fn clear_area<M: Member + ?Sized>(&self, member: &M) -> std::io::Result<()> {
        let generation = self.generation.load(Ordering::Acquire);
        let empty = PplHeader { signature: self.config.signature, generation, entries: Vec::new() }.encode();
        let mut image = AlignedBuf::zeroed(self.config.area_bytes as usize);
        image.as_mut_slice()[..PPL_HEADER_BYTES].copy_from_slice(&empty);
        member.write_at(self.config.area_offset_bytes, image, true).await.0
    }

    fn lock(&self, role: usize) -> std::sync::MutexGuard<'_, ChildLog> {
        self.logs[role].lock().expect("parity log lock")
    }

    pub fn stats(&self) -> ParityLogStats {
        ParityLogStats {
            entries_logged: self.entries_logged.load(Ordering::Relaxed),
            headers_written: self.headers_written.load(Ordering::Relaxed),
            drains: self.drains.load(Ordering::Relaxed),
            retires: self.retires.load(Ordering::Relaxed),
        }
    }

    /// A member flush begins: returns its number for [`ParityLog::flush_done`].
    pub fn flush_started(&self) -> u64 {
        self.flushes_started.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Flush `number` made every write completed before it durable: drop their entries.
    pub fn flush_done(&self, number: u64) {
        for log in &self.logs {
            let mut log = log.lock().expect("parity log lock");
            let before = log.entries.len();
            log.entries.retain(|e| e.done_at_flush.is_none_or(|c| c >= number));
            if log.entries.len() != before {
                log.pp_bytes = log.entries.iter().map(|e| e.pp.len()).sum();
            }
        }
        self.changed.notify(usize::MAX);
    }

    /// A logged write finished (or gave up) its member writes: its entries stay until a
    /// member flush, or go now if they were never logged or (`durable`: FUA) its member
    /// writes are durable.
    fn complete(&self, role: usize, ids: &[u64], durable: bool) {
        let epoch = self.flushes_started.load(Ordering::Acquire);
        let mut log = self.lock(role);
        let mut removed = 0;
        log.entries.retain_mut(|e| {
            if !ids.contains(&e.id) {
                return true;
            }
            // Never logged: its member writes never started (they wait for the header).
            // Durable: replay has nothing to fix (no other pending entry covers its rows, see
            // `check_room`).
            if !e.logged || durable {
                removed += e.pp.len();
                return false;
            }
            e.done_at_flush = Some(epoch);
            true
        });
        log.pp_bytes -= removed;
        drop(log);
        self.changed.notify(usize::MAX);
    }
}

/// A write about to log (reading its stripes): its ticket per role; released on drop.
pub(crate) struct Expected<'a> {
    log: &'a ParityLog,
    tickets: Vec<(usize, u64)>,
}

impl ParityLog {
    /// Announces that a write will log on `roles` once its reads are done.
    pub fn expect(&self, roles: Vec<usize>) -> Expected<'_> {
        let tickets = roles
            .into_iter()
            .map(|r| {
                let mut child = self.lock(r);
                let t = child.next_ticket;
                child.next_ticket += 1;
                child.expected.insert(t);
                (r, t)
            })
            .collect();
        Expected { log: self, tickets }
    }
}

impl Drop for Expected<'_> {
    fn drop(&mut self) {
        for &(r, t) in &self.tickets {
            self.log.lock(r).expected.remove(&t);
        }
        self.log.changed.notify(usize::MAX);
    }
}

/// Entries of one write; dropping it completes them (after the member writes).
pub(crate) struct LogTicket<'a> {
    log: &'a ParityLog,
    ids: Vec<(usize, Vec<u64>)>,
}

impl LogTicket<'_> {
    /// Completes the entries of a write whose member writes are durable (FUA); returns the
    /// logs whose newest header must stop naming them.
    pub(crate) fn complete_durable(mut self) -> Vec<usize> {
        let ids = std::mem::take(&mut self.ids);
        for (role, ids) in &ids {
            self.log.complete(*role, ids, true);
        }
        ids.into_iter().map(|(role, _)| role).collect()
    }
}

impl Drop for LogTicket<'_> {
    fn drop(&mut self) {
        for (role, ids) in std::mem::take(&mut self.ids) {
            self.log.complete(role, &ids, false);
        }
    }
}

/// Why a log cannot take entries now.
enum Blocked {
    /// Entries are done but not flushed: a member flush frees them.
    NeedsFlush,
    /// Wait for other writes to finish.
    Wait,
}

impl ChildLog {
    fn all_unlogged(&self) -> bool {
        self.entries.iter().all(|e| !e.logged)
    }

    /// The newest header names an entry (of several data blocks) no longer pending: its
    /// write is durable.
    fn names_retired(&self) -> bool {
        self.header_ids.iter().any(|id| !self.entries.iter().any(|e| e.id == *id))
    }

    /// Whether a header holding every pending entry plus `add` can go in the area now.
    ///
    /// At most one pending entry covers a row of a stripe: a write to rows a pending entry
    /// covers waits until that entry's data is durable (a member flush drops it). Else one
    /// entry's partial parity would hold data the other writes: replayed last, the newer
    /// one assumes the older one's data landed; the older one, once the newer cannot be
    /// replayed (a member missing), brings back data the newer one overwrote. (md writes
    /// a header only after the stripes of the one before are written and flushed.)
    ///
    /// Where the next header goes is settled here too, so that a commit never waits for
    /// other writes: it fits after the last one, or (no pending entry logged yet) at the
    /// start of the area.
    fn check_room(&self, area_bytes: u64, add: &[LogRequest]) -> Result<(), Blocked> {
        let add_pp: usize = add.iter().map(|r| r.pp.len()).sum();
        let unit = (PPL_HEADER_BYTES + self.pp_bytes + add_pp) as u64;
        let room =
            self.entries.len() + add.len() <= MAX_PENDING_ENTRIES && self.pp_bytes + add_pp <= MAX_PENDING_PP_BYTES;
        let fits = self.next_offset + unit <= area_bytes || (!self.writing && self.all_unlogged());
        let depends = add.iter().any(|r| self.entries.iter().any(|e| r.footprint.overlaps(&e.footprint)));
        if room && fits && !depends {
            return Ok(());
        }
        if self.entries.iter().any(|e| e.done_at_flush.is_some()) {
            Err(Blocked::NeedsFlush)
        } else {
            Err(Blocked::Wait)
        }
    }
}

impl<M: Member + ?Sized> Array<M> {
    /// Logs the partial parity of the stripes a write is about to change and waits until it
    /// is durable. The ticket completes the entries once the member writes are done.
    pub(crate) async fn log_partial_parity(
        &self,
        mut requests: Vec<LogRequest>,
        expected: &mut Option<Expected<'_>>,
    ) -> Result<LogTicket<'_>> {
        let log = self.parity_log.as_ref().expect("a parity log");
        // Entering now: no header waits for this write any more.
        drop(expected.take());
        requests.sort_by_key(|r| r.role); // stable: a role's entries keep the write's order
        let mut ticket = LogTicket { log, ids: Vec::new() };
        let mut requests = requests.into_iter().peekable();
        while let Some(first) = requests.next() {
            let role = first.role;
            let mut batch = vec![first];
            while let Some(r) = requests.next_if(|r| r.role == role) {
                batch.push(r);
            }
            let ids = self.enter_log(role, batch).await?;
            ticket.ids.push((role, ids));
        }
        join_all(ticket.ids.iter().map(|(role, ids)| self.commit_log(*role, ids))).await;
        Ok(ticket)
    }

    /// Adds a write's entries to one log, waiting for room.
    async fn enter_log(&self, role: usize, batch: Vec<LogRequest>) -> Result<Vec<u64>> {
        let log = self.parity_log.as_ref().expect("a parity log");
        debug_assert!(
            batch.len() <= MAX_WAVE_ENTRIES && batch.iter().map(|r| r.pp.len()).sum::<usize>() <= MAX_WAVE_PP_BYTES,
            "waves are bounded"
        );
        let mut batch = Some(batch);
        loop {
            let blocked = {
                let mut child = log.lock(role);
                match child.check_room(log.config.area_bytes, batch.as_deref().expect("entered once")) {
                    Ok(()) => {
                        let mut ids = Vec::new();
                        for r in batch.take().expect("entered once") {
                            let id = child.next_id;
                            child.next_id += 1;
                            child.pp_bytes += r.pp.len();
                            child.entries.push_back(Pending {
                                id,
                                entry: r.entry,
                                pp: r.pp,
                                footprint: r.footprint,
                                data_crcs: r.data_crcs,
                                logged: false,
                                done_at_flush: None,
                            });
                            ids.push(id);
                        }
                        return Ok(ids);
                    }
                    Err(b) => (b, log.changed.listen()),
                }
            };
            match blocked {
                (Blocked::NeedsFlush, _) => {
                    log.drains.fetch_add(1, Ordering::Relaxed);
                    // Members only: a retire (`flush`) could wait for entries this write
                    // already put in lower logs.
                    self.flush_members().await?;
                }
                (Blocked::Wait, listener) => listener.await,
            }
        }
    }

    /// Waits until `ids` of `role`'s log are in a durable header, writing one if nobody is.
    /// Waits only for header writes and for the reads of writes that announced themselves
    /// (never for writes that wait: see `check_room`, `Expected`).
    async fn commit_log(&self, role: usize, ids: &[u64]) {
        let log = self.parity_log.as_ref().expect("a parity log");
        let horizon = log.lock(role).next_ticket;
        loop {
            let (listener, unit) = {
                let mut child = log.lock(role);
                let mine_logged = child.entries.iter().filter(|e| ids.contains(&e.id)).all(|e| e.logged);
                if mine_logged {
                    return;
                }
                let reading = child.expected.first().is_some_and(|&t| t < horizon);
                let unit = (!child.writing && !reading).then(|| self.prepare_header(role, &mut child));
                (log.changed.listen(), unit)
            };
            match unit {
                None => listener.await,
                Some(unit) => self.write_header(role, unit).await,
            }
        }
    }

    /// Builds the next header of `role`'s log from every pending entry and reserves its place.
    fn prepare_header(&self, role: usize, child: &mut ChildLog) -> HeaderWrite {
        let log = self.parity_log.as_ref().expect("a parity log");
        let device_id = self.members.slots[role].device().map(|d| d.id);
        let unit_bytes = PPL_HEADER_BYTES + child.pp_bytes;
        // A device new to this role first gets its whole area cleared (no stale chain).
        let fresh = device_id != child.device_id;
        let offset = if fresh || child.next_offset + unit_bytes as u64 > log.config.area_bytes {
            assert!(fresh || child.all_unlogged(), "wrapping over logged entries (check_room settles the place)");
            0
        } else {
            child.next_offset
        };
        let generation = log.generation.fetch_add(1, Ordering::AcqRel) + 1;
        let header = PplHeader {
            signature: log.config.signature,
            generation,
            entries: child.entries.iter().map(|e| e.entry).collect(),
        };
        // The data checksums of the leading entries that fit; entries of several blocks
        // after those must be retired from the log once durable (`retire_logs`).
        let mut data = DataChecksums::default();
        let pg = self.geometry.parity().expect("raid5 has parity");
        let (chunk, dd) = (u64::from(pg.chunk_sectors()), pg.data_disks() as u64);
        for e in &child.entries {
            let replayed = e.entry.span(chunk, dd).map_or(0, |s| s.modified_disks(chunk) as usize);
            let agrees = e.data_crcs.is_empty() || e.data_crcs.len() == replayed;
            debug_assert!(agrees, "an entry's data checksums are one per block replay reads");
            if !agrees || data.crcs.len() + e.data_crcs.len() > log.config.max_data_crcs.min(MAX_DATA_CRCS) {
                break;
            }
            data.crcs.extend(&e.data_crcs);
            data.entries += 1;
        }
        child.header_ids = child
            .entries
            .iter()
            .skip(data.entries)
            .filter(|e| crate::ppl::carries_data_crcs(e.footprint.written.count_ones().into()))
            .map(|e| e.id)
            .collect();
        let len = if fresh { log.config.area_bytes as usize } else { unit_bytes };
        let mut image = AlignedBuf::zeroed(len);
        image.as_mut_slice()[..PPL_HEADER_BYTES].copy_from_slice(&header.encode_with(&data));
        let mut at = PPL_HEADER_BYTES;
        for e in &child.entries {
            image.as_mut_slice()[at..at + e.pp.len()].copy_from_slice(e.pp.as_slice());
            at += e.pp.len();
        }
        child.writing = true;
        child.next_offset = offset + unit_bytes as u64;
        child.device_id = device_id;
        HeaderWrite { ids: child.entries.iter().map(|e| e.id).collect(), offset, image }
    }

    /// Makes the newest header of each of `roles`' logs name only pending entries: after a
    /// member flush (FLUSH) or a FUA write, so a replay never takes a durable write for one
    /// in flight. Waits for a header being written; when the area has no room, flushes the
    /// members so completed entries go and the header can wrap, or waits for the writes in
    /// flight (they wait only for header writes, member I/O and member flushes, never for a
    /// retire, so this wait ends).
    pub(crate) async fn retire_logs(&self, roles: &[usize]) -> Result<()> {
        let results = join_all(roles.iter().map(|&role| self.retire_log(role))).await;
        results.into_iter().collect()
    }

    async fn retire_log(&self, role: usize) -> Result<()> {
        let Some(log) = self.parity_log.as_ref() else { return Ok(()) };
        enum Next {
            Write(HeaderWrite),
            Flush,
            Wait,
        }
        loop {
            let (listener, next) = {
                let mut child = log.lock(role);
                // A header being written may be the one that stops naming them: wait for it.
                let next = if child.writing {
                    Next::Wait
                } else if !child.names_retired() || !self.members.slots[role].is_writable() {
                    return Ok(());
                } else {
                    match child.check_room(log.config.area_bytes, &[]) {
                        Ok(()) => Next::Write(self.prepare_header(role, &mut child)),
                        Err(Blocked::NeedsFlush) => Next::Flush,
                        Err(Blocked::Wait) => Next::Wait,
                    }
                };
                (log.changed.listen(), next)
            };
            match next {
                Next::Write(unit) => {
                    log.retires.fetch_add(1, Ordering::Relaxed);
                    self.write_header(role, unit).await
                }
                Next::Flush => self.flush_members().await?,
                Next::Wait => listener.await,
            }
        }
    }

    /// Writes a prepared header (FUA) and marks its entries logged. A failed write fails the
    /// member; its entries need no protection then (the parity they protect is gone).
    async fn write_header(&self, role: usize, unit: HeaderWrite) {
        let log = self.parity_log.as_ref().expect("a parity log");
        let slot = &self.members.slots[role];
        let result = match slot.device() {
            Some(d) if slot.is_writable() => {
                d.member.write_at(log.config.area_offset_bytes + unit.offset, unit.image, true).await.0
            }
            _ => Ok(()),
        };
        if let Err(e) = &result {
            self.member_failed(role, e, "parity log write").await;
        }
        log.headers_written.fetch_add(1, Ordering::Relaxed);
        let mut child = log.lock(role);
        let mut first_time = 0;
        for e in child.entries.iter_mut().filter(|e| unit.ids.contains(&e.id)) {
            first_time += u64::from(!e.logged);
            e.logged = true;
        }
        log.entries_logged.fetch_add(first_time, Ordering::Relaxed);
        child.writing = false;
        drop(child);
        log.changed.notify(usize::MAX);
    }

    /// Before `device` takes a role: clears its log area, which may still hold the headers
    /// of an earlier life in this array (a member failed and added back). Replayed after a
    /// crash that came before its first new header, they would rewrite parity from partial
    /// parity of data changed since. md clears it too (`ppl_modify_log`).
    pub(super) async fn clear_parity_log_of(&self, device: &Device<M>) -> Result<()> {
        let Some(log) = &self.parity_log else { return Ok(()) };
        let member = &device.member;
        log.clear_area(&**member)
            .await
            .map_err(|e| RaidError::io(format!("{}: cannot clear the parity log area", member.name()), e))
    }

    /// Parity log counters (`None` without a log).
    pub fn parity_log_stats(&self) -> Option<ParityLogStats> {
        self.parity_log.as_ref().map(ParityLog::stats)
    }

    /// Enables the partial parity log (raid5). Call [`Array::start_parity_log`] before writes.
    pub fn with_parity_log(mut self, config: ParityLogConfig) -> Result<Self> {
        if self.geometry.level() != crate::geometry::Level::Raid5 {
            return Err(RaidError::new(
                ErrorKind::CannotAssemble,
                format!("a partial parity log is for raid5 (as md's PPL), not {}", self.geometry.level()),
            ));
        }
        let pg = self.geometry.parity().expect("raid5 has parity");
        let stripe_data_bytes = pg.stripe_data_sectors() * SECTOR_BYTES;
        if self.members.slots.len() > 64 || stripe_data_bytes > u64::from(u32::MAX) {
            return Err(RaidError::new(
                ErrorKind::CannotAssemble,
                format!(
                    "a partial parity log takes at most 64 members and stripes under 4 GiB (md's limits); this \
                     array has {} members and {stripe_data_bytes}-byte stripes",
                    self.members.slots.len()
                ),
            ));
        }
        self.parity_log = Some(ParityLog::new(config, self.members.slots.len()));
        Ok(self)
    }

    /// At start: after an unclean stop, replays every member's newest header (parity of each
    /// logged stripe := partial parity XOR its modified data); then clears every log area and
    /// writes an empty header, as md does. When the replay covered everything the array is
    /// in sync: no resync follows.
    pub async fn start_parity_log(&self, unclean: bool) -> Result<ReplayReport> {
        let Some(log) = &self.parity_log else { return Ok(ReplayReport::default()) };
        let mut report = ReplayReport::default();
        let roles: Vec<usize> =
            (0..self.members.slots.len()).filter(|&r| self.members.slots[r].is_writable()).collect();
        let mut max_generation = 0;
        for &role in &roles {
            let member = self.members.slots[role].member();
            let (res, area) =
                member.read_at(log.config.area_offset_bytes, AlignedBuf::zeroed(log.config.area_bytes as usize)).await;
            res.map_err(|e| RaidError::io(format!("{}: cannot read the parity log", member.name()), e))?;
            let Some((at, header)) = newest_header(area.as_slice(), log.config.signature) else {
                tracing::warn!(role, member = member.name(), "no valid parity log header");
                continue;
            };
            report.logs += 1;
            max_generation = max_generation.max(header.generation);
            if unclean {
                let data = PplHeader::data_checksums(&area.as_slice()[at..]);
                let pp_area = &area.as_slice()[at + PPL_HEADER_BYTES..];
                self.replay_header(role, &header, &data, pp_area, &mut report).await?;
            }
        }
        if unclean {
            self.flush().await?;
        }
        log.generation.fetch_max(max_generation, Ordering::AcqRel);
        // Empty headers over cleared areas (a stale chain must not follow a new header).
        let results = join_all(roles.iter().map(|&role| {
            let member = self.members.slots[role].member();
            async move { (role, log.clear_area(&*member).await) }
        }))
        .await;
        for (role, res) in results {
            match res {
                Ok(()) => {
                    let mut child = log.lock(role);
                    child.next_offset = PPL_HEADER_BYTES as u64;
                    child.device_id = self.members.slots[role].device().map(|d| d.id);
                }
                Err(e) => self.member_failed(role, &e, "parity log reset").await,
            }
        }
        self.check_survives("parity log start")?;
        if unclean && report.entries_invalid == 0 && report.logs == roles.len() {
            self.mark_resynced();
        }
        Ok(report)
    }

    /// Replays one header's entries on the parity member `role`, in order.
    async fn replay_header(
        &self,
        role: usize,
        header: &PplHeader,
        data: &DataChecksums,
        pp_area: &[u8],
        report: &mut ReplayReport,
    ) -> Result<()> {
        let pg = self.geometry.parity().expect("raid5 has parity");
        let chunk = u64::from(pg.chunk_sectors());
        let dd = pg.data_disks() as u64;
        let mut pp_at = 0usize;
        // Where the next entry's data checksums start; None once an entry's count is unknown.
        let mut crc_at = Some(0usize);
        for (i, e) in header.entries.iter().enumerate() {
            let pp_len = e.pp_size as usize;
            let pp = pp_area.get(pp_at..pp_at + pp_len);
            pp_at += pp_len;
            let span = e.span(chunk, dd).filter(|s| s.end_sector <= self.geometry.array_sectors());
            let mut crcs: Option<&[u32]> = None;
            if i < data.entries {
                crc_at = crc_at.zip(span).map(|(at, span)| {
                    let blocks = span.modified_disks(chunk);
                    let n = if crate::ppl::carries_data_crcs(blocks) { blocks as usize } else { 0 };
                    crcs = data.crcs.get(at..at + n).filter(|c| !c.is_empty());
                    at + n
                });
            }
            let (Some(pp), Some(span)) = (pp, span) else {
                report.entries_invalid += 1;
                continue;
            };
            if e.parity_disk as usize != role {
                report.entries_invalid += 1;
                continue;
            }
            if ppl_checksum(pp) != e.checksum {
                report.entries_torn += 1;
                continue;
            }
            let mut parity = vec![0u8; (span.rows * SECTOR_BYTES) as usize];
            let mut row_ok = vec![true; span.rows as usize];
            // Data blocks the entry's write modified, per row.
            let mut modified = vec![0u32; span.rows as usize];
            // Per modified block: the CRC-32C of its rows now, if it is here whole.
            let mut block_crcs: Vec<Option<u32>> = Vec::with_capacity(span.data_disks as usize);
            for disk in 0..span.data_disks {
                let start = span.first_sector + disk * chunk;
                let rows = span.rows.min(span.end_sector.saturating_sub(start));
                if rows == 0 {
                    continue;
                }
                modified[..rows as usize].iter_mut().for_each(|m| *m += 1);
                let mut crc = (rows == span.rows).then_some(0u32);
                let mut row = 0;
                while row < rows {
                    let mapped = self.geometry.map(start + row);
                    let n = mapped.len_sectors.min(rows - row);
                    let copy = mapped.copies[0];
                    if !self.members.slots[copy.role].is_readable(copy.member_sector, n) {
                        row_ok[row as usize..(row + n) as usize].fill(false);
                        crc = None;
                    } else {
                        let buf = self.read_member(copy.role, copy.member_sector, n).await.map_err(|err| {
                            RaidError::io(format!("parity log replay: cannot read role {}", copy.role), err)
                        })?;
                        let at = (row * SECTOR_BYTES) as usize;
                        crate::parity::xor_into(&mut parity[at..at + buf.len()], buf.as_slice());
                        crc = crc.map(|c| crc32c::crc32c_append(c, buf.as_slice()));
                    }
                    row += n;
                }
                block_crcs.push(crc);
            }
            if !pp.is_empty() {
                let n = parity.len().min(pp.len());
                crate::parity::xor_into(&mut parity[..n], &pp[..n]);
            }
            let degraded = row_ok.iter().any(|ok| !ok);
            if degraded {
                report.entries_degraded += 1;
            }
            // A write whose data checksums show it landed whole (its other blocks hold their
            // new data, and parity rebuilds the lost one as its new data): nothing to mark.
            let landed = match crcs {
                Some(crcs) if degraded => self.landed_whole(role, &span, crcs, &block_crcs, &parity).await?,
                _ => false,
            };
            if landed {
                report.entries_landed += 1;
            }
            // Rows that cannot be replayed: parity may be a mix of the old and new data of
            // several blocks. Marked bad, so the lost chunk reads as an error there.
            let mut row = 0u64;
            while row < span.rows && !landed {
                let unknown = |row: u64| !row_ok[row as usize] && modified[row as usize] >= 2;
                if !unknown(row) {
                    row += 1;
                    continue;
                }
                let (stripe, _, r) = pg.locate(span.first_sector + row);
                let mut n = 1;
                while row + n < span.rows && unknown(row + n) && pg.locate(span.first_sector + row + n).0 == stripe {
                    n += 1;
                }
                if pg.stripe(stripe).p_role == role {
                    self.mark_bad(role, pg.stripe_member_sector(stripe) + u64::from(r), n).await?;
                    report.parity_sectors_bad += n;
                }
                row += n;
            }
            // Parity of each row, in runs of rows that are replayable and contiguous on the member.
            let mut row = 0u64;
            while row < span.rows {
                if !row_ok[row as usize] {
                    row += 1;
                    continue;
                }
                let (stripe, _, r) = pg.locate(span.first_sector + row);
                let layout = pg.stripe(stripe);
                let member_sector = pg.stripe_member_sector(stripe) + u64::from(r);
                let mut n = 1;
                while row + n < span.rows
                    && row_ok[(row + n) as usize]
                    && pg.locate(span.first_sector + row + n).0 == stripe
                {
                    n += 1;
                }
                if layout.p_role != role {
                    report.entries_invalid += 1;
                    break;
                }
                let at = (row * SECTOR_BYTES) as usize;
                let buf = AlignedBuf::from_slice(&parity[at..at + (n * SECTOR_BYTES) as usize]);
                self.write_member(role, member_sector, buf, false)
                    .await
                    .map_err(|err| RaidError::io("parity log replay: cannot write parity", err))?;
                report.parity_sectors += n;
                row += n;
            }
            report.entries_replayed += 1;
        }
        Ok(())
    }
}

impl<M: Member + ?Sized> Array<M> {
    /// Whether a degraded entry's write landed whole: every modified block that is here holds
    /// the new data its checksum names, and the one missing block, rebuilt from the parity on
    /// `role` and `partial` (the XOR of the partial parity and the blocks that are here), does
    /// too. One block must be missing (raid5).
    async fn landed_whole(
        &self,
        role: usize,
        span: &crate::ppl::EntrySpan,
        crcs: &[u32],
        block_crcs: &[Option<u32>],
        partial: &[u8],
    ) -> Result<bool> {
        let missing: Vec<usize> = (0..block_crcs.len()).filter(|&d| block_crcs[d].is_none()).collect();
        let [lost] = missing[..] else { return Ok(false) };
        if crcs.len() != block_crcs.len() || (0..crcs.len()).any(|d| d != lost && block_crcs[d] != Some(crcs[d])) {
            return Ok(false);
        }
        let pg = self.geometry.parity().expect("raid5 has parity");
        let (stripe, _, r) = pg.locate(span.first_sector);
        if pg.stripe(stripe).p_role != role || u64::from(r) + span.rows > u64::from(pg.chunk_sectors()) {
            return Ok(false);
        }
        let at = pg.stripe_member_sector(stripe) + u64::from(r);
        let mut rebuilt = self
            .read_member(role, at, span.rows)
            .await
            .map_err(|err| RaidError::io("parity log replay: cannot read parity", err))?;
        crate::parity::xor_into(rebuilt.as_mut_slice(), partial);
        Ok(ppl_checksum(rebuilt.as_slice()) == crcs[lost])
    }
}

/// A header ready to be written.
struct HeaderWrite {
    ids: Vec<u64>,
    offset: u64,
    image: AlignedBuf,
}
