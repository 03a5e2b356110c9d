//! Level changes that move no data (md's takeover): raid1 <-> raid5 of two, raid4 <-> raid5,
//! raid5 <-> raid6 and raid0 <-> raid4/5 with a member rebuilt into the new role. Every byte
//! reads back the same through each change and after a restart from the superblocks (which
//! say the new level); redundancy gained is real (parity matches, reads right with roles
//! missing); what md refuses is refused.

use std::sync::Arc;

use futures::executor::block_on;
use raid_core::engine::{Array, MaintenanceWork};
use raid_core::geometry::{Level, ParityLayout};
use raid_core::md::DevRole;
use raid_core::{Member, MemoryMember};

mod md_common;

use md_common::in_memory::{
    check_all, check_each_role_missing, mismatches, restore, run_to_idle, snapshot, start, superblock, write_all,
};

const MEMBER_BYTES: u64 = 16 << 20;

fn create(level: Level, layout: Option<u32>, disks: usize, extra: usize, ppl: bool) -> Vec<Arc<MemoryMember>> {
    md_common::in_memory::create(level, layout, disks, extra, ppl, MEMBER_BYTES)
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_add(seed).wrapping_mul(2654435761) >> 15) as u8).collect()
}

/// Fills the array (resyncing first, so that parity is consistent) and returns its bytes.
fn fill(array: &Array<dyn Member>, seed: u32) -> Vec<u8> {
    run_to_idle(array);
    let model = pattern(array.size_bytes() as usize, seed);
    write_all(array, &model);
    model
}

#[test]
fn a_mirror_of_two_becomes_a_raid5_and_back() {
    let members = create(Level::Raid1, None, 2, 0, false);
    let s = start(&members);
    let model = fill(&s.array, 1);
    let changed = block_on(s.array.admin().change_level(Level::Raid5, None)).expect("raid1 -> raid5");
    assert_eq!((changed.to, changed.raid_disks, changed.missing_role), (Level::Raid5, 2, None));
    check_all(&s.array, &model, "raid5 of two");
    // Writes in the new level, then a SIGKILL: the superblocks say raid5.
    let more = pattern(1 << 20, 9);
    block_on(s.array.write(3 << 20, &more, false)).unwrap();
    let mut model = model;
    model[3 << 20..4 << 20].copy_from_slice(&more);
    drop(s);
    let sb = superblock(&members[1]);
    assert_eq!((sb.level, sb.layout, sb.chunksize), (Level::Raid5, ParityLayout::LeftSymmetric as u32, 128));
    let s = start(&members);
    assert_eq!(s.array.geometry().level(), Level::Raid5);
    check_all(&s.array, &model, "raid5 of two, restarted");
    run_to_idle(&s.array);
    assert_eq!(mismatches(&s.array), 0, "parity of two is a copy");
    block_on(s.array.admin().change_level(Level::Raid1, None)).expect("raid5 -> raid1");
    check_all(&s.array, &model, "raid1 again");
    block_on(s.array.shutdown()).unwrap();
    drop(s);
    assert_eq!((superblock(&members[0]).level, superblock(&members[0]).chunksize), (Level::Raid1, 0));
    check_each_role_missing(&members, &model, "raid1 again");
}

#[test]
fn a_raid4_becomes_a_raid5_with_parity_last_and_back() {
    let members = create(Level::Raid4, None, 3, 0, false);
    let s = start(&members);
    let model = fill(&s.array, 2);
    let err = block_on(s.array.admin().change_level(Level::Raid6, None)).unwrap_err();
    assert!(err.to_string().contains("no takeover"), "{err}");
    block_on(s.array.admin().change_level(Level::Raid5, None)).expect("raid4 -> raid5");
    assert_eq!(s.array.geometry().parity().unwrap().layout(), ParityLayout::ParityLast);
    check_all(&s.array, &model, "raid5 parity-last");
    assert_eq!(mismatches(&s.array), 0);
    drop(s);
    let s = start(&members);
    check_all(&s.array, &model, "raid5 parity-last, restarted");
    // The SIGKILL left a resync to do first.
    let err = block_on(s.array.admin().change_level(Level::Raid4, None)).unwrap_err();
    assert!(err.to_string().contains("background work"), "{err}");
    assert_eq!(run_to_idle(&s.array), [MaintenanceWork::Resync]);
    block_on(s.array.admin().change_level(Level::Raid4, None)).expect("raid5 -> raid4");
    block_on(s.array.shutdown()).unwrap();
    drop(s);
    assert_eq!(superblock(&members[2]).level, Level::Raid4);
    check_each_role_missing(&members, &model, "raid4 again");
}

#[test]
fn a_raid5_becomes_a_raid6_with_q_rebuilt_onto_a_new_member_and_back() {
    let members = create(Level::Raid5, Some(ParityLayout::LeftSymmetric as u32), 3, 1, false);
    let s = start(&members[..3]);
    let model = fill(&s.array, 3);
    let spare: Arc<dyn Member> = members[3].clone();
    let changed = block_on(s.array.admin().change_level(Level::Raid6, Some(spare))).expect("raid5 -> raid6");
    assert_eq!((changed.raid_disks, changed.missing_role), (4, Some(3)));
    assert_eq!(changed.layout, ParityLayout::LeftSymmetric6 as u32);
    check_all(&s.array, &model, "raid6 missing Q");
    // A crash before Q is rebuilt: dirty, missing only a parity role, so every data role is
    // there and the array starts writable (a missing data role would start read-only).
    block_on(s.array.write(0, &model[..65536], false)).unwrap();
    drop(s);
    let s = start(&members);
    assert!(!s.forced_read_only, "dirty and missing only Q: the data is whole");
    check_all(&s.array, &model, "raid6 missing Q, restarted");
    let finished = run_to_idle(&s.array);
    assert!(finished.contains(&MaintenanceWork::Recovery { role: 3 }), "Q is rebuilt: {finished:?}");
    assert!(s.array.admin().is_optimal());
    assert_eq!(mismatches(&s.array), 0, "P and Q match the data");
    block_on(s.array.shutdown()).unwrap();
    drop(s);
    let sb = superblock(&members[3]);
    assert_eq!((sb.level, sb.raid_disks, sb.layout), (Level::Raid6, 4, ParityLayout::LeftSymmetric6 as u32));
    // Any two roles missing: the data is there.
    let images = snapshot(&members);
    for (a, b) in [(0, 1), (1, 3), (2, 3), (0, 2)] {
        let s = start(&members);
        block_on(s.array.admin().fail_role(a)).unwrap();
        block_on(s.array.admin().fail_role(b)).unwrap();
        check_all(&s.array, &model, &format!("raid6 without roles {a} and {b}"));
        drop(s);
        restore(&members, &images);
    }
    // Dirty with a data role missing: parity cannot be trusted, read-only.
    let s = start(&members);
    block_on(s.array.admin().fail_role(0)).unwrap();
    block_on(s.array.write(0, &model[..65536], false)).unwrap();
    drop(s);
    let s = start(&members);
    assert!(s.forced_read_only, "dirty without a data role: the write hole");
    drop(s);
    restore(&members, &images);
    // Back: Q's member becomes a spare.
    let s = start(&members);
    let changed = block_on(s.array.admin().change_level(Level::Raid5, None)).expect("raid6 -> raid5");
    assert_eq!((changed.raid_disks, changed.layout), (3, ParityLayout::LeftSymmetric as u32));
    check_all(&s.array, &model, "raid5 again");
    assert_eq!(s.array.admin().spare_status().len(), 1, "Q's member is a spare");
    assert_eq!(mismatches(&s.array), 0);
    block_on(s.array.shutdown()).unwrap();
    drop(s);
    assert_eq!(superblock(&members[3]).dev_roles[superblock(&members[3]).dev_number as usize], DevRole::Spare);
    let s = start(&members[..3]);
    check_all(&s.array, &model, "raid5 again, restarted");
}

#[test]
fn a_raid0_becomes_a_raid5_with_parity_rebuilt_and_back() {
    let members = create(Level::Raid0, None, 2, 1, false);
    let s = start(&members[..2]);
    let model = fill(&s.array, 4);
    let spare: Arc<dyn Member> = members[2].clone();
    let changed = block_on(s.array.admin().change_level(Level::Raid5, Some(spare))).expect("raid0 -> raid5");
    assert_eq!((changed.raid_disks, changed.missing_role), (3, Some(2)));
    assert_eq!(changed.layout, ParityLayout::ParityLast as u32);
    check_all(&s.array, &model, "raid5 missing parity");
    run_to_idle(&s.array);
    assert!(s.array.admin().is_optimal(), "the parity role was rebuilt");
    assert_eq!(mismatches(&s.array), 0);
    block_on(s.array.shutdown()).unwrap();
    drop(s);
    check_each_role_missing(&members, &model, "raid5 from raid0");
    // Back to raid0: only with the parity member failed first.
    let s = start(&members);
    let err = block_on(s.array.admin().change_level(Level::Raid0, None)).unwrap_err();
    assert!(err.to_string().contains("fail it first"), "{err}");
    block_on(s.array.admin().fail_role(2)).unwrap();
    block_on(s.array.admin().change_level(Level::Raid0, None)).expect("raid5 -> raid0");
    check_all(&s.array, &model, "raid0 again");
    block_on(s.array.shutdown()).unwrap();
    drop(s);
    let sb = superblock(&members[0]);
    assert_eq!((sb.level, sb.raid_disks), (Level::Raid0, 2));
    assert_eq!(sb.data_size, sb.size, "one zone");
    let s = start(&members[..2]);
    assert_eq!(s.array.geometry().level(), Level::Raid0);
    check_all(&s.array, &model, "raid0 again, restarted");
}

#[test]
fn level_changes_md_does_not_make_are_refused() {
    let members = create(Level::Raid1, None, 3, 0, false);
    let s = start(&members);
    let err = block_on(s.array.admin().change_level(Level::Raid5, None)).unwrap_err();
    assert!(err.to_string().contains("mirror of two"), "{err}");
    let err = block_on(s.array.admin().change_level(Level::Raid1, None)).unwrap_err();
    assert!(err.to_string().contains("already"), "{err}");

    let members = create(Level::Raid5, Some(ParityLayout::LeftSymmetric as u32), 3, 0, false);
    let s = start(&members);
    let err = block_on(s.array.admin().change_level(Level::Raid4, None)).unwrap_err();
    assert!(err.to_string().contains("parity-last"), "{err}");

    let members = create(Level::Raid6, None, 4, 0, false);
    let s = start(&members);
    let err = block_on(s.array.admin().change_level(Level::Raid5, None)).unwrap_err();
    assert!(err.to_string().contains("Q is not on the last member"), "{err}");

    let members = create(Level::Raid5, None, 3, 0, true);
    let s = start(&members);
    let err = block_on(s.array.admin().change_level(Level::Raid6, None)).unwrap_err();
    assert!(err.to_string().contains("log"), "PPL: {err}");
}

/// A linear array grows by appending members (md's linear hot-add): nothing moves, the new
/// space follows the end, and the superblocks say so (also after a crash).
#[test]
fn a_linear_array_grows_by_appending_members() {
    let members = create(Level::Linear, None, 2, 2, false);
    let s = start(&members[..2]);
    let model = fill(&s.array, 6);
    let old_size = model.len();
    let added: Vec<Arc<dyn Member>> = vec![members[2].clone(), members[3].clone()];
    block_on(s.array.admin().grow(added)).expect("append");
    let new_size = s.array.size_bytes() as usize;
    assert!(new_size > old_size * 3 / 2, "{old_size} -> {new_size}");
    let got = block_on(s.array.read(0, old_size)).unwrap().to_vec();
    assert!(got == model, "the old bytes stay where they were");
    let tail = pattern(new_size - old_size, 7);
    block_on(s.array.write(old_size as u64, &tail, false)).unwrap();
    drop(s);
    let sb = superblock(&members[3]);
    assert_eq!((sb.level, sb.raid_disks), (Level::Linear, 4));
    assert_eq!(sb.dev_roles[sb.dev_number as usize], DevRole::Active(3));
    let s = start(&members);
    let mut all = model;
    all.extend_from_slice(&tail);
    check_all(&s.array, &all, "grown linear, restarted");
}
