//! Mirror reads: a write-mostly copy is read only when it must be; a much slower copy is
//! left out by its measured latency (but for rare probes); the bytes are right either way.

mod support;

use std::sync::atomic::Ordering;

use futures::executor::block_on;
use raid_core::geometry::Level;
use support::*;

fn raid1() -> Rig {
    let config =
        Config { level: Level::Raid1, layout: 0, members: 2, chunk_sectors: 128, stripes: 64, unequal_seed: 0 };
    let mut rig = Rig::new(&config);
    rig.apply(&Op::Write { offset: 0, len: rig.size(), seed: 7 });
    rig
}

/// `count` reads of 64 KiB spread over the array, each checked against the model.
fn read_spread(rig: &Rig, count: u64) {
    let size = rig.size();
    for i in 0..count {
        let offset = (i * 1_048_573 * 512) % (size - 65536) / 512 * 512;
        let data = block_on(rig.array.read(offset, 65536)).expect("read").to_vec();
        assert!(data == rig.model[offset as usize..offset as usize + 65536], "read at {offset}");
    }
}

fn reset_counts(rig: &Rig) {
    for m in &rig.members {
        m.reads.store(0, Ordering::Relaxed);
    }
}

#[test]
fn write_mostly_copies_are_read_only_when_no_other_can_be() {
    let rig = raid1();
    rig.array.admin().set_write_mostly(1, true);
    reset_counts(&rig);
    read_spread(&rig, 200);
    assert_eq!(rig.members[1].reads.load(Ordering::Relaxed), 0, "the write-mostly copy was read");
    assert!(rig.members[0].reads.load(Ordering::Relaxed) > 0);
    // Written like any other copy.
    rig.assert_consistent();
    // The other copy gone: the write-mostly one serves.
    block_on(rig.array.admin().fail_role(0)).unwrap();
    reset_counts(&rig);
    read_spread(&rig, 20);
    assert!(rig.members[1].reads.load(Ordering::Relaxed) > 0);
}

#[test]
fn a_much_slower_copy_is_left_out_by_its_measured_latency() {
    let rig = raid1();
    rig.members[1].read_delay_us.store(3000, Ordering::Relaxed);
    reset_counts(&rig);
    read_spread(&rig, 600);
    let slow = rig.members[1].reads.load(Ordering::Relaxed);
    let fast = rig.members[0].reads.load(Ordering::Relaxed);
    // Without latency balancing the regions alternate: about half each.
    assert!(slow <= 600 / 128 + 4, "the slow copy got {slow} of {} reads", slow + fast);
    assert!(slow >= 2, "the slow copy is probed now and then ({slow})");
    let (l0, l1) = (rig.array.admin().read_latency(0).unwrap(), rig.array.admin().read_latency(1).unwrap());
    assert!(l1 > l0 * 4, "{l0:?} vs {l1:?}");
    // When it is fast again, the probes see it and it shares the reads again.
    rig.members[1].read_delay_us.store(0, Ordering::Relaxed);
    reset_counts(&rig);
    read_spread(&rig, 2000);
    let slow = rig.members[1].reads.load(Ordering::Relaxed);
    assert!(slow > 300, "the recovered copy got only {slow} of 2000 reads");
}

#[test]
fn copies_of_similar_speed_share_reads() {
    let rig = raid1();
    reset_counts(&rig);
    read_spread(&rig, 400);
    let (a, b) = (rig.members[0].reads.load(Ordering::Relaxed), rig.members[1].reads.load(Ordering::Relaxed));
    assert!(a > 100 && b > 100, "{a} / {b}");
}
