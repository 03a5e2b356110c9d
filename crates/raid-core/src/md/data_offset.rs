//! Where mdadm 4.6 puts things on a new 1.2 member (`md-format.md` §1.5; mdadm `super1.c`
//! `choose_bm_space`, `validate_geometry1`, `write_init_super1`; `Create.c` size rounding).
//!
//! ```text
//!  sector 0        8          16             16+bm_space   +8              data_offset
//!  ├── 4 KiB ──────┼ superblock ┼─ bitmap room ─┼── BBL (8) ──┼── headroom ──┼── data ... (data_size)
//! ```
//!
//! These are the defaults for a *new* array only. Existing arrays were made by many mdadm
//! releases with other rules (2048 sectors in 3.2, 132736 around 2020): always read
//! `data_offset` from each member's superblock, never recompute it.

use super::superblock::SUPER_OFFSET_1_2;

/// Sectors in 1 MiB: mdadm rounds the data offset up to this.
const ONE_MIB_SECTORS: u64 = 2048;
/// Headroom starts at 128 MiB (for later reshapes that move `data_offset`).
const MAX_HEADROOM_SECTORS: u64 = 128 * 1024 * 2;
/// mdadm's bitmap starts 4 KiB after the superblock.
pub const BITMAP_OFFSET_SECTORS: i32 = 8;
/// mdadm reserves 8 sectors (512 entries) for the bad-block log.
pub const BBLOG_SECTORS: u16 = 8;

/// `choose_bm_space`: room reserved for a write-intent bitmap on a device (or component) of
/// `sectors`: 0 below 64 KiB, 4 KiB up to 8 GiB, 64 KiB up to 200 GiB, 128 KiB above.
pub fn bitmap_space_sectors(sectors: u64) -> u64 {
    if sectors < 64 * 2 {
        0
    } else if sectors - 64 * 2 >= 200 * 1024 * 1024 * 2 {
        128 * 2
    } else if sectors - 4 * 2 > 8 * 1024 * 1024 * 2 {
        64 * 2
    } else {
        4 * 2
    }
}

/// The data offset mdadm 4.6 chooses for a 1.2 array whose first member has `device_sectors`,
/// with a chunk of `chunk_kib` KiB (0 for levels without a chunk: raid1, linear without rounding).
///
/// `24 + bitmap space + headroom`, rounded up to 1 MiB; the headroom starts at 128 MiB and is
/// halved while it exceeds about 0.1 % of the device and half of it still covers two chunks.
pub fn default_data_offset_sectors(device_sectors: u64, chunk_kib: u32) -> u64 {
    data_offset_with_space(device_sectors, chunk_kib, bitmap_space_sectors(device_sectors))
}

/// [`default_data_offset_sectors`] with `bm_space_sectors` reserved after the superblock
/// (mdadm reserves 2048, the PPL area, with `--consistency-policy=ppl`).
pub fn data_offset_with_space(device_sectors: u64, chunk_kib: u32, bm_space_sectors: u64) -> u64 {
    let chunk_twice_sectors = u64::from(chunk_kib) * 2 * 2;
    let mut headroom = MAX_HEADROOM_SECTORS;
    while (headroom << 10) > device_sectors && (chunk_kib == 0 || headroom / 2 >= chunk_twice_sectors) {
        headroom >>= 1;
    }
    (12 * 2 + bm_space_sectors + headroom).next_multiple_of(ONE_MIB_SECTORS)
}

/// Bad-block log placement as `write_init_super1` writes it for a 1.2 member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BblogPlacement {
    /// Signed sectors from the superblock.
    pub bblog_offset: i32,
    pub bblog_size: u16,
    pub bblog_shift: u8,
}

/// Where mdadm puts the (empty) bad-block log on a 1.2 member with `data_offset`, for an array
/// whose component `size` is `component_sectors` (0 for linear/raid0) and no bitmap: right after
/// the bitmap room when it fits, else just before the data, else none. The `BAD_BLOCKS`
/// feature bit stays clear: mdadm clears it at create and the kernel sets it only once the list
/// holds an entry.
pub fn default_bblog(data_offset: u64, component_sectors: u64) -> Option<BblogPlacement> {
    bblog_with_space(data_offset, bitmap_space_sectors(component_sectors))
}

/// [`default_bblog`] after `bm_space` sectors of bitmap (or PPL) room.
pub fn bblog_with_space(data_offset: u64, bm_space: u64) -> Option<BblogPlacement> {
    let sb = SUPER_OFFSET_1_2;
    let bm_offset = BITMAP_OFFSET_SECTORS as u64;
    let bblog_offset = if data_offset >= sb + bm_offset + bm_space + u64::from(BBLOG_SECTORS) {
        bm_offset + bm_space
    } else if data_offset >= sb + 16 {
        data_offset - u64::from(BBLOG_SECTORS) - sb
    } else {
        return None;
    };
    Some(BblogPlacement { bblog_offset: i32::try_from(bblog_offset).ok()?, bblog_size: BBLOG_SECTORS, bblog_shift: 0 })
}

/// `max_dev` mdadm writes for `slots` member slots: `256 + 2·slots` rounded up to whole 512-byte
/// sectors, as entries (128 for up to 128 slots).
pub fn default_max_dev(slots: u32) -> u32 {
    let sb_bytes = (256 + 2 * u64::from(slots)).next_multiple_of(512);
    ((sb_bytes - 256) / 2) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 2048;
    const GIB: u64 = 1024 * MIB;

    #[test]
    fn data_offset_matches_the_cross_checked_table() {
        // md-format.md §1.5, checked against mdadm's validate_geometry1.
        for (device_sectors, chunk512, chunk64) in [
            (20 * MIB, 4096, 2048),
            (100 * MIB, 4096, 2048),
            (512 * MIB, 4096, 2048),
            (1023 * MIB, 4096, 2048),
            (2 * GIB, 6144, 6144),
            (8 * GIB, 18432, 18432),
            (64 * GIB, 133120, 133120),
            (127 * GIB, 133120, 133120),
            (128 * GIB, 264192, 264192),
            (1024 * GIB, 264192, 264192),
            (16 * 1024 * GIB, 264192, 264192),
        ] {
            assert_eq!(default_data_offset_sectors(device_sectors, 512), chunk512, "{device_sectors} sectors, 512K");
            assert_eq!(default_data_offset_sectors(device_sectors, 64), chunk64, "{device_sectors} sectors, 64K");
        }
        // Exactly 1 GiB with a 64K chunk: headroom stops at 2048 (2048·1024 == devsize), bm 8.
        assert_eq!(default_data_offset_sectors(GIB, 64), 4096);
    }

    #[test]
    fn no_chunk_only_aims_at_a_tenth_of_a_percent() {
        // raid1: headroom halves down to ≤ devsize/1024 with no two-chunk floor.
        assert_eq!(default_data_offset_sectors(100 * MIB, 0), 2048);
        assert_eq!(default_data_offset_sectors(2 * GIB, 0), 6144);
        assert_eq!(default_data_offset_sectors(128 * GIB, 0), 264192);
        // A large chunk keeps at least two chunks of headroom: 4 MiB chunk → 2·8192 sectors.
        assert_eq!(default_data_offset_sectors(100 * MIB, 4096), (24 + 8 + 16384u64).next_multiple_of(2048));
    }

    #[test]
    fn bitmap_space_thresholds() {
        assert_eq!(bitmap_space_sectors(0), 0);
        assert_eq!(bitmap_space_sectors(127), 0);
        assert_eq!(bitmap_space_sectors(128), 8);
        assert_eq!(bitmap_space_sectors(8 * GIB + 8), 8);
        assert_eq!(bitmap_space_sectors(8 * GIB + 9), 128);
        assert_eq!(bitmap_space_sectors(200 * GIB + 127), 128);
        assert_eq!(bitmap_space_sectors(200 * GIB + 128), 256);
    }

    #[test]
    fn bblog_after_the_bitmap_room() {
        // The reference example: ≥200 GiB component, data at 264192 → BBL at 272..279 (offset 264).
        let p = default_bblog(264192, 300 * GIB).unwrap();
        assert_eq!(p, BblogPlacement { bblog_offset: 264, bblog_size: 8, bblog_shift: 0 });
        // raid0/linear: size 0 → no bitmap room, BBL right after the superblock's 4 KiB.
        assert_eq!(default_bblog(4096, 0).unwrap().bblog_offset, 8);
        // A small component: 4 KiB of bitmap room.
        assert_eq!(default_bblog(2048, 100 * MIB).unwrap().bblog_offset, 16);
        // Too little room after the bitmap: just before the data.
        assert_eq!(default_bblog(40, 300 * GIB).unwrap().bblog_offset, 24);
        assert_eq!(default_bblog(23, 0), None);
    }

    #[test]
    fn max_dev_fills_whole_sectors() {
        assert_eq!(default_max_dev(1), 128);
        assert_eq!(default_max_dev(128), 128);
        assert_eq!(default_max_dev(129), 384);
        assert_eq!(default_max_dev(1920), 1920);
    }
}
