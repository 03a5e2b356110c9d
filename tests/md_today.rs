//! md as today's kernels write it: an array whose logical block size Linux 6.19+ recorded in
//! the superblock (byte 224, formerly padding) is served in that block size and keeps it
//! across raidnbd's own superblock writes; arrays with a bitmap raidnbd cannot keep (md's
//! lockless bitmap of Linux 6.18+, md-cluster's) are refused naming it, never run without it.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

use raid_core::md::{SUPERBLOCK_BYTE_OFFSET, sb_checksum};

use crate::util::{Served, assert_ok, assert_user_error, raidnbd, require_tool, run_ok, tempdir};

fn read_at(path: &Path, at: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    std::fs::File::open(path).unwrap().read_exact_at(&mut buf, at).unwrap();
    buf
}

fn write_at(path: &Path, at: u64, bytes: &[u8]) {
    OpenOptions::new().write(true).open(path).unwrap().write_all_at(bytes, at).unwrap();
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// The superblock of `member` (the first 4 KiB at byte 4096).
fn superblock(member: &Path) -> Vec<u8> {
    read_at(member, SUPERBLOCK_BYTE_OFFSET, 4096)
}

/// Sets byte `at` of `member`'s superblock to `value` (u32) and fixes its checksum, as a
/// newer md would have written it.
fn patch_superblock(member: &Path, at: usize, value: u32) {
    let mut sb = superblock(member);
    sb[at..at + 4].copy_from_slice(&value.to_le_bytes());
    let csum = sb_checksum(&sb, le32(&sb, 220));
    sb[216..220].copy_from_slice(&csum.to_le_bytes());
    write_at(member, SUPERBLOCK_BYTE_OFFSET, &sb);
}

/// Whether `member`'s superblock checksum is right.
fn checksum_ok(member: &Path) -> bool {
    let sb = superblock(member);
    le32(&sb, 216) == sb_checksum(&sb, le32(&sb, 220))
}

#[test]
fn an_array_whose_block_size_linux_recorded_is_served_in_it_and_keeps_it() {
    require_tool("nbdinfo", "libnbd-bin");
    let dir = tempdir();
    let d = dir.path();
    let members = ["m0", "m1", "m2"];
    assert_ok(&raidnbd(d, &["create", "--level", "5", "--size", "64M", "m0", "m1", "m2"]));
    for m in members {
        patch_superblock(&d.join(m), 224, 4096);
    }
    let detail = assert_ok(&raidnbd(d, &["detail", "m0", "m1", "m2"]));
    assert!(detail.contains("Logical Block Size : 4096 bytes"), "{detail}");
    assert!(detail.contains("Linux 6.18 and older refuse this array"), "{detail}");

    let served = Served::start(d, "a", &[], &members);
    let info = run_ok(Command::new("nbdinfo").args(["--json", &served.uri("a")]));
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["exports"][0]["block_size_minimum"], 4096, "{info}");
    // A write makes raidnbd rewrite every superblock (dirty, then clean at the stop).
    let data = vec![0x5a_u8; 1 << 20];
    std::fs::write(d.join("data"), &data).unwrap();
    run_ok(Command::new("nbdcopy").args([d.join("data").to_str().unwrap(), &served.uri("a")]));
    served.stop();
    for m in members {
        let sb = superblock(&d.join(m));
        assert_eq!(le32(&sb, 224), 4096, "{m}: the recorded block size survives raidnbd's writes");
        assert!(checksum_ok(&d.join(m)), "{m}: checksum");
        assert!(sb[228..256].iter().all(|&b| b == 0), "{m}: the padding stays zero");
    }

    // A value no kernel writes is refused with the field's name, not as padding.
    patch_superblock(&d.join("m0"), 224, 3000);
    let out = raidnbd(d, &["examine", "m0"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success() && text.contains("logical_block_size 3000 (byte 224"), "{text}");
}

/// Byte offset of the internal bitmap on a member of an array raidnbd created with one.
fn bitmap_at(member: &Path) -> u64 {
    let sb = superblock(member);
    assert_ne!(le32(&sb, 8) & 1, 0, "the array has an internal bitmap");
    (SUPERBLOCK_BYTE_OFFSET as i64 + i64::from(le32(&sb, 96) as i32) * 512) as u64
}

#[test]
fn arrays_with_a_bitmap_raidnbd_cannot_keep_are_refused_by_name() {
    let dir = tempdir();
    let d = dir.path();
    let members = ["m0", "m1"];
    let create = ["create", "--level", "1", "--consistency-policy", "bitmap", "--size", "64M", "m0", "m1"];
    assert_ok(&raidnbd(d, &create));
    for (version, needle) in [(6u32, "md's lockless bitmap (mdadm --bitmap=lockless, Linux 6.18"), (5, "clustered")] {
        for m in members {
            write_at(&d.join(m), bitmap_at(&d.join(m)) + 4, &version.to_le_bytes());
        }
        let out = raidnbd(d, &["serve", "--listen", "127.0.0.1:0", "--export", "a", "m0", "m1"]);
        assert_user_error(&out, needle);
        assert_user_error(&out, "which raidnbd does not keep");
    }
    // Version 3 (host-endian bitmaps of old kernels) is version 4 on this host: served.
    for m in members {
        write_at(&d.join(m), bitmap_at(&d.join(m)) + 4, &3u32.to_le_bytes());
    }
    let served = Served::start(d, "a", &[], &members);
    served.stop();
    assert_eq!(le32(&read_at(&d.join("m0"), bitmap_at(&d.join("m0")), 8), 4), 3, "written back as read");
}
