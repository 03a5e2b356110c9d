//! RAID10: near, far and offset copies (`raid10.c` setup_geo, __raid10_find_phys,
//! calc_sectors, raid10_size; `md-format.md` §2.6).
//!
//! ```text
//!  n2, 3 disks    f2, 4 disks (size 6 chunks)    o2, 4 disks
//!   0  0  1        0  1  2  3                      0  1  2  3
//!   1  2  2        4  5  6  7                      3  0  1  2
//!   3  3  4        8  9 10 11                      4  5  6  7
//!   4  5  5        3  0  1  2  <- stride           7  4  5  6
//!                  7  4  5  6
//!                 11  8  9 10
//! ```
//!
//! Array chunk `v` starts at virtual chunk `v·nc`: device `v·nc mod n`, row `v·nc / n`
//! (times `fc` with the offset flag). Its copies sit on the cyclic window of `nc·fc`
//! devices starting there, near copies on consecutive devices (a wrap moves one row
//! down), each far copy `nc` devices further and one `stride` lower.
//!
//! The array size and far stride come from md's `size` (`sb.size`), not the device size:
//! `array_chunks = ⌊⌊size/c⌋/fc⌋·n/nc`, `stride = ⌈array_chunks·nc·fc/n⌉/fc` chunks (one
//! chunk with the offset flag). Only the far-set mode mdadm creates (bits 17+ zero,
//! far set = all members) is accepted, and offset layouts with several near copies only
//! when nc divides n (otherwise md's own formula puts two chunks on one sector).

use super::{Extent, GeometryError, Level, Mapped, Raid10Layout, check_chunk};

/// Geometry of a raid10 array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raid10Geometry {
    layout: Raid10Layout,
    chunk_sectors: u32,
    raid_disks: usize,
    /// md `size` as given (sectors of each member the array may use).
    size_sectors: u64,
    /// Array size in chunks (`raid10_size`).
    array_chunks: u64,
    /// Member sectors between a chunk and its next far copy.
    stride_sectors: u64,
    /// md's `dev_sectors`: every copy lies below it.
    used_member_sectors: u64,
}

impl Raid10Geometry {
    /// `layout` is md's raw value; `size_sectors` is md's `size` (shared by every member).
    pub fn new(layout: u32, chunk_sectors: u32, raid_disks: usize, size_sectors: u64) -> Result<Self, GeometryError> {
        let bad_layout = GeometryError::BadLayout { level: Level::Raid10, layout };
        let parsed = Raid10Layout::from_md(layout).ok_or(bad_layout.clone())?;
        // md's setup_conf: 2 <= copies <= raid_disks (a single copy is raid0, refused).
        let copies = u64::from(parsed.copies());
        if copies < 2 || copies > raid_disks as u64 {
            return Err(bad_layout);
        }
        // With the offset flag, md moves a near copy that wraps to role 0 down by one row
        // only, onto the first offset copy of the previous chunk (`__raid10_find_phys`):
        // two chunks would share sectors. That happens when nc > 1 does not divide n;
        // mdadm never creates such layouts, and we refuse them rather than lose data.
        if parsed.offset && parsed.near_copies > 1 && !raid_disks.is_multiple_of(parsed.near_copies as usize) {
            return Err(bad_layout);
        }
        check_chunk(chunk_sectors)?;
        let n = raid_disks as u64;
        let (nc, fc) = (u64::from(parsed.near_copies), u64::from(parsed.far_copies));
        let chunk = u64::from(chunk_sectors);
        // calc_sectors / raid10_size.
        let array_chunks = (size_sectors / chunk) / fc * n / nc;
        if array_chunks == 0 {
            return Err(GeometryError::MemberTooSmall { role: 0, sectors: size_sectors });
        }
        let used_chunks_per_dev = (array_chunks * nc * fc).div_ceil(n);
        let stride_sectors = if parsed.offset { chunk } else { used_chunks_per_dev / fc * chunk };
        Ok(Raid10Geometry {
            layout: parsed,
            chunk_sectors,
            raid_disks,
            size_sectors,
            array_chunks,
            stride_sectors,
            used_member_sectors: used_chunks_per_dev * chunk,
        })
    }

    pub fn layout(&self) -> Raid10Layout {
        self.layout
    }

    pub fn raid_disks(&self) -> usize {
        self.raid_disks
    }

    pub fn chunk_sectors(&self) -> u32 {
        self.chunk_sectors
    }

    /// md `size` the geometry was built from.
    pub fn size_sectors(&self) -> u64 {
        self.size_sectors
    }

    /// md's `dev_sectors` (`calc_sectors`): ⌈array_chunks·nc·fc/n⌉ chunks, the member
    /// sectors the copies occupy (at most [`Raid10Geometry::size_sectors`]).
    pub fn used_member_sectors(&self) -> u64 {
        self.used_member_sectors
    }

    pub fn array_sectors(&self) -> u64 {
        self.array_chunks * u64::from(self.chunk_sectors)
    }

    /// Member sectors between a near copy and its first far copy (md's `geo->stride`).
    pub fn stride_sectors(&self) -> u64 {
        self.stride_sectors
    }

    /// Chunks per full stripe for md's `optimal_io_size`: n/nc when nc divides n, else n.
    pub fn stripe_width_chunks(&self) -> usize {
        let nc = self.layout.near_copies as usize;
        if self.raid_disks.is_multiple_of(nc) { self.raid_disks / nc } else { self.raid_disks }
    }

    /// The array sector whose copy lives at `member_sector` of `role` (md's
    /// `raid10_find_virt`), or `None` for sectors no copy uses. Rebuilds walk member space
    /// with it.
    pub fn array_sector_of(&self, role: usize, member_sector: u64) -> Option<u64> {
        let chunk = u64::from(self.chunk_sectors);
        let n = self.raid_disks as u64;
        let (nc, fc) = (u64::from(self.layout.near_copies), u64::from(self.layout.far_copies));
        if role as u64 >= n || member_sector >= self.used_member_sectors {
            return None;
        }
        let offset = member_sector % chunk;
        let mut dev = role as u64;
        let chunk_index = if self.layout.offset {
            let chunk_index = member_sector / chunk;
            let far = chunk_index % fc;
            dev = (dev + n * fc - far * nc % n) % n;
            chunk_index / fc
        } else {
            let mut sector = member_sector;
            while sector >= self.stride_sectors && fc > 1 {
                sector -= self.stride_sectors;
                dev = if dev < nc { dev + n - nc } else { dev - nc };
            }
            sector / chunk
        };
        let array_sector = (chunk_index * n + dev) / nc * chunk + offset;
        if array_sector >= self.array_sectors() {
            return None;
        }
        let found = self.map(array_sector).copies.iter().any(|c| c.role == role && c.member_sector == member_sector);
        found.then_some(array_sector)
    }

    /// Every copy of `array_sector` (`< array_sectors()`) in md's slot order; the run ends
    /// at the chunk end.
    pub fn map(&self, array_sector: u64) -> Mapped {
        let chunk = u64::from(self.chunk_sectors);
        let n = self.raid_disks as u64;
        let (nc, fc) = (u64::from(self.layout.near_copies), u64::from(self.layout.far_copies));
        let offset = array_sector % chunk;
        let vchunk = array_sector / chunk * nc;
        let mut dev = vchunk % n;
        let mut row = vchunk / n;
        if self.layout.offset {
            row *= fc;
        }
        let mut sector = row * chunk + offset;
        let mut copies = Vec::with_capacity((nc * fc) as usize);
        for _ in 0..nc {
            copies.push(Extent { role: dev as usize, member_sector: sector });
            let (mut far_dev, mut far_sector) = (dev, sector);
            for _ in 1..fc {
                far_dev = (far_dev + nc) % n;
                far_sector += self.stride_sectors;
                copies.push(Extent { role: far_dev as usize, member_sector: far_sector });
            }
            dev += 1;
            if dev == n {
                dev = 0;
                sector += chunk;
            }
        }
        debug_assert!(copies.iter().all(|c| c.role < self.raid_disks && c.member_sector < self.used_member_sectors));
        Mapped { copies, len_sectors: chunk - offset }
    }

    /// md's `first_dev_address`: the first member sector of the row holding the first copy
    /// of `array_sector`'s chunk. Rows only grow with the chunk, so no copy of a later chunk
    /// lies below it (a reshape's checkpoint rule, `doc/md-reshape-raid10.md` §3.3).
    pub fn first_row_sector(&self, array_sector: u64) -> u64 {
        let chunk = u64::from(self.chunk_sectors);
        let (nc, fc) = (u64::from(self.layout.near_copies), u64::from(self.layout.far_copies));
        array_sector / chunk * nc / self.raid_disks as u64 * fc * chunk
    }

    /// md's `last_dev_address`: the end of the row holding the last copy of `array_sector`'s
    /// chunk; no copy of it or of an earlier chunk lies at or past it.
    pub fn rows_end_sector(&self, array_sector: u64) -> u64 {
        let chunk = u64::from(self.chunk_sectors);
        let (nc, fc) = (u64::from(self.layout.near_copies), u64::from(self.layout.far_copies));
        ((array_sector / chunk + 1) * nc).div_ceil(self.raid_disks as u64) * fc * chunk
    }

    /// Whether every chunk keeps a copy on a member not in `is_missing` (indexed by role).
    /// Chunk `v`'s copies are the `nc·fc` devices cyclically from `v·nc mod n`, a pattern
    /// that repeats every `n` chunks, so checking the first `min(n, array_chunks)` is exact.
    pub fn survives(&self, is_missing: &[bool]) -> bool {
        debug_assert_eq!(is_missing.len(), self.raid_disks);
        let n = self.raid_disks as u64;
        let nc = u64::from(self.layout.near_copies);
        let copies = u64::from(self.layout.copies());
        (0..self.array_chunks.min(n)).all(|v| {
            let first = v * nc % n;
            (0..copies).any(|j| !is_missing[((first + j) % n) as usize])
        })
    }
}

#[cfg(test)]
mod inverse_tests {
    use super::*;

    /// Every copy of every array sector maps back to that array sector, and every used
    /// member chunk holds exactly one array chunk.
    #[test]
    fn array_sector_of_inverts_map() {
        for (layout, disks) in
            [("n2", 4), ("n2", 3), ("n3", 5), ("f2", 4), ("f2", 3), ("f3", 5), ("o2", 4), ("o3", 3), ("o2", 5)]
        {
            let code = Raid10Layout::parse(layout).unwrap().to_md();
            let g = Raid10Geometry::new(code, 8, disks, 8 * 23).unwrap();
            let mut hits = 0;
            for chunk in 0..g.array_sectors() / 8 {
                for c in g.map(chunk * 8).copies {
                    assert_eq!(g.array_sector_of(c.role, c.member_sector), Some(chunk * 8), "{layout} x{disks}");
                    hits += 1;
                }
            }
            let mut used = 0;
            for role in 0..disks {
                for m in (0..g.used_member_sectors()).step_by(8) {
                    used += usize::from(g.array_sector_of(role, m).is_some());
                }
            }
            assert_eq!(used, hits, "{layout} x{disks}: member chunks in use = copies");
        }
    }

    /// The row bounds are md's: every copy of a chunk lies inside them (near and offset).
    #[test]
    fn row_bounds_hold_every_copy() {
        for (layout, disks) in [("n2", 4), ("n2", 3), ("n2", 5), ("n3", 5), ("n3", 4), ("o2", 4), ("o3", 3)] {
            let code = Raid10Layout::parse(layout).unwrap().to_md();
            let g = Raid10Geometry::new(code, 8, disks, 8 * 31).unwrap();
            for chunk in 0..g.array_sectors() / 8 {
                let (first, end) = (g.first_row_sector(chunk * 8), g.rows_end_sector(chunk * 8 + 7));
                for c in g.map(chunk * 8).copies {
                    assert!(first <= c.member_sector && c.member_sector + 8 <= end, "{layout} x{disks} chunk {chunk}");
                }
                if chunk > 0 {
                    assert!(g.first_row_sector(chunk * 8) >= g.first_row_sector(chunk * 8 - 8), "monotonic");
                }
            }
        }
    }
}
