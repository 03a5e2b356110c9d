//! Full-stripe gathering: sequential partial-stripe writes in flight together reach the
//! members as whole stripes (no read-modify-write reads), every byte lands, parity holds;
//! random writes never wait; a leader that goes away lets its joiners write themselves.

mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::executor::block_on;
use futures::future::join_all;
use raid_core::engine::Timer;
use raid_core::geometry::Level;
use support::*;

/// A timer on "virtual time": the sleep ends after being polled `polls` times, so the
/// writes polled alongside it (one executor, join_all) arrive during the window.
struct PollTimer {
    polls: u32,
}

struct PollSleep(u32);

impl Future for PollSleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 == 0 {
            return Poll::Ready(());
        }
        self.0 -= 1;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl Timer for PollTimer {
    fn sleep(&self, _: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(PollSleep(self.polls))
    }
}

fn raid(level: Level) -> Rig {
    let members = if level == Level::Raid6 { 5 } else { 4 };
    // 8 KiB chunks: a stripe holds 24 KiB of data (raid5 of 4) or 24 KiB (raid6 of 5).
    let config =
        Config { level, layout: level.default_layout(), members, chunk_sectors: 16, stripes: 32, unequal_seed: 0 };
    let rig = Rig::new(&config);
    rig.array.enable_write_gathering(Duration::from_millis(1), Arc::new(PollTimer { polls: 64 }));
    rig
}

fn reads(rig: &Rig) -> u64 {
    rig.members.iter().map(|m| m.reads.load(Ordering::Relaxed)).sum()
}

/// Writes `count` consecutive writes of `len` bytes from `start`, all in flight together,
/// and updates the model.
fn sequential(rig: &mut Rig, start: u64, len: usize, count: usize, seed: u8, fua_every: usize) {
    let datas: Vec<Vec<u8>> =
        (0..count).map(|i| (0..len).map(|b| (b as u8).wrapping_mul(31) ^ seed ^ i as u8).collect()).collect();
    let array = &rig.array;
    let results = block_on(join_all(datas.iter().enumerate().map(|(i, d)| {
        let fua = fua_every > 0 && i % fua_every == 0;
        array.write(start + (i * len) as u64, d, fua)
    })));
    for r in results {
        r.expect("write");
    }
    for (i, d) in datas.iter().enumerate() {
        let at = start as usize + i * len;
        rig.model[at..at + len].copy_from_slice(d);
    }
}

#[test]
fn sequential_partial_stripe_writes_become_full_stripe_writes() {
    for level in [Level::Raid5, Level::Raid6, Level::Raid4] {
        let mut rig = raid(level);
        // A write ending at 8 KiB first: the stream's later writes start where one ended.
        sequential(&mut rig, 0, 8192, 1, 1, 0);
        let before = reads(&rig);
        // 8 KiB writes from 8 KiB on: each ends inside a stripe; together they cover 23
        // stripes. Gathered, they need no reads but those of the first, partial stripe.
        sequential(&mut rig, 8192, 8192, 3 * 23 - 1, 2, 5);
        let rmw_reads = reads(&rig) - before;
        // Per stripe one write leads and two join it.
        assert!(rig.array.gathered_writes() >= 44, "{level}: only {} joined", rig.array.gathered_writes());
        assert!(rmw_reads <= 8, "{level}: {rmw_reads} member reads: stripes were read-modify-written");
        rig.assert_consistent();
    }
}

/// Requests are dispatched in parallel: the next one on the wire may arrive first. Writes
/// arriving in reverse order gather too (groups grow at the front).
#[test]
fn writes_arriving_out_of_order_gather_too() {
    let mut rig = raid(Level::Raid5);
    sequential(&mut rig, 0, 8192, 1, 1, 0);
    // Stripes 4.. (96 KiB on): written last to first, 8 KiB at a time, all in flight.
    let start = 4 * 24576u64;
    let count = 3 * 12;
    let datas: Vec<Vec<u8>> = (0..count).map(|i| vec![0x40 + i as u8; 8192]).collect();
    let before = reads(&rig);
    rig.apply(&Op::Write { offset: start + count as u64 * 8192, len: 8192, seed: 9 });
    let array = &rig.array;
    let results = block_on(join_all((0..count).rev().map(|i| array.write(start + i as u64 * 8192, &datas[i], false))));
    for r in results {
        r.unwrap();
    }
    for (i, d) in datas.iter().enumerate() {
        let at = start as usize + i * 8192;
        rig.model[at..at + 8192].copy_from_slice(d);
    }
    assert!(rig.array.gathered_writes() >= 20, "{} joined", rig.array.gathered_writes());
    assert!(reads(&rig) - before <= 8, "{} reads", reads(&rig) - before);
    rig.assert_consistent();
}

/// Every other write first, then the ones between: separate groups form, and each gap
/// that fills merges its two neighbours into one group.
#[test]
fn groups_merge_when_the_write_between_them_arrives() {
    let mut rig = raid(Level::Raid5);
    sequential(&mut rig, 0, 8192, 1, 1, 0);
    let start = 3 * 24576u64;
    let count = 3 * 20;
    let datas: Vec<Vec<u8>> = (0..count).map(|i| vec![0x80 ^ i as u8; 8192]).collect();
    let order: Vec<usize> = (0..count).step_by(2).chain((1..count).step_by(2)).collect();
    rig.apply(&Op::Write { offset: start - 8192, len: 8192, seed: 5 });
    let before = reads(&rig);
    let array = &rig.array;
    for r in block_on(join_all(order.iter().map(|&i| array.write(start + i as u64 * 8192, &datas[i], i % 7 == 0)))) {
        r.unwrap();
    }
    for (i, d) in datas.iter().enumerate() {
        let at = start as usize + i * 8192;
        rig.model[at..at + 8192].copy_from_slice(d);
    }
    assert!(reads(&rig) - before <= 8, "{} member reads: groups did not merge", reads(&rig) - before);
    rig.assert_consistent();
}

#[test]
fn without_gathering_the_same_writes_read_modify_write() {
    let config = Config {
        level: Level::Raid5,
        layout: Level::Raid5.default_layout(),
        members: 4,
        chunk_sectors: 16,
        stripes: 32,
        unequal_seed: 0,
    };
    let mut rig = Rig::new(&config);
    sequential(&mut rig, 0, 8192, 1, 1, 0);
    let before = reads(&rig);
    sequential(&mut rig, 8192, 8192, 3 * 23 - 1, 2, 0);
    assert!(reads(&rig) - before > 40, "the check above can fail");
    rig.assert_consistent();
}

#[test]
fn random_writes_never_wait_or_join() {
    let mut rig = raid(Level::Raid5);
    let len = 4096;
    let offsets: Vec<u64> = (0..40u64).map(|i| (i * 7919 * 4096) % (rig.size() - 4096) / 4096 * 4096).collect();
    let datas: Vec<Vec<u8>> = (0..40).map(|i| vec![i as u8 + 1; len]).collect();
    let array = &rig.array;
    let mut sorted = offsets.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), offsets.len(), "distinct offsets");
    for r in block_on(join_all(offsets.iter().zip(&datas).map(|(&o, d)| array.write(o, d, false)))) {
        r.unwrap();
    }
    for (&o, d) in offsets.iter().zip(&datas) {
        rig.model[o as usize..o as usize + len].copy_from_slice(d);
    }
    assert_eq!(rig.array.gathered_writes(), 0);
    rig.assert_consistent();
}

#[test]
fn joiners_of_a_leader_that_goes_away_write_themselves() {
    let mut rig = raid(Level::Raid5);
    sequential(&mut rig, 0, 8192, 1, 1, 0);
    let lead = vec![0xaa; 4096];
    let join = vec![0xbb; 4096];
    {
        let array = &rig.array;
        let mut leader = Box::pin(array.write(8192, &lead, false));
        // Polled once: it leads a group and waits.
        let waker = futures::task::noop_waker();
        assert!(leader.as_mut().poll(&mut Context::from_waker(&waker)).is_pending());
        let mut joiner = Box::pin(array.write(12288, &join, false));
        assert!(joiner.as_mut().poll(&mut Context::from_waker(&waker)).is_pending(), "it joined");
        assert_eq!(array.gathered_writes(), 1);
        drop(leader);
        block_on(joiner).expect("the joiner writes its own data");
    }
    rig.model[12288..16384].copy_from_slice(&join);
    rig.assert_consistent();
}
