//! One `dev_roles[]` entry: what the device with a given `dev_number` is in the array
//! (`md_p.h` MD_DISK_ROLE_*; `md-format.md` §1.7).
//!
//! `dev_roles[i]` describes the device whose `dev_number == i` (a permanent slot); the value is
//! its role: an active position `0..0xFF00`, or spare / faulty / journal. Values between
//! `0xFF00` and `0xFFFC` are reserved; the kernel would hand them to the personality as a huge
//! position, we refuse them when decoding.

use std::fmt;

/// LE16 on disk: `0xFFFF`.
pub const ROLE_SPARE: u16 = 0xFFFF;
/// LE16 on disk: `0xFFFE`.
pub const ROLE_FAULTY: u16 = 0xFFFE;
/// LE16 on disk: `0xFFFD`.
pub const ROLE_JOURNAL: u16 = 0xFFFD;
/// Active positions are below this (`MD_DISK_ROLE_MAX`).
pub const ROLE_MAX: u16 = 0xFF00;

/// The role of one device slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DevRole {
    /// Active at this position (`0..0xFF00`), md's `raid_disk`.
    Active(u16),
    /// A spare, or an unused / removed slot (mdadm fills unused entries with this).
    Spare,
    /// Failed.
    Faulty,
    /// A raid4/5/6 write-journal device.
    Journal,
}

impl DevRole {
    /// Decodes an on-disk value; `None` for the reserved range `0xFF00..=0xFFFC`.
    pub fn from_raw(raw: u16) -> Option<DevRole> {
        match raw {
            ROLE_SPARE => Some(DevRole::Spare),
            ROLE_FAULTY => Some(DevRole::Faulty),
            ROLE_JOURNAL => Some(DevRole::Journal),
            r if r < ROLE_MAX => Some(DevRole::Active(r)),
            _ => None,
        }
    }

    /// The on-disk value.
    ///
    /// # Panics
    /// If an `Active` position is not below `0xFF00` (never produced by [`DevRole::from_raw`]).
    pub fn to_raw(self) -> u16 {
        match self {
            DevRole::Active(r) => {
                assert!(r < ROLE_MAX, "active role {r:#x} is in md's reserved range");
                r
            }
            DevRole::Spare => ROLE_SPARE,
            DevRole::Faulty => ROLE_FAULTY,
            DevRole::Journal => ROLE_JOURNAL,
        }
    }

    /// The active position, if any.
    pub fn active(self) -> Option<usize> {
        match self {
            DevRole::Active(r) => Some(usize::from(r)),
            _ => None,
        }
    }
}

impl fmt::Display for DevRole {
    /// mdadm's "Device Role" words: `Active device 2`, `spare`, `faulty`, `Journal`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DevRole::Active(r) => write!(f, "Active device {r}"),
            DevRole::Spare => f.write_str("spare"),
            DevRole::Faulty => f.write_str("faulty"),
            DevRole::Journal => f.write_str("Journal"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_match_md_p_h() {
        assert_eq!(DevRole::Spare.to_raw(), 0xFFFF);
        assert_eq!(DevRole::Faulty.to_raw(), 0xFFFE);
        assert_eq!(DevRole::Journal.to_raw(), 0xFFFD);
        assert_eq!(DevRole::Active(7).to_raw(), 7);
        assert_eq!(DevRole::from_raw(0xFEFF), Some(DevRole::Active(0xFEFF)));
        for raw in 0xFF00..=0xFFFC {
            assert_eq!(DevRole::from_raw(raw), None);
        }
        for raw in (0..0xFF00).step_by(97).chain([0xFFFD, 0xFFFE, 0xFFFF]) {
            assert_eq!(DevRole::from_raw(raw).unwrap().to_raw(), raw);
        }
    }
}
