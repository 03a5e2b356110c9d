//! Growing an array by members (md's reshape): online with `ctl grow` while a client writes,
//! SIGKILLed at random points of the reshape and restarted, with every acknowledged write
//! reading back and fio's verify clean; at rest with `raidnbd grow`; and mdadm reading the
//! result as raidnbd does.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::*;

pub(crate) fn writer() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/crash_writer.py")
}

pub(crate) fn status(d: &Path, sock: &str) -> Value {
    let out = assert_ok(&raidnbd(d, &["ctl", "--socket", sock, "status", "--json"]));
    serde_json::from_str::<Value>(&out).unwrap()[0].clone()
}

/// Grows the file `member` from `from` to `to` bytes, the new space holding old bytes (a
/// volume grown onto reused extents), so that its resync has work to do (new space that is
/// a hole on every member needs none and is skipped at once).
pub(crate) fn grow_with_old_bytes(member: &Path, from: u64, to: u64) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new().write(true).open(member).unwrap();
    let old: Vec<u8> = (0..to - from).map(|i| (i.wrapping_mul(0x9e37_79b9) >> 11) as u8 | 1).collect();
    file.write_all_at(&old, from).unwrap();
}

/// A fio job with verify over the region `[64 MiB, 80 MiB)` (the crash writer uses the first
/// 64 MiB): `args` add to it (`--do_verify=1` writes and verifies, `--verify_only` checks).
pub(crate) fn fio_region(uri: &str, args: &[&str]) -> Command {
    fio_verify(uri, "64m", "16m", args)
}

/// Ten rounds of: the crash writer (its log verified first) writing through `served`, a
/// SIGKILL of the server after a random pause, `inside(status, round)` checked just before the
/// kill (it lands inside the work under test), and a restart with `serve`, after which
/// `after(status, round)` is checked. Returns the server of the last restart.
pub(crate) fn sigkill_rounds(
    d: &Path,
    sock: &str,
    log: &Path,
    mut served: Served,
    serve: impl Fn() -> Served,
    inside: impl Fn(&Value, u64),
    after: impl Fn(&Value, u64),
) -> Served {
    for round in 0..10u64 {
        let uri = served.uri("a");
        run_ok(Command::new(PYTHON).arg(writer()).arg(&uri).arg(log).arg("verify"));
        let mut client = Command::new(PYTHON)
            .arg(writer())
            .arg(&uri)
            .arg(log)
            .arg(round.to_string())
            .stdout(Stdio::null())
            .spawn()
            .expect("writer");
        std::thread::sleep(Duration::from_millis(300 + (round * 7919) % 900));
        inside(&status(d, sock), round);
        served.child.kill().expect("SIGKILL the server");
        served.child.wait().unwrap();
        client.wait().unwrap();
        served = serve();
        after(&status(d, sock), round);
    }
    served
}

/// Polls `ctl status` until no resync is pending, failing with `what` after `limit`.
pub(crate) fn wait_resync_done(d: &Path, sock: &str, limit: Duration, what: &str) {
    let deadline = Instant::now() + limit;
    while status(d, sock)["resync_pending"] == true {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `mdadm --examine` of `member` as "Key : value" pairs.
pub(crate) fn mdadm_examine(member: &Path) -> Vec<(String, String)> {
    let out = run_ok(Command::new("mdadm").arg("--examine").arg(member));
    out.lines().filter_map(|l| l.split_once(" : ")).map(|(k, v)| (k.trim().to_string(), v.trim().to_string())).collect()
}

pub(crate) fn field<'a>(fields: &'a [(String, String)], key: &str) -> &'a str {
    fields.iter().find(|(k, _)| k == key).map_or("", |(_, v)| v.as_str())
}

/// What mdadm and raidnbd say of each member after a grow to `raid_devices` agree.
pub(crate) fn mdadm_agrees(d: &Path, members: &[&str], raid_devices: usize) {
    require_tool("mdadm", "mdadm");
    let ours: Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &[&["examine", "--json"][..], members].concat()))).unwrap();
    for (i, m) in members.iter().enumerate() {
        let theirs = mdadm_examine(&d.join(m));
        assert_eq!(field(&theirs, "Raid Devices"), raid_devices.to_string(), "{m}: {theirs:?}");
        assert!(field(&theirs, "Reshape pos'n").is_empty(), "{m}: mdadm sees no reshape: {theirs:?}");
        let ours = &ours[i];
        let data_offset = ours["data_offset_sectors"].as_u64().expect("data_offset_sectors");
        assert!(
            field(&theirs, "Data Offset").starts_with(&format!("{data_offset} sectors")),
            "{m}: data offset {data_offset} vs {theirs:?}"
        );
        assert_eq!(field(&theirs, "Events"), ours["events"].to_string(), "{m}");
        assert_eq!(field(&theirs, "Array UUID"), ours["array_uuid"].as_str().unwrap(), "{m}");
    }
}

/// Starts the array of `members` with a control socket at `sock` and the background work
/// slowed to 1-2 MB/s from the start, so that SIGKILLs land in the middle of it.
pub(crate) fn serve_paced(d: &Path, sock: &str, members: &[&str]) -> Served {
    let served =
        Served::start(d, "a", &["--control", sock, "--speed-limit-min", "1M", "--speed-limit-max", "2M"], members);
    let s = status(d, sock);
    assert_eq!(s["speed_limits"]["max_bytes_per_sec"], 2 << 20, "paced from the start: {s:#}");
    served
}

/// Grows the array `create` makes of `before` members by `added` online, through ten SIGKILLs
/// under writes (crash writer + fio verify), then checks sizes (`data_before` data members
/// before), every acknowledged byte, parity and what mdadm says. A raid0 reshapes as a raid4
/// of one role more and is a raid0 again at the end.
fn grow_online_through_sigkills(create: &[&str], before: usize, added: usize, data_before: u64) {
    require_libnbd_python();
    require_tool("fio", "fio");
    let dir = tempdir();
    let d = dir.path();
    let level = |l: &str| create.windows(2).any(|w| w == ["--level", l]);
    let raid0 = level("0");
    let parity_role = usize::from(raid0);
    let names: Vec<String> = (0..before + added).map(|i| format!("m{i}")).collect();
    let all: Vec<&str> = names.iter().map(String::as_str).collect();
    let (refs, new) = all.split_at(before);
    assert_ok(&raidnbd(d, &[create, refs].concat()));
    let member_bytes = std::fs::metadata(d.join(refs[0])).unwrap().len();
    for m in new {
        std::fs::File::create(d.join(m)).unwrap().set_len(member_bytes).unwrap();
    }
    let log = d.join("durable.log");
    let sock = d.join("c.sock").to_str().unwrap().to_string();
    let served = serve_paced(d, &sock, refs);
    let old_size = status(d, &sock)["size_bytes"].as_u64().unwrap();
    assert!(old_size >= 80 << 20, "room for the writer's 64 MiB and fio's 16 MiB: {old_size}");
    let count = (before + added).to_string();
    let adds: Vec<&str> = new.iter().flat_map(|m| ["--add", m]).collect();
    assert_ok(&raidnbd(d, &[&["ctl", "--socket", &sock, "grow", "--raid-devices", &count][..], &adds].concat()));
    let s = status(d, &sock);
    if raid0 {
        assert_eq!(s["level"], "raid4", "a raid4 while the data moves: {s:#}");
    }
    assert_eq!(s["reshape"]["from_raid_devices"], before + parity_role, "{s:#}");
    assert_eq!(s["reshape"]["to_raid_devices"], before + added + parity_role, "{s:#}");
    assert_eq!(s["size_bytes"], old_size, "the export keeps its size while it grows");
    // fio writes its region and verifies it while the reshape runs.
    run_ok(&mut fio_region(&served.uri("a"), &["--do_verify=1"]));
    let served = sigkill_rounds(
        d,
        &sock,
        &log,
        served,
        || serve_paced(d, &sock, &all),
        |s, round| assert!(!s["reshape"].is_null(), "round {round}: the kill lands inside the reshape"),
        |s, round| assert!(!s["reshape"].is_null(), "round {round}: the restart continues the reshape: {s:#}"),
    );
    // Full speed to the end.
    assert_ok(&raidnbd(d, &["ctl", "--socket", &sock, "rebuild-speed", "100M", "200M"]));
    assert_ok(&raidnbd(d, &["ctl", "--socket", &sock, "wait", "--timeout", "120s"]));
    let s = status(d, &sock);
    assert!(s["reshape"].is_null(), "{s:#}");
    if raid0 {
        assert_eq!(s["level"], "raid0", "a raid0 again: {s:#}");
    }
    assert_eq!(s["roles"].as_array().unwrap().len(), before + added, "{s:#}");
    let new_size = s["size_bytes"].as_u64().unwrap();
    assert_eq!(new_size, old_size / data_before * (data_before + added as u64), "the added data members' room");
    // A new connection sees the new size; every acknowledged byte reads back.
    let size = run_ok(Command::new("nbdinfo").args(["--size", &served.uri("a")]));
    assert_eq!(size.trim(), new_size.to_string());
    run_ok(Command::new(PYTHON).arg(writer()).arg(served.uri("a")).arg(&log).arg("verify"));
    run_ok(&mut fio_region(&served.uri("a"), &["--verify_only"]));
    wait_resync_done(d, &sock, Duration::from_secs(120), "the resync after the kills did not end");
    served.stop();
    if !raid0 {
        let check: Value =
            serde_json::from_str(&assert_ok(&raidnbd(d, &[&["check", "--json"][..], &all].concat()))).unwrap();
        assert_eq!(check["mismatch_cnt"], 0, "parity matches the data after the grow");
    }
    mdadm_agrees(d, &all, before + added);
    if create.contains(&"bitmap") && level("10") {
        // raid10's bitmap covers the array's sectors (md's resync space): the new size at the
        // end. Its header's sync_size (bytes 40..48, sectors; md-bitmap.h) where mdadm says.
        use std::os::unix::fs::FileExt;
        let examined = mdadm_examine(&d.join(all[0]));
        let at = field(&examined, "Internal Bitmap");
        let from_sb: u64 = at.strip_suffix(" sectors from superblock").and_then(|v| v.parse().ok()).expect(at);
        let mut header = [0u8; 48];
        std::fs::File::open(d.join(all[0])).unwrap().read_exact_at(&mut header, 4096 + from_sb * 512).unwrap();
        assert_eq!(&header[..4], b"bitm", "a bitmap where mdadm says");
        let sync_sectors = u64::from_le_bytes(header[40..48].try_into().unwrap());
        assert_eq!(sync_sectors * 512, new_size, "the bitmap covers the grown array");
    }
    if raid0 {
        for m in &all {
            assert_eq!(field(&mdadm_examine(&d.join(m)), "Raid Level"), "raid0", "{m}");
        }
    }
}

#[test]
fn a_raid5_grows_online_through_sigkills_under_writes() {
    let create = ["create", "--level", "5", "--chunk", "64K", "--consistency-policy", "resync", "--size", "48M"];
    grow_online_through_sigkills(&create, 3, 1, 2);
}

#[test]
fn a_raid4_grows_online_through_sigkills_under_writes() {
    let create = ["create", "--level", "4", "--chunk", "64K", "--consistency-policy", "resync", "--size", "48M"];
    grow_online_through_sigkills(&create, 3, 1, 2);
}

/// `create` options of the grows with a write-intent bitmap (1 MiB of array data per bit).
const WITH_BITMAP: [&str; 8] =
    ["--chunk", "64K", "--consistency-policy", "bitmap", "--bitmap-chunk", "1M", "--size", "48M"];

/// md keeps a write-intent bitmap through a reshape; so does raidnbd (the resync after each
/// kill covers the bitmap's dirty rows once the reshape ends).
#[test]
fn a_raid6_with_a_bitmap_grows_online_through_sigkills_under_writes() {
    let create = [&["create", "--level", "6"][..], &WITH_BITMAP].concat();
    grow_online_through_sigkills(&create, 4, 1, 2);
}

/// md's raid10 reshape (near layouts): a member added online to a raid10 n2 of four, with a
/// write-intent bitmap, which covers the array's sectors and so grows with it at the end.
#[test]
fn a_raid10_with_a_bitmap_grows_online_through_sigkills_under_writes() {
    let create = [&["create", "--level", "10", "--layout", "n2"][..], &WITH_BITMAP].concat();
    // Four n2 members hold two members' data; five hold two and a half.
    grow_online_through_sigkills(&create, 4, 1, 4);
}

#[test]
fn an_array_at_rest_grows_and_refusals_say_why() {
    let dir = tempdir();
    let d = dir.path();
    let create = ["create", "--level", "6", "--chunk", "64K", "--consistency-policy", "resync", "--size", "24M"];
    assert_ok(&raidnbd(d, &[&create[..], &["m0", "m1", "m2", "m3"]].concat()));
    for m in ["m4", "m5"] {
        std::fs::File::create(d.join(m)).unwrap().set_len(24 << 20).unwrap();
    }
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    std::fs::write(d.join("data"), &data).unwrap();
    {
        let served = Served::start(d, "a", &[], &["m0", "m1", "m2", "m3"]);
        run_ok(Command::new("nbdcopy").arg(d.join("data")).arg(served.uri("a")));
        served.stop();
    }
    assert_user_error(
        &raidnbd(d, &["grow", "--raid-devices", "7", "--add", "m4", "m0", "m1", "m2", "m3"]),
        "--raid-devices 7",
    );
    let out = assert_ok(&raidnbd(d, &["grow", "--add", "m4", "--add", "m5", "m0", "m1", "m2", "m3"]));
    assert!(out.contains("6 members"), "{out}");
    let members = ["m0", "m1", "m2", "m3", "m4", "m5"];
    let detail: Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &[&["detail", "--json"][..], &members].concat()))).unwrap();
    assert_eq!(detail["raid_devices"], 6);
    assert!(detail["reshape"].is_null());
    let served = Served::start(d, "a", &[], &members);
    run_ok(Command::new("nbdcopy").arg(served.uri("a")).arg(d.join("back")));
    served.stop();
    let back = std::fs::read(d.join("back")).unwrap();
    assert_eq!(back.len() as u64, detail["array_size_bytes"].as_u64().unwrap(), "the new size");
    assert!(back.len() as u64 > 4 * (20 << 20), "four data members of about 24 MiB: {}", back.len());
    assert!(back[..data.len()] == data[..], "the data survives the grow");
    assert!(back[data.len()..].iter().all(|&b| b == 0), "the rest reads as zeros");
    mdadm_agrees(d, &members, 6);

    // A linear array grows by appending a member (md's linear hot-add): nothing moves.
    assert_ok(&raidnbd(d, &["create", "--level", "linear", "--size", "16M", "l0", "l1"]));
    std::fs::File::create(d.join("l2")).unwrap().set_len(24 << 20).unwrap();
    let before: Value = serde_json::from_str(&assert_ok(&raidnbd(d, &["detail", "--json", "l0", "l1"]))).unwrap();
    let out = assert_ok(&raidnbd(d, &["grow", "--add", "l2", "l0", "l1"]));
    assert!(out.contains("3 members"), "{out}");
    let after: Value = serde_json::from_str(&assert_ok(&raidnbd(d, &["detail", "--json", "l0", "l1", "l2"]))).unwrap();
    let grown = after["array_size_bytes"].as_u64().unwrap() - before["array_size_bytes"].as_u64().unwrap();
    assert!(grown > 20 << 20, "the third member's room is appended: {grown}");
    let linear = ["l0", "l1", "l2"];
    mdadm_agrees(d, &linear, 3);

    // A raid0 grows as md grows one: through a raid4 without its parity member.
    assert_ok(&raidnbd(d, &["create", "--level", "0", "--chunk", "64K", "--size", "16M", "z0", "z1"]));
    std::fs::File::create(d.join("z2")).unwrap().set_len(16 << 20).unwrap();
    {
        let served = Served::start(d, "a", &[], &["z0", "z1"]);
        run_ok(Command::new("nbdcopy").arg(d.join("data")).arg(served.uri("a")));
        served.stop();
    }
    let out = assert_ok(&raidnbd(d, &["grow", "--add", "z2", "z0", "z1"]));
    assert!(out.contains("3 members"), "{out}");
    let raid0 = ["z0", "z1", "z2"];
    let detail: Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &[&["detail", "--json"][..], &raid0].concat()))).unwrap();
    assert_eq!(
        (detail["raid_level"].as_str(), detail["raid_devices"].as_u64()),
        (Some("raid0"), Some(3)),
        "{detail:#}"
    );
    let served = Served::start(d, "a", &[], &raid0);
    run_ok(Command::new("nbdcopy").arg(served.uri("a")).arg(d.join("back0")));
    served.stop();
    let back = std::fs::read(d.join("back0")).unwrap();
    assert!(back[..data.len()] == data[..], "the data survives the raid0 grow");
    assert!(back[data.len()..].iter().all(|&b| b == 0), "the rest reads as zeros");
    mdadm_agrees(d, &raid0, 3);

    // A raid5 with md's partial parity log (its default) is not reshaped, as md does not.
    assert_ok(&raidnbd(d, &["create", "--level", "5", "--size", "24M", "p0", "p1", "p2"]));
    std::fs::File::create(d.join("p3")).unwrap().set_len(24 << 20).unwrap();
    assert_user_error(&raidnbd(d, &["grow", "--add", "p3", "p0", "p1", "p2"]), "partial parity log");
}

/// What mdadm and raidnbd say of the size of each member after a resize agree.
fn mdadm_agrees_on_size(d: &Path, members: &[&str], used_dev_sectors: u64, array_bytes: u64) {
    require_tool("mdadm", "mdadm");
    let ours: Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &[&["examine", "--json"][..], members].concat()))).unwrap();
    for (i, m) in members.iter().enumerate() {
        let theirs = mdadm_examine(&d.join(m));
        assert_eq!(ours[i]["used_dev_sectors"], used_dev_sectors, "{m}");
        assert!(field(&theirs, "Array Size").starts_with(&format!("{} KiB", array_bytes / 1024)), "{m}: {theirs:?}");
        let avail = ours[i]["avail_dev_sectors"].as_u64().unwrap();
        assert!(avail >= used_dev_sectors, "{m}: data_size {avail}");
        assert!(field(&theirs, "Avail Dev Size").starts_with(&format!("{avail} sectors")), "{m}: {theirs:?}");
        // mdadm prints the used size only where it differs from the available one.
        let used = field(&theirs, "Used Dev Size");
        assert!(
            used.starts_with(&format!("{used_dev_sectors} sectors")) || (used.is_empty() && avail == used_dev_sectors),
            "{m}: {theirs:?}"
        );
    }
}

/// The members grew (a resized cloud volume): `ctl grow --size max` takes the room while a
/// client writes, new connections see the new size, SIGKILLs during the resync of the new
/// space lose nothing, and at the end parity matches and mdadm reads the new size.
#[test]
fn a_raid5_takes_the_room_its_members_grew_online_through_sigkills() {
    require_libnbd_python();
    require_tool("fio", "fio");
    let dir = tempdir();
    let d = dir.path();
    let create = ["create", "--level", "5", "--chunk", "64K", "--consistency-policy", "resync", "--size", "48M"];
    let members = ["m0", "m1", "m2"];
    assert_ok(&raidnbd(d, &[&create[..], &members].concat()));
    let log = d.join("durable.log");
    let sock = d.join("c.sock").to_str().unwrap().to_string();
    let serve = || serve_paced(d, &sock, &members);
    let served = serve();
    let old_size = status(d, &sock)["size_bytes"].as_u64().unwrap();
    run_ok(&mut fio_region(&served.uri("a"), &["--do_verify=1"]));
    // Nothing grew yet: max is the size it has.
    let out = assert_ok(&raidnbd(d, &["ctl", "--socket", &sock, "grow", "--size", "max"]));
    assert!(out.contains("keeps its size"), "{out}");
    for m in members {
        grow_with_old_bytes(&d.join(m), 48 << 20, 96 << 20);
    }
    let out = assert_ok(&raidnbd(d, &["ctl", "--socket", &sock, "grow", "--size", "max"]));
    assert!(out.contains("grew"), "{out}");
    let s = status(d, &sock);
    let new_size = s["size_bytes"].as_u64().unwrap();
    assert!(new_size > old_size + (80 << 20), "about 2 x 48 MiB more: {old_size} -> {new_size}");
    assert_eq!(s["resync_pending"], true, "the new space is resynced: {s:#}");
    let size = run_ok(Command::new("nbdinfo").args(["--size", &served.uri("a")]));
    assert_eq!(size.trim(), new_size.to_string(), "a new connection sees the new size");
    // fio writes a region of the new space too, before the resync got there.
    let mut new_region = fio_region(&served.uri("a"), &["--do_verify=1"]);
    new_region.arg(format!("--offset={}", old_size + (16 << 20)));
    run_ok(&mut new_region);
    let served = sigkill_rounds(
        d,
        &sock,
        &log,
        served,
        serve,
        |s, round| assert_eq!(s["resync_pending"], true, "round {round}: the kill lands inside the resync"),
        |s, round| assert_eq!(s["size_bytes"], new_size, "round {round}: the new size survives a SIGKILL"),
    );
    assert_ok(&raidnbd(d, &["ctl", "--socket", &sock, "rebuild-speed", "100M", "200M"]));
    wait_resync_done(d, &sock, Duration::from_secs(180), "the resync did not end");
    run_ok(Command::new(PYTHON).arg(writer()).arg(served.uri("a")).arg(&log).arg("verify"));
    run_ok(&mut fio_region(&served.uri("a"), &["--verify_only"]));
    let mut new_region = fio_region(&served.uri("a"), &["--verify_only"]);
    new_region.arg(format!("--offset={}", old_size + (16 << 20)));
    run_ok(&mut new_region);
    served.stop();
    let check: Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &[&["check", "--json"][..], &members].concat()))).unwrap();
    assert_eq!(check["mismatch_cnt"], 0, "parity matches the data in the new space too");
    let detail: Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &[&["detail", "--json"][..], &members].concat()))).unwrap();
    assert_eq!(detail["array_size_bytes"], new_size);
    let used = detail["used_dev_size_bytes"].as_u64().unwrap() / 512;
    mdadm_agrees_on_size(d, &members, used, new_size);
}

/// At rest: `raidnbd grow --size` shrinks and grows a mirror (the next serve resyncs the new
/// space), and what cannot be resized says why.
#[test]
fn an_array_at_rest_changes_its_size_and_refusals_say_why() {
    let dir = tempdir();
    let d = dir.path();
    // A write-intent bitmap of 4 KiB chunks: its room holds about 120 MiB of them, so the grow
    // to 256 MiB members doubles its chunk (as md_bitmap_resize).
    assert_ok(&raidnbd(
        d,
        &["create", "--level", "1", "--bitmap", "internal", "--bitmap-chunk", "4K", "--size", "32M", "m0", "m1"],
    ));
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 11) as u8).collect();
    std::fs::write(d.join("data"), &data).unwrap();
    {
        let served = Served::start(d, "a", &[], &["m0", "m1"]);
        run_ok(Command::new("nbdcopy").arg(d.join("data")).arg(served.uri("a")));
        served.stop();
    }
    assert_user_error(&raidnbd(d, &["grow", "--size", "1000M", "m0", "m1"]), "has room for");
    assert_user_error(&raidnbd(d, &["grow", "--size", "100", "m0", "m1"]), "not a multiple of 64 KiB");
    let out = assert_ok(&raidnbd(d, &["grow", "--size", "16M", "m0", "m1"]));
    assert!(out.contains("shrank"), "{out}");
    let detail: Value = serde_json::from_str(&assert_ok(&raidnbd(d, &["detail", "--json", "m0", "m1"]))).unwrap();
    assert_eq!(detail["array_size_bytes"], 16 << 20);
    for m in ["m0", "m1"] {
        std::fs::OpenOptions::new().write(true).open(d.join(m)).unwrap().set_len(256 << 20).unwrap();
    }
    let out = assert_ok(&raidnbd(d, &["grow", "--size", "max", "m0", "m1"]));
    assert!(out.contains("grew"), "{out}");
    let detail: Value = serde_json::from_str(&assert_ok(&raidnbd(d, &["detail", "--json", "m0", "m1"]))).unwrap();
    let size = detail["array_size_bytes"].as_u64().unwrap();
    assert!(size > 250 << 20 && size.is_multiple_of(64 << 10), "{size}");
    // The resized bitmap, read as md_p.h lays it out (bitmap_super_s, 8 sectors after the
    // superblock, as mdadm --examine says): the new sync size, a larger chunk, the new space
    // dirty.
    let examined = mdadm_examine(&d.join("m0"));
    assert_eq!(field(&examined, "Internal Bitmap"), "8 sectors from superblock", "{examined:?}");
    let image = std::fs::read(d.join("m0")).unwrap();
    let bitmap = &image[8192..];
    let le32 = |at: usize| u32::from_le_bytes(bitmap[at..at + 4].try_into().unwrap()) as u64;
    let le64 = |at: usize| u64::from_le_bytes(bitmap[at..at + 8].try_into().unwrap());
    assert_eq!(&bitmap[..4], b"bitm");
    assert_eq!(le64(40), size / 512, "sync_size: the new size");
    let chunk = le32(52);
    assert!(chunk > 4096 && chunk.is_power_of_two(), "the bitmap chunk doubled: {chunk}");
    let bits = size.div_ceil(chunk) as usize;
    assert!(bits as u64 <= (le32(64) * 512 - 256) * 8, "the bits fit the room reserved");
    let is_set = |bit: usize| bitmap[256 + bit / 8] & (1 << (bit % 8)) != 0;
    let old_end = (16 << 20) / chunk as usize;
    assert!((old_end + 1..bits).all(is_set), "the new space is dirty in the bitmap");
    let sock = d.join("c.sock").to_str().unwrap().to_string();
    let served = Served::start(d, "a", &["--control", &sock], &["m0", "m1"]);
    wait_resync_done(d, &sock, Duration::from_secs(60), "the resync of the new space did not end");
    run_ok(Command::new("nbdcopy").arg(served.uri("a")).arg(d.join("back")));
    served.stop();
    let back = std::fs::read(d.join("back")).unwrap();
    assert_eq!(back.len() as u64, size);
    assert!(back[..data.len()] == data[..], "the data survives the shrink and the grow");
    let check: Value = serde_json::from_str(&assert_ok(&raidnbd(d, &["check", "--json", "m0", "m1"]))).unwrap();
    assert_eq!(check["mismatch_cnt"], 0, "the mirrors agree in the new space");
    mdadm_agrees_on_size(d, &["m0", "m1"], size / 512, size);

    assert_ok(&raidnbd(d, &["create", "--level", "0", "--size", "16M", "z0", "z1"]));
    assert_user_error(&raidnbd(d, &["grow", "--size", "max", "z0", "z1"]), "grow it by members");
    assert_usage_error(&raidnbd(d, &["grow", "z0", "z1"]), "required arguments");
}

/// Online, a shrink of an export served through a write-back cache is refused (cached writes
/// past the new end could not be written back); growing it is fine.
#[test]
fn a_write_back_export_grows_online_but_shrinks_only_at_rest() {
    let dir = tempdir();
    let d = dir.path();
    assert_ok(&raidnbd(d, &["create", "--level", "1", "--size", "32M", "m0", "m1"]));
    for m in ["m0", "m1"] {
        grow_with_old_bytes(&d.join(m), 32 << 20, 48 << 20);
    }
    let sock = d.join("c.sock").to_str().unwrap().to_string();
    let served = Served::start(d, "a", &["--cache", "writeback", "--control", &sock], &["m0", "m1"]);
    // The resync of the new space is still running when the server stops below.
    assert_ok(&raidnbd(d, &["ctl", "--socket", &sock, "rebuild-speed", "1M", "1M"]));
    let before = status(d, &sock)["size_bytes"].as_u64().unwrap();
    assert_user_error(&raidnbd(d, &["ctl", "--socket", &sock, "grow", "--size", "16M"]), "write-back cache");
    assert_eq!(status(d, &sock)["size_bytes"], before, "nothing changed");
    let out = assert_ok(&raidnbd(d, &["ctl", "--socket", &sock, "grow", "--size", "max"]));
    assert!(out.contains("grew"), "{out}");
    let size = run_ok(Command::new("nbdinfo").args(["--size", &served.uri("a")]));
    assert!(size.trim().parse::<u64>().unwrap() > before + (15 << 20), "{size}");
    // At rest, not while the new space still waits for its resync.
    served.stop();
    assert_user_error(&raidnbd(d, &["grow", "--size", "16M", "m0", "m1"]), "background work");
    let served = Served::start(d, "a", &["--control", &sock], &["m0", "m1"]);
    wait_resync_done(d, &sock, Duration::from_secs(60), "the resync of the new space did not end");
    served.stop();
    let out = assert_ok(&raidnbd(d, &["grow", "--size", "16M", "m0", "m1"]));
    assert!(out.contains("shrank"), "{out}");
}

/// A raid0 grows by two members online as md grows one (a raid4 without its parity member
/// while the data moves, a raid0 again at the end), through ten SIGKILLs under writes.
#[test]
fn a_raid0_grows_online_through_sigkills_under_writes() {
    grow_online_through_sigkills(&["create", "--level", "0", "--chunk", "64K", "--size", "40M"], 3, 2, 3);
}
