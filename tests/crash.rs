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

/// The writer got writes acknowledged as durable before the crash (else the round tests nothing).
#[track_caller]
fn assert_durable_writes_logged(log: &Path, seed: u64) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    assert!(text.contains("\"d\""), "seed {seed}: the writer logged no durable write before the crash");
}

fn crash_rounds(level: &str, members: usize, seeds: std::ops::Range<u64>, create_args: &[&str]) {
    require_libnbd_python();
    let dir = tempdir();
    let d = dir.path();
    let names: Vec<String> = (0..members).map(|i| format!("m{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut create = vec!["create", "--level", level, "--size", "40M"];
    if level != "1" {
        create.extend(["--chunk", "16K"]);
    }
    create.extend(create_args);
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
        assert_durable_writes_logged(&log, seed);
    }
    // Final restart: verify, let the resync finish, stop cleanly, check offline.
    let served = Served::start(d, "a", &["--control", &sock], &refs);
    run_ok(Command::new(PYTHON).arg(script()).arg(served.uri("a")).arg(&log).arg("verify"));
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let out = assert_ok(&raidnbd(d, &["ctl", "--socket", &sock, "status", "--json"]));
        let s: Value = serde_json::from_str::<Value>(&out).unwrap()[0].clone();
        if s["resync_pending"] == false && s["work"].is_null() {
            // With checksums: what the crashes left half-written was stamped again, never
            // reported as corruption.
            for role in s["roles"].as_array().unwrap().iter().filter(|r| !r["integrity"].is_null()) {
                let i = &role["integrity"];
                assert_eq!((&i["corrupt_blocks"], &i["reports"]), (&Value::from(0), &Value::from(0)), "{s:#}");
            }
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
    crash_rounds("5", 4, 0..6, &[]);
}

/// With checksums (raid5: a partial parity log, no resync; every checksum untrusted after a
/// crash until a check stamps them).
#[test]
fn raid5_with_checksums_survives_sigkill() {
    crash_rounds("5", 4, 400..405, &["--integrity", "crc32c"]);
}

/// With checksums and a write-intent bitmap: only the dirty chunks' checksums are untrusted.
#[test]
fn raid1_with_checksums_and_a_bitmap_survives_sigkill() {
    crash_rounds("1", 3, 500..504, &["--integrity", "crc32c", "--bitmap", "internal"]);
}

#[test]
fn raid6_survives_sigkill() {
    crash_rounds("6", 5, 100..104, &[]);
}

#[test]
fn raid1_survives_sigkill() {
    crash_rounds("1", 3, 200..204, &[]);
}

#[test]
fn raid10_survives_sigkill() {
    crash_rounds("10", 4, 300..304, &[]);
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

#[test]
fn raid5_with_ppl_survives_sigkill_and_then_a_lost_member() {
    sigkill_then_a_lost_member("5", 4, Log::Ppl, 400..406);
}

/// md's journal closes the hole on raid6 and raid4 too; with it a write in flight at the
/// crash is whole or absent on every stripe, so every durable block reads back.
#[test]
fn raid6_with_a_journal_survives_sigkill_and_then_a_lost_member() {
    sigkill_then_a_lost_member("6", 5, Log::Journal, 500..505);
}

#[test]
fn raid4_with_a_journal_survives_sigkill_and_then_a_lost_member() {
    sigkill_then_a_lost_member("4", 4, Log::Journal, 600..603);
}

#[derive(PartialEq)]
enum Log {
    Ppl,
    Journal,
}

/// The write hole, closed: per seed a fresh array, SIGKILL during writes, one member
/// removed, serve again. Every durable block reads back as its durable version or a later
/// one sent, sector by sector. With the partial parity log, sectors a write was in flight to
/// on the lost member may read as EIO instead (the log cannot rebuild them: md would return
/// garbage there; raidnbd marks them bad); with the journal none do. No resync is pending, the array takes writes; a new
/// member rebuilt in, the offline check finds no mismatch.
fn sigkill_then_a_lost_member(level: &str, members: usize, log_kind: Log, seeds: std::ops::Range<u64>) {
    require_libnbd_python();
    require_tool("qemu-io", "qemu-utils");
    for seed in seeds {
        let dir = tempdir();
        let d = dir.path();
        let names: Vec<String> = (0..members).map(|i| format!("m{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let journal: &[&str] = if log_kind == Log::Journal { &["j"] } else { &[] };
        let mut create = vec!["create", "--level", level, "--chunk", "16K", "--size", "40M"];
        if log_kind == Log::Journal {
            create.extend(["--write-journal", "j"]);
        }
        let out = assert_ok(&raidnbd(d, &[&create[..], &refs].concat()));
        let policy = if log_kind == Log::Ppl { "consistency policy: ppl" } else { "consistency policy: journal" };
        assert!(out.contains(policy), "{out}");
        let log = d.join("durable.log");
        let socket = d.join("c.sock");
        let sock = socket.to_str().unwrap().to_string();
        let served_members: Vec<&str> = refs.iter().chain(journal).copied().collect();
        let mut served = Served::start(d, "a", &["--control", &sock], &served_members);
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
        assert_durable_writes_logged(&log, seed);

        // A member is lost right after the crash.
        let lost = &names[(seed % members as u64) as usize];
        std::fs::rename(d.join(lost), d.join("lost")).unwrap();
        let survivors: Vec<&str> = refs.iter().copied().filter(|n| n != lost).collect();
        let served_survivors: Vec<&str> = survivors.iter().chain(journal).copied().collect();
        let served = Served::start(d, "a", &["--control", &sock], &served_survivors);
        let text = served.log_text();
        let replayed = if log_kind == Log::Ppl { "partial parity log replayed" } else { "write journal replayed" };
        assert!(text.contains(replayed) && !text.contains("READ-ONLY"), "seed {seed}: {text}");
        let uri = served.uri("a");
        let verify = if log_kind == Log::Ppl { "verify-or-eio" } else { "verify" };
        run_ok(Command::new(PYTHON).arg(script()).arg(&uri).arg(&log).arg(verify));
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
        let s = ctl(d, &sock, &["status", "--json"]);
        let logged = match log_kind {
            Log::Ppl => s["parity_log"]["entries_logged"].as_u64(),
            Log::Journal => s["journal"]["units_written"].as_u64(),
        };
        assert!(logged >= Some(1), "seed {seed}: the write was logged: {s:#}");

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
        run_ok(Command::new(PYTHON).arg(script()).arg(&uri).arg(&log).arg(verify));
        served.stop();
        let members: Vec<&str> = survivors.iter().copied().chain(["new"]).chain(journal.iter().copied()).collect();
        let v: Value =
            serde_json::from_str(&assert_ok(&raidnbd(d, &[&["check", "--json"][..], &members].concat()))).unwrap();
        assert_eq!(v["mismatch_cnt"], 0, "seed {seed}: parity agrees with the data");
    }
}
