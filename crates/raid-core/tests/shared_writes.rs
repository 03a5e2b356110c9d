//! Writes of shared bytes (`Array::write_shared`: the NBD server's receive buffer, reference-
//! counted) leave every member exactly as the same writes borrowed (`Array::write`) do, on
//! every level, whole and degraded, with and without a partial parity log; and on the way to
//! the members no byte of a 4 KiB-aligned shared payload is copied (`copy_count`: mirror
//! legs, raid0 chunks and raid4/5/6 data blocks are slices of the payload, parity is computed
//! from them in place, a member's run of several blocks is one gathering write).
//!
//! One test: the copy counter is per process, and nothing else may copy while it counts.

use bytes::Bytes;
use futures::executor::block_on;
use raid_core::geometry::Level;
use raid_core::{AlignedBuf, copy_count};

mod md_common;

use md_common::in_memory::{self, Rng, check_all, mismatches, start};

const MEMBER_BYTES: u64 = 8 << 20;

struct Case {
    level: Level,
    disks: usize,
    ppl: bool,
    failed_role: Option<usize>,
}

/// Runs the same writes borrowed on one copy of the array and shared on another; returns the
/// bytes the shared writes copied.
fn shared_writes_match_borrowed(case: &Case, seed: u64) -> u64 {
    let what = format!("{:?} x{} ppl={} failed={:?}", case.level, case.disks, case.ppl, case.failed_role);
    let create = || in_memory::create(case.level, None, case.disks, 0, case.ppl, MEMBER_BYTES);
    let (borrowed_members, shared_members) = (create(), create());
    let (borrowed, shared) = (start(&borrowed_members), start(&shared_members));
    if let Some(role) = case.failed_role {
        block_on(borrowed.array.admin().fail_role(role)).unwrap();
        block_on(shared.array.admin().fail_role(role)).unwrap();
    }
    let size = shared.array.size_bytes();
    let mut model = vec![0u8; size as usize];
    let mut rng = Rng(seed);
    let mut copied = 0;
    for i in 0..160 {
        let len = match rng.next() % 6 {
            0 => 4096,
            1 => 64 << 10,
            2 => 192 << 10,
            3 => 1 << 20,
            4 => (1 + rng.next() % 96) as usize * 4096,
            _ => (1 + rng.next() % 40) as usize * 512,
        };
        let aligned = len.is_multiple_of(4096);
        let unit = if aligned { 4096 } else { 512 };
        let offset = rng.next() % ((size - len as u64) / unit) * unit;
        let data = rng.bytes(len);
        let fua = rng.next().is_multiple_of(5);
        block_on(borrowed.array.write(offset, &data, fua)).unwrap_or_else(|e| panic!("{what}: borrowed write: {e}"));
        // Mostly page-aligned memory (as the NBD server receives into); some 1 byte off.
        let payload = if i % 4 == 3 {
            let mut odd = vec![0u8; len + 1];
            odd[1..].copy_from_slice(&data);
            Bytes::from(odd).slice(1..)
        } else {
            Bytes::from_owner(AlignedBuf::from_slice(&data))
        };
        let before = copy_count::copied_bytes();
        block_on(shared.array.write_shared(offset, payload, fua))
            .unwrap_or_else(|e| panic!("{what}: shared write: {e}"));
        if aligned && offset.is_multiple_of(4096) {
            copied += copy_count::copied_bytes() - before;
        }
        model[offset as usize..offset as usize + len].copy_from_slice(&data);
    }
    for (i, (b, s)) in borrowed_members.iter().zip(&shared_members).enumerate() {
        assert!(b.snapshot() == s.snapshot(), "{what}: member {i} differs between borrowed and shared writes");
    }
    check_all(&shared.array, &model, &what);
    if case.failed_role.is_none() && case.level != Level::Raid0 {
        assert_eq!(mismatches(&shared.array), 0, "{what}: redundancy disagrees with the data");
    }
    copied
}

#[test]
fn shared_writes_store_what_borrowed_writes_do_and_copy_nothing() {
    let whole = |level, disks| Case { level, disks, ppl: false, failed_role: None };
    let cases = [
        whole(Level::Raid0, 3),
        whole(Level::Raid1, 3),
        whole(Level::Raid10, 4),
        whole(Level::Raid4, 4),
        whole(Level::Raid5, 4),
        whole(Level::Raid6, 5),
        Case { level: Level::Raid5, disks: 4, ppl: true, failed_role: None },
        Case { level: Level::Raid1, disks: 3, ppl: false, failed_role: Some(0) },
        Case { level: Level::Raid10, disks: 4, ppl: false, failed_role: Some(1) },
        Case { level: Level::Raid5, disks: 4, ppl: false, failed_role: Some(2) },
        Case { level: Level::Raid6, disks: 5, ppl: false, failed_role: Some(4) },
    ];
    for (i, case) in cases.iter().enumerate() {
        let copied = shared_writes_match_borrowed(case, 0x5eed + i as u64);
        assert_eq!(
            copied, 0,
            "{:?} x{} ppl={}: shared, aligned writes copied {copied} bytes",
            case.level, case.disks, case.ppl
        );
    }
}
