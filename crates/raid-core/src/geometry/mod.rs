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
pub use raid0::Raid0Geometry;
pub use raid10::Raid10Geometry;

/// Largest number of member slots an array may have (md v1.2 allows more; we cap it to
/// keep per-stripe state small and bounded).
pub const MAX_RAID_DISKS: usize = 64;

/// Smallest and largest chunk the engine accepts, in sectors (4 KiB .. 64 MiB).
pub const MIN_CHUNK_SECTORS: u32 = 8;
pub const MAX_CHUNK_SECTORS: u32 = 128 * 1024;

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
    /// For raid10 the order is md's: near copies first, then far copies.
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

impl Geometry {
    /// Builds the geometry of an array.
    ///
    /// `member_sectors[role]` is the usable size of each member's data area:
    /// - linear and raid0: md's per-device `data_size` (each is rounded down to the chunk /
    ///   rounding internally, as the kernel does);
    /// - raid1/4/5/6/10: md's array-wide `size` (the same value for every role; the engine
    ///   passes `sb.size` for all of them).
    ///
    /// `chunk_sectors` is md's `chunksize` (for linear: the rounding, 0 = none; raid1: ignored).
    pub fn new(level: Level, layout: u32, chunk_sectors: u32, member_sectors: &[u64]) -> Result<Self, GeometryError> {
        todo!("geometry: validate and build the per-level geometry")
    }

    pub fn level(&self) -> Level {
        self.level
    }

    /// md's raw layout value.
    pub fn layout(&self) -> u32 {
        self.layout
    }

    pub fn chunk_sectors(&self) -> u32 {
        self.chunk_sectors
    }

    pub fn raid_disks(&self) -> usize {
        todo!()
    }

    /// Size of the array in sectors.
    pub fn array_sectors(&self) -> u64 {
        todo!()
    }

    /// How many members can be missing at most without losing data, in the best case
    /// (raid10: `nc*fc - 1`; the exact answer for a given set is [`Geometry::survives`]).
    pub fn max_failures(&self) -> usize {
        todo!()
    }

    /// Whether the array still holds every byte when the members in `missing` (roles) are gone.
    pub fn survives(&self, missing: &[usize]) -> bool {
        todo!()
    }

    /// Where `array_sector` lives. See [`Mapped`].
    ///
    /// # Panics
    /// If `array_sector >= array_sectors()`.
    pub fn map(&self, array_sector: u64) -> Mapped {
        todo!()
    }

    /// Stripe geometry for raid4/5/6, `None` for the other levels.
    pub fn parity(&self) -> Option<&ParityGeometry> {
        match &self.kind {
            Kind::Parity(p) => Some(p),
            _ => None,
        }
    }

    /// Preferred I/O size in bytes for clients: the full data stripe width for striped
    /// levels (chunk × data disks), the chunk for raid10 n-layouts as md computes
    /// `optimal_io_size`, 4096 for linear/raid1.
    pub fn optimal_io_bytes(&self) -> u64 {
        todo!()
    }

    /// md's resync address space: member sectors for raid1/4/5/6 (`size`), array
    /// sectors for raid10; 0 for linear/raid0 (no redundancy).
    pub fn resync_sectors(&self) -> u64 {
        todo!()
    }
}
