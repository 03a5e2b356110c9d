//! `md::create`: mdadm 4.6's placement defaults (md-format.md §1.5 table), the metadata shape
//! (roles, events, names, features), the validation errors, and `mdadm --examine` reading the
//! superblocks of a created array.

mod md_common;

use md_common::*;
use raid_core::ErrorKind;
use raid_core::geometry::Level;
use raid_core::md::{
    ArrayMetadata, CreateParams, DevRole, FeatureMap, MdUuid, RESYNC_CLEAN, Superblock, create, default_max_dev,
};

/// Named `md` so that `cargo test -p raid-core md` selects these tests.
mod md {
    use super::*;

    /// Deterministic "random" UUIDs: 1, 2, 3, ... in the first byte.
    fn counter() -> impl FnMut() -> MdUuid {
        let mut next = 0u8;
        move || {
            next += 1;
            let mut bytes = [0xa0u8; 16];
            bytes[0] = next;
            MdUuid(bytes)
        }
    }

    fn params<'a>(level: Level, members_bytes: &'a [Option<u64>]) -> CreateParams<'a> {
        CreateParams {
            level,
            layout: None,
            chunk_sectors: None,
            name: "data",
            homehost: Some("testhost"),
            uuid: None,
            members_bytes,
            ppl: false,
            journal_bytes: None,
        }
    }

    fn make(p: &CreateParams<'_>) -> ArrayMetadata {
        create(p, 1_700_000_000, &mut counter()).unwrap_or_else(|e| panic!("create failed: {}", e.message))
    }

    fn create_err(p: &CreateParams<'_>) -> String {
        let e = create(p, 0, &mut counter()).expect_err("create should fail");
        assert_eq!(e.kind, ErrorKind::CannotAssemble);
        e.message
    }

    /// (level, chunk KiB or None for the default, member sizes) → (data_offset, data_size of member 0,
    /// size, bblog_offset), each cross-checked against mdadm's rules in md-format.md §1.5.
    #[test]
    fn placement_matches_mdadm_table() {
        /// (level, chunk KiB, member bytes, data_offset, data_size of member 0, size, bblog_offset)
        type Case = (Level, Option<u32>, &'static [u64], u64, u64, u64, i32);
        let cases: &[Case] = &[
            // 20 MiB .. 1 GiB, 512K chunk: data at 2 MiB.
            (Level::Raid5, None, &[GIB, GIB, GIB], 4096, 2_093_056, 2_093_056, 16),
            (Level::Raid5, None, &[100 * MIB; 3], 4096, 200_704, 200_704, 16),
            // 64K chunk below 1 GiB: 1 MiB.
            (Level::Raid5, Some(64), &[100 * MIB; 3], 2048, 202_752, 202_752, 16),
            (Level::Raid10, None, &[2 * GIB; 4], 6144, 4_188_160, 4_188_160, 16),
            (Level::Raid10, None, &[8 * GIB; 4], 18432, 16_758_784, 16_758_784, 16),
            // 64 GiB: 65 MiB, 64 KiB of bitmap room so the BBL sits at +136.
            (Level::Raid6, None, &[64 * GIB; 4], 133_120, 134_084_608, 134_084_608, 136),
            // ≥ 128 GiB: 129 MiB; ≥ 200 GiB components: 128 KiB of bitmap room, BBL at +264.
            (Level::Raid6, Some(64), &[256 * GIB; 4], 264_192, 536_606_720, 536_606_720, 264),
            // raid1: no chunk, size rounded down to 64 KiB.
            (Level::Raid1, None, &[100 * MIB + 4096, 100 * MIB + 4096], 2048, 202_760, 202_752, 16),
            // raid0 and linear: size 0, so no bitmap room: BBL right after the superblock's 4 KiB.
            (Level::Raid0, None, &[GIB, 2 * GIB], 4096, 2_093_056, 0, 8),
            (Level::Linear, None, &[GIB, GIB], 4096, 2_093_056, 0, 8),
        ];
        for &(level, chunk_kib, sizes, data_offset, data_size, size, bblog_offset) in cases {
            let slots: Vec<Option<u64>> = sizes.iter().map(|&s| Some(s)).collect();
            let mut p = params(level, &slots);
            p.chunk_sectors = chunk_kib.map(|k| k * 2);
            let md = make(&p);
            let what = format!("{level} {chunk_kib:?} {sizes:?}");
            assert_eq!(md.members[0].data_offset, data_offset, "data_offset: {what}");
            assert!(md.members.iter().all(|m| m.data_offset == data_offset), "same data_offset everywhere: {what}");
            assert_eq!(md.members[0].data_size, data_size, "data_size: {what}");
            assert_eq!(md.size, size, "size: {what}");
            for (member, &bytes) in md.members.iter().zip(sizes) {
                assert_eq!(member.data_size, bytes / 512 - data_offset, "data_size = device − data_offset: {what}");
                assert_eq!(
                    (member.bblog_offset, member.bblog_size, member.bblog_shift),
                    (bblog_offset, 8, 0),
                    "{what}"
                );
            }
        }
    }

    #[test]
    fn created_metadata_has_mdadm_shape() {
        let slots = [Some(GIB); 4];
        let md = make(&params(Level::Raid5, &slots));
        assert_eq!(md.uuid.0[0], 1, "array UUID drawn first");
        assert_eq!(md.members.iter().map(|m| m.device_uuid.0[0]).collect::<Vec<_>>(), [2, 3, 4, 5]);
        assert_eq!(md.name(), "testhost:data");
        assert_eq!(md.short_name(), "data");
        assert_eq!((md.ctime, md.utime), (1_700_000_000, 1_700_000_000));
        assert_eq!((md.level, md.layout, md.chunk_sectors, md.raid_disks), (Level::Raid5, 2, 1024, 4));
        assert_eq!(md.events, 1);
        assert_eq!(md.resync_offset, RESYNC_CLEAN, "created clean: members are zeroed");
        assert_eq!(md.features, FeatureMap::empty());
        assert_eq!(md.dev_roles.len(), 128);
        assert_eq!(
            &md.dev_roles[..4],
            &[DevRole::Active(0), DevRole::Active(1), DevRole::Active(2), DevRole::Active(3)]
        );
        assert!(md.dev_roles[4..].iter().all(|r| *r == DevRole::Spare));
        for (slot, member) in md.members.iter().enumerate() {
            assert_eq!(member.dev_number, slot as u32);
            assert_eq!(member.super_offset, 8);
            assert_eq!(member.recovery_offset, None);
            assert_eq!(member.features, FeatureMap::empty(), "BAD_BLOCKS stays clear for an empty list");
            let sb = md.superblock_for(slot);
            assert_eq!(sb.role(), DevRole::Active(slot as u16));
            assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
        }
    }

    #[test]
    fn raid0_gets_original_layout_and_the_feature_bit() {
        let slots = [Some(GIB), Some(GIB)];
        let md = make(&params(Level::Raid0, &slots));
        assert_eq!(md.layout, 1);
        assert!(md.features.contains(FeatureMap::RAID0_LAYOUT));
        let sb = md.superblock_for(1);
        assert!(sb.feature_map.contains(FeatureMap::RAID0_LAYOUT));
        let mut p = params(Level::Raid0, &slots);
        p.layout = Some(2);
        assert_eq!(make(&p).layout, 2);
        for level in [Level::Raid1, Level::Raid5, Level::Raid10, Level::Linear] {
            let slots = [Some(GIB); 4];
            assert!(!make(&params(level, &slots)).features.contains(FeatureMap::RAID0_LAYOUT), "{level}");
        }
    }

    #[test]
    fn missing_slots_leave_spare_roles() {
        let slots = [Some(GIB), None, Some(GIB)];
        let md = make(&params(Level::Raid5, &slots));
        assert_eq!(&md.dev_roles[..3], &[DevRole::Active(0), DevRole::Spare, DevRole::Active(2)]);
        assert_eq!(md.members.iter().map(|m| m.dev_number).collect::<Vec<_>>(), [0, 2]);
        assert_eq!(md.member_index(2), Some(1));
        // raid6 survives two missing, raid10 n2 one per mirror pair.
        let slots = [None, Some(GIB), Some(GIB), None];
        make(&params(Level::Raid6, &slots));
        let slots = [None, Some(GIB), None, Some(GIB)];
        make(&params(Level::Raid10, &slots));
    }

    #[test]
    fn names_and_uuid() {
        let slots = [Some(GIB); 2];
        let mut p = params(Level::Raid1, &slots);
        p.homehost = None;
        assert_eq!(make(&p).name(), "data");
        p.homehost = Some("a-very-long-host-name-indeed");
        assert_eq!(make(&p).name(), "data", "homehost:name would not fit in 31 bytes");
        p.name = "other:name";
        p.homehost = Some("h");
        assert_eq!(make(&p).name(), "other:name");
        p.uuid = Some("01234567:89abcdef:01234567:89abcdef".parse().unwrap());
        let md = make(&p);
        assert_eq!(md.uuid.to_string(), "01234567:89abcdef:01234567:89abcdef");
        assert_eq!(md.members[0].device_uuid.0[0], 1, "random source used only for devices");
    }

    #[test]
    fn max_dev_grows_past_128_slots_only() {
        assert_eq!(default_max_dev(4), 128);
        assert_eq!(default_max_dev(129), 384);
    }

    #[test]
    fn validation_errors_say_what_is_wrong() {
        let three = [Some(GIB); 3];
        let msg = create_err(&params(Level::Raid6, &three));
        assert!(msg.contains("raid6 needs at least 4 members, got 3"), "{msg}");

        let many = vec![Some(GIB); 65];
        let msg = create_err(&params(Level::Raid5, &many));
        assert!(msg.contains("at most 64"), "{msg}");

        let mut p = params(Level::Raid5, &three);
        p.chunk_sectors = Some(24);
        let msg = create_err(&p);
        assert!(msg.contains("not a power of two"), "{msg}");

        let mut p = params(Level::Raid1, &three);
        p.chunk_sectors = Some(128);
        assert!(create_err(&p).contains("raid1 has no chunk"));

        let mut p = params(Level::Raid5, &three);
        p.layout = Some(9);
        assert!(create_err(&p).contains("layout 0x9 is not valid for raid5"));

        let mut p = params(Level::Raid10, &[Some(GIB), Some(GIB)]);
        p.layout = Some(0x103);
        assert!(create_err(&p).contains("3 copies"));

        let small = [Some(GIB), Some(MIB), Some(GIB)];
        let msg = create_err(&params(Level::Raid5, &small));
        assert!(msg.contains("slot 1 is too small"), "{msg}");
        assert!(msg.contains("1048576 bytes"), "{msg}");

        let msg = create_err(&params(Level::Raid0, &[Some(GIB), None]));
        assert!(msg.contains("no member may be missing (slots 1)"), "{msg}");

        let msg = create_err(&params(Level::Raid5, &[None, None, None]));
        assert!(msg.contains("every member is missing"), "{msg}");

        let msg = create_err(&params(Level::Raid5, &[Some(GIB), None, None, Some(GIB)]));
        assert!(msg.contains("2 of 4 members missing (slots 1, 2)"), "{msg}");
        assert!(msg.contains("survives at most 1"), "{msg}");

        let msg = create_err(&params(Level::Raid10, &[None, None, Some(GIB), Some(GIB)]));
        assert!(msg.contains("members missing (slots 0, 1)"), "{msg}");

        let mut p = params(Level::Raid1, &three);
        p.name = "this-name-is-much-too-long-for-md";
        assert!(create_err(&p).contains("at most 31"));
        p.name = "";
        assert!(create_err(&p).contains("empty"));
    }

    /// The real mdadm reads the superblocks of an array we created, on images of the member size.
    #[test]
    fn mdadm_examine_reads_a_created_array() {
        let dir = ScratchDir::new("md-create");
        let slots = [Some(100 * MIB), None, Some(100 * MIB)];
        let md = make(&params(Level::Raid5, &slots));
        for (index, member) in md.members.iter().enumerate() {
            let sb = md.superblock_for(index);
            let out = examine(dir.path(), &format!("m{index}.img"), 100 * MIB, &sb.encode());
            assert!(field(&out, "Checksum").ends_with("- correct"), "{out}");
            assert_eq!(field(&out, "Version"), "1.2");
            assert_eq!(field(&out, "Array UUID"), md.uuid.to_string());
            assert_eq!(field(&out, "Device UUID"), member.device_uuid.to_string());
            assert!(field(&out, "Name").starts_with("testhost:data"), "{out}");
            assert_eq!(field(&out, "Raid Level"), "raid5");
            assert_eq!(field(&out, "Raid Devices"), "3");
            assert!(field(&out, "Avail Dev Size").starts_with("200704 sectors"), "{out}");
            assert!(field(&out, "Array Size").starts_with("200704 KiB"), "{out}");
            assert_eq!(field(&out, "Data Offset"), "4096 sectors");
            assert_eq!(field(&out, "Super Offset"), "8 sectors");
            assert_eq!(field(&out, "Unused Space"), "before=4016 sectors, after=0 sectors", "{out}");
            assert_eq!(field(&out, "State"), "clean");
            assert_eq!(field(&out, "Events"), "1");
            assert_eq!(field(&out, "Layout"), "left-symmetric");
            assert_eq!(field(&out, "Chunk Size"), "512K");
            assert_eq!(field(&out, "Device Role"), format!("Active device {}", member.dev_number));
            assert!(field(&out, "Array State").starts_with("A.A "), "{out}");
            assert!(field(&out, "Bad Block Log").starts_with("512 entries available at offset 16 sectors"), "{out}");
            assert_eq!(field(&out, "Feature Map"), "0x0");
        }
    }
}
