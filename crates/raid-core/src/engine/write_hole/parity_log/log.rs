//! The partial parity log itself: one log per role, a chain of headers in its area, and the
//! entries each write puts there before its member writes start.
//!
//! Contract:
//! - A stripe's member writes start only after an entry covering it is durable.
//! - md replays only the newest header of a log, so every header repeats the entries still
//!   *pending*: in flight, or completed but not yet durable on the members (a member flush
//!   that starts after a write completed drops its entries). The newest header therefore
//!   covers every stripe whose members may disagree; no two of its entries cover the same
//!   rows of a stripe (see `check_room`).
//! - An entry of several data blocks whose data checksums did not fit in the header is
//!   retired: once its write is durable (a member flush after it, or its own FUA), a new
//!   header stops naming it before the FLUSH or FUA write is acknowledged (`retire_logs`),
//!   so a degraded replay never takes a durable write for one in flight.
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

use super::{ParityLogConfig, ParityLogStats};
use crate::buf::AlignedBuf;
use crate::engine::Array;
use crate::error::Result;
use crate::member::Member;
use crate::ppl::{DataChecksums, MAX_DATA_CRCS, PPL_HEADER_BYTES, PplEntry, PplHeader};

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
    pub(super) config: ParityLogConfig,
    /// The array's chunk and data blocks per stripe (its geometry never changes: md allows
    /// no reshape of an array with a PPL).
    pub(super) chunk_sectors: u64,
    pub(super) data_disks: u64,
    logs: Vec<Mutex<ChildLog>>,
    changed: Event,
    flushes_started: AtomicU64,
    pub(super) generation: AtomicU64,
    entries_logged: AtomicU64,
    headers_written: AtomicU64,
    drains: AtomicU64,
    retires: AtomicU64,
}

impl ParityLog {
    pub(super) fn new(config: ParityLogConfig, roles: usize, chunk_sectors: u64, data_disks: u64) -> Self {
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
            chunk_sectors,
            data_disks,
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
    pub(super) async fn clear_area<M: Member + ?Sized>(&self, member: &M) -> std::io::Result<()> {
        let generation = self.generation.load(Ordering::Acquire);
        let empty = PplHeader { signature: self.config.signature, generation, entries: Vec::new() }.encode();
        let mut image = AlignedBuf::zeroed(self.config.area_bytes as usize);
        image.as_mut_slice()[..PPL_HEADER_BYTES].copy_from_slice(&empty);
        member.write_at(self.config.area_offset_bytes, image, true).await.0
    }

    fn lock(&self, role: usize) -> std::sync::MutexGuard<'_, ChildLog> {
        self.logs[role].lock().expect("parity log lock")
    }

    /// `role`'s area was cleared (an empty header at its start) for the device `device_id`.
    pub(super) fn cleared(&self, role: usize, device_id: Option<usize>) {
        let mut child = self.lock(role);
        child.next_offset = PPL_HEADER_BYTES as u64;
        child.device_id = device_id;
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

impl ParityLog {
    /// Logs the partial parity of the stripes a write is about to change and waits until it
    /// is durable. The ticket completes the entries once the member writes are done.
    pub(crate) async fn log_partial_parity<'a, M: Member + ?Sized>(
        &'a self,
        array: &Array<M>,
        mut requests: Vec<LogRequest>,
        expected: &mut Option<Expected<'_>>,
    ) -> Result<LogTicket<'a>> {
        let log = self;
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
            let ids = self.enter_log(array, role, batch).await?;
            ticket.ids.push((role, ids));
        }
        join_all(ticket.ids.iter().map(|(role, ids)| self.commit_log(array, *role, ids))).await;
        Ok(ticket)
    }

    /// Adds a write's entries to one log, waiting for room.
    async fn enter_log<M: Member + ?Sized>(
        &self,
        array: &Array<M>,
        role: usize,
        batch: Vec<LogRequest>,
    ) -> Result<Vec<u64>> {
        let log = self;
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
                    array.flush_members().await?;
                }
                (Blocked::Wait, listener) => listener.await,
            }
        }
    }

    /// Waits until `ids` of `role`'s log are in a durable header, writing one if nobody is.
    /// Waits only for header writes and for the reads of writes that announced themselves
    /// (never for writes that wait: see `check_room`, `Expected`).
    async fn commit_log<M: Member + ?Sized>(&self, array: &Array<M>, role: usize, ids: &[u64]) {
        let log = self;
        let horizon = log.lock(role).next_ticket;
        loop {
            let (listener, unit) = {
                let mut child = log.lock(role);
                let mine_logged = child.entries.iter().filter(|e| ids.contains(&e.id)).all(|e| e.logged);
                if mine_logged {
                    return;
                }
                let reading = child.expected.first().is_some_and(|&t| t < horizon);
                let unit = (!child.writing && !reading).then(|| {
                    let device_id = array.members.slots()[role].device().map(|d| d.id);
                    self.prepare_header(device_id, &mut child)
                });
                (log.changed.listen(), unit)
            };
            match unit {
                None => listener.await,
                Some(unit) => self.write_header(array, role, unit).await,
            }
        }
    }

    /// Builds the next header of `role`'s log from every pending entry and reserves its place.
    fn prepare_header(&self, device_id: Option<usize>, child: &mut ChildLog) -> HeaderWrite {
        let log = self;
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
        let (chunk, dd) = (self.chunk_sectors, self.data_disks);
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
    pub(crate) async fn retire_logs<M: Member + ?Sized>(&self, array: &Array<M>, roles: &[usize]) -> Result<()> {
        let results = join_all(roles.iter().map(|&role| self.retire_log(array, role))).await;
        results.into_iter().collect()
    }

    async fn retire_log<M: Member + ?Sized>(&self, array: &Array<M>, role: usize) -> Result<()> {
        let log = self;
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
                } else if !child.names_retired() || !array.members.slots()[role].is_writable() {
                    return Ok(());
                } else {
                    match child.check_room(log.config.area_bytes, &[]) {
                        Ok(()) => {
                            let device_id = array.members.slots()[role].device().map(|d| d.id);
                            Next::Write(self.prepare_header(device_id, &mut child))
                        }
                        Err(Blocked::NeedsFlush) => Next::Flush,
                        Err(Blocked::Wait) => Next::Wait,
                    }
                };
                (log.changed.listen(), next)
            };
            match next {
                Next::Write(unit) => {
                    log.retires.fetch_add(1, Ordering::Relaxed);
                    self.write_header(array, role, unit).await
                }
                Next::Flush => array.flush_members().await?,
                Next::Wait => listener.await,
            }
        }
    }

    /// Writes a prepared header (FUA) and marks its entries logged. A failed write fails the
    /// member; its entries need no protection then (the parity they protect is gone).
    async fn write_header<M: Member + ?Sized>(&self, array: &Array<M>, role: usize, unit: HeaderWrite) {
        let log = self;
        let slot = &array.members.slots()[role];
        let result = match slot.device() {
            Some(d) if slot.is_writable() => {
                d.member.write_at(log.config.area_offset_bytes + unit.offset, unit.image, true).await.0
            }
            _ => Ok(()),
        };
        if let Err(e) = &result {
            array.member_failed(role, e, "parity log write").await;
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
}

/// A header ready to be written.
struct HeaderWrite {
    ids: Vec<u64>,
    offset: u64,
    image: AlignedBuf,
}
