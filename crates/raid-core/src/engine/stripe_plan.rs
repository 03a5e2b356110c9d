//! Pure planning for raid4/5/6 writes: which rows of which data blocks a request
//! covers, how those rows split into segments with the same written set, and for each
//! segment whether to write without reads (full stripe), read-modify-write, reconstruct-
//! write, or rebuild the stripe first (degraded).
//!
//! Rows are sector offsets inside the chunk (0..chunk_sectors). Data index `k` of stripe
//! `s` holds array sectors `[s·dd·c + k·c, s·dd·c + (k+1)·c)`.

/// The rows of one data block a request writes, and where that data is in the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlockWrite {
    /// First and one-past-last row written.
    pub rows: (u32, u32),
    /// Byte offset in the request of the data for `rows.0`.
    pub req_offset_bytes: usize,
}

/// What a request writes into one stripe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StripeWrite {
    pub stripe: u64,
    /// Per data index.
    pub blocks: Vec<Option<BlockWrite>>,
}

/// Splits array sectors `[start, start + sectors)` into per-stripe writes.
pub(crate) fn stripe_writes(start: u64, sectors: u64, chunk_sectors: u32, data_disks: usize) -> Vec<StripeWrite> {
    let c = u64::from(chunk_sectors);
    let stripe_sectors = c * data_disks as u64;
    let end = start + sectors;
    let mut out: Vec<StripeWrite> = Vec::new();
    let mut sector = start;
    while sector < end {
        let stripe = sector / stripe_sectors;
        let k = ((sector % stripe_sectors) / c) as usize;
        let row = (sector % c) as u32;
        let run = (c - u64::from(row)).min(end - sector);
        if out.last().is_none_or(|w| w.stripe != stripe) {
            out.push(StripeWrite { stripe, blocks: vec![None; data_disks] });
        }
        let w = out.last_mut().expect("pushed above");
        debug_assert!(w.blocks[k].is_none());
        w.blocks[k] = Some(BlockWrite {
            rows: (row, row + run as u32),
            req_offset_bytes: ((sector - start) * crate::SECTOR_BYTES) as usize,
        });
        sector += run;
    }
    out
}

/// A row range of a stripe in which the same data blocks are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    pub rows: (u32, u32),
    /// Bit k set = data index k is written in these rows.
    pub written: u64,
}

/// Cuts the stripe's rows at every block boundary and keeps the pieces that are written.
pub(crate) fn segments(blocks: &[Option<BlockWrite>]) -> Vec<Segment> {
    let mut cuts: Vec<u32> = blocks.iter().flatten().flat_map(|b| [b.rows.0, b.rows.1]).collect();
    cuts.sort_unstable();
    cuts.dedup();
    cuts.windows(2)
        .filter_map(|w| {
            let (lo, hi) = (w[0], w[1]);
            let written = blocks
                .iter()
                .enumerate()
                .filter(|(_, b)| b.is_some_and(|b| b.rows.0 <= lo && hi <= b.rows.1))
                .fold(0u64, |m, (k, _)| m | 1 << k);
            (written != 0).then_some(Segment { rows: (lo, hi), written })
        })
        .collect()
}

/// How one segment is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Every data block is overwritten: parity from the new data, no reads.
    Full,
    /// Read the old data being overwritten and the parity; update parity by the difference.
    ReadModifyWrite,
    /// Read the data blocks not being overwritten; compute parity from all data.
    ReconstructWrite,
    /// An unreadable data block is not being overwritten: read every readable block,
    /// rebuild the missing ones, then compute parity from all data.
    Degraded,
    /// Parity cannot be computed (a data block it needs cannot be rebuilt) and is already
    /// marked bad: write the data blocks alone; parity stays bad (bad_blocks.rs).
    DataOnly,
}

/// Chooses the mode with the fewest block reads (ties go to reconstruct-write, as md).
///
/// `unreadable_data` has bit k set for data blocks that cannot be read in these rows;
/// `readable_parity` counts the P/Q blocks that can. `recompute_parity`: the parity on the
/// members cannot be updated by difference (not resynced since an unclean stop, or a parity
/// block is being rebuilt: writable, not yet readable), so read-modify-write is excluded.
pub(crate) fn choose_mode(
    data_disks: usize,
    written: u64,
    unreadable_data: u64,
    readable_parity: usize,
    recompute_parity: bool,
) -> Mode {
    let all = if data_disks == 64 { u64::MAX } else { (1u64 << data_disks) - 1 };
    debug_assert_eq!(written & !all, 0);
    if written == all {
        return Mode::Full;
    }
    if unreadable_data & !written != 0 {
        return Mode::Degraded;
    }
    let rcw_reads = data_disks - written.count_ones() as usize;
    if unreadable_data == 0 && !recompute_parity {
        let rmw_reads = if readable_parity == 0 { 0 } else { written.count_ones() as usize + readable_parity };
        if rmw_reads < rcw_reads {
            return Mode::ReadModifyWrite;
        }
    }
    Mode::ReconstructWrite
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_into_stripes_and_blocks() {
        // chunk 8 sectors, 3 data disks: stripe = 24 sectors.
        let w = stripe_writes(4, 30, 8, 3);
        assert_eq!(w.len(), 2);
        assert_eq!(w[0].stripe, 0);
        assert_eq!(w[0].blocks[0], Some(BlockWrite { rows: (4, 8), req_offset_bytes: 0 }));
        assert_eq!(w[0].blocks[1], Some(BlockWrite { rows: (0, 8), req_offset_bytes: 4 * 512 }));
        assert_eq!(w[0].blocks[2], Some(BlockWrite { rows: (0, 8), req_offset_bytes: 12 * 512 }));
        assert_eq!(w[1].stripe, 1);
        assert_eq!(w[1].blocks[0], Some(BlockWrite { rows: (0, 8), req_offset_bytes: 20 * 512 }));
        assert_eq!(w[1].blocks[1], Some(BlockWrite { rows: (0, 2), req_offset_bytes: 28 * 512 }));
        assert_eq!(w[1].blocks[2], None);
    }

    #[test]
    fn segments_follow_block_boundaries() {
        let w = stripe_writes(4, 30, 8, 3);
        assert_eq!(
            segments(&w[0].blocks),
            vec![Segment { rows: (0, 4), written: 0b110 }, Segment { rows: (4, 8), written: 0b111 }]
        );
        assert_eq!(
            segments(&w[1].blocks),
            vec![Segment { rows: (0, 2), written: 0b011 }, Segment { rows: (2, 8), written: 0b001 }]
        );
    }

    #[test]
    fn mode_choice() {
        // 4 data disks, one written, healthy raid5: rmw reads 2, rcw reads 3.
        assert_eq!(choose_mode(4, 0b0001, 0, 1, false), Mode::ReadModifyWrite);
        // three written: rmw 4, rcw 1.
        assert_eq!(choose_mode(4, 0b0111, 0, 1, false), Mode::ReconstructWrite);
        // tie (2 data disks... 3 data, 1 written raid6: rmw 3, rcw 2).
        assert_eq!(choose_mode(3, 0b001, 0, 2, false), Mode::ReconstructWrite);
        assert_eq!(choose_mode(4, 0b1111, 0b0001, 0, false), Mode::Full);
        // unreadable block is being overwritten: rcw works.
        assert_eq!(choose_mode(4, 0b0011, 0b0001, 1, false), Mode::ReconstructWrite);
        // unreadable block not overwritten: degraded.
        assert_eq!(choose_mode(4, 0b0011, 0b0100, 1, false), Mode::Degraded);
        // parity gone: just write the data.
        assert_eq!(choose_mode(4, 0b0001, 0, 0, false), Mode::ReadModifyWrite);
        // parity stale or being rebuilt: compute it from all the data.
        assert_eq!(choose_mode(4, 0b0001, 0, 1, true), Mode::ReconstructWrite);
        assert_eq!(choose_mode(4, 0b0001, 0, 0, true), Mode::ReconstructWrite);
        assert_eq!(choose_mode(4, 0b0001, 0b0100, 0, true), Mode::Degraded);
    }
}
