//! raid4/5/6 trim and write-zeroes: whole stripes are zeroed (or discarded) on every
//! member, so parity, zero for zero data, stays right without being computed; the partial
//! stripes at the ends are written with zeros like any write (trim leaves them alone: it is
//! a hint). A policy that logs data pages (the journal) has every zero written as data: a
//! discard it did not log could be undone by the replay of an older unit.

use futures::future::join_all;

use super::stripe_write::WriteSource;
use super::{Array, Layout, MAX_IO_BYTES};
use crate::SECTOR_BYTES;
use crate::error::{RaidError, Result};
use crate::member::Member;

/// Stripes zeroed per batch by trim/write-zeroes (bounds locks held and memory).
pub(crate) const ZERO_BATCH_STRIPES: u64 = 4096;

impl<M: Member + ?Sized> Array<M> {
    /// Zeroes `[start, start + sectors)` of `layout` (see the module docs).
    pub(super) async fn zero_striped(
        &self,
        layout: &Layout,
        start: u64,
        sectors: u64,
        deallocate: bool,
        trim_only: bool,
    ) -> Result<()> {
        let pg = layout.parity().expect("a parity layout");
        let stripe_sectors = pg.stripe_data_sectors();
        let end = start + sectors;
        let first_full = start.div_ceil(stripe_sectors);
        let end_full = end / stripe_sectors;
        let zero_partial = |from: u64, to: u64| async move {
            let mut at = from;
            while at < to {
                let n = (to - at).min(MAX_IO_BYTES as u64 / SECTOR_BYTES);
                self.write_striped(layout, at, n, WriteSource::Zeros, false).await?;
                at += n;
            }
            Ok::<(), RaidError>(())
        };
        if !self.write_rules().zeroes_whole_stripes {
            return zero_partial(start, end).await;
        }
        if first_full >= end_full {
            return if trim_only { Ok(()) } else { zero_partial(start, end).await };
        }
        if !trim_only {
            zero_partial(start, first_full * stripe_sectors).await?;
            zero_partial(end_full * stripe_sectors, end).await?;
        }
        let mut stripe = first_full;
        while stripe < end_full {
            let n = self.write_hole.zero_batch_stripes(layout, stripe, end_full);
            self.zero_whole_stripes(layout, stripe, n, deallocate).await?;
            stripe += n;
        }
        Ok(())
    }

    /// Zeroes whole stripes `[stripe, stripe + n)` on every writable member, under their
    /// locks and write intent, once the policy made that safe.
    async fn zero_whole_stripes(&self, layout: &Layout, stripe: u64, n: u64, deallocate: bool) -> Result<()> {
        let pg = layout.parity().expect("a parity layout");
        let chunk = u64::from(pg.chunk_sectors());
        let _guards = self.locks.lock_all(stripe..stripe + n).await;
        let _intent = self.intent_begin(pg.stripe_member_sector(stripe)..pg.stripe_member_sector(stripe + n)).await?;
        let _protected = self.write_hole.protect_zeroing(self, layout, stripe..stripe + n).await?;
        let roles: Vec<usize> =
            (0..self.members.slots().len()).filter(|&r| self.members.slots()[r].is_writable()).collect();
        let first_row = layout.stripe_member_sector(stripe);
        let results = join_all(roles.iter().map(|&r| self.zero_member(r, first_row, n * chunk, deallocate))).await;
        for (&role, res) in roles.iter().zip(results) {
            if let Err(e) = res {
                self.member_failed(role, &e, "zero").await;
            }
        }
        self.check_survives("zero")
    }
}
