//! Removing members from an array (md's backwards reshape): the size confirmed first, online
//! with `ctl grow --raid-devices N --array-size BYTES` while a client writes, SIGKILLed at
//! random points and restarted, with every acknowledged write reading back and fio's verify
//! clean; at rest with `raidnbd grow`; the removed members spares; mdadm reading the result
//! as raidnbd does.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::grow::{
    field, fio_region, mdadm_agrees, mdadm_examine, serve_paced, sigkill_rounds, status, wait_resync_done, writer,
};
use crate::util::*;

/// The size a refusal to remove members without `--array-size` names.
fn size_named(out: &std::process::Output) -> u64 {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "a refusal: {stderr}");
    assert!(stderr.contains("is lost"), "{stderr}");
    stderr
        .rsplit("--array-size ")
        .next()
        .and_then(|t| t.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("the refusal names the size: {stderr}"))
}

/// Removes the last of five members (of `member_size` each) of a `level` array online, through ten SIGKILLs under
/// writes (crash writer + fio verify), then checks the size, every acknowledged byte, parity
/// (when there is any) and what mdadm says. A raid0 reshapes as a raid4 of one role more.
fn shrink_online_through_sigkills(level: &str, member_size: &str) {
    require_libnbd_python();
    require_tool("fio", "fio");
    let dir = tempdir();
    let d = dir.path();
    let members = ["m0", "m1", "m2", "m3", "m4"];
    let create = ["create", "--level", level, "--chunk", "64K", "--consistency-policy", "resync"];
    let create = if level == "0" { &create[..5] } else { &create[..] };
    assert_ok(&raidnbd(d, &[create, &["--size", member_size], &members].concat()));
    let parity_role = usize::from(level == "0");
    let log = d.join("durable.log");
    let sock = d.join("c.sock").to_str().unwrap().to_string();
    let serve = || serve_paced(d, &sock, &members);
    let served = serve();
    let old_size = status(d, &sock)["size_bytes"].as_u64().unwrap();
    run_ok(&mut fio_region(&served.uri("a"), &["--do_verify=1"]));
    let grow = ["ctl", "--socket", &sock, "grow", "--raid-devices", "4"];
    let new_size = size_named(&raidnbd(d, &grow));
    assert!(new_size >= 80 << 20 && new_size < old_size, "room for the writer and fio: {old_size} -> {new_size}");
    let s = status(d, &sock);
    assert!(s["reshape"].is_null() && s["size_bytes"] == old_size, "a refusal changes nothing: {s:#}");
    assert_user_error(
        &raidnbd(d, &[&grow[..], &["--array-size", &(new_size + 65536).to_string()]].concat()),
        "is lost",
    );
    assert_ok(&raidnbd(d, &[&grow[..], &["--array-size", &new_size.to_string()]].concat()));
    let s = status(d, &sock);
    assert_eq!(s["reshape"]["from_raid_devices"], 5 + parity_role, "{s:#}");
    assert_eq!(s["reshape"]["to_raid_devices"], 4 + parity_role, "{s:#}");
    assert_eq!(s["reshape"]["backwards"], true, "{s:#}");
    assert_eq!(s["size_bytes"], new_size, "the export shrinks when the reshape starts");
    let size = run_ok(Command::new("nbdinfo").args(["--size", &served.uri("a")]));
    assert_eq!(size.trim(), new_size.to_string(), "a new connection sees the new size");
    // fio's region survives, and is written and verified again while the reshape runs.
    run_ok(&mut fio_region(&served.uri("a"), &["--verify_only"]));
    run_ok(&mut fio_region(&served.uri("a"), &["--do_verify=1"]));
    let served = sigkill_rounds(
        d,
        &sock,
        &log,
        served,
        serve,
        |s, round| assert!(!s["reshape"].is_null(), "round {round}: the kill lands inside the reshape"),
        |s, round| {
            assert!(!s["reshape"].is_null(), "round {round}: the restart continues the reshape: {s:#}");
            assert_eq!(s["size_bytes"], new_size, "round {round}: the smaller size after a restart");
        },
    );
    assert_ok(&raidnbd(d, &["ctl", "--socket", &sock, "rebuild-speed", "100M", "200M"]));
    assert_ok(&raidnbd(d, &["ctl", "--socket", &sock, "wait", "--timeout", "120s"]));
    let s = status(d, &sock);
    assert!(s["reshape"].is_null(), "{s:#}");
    assert_eq!(s["roles"].as_array().unwrap().len(), 4, "{s:#}");
    assert_eq!(s["size_bytes"], new_size);
    let spares: Vec<&str> = s["spares"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(spares.iter().any(|p| p.ends_with("m4")), "the removed member is a spare: {s:#}");
    run_ok(Command::new(PYTHON).arg(writer()).arg(served.uri("a")).arg(&log).arg("verify"));
    run_ok(&mut fio_region(&served.uri("a"), &["--verify_only"]));
    wait_resync_done(d, &sock, Duration::from_secs(120), "the resync after the kills did not end");
    assert_eq!(s["level"], format!("raid{level}"), "{s:#}");
    served.stop();
    if level != "0" {
        let check: Value =
            serde_json::from_str(&assert_ok(&raidnbd(d, &[&["check", "--json"][..], &members].concat()))).unwrap();
        assert_eq!(check["mismatch_cnt"], 0, "parity (or every copy) matches the data after the shrink");
    }
    mdadm_agrees(d, &members, 4);
    assert_eq!(field(&mdadm_examine(&d.join("m4")), "Device Role"), "spare", "mdadm sees m4 as a spare");
}

#[test]
fn a_raid5_loses_a_member_online_through_sigkills_under_writes() {
    shrink_online_through_sigkills("5", "40M");
}

#[test]
fn a_raid6_loses_a_member_online_through_sigkills_under_writes() {
    shrink_online_through_sigkills("6", "64M");
}

#[test]
fn a_raid0_loses_a_member_online_through_sigkills_under_writes() {
    shrink_online_through_sigkills("0", "40M");
}

#[test]
fn a_raid4_loses_a_member_online_through_sigkills_under_writes() {
    shrink_online_through_sigkills("4", "40M");
}

/// md's raid10 reshape backwards: a raid10 n2 of five loses a member.
#[test]
fn a_raid10_loses_a_member_online_through_sigkills_under_writes() {
    shrink_online_through_sigkills("10", "48M");
}

#[test]
fn an_array_at_rest_loses_members_and_refusals_say_why() {
    let dir = tempdir();
    let d = dir.path();
    let members = ["m0", "m1", "m2", "m3", "m4", "m5"];
    let create = ["create", "--level", "6", "--chunk", "64K", "--consistency-policy", "resync", "--size", "24M"];
    assert_ok(&raidnbd(d, &[&create[..], &members].concat()));
    let data: Vec<u8> = (0..20u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    std::fs::write(d.join("data"), &data).unwrap();
    {
        let served = Served::start(d, "a", &[], &members);
        run_ok(Command::new("nbdcopy").arg(d.join("data")).arg(served.uri("a")));
        served.stop();
    }
    let grow = |args: &[&str]| raidnbd(d, &[&["grow"][..], args, &members].concat());
    assert_user_error(&grow(&["--raid-devices", "3"]), "at least 4");
    let others = ["o0", "o1", "o2", "o3"];
    assert_ok(&raidnbd(d, &[&["create", "--force", "--level", "linear", "--size", "16M"][..], &others].concat()));
    let out = raidnbd(d, &[&["grow", "--raid-devices", "3", "--array-size", "1M"][..], &others].concat());
    assert_user_error(&out, "appending");
    assert_user_error(&grow(&["--raid-devices", "5", "--add", "m6"]), "--raid-devices 5");
    let size = size_named(&grow(&["--raid-devices", "4"]));
    assert!(size >= data.len() as u64, "two data members of about 24 MiB hold the data: {size}");
    let out = assert_ok(&grow(&["--raid-devices", "4", "--array-size", &size.to_string()]));
    assert!(out.contains("4 members"), "{out}");
    let detail: Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &[&["detail", "--json"][..], &members].concat()))).unwrap();
    assert_eq!(detail["raid_devices"], 4, "{detail:#}");
    assert!(detail["reshape"].is_null(), "{detail:#}");
    assert_eq!(detail["array_size_bytes"], size, "{detail:#}");
    assert_eq!(detail["spares"].as_array().unwrap().len(), 2, "{detail:#}");
    let served = Served::start(d, "a", &[], &members[..4]);
    run_ok(Command::new("nbdcopy").arg(served.uri("a")).arg(d.join("back")));
    served.stop();
    let back = std::fs::read(d.join("back")).unwrap();
    assert_eq!(back.len() as u64, size);
    assert!(back[..data.len()] == data[..], "the data survives the shrink");
    let check: Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &[&["check", "--json"][..], &members[..4]].concat()))).unwrap();
    assert_eq!(check["mismatch_cnt"], 0);
    mdadm_agrees(d, &members, 4);

    // A raid0 loses a member as md does it: through a raid4 without its parity member.
    let raid0 = ["z0", "z1", "z2"];
    assert_ok(&raidnbd(d, &[&["create", "--level", "0", "--chunk", "64K", "--size", "16M"][..], &raid0].concat()));
    {
        let served = Served::start(d, "a", &[], &raid0);
        run_ok(Command::new("nbdcopy").arg(d.join("data")).arg(served.uri("a")).arg("--destination-is-zero"));
        served.stop();
    }
    let grow = |args: &[&str]| raidnbd(d, &[&["grow"][..], args, &raid0].concat());
    let size = size_named(&grow(&["--raid-devices", "2"]));
    assert!(size >= 24 << 20, "two members of about 16 MiB: {size}");
    let out = assert_ok(&grow(&["--raid-devices", "2", "--array-size", &size.to_string()]));
    assert!(out.contains("2 members"), "{out}");
    let detail: Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &[&["detail", "--json"][..], &raid0].concat()))).unwrap();
    assert_eq!(
        (detail["raid_level"].as_str(), detail["raid_devices"].as_u64()),
        (Some("raid0"), Some(2)),
        "{detail:#}"
    );
    assert_eq!(detail["spares"].as_array().unwrap().len(), 1, "{detail:#}");
    let served = Served::start(d, "a", &[], &raid0[..2]);
    run_ok(Command::new("nbdcopy").arg(served.uri("a")).arg(d.join("back0")));
    served.stop();
    let back = std::fs::read(d.join("back0")).unwrap();
    assert_eq!(back.len() as u64, size);
    let kept = size as usize;
    assert!(back[..kept.min(data.len())] == data[..kept.min(data.len())], "the data that stays survives");
    mdadm_agrees(d, &raid0, 2);

    // A raid10 n2 of four loses one at rest (md's backwards raid10 reshape).
    let raid10 = ["t0", "t1", "t2", "t3"];
    let create = ["create", "--level", "10", "--layout", "n2", "--chunk", "64K", "--size", "16M"];
    assert_ok(&raidnbd(d, &[&create[..], &raid10].concat()));
    let kept = (20 << 20).min(data.len());
    {
        let served = Served::start(d, "a", &[], &raid10);
        run_ok(Command::new("nbdcopy").arg(d.join("data")).arg(served.uri("a")).arg("--destination-is-zero"));
        served.stop();
    }
    let grow = |args: &[&str]| raidnbd(d, &[&["grow"][..], args, &raid10].concat());
    assert_user_error(&grow(&["--raid-devices", "1", "--array-size", "1M"]), "at least 2 members");
    let size = size_named(&grow(&["--raid-devices", "3"]));
    assert!(size >= kept as u64, "three n2 members of about 16 MiB hold 20 MiB: {size}");
    let out = assert_ok(&grow(&["--raid-devices", "3", "--array-size", &size.to_string()]));
    assert!(out.contains("3 members"), "{out}");
    let detail: Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &[&["detail", "--json"][..], &raid10].concat()))).unwrap();
    assert_eq!((detail["raid_devices"].as_u64(), detail["reshape"].is_null()), (Some(3), true), "{detail:#}");
    assert_eq!(detail["spares"].as_array().unwrap().len(), 1, "{detail:#}");
    let served = Served::start(d, "a", &[], &raid10[..3]);
    run_ok(Command::new("nbdcopy").arg(served.uri("a")).arg(d.join("back10")));
    served.stop();
    let back = std::fs::read(d.join("back10")).unwrap();
    assert_eq!(back.len() as u64, size);
    assert!(back[..kept] == data[..kept], "the data survives the raid10 shrink");
    let check: Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &[&["check", "--json"][..], &raid10[..3]].concat()))).unwrap();
    assert_eq!(check["mismatch_cnt"], 0, "every copy agrees");
    mdadm_agrees(d, &raid10, 3);
}
