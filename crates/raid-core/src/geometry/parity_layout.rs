//! raid4/5/6 stripe geometry: which role holds P, Q and each data block of a stripe, and
//! the Q coefficient of each data block (`raid5.c` raid5_compute_sector,
//! raid6_idx_to_slot; `md-format.md` §2.4-2.5).
//!
//! A *stripe* is one chunk-row across all members: stripe `s` occupies member sectors
//! `[s*chunk, (s+1)*chunk)` on every member. Data index `k` (0..data_disks) is the k-th
//! chunk of array data in that stripe.

use super::{GeometryError, Level, ParityLayout};

/// Stripe geometry of a raid4/5/6 array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParityGeometry {
    level: Level,
    layout: ParityLayout,
    chunk_sectors: u32,
    raid_disks: usize,
    /// md `size`: sectors of each member used by the array, a multiple of the chunk.
    size_sectors: u64,
}

/// Roles of one stripe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StripeLayout {
    pub p_role: usize,
    /// raid6 only.
    pub q_role: Option<usize>,
    /// `data_roles[k]` = role holding data index k; length = data disks.
    pub data_roles: Vec<usize>,
    /// raid6 only: `q_exponents[k]` = e such that Q includes g^e · D_k (md's
    /// raid6_idx_to_slot order for md layouts, g^role for DDF layouts). Empty for raid4/5.
    pub q_exponents: Vec<u8>,
}

impl ParityGeometry {
    pub fn new(
        level: Level,
        layout: u32,
        chunk_sectors: u32,
        raid_disks: usize,
        size_sectors: u64,
    ) -> Result<Self, GeometryError> {
        todo!()
    }

    pub fn level(&self) -> Level {
        self.level
    }

    pub fn layout(&self) -> ParityLayout {
        self.layout
    }

    pub fn chunk_sectors(&self) -> u32 {
        self.chunk_sectors
    }

    pub fn raid_disks(&self) -> usize {
        self.raid_disks
    }

    /// 1 for raid4/5, 2 for raid6.
    pub fn parity_disks(&self) -> usize {
        self.level.parity_blocks()
    }

    pub fn data_disks(&self) -> usize {
        self.raid_disks - self.parity_disks()
    }

    /// Number of stripes (= size / chunk).
    pub fn stripes(&self) -> u64 {
        self.size_sectors / u64::from(self.chunk_sectors)
    }

    /// Array sectors covered by one stripe (chunk × data disks).
    pub fn stripe_data_sectors(&self) -> u64 {
        u64::from(self.chunk_sectors) * self.data_disks() as u64
    }

    /// (stripe, data index, sector offset within the chunk) of an array sector.
    pub fn locate(&self, array_sector: u64) -> (u64, usize, u32) {
        todo!()
    }

    /// The roles of stripe `stripe`.
    pub fn stripe(&self, stripe: u64) -> StripeLayout {
        todo!()
    }

    /// First member sector (relative to data offset) of stripe `stripe`.
    pub fn stripe_member_sector(&self, stripe: u64) -> u64 {
        stripe * u64::from(self.chunk_sectors)
    }
}
