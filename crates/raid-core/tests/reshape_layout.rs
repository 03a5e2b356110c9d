//! Changing a raid5/raid6's layout or chunk while it serves (md's no-backup reshape with the
//! same members): every byte reads back right before, during and after, with writes racing
//! the windows and restarts from the superblocks (no shutdown) along the way; the superblocks
//! say md's reshape fields while it runs and the new layout and chunk at the end.

use std::sync::Arc;

use futures::executor::block_on;
use raid_core::engine::Step;
use raid_core::geometry::{Level, ParityLayout};
use raid_core::md::FeatureMap;
use raid_core::{Member, MemoryMember};

mod md_common;

use md_common::in_memory::{self, Rng, check_all, run_to_idle, start, superblock, write_all};

const MEMBER_BYTES: u64 = 24 << 20;

fn create(level: Level, layout: ParityLayout, disks: usize) -> Vec<Arc<MemoryMember>> {
    in_memory::create(level, Some(layout as u32), disks, 0, false, MEMBER_BYTES)
}

/// Changes `level`'s layout `from` -> `to` and its chunk 64 KiB -> `chunk_sectors` under
/// writes, restarting every few windows, and checks every byte and the superblocks.
fn reshape_under_writes_and_restarts(level: Level, disks: usize, from: ParityLayout, to: ParityLayout, chunk: u32) {
    let members = create(level, from, disks);
    let mut rng = Rng(0x1a + chunk as u64 + to as u64);
    let started = start(&members);
    run_to_idle(&started.array);
    let size = started.array.size_bytes() as usize;
    let old_data_offset = superblock(&members[0]).data_offset;
    let mut model = rng.bytes(size);
    write_all(&started.array, &model);
    let layout = (to != from).then_some(to as u32);
    let new_chunk = (chunk != 128).then_some(chunk);
    block_on(started.array.admin().reshape(Vec::new(), layout, new_chunk)).expect("the reshape starts");
    let sb = superblock(&members[0]);
    assert!(sb.feature_map.contains(FeatureMap::RESHAPE_ACTIVE | FeatureMap::NEW_OFFSET), "{:?}", sb.feature_map);
    assert_eq!((sb.delta_disks, sb.new_layout, sb.new_chunk), (0, to as u32, chunk));
    assert!(sb.new_offset < 0, "the data start moves into the headroom: {}", sb.new_offset);
    let (started, restarts) =
        in_memory::reshape_under_writes(&members, started, &mut rng, &mut model, 4, &level.to_string());
    assert!(restarts >= 2, "{level}: restarted {restarts} times");
    let pg = started.array.geometry().parity().unwrap().clone();
    assert_eq!((pg.layout(), pg.chunk_sectors()), (to, chunk));
    check_all(&started.array, &model, "reshaped");
    while block_on(started.array.maintenance().step(8 << 20)).unwrap() != Step::Idle {}
    let units = started.array.maintenance().scrub_units();
    assert_eq!(block_on(started.array.maintenance().scrub(0, units, false)).unwrap().mismatch_sectors, 0);
    block_on(started.array.shutdown()).unwrap();
    for m in &members {
        let sb = superblock(m);
        assert!(!sb.feature_map.intersects(FeatureMap::RESHAPE_ACTIVE | FeatureMap::NEW_OFFSET), "done");
        assert_eq!((sb.layout, sb.chunksize), (to as u32, chunk), "{}", m.name());
        assert!(sb.data_offset < old_data_offset, "{}: moved into the headroom", m.name());
    }
    let again = start(&members);
    check_all(&again.array, &model, "after a clean restart");
}

#[test]
fn raid5_changes_its_layout_under_writes_and_restarts() {
    reshape_under_writes_and_restarts(Level::Raid5, 4, ParityLayout::LeftSymmetric, ParityLayout::RightAsymmetric, 128);
}

#[test]
fn raid5_changes_its_chunk_under_writes_and_restarts() {
    reshape_under_writes_and_restarts(Level::Raid5, 3, ParityLayout::LeftSymmetric, ParityLayout::LeftSymmetric, 64);
    reshape_under_writes_and_restarts(Level::Raid5, 3, ParityLayout::LeftSymmetric, ParityLayout::LeftSymmetric, 256);
}

/// The second half of md's raid5 -> raid6: Q moves from the last member into the rotation.
#[test]
fn raid6_moves_q_into_the_rotation_under_writes_and_restarts() {
    reshape_under_writes_and_restarts(Level::Raid6, 4, ParityLayout::LeftSymmetric6, ParityLayout::LeftSymmetric, 128);
}

#[test]
fn a_layout_change_that_would_shrink_the_array_is_refused() {
    let members = create(Level::Raid5, ParityLayout::LeftSymmetric, 3);
    let started = start(&members);
    let err = block_on(started.array.admin().reshape(Vec::new(), None, Some(128))).unwrap_err();
    assert!(err.to_string().contains("changes the layout or chunk"), "nothing to change: {err}");
    let size_sectors = started.array.geometry().component_sectors();
    // A chunk that does not divide the members' data would lose the end.
    let big = (1..12).map(|s| 128u32 << s).find(|&c| !size_sectors.is_multiple_of(u64::from(c))).unwrap();
    let err = block_on(started.array.admin().reshape(Vec::new(), None, Some(big))).unwrap_err();
    assert!(err.to_string().contains("not a multiple of the new chunk"), "{err}");
}
