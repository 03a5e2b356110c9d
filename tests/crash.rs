//! Crash safety: SIGKILL the server at random moments while a client writes with periodic
//! FLUSHes and FUA writes; restart; every block whose flush (or FUA write) was acknowledged
//! reads back; after the resync the offline check finds no mismatch. Many seeds. With md's
//! partial parity log (raid5's default), the same holds when a member is lost right after
//! the crash: the write hole is closed.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::util::*;

fn script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/crash_writer.py")
}

fn crash_rounds(level: &str, members: usize, seeds: std::ops::Range<u64>) {
    assert!(Path::new(PYTHON).exists(), "/usr/bin/python3 is required: apt-get install python3-libnbd");
    let dir = tempdir();
    let d = dir.path();
    let names: Vec<String> = (0..members).map(|i| format!("m{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut create = vec!["create", "--level", level, "--size", "40M"];
    if level != "1" {
        create.extend(["--chunk", "16K"]);
    }
    create.extend(&refs);
    assert_ok(&raidnbd(d, &create));
    let log = d.join("durable.log");
    let socket = d.join("c.sock");
    let sock = socket.to_str().unwrap().to_string();
    for seed in seeds {
        let served = Served::start(d, "a", &["--control", &sock], &refs);
        let uri = served.uri("a");
        // The previous crash left the array dirty: it must still hold every durable block.
        run_ok(Command::new(PYTHON).arg(script()).arg(&uri).arg(&log).arg("verify"));
        let mut writer = Command::new(PYTHON)
            .arg(script())
            .arg(&uri)
            .arg(&log)
            .arg(seed.to_string())
            .stdout(Stdio::null())
            .spawn()
            .expect("writer");
        std::thread::sleep(Duration::from_millis(300 + (seed * 7919) % 1200));
        let mut served = served;
        served.child.kill().expect("SIGKILL the server");
        served.child.wait().unwrap();
        writer.wait().unwrap();
    }
    // Final restart: verify, let the resync finish, stop cleanly, check offline.
    let served = Served::start(d, "a", &["--control", &sock], &refs);
    run_ok(Command::new(PYTHON).arg(script()).arg(served.uri("a")).arg(&log).arg("verify"));
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let out = assert_ok(&raidnbd(d, &["ctl", "--socket", &sock, "status", "--json"]));
        let s: Value = serde_json::from_str::<Value>(&out).unwrap()[0].clone();
        if s["resync_pending"] == false && s["work"].is_null() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "resync did not finish: {s:#}");
        std::thread::sleep(Duration::from_millis(200));
    }
    served.stop();
    let out = raidnbd(d, &[&["check", "--json"][..], &refs].concat());
    let v: Value = serde_json::from_str(&assert_ok(&out)).unwrap();
    assert_eq!(v["mismatch_cnt"], 0, "after resync parity/mirrors agree with data");
    let detail: Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &[&["detail", "--json"][..], &refs].concat()))).unwrap();
    assert_eq!(detail["clean"], true);
}

#[test]
fn raid5_survives_sigkill() {
    crash_rounds("5", 4, 0..6);
}

#[test]
fn raid6_survives_sigkill() {
    crash_rounds("6", 5, 100..104);
}

#[test]
fn raid1_survives_sigkill() {
    crash_rounds("1", 3, 200..204);
}

#[test]
fn raid10_survives_sigkill() {
    crash_rounds("10", 4, 300..304);
}

#[test]
fn dirty_degraded_parity_array_starts_read_only_unless_forced() {
    require_tool("qemu-io", "qemu-utils");
    let dir = tempdir();
    let d = dir.path();
    assert_ok(&raidnbd(
        d,
        &[
            "create",
            "--level",
            "5",
            "--consistency-policy",
            "resync",
            "--chunk",
            "64K",
            "--size",
            "32M",
            "m0",
            "m1",
            "m2",
        ],
    ));
    let mut served = Served::start(d, "a", &[], &["m0", "m1", "m2"]);
    run_ok(Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 9 0 1M", &served.uri("a")]));
    served.child.kill().unwrap(); // unclean: the array stays dirty
    served.child.wait().unwrap();

    let served = Served::start(d, "a", &[], &["m0", "m1"]);
    let log = served.log_text();
    assert!(log.contains("write hole") && log.contains("READ-ONLY"), "explains the write hole: {log}");
    run_ok(Command::new("qemu-io").args(["-f", "raw", "-r", "-c", "read -P 9 0 1M", &served.uri("a")]));
    let out = Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 8 0 4k", &served.uri("a")]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("Operation not permitted") || text.contains("read-only") || !out.status.success(),
        "write refused: {text}"
    );
    drop(served);

    let served = Served::start(d, "a", &["--force"], &["m0", "m1"]);
    run_ok(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 8 0 4k",
        "-c",
        "read -P 8 0 4k",
        &served.uri("a"),
    ]));
    served.stop();
}

fn ctl(dir: &Path, socket: &str, args: &[&str]) -> Value {
    let out = assert_ok(&raidnbd(dir, &[&["ctl", "--socket", socket][..], args].concat()));
    serde_json::from_str::<Value>(&out).map_or(Value::Null, |v| v[0].clone())
}

/// The write hole, closed: per seed a fresh raid5 (partial parity log by default), SIGKILL
/// during writes, one member removed, serve again. Every durable block with no write in
/// flight at the crash reads back (one with a write in flight may have had that write's
/// data on the lost member: like md's, the log does not protect data in flight), no resync
/// is pending, the array takes writes; a new member rebuilt in, the offline check finds no
/// mismatch.
#[test]
fn raid5_with_ppl_survives_sigkill_and_then_a_lost_member() {
    assert!(Path::new(PYTHON).exists(), "/usr/bin/python3 is required: apt-get install python3-libnbd");
    require_tool("qemu-io", "qemu-utils");
    for seed in 400..406u64 {
        let dir = tempdir();
        let d = dir.path();
        let names: Vec<String> = (0..4).map(|i| format!("m{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let out = assert_ok(&raidnbd(
            d,
            &[&["create", "--level", "5", "--chunk", "16K", "--size", "40M"][..], &refs].concat(),
        ));
        assert!(out.contains("consistency policy: ppl"), "raid5 gets the partial parity log by default: {out}");
        let log = d.join("durable.log");
        let socket = d.join("c.sock");
        let sock = socket.to_str().unwrap().to_string();
        let mut served = Served::start(d, "a", &["--control", &sock], &refs);
        let mut writer = Command::new(PYTHON)
            .arg(script())
            .arg(served.uri("a"))
            .arg(&log)
            .arg(seed.to_string())
            .stdout(Stdio::null())
            .spawn()
            .expect("writer");
        std::thread::sleep(Duration::from_millis(400 + (seed * 7919) % 1200));
        served.child.kill().expect("SIGKILL the server");
        served.child.wait().unwrap();
        writer.wait().unwrap();

        // A member is lost right after the crash.
        let lost = &names[(seed % 4) as usize];
        std::fs::rename(d.join(lost), d.join("lost")).unwrap();
        let survivors: Vec<&str> = refs.iter().copied().filter(|n| n != lost).collect();
        let served = Served::start(d, "a", &["--control", &sock], &survivors);
        let text = served.log_text();
        assert!(text.contains("partial parity log replayed") && !text.contains("READ-ONLY"), "seed {seed}: {text}");
        let uri = served.uri("a");
        run_ok(Command::new(PYTHON).arg(script()).arg(&uri).arg(&log).arg("verify-settled"));
        let s = ctl(d, &sock, &["status", "--json"]);
        assert_eq!(s["resync_pending"], false, "seed {seed}: the replay leaves nothing to resync: {s:#}");
        run_ok(Command::new("qemu-io").args([
            "-f",
            "raw",
            "-c",
            "write -P 7 100M 64k",
            "-c",
            "read -P 7 100M 64k",
            &uri,
        ]));

        // A new member takes the lost one's place; then every member must agree.
        std::fs::write(d.join("new"), vec![0u8; 40 << 20]).unwrap();
        ctl(d, &sock, &["add", &d.join("new").to_string_lossy()]);
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let s = ctl(d, &sock, &["status", "--json"]);
            let in_sync = s["roles"].as_array().unwrap().iter().all(|r| r["state"] == "in_sync");
            if in_sync && s["work"].is_null() {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "seed {seed}: rebuild did not finish: {s:#}");
            std::thread::sleep(Duration::from_millis(200));
        }
        run_ok(Command::new(PYTHON).arg(script()).arg(&uri).arg(&log).arg("verify-settled"));
        served.stop();
        let members: Vec<&str> = survivors.iter().copied().chain(["new"]).collect();
        let v: Value =
            serde_json::from_str(&assert_ok(&raidnbd(d, &[&["check", "--json"][..], &members].concat()))).unwrap();
        assert_eq!(v["mismatch_cnt"], 0, "seed {seed}: parity agrees with the data");
    }
}
