//! Network RAID: members that are NBD exports served by real peers — nbdkit (memory and file
//! plugins, over Unix sockets and TCP) and qemu-nbd — created, served, examined and checked
//! by URI; assembled again from the URIs in another order; a member server that is down at
//! start counts as absent (the array starts degraded); one killed while serving fails that
//! member (no reconnect yet): the array goes on degraded with the right bytes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::util::*;

/// Peer servers, killed on drop.
struct Peers {
    children: Vec<Child>,
}

impl Drop for Peers {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn wait_for_socket(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(Instant::now() < deadline, "{} did not appear", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_for_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Four 48 MiB members: nbdkit memory (Unix), nbdkit memory (Unix), nbdkit file (TCP),
/// qemu-nbd of a raw file (Unix). Returns the peers and the member URIs.
fn start_peers(d: &Path) -> (Peers, Vec<String>) {
    require_tool("nbdkit", "nbdkit");
    require_tool("qemu-nbd", "qemu-utils");
    let mut children = Vec::new();
    let mut uris = Vec::new();
    for i in 0..2 {
        let socket = d.join(format!("mem{i}.sock"));
        children.push(nbdkit_memory(&socket, "48M"));
        uris.push(format!("nbd+unix:///?socket={}", socket.display()));
    }
    let file = d.join("file-member.img");
    std::fs::File::create(&file).unwrap().set_len(48 << 20).unwrap();
    let port = free_port();
    children.push(nbdkit_file(&file, port));
    uris.push(format!("nbd://127.0.0.1:{port}/"));
    let image = d.join("qemu-member.img");
    std::fs::File::create(&image).unwrap().set_len(48 << 20).unwrap();
    let socket: PathBuf = d.join("qemu.sock");
    children.push(
        Command::new("qemu-nbd")
            .args(["--persistent", "-f", "raw", "-x", "q", "-k"])
            .arg(&socket)
            .arg(&image)
            .spawn()
            .expect("qemu-nbd"),
    );
    wait_for_socket(&socket);
    uris.push(format!("nbd+unix:///q?socket={}", socket.display()));
    (Peers { children }, uris)
}

fn remote_array(level: &str) {
    require_tool("nbdcopy", "libnbd-bin");
    require_tool("qemu-io", "qemu-utils");
    let dir = tempdir();
    let d = dir.path();
    let (mut peers, uris) = start_peers(d);
    let members: Vec<&str> = uris.iter().map(String::as_str).collect();
    let mut create = vec!["create", "--level", level, "--chunk", "64K"];
    create.extend_from_slice(&members);
    assert_ok(&raidnbd(d, &create));

    let served = Served::start(d, "net", &["--member-timeout", "2"], &members);
    let payload: Vec<u8> = (0..24u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 9) as u8).collect();
    std::fs::write(d.join("payload"), &payload).unwrap();
    run_ok(Command::new("nbdcopy").arg(d.join("payload")).arg(served.uri("net")).arg("--flush"));
    run_ok(Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 0x3c 30M 1M", &served.uri("net")]));
    // fio with verify over the remote members (random 4 KiB to 1 MiB writes, QD16), beyond
    // the payload and the pattern.
    require_tool("fio", "fio");
    let fio = run_ok(Command::new("fio").current_dir(d).args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={}", served.uri("net")),
        "--rw=randwrite",
        "--bsrange=4k-1m",
        "--iodepth=16",
        "--offset=40m",
        "--size=16m",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
        "--randrepeat=1",
        "--verify_state_save=0",
    ]));
    assert!(fio.contains("err= 0"), "fio verify: {fio}");
    served.stop();
    let detail: serde_json::Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &[&["detail", "--json"][..], &members].concat()))).unwrap();
    assert_eq!(detail["clean"], true, "{detail}");
    let check: serde_json::Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &[&["check", "--json"][..], &members].concat()))).unwrap();
    assert_eq!(check["mismatch_cnt"], 0, "{check}");

    // Assembled again by superblock from the URIs in another order.
    let reversed: Vec<&str> = members.iter().rev().copied().collect();
    let served = Served::start(d, "net", &["--member-timeout", "2"], &reversed);
    run_ok(Command::new("nbdcopy").arg(served.uri("net")).arg(d.join("back")));
    let back = std::fs::read(d.join("back")).unwrap();
    assert!(back[..payload.len()] == payload[..], "{level}: the data read back over remote members");
    run_ok(Command::new("qemu-io").args(["-f", "raw", "-c", "read -P 0x3c 30M 1M", &served.uri("net")]));

    // A member server killed while serving: that member fails, the array goes on degraded.
    let victim = 2; // nbdkit file over TCP
    let _ = peers.children[victim].kill();
    let _ = peers.children[victim].wait();
    run_ok(Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 0x77 31M 1M", &served.uri("net")]));
    run_ok(Command::new("nbdcopy").arg(served.uri("net")).arg(d.join("back2")));
    let back = std::fs::read(d.join("back2")).unwrap();
    assert!(back[..payload.len()] == payload[..], "{level}: right bytes with a member server gone");
    run_ok(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "read -P 0x3c 30M 1M",
        "-c",
        "read -P 0x77 31M 1M",
        &served.uri("net"),
    ]));
    let log = served.stop();
    assert!(log.contains(members[victim]), "the failed member is named: {log}");
    let detail: serde_json::Value = serde_json::from_str(&assert_ok(&raidnbd(
        d,
        &[&["detail", "--json"][..], &[members[0], members[1], members[3]]].concat(),
    )))
    .unwrap();
    assert_eq!(detail["degraded"], true, "{detail}");

    // Its server still down at the next start: the member is absent, the array degraded.
    let served = Served::start(d, "net", &[], &members);
    let log = served.log_text();
    assert!(log.contains("absent") && log.contains("DEGRADED"), "{log}");
    run_ok(Command::new("qemu-io").args(["-f", "raw", "-c", "read -P 0x77 31M 1M", &served.uri("net")]));
    served.stop();
}

#[test]
fn raid5_over_nbdkit_and_qemu_nbd_exports() {
    remote_array("5");
}

#[test]
fn raid10_over_nbdkit_and_qemu_nbd_exports() {
    remote_array("10");
}

/// `nbdkit memory SIZE` on the Unix socket `socket`.
fn nbdkit_memory(socket: &Path, size: &str) -> Child {
    let child = Command::new("nbdkit").args(["-f", "-U"]).arg(socket).args(["memory", size]).spawn().expect("nbdkit");
    wait_for_socket(socket);
    child
}

/// `nbdkit file FILE` on 127.0.0.1:`port`.
fn nbdkit_file(file: &Path, port: u16) -> Child {
    let child = Command::new("nbdkit")
        .args(["-f", "-i", "127.0.0.1", "-p", &port.to_string(), "file"])
        .arg(file)
        .spawn()
        .expect("nbdkit file");
    wait_for_port(port);
    child
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(child.id() as i32, sig);
    }
}

/// RAID1 of a local file and an nbdkit file export; python3-libnbd writes through it.
fn python(uri: &str, code: &str) {
    require_libnbd_python();
    let script = format!("import nbd\nh = nbd.NBD()\nh.connect_uri({uri:?})\n{code}\nh.shutdown()\n");
    run_ok(Command::new(PYTHON).args(["-c", &script]));
}

#[test]
fn a_member_server_that_restarts_within_the_member_timeout_is_reconnected() {
    require_tool("nbdkit", "nbdkit");
    let dir = tempdir();
    let d = dir.path();
    let remote_file = d.join("remote.img");
    std::fs::File::create(&remote_file).unwrap().set_len(32 << 20).unwrap();
    let port = free_port();
    let mut server = Peers { children: vec![nbdkit_file(&remote_file, port)] };
    let uri = format!("nbd://127.0.0.1:{port}/");
    assert_ok(&raidnbd(d, &["create", "--level", "1", "--size", "32M", "local.img", &uri]));
    let served = Served::start(d, "m", &["--member-timeout", "10"], &["local.img", &uri]);
    let array = served.uri("m");
    python(&array, "h.pwrite(b'\\x21' * (1 << 20), 0)\nh.flush()");
    // The member's server dies and comes back (same file, same port) within the timeout.
    let _ = server.children[0].kill();
    let _ = server.children[0].wait();
    std::thread::sleep(Duration::from_millis(500));
    server.children[0] = nbdkit_file(&remote_file, port);
    python(
        &array,
        "h.pwrite(b'\\x22' * (1 << 20), 1 << 20)\nh.flush()\nassert h.pread(2 << 20, 0) == b'\\x21' * (1 << 20) + b'\\x22' * (1 << 20)",
    );
    // A stall shorter than the timeout (SIGSTOP for 1 s) fails nothing either.
    signal(&server.children[0], libc::SIGSTOP);
    let resume = server.children[0].id() as i32;
    let waker = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(1));
        // SAFETY: kill(2) on the child's pid.
        unsafe { libc::kill(resume, libc::SIGCONT) };
    });
    python(&array, "h.pwrite(b'\\x23' * 65536, 3 << 20)\nh.flush()");
    waker.join().unwrap();
    let log = served.stop();
    assert!(log.contains("reconnected"), "{log}");
    assert!(!log.contains("the member fails"), "{log}");
    let detail: serde_json::Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &["detail", "--json", "local.img", &uri]))).unwrap();
    assert_eq!((detail["clean"].clone(), detail["degraded"].clone()), (true.into(), false.into()), "{detail}");
    let check: serde_json::Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &["check", "--json", "local.img", &uri]))).unwrap();
    assert_eq!(check["mismatch_cnt"], 0, "both copies agree: {check}");
}

#[test]
fn a_member_server_that_stays_away_or_comes_back_different_fails_the_member() {
    require_tool("nbdkit", "nbdkit");
    let dir = tempdir();
    let d = dir.path();
    // 1. Stopped (SIGSTOP) for longer than --member-timeout 2: the member fails, writes go on.
    let remote_file = d.join("remote.img");
    std::fs::File::create(&remote_file).unwrap().set_len(32 << 20).unwrap();
    let port = free_port();
    let server = Peers { children: vec![nbdkit_file(&remote_file, port)] };
    let uri = format!("nbd://127.0.0.1:{port}/");
    assert_ok(&raidnbd(d, &["create", "--level", "1", "--size", "32M", "a.img", &uri]));
    let served = Served::start(d, "m", &["--member-timeout", "2"], &["a.img", &uri]);
    python(&served.uri("m"), "h.pwrite(b'\\x31' * 65536, 0)\nh.flush()");
    signal(&server.children[0], libc::SIGSTOP);
    let started = Instant::now();
    python(
        &served.uri("m"),
        "h.pwrite(b'\\x32' * 65536, 65536)\nh.flush()\nassert h.pread(131072, 0) == b'\\x31' * 65536 + b'\\x32' * 65536",
    );
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(2) && waited < Duration::from_secs(30), "failed after {waited:?}");
    let log = served.stop();
    assert!(log.contains("not back within") && log.contains("the member fails"), "{log}");
    signal(&server.children[0], libc::SIGCONT);
    drop(server);

    // 2. A server that comes back empty (nbdkit memory restarted) is another disk: the member
    //    fails instead of serving zeros.
    let socket = d.join("mem.sock");
    let mut server = Peers { children: vec![nbdkit_memory(&socket, "32M")] };
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    assert_ok(&raidnbd(d, &["create", "--level", "1", "--size", "32M", "b.img", &uri]));
    let served = Served::start(d, "m", &["--member-timeout", "10"], &["b.img", &uri]);
    python(&served.uri("m"), "h.pwrite(b'\\x41' * 65536, 0)\nh.flush()");
    let _ = server.children[0].kill();
    let _ = server.children[0].wait();
    let _ = std::fs::remove_file(&socket);
    server.children[0] = nbdkit_memory(&socket, "32M");
    python(
        &served.uri("m"),
        "h.pwrite(b'\\x42' * 65536, 65536)\nh.flush()\nassert h.pread(131072, 0) == b'\\x41' * 65536 + b'\\x42' * 65536",
    );
    let log = served.stop();
    assert!(log.contains("came back with other contents"), "{log}");
    let detail: serde_json::Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &["detail", "--json", "b.img"]))).unwrap();
    assert_eq!(detail["degraded"], true, "{detail}");
    drop(server);

    // 3. Lost with writes it acknowledged but no FLUSH covered: a new connection cannot vouch
    //    for them, so the member fails at once (its server restarting with the same file).
    let remote_file = d.join("remote3.img");
    std::fs::File::create(&remote_file).unwrap().set_len(32 << 20).unwrap();
    let port = free_port();
    let mut server = Peers { children: vec![nbdkit_file(&remote_file, port)] };
    let uri = format!("nbd://127.0.0.1:{port}/");
    assert_ok(&raidnbd(d, &["create", "--level", "1", "--size", "32M", "c.img", &uri]));
    let served = Served::start(d, "m", &["--member-timeout", "10"], &["c.img", &uri]);
    let restart = format!(
        "import subprocess, time\nh.pwrite(b'\\x51' * 65536, 0)\n\
         subprocess.run(['kill', '-KILL', '{pid}'])\ntime.sleep(0.5)\n",
        pid = server.children[0].id()
    );
    python(&served.uri("m"), &restart);
    let _ = server.children[0].wait();
    server.children[0] = nbdkit_file(&remote_file, port);
    python(
        &served.uri("m"),
        "h.pwrite(b'\x52' * 65536, 65536)
h.flush()
assert h.pread(65536, 0) == b'\x51' * 65536",
    );
    let log = served.stop();
    assert!(log.contains("not yet flushed") && log.contains("the member fails"), "{log}");
}

/// `ctl` and the config file take member URIs: a RAID1 of two files loses one (`ctl fail`,
/// `ctl remove`), an nbdkit memory export is added with `ctl add URI` and rebuilt; the array,
/// served again from a config file naming the URI, checks clean.
#[test]
fn ctl_add_and_the_config_file_take_member_uris() {
    require_tool("nbdkit", "nbdkit");
    let dir = tempdir();
    let d = dir.path();
    let socket = d.join("spare.sock");
    let _server = Peers { children: vec![nbdkit_memory(&socket, "48M")] };
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    assert_ok(&raidnbd(d, &["create", "--level", "1", "--size", "48M", "m0", "m1"]));
    let control = d.join("control.sock");
    let control_arg = control.to_str().unwrap();
    let served = Served::start(d, "a", &["--control", control_arg], &["m0", "m1"]);
    python(&served.uri("a"), "h.pwrite(b'\\x61' * (4 << 20), 1 << 20)\nh.flush()");
    let ctl = |args: &[&str]| assert_ok(&raidnbd(d, &[&["ctl", "--socket", control_arg][..], args].concat()));
    let m1 = d.join("m1").canonicalize().unwrap();
    ctl(&["fail", m1.to_str().unwrap()]);
    ctl(&["remove", m1.to_str().unwrap()]);
    ctl(&["add", &uri]);
    ctl(&["wait", "--timeout", "120"]);
    let status: serde_json::Value = serde_json::from_str(&ctl(&["status", "--json"])).unwrap();
    let roles = status[0]["roles"].as_array().unwrap().clone();
    assert!(roles.iter().all(|r| r["state"] == "in_sync"), "{status:#}");
    assert!(roles.iter().any(|r| r["member"] == uri.as_str()), "the URI member has a role: {status:#}");
    served.stop();
    let config = format!("[[export]]\nname = \"a\"\nmembers = [\"m0\", {uri:?}]\n");
    std::fs::write(d.join("raidnbd.toml"), config).unwrap();
    let served =
        Served::run(d, |listen| ["serve", "--listen", listen, "--config", "raidnbd.toml"].map(String::from).to_vec());
    python(&served.uri("a"), "assert h.pread(4 << 20, 1 << 20) == b'\\x61' * (4 << 20)");
    served.stop();
    let check: serde_json::Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &["check", "--json", "m0", &uri]))).unwrap();
    assert_eq!(check["mismatch_cnt"], 0, "the rebuilt remote copy matches: {check}");
}
