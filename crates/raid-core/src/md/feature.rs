//! `feature_map` bits (`md_p.h` MD_FEATURE_*; `md-format.md` §1.4) and which of them raidnbd
//! implements.
//!
//! Some bits describe the whole array (bitmap, reshape, journal, PPL, raid0 layout), others only
//! the device whose superblock carries them (recovery offset, bad blocks, replacement, new offset,
//! recovery bitmap): the kernel rebuilds the map for each device on every superblock write, so the
//! per-device bits legitimately differ between members.

use std::fmt;
use std::ops::{BitAnd, BitOr, BitOrAssign};

/// A `feature_map` value.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FeatureMap(pub u32);

impl FeatureMap {
    /// `bitmap_offset` is valid: an internal write-intent bitmap exists.
    pub const BITMAP_OFFSET: FeatureMap = FeatureMap(1);
    /// Per device: partly rebuilt, honour `recovery_offset`.
    pub const RECOVERY_OFFSET: FeatureMap = FeatureMap(2);
    /// Reshape in progress; fields 100..127 valid.
    pub const RESHAPE_ACTIVE: FeatureMap = FeatureMap(4);
    /// Per device: the bad-block log is not empty.
    pub const BAD_BLOCKS: FeatureMap = FeatureMap(8);
    /// Per device: replacing the active device with the same role.
    pub const REPLACEMENT: FeatureMap = FeatureMap(16);
    /// Reshape runs backwards.
    pub const RESHAPE_BACKWARDS: FeatureMap = FeatureMap(32);
    /// Per device: honour `new_offset`.
    pub const NEW_OFFSET: FeatureMap = FeatureMap(64);
    /// Per device: the recovery is driven by the bitmap.
    pub const RECOVERY_BITMAP: FeatureMap = FeatureMap(128);
    /// md-cluster.
    pub const CLUSTERED: FeatureMap = FeatureMap(256);
    /// raid4/5/6 write journal.
    pub const JOURNAL: FeatureMap = FeatureMap(512);
    /// Partial parity log.
    pub const PPL: FeatureMap = FeatureMap(1024);
    /// Several PPLs.
    pub const MULTIPLE_PPLS: FeatureMap = FeatureMap(2048);
    /// `layout` is meaningful for raid0.
    pub const RAID0_LAYOUT: FeatureMap = FeatureMap(4096);

    /// `MD_FEATURE_ALL`: every bit the kernel knows; anything else is refused.
    pub const ALL: FeatureMap = FeatureMap(0x1fff);

    /// Bits that only describe the device carrying them.
    pub const PER_DEVICE: FeatureMap = FeatureMap(2 | 8 | 16 | 64 | 128);

    /// Bits raidnbd refuses to assemble: they need machinery it does not have (a reshape in
    /// progress, `RESHAPE_ACTIVE`, is checked at assembly: `reshape.rs`).
    pub const UNSUPPORTED: FeatureMap = FeatureMap(32 | 256);

    /// Either PPL bit: the array has md's partial parity log.
    pub const ANY_PPL: FeatureMap = FeatureMap(1024 | 2048);

    pub const fn empty() -> FeatureMap {
        FeatureMap(0)
    }

    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Whether every bit of `other` is set.
    pub const fn contains(self, other: FeatureMap) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any bit of `other` is set.
    pub const fn intersects(self, other: FeatureMap) -> bool {
        self.0 & other.0 != 0
    }

    pub fn insert(&mut self, other: FeatureMap) {
        self.0 |= other.0;
    }

    pub fn remove(&mut self, other: FeatureMap) {
        self.0 &= !other.0;
    }

    /// `self` without the bits of `other`.
    pub const fn without(self, other: FeatureMap) -> FeatureMap {
        FeatureMap(self.0 & !other.0)
    }

    /// The array-wide part.
    pub const fn array_bits(self) -> FeatureMap {
        self.without(Self::PER_DEVICE)
    }

    /// The per-device part.
    pub const fn device_bits(self) -> FeatureMap {
        FeatureMap(self.0 & Self::PER_DEVICE.0)
    }

    /// Names of the set bits (unknown bits as hex), for messages.
    pub fn names(self) -> Vec<String> {
        const NAMES: [&str; 13] = [
            "BITMAP_OFFSET",
            "RECOVERY_OFFSET",
            "RESHAPE_ACTIVE",
            "BAD_BLOCKS",
            "REPLACEMENT",
            "RESHAPE_BACKWARDS",
            "NEW_OFFSET",
            "RECOVERY_BITMAP",
            "CLUSTERED",
            "JOURNAL",
            "PPL",
            "MULTIPLE_PPLS",
            "RAID0_LAYOUT",
        ];
        (0..32)
            .filter(|bit| self.0 & (1 << bit) != 0)
            .map(|bit| NAMES.get(bit).map_or_else(|| format!("{:#x}", 1u32 << bit), |n| (*n).to_string()))
            .collect()
    }
}

impl BitOr for FeatureMap {
    type Output = FeatureMap;
    fn bitor(self, rhs: FeatureMap) -> FeatureMap {
        FeatureMap(self.0 | rhs.0)
    }
}

impl BitOrAssign for FeatureMap {
    fn bitor_assign(&mut self, rhs: FeatureMap) {
        self.0 |= rhs.0;
    }
}

impl BitAnd for FeatureMap {
    type Output = FeatureMap;
    fn bitand(self, rhs: FeatureMap) -> FeatureMap {
        FeatureMap(self.0 & rhs.0)
    }
}

impl fmt::Debug for FeatureMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FeatureMap({:#x} {})", self.0, self.names().join("|"))
    }
}

impl fmt::Display for FeatureMap {
    /// `0x1001 (BITMAP_OFFSET, RAID0_LAYOUT)`; mdadm prints the hex part as "Feature Map".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            return f.write_str("0x0");
        }
        write!(f, "{:#x} ({})", self.0, self.names().join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_are_consistent() {
        assert_eq!(FeatureMap::ALL.0, 0x1fff);
        assert!(FeatureMap::ALL.contains(FeatureMap::PER_DEVICE));
        assert!(FeatureMap::ALL.contains(FeatureMap::UNSUPPORTED));
        assert!(!FeatureMap::PER_DEVICE.intersects(FeatureMap::UNSUPPORTED));
        let map = FeatureMap::BITMAP_OFFSET | FeatureMap::RECOVERY_OFFSET | FeatureMap::RAID0_LAYOUT;
        assert_eq!(map.array_bits(), FeatureMap::BITMAP_OFFSET | FeatureMap::RAID0_LAYOUT);
        assert_eq!(map.device_bits(), FeatureMap::RECOVERY_OFFSET);
        assert_eq!(map.to_string(), "0x1003 (BITMAP_OFFSET, RECOVERY_OFFSET, RAID0_LAYOUT)");
        assert_eq!(FeatureMap(0x8000).names(), vec!["0x8000".to_string()]);
    }
}
