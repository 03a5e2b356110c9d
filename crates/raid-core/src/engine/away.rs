//! The away record: which resync chunks were written while a member was away, for arrays
//! without a write-intent bitmap (md allows none beside the partial parity log), so that a
//! member that comes back is re-added by copying only those chunks, as with a bitmap.
//!
//! In memory, always (redundant levels without a bitmap): the chunks with writes in flight
//! and those written since the last member flush that completed (`recent`): a member that
//! fails may have lost exactly these (acknowledged, not yet durable on it). When a member
//! fails, the record begins: those chunks, and from then on every chunk written, are in it
//! until the array is whole again (every role in sync), when it ends.
//!
//! On disk (an [`AwayStore`] the binary provides, outside the members: md never looks
//! there), while a member is away: the whole record, saved before any data write to a chunk
//! not yet in it, and again after every superblock update. It carries the array UUID and
//! the superblocks' event count it was saved at; one whose count is not the assembled one
//! (md or raidnbd changed the array after it) is not trusted. A save that fails makes the
//! engine bump the event count (so the stale file is never trusted) and go on in memory.
//!
//! A returning member may use it when its superblock events are at least `since_events`
//! (the array's count when the first member of this away period left): it was up to date
//! then, and everything written since is in the record.

use std::collections::HashMap;
use std::io;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Array, META_LOCK_KEY, StateChange};
use crate::member::{IoFuture, Member};

/// Where the record is kept between runs (one per array; the binary: a file).
pub trait AwayStore: Send + Sync {
    /// Replaces the stored record with `image`, durably.
    fn save<'a>(&'a self, image: &'a [u8]) -> IoFuture<'a, io::Result<()>>;
    /// Removes the stored record (the array is whole again).
    fn remove(&self) -> IoFuture<'_, io::Result<()>>;
}

const MAGIC: &[u8; 8] = b"RNBDAWAY";
const VERSION: u32 = 1;
const HEADER_BYTES: usize = 8 + 4 + 4 + 16 + 8 * 4;
/// At most this many chunks (an 8 KiB bitset on disk, a bounded map in memory).
pub const MAX_AWAY_CHUNKS: u64 = 65536;
/// Smallest chunk: 64 KiB.
const MIN_CHUNK_SECTORS: u64 = 128;

/// Chunk size (resync sectors, a power of two) for `resync_sectors`: at least 64 KiB, and
/// large enough for at most [`MAX_AWAY_CHUNKS`] chunks.
pub fn chunk_sectors_for(resync_sectors: u64) -> u64 {
    resync_sectors.div_ceil(MAX_AWAY_CHUNKS).next_power_of_two().max(MIN_CHUNK_SECTORS)
}

/// What a stored image holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwayImage {
    pub uuid: [u8; 16],
    pub since_events: u64,
    /// The superblocks' event count when it was saved.
    pub valid_events: u64,
    pub chunk_sectors: u64,
    pub chunks: u64,
    /// One bit per chunk, little-endian bit order.
    pub bits: Vec<u8>,
}

impl AwayImage {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES + self.bits.len() + 4);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.uuid);
        for v in [self.since_events, self.valid_events, self.chunk_sectors, self.chunks] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.bits);
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes and checks an image (magic, version, checksum, sizes).
    pub fn decode(image: &[u8]) -> Result<Self, String> {
        if image.len() < HEADER_BYTES + 4 || &image[..8] != MAGIC {
            return Err("not an away record".into());
        }
        let (body, crc) = image.split_at(image.len() - 4);
        if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
            return Err("checksum mismatch".into());
        }
        let u32_at = |at: usize| u32::from_le_bytes(body[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"));
        if u32_at(8) != VERSION {
            return Err(format!("version {} (this raidnbd reads {VERSION})", u32_at(8)));
        }
        let uuid: [u8; 16] = body[16..32].try_into().expect("16 bytes");
        let (since_events, valid_events, chunk_sectors, chunks) = (u64_at(32), u64_at(40), u64_at(48), u64_at(56));
        let bits = body[HEADER_BYTES..].to_vec();
        if chunks > MAX_AWAY_CHUNKS || bits.len() as u64 != chunks.div_ceil(8) || chunk_sectors == 0 {
            return Err(format!("{chunks} chunks in {} bytes", bits.len()));
        }
        Ok(Self { uuid, since_events, valid_events, chunk_sectors, chunks, bits })
    }

    fn is_set(&self, chunk: u64) -> bool {
        self.bits[(chunk / 8) as usize] & (1 << (chunk % 8)) != 0
    }
}

/// Whether a stored image can be trusted for this array as assembled.
pub fn check_image(
    image: &AwayImage,
    uuid: [u8; 16],
    events: u64,
    chunk_sectors: u64,
    chunks: u64,
) -> Result<(), String> {
    if image.uuid != uuid {
        return Err("it belongs to another array".into());
    }
    if image.valid_events != events {
        return Err(format!(
            "it was saved at event count {}, the superblocks say {events} (the array changed since)",
            image.valid_events
        ));
    }
    if (image.chunk_sectors, image.chunks) != (chunk_sectors, chunks) {
        return Err(format!("its chunks ({} x {} sectors) do not fit the array", image.chunks, image.chunk_sectors));
    }
    Ok(())
}

/// A member is away: what was written since.
struct Away {
    since_events: u64,
    chunks: std::collections::HashSet<u64>,
    /// Chunks added and not yet saved, with the generation that added them.
    pending: HashMap<u64, u64>,
    generation: u64,
    persisted: u64,
    /// Saving failed once: in memory only until the period ends.
    store_failed: bool,
}

impl Away {
    fn new(since_events: u64) -> Self {
        Self {
            since_events,
            chunks: Default::default(),
            pending: HashMap::new(),
            generation: 0,
            persisted: 0,
            store_failed: false,
        }
    }

    /// Adds `chunks` in a new generation; returns the newest generation one of them waits
    /// to be saved in (0: all saved).
    fn add(&mut self, chunks: impl IntoIterator<Item = u64>) -> u64 {
        self.generation += 1;
        let generation = self.generation;
        let mut need = 0;
        for c in chunks {
            if self.chunks.insert(c) {
                self.pending.insert(c, generation);
            }
            need = need.max(self.pending.get(&c).copied().unwrap_or(0));
        }
        need
    }
}

struct Inner {
    /// Writes in flight per chunk.
    inflight: HashMap<u64, u32>,
    /// Chunks written since a member flush covered them: the flush epoch at completion.
    recent: HashMap<u64, u64>,
    epoch: u64,
    away: Option<Away>,
}

/// See the module docs.
pub(crate) struct AwayRecord {
    /// Resync sectors per chunk.
    pub chunk_sectors: u64,
    pub chunks: u64,
    store: Option<Arc<dyn AwayStore>>,
    inner: Mutex<Inner>,
}

/// What [`AwayRecord::begin_write`] asks of the caller: save the record (under the metadata
/// lock) up to this generation before the data writes.
pub(crate) struct SaveNeeded(pub u64);

/// Status of the record, for displays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AwayStatus {
    pub since_events: u64,
    pub chunks_written: u64,
    pub chunks: u64,
    pub chunk_sectors: u64,
    /// Saved where the next run finds it (else in memory only).
    pub persisted: bool,
}

impl AwayRecord {
    pub fn new(resync_sectors: u64, store: Option<Arc<dyn AwayStore>>) -> Self {
        let chunk_sectors = chunk_sectors_for(resync_sectors);
        let chunks = resync_sectors.div_ceil(chunk_sectors).max(1);
        debug_assert!(chunks <= MAX_AWAY_CHUNKS);
        Self {
            chunk_sectors,
            chunks,
            store,
            inner: Mutex::new(Inner { inflight: HashMap::new(), recent: HashMap::new(), epoch: 0, away: None }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().expect("away lock")
    }

    pub fn chunk_range(&self, range: &Range<u64>) -> Range<u64> {
        range.start / self.chunk_sectors..range.end.div_ceil(self.chunk_sectors).min(self.chunks)
    }

    /// A write of `chunks` starts. While a member is away, returns the generation to save.
    pub fn begin_write(&self, chunks: Range<u64>) -> Option<SaveNeeded> {
        let mut inner = self.lock();
        for c in chunks.clone() {
            *inner.inflight.entry(c).or_insert(0) += 1;
        }
        let away = inner.away.as_mut()?;
        let need = away.add(chunks);
        (need > away.persisted && self.store.is_some() && !away.store_failed).then_some(SaveNeeded(need))
    }

    /// A write of `chunks` completed (or failed).
    pub fn end_write(&self, chunks: Range<u64>) {
        let mut inner = self.lock();
        let epoch = inner.epoch;
        for c in chunks {
            let n = inner.inflight.get_mut(&c).expect("chunk in flight");
            *n -= 1;
            if *n == 0 {
                inner.inflight.remove(&c);
            }
            inner.recent.insert(c, epoch);
        }
    }

    /// A flush of every live member starts: it covers writes completed before now.
    pub fn flush_started(&self) -> u64 {
        let mut inner = self.lock();
        let epoch = inner.epoch;
        inner.epoch += 1;
        epoch
    }

    /// The flush that started at `epoch` completed on every live member.
    pub fn flush_done(&self, epoch: u64) {
        self.lock().recent.retain(|_, e| *e > epoch);
    }

    /// A member left: begin the record (if not begun) with what it may have missed.
    pub fn begin(&self, since_events: u64) {
        let mut inner = self.lock();
        let missed: Vec<u64> = inner.recent.keys().chain(inner.inflight.keys()).copied().collect();
        inner.away.get_or_insert_with(|| Away::new(since_events)).add(missed);
    }

    /// Starts a record that began at `since_events` with the chunks `written` (from a
    /// stored image, already checked; none after a clean start).
    pub fn resume(&self, since_events: u64, written: impl IntoIterator<Item = u64>) {
        let mut away = Away::new(since_events);
        away.add(written);
        self.lock().away = Some(away);
    }

    /// The image to save now (with the superblocks at `events`), and the generation it
    /// covers; `None` when no member is away, there is no store, or saving failed before.
    pub fn image_to_save(&self, uuid: [u8; 16], events: u64) -> Option<(Vec<u8>, u64)> {
        self.store.as_ref()?;
        let inner = self.lock();
        let away = inner.away.as_ref().filter(|a| !a.store_failed)?;
        let mut bits = vec![0u8; self.chunks.div_ceil(8) as usize];
        for &c in &away.chunks {
            bits[(c / 8) as usize] |= 1 << (c % 8);
        }
        let image = AwayImage {
            uuid,
            since_events: away.since_events,
            valid_events: events,
            chunk_sectors: self.chunk_sectors,
            chunks: self.chunks,
            bits,
        };
        Some((image.encode(), away.generation))
    }

    /// Whether generation `need` is saved already.
    pub fn saved_up_to(&self, need: u64) -> bool {
        self.lock().away.as_ref().is_none_or(|a| a.persisted >= need || a.store_failed)
    }

    /// Saves `image` (covering `generation`); on failure the record stays in memory only
    /// and `false` says the caller must make the stored one stale.
    pub async fn save(&self, image: &[u8], generation: u64) -> bool {
        let Some(store) = &self.store else { return true };
        match store.save(image).await {
            Ok(()) => {
                if let Some(away) = self.lock().away.as_mut() {
                    away.persisted = away.persisted.max(generation);
                    away.pending.retain(|_, g| *g > generation);
                }
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot save the away record: a returning member will be rebuilt whole");
                if let Some(away) = self.lock().away.as_mut() {
                    away.store_failed = true;
                }
                false
            }
        }
    }

    /// The array is whole again: the record ends (and the stored one is removed).
    pub async fn end(&self) {
        if self.lock().away.take().is_none() {
            return;
        }
        if let Some(store) = &self.store
            && let Err(e) = store.remove().await
        {
            // A leftover is harmless: its event count is stale after the next update.
            tracing::warn!(error = %e, "cannot remove the away record");
        }
    }

    pub fn since_events(&self) -> Option<u64> {
        self.lock().away.as_ref().map(|a| a.since_events)
    }

    /// Whether any chunk of resync sectors `range` was written while a member was away.
    pub fn any_written(&self, range: Range<u64>) -> bool {
        let chunks = self.chunk_range(&range);
        let inner = self.lock();
        inner.away.as_ref().is_some_and(|a| chunks.clone().any(|c| a.chunks.contains(&c)))
    }

    pub fn status(&self) -> Option<AwayStatus> {
        let inner = self.lock();
        inner.away.as_ref().map(|a| AwayStatus {
            since_events: a.since_events,
            chunks_written: a.chunks.len() as u64,
            chunks: self.chunks,
            chunk_sectors: self.chunk_sectors,
            persisted: self.store.is_some() && !a.store_failed,
        })
    }
}

/// How [`Array::track_away`] started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AwayStart {
    /// Not used: the array has a bitmap, no redundancy, no metadata, or is read-only.
    Off,
    /// Every role is in sync: the record begins when a member leaves.
    Idle,
    /// Degraded, with the stored record of this away period (`chunks` written so far).
    Resumed { since_events: u64, chunks: u64 },
    /// Degraded after a clean stop without a stored record: members that were in sync at
    /// the stop (events at least `since_events`) copy only what is written from now on.
    Begun { since_events: u64 },
    /// Degraded, no usable record (why): returning members are rebuilt whole.
    Untracked(String),
}

impl std::fmt::Display for AwayStart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AwayStart::Off => write!(f, "not used"),
            AwayStart::Idle => write!(f, "idle (every member in sync)"),
            AwayStart::Resumed { since_events, chunks } => {
                write!(f, "resumed: {chunks} chunks written since event {since_events}")
            }
            AwayStart::Begun { since_events } => write!(f, "begun at event {since_events} (clean start, degraded)"),
            AwayStart::Untracked(why) => write!(f, "none usable ({why}): a returning member is rebuilt whole"),
        }
    }
}

impl<M: Member + ?Sized> Array<M> {
    /// Tracks what is written while a member is away, for arrays with redundancy and md
    /// metadata but no write-intent bitmap (call once, before serving). `stored`: the image
    /// `store` holds, if any; `assembled_events` / `assembled_clean`: the superblocks as
    /// assembled, before this run changed anything.
    pub async fn track_away(
        &self,
        store: Option<Arc<dyn AwayStore>>,
        stored: Option<&[u8]>,
        assembled_events: u64,
        assembled_clean: bool,
    ) -> AwayStart {
        let Some(summary) = self.metadata_summary() else { return AwayStart::Off };
        if self.intent.is_some() || !self.has_redundancy() || self.is_read_only() || self.away.get().is_some() {
            return AwayStart::Off;
        }
        let record = AwayRecord::new(self.layout().geometry().resync_sectors(), store.clone());
        let start = if self.is_optimal() {
            AwayStart::Idle
        } else {
            let image = stored.map(AwayImage::decode).transpose().and_then(|image| match image {
                Some(i) => check_image(&i, summary.uuid, assembled_events, record.chunk_sectors, record.chunks)
                    .map(|()| Some(i)),
                None => Ok(None),
            });
            match image {
                Ok(Some(image)) => {
                    record.resume(image.since_events, (0..image.chunks).filter(|&c| image.is_set(c)));
                    let chunks = record.status().map_or(0, |s| s.chunks_written);
                    AwayStart::Resumed { since_events: image.since_events, chunks }
                }
                Ok(None) if assembled_clean => {
                    record.resume(assembled_events, []);
                    AwayStart::Begun { since_events: assembled_events }
                }
                Ok(None) => AwayStart::Untracked("unclean stop and no stored record".into()),
                Err(why) => AwayStart::Untracked(format!("the stored record: {why}")),
            }
        };
        let active = matches!(start, AwayStart::Resumed { .. } | AwayStart::Begun { .. });
        if self.away.set(record).is_err() {
            return AwayStart::Off;
        }
        let _g = self.locks.lock(META_LOCK_KEY).await;
        if active {
            self.away_save_locked(None).await;
        } else if let (Some(store), Some(_)) = (&store, stored) {
            // In sync, or not to be trusted: the file says nothing true any more.
            if let Err(e) = store.remove().await {
                tracing::warn!(error = %e, "cannot remove the stale away record");
            }
        }
        start
    }

    /// The away record's state (`None`: no member away, or not tracked).
    pub fn away_status(&self) -> Option<AwayStatus> {
        self.away.get().and_then(AwayRecord::status)
    }

    /// A returning member whose superblock events are at least this was up to date when the
    /// away record began: it may be re-added from the record.
    pub fn away_since_events(&self) -> Option<u64> {
        self.away.get().and_then(AwayRecord::since_events)
    }

    /// A member left (it is faulty in memory now; the superblocks say so next): begin the
    /// record. `events_before`: the superblocks' count before the change that failed it.
    pub(super) fn away_begin(&self, events_before: Option<u64>) {
        let Some(record) = self.away.get() else { return };
        let Some(events) = events_before.or_else(|| self.metadata_summary().map(|s| s.events)) else { return };
        record.begin(events);
    }

    /// Saves the record with the superblocks' current event count, unless generation
    /// `need` is saved already (`None`: save now). The caller holds the metadata lock.
    pub(super) async fn away_save_locked(&self, need: Option<u64>) {
        let (Some(record), Some(summary)) = (self.away.get(), self.metadata_summary()) else { return };
        if need.is_some_and(|n| record.saved_up_to(n)) {
            return;
        }
        let Some((image, generation)) = record.image_to_save(summary.uuid, summary.events) else { return };
        if !record.save(&image, generation).await {
            // The file may hold an older record at the current count: make it stale.
            self.persist_changes_locked(StateChange::Dirty).await.ok();
            self.dirty.store(true, std::sync::atomic::Ordering::Release);
        }
    }

    /// After a superblock update: the record ends if the array is whole, else is saved
    /// again with the new event count. The caller holds the metadata lock.
    pub(super) async fn away_after_persist_locked(&self) {
        let Some(record) = self.away.get() else { return };
        if record.since_events().is_none() {
            return;
        }
        if self.is_optimal() {
            record.end().await;
            tracing::info!("every member in sync: the away record ends");
        } else {
            self.away_save_locked(None).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_sizes_stay_bounded() {
        assert_eq!(chunk_sectors_for(0), 128);
        assert_eq!(chunk_sectors_for(128 * 65536), 128);
        assert_eq!(chunk_sectors_for(128 * 65536 + 1), 256);
        let huge = 1u64 << 40;
        assert!(huge.div_ceil(chunk_sectors_for(huge)) <= MAX_AWAY_CHUNKS);
    }

    #[test]
    fn images_round_trip_and_corruption_is_refused() {
        let image = AwayImage {
            uuid: [7; 16],
            since_events: 10,
            valid_events: 12,
            chunk_sectors: 128,
            chunks: 20,
            bits: vec![0b101, 0, 0x8],
        };
        let bytes = image.encode();
        assert_eq!(AwayImage::decode(&bytes).unwrap(), image);
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(AwayImage::decode(&bad).is_err(), "byte {i} flipped was accepted");
        }
        assert!(AwayImage::decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(check_image(&image, [7; 16], 12, 128, 20).is_ok());
        assert!(check_image(&image, [8; 16], 12, 128, 20).is_err());
        assert!(check_image(&image, [7; 16], 13, 128, 20).is_err());
        assert!(check_image(&image, [7; 16], 12, 256, 10).is_err());
    }

    #[test]
    fn a_failing_member_is_owed_what_no_flush_covered() {
        let r = AwayRecord::new(128 * 100, None);
        r.begin_write(0..1);
        r.end_write(0..1);
        r.begin_write(1..2);
        r.end_write(1..2);
        let e = r.flush_started();
        r.begin_write(2..3);
        r.end_write(2..3); // completed during the flush: not covered
        r.flush_done(e);
        r.begin_write(3..4); // in flight
        r.begin(5);
        assert!(!r.any_written(0..256));
        assert!(r.any_written(256..384));
        assert!(r.any_written(384..512));
        r.end_write(3..4);
        assert!(r.begin_write(9..10).is_none(), "no store: nothing to save");
        assert!(r.any_written(9 * 128..9 * 128 + 1));
        assert_eq!(r.status().unwrap().chunks_written, 3);
        assert_eq!(r.since_events(), Some(5));
    }
}
