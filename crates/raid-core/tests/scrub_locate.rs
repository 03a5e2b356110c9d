//! A member that returns wrong bytes without an error is named by a check where redundancy
//! can tell, and repair rewrites that member (not the parity): raid6 through its P and Q
//! syndromes (mdadm's raid6check math), mirrors of three copies by majority. Where it cannot
//! tell (raid5, two copies, two wrong blocks in one raid6 page), the mismatch is reported
//! without a member and repaired as md does.

use std::sync::Arc;

use futures::executor::block_on;
use raid_core::engine::{Array, Mismatch};
use raid_core::geometry::Level;
use raid_core::md;
use raid_core::{Member, MemoryMember, SECTOR_BYTES};

mod md_common;

use md_common::in_memory::{run_to_idle, start, superblock};

const MEMBER_BYTES: u64 = 8 << 20;

fn create(level: Level, disks: usize) -> Vec<Arc<MemoryMember>> {
    md_common::in_memory::create(level, None, disks, 0, false, MEMBER_BYTES)
}

/// Started, resynced and filled with a pattern.
fn start_filled(members: &[Arc<MemoryMember>]) -> md::Started<dyn Member> {
    let s = start(members);
    run_to_idle(&s.array);
    let size = s.array.size_bytes() as usize;
    let data: Vec<u8> = (0..size as u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    block_on(s.array.write(0, &data, false)).unwrap();
    s
}

/// Flips bytes of `member` at `member_sector` (from its data start), behind the array's back.
fn corrupt(member: &MemoryMember, member_sector: u64, bytes: &[usize]) {
    let at = ((superblock(member).data_offset + member_sector) * SECTOR_BYTES) as usize;
    member.with_data(|d| bytes.iter().for_each(|&b| d[at + b] ^= 0xa5));
}

fn scrub(array: &Array<dyn Member>, repair: bool) -> (u64, u64, Vec<Mismatch>) {
    let units = array.maintenance().scrub_units();
    let counts = block_on(array.maintenance().scrub(0, units, repair)).unwrap();
    (counts.mismatch_sectors, counts.located_sectors, array.maintenance().mismatches())
}

#[test]
fn raid6_names_the_wrong_member_and_repair_rewrites_it() {
    let members = create(Level::Raid6, 5);
    let s = start_filled(&members);
    let pg = s.array.geometry().parity().unwrap().clone();
    let stripe = 5u64;
    let member_sector = pg.stripe_member_sector(stripe);
    let layout = pg.stripe(stripe);
    let good: Vec<Vec<u8>> = members.iter().map(|m| m.snapshot()).collect();
    // A data member's page, and another stripe's Q.
    let data_role = layout.data_roles[1];
    corrupt(&members[data_role], member_sector + 16, &[0, 77, 4095]);
    let q_stripe = 9u64;
    let q_role = pg.stripe(q_stripe).q_role.expect("raid6 has Q");
    let q_sector = pg.stripe_member_sector(q_stripe);
    corrupt(&members[q_role], q_sector, &[5]);
    let (mismatched, located, log) = scrub(&s.array, false);
    assert_eq!((mismatched, located), (16, 16), "{log:?}");
    assert_eq!(log.len(), 2, "{log:?}");
    assert_eq!(
        log[0],
        Mismatch {
            stripe: Some(stripe),
            member_sector: member_sector + 16,
            sectors: 8,
            role: Some(data_role),
            repaired: false
        }
    );
    assert_eq!((log[1].stripe, log[1].role), (Some(q_stripe), Some(q_role)));
    let (_, _, log) = scrub(&s.array, true);
    assert!(log.iter().all(|m| m.repaired), "{log:?}");
    for (i, m) in members.iter().enumerate() {
        assert!(m.snapshot() == good[i], "member {i} is as it was before the corruption");
    }
    assert_eq!(scrub(&s.array, false).0, 0);

    // Two wrong blocks in one page: not blamed on either; repair does what md does.
    let stripe = 2u64;
    let member_sector = pg.stripe_member_sector(stripe);
    let layout = pg.stripe(stripe);
    corrupt(&members[layout.data_roles[0]], member_sector, &[9]);
    corrupt(&members[layout.data_roles[2]], member_sector, &[9, 100]);
    let (mismatched, located, log) = scrub(&s.array, false);
    assert_eq!((mismatched, located, log[0].role), (8, 0, None), "{log:?}");
    block_on(s.array.maintenance().scrub(0, s.array.maintenance().scrub_units(), true)).unwrap();
    assert_eq!(scrub(&s.array, false).0, 0, "parity recomputed from the data, as md");
}

#[test]
fn a_three_way_mirror_names_the_copy_the_others_outvote() {
    let members = create(Level::Raid1, 3);
    let s = start_filled(&members);
    let good = members[2].snapshot();
    corrupt(&members[2], 4096, &[1, 2, 3]);
    let (mismatched, located, log) = scrub(&s.array, false);
    assert_eq!((mismatched, located), (128, 128));
    assert_eq!((log.len(), log[0].role, log[0].member_sector), (1, Some(2), 4096), "{log:?}");
    scrub(&s.array, true);
    assert!(members[2].snapshot() == good, "the outvoted copy is rewritten from the majority");
    assert_eq!(scrub(&s.array, false).0, 0);
}

#[test]
fn raid5_and_two_copies_report_without_naming_a_member() {
    for (level, disks) in [(Level::Raid5, 4), (Level::Raid1, 2)] {
        let members = create(level, disks);
        let s = start_filled(&members);
        corrupt(&members[1], 256, &[7]);
        let (mismatched, located, log) = scrub(&s.array, false);
        assert!(mismatched > 0, "{level}");
        assert_eq!((located, log.len(), log[0].role), (0, 1, None), "{level}: {log:?}");
    }
}
