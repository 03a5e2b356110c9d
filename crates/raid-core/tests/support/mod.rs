//! Test rig for engine model tests: in-memory members (optionally failing or yielding),
//! an array over them, a flat-buffer model, and consistency and rebuild checks.
#![allow(dead_code)]

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::task::{Context, Poll};

use futures::executor::block_on;
use proptest::prelude::*;
use raid_core::AlignedBuf;
use raid_core::engine::{Array, ArrayBuilder, RoleMember};
use raid_core::geometry::{Geometry, Level};
use raid_core::member::{BufResult, IoFuture, Member, MemoryMember};
use raid_core::parity::{self, BlockKind};

pub const SECTOR: u64 = 512;
pub const DATA_OFFSET_BYTES: u64 = 8192;

#[derive(Debug, Clone)]
pub struct Config {
    pub level: Level,
    pub layout: u32,
    pub members: usize,
    pub chunk_sectors: u32,
    /// Stripes (chunk-rows) per member.
    pub stripes: u64,
    /// Varies member sizes for linear/raid0.
    pub unequal_seed: u64,
}

#[derive(Debug, Clone)]
pub enum Op {
    Write {
        offset: u64,
        len: u64,
        seed: u64,
    },
    /// `Array::write_bytes` at any byte offset and length.
    WriteBytes {
        offset: u64,
        len: u64,
        seed: u64,
    },
    Read {
        offset: u64,
        len: u64,
    },
    Flush,
    Trim {
        offset: u64,
        len: u64,
    },
    Zero {
        offset: u64,
        len: u64,
        deallocate: bool,
    },
}

/// Unresolved operation: positions are fractions of the array, resolved by the rig.
#[derive(Debug, Clone)]
pub struct RawOp {
    kind: u8,
    at: u32,
    len_class: u8,
    len_raw: u32,
    seed: u64,
}

pub fn ops_strategy(max: usize) -> impl Strategy<Value = Vec<RawOp>> {
    prop::collection::vec(
        (0u8..10, any::<u32>(), 0u8..10, any::<u32>(), any::<u64>())
            .prop_map(|(kind, at, len_class, len_raw, seed)| RawOp { kind, at, len_class, len_raw, seed }),
        1..max,
    )
}

/// A memory member that counts its reads and writes, can be told to fail every I/O after
/// some number of operations (or every write), and can yield once per operation so
/// concurrent requests interleave.
pub struct TestMember {
    inner: MemoryMember,
    fail_after: AtomicI64,
    pub yield_once: AtomicBool,
    pub fail_writes: AtomicBool,
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    /// Every read takes at least this many microseconds (a slow or distant member).
    pub read_delay_us: AtomicU64,
}

impl TestMember {
    pub fn new(name: String, len_bytes: u64) -> Self {
        Self {
            inner: MemoryMember::new(name, len_bytes),
            fail_after: AtomicI64::new(-1),
            yield_once: AtomicBool::new(false),
            fail_writes: AtomicBool::new(false),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            read_delay_us: AtomicU64::new(0),
        }
    }

    /// A member that yields once per operation from the start.
    pub fn yielding(name: String, len_bytes: u64) -> Self {
        let m = Self::new(name, len_bytes);
        m.yield_once.store(true, Ordering::Relaxed);
        m
    }

    pub fn snapshot(&self) -> Vec<u8> {
        self.inner.snapshot()
    }

    /// Flips one byte at `offset_bytes` of the member (silent corruption).
    pub fn corrupt(&self, offset_bytes: u64) {
        self.inner.with_data(|d| d[offset_bytes as usize] ^= 0x5a);
    }

    fn failing(&self) -> bool {
        let left = self.fail_after.load(Ordering::SeqCst);
        if left < 0 {
            return false;
        }
        if left == 0 {
            return true;
        }
        self.fail_after.fetch_sub(1, Ordering::SeqCst);
        false
    }

    fn wrap<'a, T: Send + 'a>(&'a self, fut: IoFuture<'a, T>) -> IoFuture<'a, T> {
        if self.yield_once.load(Ordering::Relaxed) { Box::pin(YieldOnce { fut, yielded: false }) } else { fut }
    }
}

fn eio() -> io::Error {
    io::Error::other("injected failure")
}

impl Member for TestMember {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn len_bytes(&self) -> u64 {
        self.inner.len_bytes()
    }
    fn read_at(&self, offset_bytes: u64, buf: AlignedBuf) -> IoFuture<'_, BufResult> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        if self.failing() {
            return Box::pin(std::future::ready((Err(eio()), buf)));
        }
        let delay = self.read_delay_us.load(Ordering::Relaxed);
        if delay > 0 {
            // The array measures from the call: a delay here is latency to it.
            std::thread::sleep(std::time::Duration::from_micros(delay));
        }
        self.wrap(self.inner.read_at(offset_bytes, buf))
    }
    fn write_at(&self, offset_bytes: u64, buf: AlignedBuf, fua: bool) -> IoFuture<'_, BufResult> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        if self.failing() || self.fail_writes.load(Ordering::Relaxed) {
            return Box::pin(std::future::ready((Err(eio()), buf)));
        }
        self.wrap(self.inner.write_at(offset_bytes, buf, fua))
    }
    fn flush(&self) -> IoFuture<'_, io::Result<()>> {
        if self.failing() {
            return Box::pin(std::future::ready(Err(eio())));
        }
        self.wrap(self.inner.flush())
    }
    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        if self.failing() || self.fail_writes.load(Ordering::Relaxed) {
            return Box::pin(std::future::ready(Err(eio())));
        }
        self.wrap(self.inner.discard(offset_bytes, len_bytes))
    }
    fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        if self.failing() || self.fail_writes.load(Ordering::Relaxed) {
            return Box::pin(std::future::ready(Err(eio())));
        }
        self.wrap(self.inner.write_zeroes(offset_bytes, len_bytes))
    }
}

/// Returns to the executor `times` times before completing (lets other futures of a
/// `join` make progress first).
pub async fn yield_times(times: u64) {
    struct YieldNow(bool);
    impl Future for YieldNow {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            if self.0 {
                return Poll::Ready(());
            }
            self.0 = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
    for _ in 0..times {
        YieldNow(false).await;
    }
}

struct YieldOnce<'a, T> {
    fut: IoFuture<'a, T>,
    yielded: bool,
}

impl<T> Future for YieldOnce<'_, T> {
    type Output = T;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        if !self.yielded {
            self.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.fut.as_mut().poll(cx)
    }
}

pub use raid_core::conformance::pattern;

pub struct Rig {
    pub config: Config,
    pub geometry: Geometry,
    pub member_sectors: Vec<u64>,
    pub members: Vec<Arc<TestMember>>,
    pub array: Array<TestMember>,
    pub model: Vec<u8>,
    /// Per sector: false once trimmed (content unspecified until rewritten).
    pub known: Vec<bool>,
}

fn member_sizes(config: &Config) -> Vec<u64> {
    let chunk = u64::from(config.chunk_sectors);
    let base = chunk * config.stripes;
    (0..config.members)
        .map(|role| match config.level {
            Level::Raid0 => base + chunk * ((config.unequal_seed >> (role * 2)) % 3),
            Level::Linear => base + 3 * ((config.unequal_seed >> (role * 3)) % 5),
            _ => base,
        })
        .collect()
}

/// Every member in the role of its index, in sync.
fn role_members(members: &[Arc<TestMember>]) -> Vec<Option<RoleMember<TestMember>>> {
    members
        .iter()
        .enumerate()
        .map(|(role, m)| {
            Some(RoleMember {
                member: m.clone(),
                data_offset_bytes: DATA_OFFSET_BYTES,
                recovery_offset_sectors: None,
                device_id: role,
            })
        })
        .collect()
}

impl Rig {
    pub fn new(config: &Config) -> Rig {
        let member_sectors = member_sizes(config);
        let geometry = Geometry::new(config.level, config.layout, config.chunk_sectors, &member_sectors)
            .unwrap_or_else(|e| panic!("geometry {config:?}: {e}"));
        let members: Vec<Arc<TestMember>> = member_sectors
            .iter()
            .enumerate()
            .map(|(role, s)| Arc::new(TestMember::new(format!("m{role}"), DATA_OFFSET_BYTES + s * SECTOR + 4096)))
            .collect();
        Self::with_members(config.clone(), geometry, member_sectors, members)
    }

    /// A builder of a new array over the same members (a restart).
    pub fn builder(&self) -> ArrayBuilder<TestMember> {
        ArrayBuilder::new(self.geometry.clone(), role_members(&self.members))
    }

    /// A new array over the same members (a restart), `dirty` as after an unclean stop.
    pub fn reopen(rig: &Rig, dirty: bool) -> Rig {
        let mut new = Self::with_members(
            rig.config.clone(),
            rig.geometry.clone(),
            rig.member_sectors.clone(),
            rig.members.clone(),
        );
        if dirty {
            new.array = ArrayBuilder::new(rig.geometry.clone(), role_members(&new.members))
                .dirty(true)
                .build()
                .expect("array starts");
        }
        new
    }

    fn with_members(
        config: Config,
        geometry: Geometry,
        member_sectors: Vec<u64>,
        members: Vec<Arc<TestMember>>,
    ) -> Rig {
        let array = ArrayBuilder::new(geometry.clone(), role_members(&members)).build().expect("array starts");
        let size = array.size_bytes() as usize;
        let sectors = size / SECTOR as usize;
        let model = Self::read_all_from(&array);
        Rig { config, geometry, member_sectors, members, array, model, known: vec![true; sectors] }
    }

    pub fn size(&self) -> u64 {
        self.array.size_bytes()
    }

    fn read_all_from(array: &Array<TestMember>) -> Vec<u8> {
        let size = array.size_bytes();
        let mut out = Vec::with_capacity(size as usize);
        let mut at = 0;
        while at < size {
            let n = (size - at).min(32 << 20);
            out.extend(block_on(array.read(at, n as usize)).expect("read").to_vec());
            at += n;
        }
        out
    }

    pub fn resolve(&self, raw: &[RawOp]) -> Vec<Op> {
        let sectors = self.size() / SECTOR;
        let chunk = u64::from(self.config.chunk_sectors);
        raw.iter()
            .map(|r| {
                let at = (u64::from(r.at) * sectors) >> 32;
                let len_sectors = match r.len_class {
                    0..=4 => 1 + u64::from(r.len_raw) % 16,
                    5..=6 => chunk,
                    7 => 1 + u64::from(r.len_raw) % (chunk * 3),
                    _ => 1 + u64::from(r.len_raw) % (chunk * self.config.members as u64 * 3),
                };
                let len = len_sectors.clamp(1, (sectors - at).min((32 << 20) / SECTOR));
                let (offset, len) = (at * SECTOR, len * SECTOR);
                match r.kind {
                    3 => {
                        // Anywhere in the sectors chosen, any length up to theirs.
                        let start = offset + r.seed % SECTOR;
                        let len = (1 + u64::from(r.len_raw) % len).min(self.size() - start).max(1);
                        Op::WriteBytes { offset: start.min(self.size() - 1), len, seed: r.seed }
                    }
                    0..=2 => Op::Write { offset, len, seed: r.seed },
                    4..=6 => Op::Read { offset, len },
                    7 => Op::Flush,
                    8 => Op::Trim { offset, len },
                    _ => Op::Zero { offset, len, deallocate: r.seed % 2 == 0 },
                }
            })
            .collect()
    }

    /// Runs `ops`, failing the roles in `fail.1` just before op number `fail.0`.
    pub fn run_raw(&mut self, raw: &[RawOp], fail: Option<(usize, Vec<usize>)>) {
        let ops = self.resolve(raw);
        self.run(&ops, fail);
    }

    pub fn run(&mut self, ops: &[Op], fail: Option<(usize, Vec<usize>)>) {
        for (i, op) in ops.iter().enumerate() {
            if let Some((at, roles)) = &fail
                && *at == i
            {
                self.fail_roles(roles);
            }
            self.apply(op);
        }
        if let Some((at, roles)) = &fail
            && *at >= ops.len()
        {
            self.fail_roles(roles);
        }
        self.check_whole_array();
    }

    fn fail_roles(&self, roles: &[usize]) {
        for &r in roles {
            block_on(self.array.admin().fail_role(r)).expect("failing within redundancy is allowed");
        }
    }

    pub fn apply(&mut self, op: &Op) {
        match *op {
            Op::Write { offset, len, seed } => {
                let data = pattern(seed, len as usize);
                block_on(self.array.write(offset, &data, seed % 3 == 0)).unwrap_or_else(|e| panic!("{op:?}: {e}"));
                self.model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
                self.set_known(offset, len, true);
            }
            Op::WriteBytes { offset, len, seed } => {
                // Learn trimmed edge sectors first: the bytes around the write stay as they are.
                for sector in [offset / SECTOR, (offset + len - 1) / SECTOR] {
                    if !self.known[sector as usize] {
                        let at = sector * SECTOR;
                        let now = block_on(self.array.read(at, SECTOR as usize)).expect("read").to_vec();
                        self.model[at as usize..(at + SECTOR) as usize].copy_from_slice(&now);
                        self.known[sector as usize] = true;
                    }
                }
                let data = pattern(seed, len as usize);
                block_on(self.array.write_bytes(offset, &data, seed % 3 == 0))
                    .unwrap_or_else(|e| panic!("{op:?}: {e}"));
                self.model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
                let (first, last) = (offset / SECTOR, (offset + len - 1) / SECTOR);
                self.known[first as usize..=last as usize].fill(true);
            }
            Op::Read { offset, len } => {
                let got =
                    block_on(self.array.read(offset, len as usize)).unwrap_or_else(|e| panic!("{op:?}: {e}")).to_vec();
                self.compare(offset, &got, &format!("{op:?}"));
            }
            Op::Flush => block_on(self.array.flush()).expect("flush"),
            Op::Trim { offset, len } => {
                block_on(self.array.trim(offset, len, false)).unwrap_or_else(|e| panic!("{op:?}: {e}"));
                self.set_known(offset, len, false);
            }
            Op::Zero { offset, len, deallocate } => {
                block_on(self.array.write_zeroes(offset, len, deallocate, false))
                    .unwrap_or_else(|e| panic!("{op:?}: {e}"));
                self.model[offset as usize..(offset + len) as usize].fill(0);
                self.set_known(offset, len, true);
            }
        }
    }

    fn set_known(&mut self, offset: u64, len: u64, known: bool) {
        for s in offset / SECTOR..(offset + len) / SECTOR {
            self.known[s as usize] = known;
        }
    }

    fn compare(&self, offset: u64, got: &[u8], what: &str) {
        for (i, chunk) in got.chunks(SECTOR as usize).enumerate() {
            let sector = offset / SECTOR + i as u64;
            if !self.known[sector as usize] {
                continue;
            }
            let at = (sector * SECTOR) as usize;
            assert!(
                chunk == &self.model[at..at + SECTOR as usize],
                "{what}: sector {sector} differs from the model ({:?})",
                self.config
            );
        }
    }

    pub fn check_whole_array(&self) {
        let all = Self::read_all_from(&self.array);
        self.compare(0, &all, "whole-array read");
    }

    /// Up to the level's redundancy worth of distinct roles, chosen by `seed`, that the
    /// array survives losing.
    pub fn pick_victims(&self, seed: u64) -> Vec<usize> {
        let n = self.config.members;
        let want = match self.config.level {
            Level::Raid6 => 2,
            Level::Linear | Level::Raid0 => return Vec::new(),
            _ => 1 + (seed >> 40) as usize % 2,
        };
        let mut roles = Vec::new();
        let mut x = seed;
        for _ in 0..want * 4 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let r = (x >> 33) as usize % n;
            if roles.contains(&r) {
                continue;
            }
            let mut cand = roles.clone();
            cand.push(r);
            if self.geometry.survives(&cand) {
                roles = cand;
            }
            if roles.len() == want {
                break;
            }
        }
        roles
    }

    /// Scrubs the whole array; returns md's mismatch count (sectors).
    pub fn scrub(&self, repair: bool) -> u64 {
        let counts =
            block_on(self.array.maintenance().scrub(0, self.array.maintenance().scrub_units(), repair)).expect("scrub");
        assert_eq!(counts.scrubbed_bytes, self.size(), "scrub covers the array");
        counts.mismatch_sectors
    }

    pub fn arm_io_failure(&self, role: usize, after_ops: u64) {
        self.members[role].fail_after.store(after_ops as i64, Ordering::SeqCst);
    }

    fn member_data(&self, role: usize) -> Vec<u8> {
        let snap = self.members[role].snapshot();
        snap[DATA_OFFSET_BYTES as usize..(DATA_OFFSET_BYTES + self.member_sectors[role] * SECTOR) as usize].to_vec()
    }

    /// Parity matches data on every stripe; all copies of every mirrored piece are equal.
    pub fn assert_consistent(&self) {
        let data: Vec<Vec<u8>> = (0..self.config.members).map(|r| self.member_data(r)).collect();
        assert_members_consistent(&self.geometry, &data);
        self.check_whole_array();
    }

    /// Rebuilds the failed roles from the survivors (as a rebuild would), starts a fresh
    /// array on the result, and checks it reads like the model and is consistent.
    pub fn assert_rebuild_restores(&self, failed: &[usize]) {
        self.check_whole_array();
        let mut data: Vec<Vec<u8>> = (0..self.config.members).map(|r| self.member_data(r)).collect();
        for &r in failed {
            data[r].fill(0xEE); // whatever the dead member held is gone
        }
        rebuild_members(&self.geometry, &mut data, failed);
        assert_members_consistent(&self.geometry, &data);
        let members: Vec<Arc<TestMember>> = data
            .iter()
            .enumerate()
            .map(|(role, d)| {
                let m = TestMember::new(format!("rebuilt{role}"), DATA_OFFSET_BYTES + d.len() as u64 + 4096);
                block_on(m.write_at(DATA_OFFSET_BYTES, AlignedBuf::from_slice(d), false)).0.expect("seed member");
                Arc::new(m)
            })
            .collect();
        let rebuilt =
            Rig::with_members(self.config.clone(), self.geometry.clone(), self.member_sectors.clone(), members);
        self.compare(0, &rebuilt.model, "read after rebuild");
    }

    /// Many concurrent writes to disjoint ranges of the first stripes, members yielding
    /// once per I/O so the requests interleave at every await.
    pub fn run_concurrent_disjoint_writes(&mut self, count: usize, seed: u64) {
        for m in &self.members {
            m.yield_once.store(true, Ordering::Relaxed);
        }
        let span = (self.size() / SECTOR).min(u64::from(self.config.chunk_sectors) * 2 * self.config.members as u64);
        let slot = (span / count as u64).max(1);
        let writes: Vec<(u64, Vec<u8>)> = (0..count as u64)
            .filter(|i| (i + 1) * slot <= span)
            .map(|i| {
                let len = 1 + (seed.wrapping_mul(i + 3) % slot);
                ((i * slot) * SECTOR, pattern(seed ^ i, (len * SECTOR) as usize))
            })
            .collect();
        let array = &self.array;
        block_on(futures::future::join_all(writes.iter().map(|(off, d)| array.write(*off, d, false))))
            .into_iter()
            .for_each(|r| r.expect("concurrent write"));
        for (off, d) in &writes {
            self.model[*off as usize..*off as usize + d.len()].copy_from_slice(d);
        }
        for m in &self.members {
            m.yield_once.store(false, Ordering::Relaxed);
        }
    }

    /// `count` byte-granular writes at once that tile a byte range without overlapping, each
    /// 1 to 1500 bytes, so that several share each sector they touch (members yield once per
    /// operation, so the writes interleave).
    pub fn run_concurrent_byte_writes(&mut self, count: usize, seed: u64) {
        for m in &self.members {
            m.yield_once.store(true, Ordering::Relaxed);
        }
        let mut writes: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut at = 37u64;
        for i in 0..count as u64 {
            let len = 1 + (seed.wrapping_mul(i + 11).rotate_left(17) % 1500);
            if at + len > self.size() {
                break;
            }
            writes.push((at, pattern(seed ^ (i << 8), len as usize)));
            at += len;
        }
        let array = &self.array;
        block_on(futures::future::join_all(writes.iter().map(|(off, d)| array.write_bytes(*off, d, false))))
            .into_iter()
            .for_each(|r| r.expect("concurrent byte write"));
        for (off, d) in &writes {
            self.model[*off as usize..*off as usize + d.len()].copy_from_slice(d);
        }
        for m in &self.members {
            m.yield_once.store(false, Ordering::Relaxed);
        }
        self.check_whole_array();
    }
}

/// Block kinds of a stripe in engine order: data.., P, Q.
fn kinds(layout: &raid_core::geometry::StripeLayout, np: usize) -> Vec<BlockKind> {
    let mut k: Vec<BlockKind> = (0..layout.data_roles.len())
        .map(|i| BlockKind::Data { exponent: layout.q_exponents.get(i).copied().unwrap_or(0) })
        .collect();
    k.push(BlockKind::P);
    if np == 2 {
        k.push(BlockKind::Q);
    }
    k
}

fn stripe_roles(layout: &raid_core::geometry::StripeLayout) -> Vec<usize> {
    let mut r = layout.data_roles.clone();
    r.push(layout.p_role);
    r.extend(layout.q_role);
    r
}

pub fn assert_members_consistent(geometry: &Geometry, data: &[Vec<u8>]) {
    if let Some(pg) = geometry.parity() {
        let c = u64::from(pg.chunk_sectors()) * SECTOR;
        for stripe in 0..pg.stripes() {
            let layout = pg.stripe(stripe);
            let at = (pg.stripe_member_sector(stripe) * SECTOR) as usize;
            let blocks: Vec<&[u8]> = stripe_roles(&layout).iter().map(|&r| &data[r][at..at + c as usize]).collect();
            assert!(
                parity::parity_matches(&blocks, &kinds(&layout, pg.parity_disks())),
                "stripe {stripe} parity mismatch"
            );
        }
        return;
    }
    let mut sector = 0;
    while sector < geometry.array_sectors() {
        let m = geometry.map(sector);
        let len = (m.len_sectors * SECTOR) as usize;
        let first = &m.copies[0];
        let a = &data[first.role][(first.member_sector * SECTOR) as usize..][..len];
        for c in &m.copies[1..] {
            let b = &data[c.role][(c.member_sector * SECTOR) as usize..][..len];
            assert!(a == b, "copies of array sector {sector} differ (roles {} and {})", first.role, c.role);
        }
        sector += m.len_sectors;
    }
}

pub fn rebuild_members(geometry: &Geometry, data: &mut [Vec<u8>], failed: &[usize]) {
    if let Some(pg) = geometry.parity() {
        let c = (u64::from(pg.chunk_sectors()) * SECTOR) as usize;
        for stripe in 0..pg.stripes() {
            let layout = pg.stripe(stripe);
            let at = (pg.stripe_member_sector(stripe) * SECTOR) as usize;
            let roles = stripe_roles(&layout);
            let mut blocks: Vec<Vec<u8>> = roles.iter().map(|&r| data[r][at..at + c].to_vec()).collect();
            let missing: Vec<usize> = (0..roles.len()).filter(|&b| failed.contains(&roles[b])).collect();
            let mut slices: Vec<&mut [u8]> = blocks.iter_mut().map(|b| b.as_mut_slice()).collect();
            assert!(parity::reconstruct(&mut slices, &kinds(&layout, pg.parity_disks()), &missing));
            for (b, &r) in roles.iter().enumerate() {
                data[r][at..at + c].copy_from_slice(&blocks[b]);
            }
        }
        return;
    }
    let mut sector = 0;
    while sector < geometry.array_sectors() {
        let m = geometry.map(sector);
        let len = (m.len_sectors * SECTOR) as usize;
        let src = m.copies.iter().find(|c| !failed.contains(&c.role)).expect("a copy survives");
        let good = data[src.role][(src.member_sector * SECTOR) as usize..][..len].to_vec();
        for c in m.copies.iter().filter(|c| failed.contains(&c.role)) {
            data[c.role][(c.member_sector * SECTOR) as usize..][..len].copy_from_slice(&good);
        }
        sector += m.len_sectors;
    }
}
