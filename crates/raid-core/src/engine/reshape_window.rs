//! How far a reshape may move the data start, and how far its next window may reach: md's
//! rules for a reshape without a backup file (`doc/md-reshape.md` §2.4 for raid4/5/6,
//! `doc/md-reshape-raid10.md` §3.3 for raid10).
//!
//! The contract: the new rows a window writes never reach a row of the previous layout that a
//! restart from the recorded front would still read. Going forward the window's new rows must
//! end where the previous layout's rows at the front begin; going backwards they must begin
//! where the previous layout's rows below the front end. Rows are whole rows of chunks of
//! every device ([`Layout::first_member_sector`], [`Layout::member_end_sector`]), so the rule
//! is conservative per device, exact as md's. The window's own sectors are read whole before
//! they are written, and a crash while it is written restarts it from intact old rows.

use std::ops::Range;

use super::shape::{Direction, Layout};
use crate::geometry::Geometry;

/// The least data-start move for a reshape from `previous` to `new`:
/// - raid4/5/6: mdadm's `LCM(chunk·o, chunk·n) / o` for `o` and `n` data disks, and at least
///   two chunks so that the kernel, should it take over, stays in its self-safe checkpoint
///   regime (`doc/md-reshape.md` §2.4) and every window of a backwards reshape holds at least
///   one new stripe;
/// - raid10: one chunk, as mdadm moves it (`min_offset_change`; raid10.c refuses less).
///
/// `chunk` is the larger of the two chunks.
pub(crate) fn least_headroom(previous: &Geometry, new: &Geometry) -> u64 {
    let chunk = u64::from(previous.chunk_sectors().max(new.chunk_sectors()));
    match (previous.parity(), new.parity()) {
        (Some(p), Some(n)) => {
            let (o, n) = (p.data_disks() as u64, n.data_disks() as u64);
            let lcm = chunk * o / gcd(chunk * o, chunk * n) * (chunk * n);
            (lcm / o).max(2 * chunk)
        }
        _ => chunk,
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The sectors a window is made of: whole stripes of the new layout with the larger chunk
/// (raid4/5/6, md's `reshape_request`); pieces of one chunk of the smaller (raid10, whose
/// front may lie anywhere: the first window of a reshape the kernel left mid-chunk ends at
/// the next boundary).
pub(crate) fn unit_sectors(previous: &Layout, new: &Layout) -> u64 {
    let (co, cn) = (u64::from(previous.geometry().chunk_sectors()), u64::from(new.geometry().chunk_sectors()));
    match new.parity() {
        Some(pg) => co.max(cn) * pg.data_disks() as u64,
        None => co.min(cn),
    }
}

/// The array sector the reshape ends at (going backwards: starts at): md moves
/// `max(chunks)`-row units up to the device size rounded down to that, times the new data
/// disks (raid4/5/6); raid10's new layout is written up to its end (past the old end with
/// zeros, so every copy agrees).
pub(crate) fn reshape_end(new: &Layout, previous: &Layout) -> u64 {
    match (new.parity(), previous.parity()) {
        (Some(npg), Some(ppg)) => {
            let rows = u64::from(npg.chunk_sectors().max(ppg.chunk_sectors()));
            npg.size_sectors() / rows * rows * npg.data_disks() as u64
        }
        _ => new.geometry().array_sectors(),
    }
}

/// The next window from `front` (at most `wanted` sectors, whole units), inside `[0, end)`;
/// empty when the rows in use leave no room for one unit.
pub(crate) fn next_window(
    previous: &Layout,
    new: &Layout,
    direction: Direction,
    front: u64,
    end: u64,
    wanted: u64,
) -> Range<u64> {
    let unit = unit_sectors(previous, new);
    match direction {
        Direction::Forward => {
            // The previous layout's rows at the front (none past its end) are still in use.
            let limit = match front < previous.geometry().array_sectors() {
                true => previous.first_member_sector(front),
                false => u64::MAX,
            };
            let max_end = end.min(front + wanted);
            let mut at = front;
            while at < max_end {
                let next = ((at / unit + 1) * unit).min(end);
                if next > max_end || new.member_end_sector(next - 1) > limit {
                    break;
                }
                at = next;
            }
            front..at
        }
        Direction::Backward => {
            if front == 0 {
                return 0..0;
            }
            let limit = previous.member_end_sector(front - 1);
            let min_start = front.saturating_sub(wanted);
            let mut at = front;
            while at > min_start {
                let next = (at - 1) / unit * unit;
                if next < min_start || new.first_member_sector(next) < limit {
                    break;
                }
                at = next;
            }
            at..front
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::{Level, Raid10Layout};

    fn raid5(disks: usize, chunk: u32) -> Geometry {
        Geometry::new(Level::Raid5, 2, chunk, &vec![chunk as u64 * 64; disks]).unwrap()
    }

    fn raid10(disks: usize, chunk: u32, size: u64) -> Geometry {
        let n2 = Raid10Layout::parse("n2").unwrap().to_md();
        Geometry::new(Level::Raid10, n2, chunk, &vec![size; disks]).unwrap()
    }

    #[test]
    fn the_least_headroom_is_mdadms() {
        // mdadm: LCM(c·O, c·N) / O; 3 -> 4 disks of raid5 (O=2, N=3) with 512 KiB chunks.
        assert_eq!(least_headroom(&raid5(3, 1024), &raid5(4, 1024)), 3072);
        assert_eq!(least_headroom(&raid5(4, 1024), &raid5(5, 1024)), 4096);
        assert_eq!(least_headroom(&raid5(2, 128), &raid5(3, 128)), 256);
        // raid10: the larger chunk.
        assert_eq!(least_headroom(&raid10(4, 128, 8192), &raid10(5, 256, 8192)), 256);
    }

    /// Walks whole reshapes window by window with the least headroom and checks md's
    /// invariant directly on every copy: no new row written lies on an old row that a restart
    /// from the window's front would read.
    #[test]
    fn raid10_windows_never_write_old_rows_still_in_use() {
        for (o, n) in [(2, 3), (4, 5), (3, 5), (5, 4), (3, 2), (6, 4)] {
            for (co, cn) in [(16u32, 16u32), (16, 32), (32, 16)] {
                let size = 32 * 40;
                let (old, new) = (raid10(o, co, size), raid10(n, cn, size));
                let d = least_headroom(&old, &new);
                let (previous, next, direction) = if n > o {
                    (Layout::new(old.clone(), d), Layout::settled(new.clone()), Direction::Forward)
                } else {
                    (Layout::settled(old.clone()), Layout::new(new.clone(), d), Direction::Backward)
                };
                let end = reshape_end(&next, &previous);
                let mut front = if direction == Direction::Forward { 0 } else { end };
                // A kernel front inside a chunk.
                front += if direction == Direction::Forward { 8 } else { 0 };
                let mut windows = 0;
                loop {
                    let w = next_window(&previous, &next, direction, front, end, 64);
                    if w.is_empty() {
                        break;
                    }
                    windows += 1;
                    let in_use: Vec<(usize, u64)> = match direction {
                        Direction::Forward => (front..old.array_sectors()).collect::<Vec<_>>(),
                        Direction::Backward => (0..front).collect(),
                    }
                    .into_iter()
                    .flat_map(|s| previous.map(s).copies.into_iter().map(|c| (c.role, c.member_sector)))
                    .collect();
                    for s in w.clone() {
                        for c in next.map(s).copies {
                            assert!(
                                !in_use.contains(&(c.role, c.member_sector)),
                                "{o}->{n} chunks {co}->{cn}: window {w:?} overwrites an old copy in use"
                            );
                        }
                    }
                    front = if direction == Direction::Forward { w.end } else { w.start };
                }
                let done = if direction == Direction::Forward { front == end } else { front == 0 };
                assert!(done, "{o}->{n} chunks {co}->{cn}: stuck at {front} of {end} after {windows} windows");
            }
        }
    }
}
