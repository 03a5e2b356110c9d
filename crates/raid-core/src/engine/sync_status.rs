//! What a rebuild or resync will touch: per range of the array, whether its redundancy is not
//! in sync yet and whether the write-intent bitmap has it dirty (served as raidnbd's own NBD
//! meta context `raidnbd:sync`, for tools that want to know before they copy or wait).
//!
//! - [`NOT_IN_SYNC`]: the range's redundancy is not whole: a resync after an unclean stop has
//!   not reached it, or a block it lives on cannot be read there (a member failed or missing,
//!   recovering below that point, or bad there); a rebuild or resync will write it.
//! - [`BITMAP_DIRTY`]: the write-intent bitmap has the range's chunk set (written recently,
//!   or while a member was away): what a crash's resync or a re-add copies.
//!
//! Counted in the units maintenance works in (a stripe on raid4/5/6, 1 MiB of the array on
//! the mirrored levels), so a flag covers at least what the work touches. A snapshot, like
//! `base:allocation`; an array being reshaped is all [`NOT_IN_SYNC`] (the reshape moves it).

use super::maintenance::MIRROR_UNIT_SECTORS;
use super::{Array, DataPath};
use crate::SECTOR_BYTES;
use crate::error::Result;
use crate::member::Member;

/// The range's redundancy is not in sync yet.
pub const NOT_IN_SYNC: u32 = 1 << 0;
/// The write-intent bitmap has the range dirty.
pub const BITMAP_DIRTY: u32 = 1 << 1;

/// Units one request looks at, at most (the caller asks again for the rest).
const MAX_SYNC_UNITS: u64 = 1 << 16;

impl<M: Member + ?Sized> Array<M> {
    /// The sync state from `offset_bytes` (sector aligned): (length, flags) extents in
    /// order, covering at least one sector and at most `len_bytes`. See the module docs.
    pub fn sync_status(&self, offset_bytes: u64, len_bytes: u64) -> Result<Vec<(u64, u32)>> {
        self.check_io(offset_bytes, len_bytes, false)?;
        let shape = self.shape.load();
        if len_bytes == 0 || shape.reshape().is_some() {
            return Ok(vec![(len_bytes, NOT_IN_SYNC)]);
        }
        let layout = shape.layout();
        let (start, end) = (offset_bytes / SECTOR_BYTES, (offset_bytes + len_bytes) / SECTOR_BYTES);
        // Array sectors per unit, and the unit's range in the bitmap's (resync) sectors.
        let (unit_sectors, resync_unit_sectors) = match layout.parity() {
            Some(pg) => (pg.stripe_data_sectors(), u64::from(pg.chunk_sectors())),
            None => (MIRROR_UNIT_SECTORS, MIRROR_UNIT_SECTORS),
        };
        let slots = self.members.slots();
        let mut out: Vec<(u64, u32)> = Vec::new();
        let first = start / unit_sectors;
        let last = end.div_ceil(unit_sectors).min(first + MAX_SYNC_UNITS);
        for unit in first..last {
            let (from, to) = ((unit * unit_sectors).max(start), ((unit + 1) * unit_sectors).min(end));
            let whole = match DataPath::of(layout) {
                DataPath::Striped => {
                    let chunk = u64::from(layout.parity().expect("striped").chunk_sectors());
                    let rows = layout.stripe_member_sector(unit);
                    slots.iter().all(|slot| slot.is_readable(rows, chunk))
                }
                DataPath::Mirrored => {
                    let mut sector = unit * unit_sectors;
                    let unit_end = ((unit + 1) * unit_sectors).min(layout.geometry().array_sectors());
                    let mut readable = true;
                    while readable && sector < unit_end {
                        let mapped = layout.map(sector);
                        let run = mapped.len_sectors.min(unit_end - sector);
                        readable = mapped.copies.iter().all(|c| slots[c.role].is_readable(c.member_sector, run));
                        sector += run;
                    }
                    readable
                }
            };
            let mut flags = 0;
            if !whole || !self.stripe_synced(unit) {
                flags |= NOT_IN_SYNC;
            }
            let resync_range = unit * resync_unit_sectors..(unit + 1) * resync_unit_sectors;
            if self.intent.as_ref().is_some_and(|intent| intent.any_set(resync_range)) {
                flags |= BITMAP_DIRTY;
            }
            let len = (to - from) * SECTOR_BYTES;
            match out.last_mut() {
                Some((last_len, last_flags)) if *last_flags == flags => *last_len += len,
                _ => out.push((len, flags)),
            }
        }
        debug_assert!(!out.is_empty() && out.iter().map(|e| e.0).sum::<u64>() <= len_bytes);
        Ok(out)
    }
}
