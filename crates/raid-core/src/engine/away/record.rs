//! The away record in memory: chunks with writes in flight, chunks written since the last
//! member flush that completed, and, while a member is away, every chunk written since it
//! left (with the generation that added it, for saving before the data writes).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::AwayStore;
use super::image::{AwayImage, MAX_AWAY_CHUNKS, chunk_sectors_for};

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
    /// Resync sectors per chunk, and chunks: they change only with a resize of the array,
    /// while no member is away and nothing is in flight.
    chunk_sectors: AtomicU64,
    chunks: AtomicU64,
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
            chunk_sectors: AtomicU64::new(chunk_sectors),
            chunks: AtomicU64::new(chunks),
            store,
            inner: Mutex::new(Inner { inflight: HashMap::new(), recent: HashMap::new(), epoch: 0, away: None }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().expect("away lock")
    }

    /// Resync sectors per chunk.
    pub fn chunk_sectors(&self) -> u64 {
        self.chunk_sectors.load(Ordering::Acquire)
    }

    pub fn chunks(&self) -> u64 {
        self.chunks.load(Ordering::Acquire)
    }

    pub fn chunk_range(&self, range: &Range<u64>) -> Range<u64> {
        let chunk = self.chunk_sectors();
        range.start / chunk..range.end.div_ceil(chunk).min(self.chunks())
    }

    /// The array's resync space is `resync_sectors` now (a resize): chunks as a record for
    /// that size has them (as the next run makes it), the recently written ones kept in
    /// the chunks that cover them. Only while no member is away and no write is in flight
    /// (asserted).
    pub fn resize(&self, resync_sectors: u64) {
        let mut inner = self.lock();
        assert!(inner.away.is_none() && inner.inflight.is_empty(), "an away record resized while in use");
        let (old, new) = (self.chunk_sectors(), chunk_sectors_for(resync_sectors));
        let chunks = resync_sectors.div_ceil(new).max(1);
        let recent: HashMap<u64, u64> = inner
            .recent
            .iter()
            .flat_map(|(&c, &epoch)| {
                let sectors = c * old..(c + 1) * old;
                (sectors.start / new..sectors.end.div_ceil(new)).map(move |n| (n, epoch))
            })
            .filter(|&(n, _)| n < chunks)
            .collect();
        inner.recent = recent;
        self.chunk_sectors.store(new, Ordering::Release);
        self.chunks.store(chunks, Ordering::Release);
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
        let mut bits = vec![0u8; self.chunks().div_ceil(8) as usize];
        for &c in &away.chunks {
            bits[(c / 8) as usize] |= 1 << (c % 8);
        }
        let image = AwayImage {
            uuid,
            since_events: away.since_events,
            valid_events: events,
            chunk_sectors: self.chunk_sectors(),
            chunks: self.chunks(),
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
            chunks: self.chunks(),
            chunk_sectors: self.chunk_sectors(),
            persisted: self.store.is_some() && !a.store_failed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
