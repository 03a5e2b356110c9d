//! `md::start`: from md superblocks on members to a running array — data written through one
//! start is read back after the next; a dirty, degraded RAID5 comes up read-only unless
//! forced; a clean degraded one comes up writable; a dirty healthy one resyncs.

use std::sync::Arc;

use futures::executor::block_on;
use raid_core::engine::Step;
use raid_core::geometry::Level;
use raid_core::md::{self, CreateParams, MdUuid, SUPERBLOCK_BYTE_OFFSET, StartOptions};
use raid_core::{AlignedBuf, Member, MemoryMember};

mod md_common;

const MEMBER_BYTES: u64 = 8 << 20;

/// A fresh RAID5 of four memory members with md superblocks (64 KiB chunk).
fn create_raid5() -> Vec<Arc<MemoryMember>> {
    let sizes = vec![Some(MEMBER_BYTES); 4];
    let params = CreateParams {
        level: Level::Raid5,
        layout: None,
        chunk_sectors: Some(128),
        name: "start",
        homehost: None,
        uuid: Some(MdUuid([7; 16])),
        members_bytes: &sizes,
        ppl: false,
        journal_bytes: None,
    };
    let mut n = 0u8;
    let meta = md::create(&params, 1_700_000_000, &mut || {
        n += 1;
        MdUuid([n; 16])
    })
    .expect("create");
    (0..4)
        .map(|i| {
            let m = Arc::new(MemoryMember::new(format!("m{i}"), MEMBER_BYTES));
            let image = meta.superblock_for(i).encode();
            block_on(m.write_at(SUPERBLOCK_BYTE_OFFSET, AlignedBuf::from_slice(&image), true)).0.unwrap();
            m
        })
        .collect()
}

/// Assembles and starts the array over `members` (as `dyn Member`).
fn start(members: &[Arc<MemoryMember>], options: StartOptions) -> md::Started<dyn Member> {
    let members: Vec<Arc<dyn Member>> = members.iter().map(|m| m.clone() as Arc<dyn Member>).collect();
    block_on(md::start(&md_common::assemble(&members), &members, options)).expect("start")
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

#[test]
fn data_survives_a_stop_and_a_start() {
    let members = create_raid5();
    let started = start(&members, StartOptions::default());
    assert!(!started.forced_read_only);
    let data = pattern(1, 1 << 20);
    block_on(started.array.write(3 << 20, &data, false)).unwrap();
    block_on(started.array.shutdown()).unwrap();
    let again = start(&members, StartOptions::default());
    assert_eq!(block_on(again.array.read(3 << 20, 1 << 20)).unwrap().to_vec(), data);
    assert!(!again.array.is_read_only());
}

#[test]
fn dirty_and_degraded_parity_array_starts_read_only_unless_forced() {
    let members = create_raid5();
    let started = start(&members, StartOptions::default());
    block_on(started.array.write(0, &pattern(2, 65536), false)).unwrap();
    // A crash: no shutdown, so the superblocks stay dirty. Then a member is lost.
    drop(started);
    let three = &members[..3];
    let started = start(three, StartOptions::default());
    assert!(started.forced_read_only && started.array.is_read_only(), "write hole: read-only");
    assert!(block_on(started.array.write(0, &[0; 512], false)).is_err());
    drop(started);
    let forced = start(three, StartOptions { force: true, read_only: false });
    assert!(!forced.forced_read_only && !forced.array.is_read_only());
    assert_eq!(block_on(forced.array.read(0, 65536)).unwrap().to_vec(), pattern(2, 65536));
}

#[test]
fn clean_degraded_array_starts_writable_and_dirty_healthy_one_resyncs() {
    let members = create_raid5();
    let started = start(&members, StartOptions::default());
    block_on(started.array.write(1 << 20, &pattern(3, 4096), false)).unwrap();
    block_on(started.array.shutdown()).unwrap();
    drop(started);
    let degraded = start(&members[1..], StartOptions::default());
    assert!(!degraded.forced_read_only, "a clean degraded array has trustworthy parity");
    assert_eq!(block_on(degraded.array.read(1 << 20, 4096)).unwrap().to_vec(), pattern(3, 4096));
    drop(degraded);

    // Dirty but whole: starts writable and resyncs in the background.
    let members = create_raid5();
    let started = start(&members, StartOptions::default());
    block_on(started.array.write(0, &pattern(4, 4096), false)).unwrap();
    drop(started);
    let dirty = start(&members, StartOptions::default());
    assert!(!dirty.forced_read_only);
    assert!(dirty.array.maintenance().status().resync_pending, "an unclean stop resyncs");
    while block_on(dirty.array.maintenance().step(1 << 20)).unwrap() != Step::Idle {}
    assert!(!dirty.array.maintenance().status().resync_pending);
}
