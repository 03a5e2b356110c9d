//! An array as sparse as its members (issue 35): `base:allocation` through the geometry, so
//! `nbdinfo --map` and `qemu-img map` of a fresh RAID5 or RAID10 of sparse 64 GiB members
//! show one hole, nbdcopy of it makes a sparse copy, and after a 100 MiB write the maps show
//! that range as data (a RAID5 stripe's other chunks as allocated zeros, parity being
//! written there); a rebuild onto a spare copies what the members hold, not 64 GiB, with
//! local and remote (nbdkit) members, and a check afterwards finds nothing.

use serde_json::Value;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use crate::ctl_rebuild::{all_in_sync, ctl, wait_for};
use crate::remote_members::{Peers, nbdkit_file, new_file};
use crate::util::*;

const MEMBER_SIZE: &str = "64G";
const CHUNK_BYTES: u64 = 512 << 10;

/// `nbdinfo --map=CONTEXT --json` of `uri`: (offset, length, flags).
fn map_of(context: &str, uri: &str) -> Vec<(u64, u64, u64)> {
    let out = run_ok(Command::new("nbdinfo").args([&format!("--map={context}"), "--json", uri]));
    let extents: Vec<Value> = serde_json::from_str(&out).unwrap_or_else(|e| panic!("nbdinfo --map: {e}: {out}"));
    extents
        .iter()
        .map(|e| (e["offset"].as_u64().unwrap(), e["length"].as_u64().unwrap(), e["type"].as_u64().unwrap()))
        .collect()
}

/// `base:allocation` of `uri`: (offset, length, NBD_STATE_* flags).
fn map(uri: &str) -> Vec<(u64, u64, u64)> {
    map_of("base:allocation", uri)
}

/// Bytes of `file` on disk.
fn allocated_bytes(file: &Path) -> u64 {
    std::fs::metadata(file).unwrap().blocks() * 512
}

fn sparse_maps_and_copies(level: &str) {
    for (tool, package) in
        [("nbdinfo", "libnbd-bin"), ("nbdcopy", "libnbd-bin"), ("qemu-img", "qemu-utils"), ("qemu-io", "qemu-utils")]
    {
        require_tool(tool, package);
    }
    let dir = tempdir();
    let d = dir.path();
    assert_ok(&raidnbd(d, &["create", "--level", level, "--size", MEMBER_SIZE, "m0", "m1", "m2", "m3"]));
    let served = Served::start(d, "a", &[], &["m0", "m1", "m2", "m3"]);
    let uri = served.uri("a");
    let size = run_ok(Command::new("nbdinfo").args(["--size", &uri])).trim().parse::<u64>().unwrap();
    assert!(size > 60 << 30, "{level}: a large array ({size} bytes)");

    // Fresh: one hole, in both tools' eyes, and a copy that allocates nothing.
    assert_eq!(map(&uri), vec![(0, size, 3)], "raid{level}: a fresh array is one hole");
    let qemu_map: Vec<Value> =
        serde_json::from_str(&run_ok(Command::new("qemu-img").args(["map", "--output=json", "-f", "raw", &uri])))
            .unwrap();
    assert!(
        qemu_map.iter().all(|e| e["data"] == false && e["zero"] == true),
        "raid{level}: qemu-img map shows no data: {qemu_map:?}"
    );
    let copy = d.join("copy.raw");
    run_ok(Command::new("nbdcopy").arg(&uri).arg(&copy));
    assert_eq!(std::fs::metadata(&copy).unwrap().len(), size);
    assert!(allocated_bytes(&copy) < 1 << 20, "raid{level}: the copy is sparse ({} bytes)", allocated_bytes(&copy));
    std::fs::remove_file(&copy).unwrap();

    // 100 MiB written at an offset that is not chunk aligned.
    let (w0, w1) = ((10 << 30) + (64 << 10), (10 << 30) + (64 << 10) + (100 << 20));
    run_ok(Command::new("qemu-io").args(["-f", "raw", &uri, "-c", &format!("write -P 0x5c {w0} {}", w1 - w0)]));
    let extents = map(&uri);
    assert_eq!(extents.iter().map(|e| e.1).sum::<u64>(), size, "raid{level}: the map covers the array");
    // Rounded out to the stripes the write touched (raid5: 3 data chunks; raid10: exact).
    let unit = if level == "5" { 3 * CHUNK_BYTES } else { 4096 };
    let (r0, r1) = (w0 / unit * unit, w1.div_ceil(unit) * unit);
    for &(offset, len, flags) in &extents {
        let end = offset + len;
        let inside = |a: u64, b: u64| offset >= a && end <= b;
        match flags {
            0 => assert!(inside(w0, w1), "raid{level}: data only where written: {offset}+{len}"),
            2 => assert!(inside(r0, r1), "raid{level}: allocated zeros only in the stripes written: {offset}+{len}"),
            3 => assert!(end <= w0 || offset >= w1, "raid{level}: nothing written is a hole: {offset}+{len}"),
            other => panic!("raid{level}: unexpected flags {other} at {offset}+{len}"),
        }
    }
    let data: u64 = extents.iter().filter(|e| e.2 == 0).map(|e| e.1).sum();
    assert_eq!(data, w1 - w0, "raid{level}: exactly the written bytes are data: {extents:?}");

    // The copy holds the write and nothing else allocated beyond those stripes; qemu-img
    // compare (block status on both sides) agrees byte for byte.
    run_ok(Command::new("nbdcopy").arg(&uri).arg(&copy));
    let allocated = allocated_bytes(&copy);
    assert!(
        allocated >= w1 - w0 && allocated <= (r1 - r0) + (1 << 20),
        "raid{level}: the copy allocates the write ({allocated} bytes)"
    );
    run_ok(Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw"]).arg(&copy).arg(&uri));
    served.stop();
}

#[test]
fn a_sparse_raid5_maps_as_holes_copies_sparse_and_shows_what_was_written() {
    sparse_maps_and_copies("5");
}

#[test]
fn a_sparse_raid10_maps_as_holes_copies_sparse_and_shows_what_was_written() {
    sparse_maps_and_copies("10");
}

/// A RAID5 of four sparse 64 GiB members holding 1 GiB: one member fails, a spare (local,
/// or an nbdkit export of a sparse file, with another member remote too) is rebuilt, and
/// the rebuild copies the member's share of that 1 GiB, leaving the rest holes.
fn sparse_rebuild(remote: bool) {
    for (tool, package) in [("qemu-io", "qemu-utils"), ("nbdkit", "nbdkit")] {
        require_tool(tool, package);
    }
    let dir = tempdir();
    let d = dir.path();
    let member_bytes = 64u64 << 30;
    let mut peers = Peers { children: Vec::new() };
    let mut members: Vec<String> = (0..3).map(|i| format!("m{i}")).collect();
    let spare = if remote {
        let (file, port) = new_file(d, "m3.img", member_bytes);
        peers.children.push(nbdkit_file(&file, port));
        members.push(format!("nbd://127.0.0.1:{port}/"));
        let (file, port) = new_file(d, "spare.img", member_bytes);
        peers.children.push(nbdkit_file(&file, port));
        format!("nbd://127.0.0.1:{port}/")
    } else {
        std::fs::File::create(d.join("m3")).unwrap().set_len(member_bytes).unwrap();
        members.push("m3".into());
        let spare = d.join("spare");
        std::fs::File::create(&spare).unwrap().set_len(member_bytes).unwrap();
        spare.to_string_lossy().into_owned()
    };
    let refs: Vec<&str> = members.iter().map(String::as_str).collect();
    let create = [&["create", "--level", "5", "--size", MEMBER_SIZE][..], &refs].concat();
    assert_ok(&raidnbd(d, &create));
    let sock = d.join("control.sock");
    let served = Served::start(d, "a", &["--fault-injection", "--control", sock.to_str().unwrap()], &refs);
    let uri = served.uri("a");
    ctl(d, &sock, &["rebuild-speed", "10M", "2G"]);
    // 1 GiB in four places across the array.
    let places = [0u64, 20 << 30, 100 << 30, 180 << 30];
    for (i, at) in places.iter().enumerate() {
        run_ok(Command::new("qemu-io").args(["-f", "raw", &uri, "-c", &format!("write -P {} {at} 256M", 0x30 + i)]));
    }

    ctl(d, &sock, &["fault", &d.join("m1").to_string_lossy(), "all"]);
    ctl(d, &sock, &["add", &spare]);
    let s = wait_for(d, &sock, "the rebuild", all_in_sync);
    let tally = &s["last_recovery"];
    let (copied, holes) = (tally["copied_bytes"].as_u64().unwrap(), tally["hole_bytes"].as_u64().unwrap());
    // The member's share of 1 GiB of data and its parity: a quarter of 4/3 GiB (341 MiB),
    // rounded to whole stripes.
    assert!((300 << 20..=400 << 20).contains(&copied), "copied about 341 MiB, not 64 GiB: {tally:#}");
    assert!(copied + holes > 63 << 30, "the whole member is accounted for: {tally:#}");
    if !remote {
        let allocated = allocated_bytes(&d.join("spare"));
        assert!(allocated <= 400 << 20, "the rebuilt member stays sparse: {allocated} bytes allocated");
    }
    for (i, at) in places.iter().enumerate() {
        run_ok(Command::new("qemu-io").args(["-f", "raw", &uri, "-c", &format!("read -P {} {at} 256M", 0x30 + i)]));
    }
    ctl(d, &sock, &["check"]);
    let s = wait_for(d, &sock, "the check", |s| !s["last_check"].is_null());
    assert_eq!(s["last_check"]["mismatch_cnt"], 0, "{s:#}");
    let checked_holes = s["last_check"]["hole_bytes"].as_u64().unwrap();
    assert!(checked_holes > 180 << 30, "the check read no holes: {s:#}");
    served.stop();
    drop(peers);
}

#[test]
fn a_rebuild_of_sparse_members_copies_only_what_they_hold() {
    sparse_rebuild(false);
}

#[test]
fn a_rebuild_onto_a_remote_sparse_spare_copies_only_what_the_members_hold() {
    sparse_rebuild(true);
}

/// FAST_ZERO (the client falls back to writing zeros itself when the server says it would
/// be slow): whole stripes of a RAID5 are zeroed by punching every member and read back as
/// zeros and a hole; a range that leaves part of a stripe fails at once with ENOTSUP and
/// changes nothing. CACHE is advertised and answered.
#[test]
fn fast_zero_is_honoured_on_whole_stripes_and_refused_where_it_would_write_data() {
    require_libnbd_python();
    let dir = tempdir();
    let d = dir.path();
    assert_ok(&raidnbd(d, &["create", "--level", "5", "--chunk", "64K", "--size", "64M", "m0", "m1", "m2", "m3"]));
    let served = Served::start(d, "a", &[], &["m0", "m1", "m2", "m3"]);
    let script = r#"
import errno, sys, nbd
h = nbd.NBD()
h.add_meta_context("base:allocation")
h.connect_uri(sys.argv[1])
assert h.can_fast_zero() and h.can_cache(), "FAST_ZERO and CACHE advertised"
stripe = 3 * 65536
h.pwrite(b"\x5a" * (4 * stripe), 0)
h.zero(stripe, 2 * stripe, nbd.CMD_FLAG_FAST_ZERO)
assert h.pread(stripe, 2 * stripe) == bytes(stripe), "fast-zeroed stripes read as zeros"
entries = []
h.block_status(stripe, 2 * stripe, lambda ctx, off, ents, err: entries.extend(ents) or 0)
assert entries[0] == stripe and entries[1] == 3, f"and are a hole: {entries}"
try:
    h.zero(65536, 0, nbd.CMD_FLAG_FAST_ZERO)
    raise SystemExit("a partial stripe was fast-zeroed")
except nbd.Error as e:
    assert e.errnum == errno.ENOTSUP, f"ENOTSUP, not {e}"
assert h.pread(65536, 0) == b"\x5a" * 65536, "a refused fast zero changes nothing"
h.zero(65536, 0)
assert h.pread(65536, 0) == bytes(65536), "without FAST_ZERO it is zeroed"
h.cache(4 * stripe, 0)
print("ok")
"#;
    let out = run_ok(Command::new(PYTHON).args(["-c", script, &served.uri("a")]));
    assert_eq!(out.trim(), "ok");
    served.stop();
}

/// `raidnbd:sync` of `uri`: (offset, length, flags).
fn sync_map(uri: &str) -> Vec<(u64, u64, u64)> {
    map_of("raidnbd:sync", uri)
}

/// The meta context `raidnbd:sync` says what a rebuild or resync will touch: nothing on a
/// clean array; a write sets its write-intent chunk dirty (bit 1) and nothing else; with a
/// member failed every range is not in sync (bit 0) until a spare is rebuilt. A client that
/// asks for it and `base:allocation` together gets both in one reply.
#[test]
fn the_sync_context_says_what_a_rebuild_will_touch() {
    require_tool("nbdinfo", "libnbd-bin");
    require_tool("qemu-io", "qemu-utils");
    require_libnbd_python();
    let dir = tempdir();
    let d = dir.path();
    let create = ["create", "--level", "5", "--chunk", "64K", "--bitmap", "internal", "--bitmap-chunk", "1M"];
    assert_ok(&raidnbd(d, &[&create[..], &["--size", "64M", "m0", "m1", "m2", "m3"]].concat()));
    std::fs::File::create(d.join("spare")).unwrap().set_len(64 << 20).unwrap();
    let sock = d.join("control.sock");
    let served =
        Served::start(d, "a", &["--fault-injection", "--control", sock.to_str().unwrap()], &["m0", "m1", "m2", "m3"]);
    let uri = served.uri("a");
    let size = run_ok(Command::new("nbdinfo").args(["--size", &uri])).trim().parse::<u64>().unwrap();
    assert_eq!(sync_map(&uri), vec![(0, size, 0)], "a clean array: nothing to touch");

    // A write at 8 MiB: its bitmap chunk (1 MiB of each member = 3 MiB of the array) is dirty.
    run_ok(Command::new("qemu-io").args(["-f", "raw", &uri, "-c", "write -P 0x11 8M 64K"]));
    let dirty_unit = 3u64 << 20;
    let (d0, d1) = ((8 << 20) / dirty_unit * dirty_unit, (8 << 20) / dirty_unit * dirty_unit + dirty_unit);
    assert_eq!(sync_map(&uri), vec![(0, d0, 0), (d0, d1 - d0, 2), (d1, size - d1, 0)], "the written chunk is dirty");

    // Both contexts in one request.
    let script = r#"
import sys, nbd
h = nbd.NBD()
h.add_meta_context("base:allocation")
h.add_meta_context("raidnbd:sync")
h.connect_uri(sys.argv[1])
seen = {}
# 8 MiB from 1 MiB: a hole up to the rows the write at 8 MiB touched; in sync, and dirty
# from 6 MiB (its bitmap chunk).
h.block_status(8 << 20, 1 << 20, lambda ctx, off, ents, err: seen.__setitem__(ctx, ents) or 0)
assert set(seen) == {"base:allocation", "raidnbd:sync"}, seen
assert seen["base:allocation"][1] == 3 and seen["base:allocation"][0] >= 6 << 20, seen
assert seen["raidnbd:sync"][:4] == [5 << 20, 0, 3 << 20, 2], seen
print("ok")
"#;
    assert_eq!(run_ok(Command::new(PYTHON).args(["-c", script, &uri])).trim(), "ok");

    // A member fails: everything waits for a rebuild; after it, nothing does.
    ctl(d, &sock, &["fault", &d.join("m2").to_string_lossy(), "all"]);
    run_ok(Command::new("qemu-io").args(["-f", "raw", &uri, "-c", "write -P 0x22 20M 64K"]));
    let degraded = sync_map(&uri);
    assert!(degraded.iter().all(|e| e.2 & 1 == 1), "degraded: nothing is in sync: {degraded:?}");
    ctl(d, &sock, &["add", &d.join("spare").to_string_lossy()]);
    wait_for(d, &sock, "the rebuild", all_in_sync);
    let rebuilt = sync_map(&uri);
    assert!(rebuilt.iter().all(|e| e.2 & 1 == 0), "rebuilt: all in sync: {rebuilt:?}");
    served.stop();
}
