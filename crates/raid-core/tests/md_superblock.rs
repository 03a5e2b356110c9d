//! md v1.2 superblock: byte-exact field offsets, checksum (even and odd max_dev), every decode
//! rejection, single-bit corruption, round trips (proptest), and the real `mdadm --examine`
//! reading what we encode.

mod md_common;

use md_common::*;
use proptest::prelude::*;
use raid_core::ErrorKind;
use raid_core::geometry::Level;
use raid_core::md::{DevRole, FeatureMap, MdUuid, SB_CSUM_OFFSET, SUPERBLOCK_BYTES, Superblock, sb_checksum};

/// Named `md` so that `cargo test -p raid-core md` selects these tests.
mod md {
    use super::*;

    fn le32(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }

    fn le64(b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
    }

    /// Every field carries a distinct value; the offsets are the `offsetof` table of md-format.md §1.2.
    #[test]
    fn encode_places_every_field_at_its_kernel_offset() {
        let mut sb = raid5_member(2);
        sb.feature_map = FeatureMap::BITMAP_OFFSET | FeatureMap::RECOVERY_OFFSET;
        sb.ctime = 0x0102_0304_0506;
        sb.layout = 0x0a0b_0c0d;
        sb.size = 0x1111_2222_3333;
        sb.chunksize = 0x0808;
        sb.raid_disks = 4;
        sb.bitmap_offset = -24;
        sb.new_level = 6;
        sb.reshape_position = 0x4444_5555_6666;
        sb.delta_disks = -1;
        sb.new_layout = 0x77;
        sb.new_chunk = 0x99;
        sb.new_offset = -2048;
        sb.data_offset = 0x1_0000;
        sb.data_size = 0x2_0000_0000;
        sb.recovery_offset = 0x3_0000;
        sb.cnt_corrected_read = 0x55aa;
        sb.devflags = 3;
        sb.bblog_shift = 2;
        sb.bblog_size = 8;
        sb.bblog_offset = -16;
        sb.utime = 0x0607_0809_0a0b;
        sb.events = 0x0123_4567_89ab_cdef;
        sb.resync_offset = 0x7777;
        sb.dev_roles[5] = DevRole::Faulty;
        sb.dev_roles[6] = DevRole::Journal;
        sb.dev_roles.truncate(7); // odd max_dev
        let b = sb.encode();
        assert_eq!(b.len(), SUPERBLOCK_BYTES);
        assert_eq!(&b[0..4], &[0xfc, 0x4e, 0x2b, 0xa9], "magic bytes on disk");
        assert_eq!(le32(&b, 4), 1, "major_version");
        assert_eq!(le32(&b, 8), 3, "feature_map");
        assert_eq!(le32(&b, 12), 0, "pad0");
        assert_eq!(&b[16..32], &uuid(1).0, "set_uuid");
        assert_eq!(&b[32..45], b"testhost:data", "set_name");
        assert!(b[45..64].iter().all(|&x| x == 0), "set_name NUL padding");
        assert_eq!(le64(&b, 64), 0x0102_0304_0506, "ctime");
        assert_eq!(le32(&b, 72), 5, "level");
        assert_eq!(le32(&b, 76), 0x0a0b_0c0d, "layout");
        assert_eq!(le64(&b, 80), 0x1111_2222_3333, "size");
        assert_eq!(le32(&b, 88), 0x0808, "chunksize");
        assert_eq!(le32(&b, 92), 4, "raid_disks");
        assert_eq!(le32(&b, 96) as i32, -24, "bitmap_offset");
        assert_eq!(le32(&b, 100), 6, "new_level");
        assert_eq!(le64(&b, 104), 0x4444_5555_6666, "reshape_position");
        assert_eq!(le32(&b, 112) as i32, -1, "delta_disks");
        assert_eq!(le32(&b, 116), 0x77, "new_layout");
        assert_eq!(le32(&b, 120), 0x99, "new_chunk");
        assert_eq!(le32(&b, 124) as i32, -2048, "new_offset");
        assert_eq!(le64(&b, 128), 0x1_0000, "data_offset");
        assert_eq!(le64(&b, 136), 0x2_0000_0000, "data_size");
        assert_eq!(le64(&b, 144), 8, "super_offset");
        assert_eq!(le64(&b, 152), 0x3_0000, "recovery_offset");
        assert_eq!(le32(&b, 160), 2, "dev_number");
        assert_eq!(le32(&b, 164), 0x55aa, "cnt_corrected_read");
        assert_eq!(&b[168..184], &uuid(102).0, "device_uuid");
        assert_eq!(b[184], 3, "devflags");
        assert_eq!(b[185], 2, "bblog_shift");
        assert_eq!(u16::from_le_bytes([b[186], b[187]]), 8, "bblog_size");
        assert_eq!(le32(&b, 188) as i32, -16, "bblog_offset");
        assert_eq!(le64(&b, 192), 0x0607_0809_0a0b, "utime");
        assert_eq!(le64(&b, 200), 0x0123_4567_89ab_cdef, "events");
        assert_eq!(le64(&b, 208), 0x7777, "resync_offset");
        assert_eq!(le32(&b, 220), 7, "max_dev");
        assert_eq!(le32(&b, 224), 0, "logical_block_size not recorded");
        assert!(b[228..256].iter().all(|&x| x == 0), "pad3");
        let roles: Vec<u16> = (0..7).map(|i| u16::from_le_bytes([b[256 + 2 * i], b[257 + 2 * i]])).collect();
        assert_eq!(roles, [0, 1, 2, 3, 0xffff, 0xfffe, 0xfffd], "dev_roles");
        assert!(b[256 + 14..].iter().all(|&x| x == 0), "zero after dev_roles");
        assert_eq!(le32(&b, 216), independent_checksum(&b, 7), "sb_csum");
    }

    /// The checksum written straight from md-format.md §1.6, independent of the crate.
    fn independent_checksum(b: &[u8], max_dev: usize) -> u32 {
        let n = 256 + 2 * max_dev;
        let mut acc: u64 = 0;
        for at in (0..n - n % 4).step_by(4) {
            if at != 216 {
                acc += u64::from(le32(b, at));
            }
        }
        if n % 4 == 2 {
            acc += u64::from(u16::from_le_bytes([b[n - 2], b[n - 1]]));
        }
        ((acc & 0xffff_ffff) + (acc >> 32)) as u32
    }

    #[test]
    fn checksum_even_and_odd_max_dev() {
        for max_dev in [128usize, 129, 1, 2, 1919, 1920] {
            let mut sb = raid5_member(0);
            sb.dev_roles.resize(max_dev, DevRole::Active(0x1234));
            sb.dev_roles.truncate(max_dev);
            let b = sb.encode();
            assert_eq!(le32(&b, SB_CSUM_OFFSET), independent_checksum(&b, max_dev), "max_dev {max_dev}");
            assert_eq!(sb_checksum(&b, max_dev as u32), le32(&b, SB_CSUM_OFFSET));
            assert_eq!(Superblock::decode(&b).unwrap(), sb, "max_dev {max_dev}");
        }
    }

    #[test]
    fn decode_accepts_what_mdadm_writes() {
        let sb = raid5_member(3);
        let decoded = Superblock::decode(&sb.encode()).unwrap();
        assert_eq!(decoded, sb);
        assert_eq!(decoded.role(), DevRole::Active(3));
        assert_eq!(decoded.name(), "testhost:data");
        assert!(decoded.is_clean());
        assert!(decoded.notices().is_empty());
        assert_eq!(decoded.write_len_bytes(), 512);
    }

    fn expect_reject(bytes: &[u8], needle: &str) {
        match Superblock::decode(bytes) {
            Ok(sb) => panic!("accepted a superblock that should fail with {needle:?}: {sb:?}"),
            Err(e) => {
                assert_eq!(e.kind, ErrorKind::BadMetadata);
                assert!(e.message.contains(needle), "error {:?} does not mention {needle:?}", e.message);
            }
        }
    }

    /// One test per check of the kernel's super_1_load / super_1_validate, each on an otherwise valid
    /// superblock with a correct checksum.
    #[test]
    fn decode_rejects_each_kernel_check() {
        let good = raid5_member(0).encode();
        let with = |at: usize, value: &[u8]| {
            let mut b = good.clone();
            patch(&mut b, at, value);
            b
        };
        expect_reject(&with(0, &0xa92b_4efdu32.to_le_bytes()), "magic");
        expect_reject(&with(4, &2u32.to_le_bytes()), "major_version 2");
        expect_reject(&with(220, &1921u32.to_le_bytes()), "max_dev 1921");
        expect_reject(&with(144, &0u64.to_le_bytes()), "super_offset is 0");
        expect_reject(&with(144, &16u64.to_le_bytes()), "super_offset is 16");
        expect_reject(&with(8, &0x2000u32.to_le_bytes()), "unknown feature_map bits 0x2000");
        expect_reject(&with(8, &0x8000_0000u32.to_le_bytes()), "unknown feature_map bits");
        expect_reject(&with(136, &9u64.to_le_bytes()), "data_size 9");
        expect_reject(&with(12, &1u32.to_le_bytes()), "padding");
        for at in 228..256 {
            expect_reject(&with(at, &[0x40]), "padding");
        }
        // Linux 6.19+ records the array's logical block size at byte 224 (formerly padding).
        for bad_lbs in [64u32, 3000, 1 << 17] {
            expect_reject(&with(224, &bad_lbs.to_le_bytes()), "logical_block_size");
        }
        for lbs in [512u32, 4096, 65536] {
            let sb = Superblock::decode(&with(224, &lbs.to_le_bytes())).expect("a recorded block size is accepted");
            assert_eq!(sb.logical_block_size, lbs);
            assert_eq!(le32(&sb.encode(), 224), lbs, "and written back");
            assert!(sb.notices().iter().any(|n| n.contains("Linux 6.18 and older")), "{:?}", sb.notices());
        }
        // data_offset must clear the superblock: 8 + 1 sector for max_dev 128.
        expect_reject(&with(128, &8u64.to_le_bytes()), "overlaps the superblock");
        let mut big_table = raid5_member(0);
        big_table.dev_roles.resize(384, DevRole::Spare);
        big_table.data_offset = 9; // 256 + 768 bytes need 2 sectors
        expect_reject(&big_table.encode(), "overlaps the superblock");
        big_table.data_offset = 10;
        assert!(Superblock::decode(&big_table.encode()).is_ok());
        expect_reject(&with(8, &FeatureMap::RAID0_LAYOUT.0.to_le_bytes()), "RAID0_LAYOUT");
        let bad_blocks = FeatureMap::BAD_BLOCKS.0.to_le_bytes();
        let mut b = with(8, &bad_blocks);
        patch(&mut b, 186, &9u16.to_le_bytes());
        expect_reject(&b, "exceeds one page");
        let mut b = with(8, &bad_blocks);
        patch(&mut b, 188, &0u32.to_le_bytes());
        expect_reject(&b, "bblog_offset is 0");
        let mut b = with(8, &bad_blocks);
        patch(&mut b, 185, &[64]);
        expect_reject(&b, "bblog_shift 64");
        expect_reject(&with(8, &(FeatureMap::PPL | FeatureMap::MULTIPLE_PPLS).0.to_le_bytes()), "PPL");
        expect_reject(&with(8, &(FeatureMap::PPL | FeatureMap::BITMAP_OFFSET).0.to_le_bytes()), "PPL");
        // Reshape with a new offset that lands on the superblock.
        let mut b = with(8, &(FeatureMap::RESHAPE_ACTIVE | FeatureMap::NEW_OFFSET).0.to_le_bytes());
        patch(&mut b, 124, &(-4090i32).to_le_bytes());
        expect_reject(&b, "new_offset");
    }

    #[test]
    fn decode_refuses_features_raidnbd_does_not_implement() {
        let good = raid5_member(0).encode();
        // A reshape in progress (RESHAPE_ACTIVE) decodes; assembly checks it is one raidnbd
        // continues (md/reshape.rs).
        for (bits, name) in [(FeatureMap::RESHAPE_BACKWARDS, "RESHAPE_BACKWARDS"), (FeatureMap::CLUSTERED, "CLUSTERED")]
        {
            let mut b = good.clone();
            patch(&mut b, 8, &bits.0.to_le_bytes());
            expect_reject(&b, name);
            expect_reject(&b, "does not implement");
        }
        // Either PPL bit is served (md's partial parity log), and the journal; both PPL bits
        // at once, or one with the journal, the kernel refuses.
        for bits in [FeatureMap::PPL, FeatureMap::MULTIPLE_PPLS, FeatureMap::JOURNAL] {
            let mut b = good.clone();
            patch(&mut b, 8, &bits.0.to_le_bytes());
            assert!(Superblock::decode(&b).is_ok(), "{bits}");
        }
        let mut b = good.clone();
        patch(&mut b, 8, &(FeatureMap::PPL | FeatureMap::MULTIPLE_PPLS).0.to_le_bytes());
        expect_reject(&b, "contradictory PPL");
        let mut b = good.clone();
        patch(&mut b, 8, &(FeatureMap::PPL | FeatureMap::JOURNAL).0.to_le_bytes());
        expect_reject(&b, "contradictory PPL");
        for (level, needle) in [(-4i32, "level -4"), (7, "level 7"), (-5, "level -5")] {
            let mut b = good.clone();
            patch(&mut b, 72, &level.to_le_bytes());
            expect_reject(&b, needle);
        }
        let mut b = good.clone();
        patch(&mut b, 92, &0u32.to_le_bytes());
        expect_reject(&b, "raid_disks 0");
        let mut b = good.clone();
        patch(&mut b, 256 + 2 * 9, &0xff00u16.to_le_bytes());
        expect_reject(&b, "dev_roles[9] = 0xff00");
        let mut b = good.clone();
        patch(&mut b, 128, &u64::MAX.to_le_bytes());
        expect_reject(&b, "overflows");
    }

    #[test]
    fn decode_accepts_bitmap_and_bad_blocks() {
        let mut sb = raid5_member(1);
        sb.feature_map = FeatureMap::BITMAP_OFFSET | FeatureMap::BAD_BLOCKS;
        sb.bitmap_offset = 8;
        let decoded = Superblock::decode(&sb.encode()).unwrap();
        assert_eq!(decoded.bitmap_offset(), Some(8));
        assert!(decoded.feature_map.contains(FeatureMap::BAD_BLOCKS));
        let notices = decoded.notices();
        assert!(notices.is_empty(), "the bitmap and the bad-block log are both used: {notices:?}");
    }

    #[test]
    fn decode_rejects_truncated_and_garbage_input() {
        let good = raid5_member(0).encode();
        expect_reject(&good[..255], "truncated");
        expect_reject(&good[..256 + 255], "truncated");
        assert!(Superblock::decode(&good[..256 + 256]).is_ok(), "256 + 2·128 bytes are enough");
        expect_reject(&[0u8; 4096], "no md superblock");
        expect_reject(&[0xffu8; 4096], "no md superblock");
        let mut b = good.clone();
        b[SB_CSUM_OFFSET] ^= 1;
        expect_reject(&b, "bad superblock checksum");
    }

    /// Every single-bit flip inside the checksummed area is caught; flips beyond it do not matter.
    #[test]
    fn every_single_bit_corruption_is_detected() {
        let sb = raid5_member(2);
        let good = sb.encode();
        let covered = 256 + 2 * sb.dev_roles.len();
        for byte in 0..SUPERBLOCK_BYTES {
            for bit in 0..8 {
                let mut b = good.clone();
                b[byte] ^= 1 << bit;
                let result = Superblock::decode(&b);
                if byte < covered {
                    assert!(result.is_err(), "flip of byte {byte} bit {bit} went unnoticed");
                } else {
                    assert_eq!(result.unwrap(), sb, "byte {byte} beyond max_dev changed the result");
                }
            }
        }
    }

    /// mdadm itself (v4.2 on Debian 12) reads our bytes: checksum "correct", fields as intended,
    /// for an even and an odd `max_dev`.
    #[test]
    fn mdadm_examine_reads_what_we_encode() {
        let dir = ScratchDir::new("md-examine");
        for max_dev in [128usize, 129] {
            let mut sb = raid5_member(1);
            sb.dev_roles.resize(max_dev, DevRole::Spare);
            sb.dev_roles[2] = DevRole::Faulty;
            sb.resync_offset = 0;
            let out = examine(dir.path(), &format!("m{max_dev}.img"), GIB, &sb.encode());
            let csum = field(&out, "Checksum");
            assert!(csum.ends_with("- correct"), "max_dev {max_dev}: {out}");
            assert_eq!(field(&out, "Magic"), "a92b4efc");
            assert_eq!(field(&out, "Version"), "1.2");
            assert_eq!(field(&out, "Array UUID"), uuid(1).to_string());
            assert_eq!(field(&out, "Device UUID"), uuid(101).to_string());
            assert!(field(&out, "Name").starts_with("testhost:data"));
            assert_eq!(field(&out, "Raid Level"), "raid5");
            assert_eq!(field(&out, "Raid Devices"), "4");
            assert!(field(&out, "Avail Dev Size").starts_with("2093056 sectors"));
            assert!(field(&out, "Array Size").starts_with("3139584 KiB"), "{out}");
            assert_eq!(field(&out, "Data Offset"), "4096 sectors");
            assert_eq!(field(&out, "Super Offset"), "8 sectors");
            assert_eq!(field(&out, "State"), "active");
            assert_eq!(field(&out, "Events"), "42");
            assert_eq!(field(&out, "Layout"), "left-symmetric");
            assert_eq!(field(&out, "Chunk Size"), "512K");
            assert_eq!(field(&out, "Device Role"), "Active device 1");
            assert!(field(&out, "Array State").starts_with("AA.A "), "{out}");
            assert!(field(&out, "Bad Block Log").starts_with("512 entries available at offset 16 sectors"), "{out}");
            assert_eq!(field(&out, "Feature Map"), "0x0");
        }
    }

    fn arb_role() -> impl Strategy<Value = DevRole> {
        prop_oneof![
            (0u16..0xff00).prop_map(DevRole::Active),
            Just(DevRole::Spare),
            Just(DevRole::Faulty),
            Just(DevRole::Journal),
        ]
    }

    fn arb_superblock() -> impl Strategy<Value = Superblock> {
        let levels = prop::sample::select(vec![
            Level::Linear,
            Level::Raid0,
            Level::Raid1,
            Level::Raid4,
            Level::Raid5,
            Level::Raid6,
            Level::Raid10,
        ]);
        let allowed = FeatureMap::BITMAP_OFFSET.0
            | FeatureMap::RECOVERY_OFFSET.0
            | FeatureMap::BAD_BLOCKS.0
            | FeatureMap::REPLACEMENT.0
            | FeatureMap::NEW_OFFSET.0
            | FeatureMap::RECOVERY_BITMAP.0
            | FeatureMap::RAID0_LAYOUT.0;
        (
            (levels, any::<u32>(), any::<[u8; 16]>(), any::<[u8; 16]>(), any::<[u8; 32]>()),
            (any::<u64>(), any::<u32>(), any::<u64>(), any::<u32>(), 1u32..=1920, any::<i32>()),
            (any::<i32>(), any::<u64>(), any::<i32>(), any::<u32>(), any::<u32>(), any::<i32>()),
            (0u64..1 << 40, 10u64..1 << 50, any::<u64>(), any::<u32>(), any::<u32>()),
            (any::<u8>(), 0u8..64, 0u16..=8, any::<i32>(), any::<u64>(), any::<u64>(), any::<u64>()),
            prop::collection::vec(arb_role(), 0..=1920),
        )
            .prop_map(move |(a, b, c, d, e, dev_roles)| {
                let (level, features, set_uuid, device_uuid, set_name) = a;
                let (ctime, layout, size, chunksize, raid_disks, bitmap_offset) = b;
                let (new_level, reshape_position, delta_disks, new_layout, new_chunk, new_offset) = c;
                let (data_offset_extra, data_size, recovery_offset, dev_number, cnt_corrected_read) = d;
                let (devflags, bblog_shift, bblog_size, bblog_offset, utime, events, resync_offset) = e;
                let mut feature_map = FeatureMap(features & allowed);
                if level != Level::Raid0 {
                    feature_map.remove(FeatureMap::RAID0_LAYOUT);
                }
                let sb_sectors = (256 + 2 * dev_roles.len() as u64).div_ceil(512);
                let bad_blocks = feature_map.contains(FeatureMap::BAD_BLOCKS);
                Superblock {
                    feature_map,
                    set_uuid: MdUuid(set_uuid),
                    set_name,
                    ctime,
                    level,
                    layout,
                    size,
                    chunksize,
                    raid_disks,
                    bitmap_offset,
                    new_level,
                    reshape_position,
                    delta_disks,
                    new_layout,
                    new_chunk,
                    new_offset,
                    data_offset: 8 + sb_sectors + data_offset_extra,
                    data_size,
                    super_offset: 8,
                    recovery_offset,
                    dev_number,
                    cnt_corrected_read,
                    device_uuid: MdUuid(device_uuid),
                    devflags,
                    bblog_shift,
                    bblog_size,
                    bblog_offset: if bad_blocks && bblog_offset == 0 { 8 } else { bblog_offset },
                    utime,
                    events,
                    resync_offset,
                    logical_block_size: [0, 512, 4096][(events % 3) as usize],
                    dev_roles,
                }
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn encode_decode_round_trip(sb in arb_superblock()) {
            let bytes = sb.encode();
            prop_assert_eq!(bytes.len(), SUPERBLOCK_BYTES);
            let decoded = Superblock::decode(&bytes).map_err(|e| TestCaseError::fail(e.message))?;
            prop_assert_eq!(&decoded, &sb);
            prop_assert_eq!(decoded.encode(), bytes);
        }

        /// Arbitrary bytes never panic the decoder, and whatever it accepts re-encodes to the same
        /// checksummed prefix.
        #[test]
        fn decode_never_panics(mut bytes in prop::collection::vec(any::<u8>(), 0..4200), magic in any::<bool>()) {
            if magic && bytes.len() >= 256 {
                bytes[0..4].copy_from_slice(&0xa92b_4efcu32.to_le_bytes());
                bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
                let max_dev = u32::from_le_bytes(bytes[220..224].try_into().unwrap()) % 1921;
                bytes[220..224].copy_from_slice(&max_dev.to_le_bytes());
                if bytes.len() >= 256 + 2 * max_dev as usize {
                    let csum = sb_checksum(&bytes, max_dev);
                    bytes[216..220].copy_from_slice(&csum.to_le_bytes());
                }
            }
            if let Ok(sb) = Superblock::decode(&bytes) {
                let n = 256 + 2 * sb.dev_roles.len();
                prop_assert_eq!(&sb.encode()[..n], &bytes[..n]);
            }
        }
    }
}
