//! Write intent: the engine side of md's write-intent bitmap.
//!
//! Before any member write, the bits of the resync chunks it touches must be durable on
//! every member; after the writes complete and a later member flush made them durable, a
//! sweep clears the bits that saw no writes for a whole sweep interval (md clears after two
//! daemon passes). After an unclean stop only chunks whose bit is set need a resync, and
//! bits are kept while the array is degraded or resyncing.
//!
//! Ordering, the part that is easy to get wrong:
//! - A writer never issues data writes before its chunks' bits are durable, even when
//!   another writer set the bit first and is still writing the bitmap (generations).
//! - A sweep clears on disk only bits that are still clear in memory when it writes, so a
//!   bit re-set by a writer after the sweep decided is never lost.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::away::{AwayRecord, SaveNeeded};
use super::{Array, META_LOCK_KEY, StateChange};
use crate::error::Result;
use crate::member::Member;

struct Inner {
    /// Bits set in memory (durable once their generation is persisted).
    set: HashSet<u64>,
    /// Set bits not yet persisted, with the generation that set them.
    pending: HashMap<u64, u64>,
    generation: u64,
    persisted: u64,
    inflight: HashMap<u64, u32>,
    /// Chunks written since the last sweep.
    touched: HashSet<u64>,
    /// Bumped when the bits change meaning (a resize): a sweep decided before does nothing.
    epoch: u64,
}

pub(crate) struct WriteIntent {
    /// Resync sectors per bit, and bits: they change only with a resize, while nothing is
    /// in flight.
    chunk_sectors: AtomicU64,
    chunks: AtomicU64,
    inner: Mutex<Inner>,
}

/// Chunks with writes in flight (bitmap and away record); released on drop.
pub(crate) struct IntentGuard<'a> {
    intent: Option<&'a WriteIntent>,
    chunks: Range<u64>,
    away: Option<(&'a AwayRecord, Range<u64>)>,
}

impl Inner {
    /// A set bit nobody is writing under, that was not written since the last sweep and
    /// is persisted.
    fn clearable(&self, chunk: u64) -> bool {
        !self.inflight.contains_key(&chunk) && !self.touched.contains(&chunk) && !self.pending.contains_key(&chunk)
    }
}

impl Drop for IntentGuard<'_> {
    fn drop(&mut self) {
        if let Some((away, chunks)) = self.away.take() {
            away.end_write(chunks);
        }
        let Some(intent) = self.intent else { return };
        let mut inner = intent.inner.lock().expect("intent lock");
        for c in self.chunks.clone() {
            let n = inner.inflight.get_mut(&c).expect("chunk in flight");
            *n -= 1;
            if *n == 0 {
                inner.inflight.remove(&c);
            }
        }
    }
}

impl WriteIntent {
    pub fn new(chunk_sectors: u64, chunks: u64, dirty: &[u64]) -> Self {
        assert!(chunk_sectors > 0);
        WriteIntent {
            chunk_sectors: AtomicU64::new(chunk_sectors),
            chunks: AtomicU64::new(chunks),
            inner: Mutex::new(Inner {
                set: dirty.iter().copied().collect(),
                pending: HashMap::new(),
                generation: 0,
                persisted: 0,
                inflight: HashMap::new(),
                touched: HashSet::new(),
                epoch: 0,
            }),
        }
    }

    /// Resync sectors per bit.
    pub fn chunk_sectors(&self) -> u64 {
        self.chunk_sectors.load(Ordering::Acquire)
    }

    /// Bits in the bitmap.
    pub fn chunks(&self) -> u64 {
        self.chunks.load(Ordering::Acquire)
    }

    /// The array's size changed (md's `md_bitmap_resize`): `chunks` bits of `chunk_sectors`
    /// (never smaller than before), each set bit kept in the bit that covers its range now,
    /// bits past the end dropped, and `dirty` (new space, to be resynced) set. Only while no
    /// write is in flight (asserted) and under the metadata lock, which the store's copy of
    /// the bitmap changes under too.
    pub fn resize(&self, chunk_sectors: u64, chunks: u64, dirty: Range<u64>) {
        let old = self.chunk_sectors();
        assert!(chunk_sectors >= old && chunk_sectors.is_multiple_of(old), "bitmap chunk {old} -> {chunk_sectors}");
        let mut inner = self.lock();
        assert!(inner.inflight.is_empty(), "a bitmap resize with writes in flight");
        let factor = chunk_sectors / old;
        let remap = |set: &mut HashSet<u64>| *set = set.iter().map(|c| c / factor).filter(|&c| c < chunks).collect();
        remap(&mut inner.set);
        remap(&mut inner.touched);
        let pending: HashMap<u64, u64> =
            inner.pending.iter().map(|(&c, &g)| (c / factor, g)).filter(|&(c, _)| c < chunks).collect();
        inner.pending = pending;
        inner.set.extend(dirty.start.min(chunks)..dirty.end.min(chunks));
        inner.epoch += 1;
        self.chunk_sectors.store(chunk_sectors, Ordering::Release);
        self.chunks.store(chunks, Ordering::Release);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("intent lock")
    }

    /// Whether any chunk of resync sectors `range` has its bit set.
    pub fn any_set(&self, range: Range<u64>) -> bool {
        let inner = self.lock();
        let chunk = self.chunk_sectors();
        (range.start / chunk..range.end.div_ceil(chunk)).any(|c| inner.set.contains(&c))
    }

    pub fn dirty_chunks(&self) -> u64 {
        self.lock().set.len() as u64
    }
}

impl<M: Member + ?Sized> Array<M> {
    /// Bitmap chunks currently marked dirty (`None` without a bitmap).
    pub(crate) fn dirty_bitmap_chunks(&self) -> Option<u64> {
        self.intent.as_ref().map(WriteIntent::dirty_chunks)
    }

    /// Marks resync sectors `range` as being written and waits until that is durable (in
    /// the bitmap, or in the away record while a member is away).
    pub(crate) async fn intent_begin(&self, range: Range<u64>) -> Result<IntentGuard<'_>> {
        let away = self.away.get().map(|a| (a, a.chunk_range(&range)));
        let save = away.as_ref().and_then(|(record, chunks)| record.begin_write(chunks.clone()));
        // From here the guard releases what was taken, also if this future is dropped.
        let mut guard = IntentGuard { intent: None, chunks: 0..0, away };
        if let Some(SaveNeeded(need)) = save {
            let _g = self.locks.lock(META_LOCK_KEY).await;
            self.away_save_locked(Some(need)).await;
        }
        let Some(intent) = &self.intent else { return Ok(guard) };
        let (need, chunks) = {
            let mut inner = intent.lock();
            // Read under the lock: a resize changes them under it.
            let chunk = intent.chunk_sectors();
            let chunks = range.start / chunk..range.end.div_ceil(chunk).min(intent.chunks());
            let mut need = 0;
            inner.generation += 1;
            let generation = inner.generation;
            for c in chunks.clone() {
                *inner.inflight.entry(c).or_insert(0) += 1;
                inner.touched.insert(c);
                if inner.set.insert(c) {
                    inner.pending.insert(c, generation);
                }
                need = need.max(inner.pending.get(&c).copied().unwrap_or(0));
            }
            ((need > inner.persisted).then_some(need), chunks)
        };
        guard.intent = Some(intent);
        guard.chunks = chunks;
        if let Some(need) = need {
            let _g = self.locks.lock(META_LOCK_KEY).await;
            let (set, generation) = {
                let mut inner = intent.lock();
                if inner.persisted >= need {
                    (Vec::new(), inner.persisted)
                } else {
                    let set: Vec<u64> = inner.pending.drain().map(|(c, _)| c).collect();
                    (set, inner.generation)
                }
            };
            if !set.is_empty() {
                self.persist_locked(StateChange::Bitmap { set, clear: Vec::new() }).await;
                let mut inner = intent.lock();
                inner.persisted = inner.persisted.max(generation);
            }
        }
        Ok(guard)
    }

    /// One sweep: clears bits of chunks not written since the previous sweep, after a
    /// member flush made their data durable. Skipped while degraded or resyncing.
    pub(crate) async fn intent_sweep(&self) -> Result<u64> {
        let Some(intent) = &self.intent else { return Ok(0) };
        if !self.members.is_optimal() || self.maintenance().status().resync_pending {
            return Ok(0);
        }
        let (candidates, epoch): (Vec<u64>, u64) = {
            let mut inner = intent.lock();
            let c = inner.set.iter().copied().filter(|&c| inner.clearable(c)).collect();
            inner.touched.clear();
            (c, inner.epoch)
        };
        if candidates.is_empty() {
            return Ok(0);
        }
        self.flush().await?;
        let _g = self.locks.lock(META_LOCK_KEY).await;
        let clear: Vec<u64> = {
            let mut inner = intent.lock();
            if inner.epoch != epoch {
                return Ok(0);
            }
            let clear: Vec<u64> = candidates.into_iter().filter(|&c| inner.clearable(c)).collect();
            for c in &clear {
                inner.set.remove(c);
            }
            clear
        };
        let n = clear.len() as u64;
        if n > 0 {
            self.persist_locked(StateChange::Bitmap { set: Vec::new(), clear }).await;
        }
        Ok(n)
    }

    /// Clears every bit (orderly stop, after the final flush).
    pub(crate) async fn intent_clear_all_locked(&self) {
        let Some(intent) = &self.intent else { return };
        let clear: Vec<u64> = {
            let mut inner = intent.lock();
            if !inner.inflight.is_empty() {
                return;
            }
            inner.pending.clear();
            inner.touched.clear();
            inner.set.drain().collect()
        };
        if !clear.is_empty() {
            self.persist_locked(StateChange::Bitmap { set: Vec::new(), clear }).await;
        }
    }
}
