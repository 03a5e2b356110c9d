//! Level, layout and chunk changes through the binary: the level online with `ctl grow
//! --level` while a client writes, SIGKILLed while the new role is rebuilt, and at rest with
//! `raidnbd grow --level` (md's takeover, no data moves); the layout and chunk online with
//! `ctl grow --layout --chunk` (md's reshape), SIGKILLed inside it; mdadm reads every result
//! as raidnbd wrote it.

use std::process::Command;

use serde_json::Value;

use crate::grow::{field, fio_region, mdadm_examine, serve_paced, sigkill_rounds, status, wait_resync_done, writer};
use crate::util::*;

/// raid5 -> raid6 with Q rebuilt onto a new member, ten SIGKILLs during the rebuild under a
/// crash writer and fio verify; then back to raid5 with Q's member a spare.
#[test]
fn a_raid5_becomes_a_raid6_online_through_sigkills_and_back() {
    require_libnbd_python();
    require_tool("fio", "fio");
    require_tool("mdadm", "mdadm");
    let dir = tempdir();
    let d = dir.path();
    let create = ["create", "--level", "5", "--chunk", "64K", "--consistency-policy", "resync", "--size", "48M"];
    assert_ok(&raidnbd(d, &[&create[..], &["m0", "m1", "m2"]].concat()));
    std::fs::File::create(d.join("m3")).unwrap().set_len(48 << 20).unwrap();
    let all = ["m0", "m1", "m2", "m3"];
    let log = d.join("durable.log");
    let sock = d.join("c.sock").to_str().unwrap().to_string();
    let serve = |members: &[&str]| serve_paced(d, &sock, members);
    let served = serve(&all[..3]);
    let size = status(d, &sock)["size_bytes"].as_u64().unwrap();
    run_ok(&mut fio_region(&served.uri("a"), &["--do_verify=1"]));
    let out = assert_ok(&raidnbd(d, &["ctl", "--socket", &sock, "grow", "--level", "6", "--add", "m3"]));
    assert!(out.contains("raid5 -> raid6: 4 members"), "{out}");
    let s = status(d, &sock);
    assert_eq!((s["level"].as_str(), s["size_bytes"].as_u64()), (Some("raid6"), Some(size)), "{s:#}");
    assert_eq!(s["layout"], "64K chunk, left-symmetric-6", "{s:#}");
    let served = sigkill_rounds(
        d,
        &sock,
        &log,
        served,
        || serve(&all),
        |s, round| {
            assert!(!s["work"].is_null() || s["resync_pending"] == true, "round {round}: Q is still rebuilt: {s:#}")
        },
        |s, round| assert_eq!(s["level"], "raid6", "round {round}: the new level survives a SIGKILL"),
    );
    assert_ok(&raidnbd(d, &["ctl", "--socket", &sock, "rebuild-speed", "100M", "200M"]));
    assert_ok(&raidnbd(d, &["ctl", "--socket", &sock, "wait", "--timeout", "120s"]));
    let s = status(d, &sock);
    assert!(s["roles"].as_array().unwrap().iter().all(|r| r["state"] == "in_sync"), "{s:#}");
    run_ok(Command::new(PYTHON).arg(writer()).arg(served.uri("a")).arg(&log).arg("verify"));
    run_ok(&mut fio_region(&served.uri("a"), &["--verify_only"]));
    served.stop();
    let check: Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &[&["check", "--json"][..], &all].concat()))).unwrap();
    assert_eq!(check["mismatch_cnt"], 0, "P and Q match the data");
    for m in all {
        let theirs = mdadm_examine(&d.join(m));
        assert_eq!(field(&theirs, "Raid Level"), "raid6", "{m}: {theirs:?}");
        assert_eq!(field(&theirs, "Raid Devices"), "4", "{m}: {theirs:?}");
        assert_eq!(field(&theirs, "Layout"), "left-symmetric-6", "{m}: {theirs:?}");
        assert!(field(&theirs, "Device Role").starts_with("Active device"), "{m}: {theirs:?}");
    }

    // Back to raid5: Q's member becomes a spare; the data stays.
    let served = serve(&all);
    let out = assert_ok(&raidnbd(d, &["ctl", "--socket", &sock, "grow", "--level", "5"]));
    assert!(out.contains("raid6 -> raid5: 3 members"), "{out}");
    let s = status(d, &sock);
    assert_eq!(
        (s["level"].as_str(), s["layout"].as_str()),
        (Some("raid5"), Some("64K chunk, left-symmetric")),
        "{s:#}"
    );
    assert_eq!(s["spares"], serde_json::json!([d.join("m3").to_str().unwrap()]), "{s:#}");
    run_ok(Command::new(PYTHON).arg(writer()).arg(served.uri("a")).arg(&log).arg("verify"));
    run_ok(&mut fio_region(&served.uri("a"), &["--verify_only"]));
    served.stop();
    let theirs = mdadm_examine(&d.join("m3"));
    assert_eq!((field(&theirs, "Raid Level"), field(&theirs, "Device Role")), ("raid5", "spare"), "{theirs:?}");
    let check: Value = serde_json::from_str(&assert_ok(&raidnbd(d, &["check", "--json", "m0", "m1", "m2"]))).unwrap();
    assert_eq!(check["mismatch_cnt"], 0);
}

/// At rest: a mirror becomes a raid5 of two and back (md's takeover), the data and mdadm's
/// reading agreeing each time; what md cannot take over says why.
#[test]
fn a_mirror_at_rest_becomes_a_raid5_and_back() {
    require_tool("mdadm", "mdadm");
    let dir = tempdir();
    let d = dir.path();
    assert_ok(&raidnbd(d, &["create", "--level", "1", "--size", "32M", "m0", "m1"]));
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 9) as u8).collect();
    std::fs::write(d.join("data"), &data).unwrap();
    let copy_in = || {
        let served = Served::start(d, "a", &[], &["m0", "m1"]);
        run_ok(Command::new("nbdcopy").arg(d.join("data")).arg(served.uri("a")));
        served.stop();
    };
    let read_back = || {
        let served = Served::start(d, "a", &[], &["m0", "m1"]);
        run_ok(Command::new("nbdcopy").arg(served.uri("a")).arg(d.join("back")));
        served.stop();
        std::fs::read(d.join("back")).unwrap()
    };
    copy_in();
    let size = read_back().len();
    assert_user_error(&raidnbd(d, &["grow", "--level", "6", "m0", "m1"]), "no takeover");
    assert_usage_error(&raidnbd(d, &["grow", "--level", "5", "--raid-devices", "2", "m0", "m1"]), "--raid-devices");
    let out = assert_ok(&raidnbd(d, &["grow", "--level", "5", "m0", "m1"]));
    assert!(out.contains("raid1 -> raid5: 2 members"), "{out}");
    for m in ["m0", "m1"] {
        let theirs = mdadm_examine(&d.join(m));
        assert_eq!(field(&theirs, "Raid Level"), "raid5", "{m}: {theirs:?}");
        assert_eq!(field(&theirs, "Chunk Size"), "64K", "{m}: {theirs:?}");
        assert_eq!(field(&theirs, "Layout"), "left-symmetric", "{m}: {theirs:?}");
    }
    let back = read_back();
    assert_eq!(back.len(), size, "the size is kept");
    assert!(back[..data.len()] == data[..], "the data is where it was");
    let check: Value = serde_json::from_str(&assert_ok(&raidnbd(d, &["check", "--json", "m0", "m1"]))).unwrap();
    assert_eq!(check["mismatch_cnt"], 0, "a raid5 of two is a mirror");
    let out = assert_ok(&raidnbd(d, &["grow", "--level", "1", "m0", "m1"]));
    assert!(out.contains("raid5 -> raid1"), "{out}");
    assert_eq!(field(&mdadm_examine(&d.join("m1")), "Raid Level"), "raid1");
    assert!(read_back()[..data.len()] == data[..], "the data is where it was");
}

/// md's reshape of the layout and the chunk (`mdadm --grow --layout --chunk`): online under
/// the crash writer and fio verify, ten SIGKILLs inside it, then check 0 and mdadm reading the
/// new layout and chunk.
#[test]
fn a_raid5_changes_its_layout_and_chunk_online_through_sigkills() {
    require_libnbd_python();
    require_tool("fio", "fio");
    require_tool("mdadm", "mdadm");
    let dir = tempdir();
    let d = dir.path();
    let create = ["create", "--level", "5", "--chunk", "64K", "--consistency-policy", "resync", "--size", "48M"];
    let members = ["m0", "m1", "m2"];
    assert_ok(&raidnbd(d, &[&create[..], &members].concat()));
    let log = d.join("durable.log");
    let sock = d.join("c.sock").to_str().unwrap().to_string();
    let serve = || serve_paced(d, &sock, &members);
    let served = serve();
    let size = status(d, &sock)["size_bytes"].as_u64().unwrap();
    run_ok(&mut fio_region(&served.uri("a"), &["--do_verify=1"]));
    assert_user_error(&raidnbd(d, &["ctl", "--socket", &sock, "grow", "--layout", "nonsense"]), "unknown raid5 layout");
    assert_ok(&raidnbd(d, &["ctl", "--socket", &sock, "grow", "--layout", "right-asymmetric", "--chunk", "32K"]));
    let s = status(d, &sock);
    assert!(!s["reshape"].is_null(), "{s:#}");
    let served = sigkill_rounds(
        d,
        &sock,
        &log,
        served,
        serve,
        |s, round| assert!(!s["reshape"].is_null(), "round {round}: the kill lands inside the reshape: {s:#}"),
        |s, round| assert_eq!(s["size_bytes"], size, "round {round}: the size is kept"),
    );
    assert_ok(&raidnbd(d, &["ctl", "--socket", &sock, "rebuild-speed", "100M", "200M"]));
    assert_ok(&raidnbd(d, &["ctl", "--socket", &sock, "wait", "--timeout", "120s"]));
    let s = status(d, &sock);
    assert_eq!((s["layout"].as_str(), s["reshape"].is_null()), (Some("32K chunk, right-asymmetric"), true), "{s:#}");
    run_ok(Command::new(PYTHON).arg(writer()).arg(served.uri("a")).arg(&log).arg("verify"));
    run_ok(&mut fio_region(&served.uri("a"), &["--verify_only"]));
    wait_resync_done(d, &sock, std::time::Duration::from_secs(120), "the resync after the kills did not end");
    served.stop();
    let check: Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &[&["check", "--json"][..], &members].concat()))).unwrap();
    assert_eq!(check["mismatch_cnt"], 0, "parity matches the data in the new layout");
    for m in members {
        let theirs = mdadm_examine(&d.join(m));
        assert_eq!((field(&theirs, "Layout"), field(&theirs, "Chunk Size")), ("right-asymmetric", "32K"), "{m}");
        assert!(field(&theirs, "Reshape pos'n").is_empty(), "{m}: mdadm sees no reshape: {theirs:?}");
    }
}
