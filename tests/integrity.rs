//! Per-block checksums (`create --integrity crc32c`): members that return wrong bytes
//! without an error — bytes flipped in the member files behind the server's back, a member
//! whose reads the fault injector corrupts — never reach the client: fio with verify over NBD
//! sees every byte right on raid1, raid5, raid6 and raid10, the member files are healed, the
//! counts name the member, and one that keeps lying is failed.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::ctl_rebuild::{ctl, wait_for};
use crate::util::*;

/// fio with verify over the first 24 MiB (`--do_verify=0` writes, `--verify_only` checks).
fn fio(uri: &str, args: &[&str]) -> Command {
    fio_verify(uri, "0", "24m", args)
}

fn data_offset_bytes(d: &Path, member: &str) -> u64 {
    let examine: Value = serde_json::from_str(&assert_ok(&raidnbd(d, &["examine", "--json", member]))).unwrap();
    examine[0]["data_offset_sectors"].as_u64().unwrap() * 512
}

fn canonical(d: &Path, name: &str) -> String {
    d.join(name).canonicalize().unwrap().to_string_lossy().into_owned()
}

/// The status entry of the role served by the member file `name`.
fn role<'a>(s: &'a Value, d: &Path, name: &str) -> &'a Value {
    let path = canonical(d, name);
    s["roles"].as_array().unwrap().iter().find(|r| r["member"] == path.as_str()).expect("the member has a role")
}

#[test]
fn wrong_bytes_in_member_files_are_never_served_and_are_healed() {
    require_tool("fio", "fio");
    for (level, members) in [("1", 2), ("5", 4), ("6", 5), ("10", 4)] {
        let dir = tempdir();
        let d = dir.path();
        let names: Vec<String> = (0..members).map(|i| format!("m{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut create = vec!["create", "--level", level, "--size", "24M", "--integrity", "crc32c"];
        if level != "1" {
            create.extend(["--chunk", "64K"]);
        }
        let created = assert_ok(&raidnbd(d, &[&create[..], &refs].concat()));
        assert!(created.contains("integrity: crc32c"), "{created}");
        let socket = d.join("control.sock");
        let served = Served::start(d, "a", &["--control", socket.to_str().unwrap()], &refs);
        let uri = served.uri("a");
        ctl(d, &socket, &["wait"]);
        run_ok(&mut fio(&uri, &["--do_verify=0"]));
        // Flip bytes of m1 (data, or parity) behind the server's back: 4 KiB apart, in several
        // stripes. (Written through the page cache; the server's reads see them.)
        let offset = data_offset_bytes(d, "m1");
        let file = std::fs::OpenOptions::new().read(true).write(true).open(d.join("m1")).unwrap();
        let mut flipped = Vec::new();
        for at in (0..16u64).map(|i| offset + (i << 20) + 4096 * (i % 3) + 17) {
            let mut byte = [0u8];
            file.read_exact_at(&mut byte, at).unwrap();
            file.write_all_at(&[byte[0] ^ 0xa5], at).unwrap();
            flipped.push((at, byte[0]));
        }
        file.sync_all().unwrap();
        run_ok(&mut fio(&uri, &["--verify_only"]));
        // A check reads what fio did not (parity, the other copy) and heals it too.
        ctl(d, &socket, &["check"]);
        ctl(d, &socket, &["wait"]);
        let s = wait_for(d, &socket, "the heals", |s| s["work"].is_null() && role(s, d, "m1")["bad_sectors"] == 0);
        let m1 = &role(&s, d, "m1")["integrity"];
        assert!(m1["reports"].as_u64().unwrap() >= 1, "raid{level}: m1 is named: {s:#}");
        assert!(m1["healed_sectors"].as_u64().unwrap() >= 8, "raid{level}: m1 healed: {s:#}");
        for other in names.iter().filter(|n| *n != "m1") {
            assert_eq!(role(&s, d, other)["integrity"]["reports"], 0, "raid{level}: {other} did not lie: {s:#}");
        }
        assert_eq!(s["last_check"]["mismatch_cnt"], 0, "raid{level}: {s:#}");
        run_ok(&mut fio(&uri, &["--verify_only"]));
        served.stop();
        for (at, byte) in flipped {
            let mut now = [0u8];
            file.read_exact_at(&mut now, at).unwrap();
            assert_eq!(now[0], byte, "raid{level}: m1 byte {at} healed on the member file");
        }
    }
}

#[test]
fn a_member_that_keeps_returning_wrong_bytes_is_failed_and_no_wrong_byte_is_served() {
    require_tool("fio", "fio");
    for (level, members) in [("1", 2), ("5", 4), ("6", 5), ("10", 4)] {
        let dir = tempdir();
        let d = dir.path();
        let names: Vec<String> = (0..members).map(|i| format!("m{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut create = vec!["create", "--level", level, "--size", "24M", "--integrity", "crc32c"];
        if level != "1" {
            create.extend(["--chunk", "64K"]);
        }
        assert_ok(&raidnbd(d, &[&create[..], &refs].concat()));
        let socket = d.join("control.sock");
        let served = Served::start(d, "a", &["--fault-injection", "--control", socket.to_str().unwrap()], &refs);
        let uri = served.uri("a");
        ctl(d, &socket, &["wait"]);
        run_ok(&mut fio(&uri, &["--do_verify=0"]));
        ctl(d, &socket, &["fault", &canonical(d, "m1"), "corrupt-reads"]);
        run_ok(&mut fio(&uri, &["--verify_only"]));
        // Mirrors may have read the other copies more: a check reads the liar's too.
        let s = wait_for(d, &socket, "idle", |s| s["work"].is_null());
        if role(&s, d, "m1")["state"] == "in_sync" {
            ctl(d, &socket, &["check"]);
        }
        let s = wait_for(d, &socket, "m1 failed", |s| role(s, d, "m1")["state"] == "faulty");
        let m1 = &role(&s, d, "m1")["integrity"];
        assert!(m1["corrupt_blocks"].as_u64().unwrap() > 0, "raid{level}: {s:#}");
        run_ok(&mut fio(&uri, &["--verify_only"]));
        served.stop();
    }
}

/// A member on another host whose server flips bytes in its replies (a raidnbd member server
/// with corrupt-reads): its copy is never served, the check names it, the local copy is not.
#[test]
fn an_nbd_member_server_that_flips_bytes_is_named_and_never_served() {
    require_tool("fio", "fio");
    let dir = tempdir();
    let d = dir.path();
    assert_ok(&raidnbd(d, &["create", "--level", "linear", "--size", "40M", "r0"]));
    let remote_socket = d.join("remote.sock");
    let remote = Served::start(d, "r", &["--fault-injection", "--control", remote_socket.to_str().unwrap()], &["r0"]);
    let member_uri = remote.uri("r");
    assert_ok(&raidnbd(d, &["create", "--level", "1", "--size", "40M", "--integrity", "crc32c", "m0", &member_uri]));
    let socket = d.join("control.sock");
    let served = Served::start(d, "a", &["--control", socket.to_str().unwrap()], &["m0", &member_uri]);
    let uri = served.uri("a");
    ctl(d, &socket, &["wait"]);
    run_ok(&mut fio(&uri, &["--do_verify=0"]));
    ctl(d, &remote_socket, &["fault", &canonical(d, "r0"), "corrupt-reads"]);
    run_ok(&mut fio(&uri, &["--verify_only"]));
    // The reads may have met the remote copy often enough to fail it; if not, a check reads it.
    let s = wait_for(d, &socket, "idle", |s| s["work"].is_null());
    let remote_role = |s: &Value| -> Value {
        s["roles"].as_array().unwrap().iter().find(|r| r["member"] == member_uri.as_str()).cloned().unwrap()
    };
    if remote_role(&s)["state"] == "in_sync" {
        ctl(d, &socket, &["check"]);
        ctl(d, &socket, &["wait"]);
    }
    let s = wait_for(d, &socket, "the remote copy named", |s| {
        let roles = s["roles"].as_array().unwrap();
        roles.iter().any(|r| r["member"] == member_uri.as_str() && r["integrity"]["reports"].as_u64() > Some(0))
    });
    assert_eq!(role(&s, d, "m0")["integrity"]["reports"], 0, "the local copy did not lie: {s:#}");
    run_ok(&mut fio(&uri, &["--verify_only"]));
    ctl(d, &remote_socket, &["fault", &canonical(d, "r0"), "none"]);
    served.stop();
    remote.stop();
}

/// `serve --scrub-interval`: a check starts on its own, finds wrong bytes no client read
/// (parity and data alike) and heals them; the figures are in `ctl status` and the metrics.
#[test]
fn a_scheduled_check_heals_what_no_client_read_and_the_metrics_count_it() {
    require_tool("qemu-io", "qemu-utils");
    let dir = tempdir();
    let d = dir.path();
    let create = ["create", "--level", "5", "--chunk", "64K", "--size", "24M", "--integrity", "crc32c"];
    assert_ok(&raidnbd(d, &[&create[..], &["m0", "m1", "m2"]].concat()));
    let socket = d.join("control.sock");
    let metrics_port = free_port();
    let metrics = format!("127.0.0.1:{metrics_port}");
    let extra = ["--control", socket.to_str().unwrap(), "--scrub-interval", "2s", "--metrics", &metrics];
    let served = Served::start(d, "a", &extra, &["m0", "m1", "m2"]);
    run_ok(Command::new("qemu-io").args(["-f", "raw", &served.uri("a"), "-c", "write -P 0x6b 0 16M"]));
    let offset = data_offset_bytes(d, "m1");
    let file = std::fs::OpenOptions::new().read(true).write(true).open(d.join("m1")).unwrap();
    let at: Vec<u64> = (0..8u64).map(|i| offset + i * (64 << 10) + 100).collect();
    for &a in &at {
        file.write_all_at(&[0xff], a).unwrap(); // neither the data (0x6b) nor the parity (0)
    }
    file.sync_all().unwrap();
    let s = wait_for(d, &socket, "a scheduled check to heal m1", |s| {
        let m1 = role(s, d, "m1");
        m1["integrity"]["healed_sectors"].as_u64() >= Some(8 * 8) && m1["bad_sectors"] == 0
    });
    assert_eq!(role(&s, d, "m1")["integrity"]["reports"], 8, "each wrong block reported once: {s:#}");
    let text = crate::metrics::scrape(metrics_port, false);
    let line = text.lines().find(|l| l.starts_with("raidnbd_array_role_healed_sectors") && l.contains("role=\"1\""));
    let healed = line.and_then(|l| l.split_whitespace().last()).and_then(|v| v.parse::<u64>().ok());
    assert!(healed >= Some(64), "{text}");
    assert!(text.contains("raidnbd_array_role_corrupt_blocks"), "{text}");
    for &a in &at {
        let mut byte = [0u8];
        file.read_exact_at(&mut byte, a).unwrap();
        assert_ne!(byte[0], 0xff, "healed on the member file at {a}");
    }
    run_ok(Command::new("qemu-io").args(["-f", "raw", &served.uri("a"), "-c", "read -P 0x6b 0 16M"]));
    served.stop();
}

/// `raidnbd grow --integrity crc32c` on an array at rest made without checksums: refused
/// while the members have no room after md's data area, done once they grew (a resized
/// volume); from then on wrong bytes are caught and healed.
#[test]
fn checksums_are_added_to_an_array_whose_members_grew() {
    require_tool("qemu-io", "qemu-utils");
    let dir = tempdir();
    let d = dir.path();
    let members = ["m0", "m1", "m2", "m3"];
    assert_ok(&raidnbd(d, &[&["create", "--level", "5", "--chunk", "64K", "--size", "24M"][..], &members].concat()));
    let served = Served::start(d, "a", &[], &members);
    run_ok(Command::new("qemu-io").args(["-f", "raw", &served.uri("a"), "-c", "write -P 0x5d 0 16M"]));
    served.stop();
    let examine = |m: &str| -> Value {
        serde_json::from_str::<Value>(&assert_ok(&raidnbd(d, &["examine", "--json", m]))).unwrap()[0].clone()
    };
    assert!(examine("m0")["checksums"].is_null());
    let grow = [&["grow", "--integrity", "crc32c"][..], &members].concat();
    assert_user_error(&raidnbd(d, &grow), "no room for checksums");
    for m in members {
        std::fs::OpenOptions::new().write(true).open(d.join(m)).unwrap().set_len(25 << 20).unwrap();
    }
    let out = assert_ok(&raidnbd(d, &grow));
    assert!(out.contains("checksums of every 4 KiB written on 4 members"), "{out}");
    assert_eq!(examine("m3")["checksums"]["algorithm"], "crc32c");
    let detail = assert_ok(&raidnbd(d, &[&["detail"][..], &members].concat()));
    assert!(detail.contains("crc32c of every 4 KiB on 4 of 4 members"), "{detail}");
    let offset = data_offset_bytes(d, "m2");
    let file = std::fs::OpenOptions::new().write(true).open(d.join("m2")).unwrap();
    file.write_all_at(&[0xff; 16], offset + (2 << 20) + 8).unwrap();
    let socket = d.join("control.sock");
    let served = Served::start(d, "a", &["--control", socket.to_str().unwrap()], &members);
    run_ok(Command::new("qemu-io").args(["-f", "raw", &served.uri("a"), "-c", "read -P 0x5d 0 16M"]));
    ctl(d, &socket, &["check"]);
    ctl(d, &socket, &["wait"]);
    let s = wait_for(d, &socket, "m2 healed", |s| role(s, d, "m2")["bad_sectors"] == 0 && s["work"].is_null());
    assert!(role(&s, d, "m2")["integrity"]["reports"].as_u64() >= Some(1), "{s:#}");
    assert_eq!(s["last_check"]["mismatch_cnt"], 0, "{s:#}");
    served.stop();
}
