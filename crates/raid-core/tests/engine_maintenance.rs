//! Background maintenance against the flat-buffer model: a member fails, a spare is added
//! and rebuilt while writes continue; a member is replaced online; an unclean array is
//! resynced. Afterwards every byte reads back, scrub finds no mismatch, and the member
//! set alone (a fresh array) holds the data.

mod support;

use std::sync::Arc;

use futures::executor::block_on;
use proptest::prelude::*;
use raid_core::engine::{SlotState, Step};
use raid_core::geometry::{Level, Raid10Layout};
use support::*;

fn redundant_configs() -> impl Strategy<Value = Config> {
    let chunk = prop_oneof![Just(8u32), Just(16), Just(128)];
    prop_oneof![
        (2usize..=4).prop_map(|n| (Level::Raid1, 0, n)),
        (3usize..=6, 0u32..=5).prop_map(|(n, l)| (Level::Raid5, l, n)),
        (4usize..=7, prop_oneof![(0u32..=5).boxed(), (16u32..=20).boxed()]).prop_map(|(n, l)| (Level::Raid6, l, n)),
        (2usize..=3).prop_map(|n| (Level::Raid4, 0, n + 1)),
        (4usize..=6, prop_oneof![Just("n2"), Just("f2"), Just("o2")]).prop_map(|(n, l)| (
            Level::Raid10,
            Raid10Layout::parse(l).unwrap().to_md(),
            n
        )),
    ]
    .prop_flat_map(move |(level, layout, members)| (Just(level), Just(layout), Just(members), chunk.clone(), 3u64..=6))
    .prop_map(|(level, layout, members, chunk_sectors, stripes)| Config {
        level,
        layout,
        members,
        chunk_sectors,
        stripes,
        unequal_seed: 0,
    })
}

/// Runs maintenance to completion, applying one client op between steps.
fn drive(rig: &mut Rig, ops: &[Op], step_bytes: u64) {
    let mut ops = ops.iter();
    for _ in 0..100_000 {
        let step = block_on(rig.array.maintenance().step(step_bytes)).expect("maintenance step");
        if let Some(op) = ops.next() {
            rig.apply(op);
        }
        if step == Step::Idle {
            for op in ops.by_ref() {
                rig.apply(op);
            }
            return;
        }
    }
    panic!("maintenance did not finish");
}

/// Runs maintenance to completion with one client write in flight during every step,
/// started after a seed-chosen number of yields; the members yield once per I/O, so the
/// write lands anywhere in the step, e.g. on a stripe rebuilt before the recovery offset
/// moves past it.
fn drive_racing(rig: &mut Rig, pool: &[Arc<TestMember>], ops: &[Op], step_bytes: u64) {
    for m in pool {
        m.yield_once.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    let mut writes = ops.iter().filter_map(|op| match *op {
        Op::Write { offset, len, seed } => Some((offset, pattern(seed, len as usize), seed % 64)),
        _ => None,
    });
    for _ in 0..100_000 {
        let write = writes.next();
        let array = &rig.array;
        let (step, written) = block_on(futures::future::join(array.maintenance().step(step_bytes), async {
            match &write {
                Some((offset, data, delay)) => {
                    yield_times(*delay).await;
                    array.write(*offset, data, false).await
                }
                None => Ok(()),
            }
        }));
        written.expect("write during maintenance");
        if let Some((offset, data, _)) = write {
            rig.model[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
        }
        if step.expect("maintenance step") == Step::Idle {
            return;
        }
    }
    panic!("maintenance did not finish");
}

/// Points the rig's role list at whatever device now serves each role.
fn adopt_roles(rig: &mut Rig, pool: &[Arc<TestMember>]) {
    for status in rig.array.admin().role_status() {
        let name = status.name.expect("every role has a device");
        rig.members[status.role] =
            pool.iter().find(|m| raid_core::Member::name(m.as_ref()) == name).expect("known member").clone();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn failed_members_are_rebuilt_onto_spares_while_writes_continue(
        config in redundant_configs(), before in ops_strategy(20), during in ops_strategy(30), victims in any::<u64>(),
        step_kib in prop_oneof![Just(4u64), Just(64), Just(4096)]
    ) {
        let mut rig = Rig::new(&config);
        let before = rig.resolve(&before);
        rig.run(&before, None);
        let failed = rig.pick_victims(victims);
        prop_assume!(!failed.is_empty());
        for &role in &failed {
            block_on(rig.array.admin().fail_role(role)).unwrap();
        }
        let mut pool = rig.members.clone();
        for i in 0..failed.len() {
            let len = raid_core::Member::len_bytes(rig.members[0].as_ref());
            let spare = Arc::new(TestMember::new(format!("spare{i}"), len));
            block_on(rig.array.admin().add_spare(spare.clone())).expect("add spare");
            pool.push(spare);
        }
        let during = rig.resolve(&during);
        drive(&mut rig, &during, step_kib << 10);
        prop_assert!(rig.array.admin().role_status().iter().all(|s| s.state == SlotState::InSync), "{:?}", rig.array.admin().role_status());
        adopt_roles(&mut rig, &pool);
        rig.assert_consistent();
        prop_assert_eq!(rig.scrub(false), 0);
        rig.assert_rebuild_restores(&[]);
    }

    #[test]
    fn rebuild_racing_writes_leaves_redundancy_right(
        config in redundant_configs(), during in ops_strategy(40), victims in any::<u64>(),
        step_kib in prop_oneof![Just(64u64), Just(4096)]
    ) {
        let mut rig = Rig::new(&config);
        let failed = rig.pick_victims(victims);
        prop_assume!(!failed.is_empty());
        let mut pool = rig.members.clone();
        for (i, &role) in failed.iter().enumerate() {
            block_on(rig.array.admin().fail_role(role)).unwrap();
            let len = raid_core::Member::len_bytes(rig.members[0].as_ref());
            let spare = Arc::new(TestMember::new(format!("spare{i}"), len));
            block_on(rig.array.admin().add_spare(spare.clone())).expect("add spare");
            pool.push(spare);
        }
        let during = rig.resolve(&during);
        drive_racing(&mut rig, &pool, &during, step_kib << 10);
        prop_assert!(rig.array.admin().role_status().iter().all(|s| s.state == SlotState::InSync), "{:?}", rig.array.admin().role_status());
        adopt_roles(&mut rig, &pool);
        rig.assert_consistent();
        prop_assert_eq!(rig.scrub(false), 0);
        rig.check_whole_array();
    }

    #[test]
    fn members_are_replaced_online(
        config in redundant_configs(), during in ops_strategy(30), role in any::<usize>(),
        step_kib in prop_oneof![Just(4u64), Just(64)]
    ) {
        let mut rig = Rig::new(&config);
        let role = role % config.members;
        let len = raid_core::Member::len_bytes(rig.members[0].as_ref());
        let new = Arc::new(TestMember::new("new".into(), len));
        let mut pool = rig.members.clone();
        pool.push(new.clone());
        block_on(rig.array.admin().replace(role, new.clone())).expect("replace");
        let during = rig.resolve(&during);
        drive(&mut rig, &during, step_kib << 10);
        let status = rig.array.admin().role_status();
        prop_assert_eq!(status[role].name.as_deref(), Some("new"));
        prop_assert!(status.iter().all(|s| s.state == SlotState::InSync && s.replacement.is_none()));
        adopt_roles(&mut rig, &pool);
        rig.assert_consistent();
        prop_assert_eq!(rig.scrub(false), 0);
    }
}

#[test]
fn unclean_array_is_resynced() {
    for level in [Level::Raid1, Level::Raid5, Level::Raid6, Level::Raid10] {
        let members = if level == Level::Raid6 { 5 } else { 4 };
        let config =
            Config { level, layout: level.default_layout(), members, chunk_sectors: 16, stripes: 5, unequal_seed: 0 };
        let rig = Rig::new(&config);
        // A crash left redundancy stale in places: flip bytes on one member.
        for offset in [DATA_OFFSET_BYTES + 100, DATA_OFFSET_BYTES + 9000, DATA_OFFSET_BYTES + 20_000] {
            rig.members[members - 1].corrupt(offset);
        }
        assert!(rig.scrub(false) > 0, "{level}: corruption visible");
        let dirty = Rig::reopen(&rig, true);
        assert!(dirty.array.maintenance().status().resync_pending);
        let mut steps = 0;
        while block_on(dirty.array.maintenance().step(64 << 10)).unwrap() != Step::Idle {
            steps += 1;
            assert!(steps < 10_000);
        }
        assert!(!dirty.array.maintenance().status().resync_pending);
        assert_eq!(dirty.scrub(false), 0, "{level}: resync leaves no mismatch");
    }
}

#[test]
fn scrub_job_runs_in_the_background() {
    let config = Config { level: Level::Raid5, layout: 2, members: 4, chunk_sectors: 16, stripes: 8, unequal_seed: 0 };
    let rig = Rig::new(&config);
    rig.members[1].corrupt(DATA_OFFSET_BYTES + 4096);
    rig.array.maintenance().start_scrub(false).unwrap();
    assert!(rig.array.maintenance().start_scrub(false).is_err(), "one scrub at a time");
    while block_on(rig.array.maintenance().step(8 << 10)).unwrap() != Step::Idle {}
    let status = rig.array.maintenance().status();
    let (_, counts) = status.last_scrub.expect("scrub finished");
    assert_eq!(counts.mismatch_sectors, 8);
    rig.array.maintenance().start_scrub(true).unwrap();
    while block_on(rig.array.maintenance().step(8 << 10)).unwrap() != Step::Idle {}
    assert_eq!(rig.scrub(false), 0);
}

#[test]
fn write_intent_bits_follow_writes_and_drive_resync() {
    for level in [Level::Raid1, Level::Raid5, Level::Raid6, Level::Raid10] {
        let members = if level == Level::Raid6 { 5 } else { 4 };
        // 16 sectors per chunk, 8 stripes: resync space 128 sectors; bitmap chunk 32 sectors.
        let config =
            Config { level, layout: level.default_layout(), members, chunk_sectors: 16, stripes: 8, unequal_seed: 0 };
        let mut rig = Rig::new(&config);
        let resync_sectors = rig.geometry.resync_sectors();
        let bits = resync_sectors.div_ceil(32);
        rig.array = rig.builder().write_intent(32, bits, &[]).build().unwrap();
        assert_eq!(rig.array.maintenance().dirty_bitmap_chunks(), Some(0));
        rig.apply(&Op::Write { offset: 0, len: 4096, seed: 1 });
        let dirty = rig.array.maintenance().dirty_bitmap_chunks().unwrap();
        assert!(dirty >= 1, "{level}: a write sets its bit");
        // First sweep: the chunk was touched since the last sweep, so it stays.
        assert_eq!(block_on(rig.array.maintenance().intent_sweep()).unwrap(), 0);
        assert_eq!(
            block_on(rig.array.maintenance().intent_sweep()).unwrap(),
            dirty,
            "{level}: an idle chunk is cleared"
        );
        assert_eq!(rig.array.maintenance().dirty_bitmap_chunks(), Some(0));

        // Degraded: bits stay (a returning member would need them).
        let victim = rig.pick_victims(3)[0];
        block_on(rig.array.admin().fail_role(victim)).unwrap();
        rig.apply(&Op::Write { offset: 8192, len: 4096, seed: 2 });
        block_on(rig.array.maintenance().intent_sweep()).unwrap();
        assert_eq!(block_on(rig.array.maintenance().intent_sweep()).unwrap(), 0, "{level}: no clearing while degraded");
    }
}

#[test]
fn resync_after_crash_covers_exactly_the_dirty_chunks() {
    let config = Config { level: Level::Raid5, layout: 2, members: 4, chunk_sectors: 16, stripes: 8, unequal_seed: 0 };
    let rig = Rig::new(&config);
    // Stale parity in stripe 1 (bitmap chunk 0: stripes 0-1) and in stripe 6 (chunk 3).
    let parity_role = |stripe: u64| rig.geometry.parity().unwrap().stripe(stripe).p_role;
    rig.members[parity_role(1)].corrupt(DATA_OFFSET_BYTES + 16 * 512 + 10);
    rig.members[parity_role(6)].corrupt(DATA_OFFSET_BYTES + 6 * 16 * 512 + 10);
    let dirty = Rig::reopen(&rig, true);
    // The bitmap says only chunk 0 was being written at the crash.
    let array = rig.builder().dirty(true).write_intent(32, 4, &[0]).build().unwrap();
    let mut dirty = dirty;
    dirty.array = array;
    while block_on(dirty.array.maintenance().step(1 << 20)).unwrap() != Step::Idle {}
    // Stripe 1 was resynced; stripe 6 was not (the bitmap vouched for it).
    assert_eq!(dirty.scrub(false), 8, "only the corruption outside dirty chunks remains");
}

/// Fails a member, writes the first bitmap chunk while it is away, optionally damages a
/// clean chunk on it, re-adds it and runs recovery to the end.
fn re_add_rig(level: Level, damage_clean_chunk: bool) -> Rig {
    let members = if level == Level::Raid6 { 5 } else { 4 };
    let config =
        Config { level, layout: level.default_layout(), members, chunk_sectors: 16, stripes: 8, unequal_seed: 0 };
    let mut rig = Rig::new(&config);
    let bits = rig.geometry.resync_sectors().div_ceil(32);
    rig.array = rig.builder().write_intent(32, bits, &[]).build().unwrap();
    rig.apply(&Op::Write { offset: 0, len: rig.size(), seed: 10 });
    while block_on(rig.array.maintenance().intent_sweep()).unwrap() > 0
        || rig.array.maintenance().dirty_bitmap_chunks() != Some(0)
    {}
    let role = rig.pick_victims(5)[0];
    block_on(rig.array.admin().fail_role(role)).unwrap();
    rig.apply(&Op::Write { offset: 0, len: 4096, seed: 11 });
    assert!(rig.array.maintenance().dirty_bitmap_chunks().unwrap() >= 1);
    let member = rig.members[role].clone();
    if damage_clean_chunk {
        member.corrupt(DATA_OFFSET_BYTES + rig.member_sectors[role] * SECTOR - 4096);
    }
    block_on(rig.array.admin().re_add(role, member)).expect("re-add");
    while block_on(rig.array.maintenance().step(1 << 20)).unwrap() != Step::Idle {}
    assert!(rig.array.admin().role_status().iter().all(|s| s.state == SlotState::InSync), "{level}");
    rig
}

#[test]
fn returning_member_is_brought_up_to_date_from_the_bitmap() {
    for level in [Level::Raid1, Level::Raid5, Level::Raid6, Level::Raid10] {
        let rig = re_add_rig(level, false);
        rig.assert_consistent();
        assert_eq!(rig.scrub(false), 0, "{level}");
    }
}

#[test]
fn bitmap_re_add_copies_only_dirty_chunks() {
    for level in [Level::Raid1, Level::Raid5, Level::Raid6, Level::Raid10] {
        // Damage in a chunk the bitmap calls clean survives the re-add: proof it was not copied.
        let rig = re_add_rig(level, true);
        assert!(rig.scrub(false) > 0, "{level}: a clean chunk was copied");
        // And the tally says so: at most the dirty chunks' worth was copied.
        let tally = rig.array.maintenance().status().last_recovery.expect("a finished recovery");
        assert!(tally.from_bitmap && tally.dirty_chunks >= 1, "{level}: {tally:?}");
        assert!(tally.copied_bytes > 0 && tally.copied_bytes <= tally.dirty_chunks * 32 * 512, "{level}: {tally:?}");
    }
}
