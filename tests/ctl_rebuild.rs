//! Living with an array through `raidnbd ctl`: a member fails under a running workload
//! (fault injection), the array continues degraded, a spare is added and rebuilt while a
//! client keeps writing, a check finds no mismatch, and every byte verifies — for raid1,
//! raid5, raid6 (two failures) and raid10. Also online replace and a restart mid-way.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::*;

fn workload(dir: &Path, uri: &str, args: &[&str]) {
    require_libnbd_python();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/workload.py");
    let state = dir.join("model.json");
    run_ok(Command::new(PYTHON).arg(script).arg(uri).arg(&state).args(args));
}

pub(crate) fn ctl(dir: &Path, socket: &Path, args: &[&str]) -> String {
    let mut full = vec!["ctl", "--socket", socket.to_str().unwrap()];
    full.extend_from_slice(args);
    assert_ok(&raidnbd(dir, &full))
}

fn status(dir: &Path, socket: &Path) -> Value {
    let text = ctl(dir, socket, &["status", "--json"]);
    serde_json::from_str::<Value>(&text).expect("status json")[0].clone()
}

/// Polls `ctl status` until `done` holds (for at most 5 minutes); returns that status.
pub(crate) fn wait_for(dir: &Path, socket: &Path, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let s = status(dir, socket);
        if done(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}; status: {s:#}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub(crate) fn all_in_sync(s: &Value) -> bool {
    s["roles"].as_array().unwrap().iter().all(|r| r["state"] == "in_sync") && s["work"].is_null()
}

fn scenario(level: &str, members: usize, failures: usize) {
    require_tool("nbdinfo", "libnbd-bin");
    let dir = tempdir();
    let d = dir.path();
    let names: Vec<String> = (0..members).map(|i| format!("m{i}")).collect();
    let mut create = vec!["create", "--level", level, "--size", "48M"];
    if level != "1" {
        create.extend(["--chunk", "64K"]);
    }
    create.extend(names.iter().map(String::as_str));
    assert_ok(&raidnbd(d, &create));
    for i in 0..failures {
        std::fs::write(d.join(format!("spare{i}")), vec![0u8; 48 << 20]).unwrap();
    }
    let socket = d.join("control.sock");
    let control = socket.to_str().unwrap().to_string();
    let member_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let served = Served::start(d, "a", &["--fault-injection", "--control", &control], &member_refs);
    let uri = served.uri("a");
    ctl(d, &socket, &["rebuild-speed", "10M", "1G"]);

    workload(d, &uri, &["write", "1", "200"]);
    // Members die under the workload: every I/O to them fails from now on.
    for victim in names.iter().take(failures) {
        ctl(d, &socket, &["fault", &d.join(victim).to_string_lossy(), "all"]);
    }
    workload(d, &uri, &["write", "2", "200"]);
    workload(d, &uri, &["verify"]);
    let s = status(d, &socket);
    let faulty = s["roles"].as_array().unwrap().iter().filter(|r| r["state"] == "faulty").count();
    assert_eq!(faulty, failures, "failed members are marked faulty: {s:#}");
    assert!(s["state"].as_str().unwrap().contains("degraded"), "{s:#}");

    // Spares: the rebuild runs while a client keeps writing.
    for i in 0..failures {
        ctl(d, &socket, &["add", &d.join(format!("spare{i}")).to_string_lossy()]);
    }
    workload(d, &uri, &["write", "3", "300"]);
    let s = wait_for(d, &socket, "rebuild", all_in_sync);
    assert!(s["spares"].as_array().unwrap().is_empty());
    workload(d, &uri, &["verify"]);

    ctl(d, &socket, &["check"]);
    let s = wait_for(d, &socket, "check", |s| !s["last_check"].is_null());
    assert_eq!(s["last_check"]["mismatch_cnt"], 0, "{s:#}");
    served.stop();

    // The superblocks describe the new member set: it assembles and verifies without the dead.
    let mut survivors: Vec<String> = names[failures..].to_vec();
    survivors.extend((0..failures).map(|i| format!("spare{i}")));
    let refs: Vec<&str> = survivors.iter().map(String::as_str).collect();
    let detail = assert_ok(&raidnbd(d, &[&["detail", "--json"][..], &refs].concat()));
    let detail: Value = serde_json::from_str(&detail).unwrap();
    assert_eq!(detail["degraded"], false, "{detail:#}");
    assert_eq!(detail["clean"], true);
    let served = Served::start(d, "a", &[], &refs);
    workload(d, &served.uri("a"), &["verify"]);
    served.stop();
    let out = raidnbd(d, &[&["check"][..], &refs].concat());
    assert_ok(&out);
}

#[test]
fn raid1_member_fails_and_spare_rebuilds() {
    scenario("1", 2, 1);
}

#[test]
fn raid5_member_fails_and_spare_rebuilds() {
    scenario("5", 4, 1);
}

#[test]
fn raid6_two_members_fail_and_spares_rebuild() {
    scenario("6", 5, 2);
}

#[test]
fn raid10_member_fails_and_spare_rebuilds() {
    scenario("10", 4, 1);
}

#[test]
fn member_is_replaced_online_and_rebuild_resumes_after_restart() {
    let dir = tempdir();
    let d = dir.path();
    assert_ok(&raidnbd(d, &["create", "--level", "5", "--chunk", "64K", "--size", "64M", "m0", "m1", "m2"]));
    std::fs::write(d.join("new"), vec![0u8; 64 << 20]).unwrap();
    std::fs::write(d.join("spare"), vec![0u8; 64 << 20]).unwrap();
    let socket = d.join("c.sock");
    let sock = socket.to_str().unwrap().to_string();
    let served = Served::start(d, "a", &["--control", &sock], &["m0", "m1", "m2"]);
    let uri = served.uri("a");
    workload(d, &uri, &["write", "7", "150"]);
    ctl(d, &socket, &["replace", "m1", "new"]);
    workload(d, &uri, &["write", "8", "150"]);
    let s = wait_for(d, &socket, "replace", all_in_sync);
    let names: Vec<String> =
        s["roles"].as_array().unwrap().iter().map(|r| r["member"].as_str().unwrap().to_string()).collect();
    assert!(names[1].ends_with("/new"), "{s:#}");
    workload(d, &uri, &["verify"]);

    // A slow rebuild interrupted by a restart resumes from its checkpoint.
    ctl(d, &socket, &["rebuild-speed", "1M", "1M"]);
    ctl(d, &socket, &["fail", "m2"]);
    ctl(d, &socket, &["remove", "m2"]);
    ctl(d, &socket, &["add", "spare"]);
    wait_for(d, &socket, "recovery to pass a checkpoint", |s| {
        s["work"]["kind"] == "recovery"
            && s["work"]["done"].as_u64().unwrap() * 8 >= s["work"]["total"].as_u64().unwrap()
    });
    served.stop();
    let served = Served::start(d, "a", &["--control", &sock], &["m0", "new", "spare"]);
    let s = status(d, &socket);
    assert!(s["state"].as_str().unwrap().contains("degraded"), "a member being rebuilt is not in sync yet: {s:#}");
    let resumed_at = s["roles"][2]["recovery_offset_sectors"].as_u64().expect("role 2 recovering");
    assert!(resumed_at > 0, "recovery resumes from its checkpoint, not from 0: {s:#}");
    ctl(d, &socket, &["rebuild-speed", "100M", "1G"]);
    wait_for(d, &socket, "recovery", all_in_sync);
    workload(d, &served.uri("a"), &["verify"]);
    served.stop();
    assert_ok(&raidnbd(d, &["check", "m0", "new", "spare"]));
}

#[test]
fn returning_member_is_re_added_from_the_bitmap() {
    let dir = tempdir();
    let d = dir.path();
    assert_ok(&raidnbd(
        d,
        &["create", "--level", "5", "--chunk", "64K", "--bitmap", "internal", "--size", "64M", "m0", "m1", "m2", "m3"],
    ));
    let socket = d.join("c.sock");
    let sock = socket.to_str().unwrap().to_string();
    let served = Served::start(d, "a", &["--fault-injection", "--control", &sock], &["m0", "m1", "m2", "m3"]);
    let uri = served.uri("a");
    workload(d, &uri, &["write", "21", "100"]);
    let m2 = d.join("m2").to_string_lossy().into_owned();
    ctl(d, &socket, &["fault", &m2, "all"]);
    workload(d, &uri, &["write", "22", "100"]);
    let s = status(d, &socket);
    assert_eq!(s["roles"][2]["state"], "faulty", "{s:#}");
    // The member comes back (the fault is gone): re-added, only dirty chunks copied.
    ctl(d, &socket, &["add", &m2]);
    let s = wait_for(d, &socket, "re-add recovery", all_in_sync);
    assert!(s["roles"][2]["member"].as_str().unwrap().ends_with("/m2"), "{s:#}");
    assert!(served.log_text().contains("member re-added"), "bitmap-based re-add, not a spare rebuild");
    workload(d, &uri, &["verify"]);
    served.stop();
    assert_ok(&raidnbd(d, &["check", "m0", "m1", "m2", "m3"]));
}

/// RAID5 with the defaults (partial parity log, no bitmap): a member that failed and is
/// added back by its own path is re-added from the away record (only what was written
/// meanwhile is copied); one whose superblock was lost meanwhile is rebuilt whole instead
/// of refused ("already part of the array").
#[test]
fn a_failed_member_added_again_is_re_added_from_the_away_record_or_rebuilt() {
    let dir = tempdir();
    let d = dir.path();
    assert_ok(&raidnbd(d, &["create", "--level", "5", "--chunk", "64K", "--size", "64M", "m0", "m1", "m2"]));
    let socket = d.join("c.sock");
    let sock = socket.to_str().unwrap().to_string();
    let served = Served::start(d, "a", &["--fault-injection", "--control", &sock], &["m0", "m1", "m2"]);
    let uri = served.uri("a");
    workload(d, &uri, &["write", "31", "100"]);
    let m2 = d.join("m2").to_string_lossy().into_owned();
    ctl(d, &socket, &["fault", &m2, "all"]);
    workload(d, &uri, &["write", "32", "100"]);
    let s = status(d, &socket);
    assert_eq!(s["roles"][2]["state"], "faulty", "{s:#}");
    assert!(s["away"]["chunks_written"].as_u64() >= Some(1), "{s:#}");
    ctl(d, &socket, &["add", &m2]);
    let s = wait_for(d, &socket, "re-add from the away record", all_in_sync);
    let tally = &s["last_recovery"];
    assert_eq!(tally["from_bitmap"], true, "{s:#}");
    assert!(tally["copied_bytes"].as_u64().unwrap() < 32 << 20, "only what was written: {s:#}");
    assert!(served.log_text().contains("member re-added"), "{}", served.log_text());
    workload(d, &uri, &["verify"]);

    // Failed again, and its superblock lost: `ctl add` rebuilds it as a new device.
    ctl(d, &socket, &["fault", &m2, "all"]);
    workload(d, &uri, &["write", "33", "100"]);
    let s = status(d, &socket);
    assert_eq!(s["roles"][2]["state"], "faulty", "{s:#}");
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&m2).unwrap();
        f.write_all_at(&[0u8; 4096], 4096).unwrap();
    }
    ctl(d, &socket, &["add", &m2]);
    let s = wait_for(d, &socket, "a full rebuild", |s| all_in_sync(s) && s["last_recovery"]["from_bitmap"] == false);
    assert!(s["roles"][2]["member"].as_str().unwrap().ends_with("/m2"), "{s:#}");
    assert!(served.log_text().contains("a failed member added again"), "{}", served.log_text());
    workload(d, &uri, &["verify"]);
    served.stop();
    assert_ok(&raidnbd(d, &["check", "m0", "m1", "m2"]));
}

/// A member that stores wrong bytes without an error (`ctl fault M corrupt-writes`, one byte
/// per 4 KiB): a RAID6 check names it for every mismatch it counts, repair rewrites that
/// member (reads give the written bytes again) and a check after finds nothing; a RAID5 check
/// counts the mismatch but cannot say which member is wrong.
#[test]
fn a_member_that_stores_wrong_bytes_is_named_by_a_raid6_check_and_repaired() {
    require_tool("qemu-io", "qemu-utils");
    for (level, members) in [("6", 5), ("5", 4)] {
        let dir = tempdir();
        let d = dir.path();
        let names: Vec<String> = (0..members).map(|i| format!("m{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let create = ["create", "--level", level, "--chunk", "64K", "--size", "32M"];
        assert_ok(&raidnbd(d, &[&create[..], &refs].concat()));
        let socket = d.join("control.sock");
        let served = Served::start(d, "a", &["--fault-injection", "--control", socket.to_str().unwrap()], &refs);
        let uri = served.uri("a");
        let liar = d.join("m2").canonicalize().unwrap().to_string_lossy().into_owned();
        ctl(d, &socket, &["fault", &liar, "corrupt-writes"]);
        run_ok(Command::new("qemu-io").args(["-f", "raw", &uri, "-c", "write -P 0x3c 0 4M"]));
        ctl(d, &socket, &["fault", &liar, "none"]);

        ctl(d, &socket, &["check"]);
        ctl(d, &socket, &["wait"]);
        let s = status(d, &socket);
        assert!(s["last_check"]["mismatch_cnt"].as_u64().unwrap() > 0, "raid{level}: the check counts it: {s:#}");
        let mismatches = s["mismatches"].as_array().unwrap();
        assert!(!mismatches.is_empty(), "raid{level}: {s:#}");
        if level == "5" {
            assert!(mismatches.iter().all(|m| m["member"].is_null()), "raid5 cannot name the member: {s:#}");
            served.stop();
            continue;
        }
        assert!(
            mismatches.iter().all(|m| m["member"].as_str().is_some_and(|n| n.ends_with("/m2"))),
            "raid6 names m2 for every mismatch: {s:#}"
        );
        ctl(d, &socket, &["repair"]);
        ctl(d, &socket, &["wait"]);
        ctl(d, &socket, &["check"]);
        ctl(d, &socket, &["wait"]);
        let s = status(d, &socket);
        assert_eq!(s["last_check"]["mismatch_cnt"], 0, "raid6: repaired: {s:#}");
        run_ok(Command::new("qemu-io").args(["-f", "raw", &uri, "-c", "read -P 0x3c 0 4M"]));
        served.stop();
    }
}
