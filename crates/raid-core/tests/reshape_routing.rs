//! An array found mid-reshape (md's `reshape_position`, two geometries) serves every byte from
//! the layout it lies in: sectors on the reshaped side of the front from the new layout
//! (placed `shift` sectors after the data origin), the rest from the previous one; a request
//! that straddles the front is split at it; writes land in the layout their sectors are in;
//! a member lost is rebuilt from each layout's own parity. Forward (growing: below the front
//! is new) and backward (shrinking: at and above the front is new).

use std::sync::Arc;

use futures::executor::block_on;
use raid_core::SECTOR_BYTES;
use raid_core::engine::{Array, ArrayBuilder, Direction, Layout, ParityLogConfig, RoleMember};
use raid_core::geometry::{Geometry, Level};
use raid_core::member::MemoryMember;

const CHUNK: u32 = 16;
/// Sectors each layout uses on a member.
const MEMBER_SECTORS: u64 = 512;
/// Where the new layout starts on every member, after the previous one.
const SHIFT: u64 = 1024;

/// A seeded xorshift generator (replayable, no dependency).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn raid5(disks: usize) -> Geometry {
    Geometry::new(Level::Raid5, 2, CHUNK, &vec![MEMBER_SECTORS; disks]).unwrap()
}

fn roles(
    members: &[Arc<MemoryMember>],
    count: usize,
    data_offset_sectors: u64,
) -> Vec<Option<RoleMember<MemoryMember>>> {
    (0..count)
        .map(|r| {
            Some(RoleMember {
                member: members[r].clone(),
                data_offset_bytes: data_offset_sectors * SECTOR_BYTES,
                recovery_offset_sectors: None,
                device_id: r,
            })
        })
        .collect()
}

/// A settled array of `disks` members of `members` whose data starts `at` sectors in.
fn settled(members: &[Arc<MemoryMember>], disks: usize, at: u64) -> Array<MemoryMember> {
    ArrayBuilder::new(raid5(disks), roles(members, disks, at)).build().unwrap()
}

fn write(array: &Array<MemoryMember>, sector: u64, data: &[u8]) {
    block_on(array.write(sector * SECTOR_BYTES, data, false)).unwrap();
}

fn read(array: &Array<MemoryMember>, sector: u64, sectors: u64) -> Vec<u8> {
    block_on(array.read(sector * SECTOR_BYTES, (sectors * SECTOR_BYTES) as usize)).unwrap().to_vec()
}

/// Members holding `model` laid out mid-reshape: with `direction`, the sectors on the new
/// side of `front` in the 5-member layout at `SHIFT`, the others in the 4-member one at 0.
fn prepared(model: &[u8], front: u64, direction: Direction) -> Vec<Arc<MemoryMember>> {
    let members: Vec<Arc<MemoryMember>> =
        (0..5).map(|r| Arc::new(MemoryMember::new(format!("m{r}"), (SHIFT + MEMBER_SECTORS) * SECTOR_BYTES))).collect();
    let (old, new) = (settled(&members, 4, 0), settled(&members, 5, SHIFT));
    let sectors = model.len() as u64 / SECTOR_BYTES;
    let (new_range, old_range) = match direction {
        Direction::Forward => (0..front, front..sectors),
        Direction::Backward => (front..sectors, 0..front),
    };
    let bytes = |r: &std::ops::Range<u64>| &model[(r.start * SECTOR_BYTES) as usize..(r.end * SECTOR_BYTES) as usize];
    write(&new, new_range.start, bytes(&new_range));
    write(&old, old_range.start, bytes(&old_range));
    members
}

fn mid_reshape(members: &[Arc<MemoryMember>], front: u64, direction: Direction) -> Array<MemoryMember> {
    ArrayBuilder::new(raid5(5), roles(members, 5, 0))
        .reshaping(Layout::settled(raid5(4)), SHIFT, front, direction)
        .build()
        .unwrap()
}

fn check_routing(direction: Direction) {
    let export = raid5(4).array_sectors(); // 1536: the smaller layout
    // A multiple of the new stripe (64 sectors), inside a stripe of the previous one (48).
    let front = match direction {
        Direction::Forward => 640,
        Direction::Backward => 896,
    };
    let mut rng = Rng(0x5eed_0001 + front);
    let mut model = rng.bytes((export * SECTOR_BYTES) as usize);
    let members = prepared(&model, front, direction);
    let array = mid_reshape(&members, front, direction);
    assert_eq!(array.size_bytes(), export * SECTOR_BYTES, "the export is the smaller layout");
    assert_eq!(array.shape().reshape().map(|r| r.front_sectors), Some(front));
    assert_eq!(read(&array, 0, export), model, "{direction:?}: every byte from its layout");
    assert_eq!(read(&array, front - 24, 48), model[((front - 24) * 512) as usize..((front + 24) * 512) as usize]);

    // Writes anywhere, many straddling the front, each checked against the model.
    for i in 0..200 {
        let len = 1 + rng.next() % 96;
        let start = if i % 3 == 0 { front.saturating_sub(rng.next() % len) } else { rng.next() % (export - len) };
        let start = start.min(export - len);
        let data = rng.bytes((len * SECTOR_BYTES) as usize);
        write(&array, start, &data);
        model[(start * 512) as usize..((start + len) * 512) as usize].copy_from_slice(&data);
        let at = rng.next() % (export - 64);
        assert_eq!(read(&array, at, 64), model[(at * 512) as usize..((at + 64) * 512) as usize]);
    }
    assert_eq!(read(&array, 0, export), model);

    // Each side landed in its own layout, consistent with its own parity.
    let (old, new) = (settled(&members, 4, 0), settled(&members, 5, SHIFT));
    let slice = |r: std::ops::Range<u64>| &model[(r.start * 512) as usize..(r.end * 512) as usize];
    let (new_range, old_range) = match direction {
        Direction::Forward => (0..front, front..export),
        Direction::Backward => (front..export, 0..front),
    };
    assert_eq!(read(&new, new_range.start, new_range.end - new_range.start), slice(new_range.clone()));
    assert_eq!(read(&old, old_range.start, old_range.end - old_range.start), slice(old_range.clone()));
    for (array, what) in [(&old, "previous"), (&new, "new")] {
        let units = array.maintenance().scrub_units();
        let counts = block_on(array.maintenance().scrub(0, units, false)).unwrap();
        assert_eq!(counts.mismatch_sectors, 0, "{direction:?}: the {what} layout's parity matches its data");
    }

    // One member lost: both layouts rebuild its blocks from their own parity.
    let array = mid_reshape(&members, front, direction);
    block_on(array.admin().fail_role(2)).unwrap();
    assert_eq!(read(&array, 0, export), model, "{direction:?}: degraded reads");
    let data = rng.bytes((96 * SECTOR_BYTES) as usize);
    write(&array, front - 48, &data);
    model[((front - 48) * 512) as usize..((front + 48) * 512) as usize].copy_from_slice(&data);
    assert_eq!(read(&array, 0, export), model, "{direction:?}: degraded writes across the front");
}

#[test]
fn a_forward_reshape_serves_below_the_front_from_the_new_layout() {
    check_routing(Direction::Forward);
}

#[test]
fn a_backward_reshape_serves_from_the_front_up_from_the_new_layout() {
    check_routing(Direction::Backward);
}

#[test]
fn members_too_small_for_either_layout_and_logged_arrays_are_refused() {
    let members: Vec<Arc<MemoryMember>> =
        (0..5).map(|r| Arc::new(MemoryMember::new(format!("m{r}"), SHIFT * SECTOR_BYTES))).collect();
    let err = ArrayBuilder::new(raid5(5), roles(&members, 5, 0))
        .reshaping(Layout::settled(raid5(4)), SHIFT, 0, Direction::Forward)
        .build()
        .map(|_| ())
        .unwrap_err();
    assert!(err.to_string().contains("needs"), "{err}");
    let members = prepared(&vec![0; (raid5(4).array_sectors() * SECTOR_BYTES) as usize], 0, Direction::Forward);
    let ppl = ParityLogConfig { area_offset_bytes: 0, area_bytes: 1 << 20, signature: 1, max_data_crcs: 0 };
    let err = ArrayBuilder::new(raid5(5), roles(&members, 5, 0))
        .reshaping(Layout::settled(raid5(4)), SHIFT, 0, Direction::Forward)
        .parity_log(ppl)
        .build()
        .map(|_| ())
        .unwrap_err();
    assert!(err.to_string().contains("reshapes no array"), "{err}");
}
