//! raid4/5/6 stripe geometry: which role holds P, Q and each data block of a stripe, and
//! the Q coefficient of each data block (`raid5.c` raid5_compute_sector,
//! raid6_idx_to_slot; `md-format.md` §2.4-2.5).
//!
//! A *stripe* is one chunk-row across all members: stripe `s` occupies member sectors
//! `[s*chunk, (s+1)*chunk)` on every member. Data index `k` (0..data_disks) is the k-th
//! chunk of array data in that stripe.
//!
//! ```text
//!  raid5 left-symmetric, 5 disks      raid6 left-symmetric, 5 disks
//!   D0  D1  D2  D3  P                  Q   D0  D1  D2  P
//!   D5  D6  D7  P   D4                 D3  D4  D5  P   Q
//!   D10 D11 P   D8  D9                 D7  D8  P   Q   D6
//! ```
//!
//! The Q coefficient order is not the data index order in general: md walks the roles
//! starting just after Q (role 0 if Q is last), skipping P and Q, and gives the j-th data
//! block met `g^j` (raid6_d0 / raid6_idx_to_slot). DDF layouts (8-10) instead use
//! `g^role` with P and Q counted as zero blocks. Getting this wrong silently corrupts
//! every raid6 array written by the kernel, hence the exhaustive vectors in the tests.

use super::{Extent, GeometryError, Level, Mapped, ParityLayout, check_chunk, check_member_count};

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
    /// Validates and builds. `layout` is md's raw value: raid4 accepts any (parity is always
    /// on the last role; [`ParityGeometry::layout`] then reports `ParityLast`), raid5 0-5,
    /// raid6 0-5, 8-10, 16-20. `size_sectors` (md `size`) is rounded down to the chunk.
    pub fn new(
        level: Level,
        layout: u32,
        chunk_sectors: u32,
        raid_disks: usize,
        size_sectors: u64,
    ) -> Result<Self, GeometryError> {
        let bad_layout = GeometryError::BadLayout { level, layout };
        let parsed = match level {
            Level::Raid4 => ParityLayout::ParityLast,
            Level::Raid5 | Level::Raid6 => {
                ParityLayout::from_md(layout).filter(|l| l.valid_for(level)).ok_or(bad_layout)?
            }
            _ => return Err(bad_layout),
        };
        check_member_count(level, raid_disks)?;
        check_chunk(chunk_sectors)?;
        if size_sectors > super::MAX_MEMBER_SECTORS {
            return Err(GeometryError::MemberTooLarge { role: 0, sectors: size_sectors });
        }
        let rounded = size_sectors - size_sectors % u64::from(chunk_sectors);
        if rounded == 0 {
            return Err(GeometryError::MemberTooSmall { role: 0, sectors: size_sectors });
        }
        Ok(ParityGeometry { level, layout: parsed, chunk_sectors, raid_disks, size_sectors: rounded })
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

    /// md `size` rounded down to the chunk: member sectors used, = md's resync space.
    pub fn size_sectors(&self) -> u64 {
        self.size_sectors
    }

    /// Array size in sectors (`size × data disks`).
    pub fn array_sectors(&self) -> u64 {
        self.size_sectors * self.data_disks() as u64
    }

    /// Number of stripes (= size / chunk).
    pub fn stripes(&self) -> u64 {
        self.size_sectors / u64::from(self.chunk_sectors)
    }

    /// Array sectors covered by one stripe (chunk × data disks).
    pub fn stripe_data_sectors(&self) -> u64 {
        u64::from(self.chunk_sectors) * self.data_disks() as u64
    }

    /// Whether Q uses DDF's coefficient order (`g^role`, layouts 8-10).
    pub fn is_ddf(&self) -> bool {
        matches!(self.layout, ParityLayout::DdfZeroRestart | ParityLayout::DdfNRestart | ParityLayout::DdfNContinue)
    }

    /// (stripe, data index, sector offset within the chunk) of an array sector.
    pub fn locate(&self, array_sector: u64) -> (u64, usize, u32) {
        let chunk = u64::from(self.chunk_sectors);
        let chunk_number = array_sector / chunk;
        let data_disks = self.data_disks() as u64;
        ((chunk_number / data_disks), (chunk_number % data_disks) as usize, (array_sector % chunk) as u32)
    }

    /// First array sector of data index `data_index` of stripe `stripe` (inverse of
    /// [`ParityGeometry::locate`]).
    pub fn data_array_sector(&self, stripe: u64, data_index: usize) -> u64 {
        debug_assert!(data_index < self.data_disks());
        (stripe * self.data_disks() as u64 + data_index as u64) * u64::from(self.chunk_sectors)
    }

    /// The data block of `array_sector` (`< array_sectors()`); the run ends at the chunk end.
    pub fn map(&self, array_sector: u64) -> Mapped {
        let (stripe, data_index, offset) = self.locate(array_sector);
        let role = self.data_role(stripe, data_index);
        let member_sector = self.stripe_member_sector(stripe) + u64::from(offset);
        debug_assert!(member_sector < self.size_sectors);
        Mapped { copies: vec![Extent { role, member_sector }], len_sectors: u64::from(self.chunk_sectors - offset) }
    }

    /// The role holding data index `data_index` (`< data_disks()`) of stripe `stripe`.
    pub fn data_role(&self, stripe: u64, data_index: usize) -> usize {
        let (_, _, role) = self.compute(stripe, data_index);
        role
    }

    /// The roles of stripe `stripe`.
    pub fn stripe(&self, stripe: u64) -> StripeLayout {
        let n = self.raid_disks;
        let (p_role, q_role, _) = self.compute(stripe, 0);
        let data_roles: Vec<usize> = (0..self.data_disks()).map(|k| self.compute(stripe, k).2).collect();
        let q_exponents = match q_role {
            None => Vec::new(),
            Some(_) if self.is_ddf() => data_roles.iter().map(|&r| r as u8).collect(),
            Some(q) => {
                // raid6_d0 + raid6_idx_to_slot: walk from just after Q, skipping P and Q.
                let first = if q == n - 1 { 0 } else { q + 1 };
                let mut exponent_of_role = vec![u8::MAX; n];
                let walk = (0..n).map(|i| (first + i) % n).filter(|&r| r != p_role && r != q);
                for (exponent, role) in walk.enumerate() {
                    exponent_of_role[role] = exponent as u8;
                }
                data_roles.iter().map(|&r| exponent_of_role[r]).collect()
            }
        };
        let layout = StripeLayout { p_role, q_role, data_roles, q_exponents };
        debug_assert!(stripe_is_consistent(&layout, n));
        layout
    }

    /// First member sector (relative to data offset) of stripe `stripe`.
    pub fn stripe_member_sector(&self, stripe: u64) -> u64 {
        stripe * u64::from(self.chunk_sectors)
    }

    /// (P role, Q role, role of data index `k`) of stripe `stripe`, transcribed from
    /// `raid5_compute_sector` case by case.
    fn compute(&self, stripe: u64, k: usize) -> (usize, Option<usize>, usize) {
        use ParityLayout as L;
        let n = self.raid_disks;
        let data_disks = self.data_disks();
        debug_assert!(k < data_disks);
        let rot = |m: usize| (stripe % m as u64) as usize;
        let (p, q, d) = match self.level {
            Level::Raid4 => (data_disks, None, k),
            Level::Raid5 => {
                let p = match self.layout {
                    L::LeftAsymmetric | L::LeftSymmetric => data_disks - rot(n),
                    L::RightAsymmetric | L::RightSymmetric => rot(n),
                    L::ParityFirst => 0,
                    _ => data_disks,
                };
                let d = match self.layout {
                    L::LeftAsymmetric | L::RightAsymmetric => k + usize::from(k >= p),
                    L::LeftSymmetric | L::RightSymmetric => (p + 1 + k) % n,
                    L::ParityFirst => k + 1,
                    _ => k,
                };
                (p, None, d)
            }
            _ => match self.layout {
                L::LeftAsymmetric | L::RightAsymmetric | L::DdfZeroRestart | L::DdfNRestart => {
                    let p = match self.layout {
                        L::LeftAsymmetric => n - 1 - rot(n),
                        // ddf-N-restart: left-asymmetric computed with stripe + 1.
                        L::DdfNRestart => n - 1 - (rot(n) + 1) % n,
                        _ => rot(n),
                    };
                    if p == n - 1 { (p, Some(0), k + 1) } else { (p, Some(p + 1), if k >= p { k + 2 } else { k }) }
                }
                L::LeftSymmetric | L::RightSymmetric => {
                    let p = if self.layout == L::LeftSymmetric { n - 1 - rot(n) } else { rot(n) };
                    (p, Some((p + 1) % n), (p + 2 + k) % n)
                }
                L::ParityFirst => (0, Some(1), k + 2),
                L::ParityLast => (data_disks, Some(data_disks + 1), k),
                L::DdfNContinue => {
                    let p = n - 1 - rot(n);
                    (p, Some((p + n - 1) % n), (p + 1 + k) % n)
                }
                L::LeftAsymmetric6 | L::RightAsymmetric6 => {
                    let p = if self.layout == L::LeftAsymmetric6 { data_disks - rot(n - 1) } else { rot(n - 1) };
                    (p, Some(n - 1), k + usize::from(k >= p))
                }
                L::LeftSymmetric6 | L::RightSymmetric6 => {
                    let p = if self.layout == L::LeftSymmetric6 { data_disks - rot(n - 1) } else { rot(n - 1) };
                    (p, Some(n - 1), (p + 1 + k) % (n - 1))
                }
                L::ParityFirst6 => (0, Some(n - 1), k + 1),
            },
        };
        debug_assert!(p < n && d < n && d != p);
        debug_assert!(q.is_none_or(|q| q < n && q != p && q != d));
        (p, q, d)
    }
}

/// Every role used once: data roles distinct, P/Q apart from them and each other, Q
/// exponents distinct.
fn stripe_is_consistent(layout: &StripeLayout, raid_disks: usize) -> bool {
    let mut seen = vec![false; raid_disks];
    let all = layout.data_roles.iter().chain(std::iter::once(&layout.p_role)).chain(layout.q_role.iter());
    for &role in all {
        if role >= raid_disks || std::mem::replace(&mut seen[role], true) {
            return false;
        }
    }
    let mut exponents = layout.q_exponents.clone();
    exponents.sort_unstable();
    exponents.dedup();
    exponents.len() == layout.q_exponents.len()
        && (layout.q_role.is_none() || layout.q_exponents.len() == layout.data_roles.len())
}
