//! Per-block checksums (`create --integrity`): a member that returns wrong bytes without an
//! error is caught on every read, the bytes are served right from redundancy, and the member
//! is healed; without redundancy left the read fails. After a crash the checksums of what the
//! crash may have left half-written are stamped again, never reported as corruption.

use std::sync::Arc;

use futures::executor::block_on;
use raid_core::engine::Array;
use raid_core::geometry::Level;
use raid_core::integrity::{self, IntegrityMember, reserve_bytes};
use raid_core::md::{self, SUPERBLOCK_BYTE_OFFSET, StartOptions};
use raid_core::{AlignedBuf, Member, MemoryMember};

mod md_common;

use md_common::in_memory::{Rng, check_all, mismatches, run_to_idle, superblock, write_all};

const MEMBER_BYTES: u64 = 8 << 20;

/// Members holding a new array of `level` with checksum areas.
fn create(level: Level, disks: usize) -> Vec<Arc<MemoryMember>> {
    create_sized(level, disks, MEMBER_BYTES)
}

fn create_sized(level: Level, disks: usize, member_bytes: u64) -> Vec<Arc<MemoryMember>> {
    let tail = reserve_bytes(member_bytes);
    let members = md_common::in_memory::create_leaving(level, None, disks, 0, false, member_bytes, tail);
    for m in &members {
        block_on(integrity::format(m.as_ref())).expect("format");
    }
    members
}

/// The array on `members`, each verified by its checksums.
fn start(members: &[Arc<MemoryMember>]) -> md::Started<dyn Member> {
    let wrapped: Vec<Arc<dyn Member>> = members
        .iter()
        .map(|m| {
            let opened = block_on(IntegrityMember::open(m.clone())).expect("open");
            Arc::new(opened.ok().expect("a checksum area")) as Arc<dyn Member>
        })
        .collect();
    let assembly = md_common::assemble(&wrapped);
    block_on(md::start(&assembly, &wrapped, StartOptions::default())).expect("start")
}

fn fill(array: &Array<dyn Member>, seed: u64) -> Vec<u8> {
    let data = Rng(seed).bytes(array.size_bytes() as usize);
    write_all(array, &data);
    data
}

/// Flips one byte of `member` at `data_bytes` into its data area, behind the array's back.
fn flip(member: &MemoryMember, data_bytes: u64) -> u64 {
    let at = superblock(member).data_offset * 512 + data_bytes;
    member.with_data(|d| d[at as usize] ^= 0x5a);
    at
}

fn integrity_reports(array: &Array<dyn Member>) -> Vec<Option<integrity::IntegrityReport>> {
    array.admin().role_status().iter().map(|r| r.integrity).collect()
}

fn reports(array: &Array<dyn Member>) -> Vec<(u64, u64, u64)> {
    let mut counts: Vec<(u64, u64, u64)> =
        array.maintenance().corruption().iter().map(|c| (c.reports, c.found_sectors, c.healed_sectors)).collect();
    counts.resize(array.geometry().raid_disks(), (0, 0, 0));
    counts
}

#[test]
fn wrong_bytes_are_served_right_and_healed_on_every_redundant_level() {
    for (level, disks) in [(Level::Raid1, 3), (Level::Raid5, 4), (Level::Raid6, 5), (Level::Raid10, 4)] {
        let members = create(level, disks);
        let s = start(&members);
        run_to_idle(&s.array);
        let model = fill(&s.array, 7);
        block_on(s.array.flush()).unwrap();
        let before: Vec<Vec<u8>> = members.iter().map(|m| m.snapshot()).collect();
        // Two blocks on member 1, one on member 2 (another stripe).
        let hits =
            [(1, flip(&members[1], 200 << 10)), (1, flip(&members[1], 1 << 20)), (2, flip(&members[2], 3 << 20))];
        check_all(&s.array, &model, &format!("{level}: reads with wrong bytes underneath"));
        // Mirrors read one copy: a check reads the others.
        s.array.maintenance().start_scrub(false).unwrap();
        run_to_idle(&s.array);
        let found = reports(&s.array);
        assert!(found[1].0 >= 2 && found[2].0 >= 1, "{level}: the members that lied are named: {found:?}");
        assert_eq!(found[0].0, 0, "{level}: member 0 did not lie: {found:?}");
        run_to_idle(&s.array);
        for (m, at) in hits {
            assert_eq!(members[m].snapshot()[at as usize], before[m][at as usize], "{level}: m{m} byte {at} healed");
        }
        let healed = reports(&s.array);
        assert!(healed[1].2 >= 16 && healed[2].2 >= 8, "{level}: healed sectors counted: {healed:?}");
        assert_eq!(mismatches(&s.array), 0, "{level}: a check after healing");
        let report = integrity_reports(&s.array);
        assert!(report.iter().all(|r| r.is_some_and(|r| r.verified_blocks > 0)), "{level}: {report:?}");
        check_all(&s.array, &model, &format!("{level}: after healing"));
    }
}

#[test]
fn a_check_finds_and_heals_what_reads_did_not_touch() {
    let members = create(Level::Raid5, 4);
    let s = start(&members);
    run_to_idle(&s.array);
    let model = fill(&s.array, 11);
    let before = members[3].snapshot();
    let at = flip(&members[3], 5 << 20);
    s.array.maintenance().start_scrub(false).unwrap();
    run_to_idle(&s.array);
    assert_eq!(members[3].snapshot()[at as usize], before[at as usize], "the check healed m3");
    assert_eq!(reports(&s.array)[3].0, 1, "{:?}", reports(&s.array));
    check_all(&s.array, &model, "after the check");
}

#[test]
fn without_redundancy_left_a_wrong_block_is_an_error_not_data() {
    // raid0: nothing to rebuild from.
    let members = create(Level::Raid0, 2);
    let s = start(&members);
    fill(&s.array, 3);
    flip(&members[1], 4096);
    let chunk_bytes = 64 << 10;
    let err = block_on(s.array.read(chunk_bytes, 8192)).expect_err("a wrong block on a raid0 member");
    let io = std::error::Error::source(&err).and_then(|e| e.downcast_ref::<std::io::Error>());
    assert!(io.and_then(integrity::corruption_of).is_some(), "the error names the corruption: {err:?}");
    // A degraded raid5: the other member of the stripe is gone.
    let members = create(Level::Raid5, 3);
    let s = start(&members);
    run_to_idle(&s.array);
    let model = fill(&s.array, 5);
    block_on(s.array.admin().fail_role(0)).unwrap();
    flip(&members[1], 8192);
    let size = s.array.size_bytes();
    let mut errors = 0;
    for at in (0..size).step_by(64 << 10) {
        match block_on(s.array.read(at, 64 << 10)) {
            Ok(data) => assert_eq!(data.to_vec(), model[at as usize..][..64 << 10], "bytes at {at}"),
            Err(_) => errors += 1,
        }
    }
    assert!(errors >= 1, "the stripe holding the wrong block fails");
}

#[test]
fn a_crash_leaves_no_false_corruption_and_a_clean_stop_keeps_the_checksums() {
    for level in [Level::Raid5, Level::Raid1] {
        let members = create(level, 3);
        let model = {
            let s = start(&members);
            run_to_idle(&s.array);
            block_on(s.array.shutdown()).unwrap();
            let s = start(&members);
            let model = fill(&s.array, 21);
            // No flush, no shutdown: the table pages written since are lost with the process.
            model
        };
        let s = start(&members);
        let untrusted: u64 = integrity_reports(&s.array).iter().map(|r| r.unwrap().untrusted_bytes).sum();
        assert!(untrusted > 0, "{level}: the crash left checksums untrusted");
        check_all(&s.array, &model, &format!("{level}: after the crash"));
        run_to_idle(&s.array);
        assert!(reports(&s.array).iter().all(|r| r.0 == 0), "{level}: no corruption reported: {:?}", reports(&s.array));
        assert_eq!(mismatches(&s.array), 0);
        block_on(s.array.shutdown()).unwrap();
        // After a clean stop every checksum is trusted: a flipped byte is caught.
        let s = start(&members);
        for r in integrity_reports(&s.array) {
            assert_eq!(r.unwrap().untrusted_bytes, 0, "{level}: trusted after a clean stop");
        }
        flip(&members[0], (2 << 20) + (64 << 10));
        check_all(&s.array, &model, &format!("{level}: after the clean stop"));
        s.array.maintenance().start_scrub(false).unwrap();
        run_to_idle(&s.array);
        assert!(reports(&s.array)[0].0 >= 1, "{level}: {:?}", reports(&s.array));
    }
}

#[test]
fn a_spare_rebuilt_into_the_array_gets_checksums_that_survive_a_restart() {
    let mut members = create(Level::Raid5, 3);
    let s = start(&members);
    run_to_idle(&s.array);
    let model = fill(&s.array, 31);
    block_on(s.array.admin().fail_role(2)).unwrap();
    let spare = Arc::new(MemoryMember::new("m3", MEMBER_BYTES));
    spare.with_data(|d| d.fill(0xee)); // an old disk: garbage everywhere
    let first_data_block = superblock(&members[0]).data_offset * 512 / integrity::BLOCK_BYTES;
    let fresh = IntegrityMember::fresh(spare.clone(), first_data_block).unwrap();
    block_on(s.array.admin().add_spare(Arc::new(fresh))).unwrap();
    run_to_idle(&s.array);
    check_all(&s.array, &model, "rebuilt onto the spare");
    block_on(s.array.shutdown()).unwrap();
    drop(s);
    members[2] = spare;
    let s = start(&members);
    assert!(integrity_reports(&s.array).iter().all(|r| r.is_some_and(|r| r.untrusted_bytes == 0)));
    flip(&members[2], 1 << 20);
    check_all(&s.array, &model, "a wrong byte on the rebuilt member");
    s.array.maintenance().start_scrub(false).unwrap();
    run_to_idle(&s.array);
    assert!(reports(&s.array)[2].0 >= 1, "the rebuilt member's checksums caught it: {:?}", reports(&s.array));
    assert_eq!(mismatches(&s.array), 0);
}

#[test]
fn the_member_conformance_suite_passes_over_checksums() {
    let members = create_sized(Level::Raid1, 2, 24 << 20);
    let checked = block_on(IntegrityMember::open(members[0].clone())).unwrap().ok().expect("a checksum area");
    block_on(raid_core::conformance::run_all(Arc::new(checked), raid_core::conformance::InFlight::Synchronous));
}

/// md wrote the array (here: a start without checksums, then the event counts moved as md's
/// would): every checksum is untrusted, nothing is reported wrong, and they stay untrusted
/// across a stop until a check has read every block; after that a flipped byte is caught.
#[test]
fn writes_by_md_leave_the_checksums_untrusted_until_a_check_stamps_them() {
    let members = create(Level::Raid5, 3);
    {
        let s = start(&members);
        run_to_idle(&s.array);
        block_on(s.array.shutdown()).unwrap();
    }
    let model = {
        let s = md_common::in_memory::start(&members); // no checksums: md's view
        let model = fill(&s.array, 41);
        block_on(s.array.shutdown()).unwrap();
        model
    };
    for m in &members {
        let mut sb = superblock(m);
        sb.events += 7;
        block_on(m.write_at(SUPERBLOCK_BYTE_OFFSET, AlignedBuf::from_slice(&sb.encode()), true)).0.unwrap();
    }
    let untrusted = |s: &md::Started<dyn Member>| -> u64 {
        integrity_reports(&s.array).iter().map(|r| r.unwrap().untrusted_bytes).sum()
    };
    {
        let s = start(&members);
        assert!(untrusted(&s) > 0, "md's writes are seen");
        block_on(s.array.shutdown()).unwrap(); // stopped before any check
    }
    let s = start(&members);
    assert!(untrusted(&s) > 0, "still untrusted: nothing was read");
    check_all(&s.array, &model, "read unverified");
    s.array.maintenance().start_scrub(false).unwrap();
    run_to_idle(&s.array);
    assert!(reports(&s.array).iter().all(|r| r.0 == 0), "md's writes are no corruption: {:?}", reports(&s.array));
    block_on(s.array.shutdown()).unwrap();
    drop(s);
    let s = start(&members);
    assert_eq!(untrusted(&s), 0, "trusted after the check and a stop");
    flip(&members[1], (1 << 20) + (64 << 10));
    check_all(&s.array, &model, "a wrong byte after");
    s.array.maintenance().start_scrub(false).unwrap();
    run_to_idle(&s.array);
    assert!(reports(&s.array)[1].0 >= 1, "{:?}", reports(&s.array));
}
