//! `Array::read_in_place`: the member-file extents it hands out hold exactly the bytes a
//! normal read returns, on every level without parity, and never name a copy that is
//! failed or not yet rebuilt there; everything else reads normally (`None`).
//! `Array::write_in_place`: on linear and raid0, bytes put where its extents say are what
//! reads return; every other level, and members not in memory, write normally.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use futures::executor::block_on;
use raid_core::engine::{Array, ArrayBuilder, FileExtent, RoleMember};
use raid_core::geometry::{Geometry, Level};
use raid_core::member::{BufResult, IoFuture, Member, MemoryMember};
use raid_core::{AlignedBuf, SECTOR_BYTES};

const DATA_OFFSET_BYTES: u64 = 1 << 20;
const CHUNK_SECTORS: u32 = 128; // 64 KiB
const MEMBER_DATA_SECTORS: u64 = 16 << 11; // 16 MiB

/// A member that is a file on /dev/shm, read and written with plain pread/pwrite, and
/// offered for in-place reads and writes.
struct ShmMember {
    name: String,
    file: Arc<File>,
    len_bytes: u64,
    _dir: tempfile::TempDir,
}

impl ShmMember {
    fn new(name: &str) -> Arc<Self> {
        let dir = tempfile::tempdir_in("/dev/shm").expect("/dev/shm");
        let file = File::create_new(dir.path().join(name)).unwrap();
        let len_bytes = DATA_OFFSET_BYTES + MEMBER_DATA_SECTORS * SECTOR_BYTES;
        file.set_len(len_bytes).unwrap();
        Arc::new(Self { name: name.into(), file: Arc::new(file), len_bytes, _dir: dir })
    }

    /// Overwrites the member's data area with a byte no test writes through the array.
    fn scribble(&self, from_sector: u64) {
        let at = DATA_OFFSET_BYTES + from_sector * SECTOR_BYTES;
        self.file.write_all_at(&vec![0xEE; (self.len_bytes - at) as usize], at).unwrap();
    }
}

impl Member for ShmMember {
    fn name(&self) -> &str {
        &self.name
    }
    fn len_bytes(&self) -> u64 {
        self.len_bytes
    }
    fn read_at(&self, offset_bytes: u64, mut buf: AlignedBuf) -> IoFuture<'_, BufResult> {
        let res = self.file.read_exact_at(buf.as_mut_slice(), offset_bytes);
        Box::pin(std::future::ready((res, buf)))
    }
    fn write_at(&self, offset_bytes: u64, buf: AlignedBuf, _fua: bool) -> IoFuture<'_, BufResult> {
        let res = self.file.write_all_at(buf.as_slice(), offset_bytes);
        Box::pin(std::future::ready((res, buf)))
    }
    fn memory_file(&self, offset_bytes: u64, len_bytes: u64) -> Option<Arc<File>> {
        (offset_bytes + len_bytes <= self.len_bytes).then(|| Arc::clone(&self.file))
    }
    fn memory_file_for_write(&self, offset_bytes: u64, len_bytes: u64) -> Option<Arc<File>> {
        self.memory_file(offset_bytes, len_bytes)
    }
    fn flush(&self) -> IoFuture<'_, io::Result<()>> {
        Box::pin(std::future::ready(Ok(())))
    }
    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        self.write_zeroes(offset_bytes, len_bytes)
    }
    fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        let res = self.file.write_all_at(&vec![0; len_bytes as usize], offset_bytes);
        Box::pin(std::future::ready(res))
    }
}

fn array_of(
    level: Level,
    layout: u32,
    members: &[Arc<dyn Member>],
    recovering: Option<(usize, u64)>,
) -> Array<dyn Member> {
    let geometry = Geometry::new(level, layout, CHUNK_SECTORS, &vec![MEMBER_DATA_SECTORS; members.len()]).unwrap();
    let roles = members
        .iter()
        .enumerate()
        .map(|(role, m)| {
            Some(RoleMember {
                member: Arc::clone(m),
                data_offset_bytes: DATA_OFFSET_BYTES,
                recovery_offset_sectors: recovering.filter(|r| r.0 == role).map(|r| r.1),
                device_id: role,
            })
        })
        .collect();
    ArrayBuilder::new(geometry, roles).build().unwrap()
}

fn shm_members(n: usize) -> Vec<Arc<ShmMember>> {
    (0..n).map(|i| ShmMember::new(&format!("m{i}"))).collect()
}

fn as_dyn(members: &[Arc<ShmMember>]) -> Vec<Arc<dyn Member>> {
    members.iter().map(|m| Arc::clone(m) as Arc<dyn Member>).collect()
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_add(seed).wrapping_mul(2654435761) >> 11) as u8).collect()
}

/// The bytes the extents name, read from their files now.
fn bytes_of(extents: &[FileExtent]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in extents {
        let mut piece = vec![0u8; e.len_bytes as usize];
        e.file.read_exact_at(&mut piece, e.offset_bytes).unwrap();
        out.extend_from_slice(&piece);
    }
    out
}

/// Requests of many shapes (within a chunk, across chunks and members, unaligned to
/// chunks) all match what `read` returns and what was written.
fn check_matches_reads(array: &Array<dyn Member>, written: &[u8], at: u64) {
    for (offset, len) in
        [(0u64, 512usize), (4096, 1 << 20), (65024, 3 << 17), (at, written.len()), (at + 512, 777 * 512)]
    {
        let extents = array.read_in_place(offset, len).unwrap().expect("in place");
        assert_eq!(extents.iter().map(|e| e.len_bytes).sum::<u64>(), len as u64);
        let direct = block_on(array.read(offset, len)).unwrap().to_vec();
        assert!(bytes_of(&extents) == direct, "in-place bytes differ from read at {offset}+{len}");
        if offset >= at && offset + len as u64 <= at + written.len() as u64 {
            let from = (offset - at) as usize;
            assert!(direct == written[from..from + len], "read differs from what was written at {offset}+{len}");
        }
    }
}

#[test]
fn every_level_without_parity_reads_in_place() {
    for (level, layout, n) in
        [(Level::Linear, 0, 2), (Level::Raid0, 0, 3), (Level::Raid1, 0, 2), (Level::Raid10, 0x102, 4)]
    {
        let members = shm_members(n);
        let array = array_of(level, layout, &as_dyn(&members), None);
        let written = pattern(5 << 20, n as u32);
        let at = 3 << 20;
        block_on(array.write(at, &written, false)).unwrap();
        check_matches_reads(&array, &written, at);
        // Adjacent pieces on one file become one extent: a linear read inside one member
        // is a single extent, a raid0 read of three chunks is three.
        let one = array.read_in_place(at, 1 << 20).unwrap().unwrap();
        match level {
            Level::Linear => assert_eq!(one.len(), 1, "{level}"),
            Level::Raid0 => assert_eq!(array.read_in_place(0, 3 * 65536).unwrap().unwrap().len(), 3, "{level}"),
            _ => {}
        }
    }
}

#[test]
fn failed_and_unrebuilt_copies_are_never_named() {
    let written = pattern(4 << 20, 7);
    // raid1, role 0 failed after the write: its file is scribbled over, yet the bytes match.
    let members = shm_members(2);
    let array = array_of(Level::Raid1, 0, &as_dyn(&members), None);
    block_on(array.write(0, &written, false)).unwrap();
    block_on(array.admin().fail_role(0)).unwrap();
    members[0].scribble(0);
    check_matches_reads(&array, &written, 0);

    // raid1 whose role 1 is rebuilt up to 2 MiB: beyond that only role 0 may be named.
    let members = shm_members(2);
    let array = array_of(Level::Raid1, 0, &as_dyn(&members), None);
    block_on(array.write(0, &written, false)).unwrap();
    drop(array);
    let rebuilt_sectors = (2 << 20) / SECTOR_BYTES;
    members[1].scribble(rebuilt_sectors);
    let array = array_of(Level::Raid1, 0, &as_dyn(&members), Some((1, rebuilt_sectors)));
    check_matches_reads(&array, &written, 0);
}

#[test]
fn parity_levels_and_members_not_in_memory_read_normally() {
    let members = shm_members(3);
    let raid5 = array_of(Level::Raid5, 2, &as_dyn(&members), None);
    assert!(raid5.read_in_place(0, 1 << 20).unwrap().is_none());

    let mixed: Vec<Arc<dyn Member>> = vec![
        ShmMember::new("m0"),
        Arc::new(MemoryMember::new("mem", DATA_OFFSET_BYTES + MEMBER_DATA_SECTORS * SECTOR_BYTES)),
    ];
    let raid0 = array_of(Level::Raid0, 0, &mixed, None);
    assert!(raid0.read_in_place(0, 65536).unwrap().is_some(), "a chunk on the file");
    assert!(raid0.read_in_place(0, 2 * 65536).unwrap().is_none(), "a chunk in memory");

    // Requests the array refuses are errors, as for `read`.
    assert!(raid0.read_in_place(raid0.size_bytes(), 512).is_err());
    assert!(raid0.read_in_place(100, 512).is_err());
}

/// Writes `data` where `extents` say, as the NBD server's socket receive does.
fn put_in_place(extents: &[FileExtent], data: &[u8]) {
    assert_eq!(extents.iter().map(|e| e.len_bytes).sum::<u64>(), data.len() as u64, "extents cover the write");
    let mut at = 0usize;
    for e in extents {
        e.file.write_all_at(&data[at..at + e.len_bytes as usize], e.offset_bytes).unwrap();
        at += e.len_bytes as usize;
    }
}

#[test]
fn linear_and_raid0_take_writes_in_place() {
    let member_bytes = MEMBER_DATA_SECTORS * SECTOR_BYTES;
    for (level, n) in [(Level::Linear, 2), (Level::Raid0, 3)] {
        let members = shm_members(n);
        let array = array_of(level, 0, &as_dyn(&members), None);
        // Within a chunk, across chunks and members, unaligned to chunks, across the end of
        // linear's first member; later writes overlap earlier ones.
        let shapes = [(0u64, 512usize), (65024, 3 << 17), (member_bytes - (1 << 20), 2 << 20), (4096, 1 << 20)];
        for (i, (offset, len)) in shapes.into_iter().enumerate() {
            let data = pattern(len, 100 + i as u32);
            let extents = block_on(array.write_in_place(offset, len)).unwrap().expect("in place");
            put_in_place(&extents, &data);
            let read = block_on(array.read(offset, len)).unwrap().to_vec();
            assert!(read == data, "{level}: read differs from the in-place write at {offset}+{len}");
        }
        // Adjacent pieces on one file are one extent: linear inside one member is a single
        // extent, three raid0 chunks are three (on three members).
        let extents = block_on(array.write_in_place(0, 3 * 65536)).unwrap().unwrap();
        assert_eq!(extents.len(), if level == Level::Linear { 1 } else { 3 }, "{level}");
    }
}

#[test]
fn copies_parity_and_members_not_in_memory_write_normally() {
    for (level, layout, n) in [(Level::Raid1, 0, 2), (Level::Raid10, 0x102, 4), (Level::Raid5, 2, 3)] {
        let array = array_of(level, layout, &as_dyn(&shm_members(n)), None);
        assert!(block_on(array.write_in_place(0, 1 << 20)).unwrap().is_none(), "{level}");
    }
    let mixed: Vec<Arc<dyn Member>> = vec![
        ShmMember::new("m0"),
        Arc::new(MemoryMember::new("mem", DATA_OFFSET_BYTES + MEMBER_DATA_SECTORS * SECTOR_BYTES)),
    ];
    let raid0 = array_of(Level::Raid0, 0, &mixed, None);
    assert!(block_on(raid0.write_in_place(0, 65536)).unwrap().is_some(), "a chunk on the file");
    assert!(block_on(raid0.write_in_place(0, 2 * 65536)).unwrap().is_none(), "a chunk in memory");

    // Requests the array refuses are errors, as for `write`.
    assert!(block_on(raid0.write_in_place(raid0.size_bytes(), 512)).is_err(), "past the end");
    assert!(block_on(raid0.write_in_place(100, 512)).is_err(), "unaligned");
    raid0.set_read_only(true);
    assert!(block_on(raid0.write_in_place(0, 65536)).is_err(), "read-only");
}
