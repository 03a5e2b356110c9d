//! raid10 (near layouts) changes its member count while it serves, as md's raid10 reshape
//! does (`doc/md-reshape-raid10.md`): adding members goes forward (the data start moves into
//! the headroom before the data), removing them backwards (into the room after it); the
//! superblocks say what md writes; every byte reads back right during and after, with writes
//! racing the windows and restarts from the superblocks at any step or crashes at any member
//! write; every copy agrees at the end (md's check finds no mismatch).

use std::sync::Arc;

use futures::executor::block_on;
use raid_core::engine::{Array, Step};
use raid_core::geometry::{Level, Raid10Layout};
use raid_core::md::{DevRole, FeatureMap};
use raid_core::{Member, MemoryMember, SECTOR_BYTES};

mod md_common;

use md_common::crash::reshape_through_crashes;
use md_common::in_memory::{
    self, Rng, check_all, check_each_role_missing, mismatches, remove_confirmed, start, superblock,
};

const MEMBER_BYTES: u64 = 16 << 20;

/// The chunk `in_memory::create` gives (64 KiB).
const CHUNK_SECTORS: u64 = 128;

fn layout(name: &str) -> u32 {
    Raid10Layout::parse(name).expect("a raid10 layout").to_md()
}

/// A raid10 of `disks` memory members in `name` layout, and `extra` blank members.
fn create(name: &str, disks: usize, extra: usize) -> Vec<Arc<MemoryMember>> {
    in_memory::create(Level::Raid10, Some(layout(name)), disks, extra, false, MEMBER_BYTES)
}

fn model_written(array: &Array<dyn Member>, rng: &mut Rng) -> Vec<u8> {
    let model = rng.bytes(array.size_bytes() as usize);
    in_memory::write_all(array, &model);
    model
}

/// Every member's superblock once the reshape is over: no reshape fields, `raid_disks`, the
/// data start moved the way it went, clean.
fn check_settled(members: &[Arc<MemoryMember>], raid_disks: usize, old_data_offset: u64, grew: bool) {
    for m in members {
        let sb = superblock(m);
        assert!(!sb.feature_map.intersects(FeatureMap::RESHAPE_ACTIVE | FeatureMap::NEW_OFFSET), "done");
        assert_eq!((sb.level, sb.raid_disks as usize), (Level::Raid10, raid_disks));
        match grew {
            true => assert!(sb.data_offset < old_data_offset, "{} moved into the headroom", m.name()),
            false => assert!(sb.data_offset > old_data_offset, "{} moved its data start up", m.name()),
        }
        assert!(sb.data_offset + sb.data_size <= MEMBER_BYTES / SECTOR_BYTES);
        assert!(sb.is_clean());
    }
}

/// Grows a raid10 of `name` from `disks` by `added` members (to chunk `chunk_sectors` if
/// given) under writes, restarting (no shutdown) every few windows.
fn grow_under_writes_and_restarts(name: &str, disks: usize, added: usize, chunk_sectors: Option<u32>, seed: u64) {
    let what = format!("{name} {disks}+{added}");
    let members = create(name, disks, added);
    let mut rng = Rng(seed);
    let started = start(&members[..disks]);
    let old_size = started.array.size_bytes() as usize;
    let old_data_offset = superblock(&members[0]).data_offset;
    let mut model = model_written(&started.array, &mut rng);
    let new: Vec<Arc<dyn Member>> = members[disks..].iter().map(|m| m.clone() as Arc<dyn Member>).collect();
    block_on(started.array.admin().reshape(new, None, chunk_sectors)).expect("the grow starts");
    assert_eq!(started.array.size_bytes() as usize, old_size, "{what}: the export keeps its size while it grows");
    let sb = superblock(&members[0]);
    assert!(sb.feature_map.contains(FeatureMap::RESHAPE_ACTIVE | FeatureMap::NEW_OFFSET), "{:?}", sb.feature_map);
    assert!(!sb.feature_map.contains(FeatureMap::RESHAPE_BACKWARDS));
    assert_eq!((sb.raid_disks as usize, sb.delta_disks, sb.reshape_position), (disks + added, added as i32, 0));
    assert_eq!((sb.level, sb.new_level, sb.layout, sb.new_layout), (Level::Raid10, 10, layout(name), layout(name)));
    let larger_chunk = u64::from(chunk_sectors.unwrap_or(0)).max(CHUNK_SECTORS) as i64;
    assert!(-i64::from(sb.new_offset) >= larger_chunk, "md needs the larger chunk at least: {}", sb.new_offset);
    for (i, m) in members[disks..].iter().enumerate() {
        let sb = superblock(m);
        assert_eq!(sb.role(), DevRole::Active((disks + i) as u16), "a new member takes a new role");
        assert!(sb.recovery_offset().is_none(), "in sync from the start (md's raid10_start_reshape)");
    }
    check_all(&started.array, &model, &format!("{what} started"));

    let (started, restarts) = in_memory::reshape_under_writes(&members, started, &mut rng, &mut model, 4, &what);
    assert!(restarts >= 2, "{what}: restarted {restarts} times");
    let new_size = started.array.size_bytes() as usize;
    assert!(new_size > old_size, "{what}: the export grew ({old_size} -> {new_size})");
    assert_eq!(started.array.geometry().raid_disks(), disks + added);
    model.resize(new_size, 0);
    check_all(&started.array, &model, &format!("{what} grown"));
    while block_on(started.array.maintenance().step(4 << 20)).unwrap() != Step::Idle {}
    assert_eq!(mismatches(&started.array), 0, "{what}: every copy agrees");
    block_on(started.array.shutdown()).unwrap();
    check_settled(&members, disks + added, old_data_offset, true);
    if let Some(chunk) = chunk_sectors {
        assert_eq!(superblock(&members[0]).chunksize, chunk, "{what}: the new chunk");
    }
    check_each_role_missing(&members, &model, &what);
}

#[test]
fn raid10_n2_grows_from_four_to_five_under_writes_and_restarts() {
    grow_under_writes_and_restarts("n2", 4, 1, None, 0x1045);
}

#[test]
fn raid10_n2_grows_from_two_to_four_under_writes_and_restarts() {
    grow_under_writes_and_restarts("n2", 2, 2, None, 0x1024);
}

#[test]
fn raid10_n3_grows_by_a_member_with_a_larger_chunk_under_writes_and_restarts() {
    grow_under_writes_and_restarts("n3", 3, 1, Some(256), 0x1034);
}

/// Removes `removed` members of a raid10 of `name` under writes, restarting every few windows.
fn shrink_under_writes_and_restarts(name: &str, disks: usize, removed: usize, seed: u64) {
    let what = format!("{name} {disks}-{removed}");
    let members = create(name, disks, 0);
    let mut rng = Rng(seed);
    let started = start(&members);
    let old_data_offset = superblock(&members[0]).data_offset;
    let mut model = model_written(&started.array, &mut rng);
    let new_size = remove_confirmed(&started.array, disks - removed) as usize;
    assert!(new_size < model.len(), "{what}: smaller");
    assert_eq!(started.array.size_bytes() as usize, new_size, "{what}: the export shrinks at once");
    model.truncate(new_size);
    let sb = superblock(&members[0]);
    assert!(sb.feature_map.contains(FeatureMap::RESHAPE_ACTIVE | FeatureMap::NEW_OFFSET), "{:?}", sb.feature_map);
    assert_eq!((sb.raid_disks as usize, sb.delta_disks), (disks - removed, -(removed as i32)));
    assert_eq!(sb.reshape_position * SECTOR_BYTES, new_size as u64, "md starts at the new end");
    assert!(i64::from(sb.new_offset) >= CHUNK_SECTORS as i64, "the data start moves up: {}", sb.new_offset);

    let (started, restarts) = in_memory::reshape_under_writes(&members, started, &mut rng, &mut model, 4, &what);
    assert!(restarts >= 2, "{what}: restarted {restarts} times");
    assert_eq!(started.array.geometry().raid_disks(), disks - removed);
    assert_eq!(started.array.size_bytes() as usize, new_size);
    assert_eq!(started.array.admin().spare_status().len(), removed, "{what}: the removed members are spares");
    check_all(&started.array, &model, &format!("{what} shrunk"));
    while block_on(started.array.maintenance().step(4 << 20)).unwrap() != Step::Idle {}
    assert_eq!(mismatches(&started.array), 0, "{what}: every copy agrees");
    block_on(started.array.shutdown()).unwrap();
    check_settled(&members, disks - removed, old_data_offset, false);
    for m in &members[disks - removed..] {
        assert_eq!(superblock(m).role(), DevRole::Spare, "{what}: a removed member");
    }
    check_each_role_missing(&members[..disks - removed], &model, &what);
}

#[test]
fn raid10_n2_shrinks_from_five_to_four_under_writes_and_restarts() {
    shrink_under_writes_and_restarts("n2", 5, 1, 0x1054);
}

#[test]
fn raid10_n2_shrinks_from_four_to_two_under_writes_and_restarts() {
    shrink_under_writes_and_restarts("n2", 4, 2, 0x1042);
}

#[test]
fn raid10_n3_shrinks_from_five_to_three_under_writes_and_restarts() {
    shrink_under_writes_and_restarts("n3", 5, 2, 0x1053);
}

/// Crashes at random member writes of a raid10 reshape from `disks` to `to` members; every
/// restart continues from the superblocks and no byte that stays is ever lost.
fn through_crashes(disks: usize, to: usize, seed: u64) {
    let members = create("n2", disks, to.saturating_sub(disks));
    let mut rng = Rng(seed);
    let started = start(&members[..disks]);
    let mut model = model_written(&started.array, &mut rng);
    let old_size = model.len();
    if to > disks {
        let new: Vec<Arc<dyn Member>> = members[disks..].iter().map(|m| m.clone() as Arc<dyn Member>).collect();
        block_on(started.array.admin().grow(new)).expect("the grow starts");
    } else {
        let size = remove_confirmed(&started.array, to) as usize;
        model.truncate(size);
    }
    drop(started);
    let what = format!("raid10 {disks} -> {to}");
    let crashes = reshape_through_crashes(&members, &mut rng, &what, |started| {
        assert_eq!(started.array.size_bytes() as usize, model.len().min(old_size), "{what}: the size");
        check_all(&started.array, &model, "restarted");
    });
    assert!(crashes >= 5, "{what}: only {crashes} crashes");
    let started = start(&members);
    assert!(started.array.shape().reshape().is_none(), "{what}: finished");
    assert_eq!(started.array.geometry().raid_disks(), to);
    model.resize(started.array.size_bytes() as usize, 0);
    check_all(&started.array, &model, "reshaped through crashes");
    while block_on(started.array.maintenance().step(4 << 20)).unwrap() != Step::Idle {}
    assert_eq!(mismatches(&started.array), 0, "{what}: every copy agrees");
}

#[test]
fn raid10_grows_through_crashes_at_any_member_write() {
    through_crashes(3, 4, 0x10c3);
}

#[test]
fn raid10_shrinks_through_crashes_at_any_member_write() {
    through_crashes(4, 3, 0x10c4);
}

/// Asks `array` for a reshape (with the blank members given) and returns the refusal.
type Refusal = dyn Fn(&Array<dyn Member>, Vec<Arc<dyn Member>>) -> String;

#[test]
fn raid10_reshapes_are_refused_where_md_refuses_them() {
    let refusal = |name: &str, disks: usize, f: &Refusal| {
        let members = create(name, disks, 1);
        let started = start(&members[..disks]);
        f(&started.array, vec![members[disks].clone() as Arc<dyn Member>])
    };
    let grow = |a: &Array<dyn Member>, new| block_on(a.admin().grow(new)).unwrap_err().to_string();
    let far = refusal("f2", 4, &grow);
    assert!(far.contains("f2") && far.contains("cannot be reshaped"), "{far}");
    let offset = refusal("o2", 4, &grow);
    assert!(offset.contains("near layouts") && offset.contains("mdadm"), "{offset}");
    let copies =
        refusal("n2", 3, &|a, new| block_on(a.admin().reshape(new, Some(layout("n3")), None)).unwrap_err().to_string());
    assert!(copies.contains("number of copies"), "{copies}");
    let too_few =
        refusal("n3", 3, &|a, _| block_on(a.admin().remove_members(2, None, None, None)).unwrap_err().to_string());
    assert!(too_few.contains("at least 3"), "{too_few}");
    let degraded = refusal("n2", 4, &|a, new| {
        block_on(a.admin().fail_role(1)).unwrap();
        block_on(a.admin().grow(new)).unwrap_err().to_string()
    });
    assert!(degraded.contains("in sync"), "a degraded raid10 is not reshaped: {degraded}");
}
