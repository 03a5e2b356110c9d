//! Removing members from a raid4/5/6 while it serves (md's backwards reshape: the data start
//! moves up into the room after the data, the new layout is written from the end of the
//! array down): the size is confirmed first, every byte that stays reads back right during
//! and after, with writes racing the windows and restarts from the superblocks at any step
//! (a SIGKILL: nothing shut down), the superblocks say what md writes, the removed members
//! end as spares, and parity matches data.

use std::sync::Arc;

use futures::executor::block_on;
use raid_core::engine::Step;
use raid_core::geometry::Level;
use raid_core::md::{DevRole, FeatureMap};
use raid_core::{Member, MemoryMember, SECTOR_BYTES};

mod md_common;

use md_common::crash::reshape_through_crashes;
use md_common::in_memory::{self, Rng, check_all, check_each_role_missing, remove_confirmed, start, superblock};

const MEMBER_BYTES: u64 = 24 << 20;

fn create(level: Level, disks: usize) -> Vec<Arc<MemoryMember>> {
    in_memory::create(level, None, disks, 0, false, MEMBER_BYTES)
}

/// Removes one member of `level` under writes, restarting (no shutdown) every few windows,
/// and checks every byte, the superblocks and the spare left.
fn shrink_under_writes_and_restarts(level: Level, disks: usize, seed: u64) {
    let members = create(level, disks);
    let mut rng = Rng(seed);
    let started = start(&members);
    let old_size = started.array.size_bytes() as usize;
    let old_data_offset = superblock(&members[0]).data_offset;
    let mut model = rng.bytes(old_size);
    in_memory::write_all(&started.array, &model);

    let new_size = remove_confirmed(&started.array, disks - 1) as usize;
    assert!(new_size < old_size, "{level}: smaller ({old_size} -> {new_size})");
    assert_eq!(started.array.size_bytes() as usize, new_size, "{level}: the export shrinks at once");
    model.truncate(new_size);
    assert!(
        block_on(started.array.read(new_size as u64, 4096)).is_err(),
        "{level}: past the new end is refused at once"
    );
    let sb = superblock(&members[0]);
    assert!(sb.feature_map.contains(FeatureMap::RESHAPE_ACTIVE | FeatureMap::NEW_OFFSET), "{:?}", sb.feature_map);
    assert!(!sb.feature_map.contains(FeatureMap::RESHAPE_BACKWARDS), "md says backwards by delta_disks < 0");
    assert_eq!((sb.raid_disks, sb.delta_disks), (disks as u32 - 1, -1));
    assert_eq!(sb.reshape_position * SECTOR_BYTES, new_size as u64, "md starts at the new end");
    assert!(sb.new_offset > 0, "the data start moves up: {}", sb.new_offset);
    assert_eq!(superblock(&members[disks - 1]).role(), DevRole::Active(disks as u16 - 1), "still a role");
    check_all(&started.array, &model, "started");

    let (started, restarts) =
        in_memory::reshape_under_writes(&members, started, &mut rng, &mut model, 5, &level.to_string());
    assert!(restarts >= 2, "{level}: restarted {restarts} times");
    assert_eq!(started.array.geometry().raid_disks(), disks - 1);
    assert_eq!(started.array.size_bytes() as usize, new_size);
    assert_eq!(started.array.admin().spare_status().len(), 1, "{level}: the removed member is a spare");
    check_all(&started.array, &model, "shrunk");
    while block_on(started.array.maintenance().step(4 << 20)).unwrap() != Step::Idle {}
    let units = started.array.maintenance().scrub_units();
    let counts = block_on(started.array.maintenance().scrub(0, units, false)).unwrap();
    assert_eq!(counts.mismatch_sectors, 0, "{level}: parity matches data after the shrink");
    block_on(started.array.shutdown()).unwrap();
    for m in &members {
        let sb = superblock(m);
        assert!(!sb.feature_map.intersects(FeatureMap::RESHAPE_ACTIVE | FeatureMap::NEW_OFFSET), "{level}: done");
        assert_eq!(sb.raid_disks as usize, disks - 1);
        assert!(sb.data_offset > old_data_offset, "{level}: {} moved its data start up", m.name());
        assert!(sb.data_offset + sb.data_size <= MEMBER_BYTES / SECTOR_BYTES);
        assert!(sb.is_clean());
    }
    assert_eq!(superblock(&members[disks - 1]).role(), DevRole::Spare, "{level}: the removed member");
    let again = start(&members[..disks - 1]);
    assert!(again.array.shape().reshape().is_none());
    assert_eq!(again.array.size_bytes() as usize, new_size);
    check_all(&again.array, &model, "after a clean restart without the removed member");
    drop(again);
    check_each_role_missing(&members[..disks - 1], &model, "shrunk");
}

#[test]
fn raid5_loses_a_member_under_writes_and_restarts() {
    shrink_under_writes_and_restarts(Level::Raid5, 5, 0x55);
}

#[test]
fn raid6_loses_a_member_under_writes_and_restarts() {
    shrink_under_writes_and_restarts(Level::Raid6, 6, 0x66);
}

#[test]
fn raid4_loses_a_member_under_writes_and_restarts() {
    shrink_under_writes_and_restarts(Level::Raid4, 4, 0x44);
}

#[test]
fn removing_members_is_refused_where_md_refuses_it() {
    let members = create(Level::Raid6, 4);
    let started = start(&members);
    let err = block_on(started.array.admin().remove_members(3, None, None, None)).unwrap_err();
    assert!(err.to_string().contains("at least 4"), "raid6 keeps 4 members: {err}");
    let err = block_on(started.array.admin().remove_members(4, None, None, None)).unwrap_err();
    assert!(err.to_string().contains("fewer"), "{err}");
    block_on(started.array.admin().fail_role(1)).unwrap();
    drop(started);
    let members = create(Level::Raid5, 4);
    let started = start(&members);
    block_on(started.array.admin().fail_role(2)).unwrap();
    let err = block_on(started.array.admin().remove_members(3, None, None, None)).unwrap_err();
    assert!(err.to_string().contains("in sync"), "a degraded array is not reshaped: {err}");
}

/// Crashes at random member writes of the shrink; every restart continues from the
/// superblocks and no byte that stays is ever lost.
fn shrink_through_crashes(level: Level, disks: usize, seed: u64) {
    let members = create(level, disks);
    let mut rng = Rng(seed);
    let started = start(&members);
    let old_size = started.array.size_bytes() as usize;
    let mut model = rng.bytes(old_size);
    in_memory::write_all(&started.array, &model);
    let new_size = remove_confirmed(&started.array, disks - 1) as usize;
    model.truncate(new_size);
    drop(started);
    let crashes = reshape_through_crashes(&members, &mut rng, &level.to_string(), |started| {
        assert_eq!(started.array.size_bytes() as usize, new_size, "{level}: the new size from the start");
        check_all(&started.array, &model, "restarted");
    });
    assert!(crashes >= 5, "{level}: only {crashes} crashes");
    let started = start(&members);
    assert!(started.array.shape().reshape().is_none(), "{level}: finished");
    check_all(&started.array, &model, "shrunk through crashes");
    assert_eq!((started.array.geometry().level(), started.array.geometry().raid_disks()), (level, disks - 1));
    while block_on(started.array.maintenance().step(4 << 20)).unwrap() != Step::Idle {}
    if level != Level::Raid0 {
        let units = started.array.maintenance().scrub_units();
        assert_eq!(block_on(started.array.maintenance().scrub(0, units, false)).unwrap().mismatch_sectors, 0);
    }
}

#[test]
fn raid0_loses_a_member_through_crashes_at_any_member_write() {
    shrink_through_crashes(Level::Raid0, 4, 0x0d);
}

/// A raid0 loses a member the way md does it: a raid4 without its parity member, reshaped
/// backwards to one role more than the members kept (the member removed holds the new
/// parity while its data moves to the others), a raid0 again at the end, the removed member
/// a spare; under writes, with restarts.
#[test]
fn raid0_loses_a_member_through_a_raid4_under_writes_and_restarts() {
    let disks = 4;
    let members = create(Level::Raid0, disks);
    let mut rng = Rng(0x0e);
    let started = start(&members);
    let old_size = started.array.size_bytes() as usize;
    let mut model = rng.bytes(old_size);
    in_memory::write_all(&started.array, &model);
    let before = superblock(&members[0]).events;
    let new_size = remove_confirmed(&started.array, disks - 1) as usize;
    assert!(new_size < old_size / disks * (disks - 1) + 1, "{old_size} -> {new_size}");
    model.truncate(new_size);
    assert_eq!(started.array.geometry().level(), Level::Raid4, "a raid4 while it reshapes");
    let sb = superblock(&members[0]);
    assert!(sb.events > before);
    assert_eq!((sb.level, sb.raid_disks, sb.delta_disks), (Level::Raid4, disks as u32, -1), "raid4 of 5 -> 4 roles");
    let (started, restarts) = in_memory::reshape_under_writes(&members, started, &mut rng, &mut model, 4, "raid0");
    assert!(restarts >= 2, "restarted during the reshape {restarts} times");
    assert_eq!((started.array.geometry().level(), started.array.geometry().raid_disks()), (Level::Raid0, disks - 1));
    assert_eq!(started.array.size_bytes() as usize, new_size);
    assert_eq!(started.array.admin().spare_status().len(), 1, "the removed member (it held the new parity)");
    check_all(&started.array, &model, "shrunk");
    block_on(started.array.shutdown()).unwrap();
    for (i, m) in members.iter().enumerate() {
        let sb = superblock(m);
        assert_eq!((sb.level, sb.raid_disks), (Level::Raid0, disks as u32 - 1), "{}", m.name());
        let role = if i < disks - 1 { DevRole::Active(i as u16) } else { DevRole::Spare };
        assert_eq!(sb.role(), role, "{}", m.name());
    }
    let again = start(&members[..disks - 1]);
    check_all(&again.array, &model, "after a clean restart without the removed member");
}

#[test]
fn raid5_loses_a_member_through_crashes_at_any_member_write() {
    shrink_through_crashes(Level::Raid5, 4, 0x5d);
}

#[test]
fn raid6_loses_a_member_through_crashes_at_any_member_write() {
    shrink_through_crashes(Level::Raid6, 5, 0x6d);
}
