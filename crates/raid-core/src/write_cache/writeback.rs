//! Write-back: choosing what to write (oldest first, merged with its neighbours into
//! stripe-sized runs), writing it, and marking exactly what was written clean.
//!
//! A *run* is a gap-free sequence of dirty extents written with one `Array::write`. Runs
//! are seeded by the oldest dirty extent not under a range lock, then grown left and right
//! through adjacent unlocked extents up to a cap that is a multiple of the full stripe, so
//! 4 KiB writes that together cover a stripe reach the engine as one full-stripe write
//! (parity from the new data alone, no member reads). One step writes up to
//! [`MAX_RUNS_PER_STEP`] runs concurrently; each run holds its range lock until it is
//! marked clean.

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

/// A gap-free range of dirty bytes to write with one array write.
struct Run<'a, M: Member + ?Sized> {
    start: u64,
    /// Clipped pieces in offset order, each `(offset, extent)`, with no gaps.
    pieces: Vec<(u64, Extent)>,
    /// The run's range lock (none when the caller holds a lock covering it).
    _guard: Option<RangeGuard<'a, M>>,
}

impl<M: Member + ?Sized> Run<'_, M> {
    fn len_bytes(&self) -> u64 {
        self.pieces.iter().map(|(_, e)| e.len_bytes).sum()
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
                Some(run)
                    if run.start + run.len_bytes() == offset
                        && run.len_bytes() + piece.len_bytes <= MAX_IO_BYTES as u64 =>
                {
                    run.pieces.push((offset, piece));
                }
                _ => runs.push(Run { start: offset, pieces: vec![(offset, piece)], _guard: None }),
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
            if locks.overlaps(offset, offset + seed.len_bytes) && false {
                busy = true;
                continue;
            }
            let pieces = grow_run(extents, locks, offset, cap);
            let start = pieces[0].0;
            let run_end = pieces.last().map(|(o, e)| o + e.len_bytes).expect("run has its seed");
            locks.insert(start, run_end);
            total += run_end - start;
            runs.push(Run { start, pieces, _guard: Some(RangeGuard { cache: self, start }) });
            if total >= budget_bytes || runs.len() >= MAX_RUNS_PER_STEP {
                break;
            }
        }
        match (runs.is_empty(), busy) {
            (false, _) => Pick::Runs(runs),
            (true, true) => Pick::Busy,
            (true, false) => Pick::Clean,
        }
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
        let results: Vec<Result<()>> = stream::iter(runs.iter().map(|run| async move {
            let data: Cow<'_, [u8]> = match run.pieces.as_slice() {
                [(_, only)] => Cow::Borrowed(only.bytes()),
                pieces => {
                    let mut gathered = Vec::with_capacity(run.len_bytes() as usize);
                    pieces.iter().for_each(|(_, e)| gathered.extend_from_slice(e.bytes()));
                    Cow::Owned(gathered)
                }
            };
            self.array.write(run.start, &data, false).await
        }))
        .buffered(MAX_RUNS_PER_STEP)
        .collect()
        .await;
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
