//! Growing a raid5/raid6 by members while it serves (md's no-backup reshape): every byte reads
//! back right before, during and after, with writes racing the reshape's windows and restarts
//! from the superblocks at any step (a SIGKILL: nothing shut down); the superblocks say what
//! md writes (the reshape fields while it runs, the new geometry and data offset at the end),
//! and the grown array's parity matches its data.

use std::sync::Arc;

use futures::executor::block_on;
use raid_core::engine::Step;
use raid_core::geometry::Level;
use raid_core::md::{self, FeatureMap};
use raid_core::{Member, MemoryMember};

mod md_common;

use md_common::crash::reshape_through_crashes;
use md_common::in_memory::{self, Rng, check_all, start, superblock};

const MEMBER_BYTES: u64 = 24 << 20;

/// An md array of `disks` memory members (64 KiB chunks, resync policy), and `extra` blank
/// members of the same size.
fn create(level: Level, disks: usize, extra: usize) -> Vec<Arc<MemoryMember>> {
    in_memory::create(level, None, disks, extra, false, MEMBER_BYTES)
}

/// Grows `level` from `disks` to `disks + 1` members under writes, restarting (no shutdown)
/// every few windows, and checks every byte and the superblocks.
fn grow_under_writes_and_restarts(level: Level, disks: usize, seed: u64) {
    let members = create(level, disks, 1);
    let mut rng = Rng(seed);
    let started = start(&members[..disks]);
    let old_size = started.array.size_bytes() as usize;
    let old_data_offset = superblock(&members[0]).data_offset;
    let mut model = rng.bytes(old_size);
    block_on(started.array.write(0, &model[..old_size / 2], false)).unwrap();
    block_on(started.array.write((old_size / 2) as u64, &model[old_size / 2..], false)).unwrap();

    let new: Arc<dyn Member> = members[disks].clone();
    block_on(started.array.admin().grow(vec![new])).expect("the grow starts");
    assert!(started.array.shape().reshape().is_some(), "reshaping");
    assert_eq!(started.array.size_bytes() as usize, old_size, "the export keeps its size while it grows");
    let sb = superblock(&members[0]);
    assert!(sb.feature_map.contains(FeatureMap::RESHAPE_ACTIVE | FeatureMap::NEW_OFFSET), "{:?}", sb.feature_map);
    assert_eq!((sb.raid_disks, sb.delta_disks, sb.reshape_position), (disks as u32 + 1, 1, 0));
    assert!(sb.new_offset < 0, "the data start moves into the headroom: {}", sb.new_offset);
    assert_eq!(superblock(&members[disks]).dev_roles, sb.dev_roles, "the new member has the array's role table");

    let (started, restarts) =
        in_memory::reshape_under_writes(&members, started, &mut rng, &mut model, 5, &level.to_string());
    assert!(restarts >= 2, "{level}: restarted {restarts} times");
    // Grown: the new geometry, the export larger, the new space zeros.
    let new_size = started.array.size_bytes() as usize;
    assert!(new_size > old_size, "{level}: the export grew ({old_size} -> {new_size})");
    assert_eq!(started.array.geometry().raid_disks(), disks + 1);
    model.resize(new_size, 0);
    check_all(&started.array, &model, "grown");
    // The resync the restarts (unclean stops) left pending runs after the reshape.
    while block_on(started.array.maintenance().step(4 << 20)).unwrap() != Step::Idle {}
    let units = started.array.maintenance().scrub_units();
    let counts = block_on(started.array.maintenance().scrub(0, units, false)).unwrap();
    assert_eq!(counts.mismatch_sectors, 0, "{level}: parity matches data after the grow");
    block_on(started.array.shutdown()).unwrap();
    for m in &members {
        let sb = superblock(m);
        assert!(!sb.feature_map.intersects(FeatureMap::RESHAPE_ACTIVE | FeatureMap::NEW_OFFSET), "{level}: done");
        assert_eq!(sb.raid_disks as usize, disks + 1);
        assert!(sb.data_offset < old_data_offset, "{level}: {} moved into the headroom", m.name());
        assert!(sb.is_clean());
    }
    let again = start(&members);
    assert!(again.array.shape().reshape().is_none());
    check_all(&again.array, &model, "after a clean restart");
}

#[test]
fn raid5_grows_by_a_member_under_writes_and_restarts() {
    grow_under_writes_and_restarts(Level::Raid5, 3, 0x51);
}

#[test]
fn raid6_grows_by_a_member_under_writes_and_restarts() {
    grow_under_writes_and_restarts(Level::Raid6, 4, 0x61);
}

#[test]
fn a_grow_is_refused_where_md_cannot_do_it_without_a_backup() {
    let members = create(Level::Raid5, 3, 1);
    let started = start(&members[..3]);
    let twice: Vec<Arc<dyn Member>> = vec![members[3].clone(), members[3].clone()];
    let err = block_on(started.array.admin().grow(twice)).unwrap_err();
    assert!(err.to_string().contains("named twice"), "{err}");
    let own: Vec<Arc<dyn Member>> = vec![members[0].clone()];
    let err = block_on(started.array.admin().grow(own)).unwrap_err();
    assert!(err.to_string().contains("already part of the array"), "{err}");
    let small: Arc<dyn Member> = Arc::new(MemoryMember::new("small", 1 << 20));
    let err = block_on(started.array.admin().grow(vec![small])).unwrap_err();
    assert!(err.to_string().contains("too small"), "{err}");
    block_on(started.array.admin().fail_role(1)).unwrap();
    let err = block_on(started.array.admin().grow(vec![members[3].clone() as Arc<dyn Member>])).unwrap_err();
    assert!(err.to_string().contains("in sync"), "{err}");
}

/// Crashes at random member writes of the reshape (inside a window's copy, between its
/// flush and its superblocks, half-way through the superblocks), with large windows; every
/// restart continues from the superblocks and no byte is ever lost.
fn grow_through_crashes(level: Level, disks: usize, seed: u64) {
    let members = create(level, disks, 1);
    let mut rng = Rng(seed);
    let started = start(&members[..disks]);
    let old_size = started.array.size_bytes() as usize;
    let model = rng.bytes(old_size);
    in_memory::write_all(&started.array, &model);
    block_on(started.array.admin().grow(vec![members[disks].clone() as Arc<dyn Member>])).unwrap();
    drop(started);
    let crashes = reshape_through_crashes(&members, &mut rng, &level.to_string(), |started| {
        let mut expected = model.clone();
        expected.resize(started.array.size_bytes() as usize, 0);
        check_all(&started.array, &expected, "restarted");
    });
    assert!(crashes >= 5, "{level}: only {crashes} crashes");
    let started = start(&members);
    assert!(started.array.shape().reshape().is_none(), "{level}: finished");
    let mut grown = model.clone();
    grown.resize(started.array.size_bytes() as usize, 0);
    check_all(&started.array, &grown, "grown through crashes");
    assert_eq!(started.array.geometry().level(), level);
    assert_eq!(started.array.geometry().raid_disks(), disks + 1);
    while block_on(started.array.maintenance().step(4 << 20)).unwrap() != Step::Idle {}
    if level != Level::Raid0 {
        let units = started.array.maintenance().scrub_units();
        assert_eq!(block_on(started.array.maintenance().scrub(0, units, false)).unwrap().mismatch_sectors, 0);
    }
}

#[test]
fn raid0_grows_through_crashes_at_any_member_write() {
    grow_through_crashes(Level::Raid0, 3, 0x0c);
}

#[test]
fn raid5_grows_through_crashes_at_any_member_write() {
    grow_through_crashes(Level::Raid5, 3, 0x5c);
}

#[test]
fn raid6_grows_through_crashes_at_any_member_write() {
    grow_through_crashes(Level::Raid6, 4, 0x6c);
}

/// A raid0 grows the way md grows one (mdadm's Grow.c): a raid4 without its parity member,
/// reshaped onto the new members (the first fills the parity role's place and is recovered by
/// the reshape, the new layout's parity role stays missing), and a raid0 again at the end;
/// under writes, with restarts (no shutdown) every few windows.
#[test]
fn raid0_grows_by_two_members_through_a_raid4_under_writes_and_restarts() {
    let disks = 3;
    let members = in_memory::create(Level::Raid0, None, disks, 2, false, MEMBER_BYTES);
    let mut rng = Rng(0x0a);
    let started = start(&members[..disks]);
    let old_size = started.array.size_bytes() as usize;
    let mut model = rng.bytes(old_size);
    in_memory::write_all(&started.array, &model);
    let new: Vec<Arc<dyn Member>> = vec![members[disks].clone(), members[disks + 1].clone()];
    block_on(started.array.admin().grow(new)).expect("the grow starts");
    assert_eq!(started.array.geometry().level(), Level::Raid4, "a raid4 while it reshapes");
    let sb = superblock(&members[0]);
    assert_eq!((sb.raid_disks, sb.delta_disks), (disks as u32 + 3, 2), "raid4 of 4 -> 6 roles");
    let filler = superblock(&members[disks]);
    assert_eq!(filler.role(), md::DevRole::Active(disks as u16), "the first new member fills the parity role");
    assert_eq!(filler.recovery_offset(), Some(0), "recovered by the reshape");
    assert_eq!(superblock(&members[disks + 1]).role(), md::DevRole::Active(disks as u16 + 1));
    let (started, restarts) = in_memory::reshape_under_writes(&members, started, &mut rng, &mut model, 4, "raid0");
    assert!(restarts >= 2, "restarted during the reshape {restarts} times");
    assert_eq!(started.array.geometry().level(), Level::Raid0, "a raid0 again");
    assert_eq!(started.array.geometry().raid_disks(), disks + 2);
    let new_size = started.array.size_bytes() as usize;
    assert_eq!(new_size, old_size / disks * (disks + 2), "two members' more room");
    model.resize(new_size, 0);
    check_all(&started.array, &model, "grown");
    assert_eq!(block_on(started.array.maintenance().step(4 << 20)).unwrap(), Step::Idle, "nothing left to do");
    block_on(started.array.shutdown()).unwrap();
    for m in &members {
        let sb = superblock(m);
        assert_eq!((sb.level, sb.raid_disks), (Level::Raid0, disks as u32 + 2), "{}", m.name());
        assert!(sb.recovery_offset().is_none() && !sb.feature_map.contains(FeatureMap::RESHAPE_ACTIVE));
    }
    let again = start(&members);
    check_all(&again.array, &model, "after a clean restart");
}
