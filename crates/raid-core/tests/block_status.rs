//! `base:allocation` of arrays of every level from their members' holes (memory members
//! report all-zero 4 KiB blocks as holes, as a sparse file does): every `zero` or `hole` it
//! claims holds for the array's bytes, whole or degraded, and what nothing was written to is
//! reported as a hole, also with any one member missing.

use std::sync::Arc;

use futures::executor::block_on;
use raid_core::allocation::{Allocation, total_bytes};
use raid_core::engine::Array;
use raid_core::geometry::{Level, Raid10Layout};
use raid_core::write_cache::WriteCache;
use raid_core::{Member, MemoryMember, Volume};

mod md_common;

use md_common::in_memory::{Rng, create, read_all, restore, run_to_idle, snapshot, start};

const MEMBER_BYTES: u64 = 32 << 20;

/// Whole-array status, asked again from where each answer stopped.
fn status_of_all(array: &Array<dyn Member>) -> Vec<Allocation> {
    let size = array.size_bytes();
    let mut all = Vec::new();
    let mut at = 0;
    while at < size {
        let got = block_on(array.block_status(at, size - at)).unwrap();
        let covered = total_bytes(&got);
        assert!(covered > 0 && covered <= size - at, "an answer covers 1..={} bytes, not {covered}", size - at);
        assert!(got.iter().all(|e| e.len_bytes % 512 == 0 && (!e.hole || e.zero)), "sectors; holes read as zero");
        all.extend(got);
        at += covered;
    }
    all
}

/// Every claim of `status` holds for `bytes`; and every 1 MiB window `untouched` says
/// nothing was written near is wholly a hole.
fn check_claims(status: &[Allocation], bytes: &[u8], untouched: &[u64], what: &str) {
    let mut at = 0usize;
    for e in status {
        let range = &bytes[at..at + e.len_bytes as usize];
        if e.zero {
            assert!(range.iter().all(|&b| b == 0), "{what}: {at}+{} claimed zero but holds data", e.len_bytes);
        }
        at += e.len_bytes as usize;
    }
    for &window in untouched {
        let mut start = 0u64;
        let covered = status.iter().any(|e| {
            let hit = e.hole && start <= window && window + (1 << 20) <= start + e.len_bytes;
            start += e.len_bytes;
            hit
        });
        assert!(covered, "{what}: the untouched window at {window} is not reported as a hole");
    }
}

/// Writes random bytes in a few places (and a block of zeros); returns the 1 MiB windows
/// at least 1 MiB away from every write.
fn scatter_writes(array: &Array<dyn Member>, seed: u64) -> Vec<u64> {
    let size = array.size_bytes();
    let mut rng = Rng(seed);
    let mut written = Vec::new();
    for i in 0..5 {
        let len = 4096 * (1 + rng.next() % 48);
        let at = (rng.next() % ((size - len) / 4096)) * 4096;
        let data = if i == 4 { vec![0u8; len as usize] } else { rng.bytes(len as usize) };
        block_on(array.write(at, &data, false)).unwrap();
        written.push((at, at + len));
    }
    (0..size / (1 << 20))
        .map(|w| w << 20)
        .filter(|&w| w + (1 << 20) <= size)
        .filter(|&w| written.iter().all(|&(s, e)| e + (1 << 20) <= w || s >= w + (2 << 20)))
        .collect()
}

fn check_level(level: Level, layout: Option<u32>, disks: usize) {
    let what = format!("{level:?} x{disks} layout {layout:?}");
    let members: Vec<Arc<MemoryMember>> = create(level, layout, disks, 0, false, MEMBER_BYTES);
    let s = start(&members);
    run_to_idle(&s.array);
    let fresh = status_of_all(&s.array);
    assert!(fresh.iter().all(|e| e.hole), "{what}: a new array is all holes: {fresh:?}");
    let untouched = scatter_writes(&s.array, 7 + disks as u64);
    assert!(!untouched.is_empty(), "{what}: the test leaves some windows untouched");
    let bytes = read_all(&s.array);
    let status = status_of_all(&s.array);
    check_claims(&status, &bytes, &untouched, &what);
    assert!(status.iter().any(|e| !e.zero), "{what}: what was written is data");
    drop(s);

    // With each role missing in turn: still true, and untouched windows still holes.
    if level == Level::Raid0 {
        return;
    }
    let images = snapshot(&members);
    for role in 0..disks {
        let s = start(&members);
        block_on(s.array.admin().fail_role(role)).unwrap();
        let status = status_of_all(&s.array);
        check_claims(&status, &bytes, &untouched, &format!("{what} without role {role}"));
        drop(s);
        restore(&members, &images);
    }
}

#[test]
fn every_level_reports_its_members_holes_truthfully_whole_and_degraded() {
    check_level(Level::Raid0, None, 3);
    check_level(Level::Raid1, None, 2);
    check_level(Level::Raid1, None, 3);
    check_level(Level::Raid4, None, 4);
    check_level(Level::Raid5, None, 4);
    check_level(Level::Raid6, None, 5);
    for l in ["n2", "f2", "o2"] {
        check_level(Level::Raid10, Some(Raid10Layout::parse(l).unwrap().to_md()), 4);
    }
}

#[test]
fn a_stripe_whose_parity_holds_data_is_zero_but_not_a_hole() {
    let members = create(Level::Raid5, None, 4, 0, false, MEMBER_BYTES);
    let s = start(&members);
    run_to_idle(&s.array);
    // One chunk of a three-chunk stripe: its parity is written, the other two data chunks
    // read as zero but are no holes any more (their stripe's parity is allocated).
    let chunk = 64 << 10;
    block_on(s.array.write(0, &vec![0x5a; chunk], false)).unwrap();
    let status = block_on(s.array.block_status(0, 4 * chunk as u64)).unwrap();
    assert_eq!(
        status[..2],
        [Allocation::data(chunk as u64), Allocation { len_bytes: 2 * chunk as u64, hole: false, zero: true }]
    );
    assert!(status[2].hole, "the next stripe is untouched");
}

#[test]
fn a_write_back_cache_reports_what_it_holds_as_data() {
    let members = create(Level::Raid5, None, 4, 0, false, MEMBER_BYTES);
    let array = Arc::new(start(&members).array);
    run_to_idle(&array);
    let cache = WriteCache::new(array.clone(), 64 << 20);
    block_on(cache.write(1 << 20, &[7u8; 4096], false)).unwrap();
    let array_says = block_on(array.block_status(1 << 20, 4096)).unwrap();
    assert!(array_says[0].hole, "the write is still only in the cache");
    let before = block_on(Volume::block_status(&cache, 0, 2 << 20)).unwrap();
    assert_eq!(before, vec![Allocation::hole(1 << 20)], "up to the cached write");
    let at = block_on(Volume::block_status(&cache, 1 << 20, 1 << 20)).unwrap();
    assert_eq!(at, vec![Allocation::data(4096)]);
    block_on(cache.flush()).unwrap();
    let after = block_on(Volume::block_status(&cache, 1 << 20, 4096)).unwrap();
    assert_eq!(after, vec![Allocation::data(4096)], "written back: the array's own answer");
}
