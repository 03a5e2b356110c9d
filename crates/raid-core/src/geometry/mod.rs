//! RAID geometry: where every array sector lives on the members, exactly as Linux md
//! places it (`drivers/md/{md-linear,raid0,raid1,raid5,raid10}.c`).
//!
//! All sector numbers are 512-byte sectors. Member sectors are relative to the start of
//! the member's data area (the engine adds the per-member md `data_offset`).
//!
//! ```text
//!   Geometry::new(level, layout, chunk_sectors, member_sectors) ── validates
//!        │
//!        ├── map(array_sector) -> Mapped { copies: [(role, member_sector)], len_sectors }
//!        │      linear / raid0 / raid1 / raid10: every copy of the data
//!        │      raid4/5/6: the one data block (parity lives in `parity()`)
//!        └── parity() -> Option<&ParityGeometry>     raid4/5/6 only
//!               locate(array_sector) -> (stripe, data_index, offset_in_chunk)
//!               stripe(stripe) -> StripeLayout { p_role, q_role, data_roles, q_exponents }
//! ```
//!
//! Why it mirrors the kernel formula by formula instead of a cleaner model: an array
//! created by mdadm must read back byte for byte here and vice versa, including md's odd
//! corners (raid0 original vs alternate multi-zone layout, raid10 far stride taken from
//! `sb.size`, raid6 Q coefficient order). Bad input is refused with a [`GeometryError`],
//! never a panic; sizes are capped at [`MAX_MEMBER_SECTORS`] so no product overflows.
//!
//! Invariants asserted in debug builds: roles < raid_disks, P/Q never collide with a data
//! role, a mapped run never crosses a chunk, zone or member boundary.

mod level;
mod linear;
mod parity_layout;
mod raid0;
mod raid10;

pub use level::{Level, ParityLayout, Raid0Layout, Raid10Layout};
pub use linear::LinearGeometry;
pub use parity_layout::{ParityGeometry, StripeLayout};
pub use raid0::{Raid0Geometry, Raid0Zone};
pub use raid10::Raid10Geometry;

/// Largest number of member slots an array may have (md v1.2 allows more; we cap it to
/// keep per-stripe state small and bounded).
pub const MAX_RAID_DISKS: usize = 64;

/// Smallest and largest chunk the engine accepts, in sectors (4 KiB .. 64 MiB).
pub const MIN_CHUNK_SECTORS: u32 = 8;
pub const MAX_CHUNK_SECTORS: u32 = 128 * 1024;

/// Largest member data area accepted, in sectors (2^48 sectors = 128 PiB). With at most
/// [`MAX_RAID_DISKS`] members every size product stays far below `u64::MAX`.
pub const MAX_MEMBER_SECTORS: u64 = 1 << 48;

/// Why a geometry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GeometryError {
    #[error("{level} needs at least {min} members, got {got}")]
    TooFewMembers { level: Level, min: usize, got: usize },
    #[error("at most {MAX_RAID_DISKS} members are supported, got {0}")]
    TooManyMembers(usize),
    #[error("chunk size {0} sectors is not a power of two between 4 KiB and 64 MiB")]
    BadChunk(u32),
    #[error("layout {layout:#x} is not valid for {level}")]
    BadLayout { level: Level, layout: u32 },
    #[error("member {role} is too small ({sectors} sectors)")]
    MemberTooSmall { role: usize, sectors: u64 },
    #[error("member {role} is too large ({sectors} sectors, at most {MAX_MEMBER_SECTORS} supported)")]
    MemberTooLarge { role: usize, sectors: u64 },
}

/// One copy of a run of array sectors on one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Member slot (md "role", the position in the array), `< raid_disks`.
    pub role: usize,
    /// Sector relative to the member's data offset.
    pub member_sector: u64,
}

/// Where a run of array sectors starting at some array sector lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapped {
    /// Every copy of the run (1 for linear/raid0/raid4-6 data, n for raid1, nc*fc for raid10).
    /// For raid10 the order is md's `devs[]` slot order (`__raid10_find_phys`): near copy 0,
    /// then the far copies of near copy 0, then near copy 1 and its far copies, ... For the
    /// layouts mdadm creates (n*, f*, o*) that is "near copies first, then far copies".
    pub copies: Vec<Extent>,
    /// Number of sectors, from the mapped sector on, that stay contiguous on every copy
    /// (never crosses a chunk, zone, stripe or member boundary, nor the array end). >= 1.
    pub len_sectors: u64,
}

/// The complete address geometry of one array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    level: Level,
    /// md's raw layout value for the level (see [`Level`] docs).
    layout: u32,
    chunk_sectors: u32,
    kind: Kind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Linear(LinearGeometry),
    Raid0(Raid0Geometry),
    Raid1 { raid_disks: usize, size_sectors: u64 },
    Parity(ParityGeometry),
    Raid10(Raid10Geometry),
}

/// Refuses chunks md (and our stripe buffers) cannot take: a power of two in
/// `MIN_CHUNK_SECTORS..=MAX_CHUNK_SECTORS`.
pub(crate) fn check_chunk(chunk_sectors: u32) -> Result<(), GeometryError> {
    if chunk_sectors.is_power_of_two() && (MIN_CHUNK_SECTORS..=MAX_CHUNK_SECTORS).contains(&chunk_sectors) {
        Ok(())
    } else {
        Err(GeometryError::BadChunk(chunk_sectors))
    }
}

/// Refuses member counts outside `level.min_members()..=MAX_RAID_DISKS`.
pub(crate) fn check_member_count(level: Level, raid_disks: usize) -> Result<(), GeometryError> {
    if raid_disks < level.min_members() {
        return Err(GeometryError::TooFewMembers { level, min: level.min_members(), got: raid_disks });
    }
    if raid_disks > MAX_RAID_DISKS {
        return Err(GeometryError::TooManyMembers(raid_disks));
    }
    Ok(())
}

impl Geometry {
    /// Builds the geometry of an array.
    ///
    /// `member_sectors[role]` is the usable size of each member's data area:
    /// - linear and raid0: md's per-device `data_size` (each is rounded down to the chunk /
    ///   rounding internally, as the kernel does);
    /// - raid1/4/5/6/10: md's array-wide `size` (the same value for every role; the engine
    ///   passes `sb.size` for all of them). Should they differ, the smallest is used, as md
    ///   does when it creates an array.
    ///
    /// `chunk_sectors` is md's `chunksize` (for linear: the rounding, 0 = none; raid1: ignored).
    /// `layout` is md's raw value: ignored for linear, raid1 and raid4 (parity on the last
    /// role); raid0 needs 1 or 2 only when members differ in size (multi-zone).
    pub fn new(level: Level, layout: u32, chunk_sectors: u32, member_sectors: &[u64]) -> Result<Self, GeometryError> {
        let raid_disks = member_sectors.len();
        check_member_count(level, raid_disks)?;
        if let Some((role, &sectors)) = member_sectors.iter().enumerate().find(|(_, s)| **s > MAX_MEMBER_SECTORS) {
            return Err(GeometryError::MemberTooLarge { role, sectors });
        }
        // Smallest member and its role (raid_disks >= 1 was checked above).
        let (min_role, min_sectors) =
            member_sectors.iter().copied().enumerate().min_by_key(|&(_, s)| s).unwrap_or((0, 0));
        // The shared-size constructors know no roles: name the smallest member instead.
        let name_smallest = |e: GeometryError| match e {
            GeometryError::MemberTooSmall { .. } => {
                GeometryError::MemberTooSmall { role: min_role, sectors: min_sectors }
            }
            other => other,
        };
        let kind = match level {
            Level::Linear => Kind::Linear(LinearGeometry::new(chunk_sectors, member_sectors)?),
            Level::Raid0 => Kind::Raid0(Raid0Geometry::new(layout, chunk_sectors, member_sectors)?),
            Level::Raid1 => {
                if min_sectors == 0 {
                    return Err(GeometryError::MemberTooSmall { role: min_role, sectors: 0 });
                }
                Kind::Raid1 { raid_disks, size_sectors: min_sectors }
            }
            Level::Raid4 | Level::Raid5 | Level::Raid6 => Kind::Parity(
                ParityGeometry::new(level, layout, chunk_sectors, raid_disks, min_sectors).map_err(name_smallest)?,
            ),
            Level::Raid10 => Kind::Raid10(
                Raid10Geometry::new(layout, chunk_sectors, raid_disks, min_sectors).map_err(name_smallest)?,
            ),
        };
        Ok(Geometry { level, layout, chunk_sectors, kind })
    }

    pub fn level(&self) -> Level {
        self.level
    }

    /// md's raw layout value.
    pub fn layout(&self) -> u32 {
        self.layout
    }

    /// md's `chunksize` as given (linear: the rounding, may be 0; raid1: whatever was passed).
    pub fn chunk_sectors(&self) -> u32 {
        self.chunk_sectors
    }

    pub fn raid_disks(&self) -> usize {
        match &self.kind {
            Kind::Linear(g) => g.raid_disks(),
            Kind::Raid0(g) => g.raid_disks(),
            Kind::Raid1 { raid_disks, .. } => *raid_disks,
            Kind::Parity(g) => g.raid_disks(),
            Kind::Raid10(g) => g.raid_disks(),
        }
    }

    /// Size of the array in sectors.
    pub fn array_sectors(&self) -> u64 {
        match &self.kind {
            Kind::Linear(g) => g.array_sectors(),
            Kind::Raid0(g) => g.array_sectors(),
            Kind::Raid1 { size_sectors, .. } => *size_sectors,
            Kind::Parity(g) => g.array_sectors(),
            Kind::Raid10(g) => g.array_sectors(),
        }
    }

    /// Sectors of member `role`'s data area the array uses: every copy and parity block
    /// of every array sector lies below it, so a member needs `data_offset` plus this much.
    /// Linear/raid0: the role's rounded `data_size`; raid1: `size`; raid4/5/6: `size`
    /// rounded down to the chunk; raid10: md's `dev_sectors` = ⌈array_chunks·nc·fc/n⌉ chunks
    /// (at most `size`).
    ///
    /// # Panics
    /// If `role >= raid_disks()`.
    pub fn member_sectors(&self, role: usize) -> u64 {
        assert!(role < self.raid_disks(), "role {role} of {} members", self.raid_disks());
        match &self.kind {
            Kind::Linear(g) => g.member_sectors(role),
            Kind::Raid0(g) => g.member_sectors(role),
            Kind::Raid1 { size_sectors, .. } => *size_sectors,
            Kind::Parity(g) => g.size_sectors(),
            Kind::Raid10(g) => g.used_member_sectors(),
        }
    }

    /// For mirrored levels (raid1, raid10): the array sector stored at `member_sector` of
    /// `role`, `None` where no copy lives. Other levels: `None`.
    pub fn array_sector_of(&self, role: usize, member_sector: u64) -> Option<u64> {
        match &self.kind {
            Kind::Raid1 { size_sectors, .. } => (member_sector < *size_sectors).then_some(member_sector),
            Kind::Raid10(g) => g.array_sector_of(role, member_sector),
            _ => None,
        }
    }

    /// How many members can be missing at most without losing data, in the best case
    /// (raid10: `nc*fc - 1`; the exact answer for a given set is [`Geometry::survives`]).
    pub fn max_failures(&self) -> usize {
        match &self.kind {
            Kind::Linear(_) | Kind::Raid0(_) => 0,
            Kind::Raid1 { raid_disks, .. } => raid_disks - 1,
            Kind::Parity(g) => g.parity_disks(),
            Kind::Raid10(g) => g.layout().copies() as usize - 1,
        }
    }

    /// Whether the array still holds every byte when the members in `missing` (roles) are gone.
    /// Roles `>= raid_disks` are not members and are ignored; duplicates count once.
    pub fn survives(&self, missing: &[usize]) -> bool {
        let raid_disks = self.raid_disks();
        let mut is_missing = vec![false; raid_disks];
        for &role in missing.iter().filter(|&&r| r < raid_disks) {
            is_missing[role] = true;
        }
        let missing_count = is_missing.iter().filter(|&&m| m).count();
        match &self.kind {
            Kind::Linear(_) | Kind::Raid0(_) => missing_count == 0,
            Kind::Raid1 { .. } => missing_count < raid_disks,
            Kind::Parity(g) => missing_count <= g.parity_disks(),
            Kind::Raid10(g) => g.survives(&is_missing),
        }
    }

    /// Where `array_sector` lives. See [`Mapped`].
    ///
    /// # Panics
    /// If `array_sector >= array_sectors()`.
    pub fn map(&self, array_sector: u64) -> Mapped {
        assert!(
            array_sector < self.array_sectors(),
            "array sector {array_sector} beyond the array end {}",
            self.array_sectors()
        );
        let mapped = match &self.kind {
            Kind::Linear(g) => g.map(array_sector),
            Kind::Raid0(g) => g.map(array_sector),
            Kind::Raid1 { raid_disks, size_sectors } => Mapped {
                copies: (0..*raid_disks).map(|role| Extent { role, member_sector: array_sector }).collect(),
                len_sectors: size_sectors - array_sector,
            },
            Kind::Parity(g) => g.map(array_sector),
            Kind::Raid10(g) => g.map(array_sector),
        };
        debug_assert!(mapped.len_sectors >= 1);
        debug_assert!(array_sector + mapped.len_sectors <= self.array_sectors());
        debug_assert!(mapped.copies.iter().all(|c| c.role < self.raid_disks()));
        if self.level.has_chunk() {
            let chunk = u64::from(self.chunk_sectors);
            debug_assert!(mapped.len_sectors <= chunk - array_sector % chunk, "run crosses a chunk");
        }
        mapped
    }

    /// Stripe geometry for raid4/5/6, `None` for the other levels.
    pub fn parity(&self) -> Option<&ParityGeometry> {
        match &self.kind {
            Kind::Parity(p) => Some(p),
            _ => None,
        }
    }

    /// The raid10 geometry (copy counts, far stride), `None` for the other levels.
    pub fn raid10(&self) -> Option<&Raid10Geometry> {
        match &self.kind {
            Kind::Raid10(g) => Some(g),
            _ => None,
        }
    }

    /// The raid0 geometry (zones), `None` for the other levels.
    pub fn raid0(&self) -> Option<&Raid0Geometry> {
        match &self.kind {
            Kind::Raid0(g) => Some(g),
            _ => None,
        }
    }

    /// The linear geometry (rounded member sizes), `None` for the other levels.
    pub fn linear(&self) -> Option<&LinearGeometry> {
        match &self.kind {
            Kind::Linear(g) => Some(g),
            _ => None,
        }
    }

    /// Preferred I/O size in bytes for clients, md's `optimal_io_size` (`md-format.md` §2.7):
    /// raid0 chunk × n, raid4/5/6 chunk × data disks, raid10 chunk × n/nc when nc divides n
    /// (else chunk × n); 4096 for linear/raid1, which have no stripe.
    pub fn optimal_io_bytes(&self) -> u64 {
        let chunk_bytes = u64::from(self.chunk_sectors) * crate::SECTOR_BYTES;
        match &self.kind {
            Kind::Linear(_) | Kind::Raid1 { .. } => 4096,
            Kind::Raid0(g) => chunk_bytes * g.raid_disks() as u64,
            Kind::Parity(g) => chunk_bytes * g.data_disks() as u64,
            Kind::Raid10(g) => chunk_bytes * g.stripe_width_chunks() as u64,
        }
    }

    /// md's `size` (`mdadm --size`): what every member holds for a level that uses the same
    /// size on each (raid1/4/5/6/10); 0 for linear and raid0, which use whole members.
    pub fn component_sectors(&self) -> u64 {
        match &self.kind {
            Kind::Linear(_) | Kind::Raid0(_) => 0,
            Kind::Raid1 { size_sectors, .. } => *size_sectors,
            Kind::Parity(g) => g.size_sectors(),
            Kind::Raid10(g) => g.size_sectors(),
        }
    }

    /// The unit md's `size` is rounded down to, as raidnbd creates and resizes arrays: the
    /// chunk, or 64 KiB for raid1 (so that a later raid5 conversion has a chunk), or the
    /// rounding of a linear array's members.
    pub fn component_rounding_sectors(level: Level, chunk_sectors: u32) -> u64 {
        match level {
            Level::Raid1 => 128,
            _ => u64::from(chunk_sectors).max(1),
        }
    }

    /// md's resync address space: member sectors for raid1/4/5/6 (`size`), array
    /// sectors for raid10; 0 for linear/raid0 (no redundancy).
    pub fn resync_sectors(&self) -> u64 {
        match &self.kind {
            Kind::Linear(_) | Kind::Raid0(_) => 0,
            Kind::Raid1 { size_sectors, .. } => *size_sectors,
            Kind::Parity(g) => g.size_sectors(),
            Kind::Raid10(g) => g.array_sectors(),
        }
    }
}
