//! Changing an array's size (md's `--grow --size max|SIZE`): the members grew (a resized
//! volume) and the array takes the new space, or it gives some back. Every byte below the old
//! end reads back the same through it, restarts (no shutdown) included; the new space is
//! resynced, so parity and mirrors match at the end and a write there before the resync is
//! right also when read degraded; the superblocks say what md writes.

use std::sync::Arc;

use futures::executor::block_on;
use raid_core::engine::{MaintenanceWork, SizeTarget};
use raid_core::geometry::Level;
use raid_core::{Member, MemoryMember, SECTOR_BYTES};

mod md_common;

use md_common::in_memory::{
    self, Rng, check_all, check_each_role_missing, mismatches, read_all, restore, run_to_idle, snapshot, start,
    superblock, write_all,
};

const MEMBER_BYTES: u64 = 24 << 20;
const GROWN_BYTES: u64 = 40 << 20;

/// An md array of `disks` memory members of `MEMBER_BYTES` (64 KiB chunks).
fn create(level: Level, disks: usize, ppl: bool) -> Vec<Arc<MemoryMember>> {
    in_memory::create(level, None, disks, 0, ppl, MEMBER_BYTES)
}

/// Grows every member (the volumes were resized), filling the new room with garbage: the
/// devices hold whatever they held there, and the resync must make it consistent.
fn grow_members(members: &[Arc<MemoryMember>], rng: &mut Rng) {
    for m in members {
        m.grow_to(GROWN_BYTES);
        let garbage = rng.bytes((GROWN_BYTES - MEMBER_BYTES) as usize);
        m.with_data(|d| d[MEMBER_BYTES as usize..].copy_from_slice(&garbage));
    }
}

/// `--size max` after the members grew: the export grows at once, the new space is resynced
/// (also across a restart half-way), writes there before and during the resync read back
/// right, and md's fields say so.
fn grow_to_max(level: Level, disks: usize, ppl: bool, seed: u64) {
    let members = create(level, disks, ppl);
    let mut rng = Rng(seed);
    let started = start(&members);
    let old_size = started.array.size_bytes() as usize;
    let mut model = rng.bytes(old_size);
    write_all(&started.array, &model);
    // A clean restart: md records where the new space's resync begins only on a clean array
    // (a dirty one resyncs everything after a crash anyway).
    block_on(started.array.shutdown()).unwrap();
    drop(started);
    let started = start(&members);
    let before = superblock(&members[0]);
    let old_resync_sectors = started.array.geometry().resync_sectors();

    // Not grown yet: max is what it has.
    let same = block_on(started.array.admin().resize(SizeTarget::Max)).unwrap();
    assert_eq!(same.from_component_sectors, same.to_component_sectors, "{level}: nothing to take");

    grow_members(&members, &mut rng);
    let resized = block_on(started.array.admin().resize(SizeTarget::Max)).expect("resize");
    assert_eq!(resized.from_bytes, old_size as u64);
    assert_eq!(resized.from_component_sectors, before.size);
    assert!(resized.to_component_sectors > before.size, "{level}: {resized:?}");
    assert_eq!(resized.to_component_sectors % 128, 0, "{level}: a whole number of chunks");
    assert!(
        resized.to_component_sectors * SECTOR_BYTES + before.data_offset * SECTOR_BYTES <= GROWN_BYTES,
        "{level}: fits the devices"
    );
    let new_size = started.array.size_bytes() as usize;
    assert_eq!(new_size as u64, resized.to_bytes);
    assert!(new_size > old_size);
    let status = started.array.maintenance().status();
    assert!(status.resync_pending, "{level}: the new space waits for its resync");
    let sb = superblock(&members[0]);
    assert_eq!(sb.size, resized.to_component_sectors, "{level}: md's size");
    assert!(sb.data_size >= sb.size, "{level}: data_size {} < size {}", sb.data_size, sb.size);
    assert_eq!(sb.resync_offset, old_resync_sectors, "{level}: md's resync_offset at the old end");

    // The new space reads as it is until written: take what it reads now, then write half.
    model.extend_from_slice(&read_all(&started.array)[old_size..]);
    let half = old_size + (new_size - old_size) / 2;
    let data = rng.bytes(half - old_size);
    block_on(started.array.write(old_size as u64, &data, false)).unwrap();
    model[old_size..half].copy_from_slice(&data);
    // A small write well inside the new space, before the resync got there.
    let small_at = (new_size - 3 * 65536) as u64;
    let small = rng.bytes(4096);
    block_on(started.array.write(small_at, &small, false)).unwrap();
    model[small_at as usize..small_at as usize + 4096].copy_from_slice(&small);
    check_all(&started.array, &model, "grown, before the resync");

    // Half the resync, then a SIGKILL: the next start continues it.
    for _ in 0..4 {
        let _ = block_on(started.array.maintenance().step(1 << 20)).unwrap();
    }
    let roles = started.array.geometry().raid_disks();
    if ppl {
        // Dirty now; a partial parity log replays instead of resyncing after a crash, so the
        // dirty mark keeps where the resync stands (md's own PPL would forget it).
        let offset = superblock(&members[0]).resync_offset;
        assert!(offset >= old_resync_sectors && offset < u64::MAX, "{level} ppl: resync_offset {offset}");
    }
    drop(started);
    // The small write, read with each role missing before the resync reached it: the right
    // bytes or an error, never others (a read-modify-write over garbage parity would lie).
    let images = snapshot(&members);
    for role in 0..roles {
        let crashed = start(&members);
        block_on(crashed.array.admin().fail_role(role)).unwrap();
        if let Ok(got) = block_on(crashed.array.read(small_at, 4096)) {
            assert!(got.to_vec() == small, "{level}: without role {role} the new space lies");
        }
        drop(crashed);
        restore(&members, &images);
    }
    let started = start(&members);
    assert_eq!(started.array.size_bytes() as usize, new_size, "{level}: the size survives a crash");
    assert!(started.array.maintenance().status().resync_pending, "{level}: the resync is still pending");
    let finished = run_to_idle(&started.array);
    assert!(finished.contains(&MaintenanceWork::Resync), "{level}: {finished:?}");
    // Unwritten new space on a mirror reads as the resync made it.
    if matches!(level, Level::Raid1 | Level::Raid10) {
        model[half..].copy_from_slice(&read_all(&started.array)[half..]);
        model[small_at as usize..small_at as usize + 4096].copy_from_slice(&small);
    }
    check_all(&started.array, &model, "resynced");
    assert_eq!(mismatches(&started.array), 0, "{level}: redundancy matches data after the resync");
    block_on(started.array.shutdown()).unwrap();
    for m in &members {
        let sb = superblock(m);
        assert_eq!(sb.size, resized.to_component_sectors, "{level}: {}", m.name());
        assert_eq!(sb.resync_offset, u64::MAX, "{level}: {} in sync", m.name());
        assert!(sb.is_clean());
    }
    let again = start(&members);
    check_all(&again.array, &model, "after a clean restart");
    drop(again);
    // Every role missing in turn reads the same bytes: the new space's redundancy is real.
    check_each_role_missing(&members, &model, &level.to_string());
}

#[test]
fn raid5_grows_to_max() {
    grow_to_max(Level::Raid5, 3, false, 0x55);
}

#[test]
fn raid6_grows_to_max() {
    grow_to_max(Level::Raid6, 4, false, 0x66);
}

#[test]
fn raid1_grows_to_max() {
    grow_to_max(Level::Raid1, 2, false, 0x11);
}

#[test]
fn raid10_grows_to_max() {
    grow_to_max(Level::Raid10, 4, false, 0x10);
}

#[test]
fn raid5_with_a_partial_parity_log_grows_to_max_and_a_crash_keeps_the_resync() {
    grow_to_max(Level::Raid5, 3, true, 0x5f);
}

/// A smaller `--size`: the export shrinks at once, requests past the new end are refused,
/// what is below reads back the same across restarts, and growing again resyncs the space
/// given back.
#[test]
fn raid5_shrinks_and_grows_back() {
    let members = create(Level::Raid5, 3, false);
    let mut rng = Rng(0x5a);
    let started = start(&members);
    let old_size = started.array.size_bytes() as usize;
    let model = rng.bytes(old_size);
    write_all(&started.array, &model);
    let from = superblock(&members[0]).size;
    let err = block_on(started.array.admin().resize(SizeTarget::Sectors(from / 2 + 8))).unwrap_err();
    assert!(err.to_string().contains("not a multiple"), "{err}");
    let err = block_on(started.array.admin().resize(SizeTarget::Sectors(from + 1024))).unwrap_err();
    assert!(err.to_string().contains("has room for"), "{err}");

    let to = from / 2 / 128 * 128;
    let resized = block_on(started.array.admin().resize(SizeTarget::Sectors(to))).expect("shrink");
    assert_eq!((resized.from_component_sectors, resized.to_component_sectors), (from, to));
    let new_size = started.array.size_bytes() as usize;
    assert_eq!(new_size as u64, resized.to_bytes);
    assert_eq!(new_size as u64, to * SECTOR_BYTES * 2, "two data members");
    let err = block_on(started.array.read(new_size as u64, 4096)).unwrap_err();
    assert!(err.to_string().contains("beyond array end"), "a read past the new end: {err}");
    assert!(block_on(started.array.write(new_size as u64 - 4096, &[1; 8192], false)).is_err());
    check_all(&started.array, &model[..new_size], "shrunk");
    assert_eq!(superblock(&members[1]).size, to);
    drop(started);
    let started = start(&members);
    assert_eq!(started.array.size_bytes() as usize, new_size, "the smaller size survives a crash");
    check_all(&started.array, &model[..new_size], "shrunk, restarted");
    run_to_idle(&started.array);
    block_on(started.array.shutdown()).unwrap();
    drop(started);

    let started = start(&members);
    let resized = block_on(started.array.admin().resize(SizeTarget::Max)).expect("grow back");
    assert_eq!(resized.to_component_sectors, from, "the devices did not change");
    assert_eq!(superblock(&members[0]).resync_offset, to, "the space given back is resynced");
    run_to_idle(&started.array);
    assert_eq!(mismatches(&started.array), 0);
    let below = block_on(started.array.read(0, new_size)).unwrap().to_vec();
    assert!(below == model[..new_size], "grown back: the bytes below the small end are kept");
}

#[test]
fn a_resize_is_refused_where_it_cannot_be_done_safely() {
    let members = create(Level::Raid0, 2, false);
    let started = start(&members);
    let err = block_on(started.array.admin().resize(SizeTarget::Max)).unwrap_err();
    assert!(err.to_string().contains("grow it by members"), "raid0: {err}");

    let members = in_memory::create(Level::Raid10, Some(0x201), 2, 0, false, MEMBER_BYTES);
    let started = start(&members);
    let err = block_on(started.array.admin().resize(SizeTarget::Max)).unwrap_err();
    assert!(err.to_string().contains("far copies"), "raid10 f2: {err}");

    let members = create(Level::Raid5, 3, false);
    let started = start(&members);
    block_on(started.array.admin().fail_role(2)).unwrap();
    let err = block_on(started.array.admin().resize(SizeTarget::Max)).unwrap_err();
    assert!(err.to_string().contains("in sync"), "degraded: {err}");
    drop(started);

    let members = create(Level::Raid5, 3, false);
    let started = start(&members);
    started.array.maintenance().start_scrub(false).unwrap();
    let _ = block_on(started.array.maintenance().step(1 << 20)).unwrap();
    let err = block_on(started.array.admin().resize(SizeTarget::Max)).unwrap_err();
    assert!(err.to_string().contains("background work"), "while checking: {err}");
}
