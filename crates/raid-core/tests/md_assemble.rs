//! `md::assemble`: candidates in any order, missing members within and beyond redundancy, stale
//! and one-behind members, foreign arrays, duplicate roles and copies, undersized devices and
//! corrupt superblocks. Every refusal must name the member(s) involved.

mod md_common;

use md_common::*;
use raid_core::ErrorKind;
use raid_core::geometry::Level;
use raid_core::md::{ArrayMetadata, Assembly, Candidate, CreateParams, DevRole, FeatureMap, MdUuid, assemble, create};

/// Named `md` so that `cargo test -p raid-core md` selects these tests.
mod md {
    use super::*;

    const MEMBER_BYTES: u64 = 100 * MIB;

    fn new_array(level: Level, members: usize, name: &str, seed: u8) -> ArrayMetadata {
        let slots = vec![Some(MEMBER_BYTES); members];
        let params = CreateParams {
            level,
            layout: None,
            chunk_sectors: None,
            name,
            homehost: Some("host"),
            uuid: None,
            members_bytes: &slots,
            ppl: false,
            journal_bytes: None,
        };
        let mut next = 0u8;
        let mut random = || {
            next += 1;
            MdUuid([seed, next, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
        };
        create(&params, 1_700_000_000, &mut random).unwrap()
    }

    fn dev(name: &str, i: usize) -> String {
        format!("/dev/{name}{}", (b'a' + i as u8) as char)
    }

    /// One candidate per member of `md`, named /dev/{prefix}a, b, ..., through real encode/decode.
    fn candidates_of(md: &ArrayMetadata, prefix: &str) -> Vec<Candidate> {
        (0..md.members.len())
            .map(|i| Candidate::from_bytes(dev(prefix, i), MEMBER_BYTES, &md.superblock_for(i).encode()))
            .collect()
    }

    fn ok(candidates: &[Candidate]) -> Assembly {
        assemble(candidates).unwrap_or_else(|e| panic!("assembly failed: {}", e.message))
    }

    fn refused(candidates: &[Candidate]) -> String {
        let e = assemble(candidates).expect_err("assembly should be refused");
        assert!(matches!(e.kind, ErrorKind::CannotAssemble | ErrorKind::BadMetadata | ErrorKind::ArrayFailed), "{e:?}");
        e.message
    }

    /// Role → candidate name, for order-independent comparisons.
    fn role_names(a: &Assembly, c: &[Candidate]) -> Vec<Option<String>> {
        a.members.iter().map(|m| m.map(|i| c[i].name.clone())).collect()
    }

    fn permutations(n: usize) -> Vec<Vec<usize>> {
        if n == 0 {
            return vec![vec![]];
        }
        let mut out = Vec::new();
        for p in permutations(n - 1) {
            for at in 0..=p.len() {
                let mut q = p.clone();
                q.insert(at, n - 1);
                out.push(q);
            }
        }
        out
    }

    #[test]
    fn any_order_gives_the_same_array() {
        let md = new_array(Level::Raid5, 4, "data", 1);
        let all = candidates_of(&md, "sd");
        let expected: Vec<Option<String>> = (0..4).map(|i| Some(dev("sd", i))).collect();
        for order in permutations(4) {
            let shuffled: Vec<Candidate> = order
                .iter()
                .map(|&i| Candidate {
                    name: all[i].name.clone(),
                    device_bytes: MEMBER_BYTES,
                    superblock: Ok(all[i].superblock.as_ref().unwrap().clone()),
                })
                .collect();
            let a = ok(&shuffled);
            assert_eq!(role_names(&a, &shuffled), expected, "order {order:?}");
            assert_eq!(a.metadata, md, "order {order:?}: metadata read back equals what was created");
            assert!(!a.degraded && !a.dirty && a.missing_roles.is_empty() && a.stale.is_empty());
            for (k, &c) in a.member_candidates.iter().enumerate() {
                assert_eq!(a.metadata.members[k].dev_number as usize, order[c], "member record {k} ↔ candidate {c}");
                assert_eq!(a.member_index_of_candidate(c), Some(k));
            }
        }
    }

    #[test]
    fn missing_members_within_redundancy_run_degraded() {
        let md = new_array(Level::Raid5, 4, "data", 1);
        let mut c = candidates_of(&md, "sd");
        c.remove(2);
        let a = ok(&c);
        assert_eq!(a.missing_roles, [2]);
        assert!(a.degraded && !a.dirty && !a.parity_untrusted());
        assert_eq!(role_names(&a, &c)[3].as_deref(), Some("/dev/sdd"));

        let md6 = new_array(Level::Raid6, 5, "six", 2);
        let c6: Vec<Candidate> = candidates_of(&md6, "vd")
            .into_iter()
            .enumerate()
            .filter(|(i, _)| *i != 0 && *i != 3)
            .map(|(_, c)| c)
            .collect();
        assert_eq!(ok(&c6).missing_roles, [0, 3]);

        let md1 = new_array(Level::Raid1, 3, "mirror", 3);
        let c1: Vec<Candidate> = candidates_of(&md1, "vd").into_iter().skip(2).collect();
        assert_eq!(ok(&c1).missing_roles, [0, 1]);

        // raid10 n2 over 4: roles (0,1) and (2,3) mirror each other.
        let md10 = new_array(Level::Raid10, 4, "ten", 4);
        let all10 = candidates_of(&md10, "nvme");
        let keep = |roles: &[usize]| -> Vec<Candidate> {
            roles
                .iter()
                .map(|&i| Candidate::from_bytes(dev("nvme", i), MEMBER_BYTES, &md10.superblock_for(i).encode()))
                .collect()
        };
        assert_eq!(ok(&keep(&[1, 3])).missing_roles, [0, 2]);
        drop(all10);
        let msg = refused(&keep(&[2, 3]));
        assert!(msg.contains("2 of 4 members missing (roles 0, 1)"), "{msg}");
        assert!(msg.contains("/dev/nvmec (role 2)") && msg.contains("/dev/nvmed (role 3)"), "{msg}");
    }

    #[test]
    fn too_many_missing_is_refused_with_what_was_found() {
        let md = new_array(Level::Raid5, 4, "data", 1);
        let c: Vec<Candidate> =
            candidates_of(&md, "sd").into_iter().enumerate().filter(|(i, _)| i % 2 == 0).map(|(_, c)| c).collect();
        let msg = refused(&c);
        assert!(
            msg.contains("cannot assemble raid5 array \"host:data\": 2 of 4 members missing (roles 1, 3); raid5 survives at most 1"),
            "{msg}"
        );
        assert!(msg.contains("found: /dev/sda (role 0), /dev/sdc (role 2)"), "{msg}");
        // Too few members is its own kind (mdadm --detail --test: "unusable").
        assert_eq!(assemble(&c).unwrap_err().kind, ErrorKind::ArrayFailed);

        let md0 = new_array(Level::Raid0, 3, "stripe", 5);
        let c0: Vec<Candidate> = candidates_of(&md0, "sd").into_iter().take(2).collect();
        let msg = refused(&c0);
        assert!(msg.contains("1 of 3 members missing (roles 2); raid0 survives at most 0"), "{msg}");
        assert!(msg.contains("/dev/sda (role 0), /dev/sdb (role 1)"), "{msg}");
    }

    /// Commits `rounds` metadata updates on the members whose dev_number is in `on`.
    fn with_events(md: &ArrayMetadata, rounds: u64) -> ArrayMetadata {
        let mut newer = md.clone();
        for _ in 0..rounds {
            newer.bump_events();
        }
        newer
    }

    #[test]
    fn stale_member_is_reported_and_not_used() {
        let md = new_array(Level::Raid5, 4, "data", 1);
        let newer = with_events(&md, 5);
        let mut c = candidates_of(&newer, "sd");
        c[1] = Candidate::from_bytes("/dev/sdb", MEMBER_BYTES, &md.superblock_for(1).encode());
        let a = ok(&c);
        assert_eq!(a.stale, [("/dev/sdb".to_string(), 1)]);
        assert_eq!(a.missing_roles, [1]);
        assert!(a.degraded);
        assert!(a.notices.iter().any(|n| n.contains("/dev/sdb is stale (events 1, array at 6)")), "{:?}", a.notices);
        assert_eq!(a.metadata.events, 6);

        // Two stale members of a raid5: refused, naming them.
        c[3] = Candidate::from_bytes("/dev/sdd", MEMBER_BYTES, &md.superblock_for(3).encode());
        let msg = refused(&c);
        assert!(msg.contains("2 of 4 members missing (roles 1, 3)"), "{msg}");
        assert!(msg.contains("stale: /dev/sdb (events 1 < 6), /dev/sdd (events 1 < 6)"), "{msg}");
    }

    #[test]
    fn one_behind_takes_its_role_from_the_freshest() {
        let md = new_array(Level::Raid5, 4, "data", 1);
        // Crash right after md recorded sdc as failed on the others.
        let mut newer = md.clone();
        newer.mark_faulty(2).unwrap();
        newer.bump_events();
        let mut c = candidates_of(&newer, "sd");
        c[2] = Candidate::from_bytes("/dev/sdc", MEMBER_BYTES, &md.superblock_for(2).encode());
        let a = ok(&c);
        assert_eq!(a.faulty, [2], "the freshest table says sdc failed, its own says active");
        assert_eq!(a.missing_roles, [2]);
        assert!(a.notices.iter().any(|n| n.contains("/dev/sdc is recorded as failed")), "{:?}", a.notices);

        // One behind with nothing recorded against it: used normally.
        let newer = with_events(&md, 1);
        let mut c = candidates_of(&newer, "sd");
        c[0] = Candidate::from_bytes("/dev/sda", MEMBER_BYTES, &md.superblock_for(0).encode());
        let a = ok(&c);
        assert!(a.missing_roles.is_empty() && a.stale.is_empty());
        assert_eq!(a.metadata.events, 2);
    }

    #[test]
    fn member_of_another_array_is_refused_naming_both_groups() {
        let data = new_array(Level::Raid5, 3, "data", 1);
        let other = new_array(Level::Raid5, 3, "other", 9);
        let mut c = candidates_of(&data, "sd");
        c[1] = Candidate::from_bytes("/dev/sdx", MEMBER_BYTES, &other.superblock_for(1).encode());
        let msg = refused(&c);
        assert!(msg.contains("belong to 2 different arrays"), "{msg}");
        assert!(msg.contains(&format!("/dev/sda, /dev/sdc in array \"host:data\" (UUID {})", data.uuid)), "{msg}");
        assert!(msg.contains(&format!("/dev/sdx in array \"host:other\" (UUID {})", other.uuid)), "{msg}");
    }

    #[test]
    fn duplicate_roles_and_copies_are_refused() {
        let md = new_array(Level::Raid5, 3, "data", 1);
        // A disk cloned with dd: same dev_number and device UUID under another name.
        let mut c = candidates_of(&md, "sd");
        c.push(Candidate::from_bytes("/dev/sdz", MEMBER_BYTES, &md.superblock_for(1).encode()));
        let msg = refused(&c);
        assert!(msg.contains("/dev/sdb and /dev/sdz have the same dev_number"), "{msg}");

        // A table listing role 1 twice (slots 1 and 4), with a device in each slot.
        let mut twice = md.clone();
        twice.set_role(4, DevRole::Active(1)).unwrap();
        let mut extra = twice.members[1].clone();
        extra.dev_number = 4;
        extra.device_uuid = MdUuid([0xee; 16]);
        twice.members.push(extra);
        let c: Vec<Candidate> = (0..4)
            .map(|i| Candidate::from_bytes(dev("sd", i), MEMBER_BYTES, &twice.superblock_for(i).encode()))
            .collect();
        let msg = refused(&c);
        assert!(msg.contains("/dev/sdb and /dev/sdd both claim role 1"), "{msg}");

        let mut c = candidates_of(&md, "sd");
        c.push(Candidate::from_bytes("/dev/sda", MEMBER_BYTES, &md.superblock_for(0).encode()));
        assert!(refused(&c).contains("member /dev/sda is given twice"));
    }

    #[test]
    fn undersized_device_is_refused_by_name() {
        let md = new_array(Level::Raid5, 3, "data", 1);
        let mut c = candidates_of(&md, "sd");
        c[2].device_bytes = MEMBER_BYTES - 4096;
        let msg = refused(&c);
        assert!(msg.contains("/dev/sdc is too small: 204792 sectors"), "{msg}");
        assert!(msg.contains("data_offset 4096 + data_size 200704 = 204800"), "{msg}");

        // data_size below the array's component size.
        let mut short = md.clone();
        short.members[0].data_size = md.size - 1024;
        let mut c = candidates_of(&short, "sd");
        c[0].device_bytes = MEMBER_BYTES;
        let msg = refused(&c);
        assert!(msg.contains("/dev/sda has data_size"), "{msg}");
    }

    #[test]
    fn corrupt_superblock_is_an_error_even_when_redundancy_would_cover_it() {
        let md = new_array(Level::Raid5, 4, "data", 1);
        let mut c = candidates_of(&md, "sd");
        let mut bytes = md.superblock_for(3).encode();
        bytes[300] ^= 0x10;
        c[3] = Candidate::from_bytes("/dev/sdd", MEMBER_BYTES, &bytes);
        c[1] = Candidate::from_bytes("/dev/sdb", MEMBER_BYTES, &[0u8; 4096]);
        let e = assemble(&c).unwrap_err();
        assert_eq!(e.kind, ErrorKind::BadMetadata);
        assert!(e.message.contains("/dev/sdb: no md superblock"), "{}", e.message);
        assert!(e.message.contains("/dev/sdd: bad superblock checksum"), "{}", e.message);
    }

    #[test]
    fn spares_recovery_and_dirty_state() {
        let md = new_array(Level::Raid5, 4, "data", 1);
        // Role 3 is being rebuilt onto its device (halfway); a fresh spare waits in slot 4; a crash
        // left the array dirty.
        let mut state = md.clone();
        let mut spare = state.members[3].clone();
        spare.dev_number = 4;
        spare.device_uuid = MdUuid([0x55; 16]);
        state.members.push(spare);
        state.set_role(4, DevRole::Spare).unwrap();
        state.set_recovery_offset(3, Some(1000)).unwrap();
        state.set_dirty();
        state.bump_events();
        let c = candidates_of(&state, "sd");
        let a = ok(&c);
        assert_eq!(a.spares, [4]);
        assert!(a.missing_roles.is_empty());
        assert_eq!(a.recovering_roles, [3]);
        assert!(a.dirty && a.degraded && a.parity_untrusted());
        assert!(a.notices.iter().any(|n| n.contains("dirty and degraded")), "{:?}", a.notices);
        assert_eq!(a.member_candidates, [0, 1, 2, 3, 4], "role order, then spares");
        assert_eq!(a.metadata.members[3].recovery_offset, Some(1000));
        assert!(a.metadata.superblock_for(3).feature_map.contains(FeatureMap::RECOVERY_OFFSET));
        assert!(!a.metadata.superblock_for(1).feature_map.contains(FeatureMap::RECOVERY_OFFSET));
        assert_eq!(a.metadata.superblock_for(4).role(), DevRole::Spare);

        // A rebuilding role counts as missing: with another role gone, raid5 cannot run.
        let c: Vec<Candidate> = candidates_of(&state, "sd").into_iter().skip(1).collect();
        let msg = refused(&c);
        assert!(msg.contains("2 of 4 members missing (roles 0, 3) (roles 3 are only partly rebuilt"), "{msg}");
        assert!(msg.contains("spares: /dev/sde"), "{msg}");
    }

    #[test]
    fn only_spares_or_split_brain_are_refused() {
        let md = new_array(Level::Raid1, 2, "mirror", 1);
        let mut spare_only = md.clone();
        spare_only.set_role(0, DevRole::Spare).unwrap();
        let c = vec![Candidate::from_bytes("/dev/sda", MEMBER_BYTES, &spare_only.superblock_for(0).encode())];
        let msg = refused(&c);
        assert!(msg.contains("no member is active in an array, only /dev/sda (spare)"), "{msg}");

        // Two halves of a mirror each assembled alone and updated once: equal events, tables disagree.
        let mut left = md.clone();
        left.mark_faulty(1).unwrap();
        left.bump_events();
        let mut right = md.clone();
        right.mark_faulty(0).unwrap();
        right.bump_events();
        let c = vec![
            Candidate::from_bytes("/dev/sda", MEMBER_BYTES, &left.superblock_for(0).encode()),
            Candidate::from_bytes("/dev/sdb", MEMBER_BYTES, &right.superblock_for(1).encode()),
        ];
        let msg = refused(&c);
        assert!(msg.contains("/dev/sda and /dev/sdb have the same event count 2 but different role tables"), "{msg}");
    }

    #[test]
    fn geometry_mismatch_and_raid0_layout() {
        let md = new_array(Level::Raid5, 3, "data", 1);
        let mut odd = md.clone();
        odd.chunk_sectors = 128;
        let mut c = candidates_of(&md, "sd");
        c[2] = Candidate::from_bytes("/dev/sdc", MEMBER_BYTES, &odd.superblock_for(2).encode());
        let msg = refused(&c);
        assert!(msg.contains("/dev/sdc has the same UUID as /dev/sda but a different chunk size"), "{msg}");

        // Multi-zone raid0 whose superblock has no RAID0_LAYOUT: md cannot know the layout.
        let slots = [Some(MEMBER_BYTES), Some(2 * MEMBER_BYTES)];
        let params = CreateParams {
            level: Level::Raid0,
            layout: None,
            chunk_sectors: None,
            name: "zones",
            homehost: None,
            uuid: None,
            members_bytes: &slots,
            ppl: false,
            journal_bytes: None,
        };
        let mut md0 = create(&params, 0, &mut || MdUuid([7; 16])).unwrap();
        md0.members[1].device_uuid = MdUuid([8; 16]);
        let sizes = [MEMBER_BYTES, 2 * MEMBER_BYTES];
        let cands = |md: &ArrayMetadata| -> Vec<Candidate> {
            (0..2).map(|i| Candidate::from_bytes(dev("sd", i), sizes[i], &md.superblock_for(i).encode())).collect()
        };
        assert!(ok(&cands(&md0)).missing_roles.is_empty());
        md0.features.remove(FeatureMap::RAID0_LAYOUT);
        let msg = refused(&cands(&md0));
        assert!(msg.contains("records no raid0 layout"), "{msg}");
    }

    #[test]
    fn behind_devices_never_become_active_on_newer_superblocks_alone() {
        let md = new_array(Level::Raid1, 2, "mirror", 1);
        // Slot 2 is a spare; its own superblock says so.
        let mut with_spare = md.clone();
        let mut spare = with_spare.members[1].clone();
        spare.dev_number = 2;
        spare.device_uuid = MdUuid([0x33; 16]);
        with_spare.members.push(spare);
        with_spare.set_role(2, DevRole::Spare).unwrap();
        let old_spare = with_spare.superblock_for(2).encode();

        // The others recorded it active (rebuild started) but its own write was lost: one behind.
        let mut promoted = with_spare.clone();
        promoted.set_role(1, DevRole::Faulty).unwrap();
        promoted.set_role(2, DevRole::Active(1)).unwrap();
        promoted.bump_events();
        let c = vec![
            Candidate::from_bytes("/dev/sda", MEMBER_BYTES, &promoted.superblock_for(0).encode()),
            Candidate::from_bytes("/dev/sdc", MEMBER_BYTES, &old_spare),
        ];
        let a = ok(&c);
        assert_eq!(a.spares, [1], "treated as a spare, not as an in-sync mirror");
        assert_eq!(a.missing_roles, [1]);
        assert!(
            a.notices.iter().any(|n| n.contains("/dev/sdc is active only in newer superblocks")),
            "{:?}",
            a.notices
        );

        // Far behind and still a spare in the freshest table: a usable spare.
        let newer = with_events(&with_spare, 7);
        let c = vec![
            Candidate::from_bytes("/dev/sda", MEMBER_BYTES, &newer.superblock_for(0).encode()),
            Candidate::from_bytes("/dev/sdb", MEMBER_BYTES, &newer.superblock_for(1).encode()),
            Candidate::from_bytes("/dev/sdc", MEMBER_BYTES, &old_spare),
        ];
        let a = ok(&c);
        assert_eq!(a.spares, [2]);
        assert!(a.stale.is_empty());

        // Far behind but active in the freshest table: stale.
        let mut far = promoted.clone();
        far.bump_events();
        far.bump_events();
        let c = vec![
            Candidate::from_bytes("/dev/sda", MEMBER_BYTES, &far.superblock_for(0).encode()),
            Candidate::from_bytes("/dev/sdc", MEMBER_BYTES, &old_spare),
        ];
        let a = ok(&c);
        assert_eq!(a.stale, [("/dev/sdc".to_string(), 1)]);
        assert!(a.spares.is_empty());
    }

    #[test]
    fn no_candidates() {
        assert!(refused(&[]).contains("no member devices given"));
    }
}
