//! Superblocks raid-core did not write: a hand-made image built field by field from the md
//! offset table (fixtures/handmade), and real mdadm-created member images (fixtures/mdadm, made
//! in a VM by the vm-rig helper). Each must decode, re-encode byte for byte, and agree with the
//! `mdadm --examine` text recorded next to it.

mod md_common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use md_common::*;
use raid_core::geometry::Level;
use raid_core::md::{Candidate, CreateParams, DevRole, FeatureMap, MdUuid, RESYNC_CLEAN, Superblock, assemble, create};

/// Named `md` so that `cargo test -p raid-core md` selects these tests.
mod md {
    use super::*;

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
    }

    fn superblock_area(image: &[u8]) -> &[u8] {
        assert!(image.len() >= 8192, "a fixture holds the first 8 KiB of a member, got {} bytes", image.len());
        &image[4096..8192]
    }

    #[test]
    fn handmade_fixture_decodes_field_by_field() {
        let dir = fixtures().join("handmade");
        let image = std::fs::read(dir.join("raid6-member3.img")).expect("fixtures/handmade/raid6-member3.img");
        assert!(image[..4096].iter().all(|&b| b == 0));
        let area = superblock_area(&image);
        let sb = Superblock::decode(area).unwrap_or_else(|e| panic!("{}", e.message));
        let mut roles = vec![DevRole::Spare; 128];
        roles[..6].copy_from_slice(&[
            DevRole::Active(0),
            DevRole::Active(1),
            DevRole::Faulty,
            DevRole::Active(3),
            DevRole::Active(4),
            DevRole::Active(2),
        ]);
        let expected = Superblock {
            feature_map: FeatureMap::RECOVERY_OFFSET,
            set_uuid: "3a7c5e91:d20f4b68:a1c4e5f6:0718293a".parse().unwrap(),
            set_name: name32("fixturehost:archive"),
            ctime: 1_650_000_000,
            level: Level::Raid6,
            size: 4_188_160,
            raid_disks: 5,
            data_offset: 6144,
            data_size: 4_188_160,
            recovery_offset: 1_048_576,
            dev_number: 3,
            cnt_corrected_read: 7,
            device_uuid: "0badc0de:12345678:89abcdef:00112233".parse().unwrap(),
            devflags: 1,
            bblog_shift: 0,
            bblog_size: 8,
            bblog_offset: 24,
            utime: 1_650_000_777,
            events: 1234,
            resync_offset: 0,
            logical_block_size: 0,
            dev_roles: roles,
            // The rest as mdadm writes it for any array (layout 2, 512K chunk, no bitmap, no
            // reshape, superblock at sector 8, 8-sector bad-block log): as in raid5_member.
            ..raid5_member(3)
        };
        assert_eq!(sb, expected);
        assert_eq!(sb.encode(), area, "re-encoding reproduces the fixture byte for byte");
        assert_eq!(sb.recovery_offset(), Some(1_048_576));
        assert!(!sb.is_clean() && sb.resync_offset != RESYNC_CLEAN);
        let examine = std::fs::read_to_string(dir.join("raid6-member3.examine.txt")).unwrap();
        check_examine(&sb, &examine);
    }

    /// An image file and the decoded superblock in it.
    struct Fixture {
        file: String,
        superblock: Superblock,
    }

    /// Every `mdadm --examine` block found in the text files of `dir`, keyed by Device UUID.
    fn examine_blocks(dir: &Path) -> BTreeMap<String, String> {
        let mut blocks = BTreeMap::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let Ok(text) = std::fs::read_to_string(&path) else { continue };
            // A block starts at a "Magic :" line; keep everything up to the next one.
            let mut starts: Vec<usize> =
                text.match_indices("Magic : ").map(|(at, _)| text[..at].rfind('\n').map_or(0, |n| n + 1)).collect();
            starts.push(text.len());
            for pair in starts.windows(2) {
                let block = &text[pair[0]..pair[1]];
                if let Some(device_uuid) = field_opt(block, "Device UUID") {
                    blocks.insert(device_uuid.to_string(), block.to_string());
                }
            }
        }
        blocks
    }

    /// Real mdadm output: requires the fixtures the vm-rig helper produces (first 8 KiB of members of
    /// arrays created by `mdadm --create` in a VM, plus their `mdadm --examine` text).
    #[test]
    fn mdadm_created_superblocks() {
        let dir = fixtures().join("mdadm");
        let mut images: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|entries| entries.map(|e| e.unwrap().path()).collect::<Vec<PathBuf>>())
            .unwrap_or_default()
            .into_iter()
            .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.len() == 8192))
            .collect();
        images.sort();
        assert!(
            !images.is_empty(),
            "no mdadm-made fixtures: expected 8192-byte member images (first 8 KiB) under {} — they are produced in a \
             VM by the vm-rig helper (see that directory's README); the hand-made stand-in is fixtures/handmade",
            dir.display()
        );
        let blocks = examine_blocks(&dir);
        let mut fixtures = Vec::new();
        for path in &images {
            let file = path.file_name().unwrap().to_string_lossy().into_owned();
            let image = std::fs::read(path).unwrap();
            let area = superblock_area(&image);
            let sb = Superblock::decode(area).unwrap_or_else(|e| panic!("{file}: {}", e.message));
            assert_eq!(sb.encode(), area, "{file}: re-encoding must reproduce mdadm's bytes exactly");
            let examine = blocks.get(&sb.device_uuid.to_string()).unwrap_or_else(|| {
                panic!("{file}: no `mdadm --examine` text with Device UUID {} in {}", sb.device_uuid, dir.display())
            });
            check_examine(&sb, examine);
            fixtures.push(Fixture { file, superblock: sb });
        }

        // Each complete array (every active role of its freshest table present) must assemble.
        let mut arrays: BTreeMap<MdUuid, Vec<&Fixture>> = BTreeMap::new();
        for f in &fixtures {
            arrays.entry(f.superblock.set_uuid).or_default().push(f);
        }
        for (uuid, members) in arrays {
            let freshest = members.iter().map(|f| &f.superblock).max_by_key(|sb| sb.events).unwrap();
            let active_roles = freshest.dev_roles.iter().filter(|r| matches!(r, DevRole::Active(_))).count();
            let all_current = members.iter().all(|f| f.superblock.events == freshest.events);
            if members.len() < active_roles || !all_current {
                continue;
            }
            let candidates: Vec<Candidate> = members
                .iter()
                .map(|f| Candidate {
                    name: f.file.clone(),
                    device_bytes: (f.superblock.data_offset + f.superblock.data_size) * 512,
                    superblock: Ok(f.superblock.clone()),
                })
                .collect();
            let assembly = assemble(&candidates).unwrap_or_else(|e| panic!("array {uuid}: {}", e.message));
            assert!(assembly.missing_roles.is_empty() && !assembly.degraded, "array {uuid}: {assembly:?}");
            assert_eq!(assembly.metadata.uuid, uuid);
            same_placement_as_our_create(&members);
        }
    }

    /// `md::create` with the parameters of an mdadm-made array must place everything where mdadm
    /// did: data offset (from the first member), data and component sizes, bad-block log,
    /// max_dev, roles, name. Events, times, clean state and device UUIDs legitimately differ.
    fn same_placement_as_our_create(members: &[&Fixture]) {
        let mut by_dev: Vec<&Superblock> = members.iter().map(|f| &f.superblock).collect();
        by_dev.sort_by_key(|sb| sb.dev_number);
        let first = by_dev[0];
        if first.bitmap_offset().is_some() {
            return; // a bitmap moves the bad-block log; raidnbd does not create bitmaps
        }
        let name = first.name();
        let (homehost, short) = name.split_once(':').map_or((None, name.as_str()), |(h, n)| (Some(h), n));
        let slots: Vec<Option<u64>> = by_dev.iter().map(|sb| Some((sb.data_offset + sb.data_size) * 512)).collect();
        let params = CreateParams {
            level: first.level,
            layout: Some(first.layout),
            chunk_sectors: Some(first.chunksize),
            name: short,
            homehost,
            uuid: Some(first.set_uuid),
            members_bytes: &slots,
            ppl: false,
            journal_bytes: None,
        };
        let ours = create(&params, 0, &mut || MdUuid::default())
            .unwrap_or_else(|e| panic!("{}: create with mdadm's parameters failed: {}", members[0].file, e.message));
        for (index, theirs) in by_dev.iter().enumerate() {
            let mine = ours.superblock_for(index);
            let what = format!("{} (dev_number {})", members[0].file, theirs.dev_number);
            assert_eq!(mine.set_name, theirs.set_name, "set_name of {what}");
            assert_eq!(mine.data_offset, theirs.data_offset, "data_offset of {what}");
            assert_eq!(mine.data_size, theirs.data_size, "data_size of {what}");
            if first.level != Level::Raid0 && first.level != Level::Linear {
                // The kernel rewrites `size` for linear/raid0 once the array runs; mdadm writes 0.
                assert_eq!(mine.size, theirs.size, "size of {what}");
            }
            assert_eq!(
                (mine.bblog_offset, mine.bblog_size, mine.bblog_shift),
                (theirs.bblog_offset, theirs.bblog_size, theirs.bblog_shift),
                "bad-block log of {what}"
            );
            assert_eq!(mine.dev_roles, theirs.dev_roles, "dev_roles of {what}");
            assert_eq!(mine.dev_number, theirs.dev_number, "dev_number of {what}");
            assert_eq!((mine.layout, mine.chunksize), (theirs.layout, theirs.chunksize), "layout/chunk of {what}");
            assert_eq!(mine.super_offset, theirs.super_offset, "super_offset of {what}");
            // mdadm older than 4.6 sets RAID0_LAYOUT only for members of different sizes.
            let sizes_differ = by_dev.iter().any(|sb| {
                sb.data_size / u64::from(sb.chunksize.max(1)) != first.data_size / u64::from(first.chunksize.max(1))
            });
            if first.level != Level::Raid0 || sizes_differ {
                assert_eq!(mine.feature_map, theirs.feature_map.without(FeatureMap::PER_DEVICE), "features of {what}");
            }
        }
    }
}
