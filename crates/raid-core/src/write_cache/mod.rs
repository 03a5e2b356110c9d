//! `WriteCache<M>`: a bounded in-memory write-back cache in front of an [`Array`].
//!
//! ```text
//!   write ──► copy into a Chunk, index it (ExtentMap), acknowledge      (no member I/O)
//!   read  ──► array read, then the dirty cached bytes laid over it      (or cache only)
//!   write_back_some ─► oldest dirty extent + its adjacent neighbours as one array write
//!                      (sequential small writes become full-stripe writes: no reads),
//!                      or, raid4/5/6, its whole stripe when scattered dirty pieces would
//!                      cost more as separate read-modify-writes (read once, write full)
//!   flush ──► write back everything acknowledged before the call, then array.flush()
//!   fua write, write larger than the cache, trim, write_zeroes ──► straight to the array,
//!                      ordered against cached copies of the same bytes (below)
//! ```
//!
//! Contract:
//! - Every read sees every write acknowledged before it started (the cache is shared by
//!   all connections of an export).
//! - `flush` returns once every write acknowledged before the call is on the members and
//!   the members are flushed. A write with `fua` is durable when it returns.
//! - Memory: cached data plus [`CHUNK_OVERHEAD_BYTES`] per write never exceeds the
//!   capacity (bytes still referenced by an in-flight write-back or read count too). A
//!   writer that does not fit writes back the oldest data itself first (backpressure); a
//!   single write larger than the whole capacity goes straight to the array. On top of
//!   that, each write-back in flight allocates one gather buffer for runs of several
//!   extents (at most [`MAX_IO_BYTES`](crate::engine::MAX_IO_BYTES) per run).
//! - Errors: data that fails to write back stays cached (reads still see it) and is retried
//!   later; from then on every `flush` returns an error, like the page cache's EIO on
//!   fsync: the cache can no longer promise that acknowledged data reached the members.
//!
//! Ordering, the subtle part. Each cached write gets a generation number. Member writes of
//! the same bytes are serialised by `RangeLocks`: a write-back run or a direct operation
//! holds its byte range while its array I/O is in flight, and write-back skips locked
//! ranges. A finished write-back marks clean only the bytes whose generation is still the
//! one it wrote, so a newer write that arrived meanwhile stays dirty and is written later
//! (after, since the range was locked). A direct operation takes its range lock, does the
//! array I/O, and only then drops the cached bytes it superseded (generations older than
//! itself): until then reads keep seeing them, never the stale member bytes below.
//!
//! No runtime: every method is an async fn over `futures`; waiting uses `event-listener`.
//! The caller drives background write-back (`wait_for_work` + `write_back_some` in a loop).
//! The state mutex is a std mutex never held across an await.

mod budget;
mod extent_map;
mod range_locks;
mod read_overlay;
mod writeback;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::SECTOR_BYTES;
use crate::allocation::Allocation;
use crate::engine::Array;
use crate::error::{ErrorKind, RaidError, Result};
use crate::member::Member;
use crate::read_data::ReadData;
use crate::volume::{Volume, VolumeFuture};
pub use budget::CHUNK_OVERHEAD_BYTES;
use budget::{Budget, Chunk};
use extent_map::{Extent, ExtentMap};
use range_locks::RangeLocks;

/// Default capacity, as `raidnbd serve --cache-size`.
pub const DEFAULT_CAPACITY_BYTES: u64 = 256 << 20;

struct State {
    extents: ExtentMap,
    locks: RangeLocks,
    next_generation: u64,
    /// First write-back failure: (kind, message); sticky.
    failure: Option<(ErrorKind, String)>,
}

/// A write-back cache over one array. Share it (`Arc`) between all connections.
pub struct WriteCache<M: Member + ?Sized> {
    array: Arc<Array<M>>,
    budget: Arc<Budget>,
    state: Mutex<State>,
    /// Write-back merge unit: the full stripe (raid4/5/6) or the optimal I/O size.
    stripe_bytes: u64,
    /// raid4/5/6: what a stripe fill costs (see `writeback.rs`).
    parity_shape: Option<writeback::ParityShape>,
}

/// Holds `[start, ..)` in the range locks; releases it (and wakes waiters) on drop.
/// Never dropped while the state mutex is held.
struct RangeGuard<'a, M: Member + ?Sized> {
    cache: &'a WriteCache<M>,
    start: u64,
}

impl<M: Member + ?Sized> Drop for RangeGuard<'_, M> {
    fn drop(&mut self) {
        self.cache.state.lock().unwrap_or_else(PoisonError::into_inner).locks.remove(self.start);
        self.cache.budget.notify();
    }
}

impl<M: Member + ?Sized> WriteCache<M> {
    /// A cache of at most `capacity_bytes` (data plus per-write overhead) over `array`.
    pub fn new(array: Arc<Array<M>>, capacity_bytes: u64) -> Self {
        let geometry = array.geometry();
        let stripe_bytes = match geometry.parity() {
            Some(pg) => pg.stripe_data_sectors() * SECTOR_BYTES,
            None => geometry.optimal_io_bytes(),
        };
        let parity_shape = geometry.parity().map(|pg| writeback::ParityShape {
            chunk_bytes: u64::from(pg.chunk_sectors()) * SECTOR_BYTES,
            data_disks: pg.data_disks() as u64,
            parity_disks: pg.parity_disks() as u64,
        });
        Self {
            array,
            budget: Arc::new(Budget::new(capacity_bytes)),
            state: Mutex::new(State {
                extents: ExtentMap::default(),
                locks: RangeLocks::default(),
                next_generation: 1,
                failure: None,
            }),
            stripe_bytes: stripe_bytes.max(SECTOR_BYTES),
            parity_shape,
        }
    }

    pub fn array(&self) -> &Arc<Array<M>> {
        &self.array
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.budget.capacity_bytes()
    }

    /// Bytes of acknowledged data not yet written back.
    pub fn dirty_bytes(&self) -> u64 {
        self.state().extents.dirty_bytes()
    }

    /// Memory charged right now (cached data, data still held by write-backs or reads,
    /// per-write overhead); never above [`WriteCache::capacity_bytes`].
    pub fn used_bytes(&self) -> u64 {
        self.budget.used_bytes()
    }

    /// The write-back failure every `flush` reports, if one happened.
    pub fn failure(&self) -> Option<RaidError> {
        self.state().failure.as_ref().map(|(kind, message)| failure_error(*kind, message))
    }

    /// Reads `len_bytes` at `offset_bytes`: the array's bytes with every dirty cached byte
    /// laid over them (no array read when the cache holds the whole range).
    pub async fn read(&self, offset_bytes: u64, len_bytes: usize) -> Result<ReadData> {
        self.array.check_io(offset_bytes, len_bytes as u64, true)?;
        let end = offset_bytes + len_bytes as u64;
        let cached: Vec<(u64, Extent)> = {
            let st = self.state();
            st.extents.overlapping(offset_bytes, end).map(|(o, e)| clip(o, e, offset_bytes, end)).collect()
        };
        if cached.iter().map(|(_, e)| e.len_bytes).sum::<u64>() == len_bytes as u64 && len_bytes > 0 {
            return Ok(read_overlay::from_cache(offset_bytes, len_bytes, &cached));
        }
        let mut data = self.array.read(offset_bytes, len_bytes).await?;
        read_overlay::overlay(&mut data, offset_bytes, &cached);
        Ok(data)
    }

    /// `base:allocation`: the array's, up to the first cached byte; cached bytes are data.
    /// The cache is looked at before the array is asked, so a write the cache writes back
    /// meanwhile is in the array by then.
    pub async fn block_status(&self, offset_bytes: u64, len_bytes: u64) -> Result<Vec<Allocation>> {
        self.array.check_io(offset_bytes, len_bytes, false)?;
        let end = offset_bytes + len_bytes;
        let first_cached = {
            let st = self.state();
            st.extents.overlapping(offset_bytes, end).next().map(|(o, e)| (o, (o + e.len_bytes).min(end)))
        };
        match first_cached {
            Some((start, cached_end)) if start <= offset_bytes => Ok(vec![Allocation::data(cached_end - offset_bytes)]),
            Some((start, _)) => self.array.block_status(offset_bytes, start - offset_bytes).await,
            None => self.array.block_status(offset_bytes, len_bytes).await,
        }
    }

    /// Writes `data` at `offset_bytes`. Cached and acknowledged at once unless `fua` (then
    /// written through and durable on return) or larger than the whole cache (written
    /// around). Waits (writing back old data itself) when the cache is full.
    pub async fn write(&self, offset_bytes: u64, data: &[u8], fua: bool) -> Result<()> {
        self.array.check_io(offset_bytes, data.len() as u64, true)?;
        if data.is_empty() {
            return Ok(());
        }
        let charge_bytes = data.len() as u64 + CHUNK_OVERHEAD_BYTES;
        if fua || charge_bytes > self.capacity_bytes() {
            let end = offset_bytes + data.len() as u64;
            return self.direct(offset_bytes, end, self.array.write(offset_bytes, data, fua)).await;
        }
        let charge = self.reserve(charge_bytes).await?;
        let chunk = Arc::new(Chunk::new(data, charge));
        {
            let mut st = self.state();
            let generation = st.take_generation();
            st.extents
                .insert(offset_bytes, Extent { len_bytes: data.len() as u64, generation, chunk, chunk_offset: 0 });
        }
        self.budget.notify();
        Ok(())
    }

    /// Makes every write acknowledged before the call durable on the members: writes it
    /// back (waiting for write-backs already in flight), then flushes the array. Fails if
    /// any write-back ever failed (see the module docs).
    pub async fn flush(&self) -> Result<()> {
        let before = self.state().next_generation;
        self.write_back_before(before).await?;
        self.array.flush().await?;
        match self.failure() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Discards a range (a hint, as [`Array::trim`]). Cached data in the range is written
    /// back first, so the result is exactly what the array alone would give.
    pub async fn trim(&self, offset_bytes: u64, len_bytes: u64, fua: bool) -> Result<()> {
        self.array.check_io(offset_bytes, len_bytes, false)?;
        if len_bytes == 0 {
            return self.array.trim(offset_bytes, 0, fua).await;
        }
        let end = offset_bytes + len_bytes;
        let _guard = self.lock_range(offset_bytes, end).await;
        self.drain_locked(offset_bytes, end).await?;
        self.array.trim(offset_bytes, len_bytes, fua).await
    }

    /// Zeroes a range (as [`Array::write_zeroes`]); cached data in it is superseded.
    pub async fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64, may_deallocate: bool, fua: bool) -> Result<()> {
        self.array.check_io(offset_bytes, len_bytes, false)?;
        if len_bytes == 0 {
            return self.array.write_zeroes(offset_bytes, 0, may_deallocate, fua).await;
        }
        let end = offset_bytes + len_bytes;
        self.direct(offset_bytes, end, self.array.write_zeroes(offset_bytes, len_bytes, may_deallocate, fua)).await
    }

    /// Runs an array operation that overwrites `[start, end)` on the members, ordered
    /// against cached copies: waits for write-backs of the range, keeps new write-backs of
    /// it out while `op` runs, then drops the cached bytes `op` superseded.
    async fn direct(&self, start: u64, end: u64, op: impl Future<Output = Result<()>>) -> Result<()> {
        let guard = self.lock_range(start, end).await;
        let op_generation = self.state().take_generation();
        op.await?;
        self.state().extents.remove_where(start, end, |g| g < op_generation);
        drop(guard);
        Ok(())
    }

    /// Reserves memory for a cached write, writing back the oldest data when full.
    async fn reserve(&self, bytes: u64) -> Result<budget::Charge> {
        loop {
            if let Some(charge) = self.budget.try_charge(bytes) {
                return Ok(charge);
            }
            if self.write_back_some(writeback::RESERVE_STEP_BYTES).await? > 0 {
                continue;
            }
            // Everything dirty is being written by others (or memory is held by reads):
            // wait for a change, re-checking after listening so no wake-up is lost.
            let listener = self.budget.changed.listen();
            if let Some(charge) = self.budget.try_charge(bytes) {
                return Ok(charge);
            }
            if self.has_work() {
                continue;
            }
            listener.await;
        }
    }

    /// Waits until no held range overlaps `[start, end)`, then holds it.
    async fn lock_range(&self, start: u64, end: u64) -> RangeGuard<'_, M> {
        debug_assert!(start < end);
        loop {
            let listener = {
                let mut st = self.state();
                if !st.locks.overlaps(start, end) {
                    st.locks.insert(start, end);
                    return RangeGuard { cache: self, start };
                }
                self.budget.changed.listen()
            };
            listener.await;
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("write cache state lock")
    }
}

impl State {
    fn take_generation(&mut self) -> u64 {
        let generation = self.next_generation;
        self.next_generation += 1;
        generation
    }
}

/// The part of the extent at `offset` inside `[start, end)`.
fn clip(offset: u64, extent: &Extent, start: u64, end: u64) -> (u64, Extent) {
    let from = offset.max(start);
    let to = (offset + extent.len_bytes).min(end);
    (from, extent.slice(from - offset, to - from))
}

fn failure_error(kind: ErrorKind, message: &str) -> RaidError {
    RaidError::new(kind, format!("cached writes could not be written to the array (data stays cached): {message}"))
}

/// The cache is a volume stacked on its array (no in-place paths: every byte goes through
/// the cache).
impl<M: Member + ?Sized + 'static> Volume for WriteCache<M> {
    fn size_bytes(&self) -> u64 {
        self.array.size_bytes()
    }
    fn read(&self, offset_bytes: u64, len_bytes: usize) -> VolumeFuture<'_, ReadData> {
        Box::pin(WriteCache::read(self, offset_bytes, len_bytes))
    }
    fn write<'a>(&'a self, offset_bytes: u64, data: &'a [u8], fua: bool) -> VolumeFuture<'a, ()> {
        Box::pin(WriteCache::write(self, offset_bytes, data, fua))
    }
    fn flush(&self) -> VolumeFuture<'_, ()> {
        Box::pin(WriteCache::flush(self))
    }
    fn can_trim(&self) -> bool {
        Volume::can_trim(&*self.array)
    }
    fn trim(&self, offset_bytes: u64, len_bytes: u64, fua: bool) -> VolumeFuture<'_, ()> {
        Box::pin(WriteCache::trim(self, offset_bytes, len_bytes, fua))
    }
    fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64, may_deallocate: bool, fua: bool) -> VolumeFuture<'_, ()> {
        Box::pin(WriteCache::write_zeroes(self, offset_bytes, len_bytes, may_deallocate, fua))
    }
    fn block_status(&self, offset_bytes: u64, len_bytes: u64) -> VolumeFuture<'_, Vec<Allocation>> {
        Box::pin(WriteCache::block_status(self, offset_bytes, len_bytes))
    }
    fn cache(&self, offset_bytes: u64, len_bytes: u64) -> VolumeFuture<'_, ()> {
        Box::pin(self.array.cache(offset_bytes, len_bytes))
    }
    fn sync_status(&self, offset_bytes: u64, len_bytes: u64) -> Result<Vec<(u64, u32)>> {
        self.array.sync_status(offset_bytes, len_bytes)
    }
}
