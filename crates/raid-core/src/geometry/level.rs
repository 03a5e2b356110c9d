//! RAID levels and md's layout encodings (`md-format.md` §1.10).

use std::fmt;

/// A RAID level as md numbers it in the superblock `level` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Level {
    /// md level -1: members concatenated in role order.
    Linear,
    Raid0,
    Raid1,
    Raid4,
    Raid5,
    Raid6,
    Raid10,
}

impl Level {
    /// The md superblock value.
    pub fn to_md(self) -> i32 {
        match self {
            Level::Linear => -1,
            Level::Raid0 => 0,
            Level::Raid1 => 1,
            Level::Raid4 => 4,
            Level::Raid5 => 5,
            Level::Raid6 => 6,
            Level::Raid10 => 10,
        }
    }

    pub fn from_md(level: i32) -> Option<Level> {
        Some(match level {
            -1 => Level::Linear,
            0 => Level::Raid0,
            1 => Level::Raid1,
            4 => Level::Raid4,
            5 => Level::Raid5,
            6 => Level::Raid6,
            10 => Level::Raid10,
            _ => return None,
        })
    }

    /// Parses what users type: `linear`, `0`, `raid0`, `stripe`, `1`, `mirror`, `raid5`, `5`, ...
    pub fn parse(text: &str) -> Option<Level> {
        let t = text.trim().to_ascii_lowercase();
        let t = t.strip_prefix("raid").unwrap_or(&t);
        Some(match t {
            "linear" | "-1" => Level::Linear,
            "0" | "stripe" => Level::Raid0,
            "1" | "mirror" => Level::Raid1,
            "4" => Level::Raid4,
            "5" => Level::Raid5,
            "6" => Level::Raid6,
            "10" => Level::Raid10,
            _ => return None,
        })
    }

    /// Fewest members md accepts for this level (raid4/5 need 2, raid6 4, raid10 2).
    pub fn min_members(self) -> usize {
        match self {
            Level::Linear | Level::Raid0 | Level::Raid1 => 1,
            Level::Raid4 | Level::Raid5 | Level::Raid10 => 2,
            Level::Raid6 => 4,
        }
    }

    /// Number of parity blocks per stripe (raid4/5: 1, raid6: 2, others 0).
    pub fn parity_blocks(self) -> usize {
        match self {
            Level::Raid4 | Level::Raid5 => 1,
            Level::Raid6 => 2,
            _ => 0,
        }
    }

    /// md's default layout value for a new array of this level.
    pub fn default_layout(self) -> u32 {
        match self {
            Level::Raid5 | Level::Raid6 => ParityLayout::LeftSymmetric as u32,
            Level::Raid4 => 0,
            Level::Raid10 => Raid10Layout::DEFAULT.to_md(),
            Level::Raid0 => Raid0Layout::Original as u32,
            Level::Linear | Level::Raid1 => 0,
        }
    }

    /// Whether the level has a chunk size (linear has a "rounding", raid1 has neither).
    pub fn has_chunk(self) -> bool {
        !matches!(self, Level::Raid1 | Level::Linear)
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Linear => "linear",
            Level::Raid0 => "raid0",
            Level::Raid1 => "raid1",
            Level::Raid4 => "raid4",
            Level::Raid5 => "raid5",
            Level::Raid6 => "raid6",
            Level::Raid10 => "raid10",
        })
    }
}

/// md's raid4/5/6 layout codes (`drivers/md/raid5.h` ALGORITHM_*).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ParityLayout {
    LeftAsymmetric = 0,
    RightAsymmetric = 1,
    LeftSymmetric = 2,
    RightSymmetric = 3,
    ParityFirst = 4,
    ParityLast = 5,
    /// raid6 only: DDF layouts with DDF Q coefficient order.
    DdfZeroRestart = 8,
    DdfNRestart = 9,
    DdfNContinue = 10,
    /// raid6 only: a raid5 layout over roles 0..n-2 with Q on the last role.
    LeftAsymmetric6 = 16,
    RightAsymmetric6 = 17,
    LeftSymmetric6 = 18,
    RightSymmetric6 = 19,
    ParityFirst6 = 20,
}

impl ParityLayout {
    pub const ALL: [ParityLayout; 14] = [
        ParityLayout::LeftAsymmetric,
        ParityLayout::RightAsymmetric,
        ParityLayout::LeftSymmetric,
        ParityLayout::RightSymmetric,
        ParityLayout::ParityFirst,
        ParityLayout::ParityLast,
        ParityLayout::DdfZeroRestart,
        ParityLayout::DdfNRestart,
        ParityLayout::DdfNContinue,
        ParityLayout::LeftAsymmetric6,
        ParityLayout::RightAsymmetric6,
        ParityLayout::LeftSymmetric6,
        ParityLayout::RightSymmetric6,
        ParityLayout::ParityFirst6,
    ];

    pub fn from_md(code: u32) -> Option<ParityLayout> {
        Self::ALL.into_iter().find(|l| *l as u32 == code)
    }

    /// Whether md accepts this layout for `level` (raid4 ignores the layout; 8-20 are raid6 only).
    pub fn valid_for(self, level: Level) -> bool {
        match level {
            Level::Raid4 => true,
            Level::Raid5 => (self as u32) <= 5,
            Level::Raid6 => true,
            _ => false,
        }
    }

    /// The roles of a `raid_disks` array of `level` in this layout that hold parity (P or Q)
    /// in every stripe, never data: raid4's last, `parity-first`'s first, the `*-6` layouts'
    /// last (Q), ... Missing only these, a dirty array still has all its data.
    pub fn parity_only_roles(self, level: Level, raid_disks: usize) -> Vec<usize> {
        let n = raid_disks;
        match (level, self) {
            (Level::Raid4, _) => vec![n - 1],
            (Level::Raid5, ParityLayout::ParityFirst) => vec![0],
            (Level::Raid5, ParityLayout::ParityLast) => vec![n - 1],
            (Level::Raid6, ParityLayout::ParityFirst) => vec![0, 1],
            (Level::Raid6, ParityLayout::ParityLast) => vec![n - 2, n - 1],
            (Level::Raid6, ParityLayout::ParityFirst6) => vec![0, n - 1],
            (
                Level::Raid6,
                ParityLayout::LeftAsymmetric6
                | ParityLayout::RightAsymmetric6
                | ParityLayout::LeftSymmetric6
                | ParityLayout::RightSymmetric6,
            ) => vec![n - 1],
            _ => Vec::new(),
        }
    }

    /// mdadm's name (`left-symmetric`, `parity-last`, `ddf-zero-restart`, `left-symmetric-6`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ParityLayout::LeftAsymmetric => "left-asymmetric",
            ParityLayout::RightAsymmetric => "right-asymmetric",
            ParityLayout::LeftSymmetric => "left-symmetric",
            ParityLayout::RightSymmetric => "right-symmetric",
            ParityLayout::ParityFirst => "parity-first",
            ParityLayout::ParityLast => "parity-last",
            ParityLayout::DdfZeroRestart => "ddf-zero-restart",
            ParityLayout::DdfNRestart => "ddf-N-restart",
            ParityLayout::DdfNContinue => "ddf-N-continue",
            ParityLayout::LeftAsymmetric6 => "left-asymmetric-6",
            ParityLayout::RightAsymmetric6 => "right-asymmetric-6",
            ParityLayout::LeftSymmetric6 => "left-symmetric-6",
            ParityLayout::RightSymmetric6 => "right-symmetric-6",
            ParityLayout::ParityFirst6 => "parity-first-6",
        }
    }

    /// Parses mdadm's names and the short forms `ls`, `la`, `rs`, `ra` (case-insensitive).
    pub fn parse(text: &str) -> Option<ParityLayout> {
        let t = text.trim().to_ascii_lowercase();
        let short = match t.as_str() {
            "la" => Some(ParityLayout::LeftAsymmetric),
            "ra" => Some(ParityLayout::RightAsymmetric),
            "ls" => Some(ParityLayout::LeftSymmetric),
            "rs" => Some(ParityLayout::RightSymmetric),
            _ => None,
        };
        short.or_else(|| Self::ALL.into_iter().find(|l| l.name().eq_ignore_ascii_case(&t)))
    }
}

/// md's raid0 layout values; only meaningful for multi-zone arrays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Raid0Layout {
    Unspecified = 0,
    /// Pre-3.14 kernels (mdadm's default for new v1 arrays).
    Original = 1,
    /// 3.14+ kernels.
    Alternate = 2,
}

impl Raid0Layout {
    pub fn from_md(code: u32) -> Option<Raid0Layout> {
        match code {
            0 => Some(Raid0Layout::Unspecified),
            1 => Some(Raid0Layout::Original),
            2 => Some(Raid0Layout::Alternate),
            _ => None,
        }
    }
}

/// md's raid10 layout: near copies, far copies and the offset flag (`raid10.c` setup_geo).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Raid10Layout {
    pub near_copies: u32,
    pub far_copies: u32,
    /// With `far_copies > 1`: copies sit one chunk-stripe apart ("o2") instead of far ("f2").
    pub offset: bool,
}

impl Raid10Layout {
    /// mdadm's default: n2.
    pub const DEFAULT: Raid10Layout = Raid10Layout { near_copies: 2, far_copies: 1, offset: false };

    /// Encodes as md's layout integer (bits 0-7 near, 8-15 far, 16 offset).
    pub fn to_md(self) -> u32 {
        self.near_copies | (self.far_copies << 8) | (u32::from(self.offset) << 16)
    }

    /// Decodes md's layout integer; `None` for the far-set modes md marks invalid or buggy
    /// (bits 17 and above) and for zero copy counts.
    pub fn from_md(layout: u32) -> Option<Raid10Layout> {
        if layout >> 17 != 0 {
            return None;
        }
        let near_copies = layout & 0xff;
        let far_copies = (layout >> 8) & 0xff;
        if near_copies == 0 || far_copies == 0 {
            return None;
        }
        Some(Raid10Layout { near_copies, far_copies, offset: layout & (1 << 16) != 0 })
    }

    /// Only near copies (`n2`, `n3`, ...): the layouts raidnbd reshapes.
    pub fn is_near(self) -> bool {
        self.far_copies == 1 && !self.offset
    }

    /// Total copies of each chunk.
    pub fn copies(self) -> u32 {
        self.near_copies * self.far_copies
    }

    /// Parses `n2`, `f2`, `o3`, ... as mdadm does.
    pub fn parse(text: &str) -> Option<Raid10Layout> {
        let t = text.trim().to_ascii_lowercase();
        let mut chars = t.chars();
        let kind = chars.next()?;
        let count: u32 = chars.as_str().parse().ok().filter(|c| (1..=255).contains(c))?;
        match kind {
            'n' => Some(Raid10Layout { near_copies: count, far_copies: 1, offset: false }),
            'f' => Some(Raid10Layout { near_copies: 1, far_copies: count, offset: false }),
            'o' => Some(Raid10Layout { near_copies: 1, far_copies: count, offset: true }),
            _ => None,
        }
    }

    /// mdadm's short name (`n2`, `f2`, `o2`; `n2f2` style when both are > 1).
    pub fn name(self) -> String {
        match (self.near_copies, self.far_copies, self.offset) {
            (n, 1, _) => format!("n{n}"),
            (1, f, false) => format!("f{f}"),
            (1, f, true) => format!("o{f}"),
            (n, f, false) => format!("n{n}f{f}"),
            (n, f, true) => format!("n{n}o{f}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raid10_layout_codes_match_mdadm() {
        assert_eq!(Raid10Layout::parse("n2").unwrap().to_md(), 0x102);
        assert_eq!(Raid10Layout::parse("f2").unwrap().to_md(), 0x201);
        assert_eq!(Raid10Layout::parse("o2").unwrap().to_md(), 0x10201);
        assert_eq!(Raid10Layout::parse("n3").unwrap().to_md(), 0x103);
        assert_eq!(Raid10Layout::from_md(0x102), Some(Raid10Layout::DEFAULT));
        assert_eq!(Raid10Layout::from_md(0x20102), None);
    }

    #[test]
    fn level_parse() {
        assert_eq!(Level::parse("raid5"), Some(Level::Raid5));
        assert_eq!(Level::parse("10"), Some(Level::Raid10));
        assert_eq!(Level::parse("linear"), Some(Level::Linear));
        assert_eq!(Level::parse("7"), None);
        for l in [Level::Linear, Level::Raid0, Level::Raid1, Level::Raid4, Level::Raid5, Level::Raid6, Level::Raid10] {
            assert_eq!(Level::from_md(l.to_md()), Some(l));
            assert_eq!(Level::parse(&l.to_string()), Some(l));
        }
    }

    #[test]
    fn parity_layout_names() {
        for l in ParityLayout::ALL {
            assert_eq!(ParityLayout::parse(l.name()), Some(l));
            assert_eq!(ParityLayout::from_md(l as u32), Some(l));
        }
        assert_eq!(ParityLayout::parse("ls"), Some(ParityLayout::LeftSymmetric));
    }
}
