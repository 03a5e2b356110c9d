//! The write-back cache against a flat-buffer model and against the members themselves:
//! reads always see acknowledged writes, FLUSH (and FUA) make data readable from the
//! members alone, memory never exceeds the capacity, sequential small writes reach RAID5 as
//! full stripes (no member reads), a newer write is never overwritten by an older cached
//! copy, and write-back failures are reported by every later FLUSH.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use futures::executor::block_on;
use futures::future::join_all;
use proptest::prelude::*;
use raid_core::engine::{Array, ArrayBuilder, RoleMember};
use raid_core::geometry::{Geometry, Level};
use raid_core::member::Member;
use raid_core::write_cache::{CHUNK_OVERHEAD_BYTES, WriteCache};

mod support;
use support::{DATA_OFFSET_BYTES, SECTOR, TestMember, pattern};

/// Runs `fut`, calling `check` before every poll (invariants that must hold at every
/// interleaving point, not just between operations).
struct Checked<'a, F> {
    fut: Pin<Box<F>>,
    check: &'a (dyn Fn() + Sync),
}

impl<F: Future> Future for Checked<'_, F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        (self.check)();
        let out = self.fut.as_mut().poll(cx);
        (self.check)();
        out
    }
}

fn checked<'a, F: Future>(fut: F, check: &'a (dyn Fn() + Sync)) -> Checked<'a, F> {
    Checked { fut: Box::pin(fut), check }
}

/// An array over test members, a cache over it, and a model of what reads must return.
struct Rig {
    geometry: Geometry,
    members: Vec<Arc<TestMember>>,
    cache: WriteCache<TestMember>,
    model: Vec<u8>,
    /// Per byte: false once trimmed (content unspecified until rewritten).
    known: Vec<bool>,
}

impl Rig {
    fn new(level: Level, members: usize, chunk_sectors: u32, stripes: u64, capacity_bytes: u64) -> Rig {
        let member_sectors = vec![u64::from(chunk_sectors) * stripes; members];
        let layout = level.default_layout();
        let geometry = Geometry::new(level, layout, chunk_sectors, &member_sectors).expect("geometry");
        let members: Vec<Arc<TestMember>> = member_sectors
            .iter()
            .enumerate()
            .map(|(role, s)| Arc::new(TestMember::yielding(format!("m{role}"), DATA_OFFSET_BYTES + s * SECTOR)))
            .collect();
        let array = Arc::new(array_over(&geometry, &members));
        let size = array.size_bytes() as usize;
        Rig {
            geometry,
            members,
            cache: WriteCache::new(array, capacity_bytes),
            model: vec![0; size],
            known: vec![true; size],
        }
    }

    fn size(&self) -> u64 {
        self.model.len() as u64
    }

    /// A new array over the same members, without the cache: what survives a crash.
    fn members_alone(&self) -> Array<TestMember> {
        array_over(&self.geometry, &self.members)
    }

    fn member_reads(&self) -> u64 {
        self.members.iter().map(|m| m.reads.load(Ordering::Relaxed)).sum()
    }

    fn member_writes(&self) -> u64 {
        self.members.iter().map(|m| m.writes.load(Ordering::Relaxed)).sum()
    }

    fn check_memory(&self) {
        let used = self.cache.used_bytes();
        assert!(
            used <= self.cache.capacity_bytes(),
            "cache holds {used} bytes, capacity {}",
            self.cache.capacity_bytes()
        );
    }

    /// Every known byte of `data` (read at `offset`) matches the model.
    #[track_caller]
    fn assert_matches_model(&self, offset: u64, data: &[u8], what: &str) {
        let range = offset as usize..offset as usize + data.len();
        for (i, (&got, (&want, &known))) in
            data.iter().zip(self.model[range.clone()].iter().zip(&self.known[range])).enumerate()
        {
            assert!(!known || got == want, "{what}: byte {} is {got:#x}, expected {want:#x}", offset as usize + i);
        }
    }

    /// After a FLUSH: the members alone hold the model, and the cache reads the same bytes.
    #[track_caller]
    fn assert_members_hold_model(&self) {
        let alone = self.members_alone();
        let size = self.size() as usize;
        let from_members = block_on(alone.read(0, size)).expect("members read").to_vec();
        self.assert_matches_model(0, &from_members, "members alone after flush");
        let from_cache = block_on(self.cache.read(0, size)).expect("cache read").to_vec();
        assert!(from_cache == from_members, "cache and members disagree after flush");
    }
}

fn array_over(geometry: &Geometry, members: &[Arc<TestMember>]) -> Array<TestMember> {
    let roles = members
        .iter()
        .enumerate()
        .map(|(device_id, m)| {
            Some(RoleMember {
                member: m.clone(),
                data_offset_bytes: DATA_OFFSET_BYTES,
                recovery_offset_sectors: None,
                device_id,
            })
        })
        .collect();
    ArrayBuilder::new(geometry.clone(), roles).build().expect("array starts")
}

#[derive(Debug, Clone)]
enum Op {
    Write { offset: u64, len: u64, seed: u64, fua: bool },
    Read { offset: u64, len: u64 },
    Flush,
    Trim { offset: u64, len: u64 },
    Zero { offset: u64, len: u64, deallocate: bool },
    WriteBack { budget: u64 },
}

impl Op {
    /// The byte range whose content the op changes, if any.
    fn mutates(&self) -> Option<(u64, u64)> {
        match *self {
            Op::Write { offset, len, .. } | Op::Trim { offset, len } | Op::Zero { offset, len, .. } => {
                Some((offset, offset + len))
            }
            _ => None,
        }
    }

    fn range(&self) -> Option<(u64, u64)> {
        match *self {
            Op::Read { offset, len } => Some((offset, offset + len)),
            _ => self.mutates(),
        }
    }
}

/// Ops that may run joined: they do not touch the same bytes in a way whose order matters.
fn independent(a: &Op, b: &Op) -> bool {
    let overlap = |x: (u64, u64), y: (u64, u64)| x.0 < y.1 && y.0 < x.1;
    match (a.mutates(), b.mutates()) {
        (None, None) => true,
        (Some(m), None) => b.range().is_none_or(|r| !overlap(m, r)),
        (None, Some(m)) => a.range().is_none_or(|r| !overlap(m, r)),
        (Some(x), Some(y)) => !overlap(x, y),
    }
}

/// Raw, resolved against the array size by the rig.
#[derive(Debug, Clone)]
struct RawOp {
    kind: u8,
    at: u32,
    len_raw: u32,
    seed: u64,
    with_next: bool,
}

fn raw_ops(max: usize) -> impl Strategy<Value = Vec<RawOp>> {
    prop::collection::vec(
        (0u8..20, any::<u32>(), any::<u32>(), any::<u64>(), prop::bool::weighted(0.3))
            .prop_map(|(kind, at, len_raw, seed, with_next)| RawOp { kind, at, len_raw, seed, with_next }),
        1..max,
    )
}

impl Rig {
    fn resolve(&self, r: &RawOp) -> Op {
        let sectors = self.size() / SECTOR;
        let at = (u64::from(r.at) * sectors) >> 32;
        let max_len = sectors - at;
        // Mostly small writes (4 KiB-ish), some spanning stripes, a few beyond the capacity.
        let len_sectors = match r.len_raw % 10 {
            0..=5 => 1 + u64::from(r.len_raw >> 8) % 16,
            6..=8 => 1 + u64::from(r.len_raw >> 8) % 128,
            _ => 1 + u64::from(r.len_raw >> 8) % sectors,
        }
        .min(max_len);
        let (offset, len) = (at * SECTOR, len_sectors * SECTOR);
        match r.kind {
            0..=8 => Op::Write { offset, len, seed: r.seed, fua: r.seed.is_multiple_of(7) },
            9..=12 => Op::Read { offset, len },
            13 => Op::Flush,
            14 => Op::Trim { offset, len },
            15 => Op::Zero { offset, len, deallocate: r.seed.is_multiple_of(2) },
            _ => Op::WriteBack { budget: u64::from(r.len_raw % 65536) * SECTOR / 64 },
        }
    }

    /// Runs the op against the cache, checking what it can check by itself.
    /// `other` is the op joined with this one (its bytes are in flux meanwhile).
    async fn exec(&self, op: &Op, other: Option<&Op>) {
        match *op {
            Op::Write { offset, len, seed, fua } => {
                let data = pattern(seed, len as usize);
                self.cache.write(offset, &data, fua).await.expect("write");
                if fua {
                    let on_members = self.members_alone().read(offset, len as usize).await.expect("read").to_vec();
                    assert!(on_members == data, "FUA write at {offset}+{len} not on the members on return");
                }
            }
            Op::Read { offset, len } => {
                let got = self.cache.read(offset, len as usize).await.expect("read").to_vec();
                assert_eq!(got.len() as u64, len);
                self.assert_matches_model(offset, &got, &format!("read {offset}+{len}"));
            }
            Op::Flush => {
                self.cache.flush().await.expect("flush");
                // Everything acknowledged before the flush started is on the members now.
                let size = self.size() as usize;
                let mut alone = self.members_alone().read(0, size).await.expect("members read").to_vec();
                if let Some((from, to)) = other.and_then(Op::mutates) {
                    alone[from as usize..to as usize].copy_from_slice(&self.model[from as usize..to as usize]);
                }
                self.assert_matches_model(0, &alone, "members alone when flush returns");
            }
            Op::Trim { offset, len } => self.cache.trim(offset, len, false).await.expect("trim"),
            Op::Zero { offset, len, deallocate } => {
                self.cache.write_zeroes(offset, len, deallocate, false).await.expect("zeroes")
            }
            Op::WriteBack { budget } => {
                self.cache.write_back_some(budget).await.expect("write back");
            }
        }
    }

    fn apply_to_model(&mut self, op: &Op) {
        match *op {
            Op::Write { offset, len, seed, .. } => {
                let r = offset as usize..(offset + len) as usize;
                self.model[r.clone()].copy_from_slice(&pattern(seed, len as usize));
                self.known[r].fill(true);
            }
            Op::Zero { offset, len, .. } => {
                let r = offset as usize..(offset + len) as usize;
                self.model[r.clone()].fill(0);
                self.known[r].fill(true);
            }
            Op::Trim { offset, len } => self.known[offset as usize..(offset + len) as usize].fill(false),
            Op::Read { .. } | Op::Flush | Op::WriteBack { .. } => {}
        }
    }

    fn run(&mut self, raw: &[RawOp]) {
        let ops: Vec<(Op, bool)> = raw.iter().map(|r| (self.resolve(r), r.with_next)).collect();
        let mut i = 0;
        while i < ops.len() {
            let (a, with_next) = &ops[i];
            let pair = ops.get(i + 1).filter(|(b, _)| *with_next && independent(a, b)).map(|(b, _)| b.clone());
            let a = a.clone();
            {
                let this = &*self;
                let check: &(dyn Fn() + Sync) = &|| this.check_memory();
                match &pair {
                    Some(b) => {
                        block_on(futures::future::join(
                            checked(this.exec(&a, Some(b)), check),
                            checked(this.exec(b, Some(&a)), check),
                        ));
                    }
                    None => block_on(checked(this.exec(&a, None), check)),
                }
            }
            self.apply_to_model(&a);
            if let Some(b) = &pair {
                self.apply_to_model(b);
                i += 1;
            }
            if matches!(a, Op::Flush) || matches!(pair, Some(Op::Flush)) {
                // Both ops of a pair completed; a FLUSH joined with a write need not cover it,
                // so compare the members only after a lone flush.
                if pair.is_none() {
                    assert_eq!(self.cache.dirty_bytes(), 0, "flush left dirty data");
                    self.assert_members_hold_model();
                }
            }
            i += 1;
        }
        block_on(self.cache.flush()).expect("final flush");
        assert_eq!(self.cache.dirty_bytes(), 0);
        self.assert_members_hold_model();
        assert_eq!(self.cache.used_bytes(), 0, "a clean cache holds no memory");
    }
}

fn level_config(which: u8) -> (Level, usize) {
    match which % 5 {
        0 | 1 => (Level::Raid5, 4),
        2 => (Level::Raid6, 5),
        3 => (Level::Raid1, 2),
        _ => (Level::Raid10, 4),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Reads always equal the model; after every FLUSH the members alone hold it; memory
    /// stays under the capacity at every interleaving point.
    #[test]
    fn cache_matches_model(which in 0u8..5, capacity_kib in 4u64..160, ops in raw_ops(60)) {
        let (level, members) = level_config(which);
        let mut rig = Rig::new(level, members, 8, 24, capacity_kib * 1024);
        rig.run(&ops);
    }
}

#[test]
fn flush_makes_writes_readable_from_the_members_alone() {
    let mut rig = Rig::new(Level::Raid5, 4, 128, 8, 4 << 20);
    let writes: Vec<(u64, u64)> = (0..64u64).map(|i| ((i * 7919 % 384) * 4096, 4096)).collect();
    for (n, &(offset, len)) in writes.iter().enumerate() {
        let data = pattern(n as u64 + 1, len as usize);
        block_on(rig.cache.write(offset, &data, false)).expect("write");
        rig.model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
    }
    assert!(rig.cache.dirty_bytes() > 0, "writes are cached, not written through");
    let before = block_on(rig.members_alone().read(0, rig.size() as usize)).expect("read").to_vec();
    assert!(before != rig.model, "nothing written back before the flush (no background task runs here)");
    block_on(rig.cache.flush()).expect("flush");
    assert_eq!(rig.cache.dirty_bytes(), 0);
    rig.assert_members_hold_model();
    // Data written after the flush is not on the members until the next one.
    let late = pattern(999, 4096);
    block_on(rig.cache.write(0, &late, false)).expect("write");
    let on_members = block_on(rig.members_alone().read(0, 4096)).expect("read").to_vec();
    assert_eq!(on_members, rig.model[..4096], "unflushed write is not on the members");
    assert_eq!(block_on(rig.cache.read(0, 4096)).expect("read").to_vec(), late, "but reads see it");
}

#[test]
fn sequential_small_writes_reach_raid5_as_full_stripes_without_member_reads() {
    // 4 members, 64 KiB chunks: a stripe holds 192 KiB of data = 48 writes of 4 KiB.
    let rig = Rig::new(Level::Raid5, 4, 128, 16, 8 << 20);
    let stripe_bytes = 3 * 64 * 1024u64;
    let stripes = 4;
    let blocks = stripes * stripe_bytes / 4096;
    // Written in a scrambled order: merging does not depend on arrival order.
    let order: Vec<u64> = (0..blocks).map(|i| (i * 37) % blocks).collect();
    for &b in &order {
        block_on(rig.cache.write(b * 4096, &pattern(b + 1, 4096), false)).expect("write");
    }
    let (reads, writes) = (rig.member_reads(), rig.member_writes());
    assert_eq!((reads, writes), (0, 0), "cached writes do no member I/O");
    let written = block_on(rig.cache.write_back_some(64 << 20)).expect("write back");
    assert_eq!(written, stripes * stripe_bytes);
    assert_eq!(rig.member_reads(), 0, "full-stripe write-back needs no member reads");
    assert!(rig.member_writes() > 0);
    assert_eq!(rig.cache.dirty_bytes(), 0);
    let alone = block_on(rig.members_alone().read(0, (stripes * stripe_bytes) as usize)).expect("read").to_vec();
    for b in 0..blocks {
        assert_eq!(alone[(b * 4096) as usize..((b + 1) * 4096) as usize], pattern(b + 1, 4096)[..], "block {b}");
    }

    // The same writes without the cache: every 4 KiB write reads the old data and parity.
    let plain = Rig::new(Level::Raid5, 4, 128, 16, 8 << 20);
    for &b in &order {
        block_on(plain.cache.array().write(b * 4096, &pattern(b + 1, 4096), false)).expect("write");
    }
    assert!(plain.member_reads() >= blocks, "write-through RMW reads: {}", plain.member_reads());
}

#[test]
fn scattered_small_writes_in_a_stripe_are_written_back_as_one_full_stripe() {
    let rig = Rig::new(Level::Raid5, 4, 128, 16, 8 << 20);
    let stripe_bytes = 3 * 64 * 1024usize;
    let base = pattern(9, 2 * stripe_bytes);
    block_on(rig.cache.array().write(0, &base, false)).expect("base data");
    for m in &rig.members {
        m.reads.store(0, Ordering::Relaxed);
        m.writes.store(0, Ordering::Relaxed);
    }
    // Eight 4 KiB writes scattered over stripe 1 (one every 24 KiB).
    let mut want = base.clone();
    for k in 0..8usize {
        let offset = stripe_bytes + k * 24576;
        let data = pattern(100 + k as u64, 4096);
        block_on(rig.cache.write(offset as u64, &data, false)).expect("write");
        want[offset..offset + 4096].copy_from_slice(&data);
    }
    let written = block_on(rig.cache.write_back_some(1 << 20)).expect("write back");
    assert_eq!(written, 8 * 4096);
    assert_eq!(rig.cache.dirty_bytes(), 0);
    // One read of the stripe (one per data member) and one full-stripe write, instead of
    // eight read-modify-writes (16 reads, 16 writes).
    assert_eq!((rig.member_reads(), rig.member_writes()), (3, 4));
    let alone = block_on(rig.members_alone().read(0, 2 * stripe_bytes)).expect("read").to_vec();
    assert!(alone == want, "the clean bytes of the stripe are kept, the dirty ones written");
}

#[test]
fn a_newer_write_is_never_overwritten_by_an_older_cached_copy() {
    let rig = Rig::new(Level::Raid5, 4, 8, 16, 1 << 20);
    let (old, new) = (pattern(1, 8192), pattern(2, 8192));
    block_on(rig.cache.write(4096, &old, false)).expect("write");
    // The write-back takes `old` and yields at its first member I/O; the new write lands
    // in the cache meanwhile.
    let (written, ()) = block_on(futures::future::join(rig.cache.write_back_some(1 << 20), async {
        rig.cache.write(4096, &new, false).await.expect("write")
    }));
    assert_eq!(written.expect("write back"), 8192, "the old copy was written back");
    assert_eq!(rig.cache.dirty_bytes(), 8192, "the newer write stays dirty");
    assert_eq!(block_on(rig.cache.read(4096, 8192)).expect("read").to_vec(), new);
    block_on(rig.cache.flush()).expect("flush");
    assert_eq!(block_on(rig.members_alone().read(4096, 8192)).expect("read").to_vec(), new);

    // The same race against a stripe fill (scattered pieces of one 12 KiB stripe).
    block_on(rig.cache.write(12288, &pattern(6, 512), false)).expect("write");
    block_on(rig.cache.write(12288 + 8192, &pattern(7, 512), false)).expect("write");
    let newer = pattern(8, 1024);
    let (written, ()) = block_on(futures::future::join(rig.cache.write_back_some(1 << 20), async {
        rig.cache.write(12288 + 8192, &newer, false).await.expect("write")
    }));
    assert_eq!(written.expect("write back"), 1024, "the fill wrote both old pieces");
    assert_eq!(rig.cache.dirty_bytes(), 1024, "the newer write stays dirty");
    block_on(rig.cache.flush()).expect("flush");
    assert_eq!(block_on(rig.members_alone().read(12288 + 8192, 1024)).expect("read").to_vec(), newer);

    // A direct operation (write_zeroes) racing a write-back of the same bytes: zeros win.
    block_on(rig.cache.write(0, &pattern(3, 16384), false)).expect("write");
    let (wb, z) = block_on(futures::future::join(
        rig.cache.write_back_some(1 << 20),
        rig.cache.write_zeroes(0, 16384, false, false),
    ));
    wb.expect("write back");
    z.expect("zeroes");
    block_on(rig.cache.flush()).expect("flush");
    assert!(block_on(rig.members_alone().read(0, 16384)).expect("read").to_vec().iter().all(|&b| b == 0));
    assert!(block_on(rig.cache.read(0, 16384)).expect("read").to_vec().iter().all(|&b| b == 0));

    // A FUA write over cached data: durable on return, and the older cached copy is gone.
    block_on(rig.cache.write(0, &pattern(4, 16384), false)).expect("write");
    block_on(rig.cache.write(4096, &pattern(5, 4096), true)).expect("fua write");
    assert_eq!(block_on(rig.members_alone().read(4096, 4096)).expect("read").to_vec(), pattern(5, 4096));
    block_on(rig.cache.flush()).expect("flush");
    let mut want = pattern(4, 16384);
    want[4096..8192].copy_from_slice(&pattern(5, 4096));
    assert_eq!(block_on(rig.members_alone().read(0, 16384)).expect("read").to_vec(), want);
}

#[test]
fn many_concurrent_writers_never_exceed_the_capacity() {
    // Capacity for ~6 writes of 4 KiB; 64 writers at once plus a background write-back.
    let capacity = 6 * (4096 + CHUNK_OVERHEAD_BYTES);
    let rig = Rig::new(Level::Raid5, 4, 8, 64, capacity);
    let check: &(dyn Fn() + Sync) = &|| rig.check_memory();
    let cache = &rig.cache;
    let writers = (0..64u64).map(|i| {
        let offset = (i * 13 % 96) * 4096;
        checked(async move { cache.write(offset, &pattern(i + 1, 4096), false).await.expect("write") }, check)
    });
    let background = checked(
        async {
            for _ in 0..8 {
                rig.cache.write_back_some(8192).await.expect("write back");
            }
        },
        check,
    );
    block_on(futures::future::join(join_all(writers), background));
    block_on(rig.cache.flush()).expect("flush");
    let mut model = vec![0u8; rig.size() as usize];
    for i in 0..64u64 {
        let offset = ((i * 13 % 96) * 4096) as usize;
        model[offset..offset + 4096].copy_from_slice(&pattern(i + 1, 4096));
    }
    let alone = block_on(rig.members_alone().read(0, rig.size() as usize)).expect("read").to_vec();
    // Offsets repeat (i*13 % 96 has period 96 > 64: they do not), so the last write wins trivially.
    assert!(alone == model, "members hold every write after flush");
    assert_eq!(rig.cache.used_bytes(), 0);
}

#[test]
fn a_write_larger_than_the_cache_goes_around_it() {
    let rig = Rig::new(Level::Raid5, 4, 8, 64, 16 << 10);
    block_on(rig.cache.write(0, &pattern(1, 8192), false)).expect("small write cached");
    let big = pattern(2, 64 << 10);
    block_on(rig.cache.write(4096, &big, false)).expect("big write");
    // Written around the cache straight to the members; the overlapped cached bytes are gone.
    assert_eq!(block_on(rig.members_alone().read(4096, 64 << 10)).expect("read").to_vec(), big);
    assert_eq!(rig.cache.dirty_bytes(), 4096, "only the first 4 KiB of the small write stays cached");
    let mut want = pattern(1, 8192)[..4096].to_vec();
    want.extend_from_slice(&big);
    assert_eq!(block_on(rig.cache.read(0, 4096 + (64 << 10))).expect("read").to_vec(), want);
}

#[test]
fn write_back_failures_keep_data_cached_and_fail_every_flush() {
    let rig = Rig::new(Level::Raid5, 4, 8, 16, 1 << 20);
    let data = pattern(7, 16384);
    block_on(rig.cache.write(0, &data, false)).expect("cached write succeeds");
    // Two of four RAID5 members fail: the array cannot take the write.
    rig.members[0].fail_writes.store(true, Ordering::Relaxed);
    rig.members[1].fail_writes.store(true, Ordering::Relaxed);
    let err = block_on(rig.cache.write_back_some(1 << 20)).expect_err("write-back fails");
    assert!(rig.cache.failure().is_some());
    assert_eq!(rig.cache.dirty_bytes(), 16384, "data that failed to write back stays dirty");
    assert_eq!(block_on(rig.cache.read(0, 16384)).expect("read").to_vec(), data, "and reads still see it");
    let first = block_on(rig.cache.flush()).expect_err("flush reports the failure");
    let second = block_on(rig.cache.flush()).expect_err("and so does the next one");
    assert_eq!((err.kind, first.kind), (second.kind, second.kind));
    assert_eq!(rig.cache.dirty_bytes(), 16384);

    // A transient failure (raid0 has no faulty state: the next write may succeed): the data
    // reaches the members on a later try, but FLUSH keeps reporting that a write-back failed.
    let rig = Rig::new(Level::Raid0, 2, 8, 16, 1 << 20);
    block_on(rig.cache.write(0, &data, false)).expect("cached write succeeds");
    rig.members[0].fail_writes.store(true, Ordering::Relaxed);
    block_on(rig.cache.flush()).expect_err("flush fails");
    rig.members[0].fail_writes.store(false, Ordering::Relaxed);
    let sticky = block_on(rig.cache.flush()).expect_err("the failure is sticky");
    assert!(sticky.to_string().contains("could not be written"), "{sticky}");
    assert_eq!(rig.cache.dirty_bytes(), 0, "the retry wrote the data");
    assert_eq!(block_on(rig.members_alone().read(0, 16384)).expect("read").to_vec(), data);
}

/// The binary serves `WriteCache<dyn Member>` from a multi-threaded runtime: every future
/// must be `Send` (checked at compile time; never called).
#[allow(dead_code)]
fn futures_are_send_over_dyn_members(cache: &WriteCache<dyn Member>) {
    fn send<T: Send>(_: T) {}
    send(cache.read(0, 512));
    send(cache.write(0, &[0; 512], false));
    send(cache.flush());
    send(cache.trim(0, 512, false));
    send(cache.write_zeroes(0, 512, true, false));
    send(cache.write_back_some(1 << 20));
    send(cache.wait_for_work());
}

#[test]
fn bad_requests_are_refused_like_the_array_refuses_them() {
    let rig = Rig::new(Level::Raid5, 4, 8, 16, 1 << 20);
    let size = rig.size();
    assert!(block_on(rig.cache.write(100, &[0; 512], false)).is_err(), "unaligned");
    assert!(block_on(rig.cache.write(size, &[0; 512], false)).is_err(), "past the end");
    assert!(block_on(rig.cache.read(u64::MAX - 511, 512)).is_err(), "overflow");
    assert!(block_on(rig.cache.trim(0, size + 512, false)).is_err());
    assert!(block_on(rig.cache.write_zeroes(512, 100, false, false)).is_err());
    assert_eq!(rig.cache.dirty_bytes(), 0);
    assert_eq!(rig.cache.used_bytes(), 0);
}
