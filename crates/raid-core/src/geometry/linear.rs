//! Linear (md level -1): members concatenated in role order (`md-linear.c`,
//! `md-format.md` §2.1).
//!
//! Each member contributes its `data_size` rounded down to the "rounding" (md's
//! `chunksize` for linear; 0 = no rounding). Array sector `s` lives on the first member
//! whose cumulative end exceeds `s`, at `s -` (sum of the earlier sizes). A run never
//! crosses into the next member.

use super::{Extent, GeometryError, Mapped};

/// Geometry of a linear array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinearGeometry {
    /// Rounded usable size of each member, by role.
    member_sectors: Vec<u64>,
    /// `member_ends[role]` = array sector just past that member (cumulative sum).
    member_ends: Vec<u64>,
}

impl LinearGeometry {
    /// `rounding_sectors` 0 means none. Members whose rounded size is 0 are refused: md would
    /// skip them, but such an array is almost certainly a mistake.
    pub fn new(rounding_sectors: u32, data_sectors: &[u64]) -> Result<Self, GeometryError> {
        let mut member_sectors = Vec::with_capacity(data_sectors.len());
        let mut member_ends = Vec::with_capacity(data_sectors.len());
        let mut end = 0u64;
        for (role, &sectors) in data_sectors.iter().enumerate() {
            let rounded = match rounding_sectors {
                0 => sectors,
                r => sectors - sectors % u64::from(r),
            };
            if rounded == 0 {
                return Err(GeometryError::MemberTooSmall { role, sectors });
            }
            end += rounded;
            member_sectors.push(rounded);
            member_ends.push(end);
        }
        Ok(LinearGeometry { member_sectors, member_ends })
    }

    pub fn raid_disks(&self) -> usize {
        self.member_sectors.len()
    }

    pub fn array_sectors(&self) -> u64 {
        self.member_ends.last().copied().unwrap_or(0)
    }

    /// Usable (rounded) sectors of member `role`.
    pub fn member_sectors(&self, role: usize) -> u64 {
        self.member_sectors[role]
    }

    /// The member holding `array_sector` (`< array_sectors()`), and the run to its end.
    pub fn map(&self, array_sector: u64) -> Mapped {
        let role = self.member_ends.partition_point(|&end| end <= array_sector);
        debug_assert!(role < self.raid_disks());
        let start = self.member_ends[role] - self.member_sectors[role];
        let member_sector = array_sector - start;
        Mapped { copies: vec![Extent { role, member_sector }], len_sectors: self.member_sectors[role] - member_sector }
    }
}
