//! Growing an array by members (md's reshape): online with `ctl grow` while a client writes,
//! SIGKILLed at random points of the reshape and restarted, with every acknowledged write
//! reading back and fio's verify clean; at rest with `raidnbd grow`; and mdadm reading the
//! result as raidnbd does.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::*;

fn writer() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/crash_writer.py")
}

fn status(d: &Path, sock: &str) -> Value {
    let out = assert_ok(&raidnbd(d, &["ctl", "--socket", sock, "status", "--json"]));
    serde_json::from_str::<Value>(&out).unwrap()[0].clone()
}

/// A fio job with verify over the region `[64 MiB, 80 MiB)` (the crash writer uses the first
/// 64 MiB): `args` add to it (`--do_verify=1` writes and verifies, `--verify_only` checks).
fn fio_region(uri: &str, args: &[&str]) -> Command {
    let mut fio = Command::new("fio");
    fio.args([
        "--name=grow",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=randwrite",
        "--bs=16k",
        "--offset=64m",
        "--size=16m",
        "--randseed=34",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--iodepth=8",
    ]);
    fio.args(args);
    fio
}

/// `mdadm --examine` of `member` as "Key : value" pairs.
fn mdadm_examine(member: &Path) -> Vec<(String, String)> {
    let out = run_ok(Command::new("mdadm").arg("--examine").arg(member));
    out.lines().filter_map(|l| l.split_once(" : ")).map(|(k, v)| (k.trim().to_string(), v.trim().to_string())).collect()
}

fn field<'a>(fields: &'a [(String, String)], key: &str) -> &'a str {
    fields.iter().find(|(k, _)| k == key).map_or("", |(_, v)| v.as_str())
}

/// What mdadm and raidnbd say of each member after a grow to `raid_devices` agree.
fn mdadm_agrees(d: &Path, members: &[&str], raid_devices: usize) {
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

#[test]
fn a_raid5_grows_online_through_sigkills_under_writes() {
    require_libnbd_python();
    require_tool("fio", "fio");
    let dir = tempdir();
    let d = dir.path();
    let create = ["create", "--level", "5", "--chunk", "64K", "--consistency-policy", "resync", "--size", "48M"];
    assert_ok(&raidnbd(d, &[&create[..], &["m0", "m1", "m2"]].concat()));
    std::fs::File::create(d.join("m3")).unwrap().set_len(48 << 20).unwrap();
    let (refs, grown) = (["m0", "m1", "m2"], ["m0", "m1", "m2", "m3"]);
    let log = d.join("durable.log");
    let sock = d.join("c.sock").to_str().unwrap().to_string();
    let serve = |members: &[&str]| {
        let served = Served::start(d, "a", &["--control", &sock], members);
        // Slow enough that the kills land in the middle of it.
        assert_ok(&raidnbd(d, &["ctl", "--socket", &sock, "rebuild-speed", "1M", "2M"]));
        served
    };
    let served = serve(&refs);
    let old_size = status(d, &sock)["size_bytes"].as_u64().unwrap();
    assert!(old_size >= 80 << 20, "room for the writer's 64 MiB and fio's 16 MiB: {old_size}");
    let out = raidnbd(d, &["ctl", "--socket", &sock, "grow", "--raid-devices", "4", "--add", "m3"]);
    assert_ok(&out);
    let s = status(d, &sock);
    assert_eq!(s["reshape"]["from_raid_devices"], 3, "{s:#}");
    assert_eq!(s["reshape"]["to_raid_devices"], 4, "{s:#}");
    assert_eq!(s["size_bytes"], old_size, "the export keeps its size while it grows");
    // fio writes its region and verifies it while the reshape runs.
    run_ok(&mut fio_region(&served.uri("a"), &["--do_verify=1"]));
    let mut served = served;
    let mut kills = 0;
    for seed in 0..10u64 {
        let uri = served.uri("a");
        run_ok(Command::new(PYTHON).arg(writer()).arg(&uri).arg(&log).arg("verify"));
        let mut client = Command::new(PYTHON)
            .arg(writer())
            .arg(&uri)
            .arg(&log)
            .arg(seed.to_string())
            .stdout(Stdio::null())
            .spawn()
            .expect("writer");
        std::thread::sleep(Duration::from_millis(300 + (seed * 7919) % 900));
        assert!(!status(d, &sock)["reshape"].is_null(), "round {seed}: the kill lands inside the reshape");
        served.child.kill().expect("SIGKILL the server");
        served.child.wait().unwrap();
        client.wait().unwrap();
        kills += 1;
        served = serve(&grown);
        let s = status(d, &sock);
        assert!(!s["reshape"].is_null(), "round {seed}: the restart continues the reshape: {s:#}");
    }
    assert_eq!(kills, 10);
    // Full speed to the end.
    assert_ok(&raidnbd(d, &["ctl", "--socket", &sock, "rebuild-speed", "100M", "200M"]));
    assert_ok(&raidnbd(d, &["ctl", "--socket", &sock, "wait", "--timeout", "120s"]));
    let s = status(d, &sock);
    assert!(s["reshape"].is_null(), "{s:#}");
    assert_eq!(s["roles"].as_array().unwrap().len(), 4);
    let new_size = s["size_bytes"].as_u64().unwrap();
    assert_eq!(new_size, old_size / 2 * 3, "three data members instead of two");
    // A new connection sees the new size; every acknowledged byte reads back.
    let size = run_ok(Command::new("nbdinfo").args(["--size", &served.uri("a")]));
    assert_eq!(size.trim(), new_size.to_string());
    run_ok(Command::new(PYTHON).arg(writer()).arg(served.uri("a")).arg(&log).arg("verify"));
    run_ok(&mut fio_region(&served.uri("a"), &["--verify_only"]));
    let deadline = Instant::now() + Duration::from_secs(120);
    while status(d, &sock)["resync_pending"] == true {
        assert!(Instant::now() < deadline, "the resync after the kills did not end");
        std::thread::sleep(Duration::from_millis(200));
    }
    served.stop();
    let check: Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &[&["check", "--json"][..], &grown].concat()))).unwrap();
    assert_eq!(check["mismatch_cnt"], 0, "parity matches the data after the grow");
    mdadm_agrees(d, &grown, 4);
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

    // A raid5 with md's partial parity log (its default) is not reshaped, as md does not.
    assert_ok(&raidnbd(d, &["create", "--level", "5", "--size", "24M", "p0", "p1", "p2"]));
    std::fs::File::create(d.join("p3")).unwrap().set_len(24 << 20).unwrap();
    assert_user_error(&raidnbd(d, &["grow", "--add", "p3", "p0", "p1", "p2"]), "partial parity log");
}
