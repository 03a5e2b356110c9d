//! Fault injection: count, range and seeded-random rules, delays, runtime arm/disarm.

use std::time::Duration;

use member_io::{FaultControl, FaultOps, Faulty};
use raid_core::{Member, MemoryMember};

use crate::util::pattern;
use raid_core::conformance::{read, write};

fn member() -> (Faulty<MemoryMember>, std::sync::Arc<FaultControl>) {
    let control = FaultControl::new();
    (Faulty::new(MemoryMember::new("m", 1 << 20), std::sync::Arc::clone(&control)), control)
}

fn is_eio(r: std::io::Result<impl Sized>) -> bool {
    matches!(r, Err(e) if e.raw_os_error() == Some(libc::EIO))
}

#[tokio::test]
async fn fail_after_n_reads_then_disarm() {
    let (m, control) = member();
    assert!(!control.is_armed());
    control.fail_after(FaultOps::Reads, 3);
    assert!(control.is_armed());
    for i in 0..3 {
        assert!(read(&m, 0, 4096).await.is_ok(), "read {i} before the fault");
    }
    assert!(is_eio(read(&m, 0, 4096).await));
    assert!(is_eio(read(&m, 8192, 512).await), "stays failed");
    assert!(write(&m, 0, &[1; 512], false).await.is_ok(), "writes unaffected by a read rule");
    assert_eq!(control.injected_failures(), 2);
    control.disarm();
    assert!(!control.is_armed());
    assert!(read(&m, 0, 4096).await.is_ok());
}

#[tokio::test]
async fn dead_disk_fails_everything_including_flush() {
    let (m, control) = member();
    control.fail_after(FaultOps::All, 0);
    assert!(is_eio(read(&m, 0, 512).await));
    assert!(is_eio(write(&m, 0, &[1; 512], false).await));
    assert!(is_eio(m.flush().await));
    assert!(is_eio(m.discard(0, 512).await));
    assert!(is_eio(m.write_zeroes(0, 512).await));
    assert_eq!(control.injected_failures(), 5);
}

#[tokio::test]
async fn range_rule_hits_only_overlapping_writes_and_leaves_data_alone() {
    let (m, control) = member();
    let before = pattern(5, 16384);
    write(&m, 0, &before, false).await.unwrap();
    control.fail_range(FaultOps::Writes, 4096..8192);
    assert!(write(&m, 0, &[9; 4096], false).await.is_ok(), "below the range");
    assert!(write(&m, 8192, &[9; 4096], false).await.is_ok(), "above the range (end exclusive)");
    assert!(is_eio(write(&m, 4096, &[7; 512], false).await));
    assert!(is_eio(write(&m, 0, &[7; 8192], false).await), "overlapping from below");
    assert!(is_eio(m.write_zeroes(6144, 4096).await), "zeroing overlaps");
    assert!(m.flush().await.is_ok(), "flush has no range");
    assert!(read(&m, 4096, 4096).await.is_ok(), "reads unaffected by a write rule");
    let now = read(&m, 4096, 4096).await.unwrap();
    assert!(now == before[4096..8192], "a failed write must not reach the inner member");
}

#[tokio::test]
async fn random_failures_are_reproducible_from_the_seed() {
    async fn outcomes(seed: u64) -> Vec<bool> {
        let (m, control) = member();
        control.fail_randomly(FaultOps::All, 0.3, seed);
        let mut v = Vec::new();
        for i in 0..200u64 {
            v.push(read(&m, (i % 256) * 4096, 4096).await.is_err());
        }
        v
    }
    let a = outcomes(42).await;
    assert_eq!(a, outcomes(42).await, "same seed, same failures");
    assert_ne!(a, outcomes(43).await, "another seed, other failures");
    let failed = a.iter().filter(|&&f| f).count();
    assert!((30..=90).contains(&failed), "p=0.3 over 200 ops failed {failed}");
}

#[tokio::test(start_paused = true)]
async fn delay_makes_member_slow_and_is_switchable() {
    let (m, control) = member();
    control.set_delay(Duration::from_millis(250));
    let t0 = tokio::time::Instant::now();
    read(&m, 0, 512).await.unwrap();
    assert_eq!(t0.elapsed(), Duration::from_millis(250));
    control.set_delay(Duration::ZERO);
    let t0 = tokio::time::Instant::now();
    read(&m, 0, 512).await.unwrap();
    assert_eq!(t0.elapsed(), Duration::ZERO);
}

#[tokio::test]
async fn one_control_governs_several_members() {
    let control = FaultControl::new();
    let a = Faulty::new(MemoryMember::new("a", 4096), std::sync::Arc::clone(&control));
    let b = Faulty::new(MemoryMember::new("b", 4096), std::sync::Arc::clone(&control));
    control.fail_after(FaultOps::Reads, 0);
    assert!(is_eio(read(&a, 0, 512).await) && is_eio(read(&b, 0, 512).await));
    assert_eq!(control.ops_seen(), 2);
}

/// A corrupting member answers without an error: reads in the range come back with one byte
/// per 4 KiB inverted, writes in the range store such bytes (the caller's buffer untouched),
/// nothing outside the range changes, and disarming stops it (what was stored stays wrong).
#[tokio::test]
async fn corrupt_rules_return_and_store_wrong_bytes_without_an_error() {
    let (m, control) = member();
    let data = pattern(9, 32768);
    write(&m, 0, &data, false).await.unwrap();
    control.corrupt_range(FaultOps::Reads, 8192..16384);
    let got = read(&m, 0, 32768).await.unwrap();
    let differ: Vec<usize> = (0..got.len()).filter(|&i| got[i] != data[i]).collect();
    assert_eq!(differ, vec![8192, 12288], "one inverted byte per 4 KiB block of the range");
    assert!(m.inner().snapshot()[..32768] == data[..], "a corrupt read changes nothing stored");
    control.disarm();
    control.corrupt_range(FaultOps::Writes, 20480..24576);
    let fresh = pattern(10, 8192);
    let buf = raid_core::AlignedBuf::from_slice(&fresh);
    let (res, back) = m.write_at(16384, buf, false).await;
    res.unwrap();
    assert!(back.as_slice() == &fresh[..], "the caller's buffer is not changed");
    write(&m, 24576, &fresh[..4096], false).await.unwrap();
    control.disarm();
    let stored = m.inner().snapshot();
    let differ: Vec<usize> =
        (16384..28672).filter(|&i| stored[i] != [&fresh[..], &fresh[..4096]].concat()[i - 16384]).collect();
    assert_eq!(differ, vec![20480], "the stored copy is wrong in the range only, and stays so");
    assert_eq!(control.corrupted_bytes(), 3);
}
