//! RAID0 striping, including md's multi-zone arrays of unequal members (`raid0.c`
//! create_strip_zones / map_sector, `md-format.md` §2.2).
//!
//! ```text
//!   sizes in chunks [1, 3, 3]        zone 0: roles 0,1,2, member chunks [0,1)
//!   role:   0    1    2              zone 1: roles 1,2,   member chunks [1,3)
//!          c0   c1   c2
//!               c4   c3   original (layout 1): member = zone.roles[abs_chunk % m]
//!               c6   c5   alternate (layout 2): member = zone.roles[zone_chunk % m]
//! ```
//!
//! One zone per distinct member size; zone k holds the members larger than zone k-1's
//! end, in role order. Only multi-zone arrays depend on the layout, and md refuses to
//! guess (layout 0 = unspecified) for those, so do we.

use super::{Extent, GeometryError, Level, Mapped, Raid0Layout, check_chunk};

/// One band of member sectors striped over the members that reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raid0Zone {
    /// First array sector of the zone.
    pub array_start: u64,
    /// Array sector just past the zone.
    pub array_end: u64,
    /// Member sector (on each member of the zone) where the zone begins.
    pub dev_start: u64,
    /// Members of the zone, in role order.
    pub roles: Vec<usize>,
}

/// Geometry of a raid0 array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raid0Geometry {
    chunk_sectors: u32,
    /// Chunk-rounded usable size of each member, by role.
    member_sectors: Vec<u64>,
    zones: Vec<Raid0Zone>,
    /// The layout actually applied: `Original` for single-zone arrays (as the kernel does).
    effective_layout: Raid0Layout,
}

impl Raid0Geometry {
    /// `data_sectors[role]` is md's per-device `data_size`; each is rounded down to the chunk.
    pub fn new(layout: u32, chunk_sectors: u32, data_sectors: &[u64]) -> Result<Self, GeometryError> {
        check_chunk(chunk_sectors)?;
        let chunk = u64::from(chunk_sectors);
        let mut member_sectors = Vec::with_capacity(data_sectors.len());
        for (role, &sectors) in data_sectors.iter().enumerate() {
            let rounded = sectors - sectors % chunk;
            if rounded == 0 {
                return Err(GeometryError::MemberTooSmall { role, sectors });
            }
            member_sectors.push(rounded);
        }

        let mut distinct: Vec<u64> = member_sectors.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let mut zones = Vec::with_capacity(distinct.len());
        let (mut dev_start, mut array_start) = (0u64, 0u64);
        for &zone_end_member in &distinct {
            let roles: Vec<usize> = (0..member_sectors.len()).filter(|&r| member_sectors[r] > dev_start).collect();
            let array_end = array_start + (zone_end_member - dev_start) * roles.len() as u64;
            zones.push(Raid0Zone { array_start, array_end, dev_start, roles });
            dev_start = zone_end_member;
            array_start = array_end;
        }

        let effective_layout = if zones.len() == 1 {
            Raid0Layout::Original
        } else {
            match Raid0Layout::from_md(layout) {
                Some(l @ (Raid0Layout::Original | Raid0Layout::Alternate)) => l,
                _ => return Err(GeometryError::BadLayout { level: Level::Raid0, layout }),
            }
        };
        Ok(Raid0Geometry { chunk_sectors, member_sectors, zones, effective_layout })
    }

    pub fn raid_disks(&self) -> usize {
        self.member_sectors.len()
    }

    pub fn array_sectors(&self) -> u64 {
        self.zones.last().map_or(0, |z| z.array_end)
    }

    /// Chunk-rounded usable sectors of member `role`.
    pub fn member_sectors(&self, role: usize) -> u64 {
        self.member_sectors[role]
    }

    /// The zones in array order (one for equal members).
    pub fn zones(&self) -> &[Raid0Zone] {
        &self.zones
    }

    /// The layout applied: `Original` for single-zone arrays whatever the superblock says.
    pub fn effective_layout(&self) -> Raid0Layout {
        self.effective_layout
    }

    /// The member and member sector of `array_sector` (`< array_sectors()`); the run ends
    /// at the chunk end (zones are whole chunks, so also never crosses a zone).
    pub fn map(&self, array_sector: u64) -> Mapped {
        let chunk = u64::from(self.chunk_sectors);
        let zone = &self.zones[self.zones.partition_point(|z| z.array_end <= array_sector)];
        let members = zone.roles.len() as u64;
        let in_zone = array_sector - zone.array_start;
        let offset = array_sector % chunk;
        let chunk_in_member = in_zone / (chunk * members);
        let stripe_index = match self.effective_layout {
            Raid0Layout::Alternate => (in_zone / chunk) % members,
            _ => (array_sector / chunk) % members,
        };
        let role = zone.roles[stripe_index as usize];
        let member_sector = zone.dev_start + chunk_in_member * chunk + offset;
        debug_assert!(member_sector < self.member_sectors[role]);
        debug_assert!(array_sector + (chunk - offset) <= zone.array_end);
        Mapped { copies: vec![Extent { role, member_sector }], len_sectors: chunk - offset }
    }
}
