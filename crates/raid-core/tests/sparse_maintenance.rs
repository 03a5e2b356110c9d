//! Maintenance is as sparse as the members: a rebuild onto a spare copies what its sources
//! hold and leaves the rest a hole (punching what the spare held there), a check reads
//! nothing that is a hole on every member, and what is left is byte for byte what md's full
//! copy writes (holes read as zeros), so a check afterwards finds nothing.

use std::sync::Arc;

use futures::executor::block_on;
use raid_core::allocation::total_bytes;
use raid_core::engine::SlotState;
use raid_core::geometry::{Level, Raid10Layout};
use raid_core::md::SUPERBLOCK_BYTE_OFFSET;
use raid_core::{Member, MemoryMember, SECTOR_BYTES};

mod md_common;

use md_common::in_memory::{Rng, check_all, create, read_all, run_to_idle, start, superblock};

const MEMBER_BYTES: u64 = 64 << 20;

fn rebuild_onto_a_dirty_spare(level: Level, layout: Option<u32>, disks: usize) {
    let what = format!("{level:?} x{disks} {layout:?}");
    let members = create(level, layout, disks, 1, false, MEMBER_BYTES);
    let spare = members[disks].clone();
    // The spare held something before: what the rebuild leaves a hole must be punched.
    spare.with_data(|d| d.fill(0xee));
    let s = start(&members[..disks]);
    run_to_idle(&s.array);
    let mut rng = Rng(disks as u64);
    let written: u64 = [(3u64 << 20, 1u64 << 20), (17 << 20, 256 << 10)]
        .iter()
        .map(|&(at, len)| {
            block_on(s.array.write(at, &rng.bytes(len as usize), false)).unwrap();
            len
        })
        .sum();
    let model = read_all(&s.array);
    let role = 1;
    let before = members[role].snapshot();
    block_on(s.array.admin().fail_role(role)).unwrap();
    block_on(s.array.admin().add_spare(spare.clone() as Arc<dyn Member>)).unwrap();
    run_to_idle(&s.array);
    assert!(s.array.admin().role_status().iter().all(|r| r.state == SlotState::InSync), "{what}: rebuilt");
    let tally = s.array.maintenance().status().last_recovery.expect("a recovery");
    let member_data = s.array.geometry().member_sectors(role) * SECTOR_BYTES;
    assert_eq!(tally.copied_bytes + tally.hole_bytes, member_data, "{what}: every sector counted once: {tally:?}");
    // Copied: about what was written (rounded to chunks and, with parity, stripes), not the member.
    assert!(tally.copied_bytes > 0 && tally.copied_bytes <= 4 * written, "{what}: {tally:?} for {written} written");
    check_all(&s.array, &model, &what);
    assert_eq!(md_common::in_memory::mismatches(&s.array), 0, "{what}: check clean");
    // The rebuilt data area is what the failed member held (the same bytes md's full copy
    // writes), and mostly holes.
    let offset = (superblock(&spare).data_offset * SECTOR_BYTES) as usize;
    let rebuilt = spare.snapshot();
    let end = offset + member_data as usize;
    assert!(rebuilt[offset..end] == before[offset..end], "{what}: the rebuilt member differs from the failed one");
    let holes = block_on(spare.allocation(offset as u64, member_data)).unwrap();
    let hole_bytes: u64 = holes.iter().filter(|e| e.hole).map(|e| e.len_bytes).sum();
    assert_eq!(total_bytes(&holes), member_data);
    assert!(hole_bytes >= member_data - 4 * written, "{what}: the spare stays sparse ({hole_bytes} of {member_data})");
    assert!(SUPERBLOCK_BYTE_OFFSET < offset as u64);
}

#[test]
fn a_rebuild_copies_only_what_its_sources_hold() {
    rebuild_onto_a_dirty_spare(Level::Raid1, None, 2);
    rebuild_onto_a_dirty_spare(Level::Raid5, None, 4);
    rebuild_onto_a_dirty_spare(Level::Raid6, None, 5);
    rebuild_onto_a_dirty_spare(Level::Raid10, Some(Raid10Layout::parse("n2").unwrap().to_md()), 4);
    rebuild_onto_a_dirty_spare(Level::Raid10, Some(Raid10Layout::parse("f2").unwrap().to_md()), 4);
}

#[test]
fn a_check_reads_nothing_that_is_a_hole_everywhere_and_still_finds_damage() {
    for (level, disks) in [(Level::Raid5, 4), (Level::Raid1, 2)] {
        let members: Vec<Arc<MemoryMember>> = create(level, None, disks, 0, false, MEMBER_BYTES);
        let s = start(&members);
        run_to_idle(&s.array);
        block_on(s.array.write(5 << 20, &[0x42; 1 << 20], false)).unwrap();
        // A flipped byte far from that write, on one member only: no longer a hole there.
        let offset = superblock(&members[0]).data_offset * SECTOR_BYTES;
        members[0].with_data(|d| d[(offset + (40 << 20)) as usize] ^= 1);
        let units = s.array.maintenance().scrub_units();
        let counts = block_on(s.array.maintenance().scrub(0, units, false)).unwrap();
        assert!(counts.mismatch_sectors > 0, "{level:?}: the damage is found");
        let size = s.array.size_bytes();
        assert_eq!(counts.scrubbed_bytes, size, "{level:?}");
        assert!(counts.hole_bytes >= size - (4 << 20), "{level:?}: holes not read: {counts:?}");
        assert!(counts.hole_bytes < size, "{level:?}");
    }
}
