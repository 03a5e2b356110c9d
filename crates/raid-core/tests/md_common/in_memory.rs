//! md arrays on memory members, as the engine tests of changing shape use them: create one
//! the way `raidnbd create` does, start it from its superblocks (a restart after a SIGKILL is
//! a drop and a start), read superblocks back, and compare the array with a model.

use std::sync::Arc;

use futures::executor::block_on;
use raid_core::engine::{Array, MaintenanceWork, Step};
use raid_core::geometry::Level;
use raid_core::md::{self, CreateParams, MdUuid, SUPERBLOCK_BYTE_OFFSET, StartOptions, Superblock};
use raid_core::{AlignedBuf, Member, MemoryMember, SECTOR_BYTES};

/// A seeded xorshift generator.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// `disks` memory members of `member_bytes` holding a new md array of `level` (`layout`, or
/// md's default; 64 KiB chunks, raid1 none; a partial parity log if `ppl`), then `extra`
/// blank members of the same size.
pub fn create(
    level: Level,
    layout: Option<u32>,
    disks: usize,
    extra: usize,
    ppl: bool,
    member_bytes: u64,
) -> Vec<Arc<MemoryMember>> {
    create_leaving(level, layout, disks, extra, ppl, member_bytes, 0)
}

/// [`create`], md's data area ending `tail_bytes` before each member's end (room for
/// checksums).
pub fn create_leaving(
    level: Level,
    layout: Option<u32>,
    disks: usize,
    extra: usize,
    ppl: bool,
    member_bytes: u64,
    tail_bytes: u64,
) -> Vec<Arc<MemoryMember>> {
    let sizes = vec![Some(member_bytes - tail_bytes); disks];
    let params = CreateParams {
        level,
        layout,
        chunk_sectors: (level != Level::Raid1).then_some(128),
        name: "test",
        homehost: None,
        uuid: Some(MdUuid([9; 16])),
        members_bytes: &sizes,
        ppl,
        journal_bytes: None,
    };
    let mut n = 0u8;
    let meta = md::create(&params, 1_700_000_000, &mut || {
        n += 1;
        MdUuid([n; 16])
    })
    .expect("create");
    (0..disks + extra)
        .map(|i| {
            let m = Arc::new(MemoryMember::new(format!("m{i}"), member_bytes));
            if i < disks {
                let image = meta.superblock_for(i).encode();
                block_on(m.write_at(SUPERBLOCK_BYTE_OFFSET, AlignedBuf::from_slice(&image), true)).0.unwrap();
            }
            m
        })
        .collect()
}

/// The array on `members`, assembled and started from their superblocks.
pub fn start(members: &[Arc<MemoryMember>]) -> md::Started<dyn Member> {
    let members: Vec<Arc<dyn Member>> = members.iter().map(|m| m.clone() as Arc<dyn Member>).collect();
    block_on(md::start(&super::assemble(&members), &members, StartOptions::default())).expect("start")
}

/// The superblock on `member`.
pub fn superblock(member: &MemoryMember) -> Superblock {
    let (res, buf) = block_on(member.read_at(SUPERBLOCK_BYTE_OFFSET, AlignedBuf::zeroed(4096)));
    res.unwrap();
    Superblock::decode(buf.as_slice()).expect("a valid superblock")
}

/// Every byte of the array.
pub fn read_all(array: &Array<dyn Member>) -> Vec<u8> {
    let size = array.size_bytes() as usize;
    let mut out = Vec::with_capacity(size);
    while out.len() < size {
        let n = (size - out.len()).min(4 << 20);
        out.extend_from_slice(&block_on(array.read(out.len() as u64, n)).unwrap().to_vec());
    }
    out
}

/// Writes `data` from the array's start, in pieces of 4 MiB.
pub fn write_all(array: &Array<dyn Member>, data: &[u8]) {
    for (i, part) in data.chunks(4 << 20).enumerate() {
        block_on(array.write((i << 22) as u64, part, false)).unwrap();
    }
}

/// The array holds exactly `model`.
pub fn check_all(array: &Array<dyn Member>, model: &[u8], what: &str) {
    let got = read_all(array);
    assert_eq!(got.len(), model.len(), "{what}: the size");
    if let Some(at) = got.iter().zip(model).position(|(a, b)| a != b) {
        panic!("{what}: byte {at} differs");
    }
}

/// Steps the running reshape of `started` to its end, a random write (up to 32 KiB, into
/// `model`) and a 64 KiB read (which must see the bytes before or after the write) racing each
/// step; every `restart_every` steps a restart from the superblocks (a SIGKILL: nothing shut
/// down) that must still be reshaping, writable, of the same size and hold `model`. Returns
/// the array and how often it restarted.
pub fn reshape_under_writes(
    members: &[Arc<MemoryMember>],
    mut started: md::Started<dyn Member>,
    rng: &mut Rng,
    model: &mut [u8],
    restart_every: usize,
    what: &str,
) -> (md::Started<dyn Member>, usize) {
    let size = model.len();
    let (mut steps, mut restarts) = (0, 0);
    loop {
        let len = ((1 + rng.next() % 64) * SECTOR_BYTES) as usize;
        let at = ((rng.next() % ((size - len) as u64 / SECTOR_BYTES)) * SECTOR_BYTES) as usize;
        let data = rng.bytes(len);
        let read_at = ((rng.next() % ((size - 65536) as u64 / SECTOR_BYTES)) * SECTOR_BYTES) as usize;
        let maintenance = started.array.maintenance();
        let (step, written, read) = block_on(async {
            futures::join!(
                maintenance.step(1 << 20),
                started.array.write(at as u64, &data, false),
                started.array.read(read_at as u64, 65536)
            )
        });
        written.unwrap();
        let read = read.unwrap().to_vec();
        let before = model[read_at..read_at + 65536].to_vec();
        model[at..at + len].copy_from_slice(&data);
        assert!(
            read == before || read[..] == model[read_at..read_at + 65536],
            "{what}: a read during the reshape returned other bytes"
        );
        steps += 1;
        match step.expect("a reshape step") {
            Step::Finished(MaintenanceWork::Reshape) => return (started, restarts),
            Step::Worked { work: MaintenanceWork::Reshape, .. } => {}
            other => panic!("{what}: unexpected step {other:?}"),
        }
        if steps % restart_every == 0 {
            drop(started);
            started = start(members);
            restarts += 1;
            assert!(started.array.shape().reshape().is_some(), "{what}: still reshaping after a restart");
            assert!(!started.array.is_read_only(), "{what}: writable after a restart");
            assert_eq!(started.array.size_bytes() as usize, size, "{what}: the size after a restart");
            check_all(&started.array, model, &format!("{what} after a restart"));
        }
        assert!(steps < 10_000, "{what}: the reshape does not end");
    }
}

/// Runs background work until there is none; the kinds of work that finished.
pub fn run_to_idle(array: &Array<dyn Member>) -> Vec<MaintenanceWork> {
    let mut finished = Vec::new();
    for _ in 0..100_000 {
        match block_on(array.maintenance().step(4 << 20)).expect("a maintenance step") {
            Step::Idle => return finished,
            Step::Finished(work) => finished.push(work),
            Step::Worked { .. } => {}
        }
    }
    panic!("background work does not end");
}

/// md's mismatch_cnt of a check over the whole array.
pub fn mismatches(array: &Array<dyn Member>) -> u64 {
    let units = array.maintenance().scrub_units();
    block_on(array.maintenance().scrub(0, units, false)).unwrap().mismatch_sectors
}

/// Copies of every member's bytes, to put back with [`restore`].
pub fn snapshot(members: &[Arc<MemoryMember>]) -> Vec<Vec<u8>> {
    members.iter().map(|m| m.snapshot()).collect()
}

pub fn restore(members: &[Arc<MemoryMember>], images: &[Vec<u8>]) {
    for (m, image) in members.iter().zip(images) {
        m.with_data(|d| d.copy_from_slice(image));
    }
}

/// Reads everything with each role failed in turn (the members put back after each).
pub fn check_each_role_missing(members: &[Arc<MemoryMember>], model: &[u8], what: &str) {
    let images = snapshot(members);
    let roles = start(members).array.geometry().raid_disks();
    for role in 0..roles {
        let s = start(members);
        block_on(s.array.admin().fail_role(role)).unwrap();
        check_all(&s.array, model, &format!("{what} without role {role}"));
        drop(s);
        restore(members, &images);
    }
}

/// Asks to remove members without naming the size: the refusal names it; then removes them
/// confirming it. Returns the new size.
pub fn remove_confirmed(array: &Array<dyn Member>, raid_disks: usize) -> u64 {
    let err = block_on(array.admin().remove_members(raid_disks, None, None, None)).unwrap_err();
    let text = err.to_string();
    let size: u64 = text
        .rsplit("--array-size ")
        .next()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or_else(|| panic!("the refusal names the size: {text}"));
    assert!(text.contains("is lost"), "{text}");
    let wrong = block_on(array.admin().remove_members(raid_disks, None, None, Some(size + 4096))).unwrap_err();
    assert!(wrong.to_string().contains(&format!("--array-size {size}")), "{wrong}");
    block_on(array.admin().remove_members(raid_disks, None, None, Some(size))).expect("the shrink starts");
    size
}
