//! Write-back: choosing what to write (oldest first, merged with its neighbours into
//! stripe-sized runs), writing it, and marking exactly what was written clean.
//!
//! A *run* is written with one `Array::write`. It is seeded by the oldest dirty extent not
//! under a range lock, and is either
//! - a gap-free sequence of dirty extents, grown left and right from the seed through
//!   adjacent unlocked extents up to a cap that is a multiple of the full stripe, so 4 KiB
//!   writes that together cover a stripe reach the engine as one full-stripe write (parity
//!   from the new data alone, no member reads); or
//! - a *stripe fill* (raid4/5/6): when the seed's stripe holds scattered dirty pieces whose
//!   separate read-modify-writes would cost more, the stripe is read once, the dirty pieces
//!   are laid over it and it is written back whole (no further reads). The whole stripe is
//!   range-locked meanwhile, so the clean bytes read cannot change on the members before
//!   they are written back unchanged; a cached write landing in a gap meanwhile stays dirty
//!   (its generation was not part of the fill) and is written later.
//!
//! One step writes up to [`MAX_RUNS_PER_STEP`] runs concurrently; each run holds its range
//! lock until it is marked clean. Transient memory per step: one gather buffer per run, the
//! step's runs totalling about its budget plus one stripe.

use std::borrow::Cow;

use futures::StreamExt;
use futures::stream;

use super::extent_map::{Extent, ExtentMap};
use super::range_locks::RangeLocks;
use super::{RangeGuard, State, WriteCache, clip};
use crate::engine::MAX_IO_BYTES;
use crate::error::Result;
use crate::member::Member;

/// Runs written concurrently by one step.
pub(crate) const MAX_RUNS_PER_STEP: usize = 32;

/// What a writer that finds the cache full writes back before retrying.
pub(crate) const RESERVE_STEP_BYTES: u64 = 1 << 20;

/// What one FLUSH (or trim drain) step writes back.
const FLUSH_STEP_BYTES: u64 = 16 << 20;

/// Cost of one member I/O expressed in bytes transferred, for choosing between a stripe
/// fill and per-piece read-modify-writes (64 KiB: about an SSD's or a cloud volume's ratio of
/// bandwidth to IOPS).
const OP_COST_BYTES: u64 = 64 << 10;

/// raid4/5/6 shape, for pricing a stripe fill.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ParityShape {
    pub chunk_bytes: u64,
    pub data_disks: u64,
    pub parity_disks: u64,
}

impl ParityShape {
    /// Whether reading the whole stripe and writing it back full is cheaper than `runs`
    /// separate read-modify-writes of `dirty_bytes` in total.
    fn fill_pays(&self, runs: u64, dirty_bytes: u64) -> bool {
        let (dd, np) = (self.data_disks, self.parity_disks);
        let stripe_bytes = dd * self.chunk_bytes;
        // Read the data blocks, write data and parity blocks.
        let fill = (2 * dd + np) * OP_COST_BYTES + stripe_bytes + (dd + np) * self.chunk_bytes;
        // Each run reads and writes its data and the parity.
        let rmw = runs * 2 * (1 + np) * OP_COST_BYTES + 2 * (1 + np) * dirty_bytes;
        fill < rmw
    }
}

/// A gap-free range of dirty bytes to write with one array write.
struct Run<'a, M: Member + ?Sized> {
    start: u64,
    /// Clipped pieces in offset order, each `(offset, extent)`; with no gaps unless `fill`.
    pieces: Vec<(u64, Extent)>,
    /// A stripe fill of `[start, fill_end)`: read it, lay the pieces over, write it whole.
    fill_end: Option<u64>,
    /// The run's range lock (none when the caller holds a lock covering it).
    _guard: Option<RangeGuard<'a, M>>,
}

/// A stripe fill: `(start, end, dirty pieces inside)`.
type FillPlan = (u64, u64, Vec<(u64, Extent)>);

impl<M: Member + ?Sized> Run<'_, M> {
    /// Dirty bytes the run writes back.
    fn len_bytes(&self) -> u64 {
        self.pieces.iter().map(|(_, e)| e.len_bytes).sum()
    }

    /// End of the range the run writes (and locks).
    fn end(&self) -> u64 {
        self.fill_end.unwrap_or_else(|| self.pieces.last().map(|(o, e)| o + e.len_bytes).expect("run has pieces"))
    }
}

enum Pick<'a, M: Member + ?Sized> {
    Runs(Vec<Run<'a, M>>),
    /// Eligible data exists but every piece of it is locked by someone else.
    Busy,
    /// Nothing eligible is dirty.
    Clean,
}

impl<M: Member + ?Sized> WriteCache<M> {
    /// One background step: writes back up to about `budget_bytes` of the oldest dirty data
    /// (at least one run), merged into stripe-sized runs. Returns the bytes written back;
    /// 0 when nothing is eligible (all clean, or all being written by others). On failure
    /// the data stays dirty, every later `flush` fails, and the error is returned.
    pub async fn write_back_some(&self, budget_bytes: u64) -> Result<u64> {
        let pick = {
            let mut st = self.state();
            self.pick_runs(&mut st, budget_bytes, u64::MAX)
        };
        match pick {
            Pick::Runs(runs) => self.write_runs(runs).await,
            Pick::Busy | Pick::Clean => Ok(0),
        }
    }

    /// Waits until some dirty data can be written back (dirty and not locked).
    pub async fn wait_for_work(&self) {
        loop {
            let listener = self.budget.changed.listen();
            if self.has_work() {
                return;
            }
            listener.await;
        }
    }

    /// Whether some dirty data is not under a range lock.
    pub(super) fn has_work(&self) -> bool {
        let st = self.state();
        st.extents.oldest(u64::MAX).any(|(_, offset)| {
            let e = st.extents.get(offset).expect("aged extent present");
            !st.locks.overlaps(offset, offset + e.len_bytes)
        })
    }

    /// Writes back every extent with a generation below `before` (FLUSH), waiting for
    /// write-backs of such data that others have in flight.
    pub(super) async fn write_back_before(&self, before: u64) -> Result<()> {
        loop {
            let (pick, listener) = {
                let mut st = self.state();
                let pick = self.pick_runs(&mut st, FLUSH_STEP_BYTES, before);
                let listener = matches!(pick, Pick::Busy).then(|| self.budget.changed.listen());
                (pick, listener)
            };
            match pick {
                Pick::Runs(runs) => {
                    self.write_runs(runs).await?;
                }
                Pick::Busy => listener.expect("listening while busy").await,
                Pick::Clean => return Ok(()),
            }
        }
    }

    /// Writes back the dirty bytes inside `[start, end)`; the caller holds a range lock
    /// covering it (so nothing else writes them meanwhile).
    pub(super) async fn drain_locked(&self, start: u64, end: u64) -> Result<()> {
        let pieces: Vec<(u64, Extent)> = {
            let st = self.state();
            st.extents.overlapping(start, end).map(|(o, e)| clip(o, e, start, end)).collect()
        };
        let mut runs: Vec<Run<'_, M>> = Vec::new();
        for (offset, piece) in pieces {
            match runs.last_mut() {
                // Runs built here have no gaps: their end is where the next piece must start.
                Some(run) if run.end() == offset && offset + piece.len_bytes - run.start <= MAX_IO_BYTES as u64 => {
                    run.pieces.push((offset, piece));
                }
                _ => runs.push(Run { start: offset, pieces: vec![(offset, piece)], fill_end: None, _guard: None }),
            }
        }
        let mut batch = Vec::new();
        let mut batch_bytes = 0;
        for run in runs {
            batch_bytes += run.len_bytes();
            batch.push(run);
            if batch_bytes >= FLUSH_STEP_BYTES || batch.len() >= MAX_RUNS_PER_STEP {
                self.write_runs(std::mem::take(&mut batch)).await?;
                batch_bytes = 0;
            }
        }
        if !batch.is_empty() {
            self.write_runs(batch).await?;
        }
        Ok(())
    }

    /// Chooses runs seeded by the oldest unlocked extents with generation < `before`, up
    /// to `budget_bytes` and [`MAX_RUNS_PER_STEP`] runs, and locks them.
    fn pick_runs<'a>(&'a self, st: &mut State, budget_bytes: u64, before: u64) -> Pick<'a, M> {
        let cap = self.run_cap_bytes(budget_bytes);
        let State { extents, locks, .. } = st;
        let mut runs = Vec::new();
        let mut total = 0;
        let mut busy = false;
        for (_, offset) in extents.oldest(before) {
            let seed = extents.get(offset).expect("aged extent present");
            if locks.overlaps(offset, offset + seed.len_bytes) {
                busy = true;
                continue;
            }
            let run = match self.stripe_fill(extents, locks, offset) {
                Some((start, end, pieces)) => Run { start, pieces, fill_end: Some(end), _guard: None },
                None => {
                    let pieces = grow_run(extents, locks, offset, cap);
                    Run { start: pieces[0].0, pieces, fill_end: None, _guard: None }
                }
            };
            let run_end = run.end();
            locks.insert(run.start, run_end);
            total += run_end - run.start;
            runs.push(run);
            if total >= budget_bytes || runs.len() >= MAX_RUNS_PER_STEP {
                break;
            }
        }
        // Guards only now, past every assertion: a guard dropped while unwinding here would
        // relock the state mutex this thread holds.
        for run in &mut runs {
            run._guard = Some(RangeGuard { cache: self, start: run.start });
        }
        match (runs.is_empty(), busy) {
            (false, _) => Pick::Runs(runs),
            (true, true) => Pick::Busy,
            (true, false) => Pick::Clean,
        }
    }

    /// The stripe fill for the seed at `seed_offset`, if one pays: `(start, end, pieces)`.
    fn stripe_fill(&self, extents: &ExtentMap, locks: &RangeLocks, seed_offset: u64) -> Option<FillPlan> {
        let shape = self.parity_shape?;
        let stripe = self.stripe_bytes;
        let seed = extents.get(seed_offset).expect("seed present");
        let start = seed_offset / stripe * stripe;
        let end = start + stripe;
        if seed_offset + seed.len_bytes > end || locks.overlaps(start, end) {
            return None;
        }
        debug_assert!(end <= self.array.size_bytes());
        let pieces: Vec<(u64, Extent)> = extents.overlapping(start, end).map(|(o, e)| clip(o, e, start, end)).collect();
        let dirty: u64 = pieces.iter().map(|(_, e)| e.len_bytes).sum();
        let gaps = pieces.windows(2).filter(|w| w[0].0 + w[0].1.len_bytes != w[1].0).count() as u64;
        if dirty == stripe || !shape.fill_pays(gaps + 1, dirty) {
            return None;
        }
        Some((start, end, pieces))
    }

    /// Largest run: the budget rounded down to whole stripes, at least one stripe, at most
    /// what the engine takes in one write.
    fn run_cap_bytes(&self, budget_bytes: u64) -> u64 {
        let stripe = self.stripe_bytes;
        let max = MAX_IO_BYTES as u64;
        if stripe >= max {
            return max;
        }
        (budget_bytes.max(stripe) / stripe * stripe).min(max / stripe * stripe)
    }

    /// Writes the runs (concurrently) and marks clean what each wrote, if still current.
    async fn write_runs(&self, runs: Vec<Run<'_, M>>) -> Result<u64> {
        // Futures collected first: a `Map` closure inside the stream would make the future
        // not `Send` for every lifetime (rustc's higher-ranked inference limits).
        let writes: Vec<_> = runs.iter().map(|run| self.write_run(run)).collect();
        let results: Vec<Result<()>> = stream::iter(writes).buffered(MAX_RUNS_PER_STEP).collect().await;
        let mut written = 0;
        let mut first_error = None;
        {
            let mut st = self.state();
            for (run, result) in runs.iter().zip(results) {
                match result {
                    Ok(()) => {
                        for (offset, piece) in &run.pieces {
                            let generation = piece.generation;
                            st.extents.remove_where(*offset, offset + piece.len_bytes, |g| g == generation);
                        }
                        written += run.len_bytes();
                    }
                    Err(e) => {
                        tracing::error!(offset = run.start, len = run.len_bytes(), error = %e, "write-back failed");
                        st.failure.get_or_insert_with(|| (e.kind, e.to_string()));
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        // Range guards drop here, outside the state lock.
        drop(runs);
        match first_error {
            Some(e) => Err(e),
            None => Ok(written),
        }
    }
}

impl<M: Member + ?Sized> WriteCache<M> {
    /// One array write of a run (gathered into one buffer when it has several pieces).
    async fn write_run(&self, run: &Run<'_, M>) -> Result<()> {
        if let Some(end) = run.fill_end {
            let mut stripe = self.array.read(run.start, (end - run.start) as usize).await?.to_vec();
            for (offset, piece) in &run.pieces {
                let at = (offset - run.start) as usize;
                stripe[at..at + piece.len_bytes as usize].copy_from_slice(piece.bytes());
            }
            crate::copy_count::copied(run.pieces.iter().map(|(_, piece)| piece.len_bytes as usize).sum());
            return self.array.write(run.start, &stripe, false).await;
        }
        let data: Cow<'_, [u8]> = match run.pieces.as_slice() {
            [(_, only)] => Cow::Borrowed(only.bytes()),
            pieces => {
                let mut gathered = Vec::with_capacity(run.len_bytes() as usize);
                pieces.iter().for_each(|(_, e)| gathered.extend_from_slice(e.bytes()));
                crate::copy_count::copied(gathered.len());
                Cow::Owned(gathered)
            }
        };
        self.array.write(run.start, &data, false).await
    }
}

/// The gap-free run of unlocked extents around the one at `seed_offset`, at most `cap_bytes`
/// (the seed alone may exceed it).
fn grow_run(extents: &ExtentMap, locks: &RangeLocks, seed_offset: u64, cap_bytes: u64) -> Vec<(u64, Extent)> {
    let seed = extents.get(seed_offset).expect("seed present");
    let (mut start, mut end) = (seed_offset, seed_offset + seed.len_bytes);
    let mut left = Vec::new();
    while let Some((offset, e)) = extents.ending_at(start) {
        if end - offset > cap_bytes || locks.overlaps(offset, start) {
            break;
        }
        left.push((offset, e.clone()));
        start = offset;
    }
    let mut pieces: Vec<(u64, Extent)> = left.into_iter().rev().collect();
    pieces.push((seed_offset, seed.clone()));
    while let Some(e) = extents.get(end) {
        if end + e.len_bytes - start > cap_bytes || locks.overlaps(end, end + e.len_bytes) {
            break;
        }
        pieces.push((end, e.clone()));
        end += e.len_bytes;
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripe_fill_pays_for_scattered_small_pieces_only() {
        let raid5 = ParityShape { chunk_bytes: 64 << 10, data_disks: 3, parity_disks: 1 };
        assert!(!raid5.fill_pays(1, 4096), "one 4 KiB read-modify-write is cheaper than a stripe");
        assert!(!raid5.fill_pays(3, 3 * 4096));
        assert!(raid5.fill_pays(4, 4 * 4096), "four scattered pieces: one stripe read + write wins");
        let big_chunks = ParityShape { chunk_bytes: 512 << 10, ..raid5 };
        assert!(!big_chunks.fill_pays(4, 4 * 4096), "a 1.5 MiB stripe needs more pieces");
        assert!(big_chunks.fill_pays(16, 16 * 4096));
        let raid6 = ParityShape { parity_disks: 2, data_disks: 2, ..raid5 };
        assert!(raid6.fill_pays(2, 2 * 4096), "raid6 read-modify-write is dearer");
    }
}
