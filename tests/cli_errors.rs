//! Every user error is one clear line and exit status 2, never a panic; nothing is
//! written to members when a command refuses.

use std::process::Command;

use crate::util::*;

#[test]
fn create_refuses_bad_requests() {
    let dir = tempdir();
    let d = dir.path();
    assert_user_error(&raidnbd(d, &["create", "--level", "5", "a", "b", "c"]), "a does not exist (give --size");
    assert_user_error(&raidnbd(d, &["create", "--level", "7", "--size", "8M", "a", "b"]), "unknown RAID level '7'");
    assert_user_error(
        &raidnbd(d, &["create", "--level", "6", "--size", "8M", "a", "b", "c"]),
        "needs at least 4 members",
    );
    assert_user_error(
        &raidnbd(d, &["create", "--level", "5", "--chunk", "3K", "--size", "8M", "a", "b"]),
        "power of two",
    );
    assert_usage_error(&raidnbd(d, &["create", "--level", "5", "--chunk", "12Q", "a", "b"]), "unknown suffix");
    assert_user_error(
        &raidnbd(d, &["create", "--level", "5", "--layout", "diagonal", "--size", "8M", "a", "b"]),
        "unknown raid5 layout",
    );
    assert_user_error(
        &raidnbd(d, &["create", "--level", "1", "--chunk", "64K", "--size", "8M", "a", "b"]),
        "raid1 has no chunk",
    );
    assert_user_error(
        &raidnbd(d, &["create", "--level", "0", "--size", "8M", "a", "missing"]),
        "no member may be missing",
    );
    assert_user_error(&raidnbd(d, &["create", "--level", "5", "--size", "8M", "a", "a"]), "given twice");
    assert_user_error(&raidnbd(d, &["create", "--level", "5", "--size", "4K", "s1", "s2"]), "too small");
}

#[test]
fn create_protects_existing_data() {
    let dir = tempdir();
    let d = dir.path();
    assert_ok(&raidnbd(d, &["create", "--level", "1", "--size", "16M", "m0", "m1"]));
    let before = std::fs::read(d.join("m0")).unwrap();
    assert_user_error(&raidnbd(d, &["create", "--level", "0", "m0", "m1"]), "already holds an md superblock");
    assert_eq!(std::fs::read(d.join("m0")).unwrap(), before, "refused create must not write");
    assert_ok(&raidnbd(d, &["create", "--level", "0", "--force", "m0", "m1"]));

    require_tool("mkfs.ext4", "e2fsprogs");
    std::fs::write(d.join("fs.img"), vec![0u8; 16 << 20]).unwrap();
    run_ok(std::process::Command::new("mkfs.ext4").args(["-q", "-F"]).arg(d.join("fs.img")));
    std::fs::write(d.join("other.img"), vec![0u8; 16 << 20]).unwrap();
    assert_user_error(
        &raidnbd(d, &["create", "--level", "1", "fs.img", "other.img"]),
        "fs.img already holds an ext2/3/4 filesystem",
    );
}

#[test]
fn serve_and_inspect_refuse_bad_member_sets() {
    let dir = tempdir();
    let d = dir.path();
    assert_ok(&raidnbd(d, &["create", "--level", "5", "--chunk", "64K", "--size", "16M", "a", "b", "c"]));
    assert_ok(&raidnbd(d, &["create", "--level", "5", "--chunk", "64K", "--size", "16M", "x", "y", "z"]));
    std::fs::write(d.join("plain"), vec![0u8; 1 << 20]).unwrap();

    // A named member that does not exist counts as absent (the array would start degraded);
    // with --require-all, or when too few are left, serve refuses and names it.
    assert_user_error(&raidnbd(d, &["serve", "--require-all", "a", "b", "nope"]), "nope");
    assert_user_error(&raidnbd(d, &["serve", "a", "nope", "nope2"]), "absent: nope, nope2");
    assert_user_error(&raidnbd(d, &["serve", "a", "b", "x"]), "x");
    assert_user_error(&raidnbd(d, &["serve", "a"]), "cannot");
    assert_user_error(&raidnbd(d, &["serve", "a", "b", "plain"]), "plain");
    assert_user_error(&raidnbd(d, &["serve"]), "no members given");
    let speeds = ["serve", "--speed-limit-min", "4M", "--speed-limit-max", "1M", "a", "b", "c"];
    assert_user_error(&raidnbd(d, &speeds), "need 0 < min (4194304) <= max (1048576)");
    assert_user_error(&raidnbd(d, &["examine", "plain"]), "no valid md superblock on plain");
    assert_user_error(&raidnbd(d, &["detail", "a", "x"]), "x");

    // Port in use.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    assert_user_error(&raidnbd(d, &["serve", "--listen", &addr, "a", "b", "c"]), "cannot listen on");
}

#[test]
fn check_reports_and_repairs_mismatches() {
    let dir = tempdir();
    let d = dir.path();
    assert_ok(&raidnbd(d, &["create", "--level", "5", "--chunk", "64K", "--size", "8M", "a", "b", "c"]));
    let out = raidnbd(d, &["check", "--json", "a", "b", "c"]);
    let text = assert_ok(&out);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["mismatch_cnt"], 0);
    // Flip a byte in b's data area (data offset 2 MiB for such small members: after the
    // superblock and the 1 MiB partial parity log).
    let mut bytes = std::fs::read(d.join("b")).unwrap();
    bytes[(2 << 20) + 777] ^= 0xff;
    std::fs::write(d.join("b"), bytes).unwrap();
    let out = raidnbd(d, &["check", "--json", "a", "b", "c"]);
    assert_eq!(out.status.code(), Some(1), "mismatches found => exit 1");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["mismatch_cnt"], 8, "one 4 KiB page");
    let out = raidnbd(d, &["check", "--repair", "--json", "a", "b", "c"]);
    assert_eq!(out.status.code(), Some(1));
    let out = raidnbd(d, &["check", "--json", "a", "b", "c"]);
    assert_ok(&out);
}

/// A raid6 member that returns wrong bytes: `check` names it (offline and `ctl check`
/// online), `check --repair` rewrites that member's bytes, not the parity.
#[test]
fn raid6_check_names_the_wrong_member_and_repair_rewrites_it() {
    let dir = tempdir();
    let d = dir.path();
    let members = ["a", "b", "c", "d"];
    let create = ["create", "--level", "6", "--chunk", "64K", "--consistency-policy", "resync", "--size", "8M"];
    assert_ok(&raidnbd(d, &[&create[..], &members].concat()));
    {
        let served = Served::start(d, "a", &[], &members);
        let data: Vec<u8> = (0..4u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 7) as u8).collect();
        std::fs::write(d.join("data"), &data).unwrap();
        run_ok(Command::new("nbdcopy").arg(d.join("data")).arg(served.uri("a")));
        served.stop();
    }
    let examine: serde_json::Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &["examine", "--json", "c"]))).unwrap();
    let data_offset = examine[0]["data_offset_sectors"].as_u64().unwrap() as usize * 512;
    let good = std::fs::read(d.join("c")).unwrap();
    let mut bytes = good.clone();
    for at in [data_offset + (1 << 20) + 5, data_offset + (3 << 20) + 4000] {
        bytes[at] ^= 0x3c;
    }
    std::fs::write(d.join("c"), &bytes).unwrap();
    let out = raidnbd(d, &[&["check", "--json"][..], &members].concat());
    assert_eq!(out.status.code(), Some(1), "mismatches found => exit 1");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((v["mismatch_cnt"].as_u64(), v["located_sectors"].as_u64()), (Some(16), Some(16)), "{v:#}");
    let c = d.join("c").to_str().unwrap().to_string();
    for m in v["mismatches"].as_array().unwrap() {
        assert_eq!(m["member"].as_str(), Some(c.as_str()), "{v:#}");
    }
    // Online: ctl check names it in ctl status.
    let sock = d.join("c.sock").to_str().unwrap().to_string();
    let served = Served::start(d, "a", &["--control", &sock], &members);
    assert_ok(&raidnbd(d, &["ctl", "--socket", &sock, "check"]));
    assert_ok(&raidnbd(d, &["ctl", "--socket", &sock, "wait", "--timeout", "60s"]));
    let status: serde_json::Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &["ctl", "--socket", &sock, "status", "--json"]))).unwrap();
    let mismatches = status[0]["mismatches"].as_array().unwrap();
    assert_eq!(mismatches.len(), 2, "{status:#}");
    assert!(mismatches.iter().all(|m| m["member"].as_str() == Some(c.as_str())), "{status:#}");
    served.stop();
    let out = raidnbd(d, &[&["check", "--repair"][..], &members].concat());
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("wrong on {c} (role 2), repaired")), "{text}");
    assert!(std::fs::read(d.join("c")).unwrap() == good, "the wrong member's bytes are rewritten");
    assert_ok(&raidnbd(d, &[&["check", "--json"][..], &members].concat()));
}

#[test]
fn sizes_and_help_are_friendly() {
    let dir = tempdir();
    let out = raidnbd(dir.path(), &["--help"]);
    let help = assert_ok(&out);
    for word in ["create", "serve", "examine", "detail", "check", "quickstart"] {
        assert!(help.contains(word), "help lists {word}");
    }
    assert_usage_error(&raidnbd(dir.path(), &["serve", "--member-bw", "fast", "a"]), "invalid size 'fast'");
}

/// `attach` refuses what the kernel's driver cannot use before it touches the device, and
/// names the missing nbd module (this machine's kernel has none) instead of failing obscurely.
/// The attach itself, and its ride through restarts, run in the VM rig (`raidnbd-restart`).
#[test]
fn attach_refuses_bad_requests() {
    let dir = tempdir();
    let d = dir.path();
    let uri = "nbd://127.0.0.1:1/data";
    assert_user_error(&raidnbd(d, &["attach", uri, "/dev/sda"]), "is not an NBD device");
    assert_user_error(
        &raidnbd(d, &["attach", "nbds://127.0.0.1:1/data?tls-certificates=/nonexistent", "/dev/nbd0"]),
        "cannot speak TLS",
    );
    assert_user_error(&raidnbd(d, &["attach", uri, "/dev/nbd0", "-b", "8192"]), "--block-size must be");
    assert_user_error(&raidnbd(d, &["attach", uri, "/dev/nbd0", "-C", "17"]), "--connections must be 1 to 16");
    assert_user_error(&raidnbd(d, &["attach", uri, "/dev/nbd0", "--dead-conn-timeout", "0"]), "at least 1s");
    if std::path::Path::new("/sys/module/nbd").exists() {
        println!("the nbd module is loaded here: the no-driver message is not checked");
    } else {
        assert_user_error(&raidnbd(d, &["attach", uri, "/dev/nbd0"]), "modprobe nbd");
    }
}
