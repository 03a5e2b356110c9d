//! md's write journal through the binary: what `create` refuses, what the served export
//! advertises, what `detail` and `ctl status` say, and a journal left out at start (read-only,
//! as md). Crash safety with a lost member is in crash.rs; kernel interop in the VM rig
//! (`raidnbd-journal`) and raid-core's md_journal tests.

use std::process::Command;

use serde_json::Value;

use crate::util::*;

#[test]
fn create_refuses_what_md_refuses() {
    let dir = tempdir();
    let d = dir.path();
    let members = ["m0", "m1", "m2", "m3"];
    let create = |extra: &[&str]| {
        let args: Vec<&str> =
            ["create", "--size", "16M", "--force"].iter().chain(extra).chain(members.iter()).copied().collect();
        raidnbd(d, &args)
    };
    assert_user_error(&create(&["--level", "1", "--write-journal", "j"]), "raid4, raid5 and raid6");
    assert_user_error(&create(&["--level", "6", "--write-journal", "j", "--bitmap", "internal"]), "exclude each other");
    assert_user_error(&create(&["--level", "6", "--consistency-policy", "journal"]), "needs --write-journal");
    assert_user_error(&create(&["--level", "5", "--write-journal", "m0"]), "is one of the members");
    assert_user_error(
        &create(&["--level", "5", "--write-journal", "j", "--consistency-policy", "ppl"]),
        "makes the consistency policy journal",
    );
    std::fs::write(d.join("tiny"), vec![0u8; 1 << 20]).unwrap();
    assert_user_error(&create(&["--level", "6", "--write-journal", "tiny"]), "the journal needs at least");
}

#[test]
fn a_journaled_array_is_served_without_trim_and_reports_its_journal() {
    require_tool("nbdinfo", "libnbd-bin");
    require_tool("qemu-io", "qemu-utils");
    let dir = tempdir();
    let d = dir.path();
    let out = assert_ok(&raidnbd(
        d,
        &["create", "--level", "6", "--chunk", "64K", "--size", "16M", "--write-journal", "j", "m0", "m1", "m2", "m3"],
    ));
    assert!(out.contains("consistency policy: journal") && !out.contains("write hole is open"), "{out}");
    // Without a journal, create says the hole is open and what closes it.
    let plain = ["create", "--level", "6", "--chunk", "64K", "--size", "16M", "n0", "n1", "n2", "n3"];
    let out = assert_ok(&raidnbd(d, &plain));
    assert!(out.contains("note: the write hole is open") && out.contains("--write-journal DEVICE"), "{out}");
    let detail = assert_ok(&raidnbd(d, &["detail", "m0", "m1", "m2", "m3", "j"]));
    assert!(detail.contains("Consistency Policy : journal") && detail.contains("journal           j"), "{detail}");
    let socket = d.join("c.sock");
    let sock = socket.to_str().unwrap();
    let served = Served::start(d, "a", &["--control", sock], &["m0", "m1", "m2", "m3", "j"]);
    let info: Value =
        serde_json::from_str(&run_ok(Command::new("nbdinfo").args(["--json", &served.uri("a")]))).unwrap();
    let export = &info["exports"][0];
    assert_eq!(export["can_trim"], false, "md does not advertise discard with a journal: {export:#}");
    assert_eq!(export["can_flush"], true, "{export:#}");
    // An unaligned write (widened to whole pages under the stripe lock) reads back.
    run_ok(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0x61 1000 70000",
        "-c",
        "read -P 0x61 1000 70000",
        "-c",
        "read -P 0 0 1000",
        "-c",
        "write -z 1M 512k",
        "-c",
        "read -P 0 1M 512k",
        &served.uri("a"),
    ]));
    let status = assert_ok(&raidnbd(d, &["ctl", "--socket", sock, "status", "--json"]));
    let s: Value = serde_json::from_str::<Value>(&status).unwrap()[0].clone();
    assert!(s["journal"]["units_written"].as_u64() >= Some(2), "{s:#}");
    // The unaligned write alone: 18 data pages, and P and Q of its 16 rows.
    assert!(s["journal"]["pages_logged"].as_u64() >= Some(18 + 2 * 16), "{s:#}");
    let text = assert_ok(&raidnbd(d, &["ctl", "--socket", sock, "status"]));
    assert!(text.contains("write journal:"), "{text}");
    served.stop();

    // Without its journal the array is served read-only (as md), and says why.
    let served = Served::start(d, "a", &[], &["m0", "m1", "m2", "m3"]);
    let log = served.log_text();
    assert!(log.contains("missing or stale") && log.contains("READ-ONLY"), "{log}");
    let out = Command::new("qemu-io").args(["-f", "raw", "-c", "write 0 4k", &served.uri("a")]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("failed") || said.contains("denied") || !out.status.success(), "a write is refused: {said}");
    run_ok(Command::new("qemu-io").args(["-f", "raw", "-r", "-c", "read -P 0x61 1000 70000", &served.uri("a")]));
    served.stop();
}
